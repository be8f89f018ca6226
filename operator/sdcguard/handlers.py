"""Every Kopf registration of the operator, kept thin.

Index handlers return ``{}`` (never None) for an object that no longer belongs in
an index: Kopf keeps an object's previous entry when its handler returns None.

Nodes, Pods, probe Jobs and our own SDCTests, RepairTickets and SDCHardware records
are not Kopf's to index: ``adapters/inventory.py`` lists them page by page and then
watches them (Kopf's initial indexing costs time in the square of the object count,
and these kinds grow with the fleet), keeping slim snapshots in memory and writing no
bookkeeping to them, so a node with nothing to do costs zero writes. Kopf keeps the
few policies and baselines (indexes), the policy daemons and the SDCReport events; the
tickets' announcements run from the operator's copy (``ticket_sinks.Announcer``). Every
change marks the nodes it is about dirty; one daemon per SDCPolicy then runs a
reconcile pass (debounced), and a periodic resync catches anything time-driven
(idle windows, expiry, back-off). All decisions are made by ``sdcguard.domain``
inside the pass; this module only wires events to it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import kopf
import structlog
from pydantic import ValidationError

from sdcguard.adapters import observe, reports, ticket_sinks
from sdcguard.adapters.heap import Heap
from sdcguard.adapters.inventory import Inventory
from sdcguard.adapters.kube import KubeWriter, make_api_client
from sdcguard.adapters.leader import LeaderElector
from sdcguard.adapters.pass_state import FleetView, UrgentWork
from sdcguard.adapters.policy_status import StatusSender
from sdcguard.adapters.reconciler import Reconciler
from sdcguard.api import GROUP, VERSION, SDCBaseline, SDCPolicy
from sdcguard.api.policy import NodeSelector
from sdcguard.domain.observed import NodeSnapshot
from sdcguard.logs import configure_logging
from sdcguard.metrics import Metrics
from sdcguard.settings import Settings, load_settings

log = structlog.get_logger("sdcguard")
T = TypeVar("T")


class Wake:
    """What one policy loop has to look at: nodes whose observations changed (``dirty``),
    nodes whose probe just ended (``urgent``: decided at once, no debounce) and
    whether everything should be looked at (``full``)."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.urgent_event = asyncio.Event()
        self.dirty: set[str] = set()
        self.urgent: set[str] = set()
        self.full = True
        # The ended probe Pods and Jobs themselves: the index may not hold them yet when
        # the loop wakes (Kopf stores a handler's value after it returns).
        self.ended_pods: dict[str, observe.ProbePod] = {}
        self.ended_jobs: dict[str, observe.ProbeJob] = {}

    def take_urgent(self) -> tuple[frozenset[str], dict[str, Any], dict[str, Any]]:
        taken = (frozenset(self.urgent), self.ended_pods, self.ended_jobs)
        self.urgent, self.ended_pods, self.ended_jobs = set(), {}, {}
        return taken


class Runtime:
    """The operator's state shared by its handlers: made by the startup handler and
    kept in Kopf's memo (``memo.rt``), which every handler receives; no module globals."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        reconciler: Reconciler,
        inventory: Inventory | None = None,
        heap: Heap | None = None,
    ) -> None:
        self.settings = settings
        self.heap = heap
        """Freezes the long-lived heap after each full pass (None: the collector is left
        as it is; the operator's process has one, adapters/heap.py)."""
        self.metrics = metrics
        self.reconciler = reconciler
        self.wakes: list[Wake] = []
        self.started = _now()
        self.inventory = inventory or Inventory(
            reconciler.writer.api, settings.namespace, test_node=lambda _: None, clock=_now
        )
        """Nodes, workload Pods, probe Pods and Jobs, SDCTests, RepairTickets and
        SDCHardware: listed in pages, then watched (a standby replica's is handed in
        already warm)."""
        self.inventory.test_node = lambda test: reconciler.test_nodes.get(test)
        for mirror in self.inventory.mirrors:  # read when scraped, never copied
            metrics.mirror_objects.labels(kind=mirror.kind.name).set_function(mirror.__len__)
        # The workload records are written, so only the leader keeps them.
        self.inventory.keep_records(reconciler.writer, settings.workload_record_seconds)
        reconciler.workloads = self.inventory.book
        # One worker thread runs every pass (they are serialized anyway): one malloc arena.
        self.executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sdcguard-pass")
        self.view_executor = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="sdcguard-view"
        )
        """Copies each pass's view of the fleet while the pass's thread serves probe
        ends (``_pass``)."""
        self.policy_seen: dict[str, Any] = {}
        """Each policy's generation and sdcguard annotations, as last seen."""
        self.background: set[asyncio.Future[Any]] = set()
        """Work started from the inventory's changes (kept referenced until done)."""
        self.reports = reports.ReportAdmission(reconciler.writer, settings.report_limits())
        """Admits training jobs' SDCReports, with the caps the settings set."""
        self.announcer = ticket_sinks.Announcer(
            self.inventory.tickets.items,
            reconciler.writer,
            metrics,
            records=self.inventory.hardware.get,
            clock=_now,
        )
        """Delivers the tickets' events to their policies' sinks (not a Kopf timer)."""
        self.stopping = False


