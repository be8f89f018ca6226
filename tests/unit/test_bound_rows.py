"""Every row of the lifecycle table, bound: what it does to a representative node.

The table's own test (test_lifecycle) checks the rows as written; this one binds each
row against a node in its source state, as the binder does for a decision, and checks
the whole transition a user would see: the state label, our taints and the cordon, the
annotations the node remembers, the objects written (tests, tickets, device rules,
history) and the Events. Each row is bound with scope Node, with scope Device (an
incident whose device rules keep the node serving) and in Observe mode."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from sdcguard.api import (
    Finding,
    Resolution,
    ScreeningReason,
    SDCTestPhase,
    Suite,
    TicketPhase,
    Verdict,
)
from sdcguard.domain import keys
from sdcguard.domain.binding import Binder, Bound
from sdcguard.domain.devicetaints import NodeDevices, SliceDevice, TicketMember
from sdcguard.domain.lifecycle import (
    BOOKKEEPING,
    OBSERVE_SUPPRESSED,
    TRANSITIONS,
    AddTaint,
    Annotate,
    EmitEvent,
    Event,
    NodeState,
    Only,
    RemoveTaint,
    TaintRole,
    Transition,
)
from sdcguard.domain.nodepatch import plan_node_patch
from sdcguard.domain.observed import NodeFacts, Observed, Taint, TestFacts, TicketFacts
from sdcguard.domain.plan import STAGE_OF, Plan, Stage
from sdcguard.domain.reading import Reader, Reading
from sdcguard.domain.upkeep import UPKEEP, Scope, scope_of, upkeep_row
from tests.unit.factories import HOUR, NOW, node, policy, sdctest

S, E = NodeState, Event
GATE, TESTING, QUARANTINE = (
    "sdcguard.dev/unqualified",
    "sdcguard.dev/testing",
    "sdcguard.dev/quarantined",
)
ROLE = {GATE: "gate", TESTING: "testing", QUARANTINE: "quarantine"}
GPUS = tuple(SliceDevice("gpu.nvidia.com", "gpu-1", f"gpu-{i}", f"GPU-{i}-uuid") for i in range(8))
NODE_SCOPE = policy(confirmation={"reruns": 0}, quarantine={"drain": True})
DEVICE_SCOPE = policy(confirmation={"reruns": 0}, quarantine={"scope": "Device"})
OBSERVE = policy(confirmation={"reruns": 0}, mode="Observe")

HELD_STATES = (S.QUARANTINED, S.REPAIRING, S.VERIFYING, S.RETIRED)
TICKET_PHASE = {
    S.QUARANTINED: TicketPhase.OPEN,
    S.REPAIRING: TicketPhase.IN_REPAIR,
    S.VERIFYING: TicketPhase.VERIFYING,
    S.RETIRED: TicketPhase.RETIRED,
}


def _ticket(source: NodeState, event: Event, device: bool) -> TicketFacts | None:
    if source not in HELD_STATES:
        return None
    phase = TICKET_PHASE[source]
    resolution = {E.TICKET_RESOLVED: Resolution.REPAIRED, E.TICKET_RETIRE: Resolution.RETIRE}.get(
        event, Resolution.REPAIRED if source == S.VERIFYING else None
    )
    acknowledged = event in (E.REPAIR_STARTED, E.REPLACE_DUE) or source != S.QUARANTINED
    if not device:
        return TicketFacts("gpu-1-0a1b2-3", phase, resolution, 1, acknowledged)
    members = tuple(
        TicketMember(f"gpu-1-0a1b2-3-{i}", (GPUS[i],), phase, resolution, 1, acknowledged)
        for i in (2, 5)
    )
    return TicketFacts.incident(
        [
            TicketFacts(m.name, m.phase, m.resolution, m.cycle, m.acknowledged, m.devices)
            for m in members
        ]
    )


def _test(source: NodeState, event: Event) -> TestFacts | None:
    if event in (E.TEST_PASSED, E.VERIFICATION_PASSED):
        return sdctest("t1", verdict=Verdict.PASS)
    if event == E.DEVICES_RETURNED or event in (
        E.TEST_FAILED,
        E.TEST_FAILED_UNCONFIRMED,
        E.QUARANTINE_HELD,
        E.REPAIR_CYCLES_EXCEEDED,
        E.VERIFICATION_FAILED,
        E.FLAKY,
        E.CONFIRMATION_PASSED,
    ):
        failed = sdctest("t1", verdict=Verdict.SDC, failed=("golden",))
        findings = (Finding(test="t1", check="golden", odd_device=5),)
        return dataclasses.replace(
            failed, findings=findings, device_ids=tuple(g.uuid for g in GPUS)
        )
    if event in (E.TEST_INCONCLUSIVE, E.ACCEPTANCE_INCONCLUSIVE):
        return sdctest("t1", verdict=Verdict.INCONCLUSIVE)
    if event in (E.TEST_CANCELLED, E.ACCEPTANCE_CANCELLED):
        ended = sdctest("t1", phase=SDCTestPhase.CANCELLED)
        return dataclasses.replace(ended, end_reason="NodeLeftPolicy")
    if event == E.TEST_STARTED:
        return sdctest("m1", reason=ScreeningReason.MANUAL)
    if source in (S.TESTING, S.SUSPECT, S.VERIFYING):
        return sdctest("t1")  # still running: a person's decision cancels it
    return None


def _node(source: NodeState, device: bool) -> NodeFacts:
    """A node in ``source`` as sdcguard leaves it: its taints and cordon, its records."""
    owned: list[str] = []
    taints: list[str] = []
    annotations: dict[str, str] = {keys.SEQ: "2"}
    qualified = None if source == S.UNQUALIFIED else NOW - 10 * HOUR
    if source == S.UNQUALIFIED:
        owned = taints = [GATE]  # registered with the gate, adopted when first labelled
    elif source == S.TESTING:
        owned = taints = [TESTING]
        annotations[keys.CURRENT_TEST] = "t1"
    elif source == S.SUSPECT:
        owned = taints = [TESTING]
        annotations |= {keys.CURRENT_TEST: "t1", keys.SUSPECT_CHECKS: "golden"}
        annotations[keys.EVIDENCE] = "t0"
    elif source in HELD_STATES and not device:
        owned = taints = [QUARANTINE]
        annotations[keys.CORDONED_BY_US] = "true"
        annotations[keys.OWNED_ANNOTATIONS] = ",".join(keys.AUTOSCALER_ANNOTATIONS)
        annotations |= dict.fromkeys(keys.AUTOSCALER_ANNOTATIONS, "true")
    if source == S.VERIFYING:
        annotations[keys.CURRENT_TEST] = "t1"
        if device:
            owned = taints = [TESTING]
    if source in (S.QUARANTINED, S.REPAIRING):
        annotations[keys.DRAIN_UNTIL] = keys.format_time(NOW + HOUR)
    if owned:
        annotations[keys.OWNED_TAINTS] = ",".join(owned)
    n = node(
        state=source,
        annotations=annotations,
        taints=tuple(Taint(k, "NoSchedule") for k in taints),
        qualified_at=qualified,
    )
    held = source in HELD_STATES and not device
    return dataclasses.replace(n, unschedulable=held)


def _reading(row: Transition) -> Reading:
    event = row.event
    evidence = ("t0", "t1") if event != E.VERIFICATION_FAILED else ("t1",)
    return Reading(
        event,
        "why",
        suite=Suite.REQUALIFICATION,
        evidence=evidence,
        suspect_checks=frozenset({"golden"}),
        returned=("gpu-1-0a1b2-3-2",) if event == E.DEVICES_RETURNED else (),
        refailed=("gpu-1-0a1b2-3-5",)
        if event in (E.DEVICES_RETURNED, E.VERIFICATION_FAILED)
        else (),
    )


def bind(row: Transition, spec: object, device: bool = False) -> tuple[NodeFacts, Bound]:
    n = _node(row.source, device)
    observed = Observed(
        node=n,
        test=_test(row.source, row.event),
        ticket=_ticket(row.source, row.event, device),
        idle_since=NOW - HOUR,
        devices=NodeDevices(served=True, devices=GPUS),
    )
    reader = Reader(observed, spec, NOW)  # type: ignore[arg-type]
    assert reader.state == row.source
    return n, Binder(reader, _reading(row), row.target, 10.0).bind_all(row.actions)


@dataclass(frozen=True)
class Seen:
    """What a user sees of a bound transition: the state label, our taints (by role)
    and the cordon, the node's annotations that change (``=`` set, ``-`` removed;
    sdcguard's without their prefix), the objects written in plan order (tests,
    tickets, device rules, history, the Node's deletion), the Events, and evictions."""

    label: str | None
    taints: list[str]
    cordoned: bool
    annotations: list[str]
    objects: list[str]
    events: list[str]
    evicts: bool


