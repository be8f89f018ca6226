"""Quarantine scope Device through the lifecycle: DeviceTaintRules instead of the node
taint and cordon, the ticket's record, verification and release (domain.decide)."""

from __future__ import annotations

import dataclasses

from sdcguard.api import (
    Finding,
    Resolution,
    ScreeningReason,
    Suite,
    TicketPhase,
    Verdict,
)
from sdcguard.domain import keys
from sdcguard.domain.decide import decide
from sdcguard.domain.devicetaints import NodeDevices, SliceDevice, rule_name
from sdcguard.domain.lifecycle import (
    AddTaint,
    Cordon,
    CreateTicket,
    Drain,
    Event,
    NodeState,
    TaintDevices,
    UntaintDevices,
)
from sdcguard.domain.observed import NodeFacts, Taint, TestFacts, TicketFacts
from sdcguard.domain.plan import Stage
from tests.unit.factories import HOUR, NOW, applied, node, policy, sdctest, ticket
from tests.unit.test_decide import created_test, observe, one, only, taint_keys

S, E = NodeState, Event
GPUS = tuple(SliceDevice("gpu.nvidia.com", "gpu-1", f"gpu-{i}", f"GPU-{i}-uuid") for i in range(8))
PUBLISHED = NodeDevices(served=True, devices=GPUS)
DEVICE = policy(
    quarantine={"scope": "Device", "deviceTaintEffect": "NoExecute"}, confirmation={"reruns": 0}
)
TESTING = "sdcguard.dev/testing"


def _failed(name: str, *devices: int | None, check: str = "golden") -> TestFacts:
    test = sdctest(name, verdict=Verdict.SDC, failed=(check,))
    findings = tuple(Finding(test=name, check=check, odd_device=d) for d in devices)
    return dataclasses.replace(test, findings=findings)


def _confirmed(devices: NodeDevices | None, *odd: int | None) -> tuple[NodeFacts, object]:
    """A screening failed on ``odd`` devices (no re-runs: confirmed at once)."""
    n = node(state=S.TESTING, annotations={keys.CURRENT_TEST: "t2"}, qualified_at=NOW - HOUR)
    d = decide(observe(n, test=_failed("t2", *odd), devices=devices), DEVICE, NOW)
    return n, d


def test_a_device_failure_taints_the_device_and_leaves_the_node_serving() -> None:
    n, d = _confirmed(PUBLISHED, 3)
    assert (d.event, d.state) == (E.TEST_FAILED, S.QUARANTINED)
    taint = one(d, TaintDevices)
    made = one(d, CreateTicket)
    assert taint.devices == (GPUS[3],) and taint.effect == "NoExecute"
    assert taint.ticket == made.name, "the rule names the ticket this decision opens"
    assert not only(d, Cordon) and not only(d, Drain)
    assert not [a for a in only(d, AddTaint) if a.key == "sdcguard.dev/quarantined"]
    after = applied(n, d)
    assert not after.unschedulable and taint_keys(after) == set()
    assert after.labels[keys.LABEL_STATE] == "Quarantined"
    record = made.quarantine
    assert record is not None and (record.scope, record.reason) == ("Device", "DeviceTainted")
    assert [(x.index, x.device, x.uuid, x.rule) for x in record.devices] == [
        (3, "gpu-3", "GPU-3-uuid", rule_name(n.name, "GPU-3-uuid"))
    ]
    steps = d.plan.stage(Stage.OBJECTS)
    assert any(isinstance(s, TaintDevices) for s in steps), "rules go with the objects"


def test_fallbacks_quarantine_the_node_and_say_why_in_the_ticket() -> None:
    cases = [
        (PUBLISHED, (None,), "FailureNotPinned"),
        (NodeDevices(served=True), (3,), "NoResourceSlices"),
        (NodeDevices(served=False), (3,), "DeviceTaintsNotServed"),
        (PUBLISHED, (12,), "DeviceNotPublished"),
        (PUBLISHED, (0, 1, 2, 3, 4), "TooManyDevices"),
        (None, (3,), "NoResourceSlices"),  # slices could not be read
    ]
    for devices, odd, reason in cases:
        _, d = _confirmed(devices, *odd)
        assert d.state == S.QUARANTINED
        assert not only(d, TaintDevices), reason
        assert only(d, Cordon), reason
        assert [a.key for a in only(d, AddTaint)] == ["sdcguard.dev/quarantined"], reason
        record = one(d, CreateTicket).quarantine
        assert record is not None and (record.scope, record.reason) == ("Node", reason)
        assert "whole node" in record.message


def test_scope_node_records_the_policy_as_the_reason() -> None:
    n = node(state=S.TESTING, annotations={keys.CURRENT_TEST: "t2"}, qualified_at=NOW - HOUR)
    node_scope = policy(confirmation={"reruns": 0})
    d = decide(observe(n, test=_failed("t2", 3), devices=PUBLISHED), node_scope, NOW)
    record = one(d, CreateTicket).quarantine
    assert record is not None and (record.scope, record.reason) == ("Node", "PolicyScopeNode")