def _rt(memo: Any) -> Runtime:
    rt: Runtime = memo.rt
    return rt


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _poke(
    rt: Runtime,
    nodes: Iterable[str] | None = None,
    *,
    urgent: bool = False,
    pod: observe.ProbePod | None = None,
    job: observe.ProbeJob | None = None,
) -> None:
    """Wake every policy loop: these nodes' observations changed (None: anything may
    have; look at every node). Handlers are coroutines, so this runs in the loop."""
    for wake in rt.wakes:
        if pod is not None:
            wake.ended_pods[pod.test_name] = pod
        if job is not None:
            wake.ended_jobs[job.test_name] = job
        if nodes is None:
            wake.full = True
        elif urgent:
            wake.urgent.update(nodes)
            wake.urgent_event.set()
        else:
            wake.dirty.update(nodes)
        wake.event.set()


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    config = load_settings()
    configure_logging(config.log_format, config.log_level)
    # One registry and endpoint a process: a replica that lost its Lease runs Kopf
    # again later in the same process (__main__), with the same memo.
    metrics: Metrics | None = memo.get("metrics")
    if metrics is None:
        metrics = memo.metrics = Metrics()
        if config.metrics_port:
            metrics.serve(config.metrics_port)
    metrics.lead()  # Kopf runs only where this process acts (alone, or holding the Lease)
    # With leader election (__main__), the Lease's holder starts Kopf: its writes are
    # fenced by the Lease, and its inventory has been listing while it waited.
    elector: LeaderElector | None = memo.get("elector")
    writer = KubeWriter(
        api=make_api_client(),
        metrics=metrics,
        dry_run=config.dry_run,
        leading=elector.leading if elector is not None else None,
    )
    # The policies' statuses are written in a thread of their own: no probe's end
    # waits behind one (policy_status.StatusSender).
    reconciler = Reconciler(
        writer=writer, settings=config, metrics=metrics, status_sender=StatusSender(writer)
    )
    heap: Heap | None = memo.get("heap")  # one a process, like the metrics (__main__'s
    if heap is None:  # with leader election, which settles it while standing by)
        heap = memo.heap = Heap(metrics)
        heap.install()
    heap.metrics = metrics
    rt = Runtime(config, metrics, reconciler, memo.get("inventory"), heap)
    memo.rt = rt

    def node_changed(name: str, node: NodeSnapshot | None) -> None:
        # An SDCReport about the node learns its outcome (confirmed, cleared).
        if rt.reports.awaits(name):
            follow = asyncio.to_thread(rt.reports.follow, name, _followed(node), _now())
            rt.background.add(asyncio.ensure_future(follow))

    rt.inventory.start(
        asyncio.get_running_loop(),
        lambda nodes=None, **kw: _poke(rt, nodes, **kw),
        on_node=node_changed,
    )
    rt.background.add(asyncio.ensure_future(_resume_reports(rt)))
    rt.background.add(asyncio.ensure_future(_announce_tickets(rt)))
    # We post our own Events on transitions; Kopf's per-handler events are noise.
    settings.posting.enabled = False
    settings.posting.level = logging.WARNING
    # One active replica: alone, or the holder of the leader Lease (__main__); Kopf's
    # peering is not used.
    settings.peering.standalone = True
    settings.peering.mandatory = False
    # Progress and diff-base bookkeeping only ever lands on our own resources: Nodes,
    # Pods and Jobs are not Kopf's to watch at all (adapters/inventory.py).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = rt.settings.api_timeout_seconds * 3
    settings.batching.error_delays = [1, 2, 5, 10, 20]
    # A probe's end should reach its node in tens of milliseconds: do not hold events
    # back for more of the same object (Kopf's default waits 0.1 s).
    settings.batching.batch_window = 0.02
    log.info("operator starting", namespace=rt.settings.namespace, dry_run=rt.settings.dry_run)


