"""The operator assembled from its parts for one Kopf term: the fleet's copy (the
inventory), the reconciler, the pass scheduler, SDCReport admission and the tickets'
announcer, and what the handlers in ``handlers.py`` hand them.

Nodes, Pods, probe Jobs and our own SDCTests, RepairTickets and SDCHardware records are
not Kopf's to index: ``adapters/inventory.py`` lists them and then watches them
(``runtime/mirror.py``), keeping slim snapshots in memory and writing no bookkeeping to
them, so a node with nothing to do costs zero writes. Kopf keeps the few policies and
baselines (indexes), the policy daemons and the SDCReport events; the tickets'
announcements run from the operator's copy (``ticket_sinks.Announcer``). Every change
marks the nodes it is about dirty; one loop per SDCPolicy then runs a reconcile pass
(``runtime/scheduling.py``). All decisions are made by ``sdcguard.domain`` inside the
pass.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
from collections.abc import Callable, Mapping
from typing import Any

import kopf
import structlog
from pydantic import ValidationError

from sdcguard.adapters import reports, ticket_sinks
from sdcguard.adapters.inventory import Inventory
from sdcguard.adapters.kube import KubeWriter, make_api_client
from sdcguard.adapters.pass_view import ReconcilerPasses
from sdcguard.adapters.policy_status import StatusSender
from sdcguard.adapters.reconciler import Reconciler
from sdcguard.adapters.retention import retention_sweeper
from sdcguard.api import GROUP, SDCBaseline, SDCPolicy
from sdcguard.api.policy import NodeSelector
from sdcguard.domain.observed import NodeSnapshot
from sdcguard.metrics import Metrics
from sdcguard.runtime.heap import Heap
from sdcguard.runtime.leader import LeaderElector
from sdcguard.runtime.scheduling import PassScheduler
from sdcguard.settings import Settings

log = structlog.get_logger("sdcguard")

RETENTION_WAITS_FOR_A_PASS = 120.0
"""Seconds retention's first sweep waits for a first full pass (none comes without a
policy; history is pruned then all the same)."""


def now() -> dt.datetime:
    """The operator's clock (UTC)."""
    return dt.datetime.now(dt.UTC)