def seen(text: str) -> Seen:
    """A Seen written as "label | taints | cordoned | annotations | objects | events |
    evicts", lists space-separated, "-" for an empty one or a flag that is off."""
    label, taints, cordoned, annotations, objects, events, evicts = (
        [] if part.strip() == "-" else part.split() for part in text.split("|")
    )
    return Seen(
        label=label[0],
        taints=taints,
        cordoned=cordoned == ["cordoned"],
        annotations=annotations,
        objects=objects,
        events=events,
        evicts=evicts == ["evicts"],
    )


def summary(before: NodeFacts, bound: Bound) -> Seen:
    """What a user sees of a bound transition."""
    patch = plan_node_patch(before, bound.actions)
    labels = {**before.labels, **patch.labels}
    taints = patch.taints if patch.taints is not None else before.taints
    plan = Plan.of(bound.actions)
    annotations = sorted(
        k.removeprefix(keys.PREFIX) + ("=" if v is not None else "-")
        for k, v in patch.annotations.items()
        if before.annotations.get(k) != v
    )
    objects = [
        type(s).__name__
        + (f":{getattr(s, 'phase', '')}" if type(s).__name__ == "SetTicketPhase" else "")
        for st in (Stage.OBJECTS, Stage.STATUSES, Stage.HISTORY, Stage.NODE_DELETE)
        for s in plan.stage(st)
    ]
    return Seen(
        label=labels.get(keys.LABEL_STATE),
        taints=sorted(ROLE.get(t.key, t.key) for t in taints),
        cordoned=patch.unschedulable if patch.unschedulable is not None else before.unschedulable,
        annotations=annotations,
        objects=objects,
        events=[s.reason for s in plan.stage(Stage.EVENTS) if isinstance(s, EmitEvent)],
        evicts=bool(plan.stage(Stage.EVICTIONS)),
    )