def _followed(node: NodeSnapshot | None) -> dict[str, Any] | None:
    """A node as the report follower reads it; None: no such node."""
    if node is None:
        return None
    return {"metadata": {"labels": node.labels, "annotations": node.annotations}}


def _node_body(rt: Runtime, name: str) -> dict[str, Any] | None:
    return _followed(rt.inventory.node_bodies([name]).get(name))


async def _resume_reports(rt: Runtime) -> None:
    """Once the fleet copy is complete: reports found again after a restart learn what
    became of their node while no operator watched."""
    if await rt.inventory.wait_synced(lambda: False):
        await asyncio.to_thread(rt.reports.resume, lambda n: _node_body(rt, n), _now())


async def _announce_tickets(rt: Runtime) -> None:
    """Once tickets and hardware records have listed (the workload Pods need not: a
    quarantine served before them has its ticket told at once): every ticket's pending
    event, to its sinks."""
    if await rt.inventory.wait_synced(lambda: rt.stopping, probes=True):
        await rt.announcer.run(lambda: rt.stopping)


# Indexes ------------------------------------------------------------------


@kopf.on.cleanup()
async def stop_inventory(memo: kopf.Memo, **_: Any) -> None:
    """Kopf stops: with a process exit, or (leader election) because the Lease was
    lost, when the process stands by with its copy kept warm (``memo.keep_inventory``);
    a pass still running finishes in its thread, its writes refused by the fence."""
    rt = _rt(memo)
    rt.stopping = True
    rt.announcer.stop()
    sender = rt.reconciler.status_sender
    if sender is not None:  # the term's pending policy statuses, then its thread ends
        await asyncio.to_thread(sender.close)
    if memo.get("keep_inventory"):
        rt.inventory.detach()
    else:
        rt.inventory.stop()


@kopf.index(GROUP, VERSION, "sdcpolicies")
async def policies_index(
    name: str, spec: kopf.Spec, meta: kopf.Meta, memo: kopf.Memo, **_: Any
) -> dict[str, NodeSelector]:
    """Every policy's selector: one policy owns each node (domain.selection).

    A change of spec (generation) or of our annotations (a breaker reset) makes every
    loop look at all nodes; our own status writes do not."""
    rt = _rt(memo)
    ours = {k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith(GROUP)}
    seen = (meta.get("generation"), sorted(ours.items()))
    if rt.policy_seen.get(name) != seen:
        rt.policy_seen[name] = seen
        _poke(rt)
    return {name: NodeSelector.model_validate(spec.get("nodeSelector") or {})}


@kopf.index(GROUP, VERSION, "sdcbaselines")
async def baselines_index(
    body: kopf.Body, name: str, memo: kopf.Memo, **_: Any
) -> dict[str, SDCBaseline]:
    """Every SDCBaseline, parsed once here; an unreadable one is left out (and logged):
    no test is judged against it."""
    rt = _rt(memo)
    _poke(rt)
    try:
        return {name: SDCBaseline.model_validate(body)}
    except ValidationError as exc:
        log.warning("unreadable SDCBaseline skipped", baseline=name, error=str(exc)[:300])
        return {}


# The reconcile loop ----------------------------------------------------------


INDEX_NAMES = ("baselines_index", "policies_index")
"""Kopf's indexes a pass reads: only kinds that stay few (the rest is the inventory's)."""


def _urgent_view(
    rt: Runtime,
    indexes: dict[str, kopf.Index[str, Any]],
    nodes: frozenset[str],
    pods: dict[str, observe.ProbePod],
    jobs: dict[str, observe.ProbeJob],
) -> FleetView:
    """The view of urgent nodes, with the ended Pods and Jobs as their events said."""
    view = _view(rt, indexes, only=nodes)
    for test, pod in pods.items():
        others = [p for p in view.probe_pods.get(test, []) if p.name != pod.name]
        view.probe_pods[test] = [*others, pod]
    view.probe_jobs.update(jobs)
    return view


