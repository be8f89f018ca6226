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

from sdcguard.api import Finding, Resolution, ScreeningReason, Suite, TicketPhase, Verdict
from sdcguard.domain import keys
from sdcguard.domain.binding import Binder, Bound
from sdcguard.domain.devicetaints import NodeDevices, SliceDevice, TicketMember
from sdcguard.domain.lifecycle import (
    BOOKKEEPING,
    OBSERVE_SUPPRESSED,
    TRANSITIONS,
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
from sdcguard.domain.upkeep import upkeep_row
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
# a deliberate change here too.
NODE_SCOPE_ROWS: dict[tuple[NodeState, Event], Seen] = {
    (S.UNQUALIFIED, E.JOINED): Seen(
        label="Testing",
        taints=["gate", "testing"],
        cordoned=False,
        annotations=["owned-taints=", "seq=", "state-since=", "test="],
        objects=["CreateTest"],
        events=["TestStarted"],
        evicts=False,
    ),
    (S.UNQUALIFIED, E.REJOINED): Seen(
        label="Testing",
        taints=["gate", "testing"],
        cordoned=False,
        annotations=["history=", "owned-taints=", "seq=", "state-since=", "test="],
        objects=["CreateTest", "RecordHardware"],
        events=["HardwareRecognised"],
        evicts=False,
    ),
    (S.UNQUALIFIED, E.HARDWARE_RETIRED): Seen(
        label="Retired",
        taints=["gate", "quarantine"],
        cordoned=True,
        annotations=["cordoned-by-us=", "history=", "owned-taints=", "state-since="],
        objects=["Retire", "RecordHardware"],
        events=["Retired"],
        evicts=False,
    ),
    (S.UNQUALIFIED, E.ADMITTED): Seen(
        label="Qualified",
        taints=[],
        cordoned=False,
        annotations=["owned-taints-", "state-since="],
        objects=[],
        events=["Admitted"],
        evicts=False,
    ),
    (S.UNQUALIFIED, E.TEST_STARTED): Seen(
        label="Testing",
        taints=["gate", "testing"],
        cordoned=False,
        annotations=["owned-taints=", "state-since=", "test="],
        objects=[],
        events=[],
        evicts=False,
    ),
    (S.UNQUALIFIED, E.OPTED_OUT): Seen(
        label="Excluded",
        taints=[],
        cordoned=False,
        annotations=["owned-taints-", "state-since="],
        objects=[],
        events=["Excluded"],
        evicts=False,
    ),
    (S.UNQUALIFIED, E.MANUAL_QUARANTINE): Seen(
        label="Quarantined",
        taints=["gate", "quarantine"],
        cordoned=True,
        annotations=[
            "cluster-autoscaler.kubernetes.io/scale-down-disabled=",
            "cordoned-by-us=",
            "drain-until=",
            "karpenter.sh/do-not-disrupt=",
            "owned-annotations=",
            "owned-taints=",
            "seq=",
            "state-since=",
        ],
        objects=["CreateTicket", "OpenTicketStatus"],
        events=["Quarantined"],
        evicts=True,
    ),
    (S.UNQUALIFIED, E.MANUAL_RELEASE): Seen(
        label="Qualified",
        taints=[],
        cordoned=False,
        annotations=["owned-taints-", "state-since="],
        objects=[],
        events=["Released"],
        evicts=False,
    ),
    (S.TESTING, E.TEST_PASSED): Seen(
        label="Qualified",
        taints=[],
        cordoned=False,
        annotations=["fingerprint=", "owned-taints-", "qualified-at=", "state-since=", "test-"],
        objects=[],
        events=["Qualified"],
        evicts=False,
    ),
    (S.TESTING, E.TEST_FAILED_UNCONFIRMED): Seen(
        label="Suspect",
        taints=["testing"],
        cordoned=False,
        annotations=["evidence=", "seq=", "state-since=", "suspect-checks=", "test="],
        objects=["CreateTest"],
        events=["SDCSuspected"],
        evicts=False,
    ),
    (S.TESTING, E.TEST_FAILED): Seen(
        label="Quarantined",
        taints=["quarantine"],
        cordoned=True,
        annotations=[
            "cluster-autoscaler.kubernetes.io/scale-down-disabled=",
            "cordoned-by-us=",
            "drain-until=",
            "history=",
            "karpenter.sh/do-not-disrupt=",
            "owned-annotations=",
            "owned-taints=",
            "qualified-at-",
            "seq=",
            "state-since=",
            "test-",
        ],
        objects=["CreateTicket", "OpenTicketStatus", "RecordHardware"],
        events=["Quarantined"],
        evicts=True,
    ),
    (S.TESTING, E.REPAIR_CYCLES_EXCEEDED): Seen(
        label="Retired",
        taints=["quarantine"],
        cordoned=True,
        annotations=[
            "cordoned-by-us=",
            "history=",
            "owned-taints=",
            "qualified-at-",
            "seq=",
            "state-since=",
            "test-",
        ],
        objects=["CreateTicket", "Retire", "OpenTicketStatus", "RecordHardware"],
        events=["Retired"],
        evicts=False,
    ),
    (S.TESTING, E.QUARANTINE_HELD): Seen(
        label="Suspect",
        taints=["testing"],
        cordoned=False,
        annotations=["evidence=", "held=", "state-since=", "suspect-checks=", "test-"],
        objects=[],
        events=["QuarantineHeld"],
        evicts=False,
    ),
    (S.TESTING, E.TEST_INCONCLUSIVE): Seen(
        label="Qualified",
        taints=[],
        cordoned=False,
        annotations=["inconclusive=", "owned-taints-", "retry-after=", "state-since=", "test-"],
        objects=[],
        events=["Inconclusive"],
        evicts=False,
    ),
    (S.TESTING, E.ACCEPTANCE_INCONCLUSIVE): Seen(
        label="Unqualified",
        taints=[],
        cordoned=False,
        annotations=["inconclusive=", "owned-taints-", "retry-after=", "state-since=", "test-"],
        objects=[],
        events=["Inconclusive"],
        evicts=False,
    ),
    (S.TESTING, E.OPTED_OUT): Seen(
        label="Excluded",
        taints=[],
        cordoned=False,
        annotations=["owned-taints-", "state-since=", "test-"],
        objects=["CancelTest"],
        events=["Excluded"],
        evicts=False,
    ),
    (S.TESTING, E.MANUAL_QUARANTINE): Seen(
        label="Quarantined",
        taints=["quarantine"],
        cordoned=True,
        annotations=[
            "cluster-autoscaler.kubernetes.io/scale-down-disabled=",
            "cordoned-by-us=",
            "drain-until=",
            "karpenter.sh/do-not-disrupt=",
            "owned-annotations=",
            "owned-taints=",
            "qualified-at-",
            "seq=",
            "state-since=",
            "test-",
        ],
        objects=["CancelTest", "CreateTicket", "OpenTicketStatus"],
        events=["Quarantined"],
        evicts=True,
    ),
    (S.TESTING, E.MANUAL_RELEASE): Seen(
        label="Qualified",
        taints=[],
        cordoned=False,
        annotations=["owned-taints-", "state-since=", "test-"],
        objects=["CancelTest"],
        events=["Released"],
        evicts=False,
    ),
    (S.QUALIFIED, E.IDLE_DUE): Seen(
        label="Testing",
        taints=["testing"],
        cordoned=False,
        annotations=["owned-taints=", "seq=", "state-since=", "test="],
        objects=["CreateTest"],
        events=["TestStarted"],
        evicts=False,
    ),
    (S.QUALIFIED, E.EXPIRY_DUE): Seen(
        label="Testing",
        taints=["testing"],
        cordoned=False,
        annotations=["owned-taints=", "seq=", "state-since=", "test="],
        objects=["CreateTest"],
        events=["TestStarted"],
        evicts=False,
    ),
    (S.QUALIFIED, E.TEST_STARTED): Seen(
        label="Testing",
        taints=["testing"],
        cordoned=False,
        annotations=["owned-taints=", "state-since=", "test="],
        objects=[],
        events=[],
        evicts=False,
    ),
    (S.QUALIFIED, E.SUSPECTED): Seen(
        label="Suspect",
        taints=["testing"],
        cordoned=False,
        annotations=["owned-taints=", "state-since="],
        objects=[],
        events=["Suspected"],
        evicts=False,
    ),
    (S.QUALIFIED, E.OPTED_OUT): Seen(
        label="Excluded",
        taints=[],
        cordoned=False,
        annotations=["state-since="],
        objects=[],
        events=["Excluded"],
        evicts=False,
    ),
    (S.QUALIFIED, E.MANUAL_QUARANTINE): Seen(
        label="Quarantined",
        taints=["quarantine"],
        cordoned=True,
        annotations=[
            "cluster-autoscaler.kubernetes.io/scale-down-disabled=",
            "cordoned-by-us=",
            "drain-until=",
            "karpenter.sh/do-not-disrupt=",
            "owned-annotations=",
            "owned-taints=",
            "qualified-at-",
            "seq=",
            "state-since=",
        ],
        objects=["CreateTicket", "OpenTicketStatus"],
        events=["Quarantined"],
        evicts=True,
    ),
    (S.SUSPECT, E.TEST_PASSED): Seen(
        label="Qualified",
        taints=[],
        cordoned=False,
        annotations=[
            "evidence-",
            "fingerprint=",
            "owned-taints-",
            "qualified-at=",
            "state-since=",
            "suspect-checks-",
            "test-",
        ],
        objects=[],
        events=["Cleared"],
        evicts=False,
    ),
    (S.SUSPECT, E.TEST_FAILED): Seen(
        label="Quarantined",
        taints=["quarantine"],
        cordoned=True,
        annotations=[
            "cluster-autoscaler.kubernetes.io/scale-down-disabled=",
            "cordoned-by-us=",
            "drain-until=",
            "evidence-",
            "history=",
            "karpenter.sh/do-not-disrupt=",
            "owned-annotations=",
            "owned-taints=",
            "qualified-at-",
            "seq=",
            "state-since=",
            "suspect-checks-",
            "test-",
        ],
        objects=["CreateTicket", "OpenTicketStatus", "RecordHardware"],
        events=["Quarantined"],
        evicts=True,
    ),
    (S.SUSPECT, E.REPAIR_CYCLES_EXCEEDED): Seen(
        label="Retired",
        taints=["quarantine"],
        cordoned=True,
        annotations=[
            "cordoned-by-us=",
            "evidence-",
            "history=",
            "owned-taints=",
            "qualified-at-",
            "seq=",
            "state-since=",
            "suspect-checks-",
            "test-",
        ],
        objects=["CreateTicket", "Retire", "OpenTicketStatus", "RecordHardware"],
        events=["Retired"],
        evicts=False,
    ),
    (S.SUSPECT, E.TEST_FAILED_UNCONFIRMED): Seen(
        label="Suspect",
        taints=["testing"],
        cordoned=False,
        annotations=["evidence=", "seq=", "test="],
        objects=["CreateTest"],
        events=["SDCSuspected"],
        evicts=False,
    ),
    (S.SUSPECT, E.CONFIRMATION_PASSED): Seen(
        label="Suspect",
        taints=["testing"],
        cordoned=False,
        annotations=["evidence=", "seq=", "test="],
        objects=["CreateTest"],
        events=[],
        evicts=False,
    ),
    (S.SUSPECT, E.FLAKY): Seen(
        label="Suspect",
        taints=["testing"],
        cordoned=False,
        annotations=["evidence=", "retry-after=", "test-"],
        objects=[],
        events=["Flaky"],
        evicts=False,
    ),
    (S.SUSPECT, E.QUARANTINE_HELD): Seen(
        label="Suspect",
        taints=["testing"],
        cordoned=False,
        annotations=["evidence=", "held=", "test-"],
        objects=[],
        events=["QuarantineHeld"],
        evicts=False,
    ),
    (S.SUSPECT, E.TEST_INCONCLUSIVE): Seen(
        label="Suspect",
        taints=["testing"],
        cordoned=False,
        annotations=["inconclusive=", "retry-after=", "test-"],
        objects=[],
        events=["Inconclusive"],
        evicts=False,
    ),
    (S.SUSPECT, E.RETEST_DUE): Seen(
        label="Suspect",
        taints=["testing"],
        cordoned=False,
        annotations=["seq=", "test="],
        objects=["CreateTest"],
        events=["TestStarted"],
        evicts=False,
    ),
    (S.SUSPECT, E.TEST_STARTED): Seen(
        label="Suspect",
        taints=["testing"],
        cordoned=False,
        annotations=["test="],
        objects=[],
        events=[],
        evicts=False,
    ),
    (S.SUSPECT, E.OPTED_OUT): Seen(
        label="Excluded",
        taints=[],
        cordoned=False,
        annotations=["evidence-", "owned-taints-", "state-since=", "suspect-checks-", "test-"],
        objects=["CancelTest"],
        events=["Excluded"],
        evicts=False,
    ),
    (S.SUSPECT, E.MANUAL_QUARANTINE): Seen(
        label="Quarantined",
        taints=["quarantine"],
        cordoned=True,
        annotations=[
            "cluster-autoscaler.kubernetes.io/scale-down-disabled=",
            "cordoned-by-us=",
            "drain-until=",
            "evidence-",
            "karpenter.sh/do-not-disrupt=",
            "owned-annotations=",
            "owned-taints=",
            "qualified-at-",
            "seq=",
            "state-since=",
            "suspect-checks-",
            "test-",
        ],
        objects=["CancelTest", "CreateTicket", "OpenTicketStatus"],
        events=["Quarantined"],
        evicts=True,
    ),
    (S.SUSPECT, E.MANUAL_RELEASE): Seen(
        label="Qualified",
        taints=[],
        cordoned=False,
        annotations=["evidence-", "owned-taints-", "state-since=", "suspect-checks-", "test-"],
        objects=["CancelTest"],
        events=["Released"],
        evicts=False,
    ),
    (S.QUARANTINED, E.REPAIR_STARTED): Seen(
        label="Repairing",
        taints=["quarantine"],
        cordoned=True,
        annotations=["state-since="],
        objects=["SetTicketPhase:InRepair"],
        events=["RepairStarted"],
        evicts=False,
    ),
    (S.QUARANTINED, E.REPLACE_DUE): Seen(
        label="Repairing",
        taints=["quarantine"],
        cordoned=True,
        annotations=["state-since="],
        objects=["SetTicketPhase:InRepair", "DeleteNode"],
        events=["Replacing"],
        evicts=False,
    ),
    (S.QUARANTINED, E.TICKET_RESOLVED): Seen(
        label="Verifying",
        taints=["quarantine"],
        cordoned=True,
        annotations=["drain-until-", "seq=", "state-since=", "test="],
        objects=["SetTicketPhase:Verifying", "CreateTest"],
        events=["Verifying"],
        evicts=False,
    ),
    (S.QUARANTINED, E.TICKET_RETIRE): Seen(
        label="Retired",
        taints=["quarantine"],
        cordoned=True,
        annotations=["drain-until-", "history=", "state-since="],
        objects=["Retire", "RecordHardware"],
        events=["Retired"],
        evicts=False,
    ),
    (S.QUARANTINED, E.OPTED_OUT): Seen(
        label="Excluded",
        taints=[],
        cordoned=False,
        annotations=[
            "cluster-autoscaler.kubernetes.io/scale-down-disabled-",
            "cordoned-by-us-",
            "drain-until-",
            "karpenter.sh/do-not-disrupt-",
            "owned-annotations-",
            "owned-taints-",
            "state-since=",
        ],
        objects=[],
        events=["Excluded"],
        evicts=False,
    ),
    (S.QUARANTINED, E.MANUAL_RELEASE): Seen(
        label="Qualified",
        taints=[],
        cordoned=False,
        annotations=[
            "cluster-autoscaler.kubernetes.io/scale-down-disabled-",
            "cordoned-by-us-",
            "drain-until-",
            "karpenter.sh/do-not-disrupt-",
            "owned-annotations-",
            "owned-taints-",
            "state-since=",
        ],
        objects=["CloseTicket"],
        events=["Released"],
        evicts=False,
    ),
    (S.QUARANTINED, E.DRAIN_DUE): Seen(
        label="Quarantined",
        taints=["quarantine"],
        cordoned=True,
        annotations=[],
        objects=[],
        events=[],
        evicts=True,
    ),
    (S.QUARANTINED, E.DRAIN_TIMED_OUT): Seen(
        label="Quarantined",
        taints=["quarantine"],
        cordoned=True,
        annotations=["drain-until-"],
        objects=[],
        events=["DrainIncomplete"],
        evicts=False,
    ),
    (S.REPAIRING, E.TICKET_RESOLVED): Seen(
        label="Verifying",
        taints=["quarantine"],
        cordoned=True,
        annotations=["drain-until-", "seq=", "state-since=", "test="],
        objects=["SetTicketPhase:Verifying", "CreateTest"],
        events=["Verifying"],
        evicts=False,
    ),
    (S.REPAIRING, E.TICKET_RETIRE): Seen(
        label="Retired",
        taints=["quarantine"],
        cordoned=True,
        annotations=["drain-until-", "history=", "state-since="],
        objects=["Retire", "RecordHardware"],
        events=["Retired"],
        evicts=False,
    ),
    (S.REPAIRING, E.OPTED_OUT): Seen(
        label="Excluded",
        taints=[],
        cordoned=False,
        annotations=[
            "cluster-autoscaler.kubernetes.io/scale-down-disabled-",
            "cordoned-by-us-",
            "drain-until-",
            "karpenter.sh/do-not-disrupt-",
            "owned-annotations-",
            "owned-taints-",
            "state-since=",
        ],
        objects=[],
        events=["Excluded"],
        evicts=False,
    ),
    (S.REPAIRING, E.MANUAL_RELEASE): Seen(
        label="Qualified",
        taints=[],
        cordoned=False,
        annotations=[
            "cluster-autoscaler.kubernetes.io/scale-down-disabled-",
            "cordoned-by-us-",
            "drain-until-",
            "karpenter.sh/do-not-disrupt-",
            "owned-annotations-",
            "owned-taints-",
            "state-since=",
        ],
        objects=["CloseTicket"],
        events=["Released"],
        evicts=False,
    ),
    (S.REPAIRING, E.DRAIN_DUE): Seen(
        label="Repairing",
        taints=["quarantine"],
        cordoned=True,
        annotations=[],
        objects=[],
        events=[],
        evicts=True,
    ),
    (S.REPAIRING, E.DRAIN_TIMED_OUT): Seen(
        label="Repairing",
        taints=["quarantine"],
        cordoned=True,
        annotations=["drain-until-"],
        objects=[],
        events=["DrainIncomplete"],
        evicts=False,
    ),
    (S.VERIFYING, E.VERIFICATION_PASSED): Seen(
        label="Qualified",
        taints=[],
        cordoned=False,
        annotations=[
            "cluster-autoscaler.kubernetes.io/scale-down-disabled-",
            "cordoned-by-us-",
            "fingerprint=",
            "karpenter.sh/do-not-disrupt-",
            "owned-annotations-",
            "owned-taints-",
            "qualified-at=",
            "state-since=",
            "test-",
        ],
        objects=["CloseTicket"],
        events=["Qualified"],
        evicts=False,
    ),
    (S.VERIFYING, E.VERIFICATION_FAILED): Seen(
        label="Quarantined",
        taints=["quarantine"],
        cordoned=True,
        annotations=["history=", "state-since=", "test-"],
        objects=["RaiseCycle", "RecordHardware"],
        events=["RepairFailed"],
        evicts=False,
    ),
    (S.VERIFYING, E.DEVICES_RETURNED): Seen(
        label="Quarantined",
        taints=["quarantine"],
        cordoned=True,
        annotations=["history=", "state-since=", "test-"],
        objects=["CloseTicket", "RaiseCycle", "RecordHardware"],
        events=["DevicesReturned"],
        evicts=False,
    ),
    (S.VERIFYING, E.REPAIR_CYCLES_EXCEEDED): Seen(
        label="Retired",
        taints=["quarantine"],
        cordoned=True,
        annotations=["history=", "state-since=", "test-"],
        objects=["Retire", "RecordHardware"],
        events=["Retired"],
        evicts=False,
    ),
    (S.VERIFYING, E.TEST_INCONCLUSIVE): Seen(
        label="Verifying",
        taints=["quarantine"],
        cordoned=True,
        annotations=["inconclusive=", "retry-after=", "test-"],
        objects=[],
        events=["Inconclusive"],
        evicts=False,
    ),
    (S.VERIFYING, E.RETEST_DUE): Seen(
        label="Verifying",
        taints=["quarantine"],
        cordoned=True,
        annotations=["seq=", "test="],
        objects=["CreateTest"],
        events=[],
        evicts=False,
    ),
    (S.VERIFYING, E.OPTED_OUT): Seen(
        label="Excluded",
        taints=[],
        cordoned=False,
        annotations=[
            "cluster-autoscaler.kubernetes.io/scale-down-disabled-",
            "cordoned-by-us-",
            "karpenter.sh/do-not-disrupt-",
            "owned-annotations-",
            "owned-taints-",
            "state-since=",
            "test-",
        ],
        objects=["CancelTest"],
        events=["Excluded"],
        evicts=False,
    ),
    (S.VERIFYING, E.MANUAL_RELEASE): Seen(
        label="Qualified",
        taints=[],
        cordoned=False,
        annotations=[
            "cluster-autoscaler.kubernetes.io/scale-down-disabled-",
            "cordoned-by-us-",
            "karpenter.sh/do-not-disrupt-",
            "owned-annotations-",
            "owned-taints-",
            "state-since=",
            "test-",
        ],
        objects=["CancelTest", "CloseTicket"],
        events=["Released"],
        evicts=False,
    ),
    (S.RETIRED, E.OPTED_OUT): Seen(
        label="Excluded",
        taints=[],
        cordoned=False,
        annotations=[
            "cluster-autoscaler.kubernetes.io/scale-down-disabled-",
            "cordoned-by-us-",
            "karpenter.sh/do-not-disrupt-",
            "owned-annotations-",
            "owned-taints-",
            "state-since=",
        ],
        objects=[],
        events=["Excluded"],
        evicts=False,
    ),
    (S.RETIRED, E.MANUAL_RELEASE): Seen(
        label="Qualified",
        taints=[],
        cordoned=False,
        annotations=[
            "cluster-autoscaler.kubernetes.io/scale-down-disabled-",
            "cordoned-by-us-",
            "karpenter.sh/do-not-disrupt-",
            "owned-annotations-",
            "owned-taints-",
            "state-since=",
        ],
        objects=["CloseTicket"],
        events=["Released"],
        evicts=False,
    ),
    (S.EXCLUDED, E.OPTED_IN): Seen(
        label="Unqualified",
        taints=[],
        cordoned=False,
        annotations=["qualified-at-", "state-since="],
        objects=[],
        events=["OptedIn"],
        evicts=False,
    ),
}

# Scope Device (drain off): the rows that differ from scope Node. A quarantine found on
# one device (the test's finding) taints that device and leaves the node serving; an
# open incident of two device tickets is verified, returned, released and retired
# ticket by ticket; a person's quarantine (no finding) falls back to the whole node.
DEVICE_SCOPE_ROWS: dict[tuple[NodeState, Event], Seen] = {
    (S.UNQUALIFIED, E.MANUAL_QUARANTINE): Seen(
        label="Quarantined",
        taints=["gate", "quarantine"],
        cordoned=True,
        annotations=[
            "cluster-autoscaler.kubernetes.io/scale-down-disabled=",
            "cordoned-by-us=",
            "karpenter.sh/do-not-disrupt=",
            "owned-annotations=",
            "owned-taints=",
            "seq=",
            "state-since=",
        ],
        objects=["CreateTicket", "OpenTicketStatus"],
        events=["Quarantined"],
        evicts=False,
    ),
    (S.TESTING, E.TEST_FAILED): Seen(
        label="Quarantined",
        taints=[],
        cordoned=False,
        annotations=[
            "cluster-autoscaler.kubernetes.io/scale-down-disabled=",
            "history=",
            "karpenter.sh/do-not-disrupt=",
            "owned-annotations=",
            "owned-taints-",
            "qualified-at-",
            "seq=",
            "state-since=",
            "test-",
        ],
        objects=["TaintDevices", "CreateTicket", "OpenTicketStatus", "RecordHardware"],
        events=["Quarantined"],
        evicts=False,
    ),
    (S.TESTING, E.MANUAL_QUARANTINE): Seen(
        label="Quarantined",
        taints=["quarantine"],
        cordoned=True,
        annotations=[
            "cluster-autoscaler.kubernetes.io/scale-down-disabled=",
            "cordoned-by-us=",
            "karpenter.sh/do-not-disrupt=",
            "owned-annotations=",
            "owned-taints=",
            "qualified-at-",
            "seq=",
            "state-since=",
            "test-",
        ],
        objects=["CancelTest", "CreateTicket", "OpenTicketStatus"],
        events=["Quarantined"],
        evicts=False,
    ),
    (S.QUALIFIED, E.MANUAL_QUARANTINE): Seen(
        label="Quarantined",
        taints=["quarantine"],
        cordoned=True,
        annotations=[
            "cluster-autoscaler.kubernetes.io/scale-down-disabled=",
            "cordoned-by-us=",
            "karpenter.sh/do-not-disrupt=",
            "owned-annotations=",
            "owned-taints=",
            "qualified-at-",
            "seq=",
            "state-since=",
        ],
        objects=["CreateTicket", "OpenTicketStatus"],
        events=["Quarantined"],
        evicts=False,
    ),
    (S.SUSPECT, E.TEST_FAILED): Seen(
        label="Quarantined",
        taints=[],
        cordoned=False,
        annotations=[
            "cluster-autoscaler.kubernetes.io/scale-down-disabled=",
            "evidence-",
            "history=",
            "karpenter.sh/do-not-disrupt=",
            "owned-annotations=",
            "owned-taints-",
            "qualified-at-",
            "seq=",
            "state-since=",
            "suspect-checks-",
            "test-",
        ],
        objects=["TaintDevices", "CreateTicket", "OpenTicketStatus", "RecordHardware"],
        events=["Quarantined"],
        evicts=False,
    ),
    (S.SUSPECT, E.MANUAL_QUARANTINE): Seen(
        label="Quarantined",
        taints=["quarantine"],
        cordoned=True,
        annotations=[
            "cluster-autoscaler.kubernetes.io/scale-down-disabled=",
            "cordoned-by-us=",
            "evidence-",
            "karpenter.sh/do-not-disrupt=",
            "owned-annotations=",
            "owned-taints=",
            "qualified-at-",
            "seq=",
            "state-since=",
            "suspect-checks-",
            "test-",
        ],
        objects=["CancelTest", "CreateTicket", "OpenTicketStatus"],
        events=["Quarantined"],
        evicts=False,
    ),
    (S.QUARANTINED, E.REPAIR_STARTED): Seen(
        label="Repairing",
        taints=[],
        cordoned=False,
        annotations=["state-since="],
        objects=["SetTicketPhase:InRepair", "SetTicketPhase:InRepair"],
        events=["RepairStarted"],
        evicts=False,
    ),
    (S.QUARANTINED, E.REPLACE_DUE): Seen(
        label="Repairing",
        taints=[],
        cordoned=False,
        annotations=["state-since="],
        objects=["SetTicketPhase:InRepair", "SetTicketPhase:InRepair", "DeleteNode"],
        events=["Replacing"],
        evicts=False,
    ),
    (S.QUARANTINED, E.TICKET_RESOLVED): Seen(
        label="Verifying",
        taints=["testing"],
        cordoned=False,
        annotations=["drain-until-", "owned-taints=", "seq=", "state-since=", "test="],
        objects=["SetTicketPhase:Verifying", "SetTicketPhase:Verifying", "CreateTest"],
        events=["Verifying"],
        evicts=False,
    ),
    (S.QUARANTINED, E.TICKET_RETIRE): Seen(
        label="Retired",
        taints=[],
        cordoned=True,
        annotations=["cordoned-by-us=", "drain-until-", "history=", "state-since="],
        objects=["Retire", "SetTicketPhase:Retired", "RecordHardware"],
        events=["Retired"],
        evicts=False,
    ),
    (S.QUARANTINED, E.OPTED_OUT): Seen(
        label="Excluded",
        taints=[],
        cordoned=False,
        annotations=["drain-until-", "state-since="],
        objects=["UntaintDevices"],
        events=["Excluded"],
        evicts=False,
    ),
    (S.QUARANTINED, E.MANUAL_RELEASE): Seen(
        label="Qualified",
        taints=[],
        cordoned=False,
        annotations=["drain-until-", "state-since="],
        objects=["UntaintDevices", "CloseTicket", "CloseTicket"],
        events=["Released"],
        evicts=False,
    ),
    (S.QUARANTINED, E.DRAIN_DUE): Seen(
        label="Quarantined",
        taints=[],
        cordoned=False,
        annotations=[],
        objects=[],
        events=[],
        evicts=False,
    ),
    (S.QUARANTINED, E.DRAIN_TIMED_OUT): Seen(
        label="Quarantined",
        taints=[],
        cordoned=False,
        annotations=["drain-until-"],
        objects=[],
        events=["DrainIncomplete"],
        evicts=False,
    ),
    (S.REPAIRING, E.TICKET_RESOLVED): Seen(
        label="Verifying",
        taints=["testing"],
        cordoned=False,
        annotations=["drain-until-", "owned-taints=", "seq=", "state-since=", "test="],
        objects=["SetTicketPhase:Verifying", "SetTicketPhase:Verifying", "CreateTest"],
        events=["Verifying"],
        evicts=False,
    ),
    (S.REPAIRING, E.TICKET_RETIRE): Seen(
        label="Retired",
        taints=[],
        cordoned=True,
        annotations=["cordoned-by-us=", "drain-until-", "history=", "state-since="],
        objects=["Retire", "SetTicketPhase:Retired", "RecordHardware"],
        events=["Retired"],
        evicts=False,
    ),
    (S.REPAIRING, E.OPTED_OUT): Seen(
        label="Excluded",
        taints=[],
        cordoned=False,
        annotations=["drain-until-", "state-since="],
        objects=["UntaintDevices"],
        events=["Excluded"],
        evicts=False,
    ),
    (S.REPAIRING, E.MANUAL_RELEASE): Seen(
        label="Qualified",
        taints=[],
        cordoned=False,
        annotations=["drain-until-", "state-since="],
        objects=["UntaintDevices", "CloseTicket", "CloseTicket"],
        events=["Released"],
        evicts=False,
    ),
    (S.REPAIRING, E.DRAIN_DUE): Seen(
        label="Repairing",
        taints=[],
        cordoned=False,
        annotations=[],
        objects=[],
        events=[],
        evicts=False,
    ),
    (S.REPAIRING, E.DRAIN_TIMED_OUT): Seen(
        label="Repairing",
        taints=[],
        cordoned=False,
        annotations=["drain-until-"],
        objects=[],
        events=["DrainIncomplete"],
        evicts=False,
    ),
    (S.VERIFYING, E.VERIFICATION_PASSED): Seen(
        label="Qualified",
        taints=[],
        cordoned=False,
        annotations=["fingerprint=", "owned-taints-", "qualified-at=", "state-since=", "test-"],
        objects=["UntaintDevices", "CloseTicket", "CloseTicket"],
        events=["Qualified"],
        evicts=False,
    ),
    (S.VERIFYING, E.VERIFICATION_FAILED): Seen(
        label="Quarantined",
        taints=[],
        cordoned=False,
        annotations=["history=", "owned-taints-", "state-since=", "test-"],
        objects=["RaiseCycle", "RecordHardware"],
        events=["RepairFailed"],
        evicts=False,
    ),
    (S.VERIFYING, E.DEVICES_RETURNED): Seen(
        label="Quarantined",
        taints=[],
        cordoned=False,
        annotations=["history=", "owned-taints-", "state-since=", "test-"],
        objects=["CloseTicket", "UntaintDevices", "RaiseCycle", "RecordHardware"],
        events=["DevicesReturned"],
        evicts=False,
    ),
    (S.VERIFYING, E.REPAIR_CYCLES_EXCEEDED): Seen(
        label="Retired",
        taints=["testing"],
        cordoned=True,
        annotations=["cordoned-by-us=", "history=", "state-since=", "test-"],
        objects=["Retire", "SetTicketPhase:Retired", "RecordHardware"],
        events=["Retired"],
        evicts=False,
    ),
    (S.VERIFYING, E.TEST_INCONCLUSIVE): Seen(
        label="Verifying",
        taints=["testing"],
        cordoned=False,
        annotations=["inconclusive=", "retry-after=", "test-"],
        objects=[],
        events=["Inconclusive"],
        evicts=False,
    ),
    (S.VERIFYING, E.RETEST_DUE): Seen(
        label="Verifying",
        taints=["testing"],
        cordoned=False,
        annotations=["seq=", "test="],
        objects=["CreateTest"],
        events=[],
        evicts=False,
    ),
    (S.VERIFYING, E.OPTED_OUT): Seen(
        label="Excluded",
        taints=[],
        cordoned=False,
        annotations=["owned-taints-", "state-since=", "test-"],
        objects=["CancelTest", "UntaintDevices"],
        events=["Excluded"],
        evicts=False,
    ),
    (S.VERIFYING, E.MANUAL_RELEASE): Seen(
        label="Qualified",
        taints=[],
        cordoned=False,
        annotations=["owned-taints-", "state-since=", "test-"],
        objects=["CancelTest", "UntaintDevices", "CloseTicket", "CloseTicket"],
        events=["Released"],
        evicts=False,
    ),
    (S.RETIRED, E.OPTED_OUT): Seen(
        label="Excluded",
        taints=[],
        cordoned=False,
        annotations=["state-since="],
        objects=["UntaintDevices"],
        events=["Excluded"],
        evicts=False,
    ),
    (S.RETIRED, E.MANUAL_RELEASE): Seen(
        label="Qualified",
        taints=[],
        cordoned=False,
        annotations=["state-since="],
        objects=["UntaintDevices", "CloseTicket", "CloseTicket"],
        events=["Released"],
        evicts=False,
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
    seen = summary(before, bound)
    assert seen == NODE_SCOPE_ROWS[(row.source, row.event)]
    assert seen.label == row.target.value


@pytest.mark.parametrize("row", TRANSITIONS, ids=_id)
def test_a_row_bound_with_scope_device(row: Transition) -> None:
    before, bound = bind(row, DEVICE_SCOPE, device=True)
    key = (row.source, row.event)
    assert summary(before, bound) == DEVICE_SCOPE_ROWS.get(key, NODE_SCOPE_ROWS[key])


@pytest.mark.parametrize("row", TRANSITIONS, ids=_id)
def test_a_row_bound_in_observe_mode_changes_no_scheduling(row: Transition) -> None:
    """Observe labels, remembers, tests and tells; it sets aside what changes scheduling,
    deletes a node or reaches a repair system, and lets a registration gate go."""
    before, bound = bind(row, OBSERVE)
    kept = [a for a in bound.actions if isinstance(a, OBSERVE_SUPPRESSED)]
    assert kept == (
        [RemoveTaint(TaintRole.GATE, GATE, registered=True)] if before.has_taint(GATE) else []
    )
    seen = summary(before, bound)
    assert seen.label == row.target.value and not seen.evicts
    assert seen.cordoned == before.unschedulable
    assert not {"CreateTicket", "Retire", "DeleteNode", "TaintDevices", "RecordHardware"} & set(
        seen.objects
    )


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