# Scope Node, Enforce, drain on: written out so that any change to what a row does is
# a deliberate change here too. Each is "label | taints | cordoned | annotations |
# objects | events | evicts" (see Seen; "-" for none).
NODE_SCOPE_ROWS: dict[tuple[NodeState, Event], str] = {
    (S.UNQUALIFIED, E.JOINED): (
        "Testing | gate testing | - | owned-taints= seq= state-since= test= | CreateTest | "
        "TestStarted | -"
    ),
    (S.UNQUALIFIED, E.REJOINED): (
        "Testing | gate testing | - | history= owned-taints= seq= state-since= test= | "
        "CreateTest RecordHardware | HardwareRecognised | -"
    ),
    (S.UNQUALIFIED, E.HARDWARE_RETIRED): (
        "Retired | gate quarantine | cordoned | cordoned-by-us= history= owned-taints= "
        "state-since= | Retire RecordHardware | Retired | -"
    ),
    (S.UNQUALIFIED, E.ADMITTED): (
        "Qualified | - | - | owned-taints- state-since= | - | Admitted | -"
    ),
    (S.UNQUALIFIED, E.TEST_STARTED): (
        "Testing | gate testing | - | owned-taints= state-since= test= | - | - | -"
    ),
    (S.UNQUALIFIED, E.OPTED_OUT): (
        "Excluded | - | - | owned-taints- state-since= | - | Excluded | -"
    ),
    (S.UNQUALIFIED, E.MANUAL_QUARANTINE): (
        "Quarantined | gate quarantine | cordoned | "
        "cluster-autoscaler.kubernetes.io/scale-down-disabled= cordoned-by-us= drain-until= "
        "karpenter.sh/do-not-disrupt= owned-annotations= owned-taints= seq= state-since= | "
        "CreateTicket OpenTicketStatus | Quarantined | evicts"
    ),
    (S.UNQUALIFIED, E.MANUAL_RELEASE): (
        "Qualified | - | - | owned-taints- state-since= | - | Released | -"
    ),
    (S.TESTING, E.TEST_PASSED): (
        "Qualified | - | - | fingerprint= owned-taints- qualified-at= seeds-passed= "
        "state-since= test- | - | Qualified | -"
    ),
    (S.TESTING, E.TEST_FAILED_UNCONFIRMED): (
        "Suspect | testing | - | evidence= seq= state-since= suspect-checks= test= | "
        "CreateTest | SDCSuspected | -"
    ),
    (S.TESTING, E.TEST_FAILED): (
        "Quarantined | quarantine | cordoned | "
        "cluster-autoscaler.kubernetes.io/scale-down-disabled= cordoned-by-us= drain-until= "
        "history= karpenter.sh/do-not-disrupt= owned-annotations= owned-taints= qualified-at-"
        " seq= state-since= test- | CreateTicket OpenTicketStatus RecordHardware | "
        "Quarantined | evicts"
    ),
    (S.TESTING, E.REPAIR_CYCLES_EXCEEDED): (
        "Retired | quarantine | cordoned | cordoned-by-us= history= owned-taints= "
        "qualified-at- seq= state-since= test- | CreateTicket Retire OpenTicketStatus "
        "RecordHardware | Retired | -"
    ),
    (S.TESTING, E.QUARANTINE_HELD): (
        "Suspect | testing | - | evidence= held= state-since= suspect-checks= test- | - | "
        "QuarantineHeld | -"
    ),
    (S.TESTING, E.TEST_INCONCLUSIVE): (
        "Qualified | - | - | inconclusive= owned-taints- retry-after= state-since= test- | - "
        "| Inconclusive | -"
    ),
    (S.TESTING, E.ACCEPTANCE_INCONCLUSIVE): (
        "Unqualified | - | - | inconclusive= owned-taints- retry-after= state-since= test- | "
        "- | Inconclusive | -"
    ),
    (
        S.TESTING,
        E.TEST_CANCELLED,
    ): "Qualified | - | - | owned-taints- state-since= test- | - | TestCancelled | -",
    (
        S.TESTING,
        E.ACCEPTANCE_CANCELLED,
    ): "Unqualified | - | - | owned-taints- state-since= test- | - | TestCancelled | -",
    (S.TESTING, E.ADMITTED): (
        "Qualified | - | - | owned-taints- state-since= test- | CancelTest | Admitted | -"
    ),
    (S.TESTING, E.OPTED_OUT): (
        "Excluded | - | - | owned-taints- state-since= test- | CancelTest | Excluded | -"
    ),
    (S.TESTING, E.MANUAL_QUARANTINE): (
        "Quarantined | quarantine | cordoned | "
        "cluster-autoscaler.kubernetes.io/scale-down-disabled= cordoned-by-us= drain-until= "
        "karpenter.sh/do-not-disrupt= owned-annotations= owned-taints= qualified-at- seq= "
        "state-since= test- | CancelTest CreateTicket OpenTicketStatus | Quarantined | evicts"
    ),
    (S.TESTING, E.MANUAL_RELEASE): (
        "Qualified | - | - | owned-taints- state-since= test- | CancelTest | Released | -"
    ),
    (S.QUALIFIED, E.IDLE_DUE): (
        "Testing | testing | - | owned-taints= seq= state-since= test= | CreateTest | "
        "TestStarted | -"
    ),
    (S.QUALIFIED, E.EXPIRY_DUE): (
        "Testing | testing | - | owned-taints= seq= state-since= test= | CreateTest | "
        "TestStarted | -"
    ),
    (S.QUALIFIED, E.TEST_STARTED): (
        "Testing | testing | - | owned-taints= state-since= test= | - | - | -"
    ),
    (S.QUALIFIED, E.SUSPECTED): (
        "Suspect | testing | - | owned-taints= state-since= | - | Suspected | -"
    ),
    (S.QUALIFIED, E.OVERDUE_HELD): (
        "Qualified | testing | - | owned-taints= | - | QualificationOverdue | -"
    ),
    (S.QUALIFIED, E.OVERDUE_DRAIN_DUE): "Qualified | - | - | - | - | - | evicts",
    (S.QUALIFIED, E.OPTED_OUT): "Excluded | - | - | state-since= | - | Excluded | -",
    (S.QUALIFIED, E.MANUAL_QUARANTINE): (
        "Quarantined | quarantine | cordoned | "
        "cluster-autoscaler.kubernetes.io/scale-down-disabled= cordoned-by-us= drain-until= "
        "karpenter.sh/do-not-disrupt= owned-annotations= owned-taints= qualified-at- seq= "
        "state-since= | CreateTicket OpenTicketStatus | Quarantined | evicts"
    ),
    (S.SUSPECT, E.TEST_PASSED): (
        "Qualified | - | - | evidence- fingerprint= owned-taints- qualified-at= "
        "seeds-passed= state-since= suspect-checks- test- | - | Cleared | -"
    ),
    (S.SUSPECT, E.TEST_FAILED): (
        "Quarantined | quarantine | cordoned | "
        "cluster-autoscaler.kubernetes.io/scale-down-disabled= cordoned-by-us= drain-until= "
        "evidence- history= karpenter.sh/do-not-disrupt= owned-annotations= owned-taints= "
        "qualified-at- seq= state-since= suspect-checks- test- | CreateTicket "
        "OpenTicketStatus RecordHardware | Quarantined | evicts"
    ),
    (S.SUSPECT, E.REPAIR_CYCLES_EXCEEDED): (
        "Retired | quarantine | cordoned | cordoned-by-us= evidence- history= owned-taints= "
        "qualified-at- seq= state-since= suspect-checks- test- | CreateTicket Retire "
        "OpenTicketStatus RecordHardware | Retired | -"
    ),
    (S.SUSPECT, E.TEST_FAILED_UNCONFIRMED): (
        "Suspect | testing | - | evidence= seq= test= | CreateTest | SDCSuspected | -"
    ),
    (S.SUSPECT, E.CONFIRMATION_PASSED): (
        "Suspect | testing | - | evidence= seq= test= | CreateTest | - | -"
    ),
    (S.SUSPECT, E.FLAKY): "Suspect | testing | - | evidence= retry-after= test- | - | Flaky | -",
    (S.SUSPECT, E.QUARANTINE_HELD): (
        "Suspect | testing | - | evidence= held= test- | - | QuarantineHeld | -"
    ),
    (S.SUSPECT, E.TEST_INCONCLUSIVE): (
        "Suspect | testing | - | inconclusive= retry-after= test- | - | Inconclusive | -"
    ),
    (S.SUSPECT, E.RETEST_DUE): "Suspect | testing | - | seq= test= | CreateTest | TestStarted | -",
    (S.SUSPECT, E.TEST_STARTED): "Suspect | testing | - | test= | - | - | -",
    (S.SUSPECT, E.OPTED_OUT): (
        "Excluded | - | - | evidence- owned-taints- state-since= suspect-checks- test- | "
        "CancelTest | Excluded | -"
    ),
    (S.SUSPECT, E.MANUAL_QUARANTINE): (
        "Quarantined | quarantine | cordoned | "
        "cluster-autoscaler.kubernetes.io/scale-down-disabled= cordoned-by-us= drain-until= "
        "evidence- karpenter.sh/do-not-disrupt= owned-annotations= owned-taints= "
        "qualified-at- seq= state-since= suspect-checks- test- | CancelTest CreateTicket "
        "OpenTicketStatus | Quarantined | evicts"
    ),
    (S.SUSPECT, E.MANUAL_RELEASE): (
        "Qualified | - | - | evidence- owned-taints- state-since= suspect-checks- test- | "
        "CancelTest | Released | -"
    ),
    (S.QUARANTINED, E.REPAIR_STARTED): (
        "Repairing | quarantine | cordoned | state-since= | SetTicketPhase:InRepair | "
        "RepairStarted | -"
    ),
    (S.QUARANTINED, E.REPLACE_DUE): (
        "Repairing | quarantine | cordoned | state-since= | SetTicketPhase:InRepair "
        "DeleteNode | Replacing | -"
    ),
    (S.QUARANTINED, E.TICKET_RESOLVED): (
        "Verifying | quarantine | cordoned | drain-until- seq= state-since= test= | "
        "SetTicketPhase:Verifying CreateTest | Verifying | -"
    ),
    (S.QUARANTINED, E.TICKET_RETIRE): (
        "Retired | quarantine | cordoned | drain-until- history= state-since= | Retire "
        "RecordHardware | Retired | -"
    ),
    (S.QUARANTINED, E.OPTED_OUT): (
        "Excluded | - | - | cluster-autoscaler.kubernetes.io/scale-down-disabled- "
        "cordoned-by-us- drain-until- karpenter.sh/do-not-disrupt- owned-annotations- "
        "owned-taints- state-since= | - | Excluded | -"
    ),
    (S.QUARANTINED, E.MANUAL_RELEASE): (
        "Qualified | - | - | cluster-autoscaler.kubernetes.io/scale-down-disabled- "
        "cordoned-by-us- drain-until- karpenter.sh/do-not-disrupt- owned-annotations- "
        "owned-taints- state-since= | CloseTicket | Released | -"
    ),
    (S.QUARANTINED, E.OBSERVED_FAILURE): (
        "Suspect | quarantine testing | cordoned | drain-until- evidence= owned-taints= "
        "state-since= suspect-checks= | - | ObservedFailure | -"
    ),
    (S.QUARANTINED, E.DRAIN_DUE): "Quarantined | quarantine | cordoned | - | - | - | evicts",
    (S.QUARANTINED, E.DRAIN_DONE): "Quarantined | quarantine | cordoned | drain-until- | - | - | -",
    (S.QUARANTINED, E.DRAIN_TIMED_OUT): (
        "Quarantined | quarantine | cordoned | drain-until- | - | DrainIncomplete | -"
    ),
    (S.REPAIRING, E.TICKET_RESOLVED): (
        "Verifying | quarantine | cordoned | drain-until- seq= state-since= test= | "
        "SetTicketPhase:Verifying CreateTest | Verifying | -"
    ),
    (S.REPAIRING, E.TICKET_RETIRE): (
        "Retired | quarantine | cordoned | drain-until- history= state-since= | Retire "
        "RecordHardware | Retired | -"
    ),
    (S.REPAIRING, E.OPTED_OUT): (
        "Excluded | - | - | cluster-autoscaler.kubernetes.io/scale-down-disabled- "
        "cordoned-by-us- drain-until- karpenter.sh/do-not-disrupt- owned-annotations- "
        "owned-taints- state-since= | - | Excluded | -"
    ),
    (S.REPAIRING, E.MANUAL_RELEASE): (
        "Qualified | - | - | cluster-autoscaler.kubernetes.io/scale-down-disabled- "
        "cordoned-by-us- drain-until- karpenter.sh/do-not-disrupt- owned-annotations- "
        "owned-taints- state-since= | CloseTicket | Released | -"
    ),
    (S.REPAIRING, E.DRAIN_DUE): "Repairing | quarantine | cordoned | - | - | - | evicts",
    (S.REPAIRING, E.DRAIN_DONE): "Repairing | quarantine | cordoned | drain-until- | - | - | -",
    (S.REPAIRING, E.DRAIN_TIMED_OUT): (
        "Repairing | quarantine | cordoned | drain-until- | - | DrainIncomplete | -"
    ),
    (S.VERIFYING, E.VERIFICATION_PASSED): (
        "Qualified | - | - | cluster-autoscaler.kubernetes.io/scale-down-disabled- "
        "cordoned-by-us- fingerprint= karpenter.sh/do-not-disrupt- owned-annotations- "
        "owned-taints- qualified-at= seeds-passed= state-since= test- | CloseTicket | Qualified | -"
    ),
    (S.VERIFYING, E.VERIFICATION_FAILED): (
        "Quarantined | quarantine | cordoned | history= state-since= test- | RaiseCycle "
        "RecordHardware | RepairFailed | -"
    ),
    (S.VERIFYING, E.DEVICES_RETURNED): (
        "Quarantined | quarantine | cordoned | history= state-since= test- | CloseTicket "
        "RaiseCycle RecordHardware | DevicesReturned | -"
    ),
    (S.VERIFYING, E.REPAIR_CYCLES_EXCEEDED): (
        "Retired | quarantine | cordoned | history= state-since= test- | Retire "
        "RecordHardware | Retired | -"
    ),
    (S.VERIFYING, E.TEST_INCONCLUSIVE): (
        "Verifying | quarantine | cordoned | inconclusive= retry-after= test- | - | "
        "Inconclusive | -"
    ),
    (S.VERIFYING, E.RETEST_DUE): (
        "Verifying | quarantine | cordoned | seq= test= | CreateTest | - | -"
    ),
    (S.VERIFYING, E.OPTED_OUT): (
        "Excluded | - | - | cluster-autoscaler.kubernetes.io/scale-down-disabled- "
        "cordoned-by-us- karpenter.sh/do-not-disrupt- owned-annotations- owned-taints- "
        "state-since= test- | CancelTest | Excluded | -"
    ),
    (S.VERIFYING, E.MANUAL_RELEASE): (
        "Qualified | - | - | cluster-autoscaler.kubernetes.io/scale-down-disabled- "
        "cordoned-by-us- karpenter.sh/do-not-disrupt- owned-annotations- owned-taints- "
        "state-since= test- | CancelTest CloseTicket | Released | -"
    ),
    (S.RETIRED, E.OPTED_OUT): (
        "Excluded | - | - | cluster-autoscaler.kubernetes.io/scale-down-disabled- "
        "cordoned-by-us- karpenter.sh/do-not-disrupt- owned-annotations- owned-taints- "
        "state-since= | - | Excluded | -"
    ),
    (S.RETIRED, E.MANUAL_RELEASE): (
        "Qualified | - | - | cluster-autoscaler.kubernetes.io/scale-down-disabled- "
        "cordoned-by-us- karpenter.sh/do-not-disrupt- owned-annotations- owned-taints- "
        "state-since= | CloseTicket | Released | -"
    ),
    (S.EXCLUDED, E.OPTED_IN): "Unqualified | - | - | qualified-at- state-since= | - | OptedIn | -",
}

