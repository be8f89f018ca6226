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
from sdcguard.domain.devicetaints import NodeDevices, SliceDevice, TicketMember, rule_name
from sdcguard.domain.hardware import HardwareFacts
from sdcguard.domain.lifecycle import (
    AddTaint,
    CloseTicket,
    Cordon,
    CreateTicket,
    Drain,
    Event,
    NodeState,
    RaiseCycle,
    RecordHardware,
    Retire,
    SetTicketPhase,
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


# One ticket per device ---------------------------------------------------------------


def test_each_failed_device_gets_its_own_ticket_and_rule() -> None:
    n, d = _confirmed(PUBLISHED, 2, 5)
    made = only(d, CreateTicket)
    assert [t.name for t in made] == ["gpu-1-0a1b2-1-gpu-2", "gpu-1-0a1b2-1-gpu-5"]
    for t, gpu in zip(made, (GPUS[2], GPUS[5]), strict=True):
        record = t.quarantine
        assert record is not None and record.scope == "Device"
        assert [(x.device, x.uuid) for x in record.devices] == [(gpu.name, gpu.uuid)]
    taint = one(d, TaintDevices)
    assert taint.devices == (GPUS[2], GPUS[5])
    assert [taint.ticket_of(i) for i in range(2)] == [t.name for t in made]
    assert applied(n, d).annotations[keys.SEQ] == "1", "one step of the counter for both"
    again = decide(observe(n, test=_failed("t2", 2, 5), devices=PUBLISHED), DEVICE, NOW)
    assert [t.name for t in only(again, CreateTicket)] == [t.name for t in made], (
        "a repeated decision (a crash before the node patch) names the same tickets"
    )
    hw = one(d, RecordHardware)
    assert hw.devices == ((GPUS[2].uuid, made[0].name), (GPUS[5].uuid, made[1].name))


def test_two_findings_naming_one_device_make_one_ticket() -> None:
    test = dataclasses.replace(
        _failed("t2", 3),
        findings=(
            Finding(test="t2", check="golden", odd_device=3),
            Finding(test="t2", check="compute", odd_device=3),
        ),
    )
    n = node(state=S.TESTING, annotations={keys.CURRENT_TEST: "t2"}, qualified_at=NOW - HOUR)
    d = decide(observe(n, test=test, devices=PUBLISHED), DEVICE, NOW)
    assert [t.name for t in only(d, CreateTicket)] == ["gpu-1-0a1b2-1-gpu-3"]
    assert one(d, TaintDevices).devices == (GPUS[3],)


def test_a_device_ticket_begins_its_own_gpus_next_cycle() -> None:
    n = node(state=S.TESTING, annotations={keys.CURRENT_TEST: "t2"}, qualified_at=NOW - HOUR)
    hardware = HardwareFacts(
        records=("device-x",), cycles=1, failures=1, device_cycles={GPUS[5].uuid.lower(): 1}
    )
    d = decide(
        observe(n, test=_failed("t2", 2, 5), devices=PUBLISHED, hardware=hardware), DEVICE, NOW
    )
    cycles = {t.name: (t.cycle, t.before) for t in only(d, CreateTicket)}
    assert cycles == {"gpu-1-0a1b2-1-gpu-2": (1, 0), "gpu-1-0a1b2-1-gpu-5": (2, 1)}


def _incident(*members: TicketMember) -> TicketFacts:
    return TicketFacts.incident(
        [
            TicketFacts(
                m.name, m.phase, m.resolution, m.cycle, m.acknowledged, m.devices, parts=(m,)
            )
            for m in members
        ]
    )


A = TicketMember("n-1-gpu-2", (GPUS[2],))
B = TicketMember("n-1-gpu-5", (GPUS[5],))


def test_the_device_tickets_of_a_node_are_one_incident() -> None:
    both = _incident(
        dataclasses.replace(B, resolution=Resolution.REPAIRED, acknowledged=True),
        dataclasses.replace(A, phase=TicketPhase.IN_REPAIR, acknowledged=True),
    )
    assert both.name == A.name and both.devices == (GPUS[2], GPUS[5])
    assert both.phase == TicketPhase.IN_REPAIR and both.resolution == Resolution.REPAIRED
    retire = _incident(A, dataclasses.replace(B, resolution=Resolution.RETIRE))
    assert retire.resolution == Resolution.RETIRE


def _verifying(*members: TicketMember) -> NodeFacts:
    del members
    return node(
        state=S.VERIFYING,
        annotations={keys.CURRENT_TEST: "v1", keys.OWNED_TAINTS: TESTING},
        taints=(Taint(TESTING, "NoSchedule"),),
    )


def _verification(*odd: int | None, verdict: Verdict = Verdict.SDC) -> TestFacts:
    base = _failed("v1", *odd) if verdict == Verdict.SDC else sdctest("v1", verdict=verdict)
    return dataclasses.replace(
        base,
        suite=Suite.REPAIR_VERIFICATION,
        reason=ScreeningReason.REPAIR_VERIFICATION,
        device_ids=tuple(g.uuid for g in GPUS),
    )


VERIFYING_A = dataclasses.replace(A, phase=TicketPhase.VERIFYING, resolution=Resolution.REPAIRED)
VERIFYING_B = dataclasses.replace(B, phase=TicketPhase.VERIFYING, resolution=Resolution.REPAIRED)
CYCLES = policy(quarantine={"scope": "Device"}, repair={"maxRepairCycles": 3})


def test_verification_failing_on_one_of_two_devices_returns_the_other() -> None:
    t = _incident(VERIFYING_A, VERIFYING_B)
    n = _verifying()
    d = decide(observe(n, ticket=t, test=_verification(5)), CYCLES, NOW)
    assert (d.event, d.state) == (E.DEVICES_RETURNED, S.QUARANTINED)
    assert [c.name for c in only(d, CloseTicket)] == [A.name]
    assert one(d, UntaintDevices).devices == (GPUS[2],), "only the returned device's rule goes"
    assert [r.name for r in only(d, RaiseCycle)] == [B.name]
    assert one(d, RecordHardware).devices == ((GPUS[5].uuid, B.name),)
    assert not only(d, Cordon)
    assert taint_keys(applied(n, d)) == set(), "the node serves again, gpu-5 stays out"
    assert "returned: gpu-2" in d.note and "failed again: gpu-5" in d.note


def test_a_device_not_yet_repaired_waits_while_the_repaired_one_returns() -> None:
    t = _incident(VERIFYING_A, B)
    n = _verifying()
    # The probe still names gpu-5 (not repaired yet): that holds nothing against gpu-2.
    d = decide(observe(n, ticket=t, test=_verification(5)), CYCLES, NOW)
    assert (d.event, d.state) == (E.DEVICES_RETURNED, S.QUARANTINED)
    assert [c.name for c in only(d, CloseTicket)] == [A.name]
    assert not only(d, RaiseCycle) and not only(d, RecordHardware)
    assert "awaiting repair: gpu-5" in d.note
    passed = decide(observe(n, ticket=t, test=_verification(verdict=Verdict.PASS)), CYCLES, NOW)
    assert passed.event == E.DEVICES_RETURNED and not only(passed, RaiseCycle)


def test_the_last_devices_passing_return_the_node() -> None:
    t = _incident(VERIFYING_A, VERIFYING_B)
    d = decide(
        observe(_verifying(), ticket=t, test=_verification(verdict=Verdict.PASS)), CYCLES, NOW
    )
    assert (d.event, d.state) == (E.VERIFICATION_PASSED, S.QUALIFIED)
    assert sorted(c.name for c in only(d, CloseTicket)) == [A.name, B.name]
    assert one(d, UntaintDevices).devices == (), "every rule of ours on the node goes"


def test_a_failure_not_pinned_to_a_device_fails_every_device_under_verification() -> None:
    for odd in ((None,), (7,)):  # no device named; a device that is not quarantined
        t = _incident(VERIFYING_A, VERIFYING_B, TicketMember("n-1-gpu-6", (GPUS[6],)))
        d = decide(observe(_verifying(), ticket=t, test=_verification(*odd)), CYCLES, NOW)
        assert (d.event, d.state) == (E.VERIFICATION_FAILED, S.QUARANTINED), odd
        assert sorted(r.name for r in only(d, RaiseCycle)) == [A.name, B.name]
        assert not only(d, CloseTicket) and not only(d, UntaintDevices)


def test_a_resolution_verifies_only_the_resolved_device_tickets() -> None:
    t = _incident(
        dataclasses.replace(A, phase=TicketPhase.IN_REPAIR),
        dataclasses.replace(B, resolution=Resolution.REPAIRED, phase=TicketPhase.IN_REPAIR),
    )
    d = decide(observe(node(state=S.REPAIRING), ticket=t), DEVICE, NOW)
    assert (d.event, d.state) == (E.TICKET_RESOLVED, S.VERIFYING)
    assert [(p.name, p.phase) for p in only(d, SetTicketPhase)] == [(B.name, TicketPhase.VERIFYING)]
    assert created_test(d).ticket == B.name, "the test names the ticket it verifies"


def test_a_device_out_of_repair_cycles_retires_the_node_and_all_its_tickets() -> None:
    worn = dataclasses.replace(VERIFYING_B, cycle=3)
    t = _incident(VERIFYING_A, worn)
    d = decide(observe(_verifying(), ticket=t, test=_verification(5)), CYCLES, NOW)
    assert (d.event, d.state) == (E.REPAIR_CYCLES_EXCEEDED, S.RETIRED)
    assert one(d, Retire).name == A.name
    assert [(p.name, p.phase) for p in only(d, SetTicketPhase)] == [(B.name, TicketPhase.RETIRED)]
    # The GPU's cycles under an earlier ticket count as well as this ticket's.
    hardware = HardwareFacts(records=("d",), cycles=0, device_cycles={GPUS[5].uuid.lower(): 3})
    t = _incident(VERIFYING_A, VERIFYING_B)
    d = decide(
        observe(_verifying(), ticket=t, test=_verification(5), hardware=hardware), CYCLES, NOW
    )
    assert d.event == E.REPAIR_CYCLES_EXCEEDED


def test_an_open_incident_keeps_one_rule_per_device_naming_its_ticket() -> None:
    t = _incident(A, B)
    d = decide(observe(node(state=S.QUARANTINED), ticket=t), DEVICE, NOW)
    taint = one(d, TaintDevices)
    assert taint.devices == (GPUS[2], GPUS[5])
    assert taint.tickets == (A.name, B.name)


def test_each_device_ticket_enters_repair_when_it_is_acknowledged() -> None:
    t = _incident(dataclasses.replace(A, acknowledged=True), B)
    d = decide(observe(node(state=S.QUARANTINED), ticket=t), DEVICE, NOW)
    assert (d.event, d.state) == (E.REPAIR_STARTED, S.REPAIRING)
    assert [(p.name, p.phase) for p in only(d, SetTicketPhase)] == [(A.name, TicketPhase.IN_REPAIR)]
    later = _incident(
        dataclasses.replace(A, acknowledged=True, phase=TicketPhase.IN_REPAIR),
        dataclasses.replace(B, acknowledged=True),
    )
    d = decide(observe(node(state=S.REPAIRING), ticket=later), DEVICE, NOW)
    assert d.event is None, "the node is in repair already"
    assert [(p.name, p.phase) for p in only(d, SetTicketPhase)] == [(B.name, TicketPhase.IN_REPAIR)]