class Operator:
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
        self.metrics = metrics
        self.reconciler = reconciler
        self.started = now()
        self.inventory = inventory or Inventory(
            reconciler.writer.api, settings.namespace, test_node=lambda _: None, clock=now
        )
        """Nodes, workload Pods, probe Pods and Jobs, SDCTests, RepairTickets and
        SDCHardware: listed, then watched (a standby replica's is handed in already
        warm)."""
        self.inventory.test_node = lambda test: reconciler.test_nodes.get(test)
        for mirror in self.inventory.mirrors:  # read when scraped, never copied
            metrics.mirror_objects.labels(kind=mirror.kind.name).set_function(mirror.__len__)
        # The workload records are written, so only the leader keeps them.
        self.inventory.keep_records(reconciler.writer, settings.workload_record_seconds)
        reconciler.workloads = self.inventory.book
        self.scheduler = PassScheduler(
            resync_seconds=settings.resync_seconds,
            debounce_seconds=settings.debounce_seconds,
            metrics=metrics,
            clock=now,
            heap=heap,
        )
        """Runs every policy's passes on its two threads."""
        self.policy_seen: dict[str, Any] = {}
        """Each policy's generation and sdcguard annotations, as last seen."""
        self.background: set[asyncio.Future[Any]] = set()
        """Work started from the inventory's changes (kept referenced until done)."""
        known = reports.KnownNodes(
            self.inventory,
            lambda node: reconciler.device_taints.get().node_devices(node),
            settings.report_pool_label,
        )
        self.reports = reports.ReportAdmission(
            reconciler.writer,
            settings.report_limits(),
            devices=known.devices,
            pool_of=known.pool,
        )
        """Admits training jobs' SDCReports, with the caps the settings set."""
        reconciler.risk.reports = self.reports.recent
        self.announcer = ticket_sinks.Announcer(
            self.inventory.tickets.items,
            reconciler.writer,
            metrics,
            records=self.inventory.hardware.get,
            clock=now,
            addresses=ticket_sinks.sink_addresses(settings),
        )
        """Delivers the tickets' events to their policies' sinks (not a Kopf timer)."""
        self.deleting: set[str] = set()
        """Policies marked for deletion: none is an heir of another's nodes."""
        self.stopping = False
        self.retention = retention_sweeper(
            settings, reconciler.writer, metrics, self.inventory, now
        )
        """Deletes history past the retention settings (``adapters/retention.py``)."""
        self.retention_stop = threading.Event()

    # Life ---------------------------------------------------------------------

    @classmethod
    def assemble(cls, config: Settings, memo: kopf.Memo) -> Operator:
        """The parts for one Kopf term. One metrics registry and endpoint, and one heap
        keeper, a process: a replica that lost its Lease runs Kopf again later in the
        same process (``runtime/terms.py``), with the same memo."""
        metrics: Metrics | None = memo.get("metrics")
        if metrics is None:
            metrics = memo.metrics = Metrics()
            if config.metrics_port:
                metrics.serve(config.metrics_port)
        metrics.lead()  # Kopf runs only where this process acts (alone, or holding the Lease)
        # With leader election, the Lease's holder starts Kopf: its writes are fenced by
        # the Lease, and its inventory has been listing while it waited.
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
        heap: Heap | None = memo.get("heap")  # with leader election, settled while
        if heap is None:  # standing by too (runtime/terms.py)
            heap = memo.heap = Heap(metrics)
            heap.install()
        heap.metrics = metrics
        return cls(config, metrics, reconciler, memo.get("inventory"), heap)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Tell the policy loops every change the copy sees from now on; resume the
        reports and announce the tickets once the copy has listed."""
        self.inventory.start(loop, self.scheduler.poke, on_node=self._node_changed)
        self.background.add(asyncio.ensure_future(self._resume_reports()))
        self.background.add(asyncio.ensure_future(self._announce_tickets()))
        self.background.add(asyncio.ensure_future(self._keep_history_bounded()))

    async def stop(self, *, keep_inventory: bool) -> None:
        """Kopf stops: with a process exit, or (leader election) because the Lease was
        lost, when the process stands by with its copy kept warm (``keep_inventory``);
        a pass still running finishes in its thread, its writes refused by the fence."""
        self.stopping = True
        self.retention_stop.set()
        self.announcer.stop()
        sender = self.reconciler.status_sender
        if sender is not None:  # the term's pending policy statuses, then its thread ends
            await asyncio.to_thread(sender.close)
        if keep_inventory:
            self.inventory.detach()
        else:
            self.inventory.stop()

    # What the handlers hand in ------------------------------------------------

    def policy_seen_as(self, name: str, meta: Mapping[str, Any]) -> None:
        """A policy as its index saw it. A change of spec (generation) or of our
        annotations (a breaker reset) makes every loop look at all nodes; our own
        status writes do not."""
        if meta.get("deletionTimestamp"):
            self.deleting.add(name)
        else:
            self.deleting.discard(name)
        ours = {k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith(GROUP)}
        seen = (meta.get("generation"), sorted(ours.items()))
        if self.policy_seen.get(name) != seen:
            self.policy_seen[name] = seen
            self.scheduler.poke()

    async def run_policy(
        self,
        name: str,
        body: kopf.Body,
        indexes: Mapping[str, kopf.Index[str, Any]],
        specs: kopf.Index[str, SDCPolicy],
        stopped: Callable[[], bool],
    ) -> None:
        """The policy's loop (its Kopf daemon's body) until ``stopped()``."""
        # Kopf's index is live and shared: the announcer reads the tickets' policies from it.
        self.announcer.policy = lambda ref: next(iter(specs.get(ref, [])), None)
        passes = ReconcilerPasses(
            name, body, self.reconciler, self.inventory, indexes, self.started
        )
        await self.scheduler.run(passes, stopped)

    async def release_policy(
        self, name: str, body: Mapping[str, Any], selectors: kopf.Index[str, NodeSelector]
    ) -> None:
        """A deleted policy (its Kopf deletion handler, before the finalizer goes): its
        unfinished tests end Cancelled and its nodes are released, or handed over to a
        policy that stays (``adapters/policy_release.py``)."""
        meta = body.get("metadata") or {}
        indexed = list(selectors.get(name, []))[:1]
        try:  # the selector as indexed (an unreadable spec is never a reason to stay)
            selector = indexed[0] if indexed else policy_entry(name, body.get("spec") or {})[name]
        except ValidationError:
            selector = None
        self.deleting.add(name)
        if not await self.inventory.wait_synced(lambda: self.stopping, probes=True):
            raise kopf.TemporaryError("the operator is stopping; released on its return", delay=5)
        others = {
            p: selector
            for p, found in selectors.items()
            if p != name and p not in self.deleting
            for selector in list(found)[:1]
        }
        tests = [
            snapshot.known.running
            for snapshots in self.inventory.tests_by_node().values()
            for snapshot in snapshots
            if snapshot.known is not None
            and snapshot.known.policy == name
            and snapshot.known.running is not None
        ]
        nodes = list(self.inventory.node_bodies().values())
        await asyncio.to_thread(
            self.reconciler.release_policy,
            name,
            str(meta.get("uid") or ""),
            selector,
            others,
            nodes,
            tests,
            now(),
        )
        self.scheduler.poke()  # the heirs of handed-over nodes look at them now

    async def report_seen(self, body: Mapping[str, Any]) -> None:
        """A training job's SDCReport: admitted once (status written), remembered after."""
        await asyncio.to_thread(self.reports.handle, dict(body), now())
        if self.inventory.synced():
            # Found after the fleet copy was complete (_resume_reports ran already).
            await asyncio.to_thread(self.reports.resume, self._node_body, now())

    # Internals ----------------------------------------------------------------

    def _node_changed(self, name: str, node: NodeSnapshot | None) -> None:
        # An SDCReport about the node learns its outcome (confirmed, cleared).
        if self.reports.awaits(name):
            follow = asyncio.to_thread(self.reports.follow, name, _followed(node), now())
            self.background.add(asyncio.ensure_future(follow))

    def _node_body(self, name: str) -> dict[str, Any] | None:
        return _followed(self.inventory.node_bodies([name]).get(name))

    async def _resume_reports(self) -> None:
        """Once the fleet copy is complete: reports found again after a restart learn
        what became of their node while no operator watched."""
        if await self.inventory.wait_synced(lambda: False):
            await asyncio.to_thread(self.reports.resume, self._node_body, now())

    async def _announce_tickets(self) -> None:
        """Once tickets and hardware records have listed (the workload Pods need not: a
        quarantine served before them has its ticket told at once): every ticket's
        pending event, to its sinks."""
        if await self.inventory.wait_synced(lambda: self.stopping, probes=True):
            await self.announcer.run(lambda: self.stopping)

    async def _keep_history_bounded(self) -> None:
        """Once the fleet copy is complete (a node missing from a partial copy would look
        gone, and its records prunable): retention's sweeps, in a thread, until Kopf
        stops (this term leads). The first waits for the fleet to be served (the first
        full pass): a start on a year of history decides its nodes before it prunes."""
        if await self.inventory.wait_synced(lambda: self.stopping):
            interval = self.settings.retention_interval_seconds
            await asyncio.to_thread(
                self.retention.run,
                self.retention_stop,
                interval,
                after=self.reconciler.served,
                waiting_at_most=RETENTION_WAITS_FOR_A_PASS,
            )