# Scope Device (drain off): the rows that differ from scope Node. A quarantine found on
# one device (the test's finding) taints that device and leaves the node serving; an
# open incident of two device tickets is verified, returned, released and retired
# ticket by ticket; a person's quarantine (no finding) falls back to the whole node.
DEVICE_SCOPE_ROWS: dict[tuple[NodeState, Event], str] = {
    (S.UNQUALIFIED, E.MANUAL_QUARANTINE): (
        "Quarantined | gate quarantine | cordoned | "
        "cluster-autoscaler.kubernetes.io/scale-down-disabled= cordoned-by-us= "
        "karpenter.sh/do-not-disrupt= owned-annotations= owned-taints= seq= state-since= | "
        "CreateTicket OpenTicketStatus | Quarantined | -"
    ),
    (S.TESTING, E.TEST_FAILED): (
        "Quarantined | - | - | cluster-autoscaler.kubernetes.io/scale-down-disabled= history="
        " karpenter.sh/do-not-disrupt= owned-annotations= owned-taints- qualified-at- seq= "
        "state-since= test- | TaintDevices CreateTicket OpenTicketStatus RecordHardware | "
        "Quarantined | -"
    ),
    (S.TESTING, E.MANUAL_QUARANTINE): (
        "Quarantined | quarantine | cordoned | "
        "cluster-autoscaler.kubernetes.io/scale-down-disabled= cordoned-by-us= "
        "karpenter.sh/do-not-disrupt= owned-annotations= owned-taints= qualified-at- seq= "
        "state-since= test- | CancelTest CreateTicket OpenTicketStatus | Quarantined | -"
    ),
    (S.QUALIFIED, E.MANUAL_QUARANTINE): (
        "Quarantined | quarantine | cordoned | "
        "cluster-autoscaler.kubernetes.io/scale-down-disabled= cordoned-by-us= "
        "karpenter.sh/do-not-disrupt= owned-annotations= owned-taints= qualified-at- seq= "
        "state-since= | CreateTicket OpenTicketStatus | Quarantined | -"
    ),
    (S.SUSPECT, E.TEST_FAILED): (
        "Quarantined | - | - | cluster-autoscaler.kubernetes.io/scale-down-disabled= "
        "evidence- history= karpenter.sh/do-not-disrupt= owned-annotations= owned-taints- "
        "qualified-at- seq= state-since= suspect-checks- test- | TaintDevices CreateTicket "
        "OpenTicketStatus RecordHardware | Quarantined | -"
    ),
    (S.SUSPECT, E.MANUAL_QUARANTINE): (
        "Quarantined | quarantine | cordoned | "
        "cluster-autoscaler.kubernetes.io/scale-down-disabled= cordoned-by-us= evidence- "
        "karpenter.sh/do-not-disrupt= owned-annotations= owned-taints= qualified-at- seq= "
        "state-since= suspect-checks- test- | CancelTest CreateTicket OpenTicketStatus | "
        "Quarantined | -"
    ),
    (S.QUARANTINED, E.REPAIR_STARTED): (
        "Repairing | - | - | state-since= | SetTicketPhase:InRepair SetTicketPhase:InRepair |"
        " RepairStarted | -"
    ),
    (S.QUARANTINED, E.REPLACE_DUE): (
        "Repairing | - | - | state-since= | SetTicketPhase:InRepair SetTicketPhase:InRepair "
        "DeleteNode | Replacing | -"
    ),
    (S.QUARANTINED, E.TICKET_RESOLVED): (
        "Verifying | testing | - | drain-until- owned-taints= seq= state-since= test= | "
        "SetTicketPhase:Verifying SetTicketPhase:Verifying CreateTest | Verifying | -"
    ),
    (S.QUARANTINED, E.TICKET_RETIRE): (
        "Retired | - | cordoned | cordoned-by-us= drain-until- history= state-since= | Retire"
        " SetTicketPhase:Retired RecordHardware | Retired | -"
    ),
    (S.QUARANTINED, E.OPTED_OUT): (
        "Excluded | - | - | drain-until- state-since= | UntaintDevices | Excluded | -"
    ),
    (S.QUARANTINED, E.MANUAL_RELEASE): (
        "Qualified | - | - | drain-until- state-since= | UntaintDevices CloseTicket "
        "CloseTicket | Released | -"
    ),
    (S.QUARANTINED, E.OBSERVED_FAILURE): (
        "Suspect | testing | - | drain-until- evidence= owned-taints= state-since= "
        "suspect-checks= | - | ObservedFailure | -"
    ),
    (S.QUARANTINED, E.DRAIN_DUE): "Quarantined | - | - | - | - | - | -",
    (S.QUARANTINED, E.DRAIN_DONE): "Quarantined | - | - | drain-until- | - | - | -",
    (S.QUARANTINED, E.DRAIN_TIMED_OUT): (
        "Quarantined | - | - | drain-until- | - | DrainIncomplete | -"
    ),
    (S.REPAIRING, E.TICKET_RESOLVED): (
        "Verifying | testing | - | drain-until- owned-taints= seq= state-since= test= | "
        "SetTicketPhase:Verifying SetTicketPhase:Verifying CreateTest | Verifying | -"
    ),
    (S.REPAIRING, E.TICKET_RETIRE): (
        "Retired | - | cordoned | cordoned-by-us= drain-until- history= state-since= | Retire"
        " SetTicketPhase:Retired RecordHardware | Retired | -"
    ),
    (S.REPAIRING, E.OPTED_OUT): (
        "Excluded | - | - | drain-until- state-since= | UntaintDevices | Excluded | -"
    ),
    (S.REPAIRING, E.MANUAL_RELEASE): (
        "Qualified | - | - | drain-until- state-since= | UntaintDevices CloseTicket "
        "CloseTicket | Released | -"
    ),
    (S.REPAIRING, E.DRAIN_DUE): "Repairing | - | - | - | - | - | -",
    (S.REPAIRING, E.DRAIN_DONE): "Repairing | - | - | drain-until- | - | - | -",
    (S.REPAIRING, E.DRAIN_TIMED_OUT): "Repairing | - | - | drain-until- | - | DrainIncomplete | -",
    (S.VERIFYING, E.VERIFICATION_PASSED): (
        "Qualified | - | - | fingerprint= owned-taints- qualified-at= seeds-passed= "
        "state-since= test- | UntaintDevices CloseTicket CloseTicket | Qualified | -"
    ),
    (S.VERIFYING, E.VERIFICATION_FAILED): (
        "Quarantined | - | - | history= owned-taints- state-since= test- | RaiseCycle "
        "RecordHardware | RepairFailed | -"
    ),
    (S.VERIFYING, E.DEVICES_RETURNED): (
        "Quarantined | - | - | history= owned-taints- state-since= test- | CloseTicket "
        "UntaintDevices RaiseCycle RecordHardware | DevicesReturned | -"
    ),
    (S.VERIFYING, E.REPAIR_CYCLES_EXCEEDED): (
        "Retired | testing | cordoned | cordoned-by-us= history= state-since= test- | Retire "
        "SetTicketPhase:Retired RecordHardware | Retired | -"
    ),
    (S.VERIFYING, E.TEST_INCONCLUSIVE): (
        "Verifying | testing | - | inconclusive= retry-after= test- | - | Inconclusive | -"
    ),
    (S.VERIFYING, E.RETEST_DUE): "Verifying | testing | - | seq= test= | CreateTest | - | -",
    (S.VERIFYING, E.OPTED_OUT): (
        "Excluded | - | - | owned-taints- state-since= test- | CancelTest UntaintDevices | "
        "Excluded | -"
    ),
    (S.VERIFYING, E.MANUAL_RELEASE): (
        "Qualified | - | - | owned-taints- state-since= test- | CancelTest UntaintDevices "
        "CloseTicket CloseTicket | Released | -"
    ),
    (S.RETIRED, E.OPTED_OUT): "Excluded | - | - | state-since= | UntaintDevices | Excluded | -",
    (S.RETIRED, E.MANUAL_RELEASE): (
        "Qualified | - | - | state-since= | UntaintDevices CloseTicket CloseTicket | Released | -"
    ),
}


