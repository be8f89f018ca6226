"""The operator's copy of the fleet: Nodes, workload Pods, probe Pods and probe Jobs,
and our own SDCTests, RepairTickets and SDCHardware records.

Eight :class:`~sdcguard.runtime.mirror.Mirror` s (list, then watch; see that module
for why these kinds do not go through Kopf), each keeping slim snapshots. The mirrors
are the runtime's (what they guarantee: ``runtime/README.md``); which kinds, slimmed
into which of the domain's snapshots, is the operator's, here:

- **nodes**: a :class:`~sdcguard.domain.observed.NodeSnapshot` of every Node;
- **pods**: every Pod that holds accelerators on a node (:class:`observe.PodUse`,
  grouped by node) or waits for them unscheduled (:class:`observe.PendingDemand`);
  Pods that request no device are not kept at all, and probe Pods and Pods that
  ended (Succeeded, Failed) are left out by the server (a label and a field
  selector);
- **probe Pods** and **probe Jobs**: only the operator's namespace, selected by the
  probe's component label on the server (a Pod labelled like a probe elsewhere must
  never pass or fail a node), grouped by their SDCTest;
- **tests**: a :class:`~sdcguard.adapters.pass_state.TestSnapshot` of every SDCTest
  (a finished one keeps only its facts), grouped by node;
- **tickets**: a :class:`~sdcguard.adapters.observe.TicketSnapshot` of every
  RepairTicket, grouped by node;
- **hardware**: a :class:`~sdcguard.adapters.hardware.HardwareRecord` of every readable
  SDCHardware (only failing hardware has one).
- **slices**: a :class:`~sdcguard.domain.dra.SliceSnapshot` of every DRA ResourceSlice
  published for one node, grouped by node: a DRA-only node's devices (spec.dra). A
  cluster that does not serve ``resource.k8s.io/v1`` has none (an optional kind).

SDCTests grow with the fleet and its history (one per screening) and tickets with its
failures; through Kopf's indexes a standby's takeover and every restart paid their
initial indexing in the square of their count. Here they cost one paged list, and a
standby keeps them warm like the Nodes.

Changes reach the policy loops through ``poke`` (called in the event loop):
a node that changed; a node a workload started or stopped using (the time it stopped
is kept in ``last_busy``, from which "idle for" counts); a probe Pod or Job that
ended, urgently, with the ended object itself; a node whose SDCTest or RepairTicket
was created, changed or deleted; an SDCHardware change (the nodes that hold its host
identifier or that it was seen under).

Complete or nothing, per kind (the mirrors' rule, restated for what reads them): a
probe's end is judged once every kind but the workload Pods has listed and the
workload records are read back (:meth:`Inventory.probes_synced`); whatever reads the
workload Pods (idle windows, pending demand: reservations) waits for their complete
copy (:meth:`Inventory.workloads_synced`). The Pods outnumber the Nodes ten to one, so
after a restart on a big fleet probe ends (release, confirmation, quarantine) are
served long before the fleet is screened again.

With a writer, the inventory also keeps every node's workload record
(:class:`~sdcguard.adapters.workload_record.WorkloadBook`): the Pod changes mark
nodes, a flusher thread writes the records, and the records are read back before
the first pass, so the idle time of a node resumes where the last run left it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import structlog
from kubernetes import client

from sdcguard.adapters import observe
from sdcguard.adapters.hardware import HardwareRecord, concerned, holder_keys, id_holders
from sdcguard.adapters.kube import KubeWriter
from sdcguard.adapters.observe import TicketSnapshot
from sdcguard.adapters.owners import OwnerResolver
from sdcguard.adapters.pass_state import TestSnapshot
from sdcguard.adapters.workload_record import WorkloadBook
from sdcguard.api import GROUP, VERSION
from sdcguard.builders.probe_job import COMPONENT, COMPONENT_LABEL, NODE_LABEL
from sdcguard.domain.dra import RESOURCE_SLICES, SliceSnapshot, device_counts
from sdcguard.domain.observed import NodeSnapshot
from sdcguard.runtime.mirror import (
    NODES,
    PAGE_SIZE,
    PODS,
    Change,
    Kind,
    Mirror,
    cluster_custom,
    retrying_client,
)

log = structlog.get_logger("sdcguard.inventory")

PENDING = "pending"
"""The pods mirror's group of unscheduled pods (node groups are ``node/<name>``, and
a node name never holds a slash)."""

POD_NOT_ENDED = "status.phase!=Succeeded,status.phase!=Failed"
"""The workload Pods the copy lists and watches: those that have not ended."""

# A relist that changed more than this many nodes wakes every policy for a full pass.
FULL_PASS_AFTER = 256


class Poke(Protocol):
    def __call__(
        self,
        nodes: Iterable[str] | None = None,
        *,
        urgent: bool = False,
        pod: observe.ProbePod | None = None,
        job: observe.ProbeJob | None = None,
    ) -> None: ...


def _pod_entry(body: Mapping[str, Any]) -> observe.PodUse | observe.PendingDemand | None:
    return observe.pod_use(body) or observe.pending_demand(body)


def _pod_groups(entry: observe.PodUse | observe.PendingDemand) -> tuple[str, ...]:
    if isinstance(entry, observe.PodUse):
        return (f"node/{entry.node_name}",)
    return (PENDING,)


def _job_entry(body: Mapping[str, Any]) -> tuple[observe.ProbeJob, str] | None:
    """A probe Job and the node its label names (its test may be gone already)."""
    job = observe.probe_job(body)
    if job is None:
        return None
    label = ((body.get("metadata") or {}).get("labels") or {}).get(NODE_LABEL) or ""
    return job, str(label)


def _test_groups(test: TestSnapshot) -> tuple[str, ...]:
    return (test.node_name,)


def _ticket_groups(ticket: TicketSnapshot) -> tuple[str, ...]:
    return (ticket.node_name,)


class Inventory:
    """The eight mirrors, wired to the policy loops (module docstring)."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        *,
        test_node: Callable[[str], str | None],
        clock: Callable[[], dt.datetime],
        page_size: int = PAGE_SIZE,
        writer: KubeWriter | None = None,
        record_seconds: float = 5.0,
    ) -> None:
        self.api = retrying_client(api)
        self.page_size = page_size
        self.record_seconds = record_seconds
        self.test_node = test_node
        self.clock = clock
        self.last_busy: dict[str, dt.datetime] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._poke: Poke | None = None
        self._on_node: Callable[[str, NodeSnapshot | None], None] | None = None
        self._stop = threading.Event()
        self._records_stop = threading.Event()
        """Ends the workload-record keeper (with :meth:`stop`, or alone at :meth:`detach`)."""
        self._started = False
        probe = f"{COMPONENT_LABEL}={COMPONENT}"
        self.nodes: Mirror[NodeSnapshot] = Mirror(
            self.api,
            NODES,
            NodeSnapshot.from_body,
            # By host identifier, so a pass tells a unique providerID or system UUID
            # from one that several Nodes share (never trusted to recognise hardware).
            groups=holder_keys,
            on_change=self._nodes_changed,
            page_size=page_size,
        )
        self.pods: Mirror[observe.PodUse | observe.PendingDemand] = Mirror(
            self.api,
            # Probe Pods are the probe mirror's: the server leaves them out here, so no
            # probe Pod event is parsed twice. So are Pods that ended (a Job's finished
            # Pods can outnumber the running ones): they hold no device, and a Pod that
            # ends leaves the copy as a deletion, as it stops holding its node.
            dataclasses.replace(
                PODS,
                label_selector=f"{COMPONENT_LABEL}!={COMPONENT}",
                field_selector=POD_NOT_ENDED,
            ),
            _pod_entry,
            groups=_pod_groups,
            on_change=self._pods_changed,
            page_size=page_size,
        )
        self.probe_pods: Mirror[observe.ProbePod] = Mirror(
            self.api,
            Kind(
                "probe-pods",
                "list_namespaced_pod",
                namespace=namespace,
                label_selector=probe,
                path="/api/v1/namespaces/{namespace}/pods",
            ),
            observe.probe_pod,
            groups=lambda pod: (pod.test_name,),
            on_change=self._probe_pods_changed,
            page_size=page_size,
        )
        self.probe_jobs: Mirror[tuple[observe.ProbeJob, str]] = Mirror(
            self.api,
            Kind(
                "probe-jobs",
                "list_namespaced_job",
                api="BatchV1Api",
                namespace=namespace,
                label_selector=probe,
                path="/apis/batch/v1/namespaces/{namespace}/jobs",
            ),
            _job_entry,
            groups=lambda entry: (entry[0].test_name,),
            on_change=self._probe_jobs_changed,
            page_size=page_size,
        )
        self.tests: Mirror[TestSnapshot] = Mirror(
            self.api,
            cluster_custom(GROUP, VERSION, "sdctests"),
            TestSnapshot.slim,
            groups=_test_groups,
            on_change=self._tests_changed,
            page_size=page_size,
        )
        self.tickets: Mirror[TicketSnapshot] = Mirror(
            self.api,
            cluster_custom(GROUP, VERSION, "repairtickets"),
            TicketSnapshot.from_body,
            groups=_ticket_groups,
            on_change=self._tickets_changed,
            page_size=page_size,
        )
        self.hardware: Mirror[HardwareRecord] = Mirror(
            self.api,
            cluster_custom(GROUP, VERSION, "sdchardwares"),
            HardwareRecord.from_body,  # an unreadable record is logged and left out
            on_change=self._hardware_changed,
            page_size=page_size,
        )
        self.slices: Mirror[SliceSnapshot] = Mirror(
            self.api,
            dataclasses.replace(cluster_custom(*RESOURCE_SLICES), optional=True),
            SliceSnapshot.from_body,
            groups=lambda s: (s.node,),
            on_change=self._slices_changed,
            page_size=page_size,
        )
        self.book: WorkloadBook | None = None
        """Every node's workload record (None: not kept, without a writer)."""
        if writer is not None:
            self.keep_records(writer, record_seconds)
        self.mirrors: tuple[Mirror[Any], ...] = (
            self.nodes,
            self.pods,
            self.probe_pods,
            self.probe_jobs,
            self.tests,
            self.tickets,
            self.hardware,
            self.slices,
        )
        # The workload Pods list last, after the kinds that probe ends need (those
        # :meth:`probes_synced` waits for), and they outnumber the Nodes ten to one.
        # Listed at once beside the rest, their list took the API server's and the CPU's
        # time from those kinds (a restart at 5,000 nodes and 50,000 Pods: the SDCTests'
        # list 12 s, done 4 s after the Pods'). The passes wait for every kind either way.
        self.pods.after = tuple(m.synced for m in self.mirrors if m is not self.pods)

    # Life ---------------------------------------------------------------------

    def start(
        self,
        loop: asyncio.AbstractEventLoop,
        poke: Poke,
        on_node: Callable[[str, NodeSnapshot | None], None] | None = None,
    ) -> None:
        """Start the mirrors (unless :meth:`warm` did); ``poke`` and ``on_node`` (each
        node that changed, and how it is now, None when deleted) are called in ``loop``."""
        self._loop, self._poke, self._on_node = loop, poke, on_node
        self.warm()

    def warm(self) -> None:
        """Start listing and watching without anyone to tell (a standby replica): the
        copy stays current, and the first pass after :meth:`start` is a full one."""
        if self._started:
            return
        self._started = True
        for mirror in self.mirrors:
            mirror.start(self._stop)
        if self.book is not None:
            self._start_keeper(self.book)

    def keep_records(self, writer: KubeWriter, record_seconds: float) -> None:
        """Keep every node's workload record from now on, written through ``writer``
        (a standby replica keeps none: it attaches them once it leads)."""
        if self.book is not None:
            return
        self.record_seconds = record_seconds
        self.book = WorkloadBook(
            writer,
            OwnerResolver(self.api),
            node=self.nodes.get,
            live=self.node_uses,
            clock=self.clock,
            on_idle=self._idle_from_record,
        )
        if self._started:  # warmed already: its keeper starts now
            self._start_keeper(self.book)

    def _start_keeper(self, book: WorkloadBook) -> None:
        keeper = threading.Thread(
            target=self._keep_records, args=(book, self._records_stop), name="workload-records"
        )
        keeper.daemon = True
        keeper.start()

    def _keep_records(self, book: WorkloadBook, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                idle = book.load(self.page_size)
                break
            except Exception as exc:  # the API server is not there yet: try again
                log.warning("workload records not listed yet", error=str(exc))
                stop.wait(1.0)
        else:
            return
        for node, since in idle.items():
            self.last_busy.setdefault(node, since)
        book.run(stop, self.record_seconds, self.synced)

    def stop(self) -> None:
        self._stop.set()
        self._records_stop.set()
        for mirror in self.mirrors:
            mirror.stop_watch()

    def detach(self) -> None:
        """Kopf stops but the process stands by (a leader that lost its Lease): tell
        no event loop any more and stop keeping the workload records (their writer was
        the leader's), but go on listing and watching, so the copy stays warm for the
        next :meth:`start`, whose :meth:`keep_records` starts a new keeper."""
        self._loop = self._poke = self._on_node = None
        self._records_stop.set()
        self._records_stop = threading.Event()
        self.book = None

    def synced(self) -> bool:
        """Every mirror has listed completely at least once (and the workload records,
        where idle times resume after a restart, have been read back)."""
        return self.probes_synced() and self.workloads_synced()

    def probes_synced(self) -> bool:
        """Every mirror but the workload Pods' has listed completely at least once, and
        the workload records have been read back: enough to judge a probe's end (its
        node, test, Pod, Job, tickets and hardware are all known, and the blast radius
        of a quarantine reads the records and that node's own Pods; see
        :meth:`node_uses`)."""
        book = self.book
        if book is not None and not book.loaded.is_set():
            return False
        return all(m.synced.is_set() for m in self.mirrors if m is not self.pods)

    def workloads_synced(self) -> bool:
        """The workload Pods have listed completely at least once: only then is a node
        without a Pod in the copy known to be idle, and a pending Pod's demand known."""
        return self.pods.synced.is_set()

    async def wait_synced(self, stopped: Callable[[], bool], *, probes: bool = False) -> bool:
        """Wait until :meth:`synced` (``probes``: :meth:`probes_synced`) is true (True),
        or ``stopped()`` (False)."""
        ready = self.probes_synced if probes else self.synced
        while not ready():
            if stopped():
                return False
            await asyncio.sleep(0.05)
        return True

    # What a pass reads --------------------------------------------------------

    def node_bodies(self, only: Iterable[str] | None = None) -> dict[str, NodeSnapshot]:
        """The Nodes (``only``: just these), each with the devices its ResourceSlices
        publish (``NodeSnapshot.dra_devices``)."""
        if only is None:
            nodes = self.nodes.items()
        else:
            nodes = {k: n for k in only if (n := self.nodes.get(k)) is not None}
        for name, published in self.slices.grouped(None if only is None else nodes).items():
            node = nodes.get(name)
            if node is not None:
                nodes[name] = dataclasses.replace(node, dra_devices=device_counts(published))
        return nodes

    def id_holders(self, nodes: Iterable[NodeSnapshot]) -> dict[str, tuple[str, ...]]:
        """For each host identifier of ``nodes``, the names of the Nodes holding it."""
        return id_holders(nodes, lambda key: [n.name for n in self.nodes.group(key)])

    def busy(self, only: Iterable[str] | None = None) -> dict[str, list[observe.PodUse]]:
        names = None if only is None else [f"node/{n}" for n in only]
        return {
            group[len("node/") :]: [e for e in entries if isinstance(e, observe.PodUse)]
            for group, entries in self.pods.grouped(names).items()
            if group.startswith("node/")
        }

    def node_uses(self, node: str) -> list[observe.PodUse]:
        """The Pods using ``node``'s accelerators: from the copy once the workload Pods
        have listed, before that with one list of the node's own Pods (a quarantine's
        blast radius while the copy of a big fleet's Pods is still listing)."""
        if self.workloads_synced():
            return self.busy([node]).get(node, [])
        listed = self.pods.fetch(f"spec.nodeName={node}")
        return [e for e in listed if isinstance(e, observe.PodUse) and e.node_name == node]

    def pending(self) -> list[observe.PendingDemand]:
        return [e for e in self.pods.group(PENDING) if isinstance(e, observe.PendingDemand)]

    def probe_pods_by_test(
        self, tests: Iterable[str] | None = None
    ) -> dict[str, list[observe.ProbePod]]:
        return self.probe_pods.grouped(tests)

    def probe_jobs_by_test(self, tests: Iterable[str] | None = None) -> dict[str, observe.ProbeJob]:
        return {test: entries[0][0] for test, entries in self.probe_jobs.grouped(tests).items()}

    def tests_by_node(self, only: Iterable[str] | None = None) -> dict[str, list[TestSnapshot]]:
        """Every SDCTest by the node its spec names (``only``: just these nodes')."""
        return self.tests.grouped(only)

    def tickets_by_node(self, only: Iterable[str] | None = None) -> dict[str, list[TicketSnapshot]]:
        """Every RepairTicket by the node its spec names (``only``: just these nodes')."""
        return self.tickets.grouped(only)

    def hardware_records(self) -> dict[str, HardwareRecord]:
        """Every readable SDCHardware by name."""
        return self.hardware.items()

    def node_of_test(self, test: str) -> str | None:
        """The node an SDCTest is about: as the passes noted it, else as the copy has it."""
        node = self.test_node(test)
        if node:
            return node
        snapshot = self.tests.get(test)
        return snapshot.node_name or None if snapshot is not None else None

    # Changes (called in a mirror's thread; pokes run in the event loop) ------------

    def _call(self, nodes: Iterable[str] | None, **kwargs: Any) -> None:
        loop, poke = self._loop, self._poke
        if loop is None or poke is None or loop.is_closed():
            return
        names = None if nodes is None else list(nodes)
        loop.call_soon_threadsafe(lambda: poke(names, **kwargs))

    def _nodes_changed(self, changes: list[Change[NodeSnapshot]]) -> None:
        loop, on_node = self._loop, self._on_node
        if loop is not None and on_node is not None and not loop.is_closed():
            for change in changes:
                loop.call_soon_threadsafe(on_node, change.key, change.new)
        book = self.book  # read once: detach() may drop it from another thread
        if book is not None:
            for change in changes:
                if change.new is None:
                    book.forget(change.key)
        if len(changes) > FULL_PASS_AFTER:
            self._call(None)
        else:
            self._call([c.key for c in changes])

    def _pods_changed(self, changes: list[Change[observe.PodUse | observe.PendingDemand]]) -> None:
        touched: set[str] = set()
        started: list[observe.PodUse] = []
        stopped: list[observe.PodUse] = []
        for change in changes:
            old = change.old if isinstance(change.old, observe.PodUse) else None
            new = change.new if isinstance(change.new, observe.PodUse) else None
            if old is not None and (new is None or new.node_name != old.node_name):
                # The workload stopped using this node's devices: idle counts from now.
                self.last_busy[old.node_name] = self.clock()
                touched.add(old.node_name)
                stopped.append(old)
            if new is not None:
                touched.add(new.node_name)
                if old is None or old.node_name != new.node_name:
                    started.append(new)
        book = self.book
        if book is not None and (started or stopped):
            book.note(started, stopped)
        self._call_nodes(touched)

    def _idle_from_record(self, node: str, since: dt.datetime) -> None:
        """The record found the node idle (its Pods ended while no one watched): idle
        time counts from then, unless a stop seen since says more."""
        if node not in self.last_busy:
            self.last_busy[node] = since
            self._call([node])

    def _probe_pods_changed(self, changes: list[Change[observe.ProbePod]]) -> None:
        for change in changes:
            pod = change.new or change.old
            assert pod is not None
            ended = change.new is not None and change.new.phase in ("Succeeded", "Failed")
            # A Pod being deleted (a drain) is looked at at once, while it is still there.
            deleting = change.new is not None and change.new.deleted
            node = pod.node_name or self.node_of_test(pod.test_name)
            self._call(
                [node] if node else [],
                urgent=ended or deleting,
                pod=change.new if ended else None,
            )

    def _probe_jobs_changed(self, changes: list[Change[tuple[observe.ProbeJob, str]]]) -> None:
        for change in changes:
            entry = change.new or change.old
            assert entry is not None
            job, label = entry
            now = change.new[0] if change.new is not None else None
            ended = now is not None and now.failed_reason is not None
            node = self.node_of_test(job.test_name) or label
            self._call([node] if node else [], urgent=ended, job=now if ended else None)

    def _tests_changed(self, changes: list[Change[TestSnapshot]]) -> None:
        self._call_nodes({s.node_name for c in changes for s in (c.old, c.new) if s is not None})

    def _tickets_changed(self, changes: list[Change[TicketSnapshot]]) -> None:
        self._call_nodes({t.node_name for c in changes for t in (c.old, c.new) if t is not None})

    def _hardware_changed(self, changes: list[Change[HardwareRecord]]) -> None:
        # A record names hardware, not a Node: the nodes that hold it or were seen with it
        # are the ones its change can decide differently (a quarantine writes three
        # records; at 20,000 nodes a full pass each was seconds of CPU per quarantine).
        def holders(key: str) -> list[str]:
            return [n.name for n in self.nodes.group(key)]

        self._call_nodes(
            {
                name
                for change in changes
                for record in (change.old, change.new)
                if record is not None
                for name in concerned(record, holders)
            }
        )

    def _slices_changed(self, changes: list[Change[SliceSnapshot]]) -> None:
        self._call_nodes({s.node for c in changes for s in (c.old, c.new) if s is not None})

    def _call_nodes(self, nodes: set[str]) -> None:
        """Poke these nodes (all of them past FULL_PASS_AFTER: one full pass instead)."""
        nodes.discard("")
        if len(nodes) > FULL_PASS_AFTER:
            self._call(None)
        elif nodes:
            self._call(nodes)
