"""The transition table, row by row, and everything outside it."""

from __future__ import annotations

import itertools

import pytest

from sdcguard.api import ScreeningReason, Suite, TicketPhase
from sdcguard.domain.lifecycle import (
    DRAINED_STATES,
    EVERY_TRANSITION,
    TABLE,
    TRANSITIONS,
    AddTaint,
    AdoptTest,
    BackOff,
    CancelTest,
    CloseTicket,
    Cordon,
    CreateTest,
    CreateTicket,
    DeleteNode,
    Drain,
    DrainDeadline,
    EmitEvent,
    EndDrain,
    Event,
    ForgetSuspicion,
    ForgetTest,
    HoldQuarantine,
    IllegalTransition,
    KeepSuspicion,
    MarkQualified,
    NodeState,
    Only,
    OpenTicketStatus,
    RaiseCycle,
    RecordHardware,
    RemoveTaint,
    Retire,
    RevokeQualification,
    RowAction,
    SetAutoscalerAnnotations,
    SetLabel,
    SetTicketPhase,
    TaintDevices,
    TaintRole,
    Transition,
    Uncordon,
    UntaintDevices,
    UntaintReturnedDevices,
    transition,
)

S, E = NodeState, Event
GATE, TESTING, QUARANTINE = TaintRole.GATE, TaintRole.TESTING, TaintRole.QUARANTINE

SETTLED = {"ForgetTest", "ForgetSuspicion"}
KEEP_SUSPECT = {"ForgetTest", "KeepSuspicion"}
BACK_OFF = {"ForgetTest", "BackOff:count"}
QUARANTINE_TAINT = {"+quarantine if NodeScope", "TaintDevices if DeviceScope"}
RETIRE = {"Retire", "DeleteNode if RetireByDelete"}
QUARANTINE_EFFECTS = (
    SETTLED
    | QUARANTINE_TAINT
    | {
        "-testing",
        "Cordon if NodeScope+Cordon",
        "Drain if NodeScope+Drain",
        "DrainDeadline if NodeScope+Drain",
        "RevokeQualification",
        "CreateTicket",
        "OpenTicketStatus",
        "Autoscaler:on if InPlace",
    }
)
RELEASE_EFFECTS = SETTLED | {
    "-gate",
    "-testing",
    "-quarantine if NodeScope",
    "UntaintDevices if DeviceScope",
    "Uncordon",
    "Autoscaler:off",
}
QUALIFY_EFFECTS = SETTLED | {"-gate", "-testing", "MarkQualified"}
RETIRE_EFFECTS = SETTLED | RETIRE | {"Cordon if RetireByCordon"}
OUT_OF_CYCLES = (
    SETTLED
    | QUARANTINE_TAINT
    | RETIRE
    | {
        "-testing",
        "Cordon if RetireByCordon",
        "RevokeQualification",
        "CreateTicket:retired",
        "OpenTicketStatus",
        "Hardware:Retired+retire",
    }
)
VERIFY = {"Test:repairVerification/RepairVerification", "+testing if DeviceScope"}


def _confirm() -> str:
    return "Test:same/Confirmation"