def _id(row: Transition) -> str:
    return f"{row.source}-{row.event}"


def test_every_row_has_its_bound_transition_written_out() -> None:
    assert set(NODE_SCOPE_ROWS) == {(r.source, r.event) for r in TRANSITIONS}
    assert set(DEVICE_SCOPE_ROWS) <= set(NODE_SCOPE_ROWS)


@pytest.mark.parametrize("row", TRANSITIONS, ids=_id)
def test_a_row_bound_with_scope_node(row: Transition) -> None:
    before, bound = bind(row, NODE_SCOPE)
    got = summary(before, bound)
    assert got == seen(NODE_SCOPE_ROWS[(row.source, row.event)])
    assert got.label == row.target.value


@pytest.mark.parametrize("row", TRANSITIONS, ids=_id)
def test_a_row_bound_with_scope_device(row: Transition) -> None:
    before, bound = bind(row, DEVICE_SCOPE, device=True)
    key = (row.source, row.event)
    assert summary(before, bound) == seen(DEVICE_SCOPE_ROWS.get(key, NODE_SCOPE_ROWS[key]))


@pytest.mark.parametrize("row", TRANSITIONS, ids=_id)
def test_a_row_bound_in_observe_mode_changes_no_scheduling(row: Transition) -> None:
    """Observe labels, remembers, tests and tells; it sets aside what changes scheduling,
    deletes a node or reaches a repair system, and lets a registration gate go."""
    before, bound = bind(row, OBSERVE)
    kept = [a for a in bound.actions if isinstance(a, OBSERVE_SUPPRESSED)]
    assert kept == (
        [RemoveTaint(TaintRole.GATE, GATE, registered=True)] if before.has_taint(GATE) else []
    )
    got = summary(before, bound)
    assert got.label == row.target.value and not got.evicts
    assert got.cordoned == before.unschedulable
    repairs = {"CreateTicket", "Retire", "DeleteNode", "TaintDevices", "RecordHardware"}
    assert not repairs & set(got.objects)


