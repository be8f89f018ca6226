"""The workload record of every node: kept in memory, written to the node's
WorkloadRecord (``api.workloads``) when it changes, read back after a restart.

Why an object of its own, one per node (and not the Node, a ticket or a ConfigMap):
the record changes with every workload that comes and goes, and a Node written that
often would cost every watcher of Nodes an event per pod (the fleet's most watched
kind); a ticket exists only after a failure, but the record must be there before;
and a typed, cluster-scoped custom resource is validated by the API server, bounded
by its schema, listed with ``kubectl get sdcw`` and readable by the CLI.

Writes: the mirror's Pod changes only mark nodes (:meth:`WorkloadBook.note`); a
flusher writes each marked node's record at most once per ``workload_record_seconds``
(eight nodes at once) and only when it changed, so a node with nothing to do costs
nothing, and a node with 10,000 short Pods costs one write per period. A node's first
record is created once (then only its status is patched); the record of a deleted Node
is deleted.

After a restart the records are listed before any pass runs; their ``idleSince`` is
where the inventory's idle time resumes, and a Pod recorded as running that has gone
meanwhile counts as stopped when the operator saw it gone.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from sdcguard.adapters.kube import KubeWriter
from sdcguard.adapters.observe import PodUse
from sdcguard.adapters.owners import OwnerResolver
from sdcguard.api import (
    GROUP,
    VERSION,
    WORKLOADS,
    BlastRadius,
    ObjectMeta,
    WorkloadRecord,
    WorkloadRecordSpec,
    WorkloadRecordStatus,
    to_body,
)
from sdcguard.domain import keys
from sdcguard.domain.blast import LivePod, blast_radius, update_record
from sdcguard.domain.observed import NodeSnapshot

log = structlog.get_logger("sdcguard.workloads")

PLURAL = WORKLOADS.plural
WRITERS = 8
"""Nodes whose records one flush writes at once (:meth:`WorkloadBook.flush`)."""


class WorkloadBook:
    """Every node's record (module docstring). Thread-safe: the mirror's thread notes,
    the flusher writes, a pass reads the blast radius."""

    def __init__(
        self,
        writer: KubeWriter,
        resolver: OwnerResolver,
        *,
        node: Callable[[str], NodeSnapshot | None],
        live: Callable[[str], list[PodUse]],
        clock: Callable[[], dt.datetime],
        on_idle: Callable[[str, dt.datetime], None] | None = None,
        workers: int = WRITERS,
    ) -> None:
        self.writer = writer
        self.workers = workers
        self.resolver = resolver
        self.node = node
        self.live = live
        self.clock = clock
        self.on_idle = on_idle
        self._records: dict[str, bytes] = {}
        """As last written (or read back), as JSON: a third of the memory of the models."""
        self._exists: set[str] = set()
        self._started: dict[str, dict[tuple[str, str], dt.datetime]] = {}
        """node -> (namespace, pod) -> when it was first seen using the node."""
        self._stopped: dict[str, dict[tuple[str, str], dt.datetime]] = {}
        self._dirty: set[str] = set()
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self.loaded = threading.Event()
        self.writes = 0
        self.off: str | None = None
        """Why no record is kept (the CRD is not installed, or not readable), else None."""

    # Start ----------------------------------------------------------------------

    def load(self, page_size: int = 500) -> dict[str, dt.datetime]:
        """Read every record back (paged); returns node -> idle since, for nodes whose
        record says nothing used them when it was written."""
        custom = client.CustomObjectsApi(self.writer.api)
        token: str | None = None
        idle: dict[str, dt.datetime] = {}
        while True:
            try:
                listed: Any = custom.list_cluster_custom_object(
                    GROUP, VERSION, PLURAL, limit=page_size, _continue=token
                )
            except ApiException as exc:
                if exc.status not in (403, 404):
                    raise
                # An upgrade that left the CRDs behind (helm does not upgrade them), or
                # RBAC without the rule: screen and quarantine as before, record nothing.
                self.off = (
                    f"workload records are off: listing {PLURAL}.{GROUP} answered "
                    f"{exc.status}; apply the chart's CRDs and RBAC"
                )
                log.warning("workload records off", reason=self.off)
                self.loaded.set()
                return {}
            page: dict[str, Any] = listed if isinstance(listed, dict) else {}
            for body in page.get("items") or []:
                try:
                    record = WorkloadRecord.model_validate(body)
                except ValidationError as exc:
                    name = (body.get("metadata") or {}).get("name")
                    log.warning("unreadable workload record ignored", record=name, error=str(exc))
                    continue
                node = record.spec.node_name
                status = record.status or WorkloadRecordStatus()
                with self._lock:
                    self._exists.add(node)
                    self._records[node] = status.model_dump_json().encode()
                    # Settled once against the fleet's copy: Pods that ended and Nodes
                    # deleted while no one watched (an unchanged record costs no write).
                    self._dirty.add(node)
                if status.idle_since is not None and not any(w.running for w in status.workloads):
                    idle[node] = status.idle_since
            token = (page.get("metadata") or {}).get("continue") or None
            if not token:
                break
        self.loaded.set()
        return idle

    # Changes (the mirror's thread) -------------------------------------------------

    def note(self, started: Iterable[PodUse], stopped: Iterable[PodUse]) -> None:
        """Pods that started or stopped using a node (only marks; the flusher writes)."""
        now = self.clock()
        with self._lock:
            for use in stopped:
                self._stopped.setdefault(use.node_name, {})[(use.namespace, use.name)] = now
                self._dirty.add(use.node_name)
            for use in started:
                pods = self._started.setdefault(use.node_name, {})
                pods.setdefault((use.namespace, use.name), now)
                self._dirty.add(use.node_name)

    def forget(self, node: str) -> None:
        """The Node was deleted: its record goes at the next flush."""
        with self._lock:
            self._dirty.add(node)

    # Reading ------------------------------------------------------------------

    def record(self, node: str) -> WorkloadRecordStatus | None:
        """The node's record as last written (None: it has none)."""
        raw = self._records.get(node)
        return None if raw is None else WorkloadRecordStatus.model_validate_json(raw)

    def nodes(self) -> list[str]:
        """The nodes that have a record."""
        with self._lock:
            return list(self._records)

    def _folded(self, node: str, now: dt.datetime, take: bool) -> WorkloadRecordStatus:
        snapshot = self.node(node)
        uses = self.live(node)
        with self._lock:
            old = self.record(node) or WorkloadRecordStatus()
            stopped = self._stopped.pop(node, {}) if take else dict(self._stopped.get(node, {}))
            seen = self._started.get(node, {})
            started = {p: seen.get((p.namespace, p.name), now) for p in uses}
        pods = [
            LivePod(
                namespace=use.namespace,
                name=use.name,
                owner=self.resolver.top(use.namespace, use.name, use.owner),
                accelerators=use.devices,
                started=started[use],
            )
            for use in uses
        ]
        passed = keys.parse_time(snapshot.annotations.get(keys.QUALIFIED_AT)) if snapshot else None
        return update_record(old, pods, stopped, passed, now)

    def blast_radius(self, node: str, end: dt.datetime) -> BlastRadius | None:
        """The blast radius of a failing screening of ``node`` at ``end``, from the record
        as it is now (including what the flusher has not written yet); None while
        records are off."""
        if self.off is not None:
            return None
        snapshot = self.node(node)
        passed = keys.parse_time(snapshot.annotations.get(keys.QUALIFIED_AT)) if snapshot else None
        return blast_radius(self._folded(node, end, take=False), passed, end)

    # Writing ------------------------------------------------------------------

    def flush(self) -> int:
        """Write the records of marked nodes that changed, up to :attr:`workers` nodes
        at once; returns the writes made.

        In parallel because each write waits for the API server: one at a time, a node's
        create and status patch take two round trips, so thousands of nodes given their
        first training Pods at once would take minutes to record on a loaded API server.
        A node's own writes stay in order (one worker
        writes all of a node's), and a failing node is marked for the next period."""
        if self.off is not None:
            return 0
        with self._write_lock:
            with self._lock:
                nodes, self._dirty = sorted(self._dirty), set()
            if self.workers <= 1 or len(nodes) <= 1:
                made = sum(self._try_flush(node) for node in nodes)
            else:
                with ThreadPoolExecutor(
                    max_workers=min(self.workers, len(nodes)),
                    thread_name_prefix="workload-record",
                ) as pool:
                    made = sum(pool.map(self._try_flush, nodes))
            self.writes += made
            return made

    def _try_flush(self, node: str) -> int:
        try:
            return self._flush_node(node)
        except ApiException as exc:
            log.warning("workload record not written", node=node, status=exc.status)
            with self._lock:
                self._dirty.add(node)  # next period
            return 0

    def _flush_node(self, node: str) -> int:
        now = self.clock()
        if self.node(node) is None:
            return self._delete(node)
        with self._lock:
            live = set(self._started.get(node, {}))  # starts noted later stay for next time
        new = self._folded(node, now, take=True)
        with self._lock:
            old = self._records.get(node)
            exists = node in self._exists
        stored = new.model_dump_json().encode()
        if stored == old or (not exists and not new.workloads):
            return 0
        made = 0
        if not exists:
            record = WorkloadRecord(
                metadata=ObjectMeta(name=node, labels={keys.LABEL_NODE: node[:63]}),
                spec=WorkloadRecordSpec(node_name=node),
            )
            self.writer.create_custom(PLURAL, to_body(record))  # None: it existed already
            made += 1
        status = to_body(new)
        for field in ("since", "idleSince", "droppedUntil"):
            status.setdefault(field, None)  # a merge patch removes what is gone
        try:
            self.writer.patch_custom_status(PLURAL, node, status)
        except ApiException as exc:
            if exc.status != 404:
                raise
            with self._lock:
                self._exists.discard(node)
                self._dirty.add(node)
            return made
        made += 1
        running = {(w.namespace, p) for w in new.workloads for p in w.running}
        with self._lock:
            self._exists.add(node)
            self._records[node] = stored
            seen = self._started.get(node, {})
            for gone in live - running:
                seen.pop(gone, None)
            if not seen:
                self._started.pop(node, None)
        if self.on_idle is not None and new.idle_since is not None and not running:
            self.on_idle(node, new.idle_since)
        return made

    def _delete(self, node: str) -> int:
        with self._lock:
            exists = node in self._exists
            self._exists.discard(node)
            self._records.pop(node, None)
            self._stopped.pop(node, None)
            self._started.pop(node, None)
        if not exists:
            return 0
        self.writer.delete_custom(PLURAL, node)
        return 1

    # The flusher -------------------------------------------------------------------

    def run(self, stop: threading.Event, every: float, ready: Callable[[], bool]) -> None:
        """Flush every ``every`` seconds once ``ready()`` (the fleet's copy is complete:
        before that, a recorded Pod missing from a partial copy would look stopped)."""
        while not stop.wait(every):
            if not ready():
                continue
            try:
                self.flush()
            except Exception:  # a flush that fails is retried; marks are kept
                log.exception("workload record flush failed")