def _view(
    rt: Runtime,
    indexes: Mapping[str, Mapping[str, Iterable[Any]]],
    only: frozenset[str] | None = None,
) -> FleetView:
    """A consistent copy of the inventory and Kopf's indexes for one pass (they change
    while it runs).

    ``only``: just these nodes' entries (and their tests' Pods and Jobs), for urgent
    work that decides only them; a copy of everything costs O(fleet) each time."""

    def first(store: Iterable[Any]) -> Any:
        return next(iter(store))

    inv = rt.inventory
    known = inv.workloads_synced()  # before the copy of Pods: the Pods read below
    pending = inv.pending()
    baselines = {k: first(v) for k, v in indexes["baselines_index"].items()}
    records = inv.hardware_records()
    policies = {k: first(v) for k, v in indexes["policies_index"].items()}
    if only is None:
        return FleetView(
            nodes=inv.node_bodies(),
            busy=inv.busy(),
            probe_pods=inv.probe_pods_by_test(),
            probe_jobs=inv.probe_jobs_by_test(),
            tests=inv.tests_by_node(),
            tickets=inv.tickets_by_node(),
            last_busy=dict(inv.last_busy),
            pending=pending,
            baselines=baselines,
            operator_started=rt.started,
            policies=policies,
            hardware=records,
            id_holders=lambda node: inv.id_holders([node]),
            workloads_known=known,
        )
    tests = inv.tests_by_node(only)
    names = [t.name for snapshots in tests.values() for t in snapshots]
    return FleetView(
        nodes=inv.node_bodies(only),
        busy=inv.busy(only),
        probe_pods=inv.probe_pods_by_test(names),
        probe_jobs=inv.probe_jobs_by_test(names),
        tests=tests,
        tickets=inv.tickets_by_node(only),
        last_busy={k: v for k in only if (v := inv.last_busy.get(k)) is not None},
        pending=pending,
        baselines=baselines,
        operator_started=rt.started,
        policies=policies,
        complete=False,
        hardware=records,
        id_holders=lambda node: inv.id_holders([node]),
        workloads_known=known,
    )


class _ParsedPolicy:
    """The policy's body parsed once per change of it (its resourceVersion), so a
    pass and every urgent pass get the typed model, never the raw body."""

    def __init__(self) -> None:
        self.version: str | None = None
        self.policy: SDCPolicy | None = None

    def of(self, body: kopf.Body) -> SDCPolicy | None:
        """The typed policy, or None while its body is unreadable (logged once)."""
        version = str(body.get("metadata", {}).get("resourceVersion", ""))
        if version != self.version or not version:
            self.version = version
            try:
                self.policy = SDCPolicy.model_validate(dict(body))
            except ValidationError as exc:  # the API server should have refused it
                log.error("policy unreadable; nothing done", error=str(exc)[:500])
                self.policy = None
        return self.policy


async def _handing_on(
    rt: Runtime,
    policy: SDCPolicy,
    indexes: dict[str, kopf.Index[str, Any]],
    wake: Wake,
    work: asyncio.Future[T],
    *,
    serve: bool,
) -> T:
    """Wait for ``work`` (a pass, or its copy of the fleet), handing every probe end
    that arrives meanwhile to the reconciler with a fresh view of its nodes: served by
    the running pass between its steps, or (``serve``: no pass runs yet, the copy is
    being made) at once in the pass's thread."""
    loop = asyncio.get_running_loop()
    while not work.done():
        urgent: asyncio.Future[Any] = asyncio.ensure_future(wake.urgent_event.wait())
        await asyncio.wait({work, urgent}, return_when=asyncio.FIRST_COMPLETED)
        urgent.cancel()
        if wake.urgent_event.is_set() and not work.done():
            wake.urgent_event.clear()
            nodes, pods, jobs = wake.take_urgent()
            if nodes:
                view = _urgent_view(rt, indexes, nodes, pods, jobs)
                rt.reconciler.offer_urgent(UrgentWork(policy, view, nodes, _now()))
                if serve:
                    await loop.run_in_executor(rt.executor, rt.reconciler.serve_offered)
    return await work