def _followed(node: NodeSnapshot | None) -> dict[str, Any] | None:
    """A node as the report follower reads it; None: no such node."""
    if node is None:
        return None
    return {"metadata": {"labels": node.labels, "annotations": node.annotations}}


def policy_entry(name: str, spec: Mapping[str, Any]) -> dict[str, NodeSelector]:
    """A policy's selector for its index: one policy owns each node (domain.selection)."""
    return {name: NodeSelector.model_validate(spec.get("nodeSelector") or {})}


def baseline_entry(name: str, body: Mapping[str, Any]) -> dict[str, SDCBaseline]:
    """An SDCBaseline, parsed once for its index; an unreadable one is left out (and
    logged): no test is judged against it."""
    try:
        return {name: SDCBaseline.model_validate(body)}
    except ValidationError as exc:
        log.warning("unreadable SDCBaseline skipped", baseline=name, error=str(exc)[:300])
        return {}


def policy_spec_entry(name: str, body: Mapping[str, Any]) -> dict[str, SDCPolicy]:
    """A policy, parsed once for the ticket announcer (no GET or parse per ticket and
    look); an unreadable one is left out (and logged): its tickets wait."""
    try:
        return {
            name: SDCPolicy.model_validate(
                {"metadata": body.get("metadata", {}), "spec": body.get("spec") or {}}
            )
        }
    except ValidationError as exc:  # the API server should have refused it
        log.warning("unreadable SDCPolicy skipped", policy=name, error=str(exc)[:300])
        return {}
