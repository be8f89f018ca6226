"""A quarantine's hardware history goes out after its taint (plan stage HISTORY), and
the node patch says what it will be (``sdcguard.dev/history``), so an operator that
stops between the two still writes it: once, after a grace period, and never a second
time when the records already hold it."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import Counter
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sdcguard.adapters.hardware import HardwareRecord
from sdcguard.adapters.observe import TicketSnapshot
from sdcguard.adapters.reconciler import FleetView, Reconciler
from sdcguard.api import FailureKind, SDCHardwareSpec, SDCHardwareStatus, SDCPolicy, Verdict
from sdcguard.domain import keys
from sdcguard.domain.decide import decide
from sdcguard.domain.lifecycle import (
    TABLE,
    Annotate,
    NodeState,
    RecordHardware,
    history_note,
    parse_history_note,
)
from sdcguard.domain.observed import NodeSnapshot, Taint
from sdcguard.domain.plan import Stage
from sdcguard.metrics import Metrics
from sdcguard.settings import Settings
from tests.unit.factories import NOW, node, policy, sdctest
from tests.unit.test_apply_order import _Recorder
from tests.unit.test_decide import observe
from tests.unit.test_hardware import failing

POLICY = SDCPolicy.model_validate(
    {
        "apiVersion": "sdcguard.dev/v1alpha1",
        "kind": "SDCPolicy",
        "metadata": {"name": "fleet", "generation": 1, "resourceVersion": "1"},
        "spec": {"repair": {"maxRepairCycles": 2}, "confirmation": {"reruns": 0}},
    }
)


def _host(annotations: dict[str, str] | None = None, state: str = "Testing") -> NodeSnapshot:
    """gpu-1 with three trusted identifiers (provider ID, system UUID, machine ID)."""
    return NodeSnapshot.from_body(
        {
            "metadata": {
                "name": "gpu-1",
                "uid": "0a1b2c3d-0000",
                "resourceVersion": "5",
                "labels": {keys.LABEL_STATE: state},
                "annotations": annotations or {},
            },
            "spec": {"providerID": "aws:///us-east-1a/i-0abc123"},
            "status": {
                "allocatable": {"nvidia.com/gpu": "8"},
                "conditions": [{"type": "Ready", "status": "True"}],
                "nodeInfo": {
                    "systemUUID": "ec2a1b2c-3d4e-5f60-7182-93a4b5c6d7e8",
                    "machineID": "9f8e7d6c5b4a39281706f5e4d3c2b1a0",
                },
            },
        }
    )


def _reconciler() -> tuple[Reconciler, _Recorder]:
    metrics = Metrics()
    writer = _Recorder(api=client.ApiClient(), metrics=metrics)
    return Reconciler(writer=writer, settings=Settings(metrics_port=0), metrics=metrics), writer


def _hardware_writes(writer: _Recorder) -> list[str]:
    return [kind for kind, _ in writer.calls if kind.startswith("sdchardwares")]


def _quarantined_after(note: str, at: dt.datetime = NOW) -> NodeSnapshot:
    """gpu-1 as the quarantine's node patch left it: Quarantined since ``at``, with the
    history note the patch carried."""
    return _host({keys.STATE_SINCE: keys.format_time(at), keys.HISTORY: note}, "Quarantined")


def test_a_quarantine_writes_its_history_after_the_taint_and_the_ticket() -> None:
    decision = failing(None)
    record = next(a for a in decision.actions if isinstance(a, RecordHardware))
    assert record.failure == FailureKind.QUARANTINED
    assert [type(s) for s in decision.plan.stage(Stage.HISTORY)] == [RecordHardware]
    (annotate,) = [a for a in decision.actions if isinstance(a, Annotate)]
    changes = dict(annotate.changes)
    assert parse_history_note(changes[keys.HISTORY]) == (keys.format_time(NOW), (record,))
    assert changes[keys.STATE_SINCE] == keys.format_time(NOW)

    rec, writer = _reconciler()
    view = FleetView(nodes={"gpu-1": _host()}, policies={"fleet": {}})
    rec.executor.apply(POLICY, decision, view, NOW, Counter())
    kinds = [kind for kind, _ in writer.calls]
    assert kinds[:4] == [
        "repairtickets-create",
        "node-patch",
        "node-status-patch",  # the SDCQualified condition turns False
        "repairtickets-status",
    ], kinds
    assert sorted(kinds[4:10]) == ["sdchardwares-create"] * 3 + ["sdchardwares-status"] * 3
    assert kinds[10:] == ["event"]
    patch = writer.calls[1][1]
    assert any(t["key"] == "sdcguard.dev/quarantined" for t in patch["spec"]["taints"])
    assert patch["metadata"]["annotations"][keys.HISTORY] == changes[keys.HISTORY]
    # This process wrote it: a later look at the node finds nothing to restore.
    after = _quarantined_after(changes[keys.HISTORY])
    assert rec.history.restore(view, after, NOW + dt.timedelta(hours=1), Counter()) is None
    assert len(_hardware_writes(writer)) == 6


def test_a_history_lost_between_the_taint_and_its_records_is_written_once() -> None:
    """The operator stopped after the node patch: a new process (a restart, the standby)
    finds the note, waits out the grace period, writes the records once, and a later
    look (or a process that finds the records there) writes nothing."""
    record = RecordHardware(FailureKind.QUARANTINED, test="s1", ticket="gpu-1-t-1")
    body = _quarantined_after(history_note((record,), NOW))
    view = FleetView(nodes={"gpu-1": body}, policies={"fleet": {}})

    rec, writer = _reconciler()
    counts: Counter[str] = Counter()
    again = rec.history.restore(view, body, NOW + dt.timedelta(seconds=10), counts)
    assert again == NOW + dt.timedelta(seconds=30), "too young to tell: its writes may trail"
    assert _hardware_writes(writer) == []

    rec.history.restore(view, body, NOW + dt.timedelta(seconds=31), counts)
    creates = [b for kind, b in writer.calls if kind == "sdchardwares-create"]
    statuses = [b for kind, b in writer.calls if kind == "sdchardwares-status"]
    assert len(creates) == len(statuses) == 3
    for status in statuses:
        (failure,) = status["failures"]
        assert (failure["kind"], failure["ticket"], failure["test"]) == (
            "Quarantined",
            "gpu-1-t-1",
            "s1",
        )
        assert failure["time"] == keys.format_time(NOW), "dated at the decision, not now"
    assert counts["hardware-history-restored"] == 1

    rec.history.restore(view, body, NOW + dt.timedelta(minutes=5), counts)
    assert len(_hardware_writes(writer)) == 6, "once per note and process"

    # Another process that finds the records written writes nothing either.
    records = {
        b["metadata"]["name"]: HardwareRecord(
            b["metadata"]["name"],
            SDCHardwareSpec.model_validate(b["spec"]),
            SDCHardwareStatus.model_validate(s),
        )
        for b, s in zip(creates, statuses, strict=True)
    }
    other, other_writer = _reconciler()
    full = dataclasses.replace(view, hardware=records)
    assert other.history.restore(full, body, NOW + dt.timedelta(minutes=5), Counter()) is None
    assert _hardware_writes(other_writer) == []


def test_a_stale_or_unreadable_note_restores_nothing() -> None:
    record = RecordHardware(FailureKind.QUARANTINED, test="s1", ticket="gpu-1-t-1")
    later = NOW + dt.timedelta(hours=2)
    moved_on = _host(
        {keys.STATE_SINCE: keys.format_time(later), keys.HISTORY: history_note((record,), NOW)},
        "Repairing",
    )
    mangled = _quarantined_after('{"at": "2025-06-01T12:00:00Z", "records": [{"failure": 7}]}')
    for body in (moved_on, mangled, _quarantined_after("not json")):
        rec, writer = _reconciler()
        view = FleetView(nodes={"gpu-1": body}, policies={"fleet": {}})
        assert rec.history.restore(view, body, later + dt.timedelta(hours=1), Counter()) is None
        assert _hardware_writes(writer) == []
    assert parse_history_note(None) is None
    assert parse_history_note('{"at": "x", "records": []}') is None


def test_a_pass_comes_back_when_the_note_is_old_enough_and_writes_it() -> None:
    """After a restart the note is seen on the first pass, too young; the node is due
    again when it is old enough, and that pass writes the history."""
    record = RecordHardware(FailureKind.QUARANTINED, test="s1", ticket="gpu-1-t-1")
    body = _quarantined_after(history_note((record,), NOW))
    body = dataclasses.replace(
        body,
        taints=(Taint("sdcguard.dev/quarantined", "NoSchedule"),),
        unschedulable=True,
        annotations={
            **body.annotations,
            keys.OWNED_TAINTS: "sdcguard.dev/quarantined",
            keys.CORDONED_BY_US: "true",
        },
    )
    ticket = TicketSnapshot.from_body(
        {
            "apiVersion": "sdcguard.dev/v1alpha1",
            "kind": "RepairTicket",
            "metadata": {
                "name": "gpu-1-t-1",
                "resourceVersion": "7",
                "creationTimestamp": keys.format_time(NOW),
            },
            "spec": {"nodeName": "gpu-1", "policyRef": "fleet", "evidence": ["s1"]},
            "status": {"phase": "Open", "cycle": 1, "openedAt": keys.format_time(NOW)},
        }
    )
    rec, writer = _reconciler()
    view = FleetView(nodes={"gpu-1": body}, policies={"fleet": {}}, tickets={"gpu-1": [ticket]})
    rec.run_pass(POLICY, view, NOW + dt.timedelta(seconds=5))
    assert _hardware_writes(writer) == []
    assert [k for k, _ in writer.calls if k == "node-patch"] == [], "a steady quarantine"
    assert "gpu-1" in rec.due_nodes("fleet", NOW + dt.timedelta(seconds=30))
    rec.run_pass(POLICY, view, NOW + dt.timedelta(seconds=31), dirty=())
    assert len(_hardware_writes(writer)) == 6
    assert rec.last_counts["hardware-history-restored"] == 1


def test_observe_mode_carries_no_history_note() -> None:
    """Observe suppresses the history: no note either, so nothing restores it later."""
    n = node(state=NodeState.TESTING, annotations={keys.CURRENT_TEST: "s1"})
    test = sdctest("s1", verdict=Verdict.SDC, failed=("golden",))
    quiet = decide(observe(n, test=test), policy(mode="Observe", confirmation={"reruns": 0}), NOW)
    assert quiet.state == NodeState.QUARANTINED
    assert not [a for a in quiet.actions if isinstance(a, RecordHardware)]
    notes = [dict(a.changes) for a in quiet.actions if isinstance(a, Annotate)]
    assert notes and all(keys.HISTORY not in changes for changes in notes)


def test_the_note_leaves_with_the_state_it_came_with() -> None:
    """A rejoined host's history note stays while it tests; the patch that qualifies it
    removes the note (no extra write: it is part of that patch)."""
    note = history_note((RecordHardware(),), NOW)
    n = node(state=NodeState.TESTING, annotations={keys.CURRENT_TEST: "s1", keys.HISTORY: note})
    passed = decide(observe(n, test=sdctest("s1", verdict=Verdict.PASS)), policy(), NOW)
    assert passed.state == NodeState.QUALIFIED
    (annotate,) = [a for a in passed.actions if isinstance(a, Annotate)]
    assert dict(annotate.changes)[keys.HISTORY] is None


def test_every_row_that_writes_history_enters_a_new_state() -> None:
    """The note is restored only while the node is in the state its decision entered
    (state-since equals the note's time): a row that wrote history without a state
    change would leave a note nothing restores."""
    rows = [
        row for row in TABLE.values() if any(isinstance(a, RecordHardware) for a in row.actions)
    ]
    assert len(rows) >= 8
    assert all(row.source != row.target for row in rows), [
        (row.source, row.event) for row in rows if row.source == row.target
    ]


def test_a_history_write_refused_after_the_taint_is_retried_at_the_next_look() -> None:
    """A 429 on a record after the node patch: the node is already Quarantined, so the
    decision will not come again; this process knows the writes failed and writes the
    history at its next look, without waiting for the grace period."""

    class _Refusing(_Recorder):
        refused = False

        def patch_custom_status(self, plural: str, name: str, status: dict[str, Any]) -> None:
            if plural == "sdchardwares" and not self.refused:
                self.refused = True
                raise ApiException(status=429, reason="Too Many Requests")
            super().patch_custom_status(plural, name, status)

    metrics = Metrics()
    writer = _Refusing(api=client.ApiClient(), metrics=metrics)
    rec = Reconciler(writer=writer, settings=Settings(metrics_port=0), metrics=metrics)
    decision = failing(None)
    view = FleetView(nodes={"gpu-1": _host()}, policies={"fleet": {}})
    with pytest.raises(ApiException):
        rec.executor.apply(POLICY, decision, view, NOW, Counter())
    assert [k for k, _ in writer.calls].count("node-patch") == 1, "the taint is on"
    (annotate,) = [a for a in decision.actions if isinstance(a, Annotate)]
    after = _quarantined_after(dict(annotate.changes)[keys.HISTORY])
    counts: Counter[str] = Counter()
    assert rec.history.restore(view, after, NOW + dt.timedelta(seconds=1), counts) is None
    assert counts["hardware-history-restored"] == 1
    assert _hardware_writes(writer).count("sdchardwares-status") == 2 + 3