async def _pass(
    rt: Runtime,
    policy: SDCPolicy,
    indexes: dict[str, kopf.Index[str, Any]],
    dirty: frozenset[str] | None,
    wake: Wake,
) -> float:
    """One reconcile pass (``dirty`` None: full); returns seconds until the next look.

    While it runs, nodes whose probe ends are handed to it with a fresh view and
    served between its steps; what it did not get to is marked urgent again.
    """
    loop = asyncio.get_running_loop()
    # The pass's copy of the fleet is made in a thread of its own, not the pass's: it
    # costs O(fleet) (2.3 s at 10,000 nodes and 100,000 Pods, 2.7 s at 20,000 and
    # 200,000), and made in the event loop or before the pass in the pass's thread, it
    # held back every probe's end that arrived meanwhile (at 20,000 nodes a release
    # waited up to 2.3 s behind it). Those are served now in the pass's thread while
    # the copy is made, and the pass leaves the nodes they decided to them (``since``).
    # Kopf's indexes (a few policies and baselines) are copied here, in the loop that
    # changes them.
    copies = {name: {k: list(v) for k, v in indexes[name].items()} for name in INDEX_NAMES}
    mark = rt.reconciler.mark()
    copying = loop.run_in_executor(rt.view_executor, _view, rt, copies)
    try:
        fleet = await _handing_on(rt, policy, indexes, wake, copying, serve=True)
    except Exception:  # retried like a failed pass
        log.exception("reconcile pass failed", policy=policy.metadata.name)
        wake.full = True
        return 2.0

    def run() -> float:
        return rt.reconciler.run_pass(policy, fleet, _now(), dirty, since=mark)

    future = loop.run_in_executor(rt.executor, run)
    try:
        wake_in = await _handing_on(rt, policy, indexes, wake, future, serve=False)
    except Exception:  # a failed pass is retried; level-triggered, nothing is lost
        log.exception("reconcile pass failed", policy=policy.metadata.name)
        wake.full = True
        return 2.0
    finally:
        # Work offered as the pass ended: served first by the next pass, which runs now.
        left = rt.reconciler.take_unserved()
        for work in left:
            rt.reconciler.offer_urgent(work)
        if left:
            wake.urgent.update(n for work in left for n in work.nodes)
            wake.event.set()
    return min(rt.settings.resync_seconds, max(0.05, wake_in))


def _in_flight(inventory: Inventory) -> set[str]:
    """The nodes with an SDCTest not finished (its probe may have ended meanwhile)."""
    return {
        node
        for node, tests in inventory.tests_by_node().items()
        if any(t.known is not None and not t.known.finished for t in tests)
    }


def _look_again(rt: Runtime, policy: str) -> set[str]:
    """Before the workload Pods have listed, nothing else comes back to a node: those
    with a test in flight (a Job to create, a probe's end that came with the first
    list, a status write that failed) and those whose decision asked to be looked at
    again by now (a write that failed)."""
    return _in_flight(rt.inventory) | rt.reconciler.due_nodes(policy, _now())


async def _probe_ends_only(
    rt: Runtime,
    policy: SDCPolicy | None,
    indexes: dict[str, kopf.Index[str, Any]],
    wake: Wake,
    again: set[str],
) -> None:
    """Before the workload Pods have listed: serve the nodes whose probe ended or that
    changed, and ``again``, with views that say the Pods are not known (so only
    finished tests are decided, and tests in flight advanced); every policy's first
    pass after the copy is complete is a full one."""
    if policy is None:  # unreadable (logged): its change wakes nothing here, so look again
        await asyncio.sleep(0.5)
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(wake.event.wait(), timeout=0.2)
    wake.event.clear()
    wake.urgent_event.clear()
    urgent, pods, jobs = wake.take_urgent()
    nodes = frozenset(urgent | wake.dirty | again)
    wake.dirty = set()
    if not nodes:
        return
    view = _urgent_view(rt, indexes, nodes, pods, jobs)
    rt.reconciler.offer_urgent(UrgentWork(policy, view, nodes, _now()))
    await asyncio.get_running_loop().run_in_executor(rt.executor, rt.reconciler.serve_offered)


FULL_PASS_SPACING = 4.0
"""A full pass waits at least this many times the last one's duration after it: the
safety net takes at most a fifth of the operator's time, however big the fleet."""


def full_pass_interval(rt: Runtime, policy: str, resync: float, took: float) -> float:
    """Seconds from the end of a full pass to the next one: ``resyncSeconds``, or longer
    on a fleet whose full pass is dear (20,000 nodes: about 2 s of CPU, more under load),
    so probe ends, joins and changed nodes keep the operator's time. Time-driven work
    (idle windows, expiry, back-off) asks for its own look and does not wait for it."""
    interval = max(resync, FULL_PASS_SPACING * took)
    rt.metrics.full_pass_seconds.observe(took)
    rt.metrics.full_pass_interval.set(interval)
    if interval > resync:
        log.info(
            "full passes spaced out",
            policy=policy,
            took=round(took, 3),
            next_in=round(interval, 1),
            resync=resync,
        )
    return interval