def _device_ticket(**kw: object) -> TicketFacts:
    return dataclasses.replace(ticket(**kw), devices=(GPUS[3],))  # type: ignore[arg-type]


def test_a_device_quarantine_is_kept_on_every_look_without_node_taints() -> None:
    n = node(state=S.QUARANTINED)
    d = decide(observe(n, ticket=_device_ticket()), DEVICE, NOW)
    assert d.event is None
    assert one(d, TaintDevices).devices == (GPUS[3],)
    assert not only(d, AddTaint) and not only(d, Cordon)


def test_observe_mode_writes_no_device_rule() -> None:
    n = node(state=S.QUARANTINED)
    observe_policy = policy(mode="Observe", quarantine={"scope": "Device"})
    d = decide(observe(n, ticket=_device_ticket()), observe_policy, NOW)
    assert not only(d, TaintDevices)


def test_verification_reserves_the_node_then_returns_the_device() -> None:
    n = node(state=S.REPAIRING)
    t = _device_ticket(
        resolution=Resolution.REPAIRED, acknowledged=True, phase=TicketPhase.IN_REPAIR
    )
    d = decide(observe(n, ticket=t), DEVICE, NOW)
    assert (d.event, d.state) == (E.TICKET_RESOLVED, S.VERIFYING)
    verify = created_test(d)
    assert verify.suite == Suite.REPAIR_VERIFICATION
    assert [a.key for a in only(d, AddTaint)] == [TESTING], "all devices for the probe"
    n = applied(n, d)
    assert taint_keys(n) == {TESTING} and not n.unschedulable

    done = sdctest(
        verify.name,
        suite=Suite.REPAIR_VERIFICATION,
        reason=ScreeningReason.REPAIR_VERIFICATION,
        verdict=Verdict.PASS,
    )
    d = decide(observe(n, ticket=t, test=done), DEVICE, NOW + HOUR)
    assert (d.event, d.state) == (E.VERIFICATION_PASSED, S.QUALIFIED)
    assert one(d, UntaintDevices) == UntaintDevices(t.name)
    assert taint_keys(applied(n, d)) == set()


def test_failed_verification_keeps_the_devices_tainted() -> None:
    n = node(
        state=S.VERIFYING,
        annotations={keys.CURRENT_TEST: "v1", keys.OWNED_TAINTS: TESTING},
        taints=(Taint(TESTING, "NoSchedule"),),
    )
    t = _device_ticket(resolution=Resolution.REPAIRED, phase=TicketPhase.VERIFYING)
    test = dataclasses.replace(
        _failed("v1", 3),
        suite=Suite.REPAIR_VERIFICATION,
        reason=ScreeningReason.REPAIR_VERIFICATION,
    )
    d = decide(
        observe(n, ticket=t, test=test),
        policy(quarantine={"scope": "Device"}, repair={"maxRepairCycles": 3}),
        NOW,
    )
    assert (d.event, d.state) == (E.VERIFICATION_FAILED, S.QUARANTINED)
    assert not only(d, Cordon) and not only(d, CreateTicket) and not only(d, UntaintDevices)
    assert taint_keys(applied(n, d)) == set(), "the node serves again, the device stays out"


def test_a_manual_release_removes_only_the_device_rules() -> None:
    n = node(state=S.QUARANTINED, annotations={keys.REQUEST_RELEASE: "false alarm"})
    d = decide(observe(n, ticket=_device_ticket()), DEVICE, NOW)
    assert (d.event, d.state) == (E.MANUAL_RELEASE, S.QUALIFIED)
    assert one(d, UntaintDevices).ticket == "gpu-1-0a1b2-3"
    assert not only(d, TaintDevices)


def test_a_device_quarantine_does_not_hold_the_node_against_the_budget() -> None:
    quarantined = observe(node(state=S.QUARANTINED), ticket=_device_ticket())
    assert not quarantined.pool_member().held, "the node serves with its other devices"
    verifying = observe(node(state=S.VERIFYING), ticket=_device_ticket())
    assert verifying.pool_member().held, "reserved for its verification"
    whole = observe(node(state=S.QUARANTINED), ticket=ticket())
    assert whole.pool_member().held


def test_a_failure_is_matched_by_the_uuid_the_probe_reported() -> None:
    n = node(state=S.TESTING, annotations={keys.CURRENT_TEST: "t2"}, qualified_at=NOW - HOUR)
    test = dataclasses.replace(_failed("t2", 0), device_ids=("GPU-6-uuid", "GPU-1-uuid"))
    d = decide(observe(n, test=test, devices=PUBLISHED), DEVICE, NOW)
    assert one(d, TaintDevices).devices == (GPUS[6],)