# (source, event) -> (target, effects other than the label and Events, the node's
# bookkeeping included), written out by hand so that any change to the table is a
# deliberate change here too.
EXPECTED: dict[tuple[NodeState, Event], tuple[NodeState, set[str]]] = {
    (S.UNQUALIFIED, E.JOINED): (S.TESTING, {"+gate", "+testing", "Test:acceptance/Join"}),
    (S.UNQUALIFIED, E.REJOINED): (
        S.TESTING,
        {"+gate", "+testing", "Test:repairVerification/Join", "Hardware:seen"},
    ),
    (S.UNQUALIFIED, E.HARDWARE_RETIRED): (
        S.RETIRED,
        SETTLED | QUARANTINE_TAINT | RETIRE | {"Cordon if RetireByCordon", "Hardware:seen"},
    ),
    (S.UNQUALIFIED, E.ADMITTED): (S.QUALIFIED, {"-gate"}),
    (S.UNQUALIFIED, E.TEST_STARTED): (S.TESTING, {"AdoptTest", "+gate", "+testing"}),
    (S.TESTING, E.ADMITTED): (S.QUALIFIED, {"CancelTest", "-testing", "-gate"}),
    (S.TESTING, E.TEST_PASSED): (S.QUALIFIED, QUALIFY_EFFECTS),
    (S.TESTING, E.TEST_FAILED_UNCONFIRMED): (S.SUSPECT, KEEP_SUSPECT | {_confirm()}),
    (S.TESTING, E.TEST_FAILED): (S.QUARANTINED, QUARANTINE_EFFECTS | {"Hardware:Quarantined"}),
    (S.TESTING, E.REPAIR_CYCLES_EXCEEDED): (S.RETIRED, OUT_OF_CYCLES),
    (S.TESTING, E.QUARANTINE_HELD): (S.SUSPECT, KEEP_SUSPECT | {"HoldQuarantine"}),
    (S.TESTING, E.TEST_INCONCLUSIVE): (S.QUALIFIED, BACK_OFF | {"-testing"}),
    (S.TESTING, E.ACCEPTANCE_INCONCLUSIVE): (S.UNQUALIFIED, BACK_OFF | {"-testing"}),
    (S.TESTING, E.TEST_CANCELLED): (S.QUALIFIED, {"ForgetTest", "-testing"}),
    (S.TESTING, E.ACCEPTANCE_CANCELLED): (S.UNQUALIFIED, {"ForgetTest", "-testing"}),
    (S.QUALIFIED, E.IDLE_DUE): (S.TESTING, {"+testing", "Test:requalification/ReturnFromUse"}),
    (S.QUALIFIED, E.EXPIRY_DUE): (S.TESTING, {"+testing", "Test:requalification/Expiry"}),
    (S.QUALIFIED, E.TEST_STARTED): (S.TESTING, {"AdoptTest", "+testing"}),
    (S.QUALIFIED, E.SUSPECTED): (S.SUSPECT, {"+testing if HoldSuspects"}),
    # triggers.overdue.action Drain: hold the busy overdue node, drain it after the grace.
    (S.QUALIFIED, E.OVERDUE_HELD): (S.QUALIFIED, {"+testing"}),
    (S.QUALIFIED, E.OVERDUE_DRAIN_DUE): (S.QUALIFIED, {"Drain"}),
    (S.SUSPECT, E.TEST_PASSED): (S.QUALIFIED, QUALIFY_EFFECTS),
    (S.SUSPECT, E.TEST_FAILED): (S.QUARANTINED, QUARANTINE_EFFECTS | {"Hardware:Quarantined"}),
    (S.SUSPECT, E.REPAIR_CYCLES_EXCEEDED): (S.RETIRED, OUT_OF_CYCLES),
    (S.SUSPECT, E.TEST_FAILED_UNCONFIRMED): (S.SUSPECT, KEEP_SUSPECT | {_confirm()}),
    (S.SUSPECT, E.CONFIRMATION_PASSED): (S.SUSPECT, KEEP_SUSPECT | {_confirm()}),
    (S.SUSPECT, E.FLAKY): (S.SUSPECT, KEEP_SUSPECT | {"BackOff:keep"}),
    (S.SUSPECT, E.QUARANTINE_HELD): (S.SUSPECT, KEEP_SUSPECT | {"HoldQuarantine"}),
    (S.SUSPECT, E.TEST_INCONCLUSIVE): (S.SUSPECT, BACK_OFF),
    (S.SUSPECT, E.RETEST_DUE): (S.SUSPECT, {"+testing", "Test:requalification/Suspect"}),
    (S.SUSPECT, E.TEST_STARTED): (S.SUSPECT, {"AdoptTest", "+testing"}),
    (S.QUARANTINED, E.OBSERVED_FAILURE): (S.SUSPECT, {"+testing", "KeepSuspicion"}),
    (S.QUARANTINED, E.REPAIR_STARTED): (S.REPAIRING, {"Ticket:InRepair"}),
    (S.QUARANTINED, E.REPLACE_DUE): (S.REPAIRING, {"Ticket:InRepair", "DeleteNode"}),
    (S.QUARANTINED, E.TICKET_RESOLVED): (S.VERIFYING, VERIFY | {"Ticket:Verifying", "ForgetTest"}),
    (S.QUARANTINED, E.TICKET_RETIRE): (S.RETIRED, RETIRE_EFFECTS | {"Hardware:seen+retire"}),
    (S.REPAIRING, E.TICKET_RESOLVED): (S.VERIFYING, VERIFY | {"Ticket:Verifying", "ForgetTest"}),
    (S.REPAIRING, E.TICKET_RETIRE): (S.RETIRED, RETIRE_EFFECTS | {"Hardware:seen+retire"}),
    (S.VERIFYING, E.VERIFICATION_PASSED): (
        S.QUALIFIED,
        RELEASE_EFFECTS | {"CloseTicket", "MarkQualified"},
    ),
    (S.VERIFYING, E.VERIFICATION_FAILED): (
        S.QUARANTINED,
        SETTLED | {"-testing if DeviceScope", "RaiseCycle", "Hardware:VerificationFailed"},
    ),
    (S.VERIFYING, E.DEVICES_RETURNED): (
        S.QUARANTINED,
        SETTLED
        | {
            "-testing if DeviceScope",
            "CloseTicket",
            "UntaintReturnedDevices if DeviceScope",
            "RaiseCycle",
            "Hardware:VerificationFailed if DevicesRefailed",
        },
    ),
    (S.VERIFYING, E.REPAIR_CYCLES_EXCEEDED): (
        S.RETIRED,
        RETIRE_EFFECTS | {"Hardware:Retired+retire"},
    ),
    (S.VERIFYING, E.TEST_INCONCLUSIVE): (S.VERIFYING, BACK_OFF),
    (S.VERIFYING, E.RETEST_DUE): (S.VERIFYING, VERIFY),
    (S.EXCLUDED, E.OPTED_IN): (S.UNQUALIFIED, {"RevokeQualification"}),
    (S.QUARANTINED, E.DRAIN_DUE): (
        S.QUARANTINED,
        {"Drain if NodeScope+Drain", "-testing if DeviceScope"},
    ),
    (S.QUARANTINED, E.DRAIN_TIMED_OUT): (S.QUARANTINED, {"EndDrain", "-testing if DeviceScope"}),
    (S.REPAIRING, E.DRAIN_DUE): (S.REPAIRING, {"Drain if NodeScope+Drain"}),
    (S.REPAIRING, E.DRAIN_TIMED_OUT): (S.REPAIRING, {"EndDrain"}),
    (S.QUARANTINED, E.DRAIN_DONE): (S.QUARANTINED, {"EndDrain", "-testing if DeviceScope"}),
    (S.REPAIRING, E.DRAIN_DONE): (S.REPAIRING, {"EndDrain"}),
}
for _state in (
    S.UNQUALIFIED,
    S.TESTING,
    S.QUALIFIED,
    S.SUSPECT,
    S.QUARANTINED,
    S.REPAIRING,
    S.VERIFYING,
    S.RETIRED,
):
    EXPECTED[(_state, E.OPTED_OUT)] = (S.EXCLUDED, RELEASE_EFFECTS | {"CancelTest"})