@kopf.daemon(GROUP, VERSION, "sdcpolicies", cancellation_timeout=10)
async def policy_loop(
    name: str, body: kopf.Body, stopped: kopf.DaemonStopped, memo: kopf.Memo, **kwargs: Any
) -> None:
    """Reconcile the policy's nodes as their observations change, urgently when a
    probe ended, and all of them every resync period."""
    rt = _rt(memo)
    indexes = {key: kwargs[key] for key in INDEX_NAMES}
    specs: kopf.Index[str, SDCPolicy] = kwargs["policy_specs_index"]
    # Kopf's index is live and shared: the announcer reads the tickets' policies from it.
    rt.announcer.policy = lambda ref: next(iter(specs.get(ref, [])), None)
    settings = rt.settings
    wake = Wake()
    rt.wakes.append(wake)
    next_full = next_look = 0.0
    parsed = _ParsedPolicy()
    # Nothing is decided from a partial copy of the fleet: a node not yet listed must
    # never look idle or new. Probe ends need every kind but the workload Pods, which
    # outnumber the Nodes ten to one: they are served once the rest has listed, and
    # passes (reservations, idle windows) wait for the Pods too.
    if not await rt.inventory.wait_synced(lambda: bool(stopped), probes=True):
        rt.wakes.remove(wake)
        return
    try:
        loop = asyncio.get_running_loop()
        again_at = 0.0
        while not stopped and not rt.inventory.synced():
            again: set[str] = set()
            if time.monotonic() >= again_at:  # at once (probes that ended while no
                # operator ran came with the first list, which tells no change), then
                # every second
                again = await loop.run_in_executor(rt.executor, _look_again, rt, name)
                again_at = time.monotonic() + 1.0
            await _probe_ends_only(rt, parsed.of(body), indexes, wake, again)
        while not stopped:
            try:
                timeout = max(0.0, min(next_full, next_look) - time.monotonic())
                await asyncio.wait_for(wake.event.wait(), timeout=timeout)
            except TimeoutError:
                pass
            if stopped:
                break
            if not wake.urgent:
                # Batch a burst of events, but never hold back a probe's end.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        wake.urgent_event.wait(), timeout=settings.debounce_seconds
                    )
            wake.event.clear()
            wake.urgent_event.clear()
            policy = parsed.of(body)
            if policy is None:  # waits for a readable body; its change wakes the loop
                next_look = time.monotonic() + 60.0
                continue
            full = wake.full or time.monotonic() >= next_full
            urgent, pods, jobs = wake.take_urgent()
            if urgent:  # decided first, from a view of just these nodes
                view = _urgent_view(rt, indexes, urgent, pods, jobs)
                rt.reconciler.offer_urgent(UrgentWork(policy, view, urgent, _now()))
            dirty = None if full else frozenset(wake.dirty)
            wake.dirty, wake.full = set(), False
            began = time.monotonic()
            wake_in = await _pass(rt, policy, indexes, dirty, wake)
            if full:
                next_full = time.monotonic() + full_pass_interval(
                    rt, name, settings.resync_seconds, time.monotonic() - began
                )
                if rt.heap is not None:
                    # What the pass left alive is the fleet copy and the policy's memory:
                    # no collection scans it again (full collections stopped every thread
                    # for 0.26 s a pass in-process at 20,000 nodes).
                    rt.heap.settle()
            next_look = time.monotonic() + wake_in
    finally:
        rt.wakes.remove(wake)


@kopf.index(GROUP, VERSION, "sdcpolicies")
async def policy_specs_index(body: kopf.Body, name: str, **_: Any) -> dict[str, SDCPolicy]:
    """Every policy, parsed once here for the ticket announcer (no GET or parse per
    ticket and look); an unreadable one is left out (and logged): its tickets wait."""
    try:
        return {
            name: SDCPolicy.model_validate(
                {"metadata": body.get("metadata", {}), "spec": body.get("spec") or {}}
            )
        }
    except ValidationError as exc:  # the API server should have refused it
        log.warning("unreadable SDCPolicy skipped", policy=name, error=str(exc)[:300])
        return {}


@kopf.on.event(GROUP, VERSION, "sdcreports")
async def report_seen(type: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A training job's SDCReport: admitted once (status written), remembered after."""
    if type != "DELETED":
        rt = _rt(memo)
        await asyncio.to_thread(rt.reports.handle, dict(body), _now())
        if rt.inventory.synced():
            # Found after the fleet copy was complete (_resume_reports ran already).
            await asyncio.to_thread(rt.reports.resume, lambda n: _node_body(rt, n), _now())