@pytest.mark.parametrize(
    "spec", [NODE_SCOPE, DEVICE_SCOPE, OBSERVE], ids=["node", "device", "observe"]
)
@pytest.mark.parametrize("row", TRANSITIONS, ids=_id)
def test_a_bound_row_holds_only_actions_a_plan_applies(row: Transition, spec: object) -> None:
    """No bookkeeping, guard or template is left after binding: the plan only orders."""
    _, bound = bind(row, spec, device=spec is DEVICE_SCOPE)
    assert all(type(a) in STAGE_OF for a in bound.actions), bound.actions
    assert not [a for a in bound.actions if isinstance(a, (Only, *BOOKKEEPING))]
    assert len([a for a in bound.actions if isinstance(a, Annotate)]) <= 1


@pytest.mark.parametrize("state", [s for s in NodeState if s != S.EXCLUDED])
def test_a_node_as_sdcguard_leaves_it_needs_no_upkeep(state: NodeState) -> None:
    """The upkeep row of a node that already carries what its state implies writes
    nothing: upkeep adds only what is missing."""
    before = _node(state, device=False)
    observed = Observed(node=before, ticket=_ticket(state, E.OPTED_OUT, device=False))
    reader = Reader(observed, NODE_SCOPE, NOW)
    reading = Reading(None, "nothing to do")
    bound = Binder(reader, reading, state, None).bind_all(upkeep_row(reader))
    assert bound.actions == ()