for _state in (S.UNQUALIFIED, S.TESTING, S.QUALIFIED, S.SUSPECT):
    EXPECTED[(_state, E.MANUAL_QUARANTINE)] = (S.QUARANTINED, QUARANTINE_EFFECTS | {"CancelTest"})
for _state in (
    S.UNQUALIFIED,
    S.TESTING,
    S.SUSPECT,
    S.QUARANTINED,
    S.REPAIRING,
    S.VERIFYING,
    S.RETIRED,
):
    EXPECTED[(_state, E.MANUAL_RELEASE)] = (
        S.QUALIFIED,
        RELEASE_EFFECTS | {"CloseTicket", "CancelTest"},
    )


def _effects(action: object) -> list[str]:
    """What a row's action does, in words; guarded ones say under which guards."""
    if isinstance(action, Only):
        when = "+".join(g.value for g in action.when)
        return [f"{e} if {when}" for inner in action.actions for e in _effects(inner)]
    effect = _effect(action)
    return [effect] if effect else []


def _flat(actions: tuple[RowAction, ...]) -> list[RowAction]:
    """A row's actions with guarded ones unwrapped."""
    out: list[RowAction] = []
    for action in actions:
        out += _flat(action.actions) if isinstance(action, Only) else [action]
    return out


def _own(row: Transition) -> tuple[RowAction, ...]:
    """A row's own actions: without its label (first) and what every row ends with."""
    tail = len(EVERY_TRANSITION) + (0 if row.target in DRAINED_STATES else 1)
    return row.actions[1:-tail]


def _effect(action: object) -> str | None:
    match action:
        case AddTaint(role=role):
            return f"+{role}"
        case RemoveTaint(role=role):
            return f"-{role}"
        case CreateTest(suite=suite, reason=reason):
            return f"Test:{suite or 'same'}/{reason}"
        case SetTicketPhase(phase=phase):
            return f"Ticket:{phase}"
        case SetAutoscalerAnnotations(on=on):
            return f"Autoscaler:{'on' if on else 'off'}"
        case BackOff(count=count):
            return f"BackOff:{'count' if count else 'keep'}"
        case RecordHardware(failure=failure, retire=retire):
            return f"Hardware:{failure or 'seen'}{'+retire' if retire else ''}"
        case CreateTicket(retired=True):
            return "CreateTicket:retired"
        case SetLabel() | EmitEvent():
            return None
        case (
            Cordon()
            | Uncordon()
            | Drain()
            | DeleteNode()
            | MarkQualified()
            | RevokeQualification()
            | CreateTicket()
            | CancelTest()
            | CloseTicket()
            | RaiseCycle()
            | UntaintDevices()
            | UntaintReturnedDevices()
            | TaintDevices()
            | OpenTicketStatus()
            | DrainDeadline()
            | Retire()
            | ForgetTest()
            | ForgetSuspicion()
            | KeepSuspicion()
            | HoldQuarantine()
            | AdoptTest()
            | EndDrain()
        ):
            return type(action).__name__
    raise AssertionError(f"unexpected action {action!r}")


