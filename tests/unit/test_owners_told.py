"""A quarantine's workloads are told (a Warning Event to each owner) before its ticket's
Open status is written, so a ticket with a status has told them. A ticket found without
a status was created by an attempt that was cut short (its node patch conflicted, or the
operator stopped): whoever writes its status tells the owners first, so an owner may be
told twice but never not at all."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any, cast

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sdcguard.adapters.observe import TicketSnapshot
from sdcguard.adapters.reconciler import FleetView, Reconciler
from sdcguard.adapters.workload_record import WorkloadBook
from sdcguard.api import BlastRadius
from sdcguard.domain import keys
from sdcguard.domain.decide import Decision
from sdcguard.metrics import Metrics
from sdcguard.settings import Settings
from tests.unit.factories import NOW
from tests.unit.test_apply_order import _Recorder
from tests.unit.test_hardware import failing
from tests.unit.test_history_after_patch import POLICY, _host

RADIUS = BlastRadius.model_validate(
    {
        "windowStart": "2025-06-01T09:00:00Z",
        "windowEnd": keys.format_time(NOW),
        "workloads": [
            {
                "namespace": "team-a",
                "kind": "Job",
                "name": "train",
                "apiVersion": "batch/v1",
                "uid": "u-1",
                "pods": ["train-0"],
                "podCount": 1,
                "accelerators": 8,
                "firstSeen": "2025-06-01T09:30:00Z",
            },
            {
                "namespace": "team-b",
                "kind": "Pod",
                "name": "notebook",
                "firstSeen": "2025-06-01T09:40:00Z",
            },
        ],
        "advice": "roll back to a checkpoint saved before the window",
    }
)


class _Book:
    """The workload record's answer for gpu-1: the two workloads above."""

    def blast_radius(self, node: str, end: dt.datetime) -> BlastRadius | None:
        return RADIUS if node == "gpu-1" else None


class _Writer(_Recorder):
    """Every write in order; the first ``conflicts`` node patches answer 409, and a
    ticket whose name is in ``existing`` is not created again (the API's 409)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.conflicts = 0
        self.existing: set[str] = set()

    def patch_node(self, name: str, patch: dict[str, Any]) -> None:
        super().patch_node(name, patch)
        if self.conflicts:
            self.conflicts -= 1
            raise ApiException(status=409, reason="Conflict")

    def create_custom(self, plural: str, body: dict[str, Any]) -> dict[str, Any] | None:
        name = body["metadata"]["name"]
        if name in self.existing:
            self.calls.append((f"{plural}-exists", body))
            return None
        self.existing.add(name)
        return super().create_custom(plural, body)

    def event(self, **kw: Any) -> None:
        self.calls.append(("event", (kw["reason"], kw.get("namespace", ""), kw["name"])))


def _reconciler() -> tuple[Reconciler, _Writer]:
    metrics = Metrics()
    writer = _Writer(api=client.ApiClient(), metrics=metrics)
    rec = Reconciler(writer=writer, settings=Settings(metrics_port=0), metrics=metrics)
    rec.workloads = cast(WorkloadBook, _Book())
    return rec, writer


def _owners(writer: _Writer) -> list[tuple[str, str]]:
    """(namespace, name) of each workload told, in order."""
    return [
        (what[1], what[2])
        for kind, what in writer.calls
        if kind == "event" and what[0] == "SDCBlastRadius"
    ]


def _ticket_body(writer: _Writer, status: dict[str, Any] | None = None) -> TicketSnapshot:
    """The ticket as the first attempt created it, as the operator's copy sees it."""
    body = next(b for kind, b in writer.calls if kind == "repairtickets-create")
    seen = {**body, "metadata": {**body["metadata"], "creationTimestamp": keys.format_time(NOW)}}
    return TicketSnapshot.from_body({**seen, **({"status": status} if status else {})})


def _quarantine() -> Decision:
    return failing(None)