def _upkept(state: NodeState, scope: Scope) -> list[str]:
    """The bound upkeep row of a node in ``state`` that lost everything its state
    implies (taints, cordon; a Quarantined node its ticket too)."""
    device = scope == Scope.DEVICE
    ticket = _ticket(state, E.REPAIR_STARTED, device) if state in HELD_STATES else None
    if device and ticket is None:
        ticket = _ticket(S.QUARANTINED, E.REPAIR_STARTED, device=True)
    if state == S.QUARANTINED and not device:
        ticket = None
    gated = state in (S.UNQUALIFIED, S.TESTING) and not device
    qualified = None if gated else NOW - HOUR
    n = node(state=state, qualified_at=qualified)
    observed = Observed(node=n, ticket=ticket, devices=NodeDevices(served=True, devices=GPUS))
    reader = Reader(observed, NODE_SCOPE, NOW)
    assert reader.state == state and scope_of(reader) == scope
    bound = Binder(reader, Reading(None, "kept"), state, None).bind_all(upkeep_row(reader))
    return [
        type(a).__name__ + (f":{a.role}" if isinstance(a, AddTaint) else "")
        for a in bound.actions
        if not isinstance(a, (Annotate, EmitEvent))
    ]


UPKEPT: dict[tuple[NodeState, Scope], list[str]] = {
    (S.UNQUALIFIED, Scope.NODE): ["AddTaint:gate"],
    (S.TESTING, Scope.NODE): ["AddTaint:gate", "AddTaint:testing"],
    (S.QUARANTINED, Scope.NODE): [
        "AddTaint:quarantine",
        "Cordon",
        "CreateTicket",
        "OpenTicketStatus",
    ],
    (S.REPAIRING, Scope.NODE): ["AddTaint:quarantine", "Cordon"],
    (S.VERIFYING, Scope.NODE): ["AddTaint:quarantine", "Cordon"],
    (S.RETIRED, Scope.NODE): ["AddTaint:quarantine", "Cordon"],
    (S.UNQUALIFIED, Scope.DEVICE): ["TaintDevices"],
    (S.QUARANTINED, Scope.DEVICE): ["TaintDevices"],
    (S.REPAIRING, Scope.DEVICE): ["TaintDevices"],
    (S.VERIFYING, Scope.DEVICE): ["AddTaint:testing", "TaintDevices"],
    (S.SUSPECT, Scope.DEVICE): ["TaintDevices"],
    (S.EXCLUDED, Scope.DEVICE): ["TaintDevices"],
}


def test_every_upkeep_row_has_its_bound_actions_written_out() -> None:
    assert set(UPKEPT) == set(UPKEEP)


@pytest.mark.parametrize(("state", "scope"), sorted(UPKEEP), ids=lambda v: str(v))
def test_an_upkeep_row_bound_restores_what_its_state_implies(
    state: NodeState, scope: Scope
) -> None:
    assert _upkept(state, scope) == UPKEPT[(state, scope)]