def test_table_is_exactly_the_expected_rows() -> None:
    assert len(TABLE) == len(TRANSITIONS), "duplicate (state, event) rows"
    assert set(TABLE) == set(EXPECTED)


@pytest.mark.parametrize(("source", "event"), sorted(EXPECTED), ids=lambda v: str(v))
def test_row(source: NodeState, event: Event) -> None:
    target, effects = EXPECTED[(source, event)]
    row = transition(source, event)
    assert row.target == target
    assert {e for a in _own(row) for e in _effects(a)} == effects
    assert row.actions[0] == SetLabel(target), "the label first (bound only if it changes)"
    ends_drain = () if target in DRAINED_STATES else (EndDrain(),)
    tail = (*EVERY_TRANSITION[:3], *ends_drain, *EVERY_TRANSITION[3:])
    assert row.actions[len(row.actions) - len(tail) :] == tail, "what every row ends with"
    events = [a for a in row.actions if isinstance(a, EmitEvent)]
    if target != source and source != S.EXCLUDED:
        assert events or event in (E.TEST_STARTED, E.CONFIRMATION_PASSED), "tell the user"


@pytest.mark.parametrize("row", TRANSITIONS, ids=lambda r: f"{r.source}-{r.event}")
def test_a_row_forgets_its_test_before_it_remembers_anything_new(row: Transition) -> None:
    """The binder applies a row's bookkeeping in order and the later write wins: the
    test is forgotten first, then a new test, a back-off or a suspicion is recorded."""
    kinds = [type(a) for a in _flat(row.actions)]
    if ForgetTest in kinds:
        later = (CreateTest, BackOff, KeepSuspicion, HoldQuarantine, AdoptTest)
        assert all(kinds.index(ForgetTest) < i for i, k in enumerate(kinds) if k in later)
    assert not (ForgetSuspicion in kinds and KeepSuspicion in kinds), "settle or keep"
    assert not (AdoptTest in kinds and ForgetTest in kinds)


UNLISTED = [
    (state, event)
    for state, event in itertools.product(NodeState, Event)
    if (state, event) not in EXPECTED
]


@pytest.mark.parametrize(("state", "event"), UNLISTED, ids=lambda v: str(v))
def test_everything_else_is_illegal(state: NodeState, event: Event) -> None:
    with pytest.raises(IllegalTransition) as info:
        transition(state, event)
    assert info.value.state == state and info.value.event == event
    assert str(state) in str(info.value)


def test_quarantine_never_removes_the_quarantine_taint_and_release_never_adds_one() -> None:
    for row in TRANSITIONS:
        adds = {a.role for a in _flat(row.actions) if isinstance(a, AddTaint)}
        removes = {a.role for a in _flat(row.actions) if isinstance(a, RemoveTaint)}
        assert not adds & removes, row
        if row.target in (S.QUARANTINED, S.RETIRED) and row.source not in (
            S.QUARANTINED,
            S.REPAIRING,
            S.VERIFYING,
        ):
            assert QUARANTINE in adds or row.target == S.RETIRED, row
        if row.target == S.QUALIFIED and row.event != E.OVERDUE_HELD:
            # The one exception: an overdue node is reserved for its coming screening,
            # as a held suspect is (the re-screen that follows removes the taint).
            assert not adds, row


def test_every_state_but_excluded_can_opt_out() -> None:
    for state in NodeState:
        if state != S.EXCLUDED:
            assert transition(state, E.OPTED_OUT).target == S.EXCLUDED


def test_confirmation_reruns_use_the_suite_of_the_failed_test() -> None:
    rerun = next(
        a
        for a in TABLE[(S.TESTING, E.TEST_FAILED_UNCONFIRMED)].actions
        if isinstance(a, CreateTest)
    )
    assert rerun.suite is None and rerun.reason == ScreeningReason.CONFIRMATION
    verify = next(
        a for a in TABLE[(S.QUARANTINED, E.TICKET_RESOLVED)].actions if isinstance(a, CreateTest)
    )
    assert verify.suite == Suite.REPAIR_VERIFICATION
    phase = next(
        a
        for a in TABLE[(S.QUARANTINED, E.TICKET_RESOLVED)].actions
        if isinstance(a, SetTicketPhase)
    )
    assert phase.phase == TicketPhase.VERIFYING