def test_the_owners_are_told_before_the_tickets_status() -> None:
    rec, writer = _reconciler()
    view = FleetView(nodes={"gpu-1": _host()}, policies={"fleet": {}})
    counts: Counter[str] = Counter()
    rec.executor.apply(POLICY, _quarantine(), view, NOW, counts)
    kinds = [kind for kind, _ in writer.calls]
    assert kinds[:3] == ["repairtickets-create", "node-patch", "node-status-patch"], kinds
    assert kinds[3:6] == ["event", "event", "repairtickets-status"], kinds
    assert _owners(writer) == [("team-a", "train"), ("team-b", "notebook")]
    assert counts["blast-radius-events"] == 2
    created = next(b for kind, b in writer.calls if kind == "repairtickets-create")
    assert created["spec"]["blastRadius"]["workloads"][0]["name"] == "train"


@pytest.mark.parametrize("in_copy", [True, False], ids=["in-the-copy", "not-yet-in-the-copy"])
def test_a_repeat_after_a_conflicting_node_patch_tells_the_owners_once(in_copy: bool) -> None:
    """The first attempt created the ticket and its node patch conflicted: no owner was
    told and no status written. The repeat finds the ticket without a status, tells
    the owners what the ticket records, then writes the status. A repeat that comes
    before the watch has brought the ticket (it exists, the copy does not know it)
    tells them with the radius as it stands, not half a minute later, when
    restore_status would find the ticket without a status."""
    rec, writer = _reconciler()
    writer.conflicts = 1
    view = FleetView(nodes={"gpu-1": _host()}, policies={"fleet": {}})
    with pytest.raises(ApiException):
        rec.executor.apply(POLICY, _quarantine(), view, NOW, Counter())
    assert _owners(writer) == [] and "repairtickets-status" not in [k for k, _ in writer.calls]

    ticket = _ticket_body(writer)
    assert not ticket.has_status
    if in_copy:
        view.tickets = {"gpu-1": [ticket]}
    writer.calls.clear()
    counts: Counter[str] = Counter()
    rec.executor.apply(POLICY, _quarantine(), view, NOW, counts)
    kinds = [kind for kind, _ in writer.calls]
    assert kinds[:6] == [
        "repairtickets-exists",
        "node-patch",
        "node-status-patch",
        "event",
        "event",
        "repairtickets-status",
    ], kinds
    assert _owners(writer) == [("team-a", "train"), ("team-b", "notebook")]
    assert counts["tickets-resumed"] == 1


def test_a_repeat_that_finds_the_ticket_with_its_status_tells_no_one_again() -> None:
    rec, writer = _reconciler()
    view = FleetView(nodes={"gpu-1": _host()}, policies={"fleet": {}})
    rec.executor.apply(POLICY, _quarantine(), view, NOW, Counter())
    opened = {"phase": "Open", "cycle": 1, "openedAt": keys.format_time(NOW)}
    view.tickets = {"gpu-1": [_ticket_body(writer, opened)]}
    writer.calls.clear()
    counts: Counter[str] = Counter()
    rec.executor.apply(POLICY, _quarantine(), view, NOW, counts)
    assert _owners(writer) == []
    assert "repairtickets-status" not in [k for k, _ in writer.calls]
    assert counts["tickets-resumed"] == 0


def test_a_status_restored_late_tells_the_owners_once_per_incident() -> None:
    """The operator stopped between creating the tickets of one incident (scope Device:
    one per GPU, the same blast radius) and their statuses: the restore tells each owner
    once and writes both statuses."""
    rec, writer = _reconciler()
    created = keys.format_time(NOW - dt.timedelta(minutes=2))

    def ticket(name: str) -> TicketSnapshot:
        return TicketSnapshot.from_body(
            {
                "apiVersion": "sdcguard.dev/v1alpha1",
                "kind": "RepairTicket",
                "metadata": {"name": name, "resourceVersion": "7", "creationTimestamp": created},
                "spec": {
                    "nodeName": "gpu-1",
                    "policyRef": "fleet",
                    "evidence": ["s1"],
                    "blastRadius": RADIUS.model_dump(mode="json", by_alias=True),
                },
            }
        )

    counts: Counter[str] = Counter()
    rec.tickets.restore_status([ticket("gpu-1-d0"), ticket("gpu-1-d1")], NOW, counts)
    assert _owners(writer) == [("team-a", "train"), ("team-b", "notebook")]
    kinds = [kind for kind, _ in writer.calls]
    assert kinds == ["event", "event", "repairtickets-status", "repairtickets-status"]
    assert counts["ticket-status-restored"] == 2
