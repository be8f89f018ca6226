"""The workload record and the blast radius, decided purely (time passed in).

A node's record lists the workloads (top owners of Pods) that used its accelerators
since its last passing screening. :func:`update_record` folds what the operator saw
(the Pods using the node now, the Pods that stopped and when) into the record it had;
:func:`blast_radius` is what a failing screening tells: the window and the workloads.

Bounds (``api.workloads``): Pods merge into their top owner's entry (a Job that runs
10,000 short Pods on a node is one entry with ``podCount`` 10,000 and its newest
names); past ``MAX_WORKLOADS`` entries the oldest that ended are dropped first (counted
in ``dropped``). A running entry is never dropped: while more than ``MAX_WORKLOADS``
workloads use one node at once, the newest are left out until older ones end.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sdcguard.api.ticket import BlastRadius
from sdcguard.api.workloads import (
    MAX_POD_NAMES,
    MAX_RUNNING,
    MAX_WORKLOADS,
    Workload,
    WorkloadRecordStatus,
)
from sdcguard.domain.echo import bounded

ADVICE = (
    "roll back to a checkpoint saved before {start} and re-run the steps since on "
    "other nodes; treat results and checkpoints written in the window as suspect"
)


@dataclass(frozen=True)
class TopOwner:
    """The object at the top of a Pod's ownerReferences (the Pod itself if it has none)."""

    namespace: str
    kind: str
    name: str
    api_version: str = "v1"
    uid: str | None = None
    note: str | None = None
    """Why the top may not be the real top (a deleted owner, a cycle, no permission)."""

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.namespace, self.kind, self.name)


@dataclass(frozen=True)
class LivePod:
    """A Pod that uses the node's accelerators now, with its top owner."""

    namespace: str
    name: str
    owner: TopOwner
    accelerators: int
    started: dt.datetime
    """When the operator first saw it using the node."""


def _key(w: Workload) -> tuple[str, str, str]:
    return (w.namespace, w.kind, w.name)


def _entry(owner: TopOwner, at: dt.datetime) -> Workload:
    return Workload.model_validate(
        {
            "namespace": owner.namespace[:63],
            "kind": owner.kind[:63],
            "name": owner.name[:253],
            "apiVersion": owner.api_version[:128],
            "uid": (owner.uid or "")[:63] or None,
            "note": bounded(owner.note, 256) if owner.note else None,
            "firstSeen": at,
        }
    )


def update_record(
    record: WorkloadRecordStatus,
    live: Iterable[LivePod],
    stopped: Mapping[tuple[str, str], dt.datetime],
    passed_at: dt.datetime | None,
    now: dt.datetime,
) -> WorkloadRecordStatus:
    """The record after what was seen: ``live`` Pods use the node now; ``stopped`` Pods
    (namespace, name) stopped using it at those times; ``passed_at`` is the node's last
    passing screening. A Pod the record lists as running that is neither live nor in
    ``stopped`` stopped unseen (while the operator was down): it counts as stopped
    ``now``."""
    since = record.since
    entries = [w.model_copy(deep=True) for w in record.workloads]
    dropped, dropped_until = record.dropped, record.dropped_until
    if passed_at is not None and (since is None or passed_at > since):
        # A passing screening clears what ended before it: those runs used a good node.
        since = passed_at
        entries = [w for w in entries if w.last_seen is None or w.last_seen > passed_at]
        dropped, dropped_until = 0, None
    by_key = {_key(w): w for w in entries}
    live_by_key: dict[tuple[str, str, str], list[LivePod]] = {}
    for pod in live:
        live_by_key.setdefault(pod.owner.key, []).append(pod)
    busy = sum(1 for key in live_by_key if key in by_key)
    for key, pods in sorted(live_by_key.items(), key=lambda kv: min(p.started for p in kv[1])):
        entry = by_key.get(key)
        if entry is None:
            if busy >= MAX_WORKLOADS:
                continue  # more workloads at once than the bound: the newest wait
            busy += 1
            entry = _entry(pods[0].owner, min(p.started for p in pods))
            by_key[key] = entry
            entries.append(entry)
        for pod in sorted(pods, key=lambda p: (p.started, p.name)):
            if pod.name not in entry.pods and pod.name not in entry.running:
                entry.pod_count += 1
            if pod.name not in entry.pods:
                entry.pods = [*entry.pods, pod.name][-MAX_POD_NAMES:]
            entry.accelerators = max(entry.accelerators, pod.accelerators)
        entry.running = sorted(p.name for p in pods)[:MAX_RUNNING]
        entry.last_seen = None
    idle_since = record.idle_since if not live_by_key else None
    for entry in entries:
        if _key(entry) in live_by_key or not entry.running:
            continue
        ended = [stopped.get((entry.namespace, pod), now) for pod in entry.running]
        entry.running = []
        entry.last_seen = max(ended)
        if not live_by_key:
            idle_since = max(idle_since or entry.last_seen, entry.last_seen)
    if not live_by_key and idle_since is None:
        idle_since = max((s for s in stopped.values()), default=None)
    entries.sort(key=lambda w: (w.first_seen, _key(w)))
    while len(entries) > MAX_WORKLOADS:
        # Never a running one: at most MAX_WORKLOADS run (above), so an ended one is left.
        ended_entries = [w for w in entries if w.last_seen is not None]
        victim = min(ended_entries, key=lambda w: (w.last_seen or w.first_seen, _key(w)))
        entries.remove(victim)
        dropped += 1
        seen = victim.last_seen or now
        dropped_until = seen if dropped_until is None else max(dropped_until, seen)
    return WorkloadRecordStatus(
        since=since,
        idle_since=idle_since,
        workloads=entries,
        dropped=dropped,
        dropped_until=dropped_until,
    )


def blast_radius(
    record: WorkloadRecordStatus | None, passed_at: dt.datetime | None, end: dt.datetime
) -> BlastRadius:
    """What a failing screening at ``end`` tells: the workloads of the window from the
    last pass (the record's, or ``passed_at`` if later) to ``end``."""
    start = record.since if record is not None else None
    if passed_at is not None and (start is None or passed_at > start):
        start = passed_at
    workloads: list[Workload] = []
    dropped = 0
    if record is not None:
        workloads = [
            w
            for w in record.workloads
            if start is None or w.last_seen is None or w.last_seen > start
        ]
        if record.dropped and (
            start is None or record.dropped_until is None or record.dropped_until > start
        ):
            dropped = record.dropped
    when = start.strftime("%Y-%m-%dT%H:%M:%SZ") if start is not None else "the node's first use"
    return BlastRadius(
        window_start=start,
        window_end=end,
        workloads=workloads,
        dropped=dropped,
        advice=ADVICE.format(start=when),
    )


def owner_message(node: str, radius: BlastRadius, workload: Workload, ticket: str) -> str:
    """The Warning Event a workload's owner gets in its namespace."""
    start = (
        radius.window_start.strftime("%Y-%m-%dT%H:%M:%SZ")
        if radius.window_start is not None
        else "its first recorded use"
    )
    end = radius.window_end.strftime("%Y-%m-%dT%H:%M:%SZ")
    pods = ", ".join(workload.pods) or "-"
    return (
        f"node {node} failed an SDC screening (silent data corruption, RepairTicket "
        f"{ticket}); {workload.kind} {workload.name} used {workload.accelerators} of its "
        f"accelerators in the window {start} .. {end} ({workload.pod_count} pods: {pods}). "
        f"What to do: {radius.advice}"
    )
