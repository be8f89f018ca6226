"""The node lifecycle: states, events, actions, and the one table of allowed transitions.

::

    Unqualified ──Joined──▶ Testing ──TestPassed──▶ Qualified ──IdleDue, ExpiryDue──▶ Testing
    Qualified ──OverdueHeld, OverdueDrainDue──▶ Qualified  (overdue.action Drain: hold, drain)
    Testing ──AcceptanceInconclusive──▶ Unqualified     (never qualified: still gated)
    Testing ──TestCancelled, AcceptanceCancelled──▶ Qualified, Unqualified  (a policy
                                                        change: no result, no back-off)
    Testing ──TestInconclusive──▶ Qualified             (released, screened again later)
    Testing ──TestFailedUnconfirmed, QuarantineHeld──▶ Suspect ◀──Suspected── Qualified
    Suspect ──(re-runs, Flaky, RetestDue)──▶ Suspect ──TestPassed──▶ Qualified
    Testing, Suspect ──TestFailed──▶ Quarantined ──RepairStarted, ReplaceDue──▶ Repairing
    Quarantined, Repairing ──TicketResolved──▶ Verifying ──VerificationPassed──▶ Qualified
    Verifying ──VerificationFailed──▶ Quarantined       (repair cycle + 1)
    Verifying ──DevicesReturned──▶ Quarantined          (scope Device: the devices that
                                                        passed return, the others stay out)
    Quarantined, Repairing ──TicketRetire──▶ Retired ◀──RepairCyclesExceeded── Verifying
    Testing, Suspect ──RepairCyclesExceeded──▶ Retired  (the hardware used up its cycles)
    Unqualified ──Rejoined──▶ Testing (repair verification) ; ──HardwareRetired──▶ Retired
    any state ──OptedOut──▶ Excluded ──OptedIn──▶ Unqualified
    (most states) ──ManualQuarantine──▶ Quarantined, ──ManualRelease──▶ Qualified

A row is the whole transition. It names taints by role (gate, testing, quarantine) and
tests and tickets without names; the binder (``domain.binding``) fills in the policy's
keys, the node, and the objects involved, and nothing is added or changed after it.
What depends on the quarantine's scope or on a setting is data in the row: actions
under a :class:`Guard` (``Only``) happen only where it holds (scope Node or Device,
``cordon``, ``drain``, ``holdSuspects``, the repair strategy, the retire action). A
row also says what the node remembers afterwards (its bookkeeping: forget the test,
keep or settle the suspicion, back off, hold a quarantine; see ``BOOKKEEPING``), and
every row ends with what every transition does (``EVERY_TRANSITION``). A (state,
event) pair that is not a row raises :class:`IllegalTransition`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sdcguard.api import FailureKind, ScreeningReason, Suite, TicketPhase
from sdcguard.domain.actions import (
    BOOKKEEPING,
    HISTORY_MESSAGE_CHARS,
    NODE_MUTATIONS,
    OBSERVE_SUPPRESSED,
    TICKET_ACTIONS,
    AcknowledgedIntoRepair,
    Action,
    AddTaint,
    AdoptTest,
    Annotate,
    BackOff,
    CancelTest,
    CloseTicket,
    Cordon,
    CorrectLabel,
    CreateTest,
    CreateTicket,
    DeleteNode,
    Drain,
    DrainDeadline,
    EmitEvent,
    EndDrain,
    EnterState,
    ForgetSuspicion,
    ForgetTest,
    Guard,
    HoldQuarantine,
    KeepDeviceRules,
    KeepSuspicion,
    LeaveTest,
    MarkQualified,
    NoteHistory,
    Only,
    OpenTicketStatus,
    RaiseCycle,
    RecordHardware,
    RecordWait,
    RemoveTaint,
    Retire,
    RevokeQualification,
    RowAction,
    SetAutoscalerAnnotations,
    SetLabel,
    SetTicketPhase,
    TaintDevices,
    TaintRole,
    Template,
    Uncordon,
    UntaintDevices,
    UntaintReturnedDevices,
    history_note,
    parse_history_note,
)
from sdcguard.domain.states import Event, NodeState

__all__ = [
    "BOOKKEEPING",
    "DRAINED_STATES",
    "EVERY_TRANSITION",
    "HISTORY_MESSAGE_CHARS",
    "NODE_MUTATIONS",
    "OBSERVE_SUPPRESSED",
    "TABLE",
    "TICKET_ACTIONS",
    "TRANSITIONS",
    "AcknowledgedIntoRepair",
    "Action",
    "AddTaint",
    "AdoptTest",
    "Annotate",
    "BackOff",
    "CancelTest",
    "CloseTicket",
    "Cordon",
    "CorrectLabel",
    "CreateTest",
    "CreateTicket",
    "DeleteNode",
    "Drain",
    "DrainDeadline",
    "EmitEvent",
    "EndDrain",
    "EnterState",
    "Event",
    "ForgetSuspicion",
    "ForgetTest",
    "Guard",
    "HoldQuarantine",
    "IllegalTransition",
    "KeepDeviceRules",
    "KeepSuspicion",
    "LeaveTest",
    "MarkQualified",
    "NodeState",
    "NoteHistory",
    "Only",
    "OpenTicketStatus",
    "RaiseCycle",
    "RecordHardware",
    "RecordWait",
    "RemoveTaint",
    "Retire",
    "RevokeQualification",
    "RowAction",
    "SetAutoscalerAnnotations",
    "SetLabel",
    "SetTicketPhase",
    "TaintDevices",
    "TaintRole",
    "Template",
    "Transition",
    "Uncordon",
    "UntaintDevices",
    "UntaintReturnedDevices",
    "history_note",
    "parse_history_note",
    "transition",
]


@dataclass(frozen=True)
class Transition:
    """One row of the table."""

    source: NodeState
    event: Event
    target: NodeState
    actions: tuple[RowAction, ...]


class IllegalTransition(Exception):
    """``event`` is not allowed in ``state``: a bug, surfaced as a condition and a metric."""

    def __init__(self, state: NodeState, event: Event) -> None:
        super().__init__(f"no transition from {state} on {event}")
        self.state = state
        self.event = event


S = NodeState
E = Event
G = Guard
GATE, TESTING, QUARANTINE = TaintRole.GATE, TaintRole.TESTING, TaintRole.QUARANTINE

DRAINED_STATES = frozenset({S.QUARANTINED, S.REPAIRING})
"""The states a quarantine drain may go on in; every other state ends it."""
EVERY_TRANSITION: tuple[RowAction, ...] = (
    RecordWait(),
    CorrectLabel(),
    EnterState(),
    LeaveTest(),
    NoteHistory(),
)
"""What every row does last: it ends a wait, corrects a hand-written label, remembers
since when the node is in its state, leaves an unanswered test behind, and notes the
hardware history it writes after its node patch."""


def _row(source: NodeState, event: Event, target: NodeState, *actions: RowAction) -> Transition:
    """A row: the state label first (written when it changes, or is wrong), then the
    row's own actions, then what every transition does (``EVERY_TRANSITION``; a drain
    ends outside the quarantine states)."""
    ends_drain = (EndDrain(),) if target not in DRAINED_STATES else ()
    tail = (*EVERY_TRANSITION[:3], *ends_drain, *EVERY_TRANSITION[3:])
    return Transition(source, event, target, (SetLabel(target), *actions, *tail))


def _if(*when: Guard) -> _Guarded:
    return _Guarded(when)


@dataclass(frozen=True)
class _Guarded:
    when: tuple[Guard, ...]

    def __call__(self, *actions: RowAction) -> Only:
        return Only(self.when, actions)


QUARANTINE_TAINT: tuple[RowAction, ...] = (
    _if(G.NODE_SCOPE)(AddTaint(QUARANTINE)),
    _if(G.DEVICE_SCOPE)(TaintDevices()),
)
"""The quarantine: the node's taint, or with scope Device the failed devices' rules."""
QUARANTINE_UNTAINT: tuple[RowAction, ...] = (
    _if(G.NODE_SCOPE)(RemoveTaint(QUARANTINE)),
    _if(G.DEVICE_SCOPE)(UntaintDevices()),
)
RETIRE_CORDON = _if(G.RETIRE_BY_CORDON)(Cordon())
RETIRE: tuple[RowAction, ...] = (Retire(), _if(G.RETIRE_BY_DELETE)(DeleteNode()))
"""Retire the ticket, and with retireAction Delete the Node (deleted last, see plan)."""
OPEN_TICKET = (CreateTicket(), OpenTicketStatus())

SETTLED: tuple[RowAction, ...] = (ForgetTest(), ForgetSuspicion())
"""The node's fate is decided: its test and its suspicion are done with."""
KEEP_SUSPECT: tuple[RowAction, ...] = (ForgetTest(), KeepSuspicion())
"""The test is done with, the suspicion is not."""

QUARANTINE_ACTIONS: tuple[RowAction, ...] = (
    *SETTLED,
    RemoveTaint(TESTING),
    *QUARANTINE_TAINT,
    _if(G.NODE_SCOPE, G.CORDON)(Cordon()),
    _if(G.NODE_SCOPE, G.DRAIN)(Drain(), DrainDeadline()),
    RevokeQualification(),
    *OPEN_TICKET,
    _if(G.IN_PLACE)(SetAutoscalerAnnotations(on=True)),
)
RELEASE_ACTIONS: tuple[RowAction, ...] = (
    *SETTLED,
    RemoveTaint(GATE),
    RemoveTaint(TESTING),
    *QUARANTINE_UNTAINT,
    Uncordon(),
    SetAutoscalerAnnotations(on=False),
)
QUALIFY_ACTIONS: tuple[RowAction, ...] = (
    *SETTLED,
    RemoveTaint(GATE),
    RemoveTaint(TESTING),
    MarkQualified(),
    EmitEvent("Qualified", "{node} passed its screening: {detail}", routine=True),
)
RETIRE_ACTIONS: tuple[RowAction, ...] = (
    *SETTLED,
    RETIRE_CORDON,
    *RETIRE,
    EmitEvent("Retired", "{node} is retired: {detail}", warning=True),
)
CONFIRM = CreateTest(None, ScreeningReason.CONFIRMATION)
VERIFY = CreateTest(Suite.REPAIR_VERIFICATION, ScreeningReason.REPAIR_VERIFICATION)
VERIFY_IN_PLACE: tuple[RowAction, ...] = (VERIFY, _if(G.DEVICE_SCOPE)(AddTaint(TESTING)))
"""Verify a repair. Scope Device left the node serving: reserve it, so the probe gets
every device (the failed ones included) once the workloads on the others end."""


CONFIRMED_FAILURE: tuple[RowAction, ...] = (
    *QUARANTINE_ACTIONS,
    RecordHardware(FailureKind.QUARANTINED),
    EmitEvent("Quarantined", "{node} quarantined: {detail}", warning=True),
)
OUT_OF_CYCLES: tuple[RowAction, ...] = (
    *SETTLED,
    RemoveTaint(TESTING),
    *QUARANTINE_TAINT,
    RETIRE_CORDON,
    RevokeQualification(),
    CreateTicket(retired=True),
    OpenTicketStatus(),
    RecordHardware(FailureKind.RETIRED, retire=True),
    *RETIRE,
    EmitEvent("Retired", "{node} is retired: {detail}", warning=True),
)
"""A confirmed failure of hardware with no repair cycle left: the ticket that records it
is born Retired, and the node never serves again."""
RERUN: tuple[RowAction, ...] = (
    *KEEP_SUSPECT,
    CONFIRM,
    EmitEvent("SDCSuspected", "{node}: {detail}; re-running to confirm", warning=True),
)


def _resolution(source: NodeState) -> list[Transition]:
    """The repair side answered: verify the repair, or retire the node."""
    return [
        _row(
            source,
            E.TICKET_RESOLVED,
            S.VERIFYING,
            SetTicketPhase(TicketPhase.VERIFYING),
            ForgetTest(),
            *VERIFY_IN_PLACE,
            EmitEvent("Verifying", "{node}: {detail}"),
        ),
        _row(
            source,
            E.TICKET_RETIRE,
            S.RETIRED,
            *RETIRE_ACTIONS[:-1],
            RecordHardware(retire=True),
            RETIRE_ACTIONS[-1],
        ),
    ]


def _draining(source: NodeState) -> list[Transition]:
    """Evictions a PodDisruptionBudget refused: again, until the drain's time runs out;
    once every pod was asked to leave, the drain's deadline goes (a later pass's plan).
    Scope Device: a quarantined node serves with its other devices, so a reservation of
    ours goes (it is reserved only to verify)."""
    serving = (_if(G.DEVICE_SCOPE)(RemoveTaint(TESTING)),) if source == S.QUARANTINED else ()
    return [
        _row(source, E.DRAIN_DUE, source, _if(G.NODE_SCOPE, G.DRAIN)(Drain()), *serving),
        _row(source, E.DRAIN_DONE, source, EndDrain(), *serving),
        _row(
            source,
            E.DRAIN_TIMED_OUT,
            source,
            EndDrain(),
            *serving,
            EmitEvent("DrainIncomplete", "{node}: {detail}", warning=True),
        ),
    ]


def _manual(
    source: NodeState, *, quarantine: bool = True, release: bool = True
) -> list[Transition]:
    rows = [
        _row(
            source,
            E.OPTED_OUT,
            S.EXCLUDED,
            CancelTest(),
            *RELEASE_ACTIONS,
            EmitEvent("Excluded", "{node} opted out (sdcguard.dev/exclude=true): {detail}"),
        )
    ]
    if quarantine:
        rows.append(
            _row(
                source,
                E.MANUAL_QUARANTINE,
                S.QUARANTINED,
                CancelTest(),
                *QUARANTINE_ACTIONS,
                EmitEvent("Quarantined", "{node} quarantined by request: {detail}", warning=True),
            )
        )
    if release:
        rows.append(
            _row(
                source,
                E.MANUAL_RELEASE,
                S.QUALIFIED,
                CancelTest(),
                *RELEASE_ACTIONS,
                CloseTicket(),
                EmitEvent("Released", "{node} released by request: {detail}"),
            )
        )
    return rows


TRANSITIONS: tuple[Transition, ...] = (
    # Joining: gated until the acceptance suite passes.
    _row(
        S.UNQUALIFIED,
        E.JOINED,
        S.TESTING,
        AddTaint(GATE),
        AddTaint(TESTING),
        CreateTest(Suite.ACCEPTANCE, ScreeningReason.JOIN),
        EmitEvent("TestStarted", "{node}: acceptance test {detail}", routine=True),
    ),
    _row(
        S.UNQUALIFIED,
        E.REJOINED,
        S.TESTING,
        AddTaint(GATE),
        AddTaint(TESTING),
        CreateTest(Suite.REPAIR_VERIFICATION, ScreeningReason.JOIN),
        RecordHardware(),
        EmitEvent(
            "HardwareRecognised",
            "{node}: {detail}; it joins through the repair-verification suite",
            warning=True,
        ),
    ),
    _row(
        S.UNQUALIFIED,
        E.HARDWARE_RETIRED,
        S.RETIRED,
        *SETTLED,
        *QUARANTINE_TAINT,
        RETIRE_CORDON,
        RecordHardware(),
        *RETIRE,
        EmitEvent("Retired", "{node} is retired: {detail}", warning=True),
    ),
    _row(
        S.UNQUALIFIED,
        E.ADMITTED,
        S.QUALIFIED,
        RemoveTaint(GATE),
        EmitEvent("Admitted", "{node} admitted without acceptance ({detail}); screened when idle"),
    ),
    # A node that joined without the gate can take work in the moment before sdcguard
    # gates it (its copy of the Pods had not seen the binding yet): the acceptance test
    # whose probe cannot start beside that work yields, and the node is admitted as if
    # sdcguard had seen the work first.
    _row(
        S.TESTING,
        E.ADMITTED,
        S.QUALIFIED,
        CancelTest(),
        RemoveTaint(TESTING),
        RemoveTaint(GATE),
        EmitEvent("Admitted", "{node} admitted without acceptance ({detail}); screened when idle"),
    ),
    # Adopting a test started elsewhere (or one created just before a crash) adopts the
    # registration gate too, so the pass that qualifies the node can remove it.
    _row(S.UNQUALIFIED, E.TEST_STARTED, S.TESTING, AdoptTest(), AddTaint(GATE), AddTaint(TESTING)),
    *_manual(S.UNQUALIFIED),
    # Testing: the outcome decides.
    _row(S.TESTING, E.TEST_PASSED, S.QUALIFIED, *QUALIFY_ACTIONS),
    _row(S.TESTING, E.TEST_FAILED_UNCONFIRMED, S.SUSPECT, *RERUN),
    _row(S.TESTING, E.TEST_FAILED, S.QUARANTINED, *CONFIRMED_FAILURE),
    _row(S.TESTING, E.REPAIR_CYCLES_EXCEEDED, S.RETIRED, *OUT_OF_CYCLES),
    _row(
        S.TESTING,
        E.QUARANTINE_HELD,
        S.SUSPECT,
        *KEEP_SUSPECT,
        HoldQuarantine(),
        EmitEvent("QuarantineHeld", "{node}: {detail}", warning=True),
    ),
    _row(
        S.TESTING,
        E.TEST_INCONCLUSIVE,
        S.QUALIFIED,
        ForgetTest(),
        BackOff(),
        RemoveTaint(TESTING),
        EmitEvent("Inconclusive", "{node}: {detail}; released, screened again later"),
    ),
    _row(
        S.TESTING,
        E.ACCEPTANCE_INCONCLUSIVE,
        S.UNQUALIFIED,
        ForgetTest(),
        BackOff(),
        RemoveTaint(TESTING),
        EmitEvent("Inconclusive", "{node}: {detail}; not yet qualified, screened again later"),
    ),
    # A policy change is no result: the node is released without a back-off, and its
    # (new) owner screens it as its triggers and budgets allow.
    _row(
        S.TESTING,
        E.TEST_CANCELLED,
        S.QUALIFIED,
        ForgetTest(),
        RemoveTaint(TESTING),
        EmitEvent("TestCancelled", "{node}: {detail}; no result and no back-off"),
    ),
    _row(
        S.TESTING,
        E.ACCEPTANCE_CANCELLED,
        S.UNQUALIFIED,
        ForgetTest(),
        RemoveTaint(TESTING),
        EmitEvent(
            "TestCancelled",
            "{node}: {detail}; no result and no back-off: not yet qualified, screened "
            "as soon as the budgets allow (now: kubectl sdc test {node})",
        ),
    ),
    *_manual(S.TESTING),
    # Qualified: screened again after use, on expiry, or when suspected.
    _row(
        S.QUALIFIED,
        E.IDLE_DUE,
        S.TESTING,
        AddTaint(TESTING),
        CreateTest(Suite.REQUALIFICATION, ScreeningReason.RETURN_FROM_USE),
        EmitEvent("TestStarted", "{node} returned from use: {detail}", routine=True),
    ),
    _row(
        S.QUALIFIED,
        E.EXPIRY_DUE,
        S.TESTING,
        AddTaint(TESTING),
        CreateTest(Suite.REQUALIFICATION, ScreeningReason.EXPIRY),
        EmitEvent("TestStarted", "{node}'s qualification expired: {detail}", routine=True),
    ),
    # Overdue, with triggers.overdue.action Drain: hold (no new work lands), then drain
    # once the grace period is over; the expiry screening starts when the node is idle.
    _row(
        S.QUALIFIED,
        E.OVERDUE_HELD,
        S.QUALIFIED,
        AddTaint(TESTING),
        EmitEvent(
            "QualificationOverdue", "{node}: {detail}; no new work until re-screened", warning=True
        ),
    ),
    _row(S.QUALIFIED, E.OVERDUE_DRAIN_DUE, S.QUALIFIED, Drain()),
    _row(S.QUALIFIED, E.TEST_STARTED, S.TESTING, AdoptTest(), AddTaint(TESTING)),
    _row(
        S.QUALIFIED,
        E.SUSPECTED,
        S.SUSPECT,
        # Held (triggers.holdSuspects): no new work until the re-test clears it.
        _if(G.HOLD_SUSPECTS)(AddTaint(TESTING)),
        EmitEvent("Suspected", "{node} reported suspect: {detail}", warning=True),
    ),
    *_manual(S.QUALIFIED, release=False),
    # Suspect: confirm, clear, or keep holding.
    _row(
        S.SUSPECT,
        E.TEST_PASSED,
        S.QUALIFIED,
        *QUALIFY_ACTIONS[:-1],
        EmitEvent("Cleared", "{node} passed the re-test of its suspicion: {detail}"),
    ),
    _row(S.SUSPECT, E.TEST_FAILED, S.QUARANTINED, *CONFIRMED_FAILURE),
    _row(S.SUSPECT, E.REPAIR_CYCLES_EXCEEDED, S.RETIRED, *OUT_OF_CYCLES),
    _row(S.SUSPECT, E.TEST_FAILED_UNCONFIRMED, S.SUSPECT, *RERUN),
    _row(S.SUSPECT, E.CONFIRMATION_PASSED, S.SUSPECT, *KEEP_SUSPECT, CONFIRM),
    _row(
        S.SUSPECT,
        E.FLAKY,
        S.SUSPECT,
        *KEEP_SUSPECT,
        BackOff(count=False),
        EmitEvent("Flaky", "{node}: {detail}; held and screened again later", warning=True),
    ),
    _row(
        S.SUSPECT,
        E.QUARANTINE_HELD,
        S.SUSPECT,
        *KEEP_SUSPECT,
        HoldQuarantine(),
        EmitEvent("QuarantineHeld", "{node}: {detail}", warning=True),
    ),
    _row(
        S.SUSPECT,
        E.TEST_INCONCLUSIVE,
        S.SUSPECT,
        ForgetTest(),
        BackOff(),
        EmitEvent("Inconclusive", "{node}: {detail}; screened again later"),
    ),
    _row(
        S.SUSPECT,
        E.RETEST_DUE,
        S.SUSPECT,
        AddTaint(TESTING),
        CreateTest(Suite.REQUALIFICATION, ScreeningReason.SUSPECT),
        EmitEvent("TestStarted", "{node} is suspect: {detail}"),
    ),
    _row(S.SUSPECT, E.TEST_STARTED, S.SUSPECT, AdoptTest(), AddTaint(TESTING)),
    *_manual(S.SUSPECT),
    # Quarantined by Observe mode (no ticket, no taint): Enforce confirms before acting.
    _row(
        S.QUARANTINED,
        E.OBSERVED_FAILURE,
        S.SUSPECT,
        AddTaint(TESTING),
        KeepSuspicion(),
        EmitEvent(
            "ObservedFailure",
            "{node}: {detail}; held and re-tested before any quarantine",
            warning=True,
        ),
    ),
    # Quarantined and repairing: the ticket drives.
    _row(
        S.QUARANTINED,
        E.REPAIR_STARTED,
        S.REPAIRING,
        SetTicketPhase(TicketPhase.IN_REPAIR),
        EmitEvent("RepairStarted", "{node}: {detail}"),
    ),
    _row(
        S.QUARANTINED,
        E.REPLACE_DUE,
        S.REPAIRING,
        SetTicketPhase(TicketPhase.IN_REPAIR),
        DeleteNode(),
        EmitEvent("Replacing", "{node} is deleted for replacement: {detail}"),
    ),
    *_resolution(S.QUARANTINED),
    *_manual(S.QUARANTINED, quarantine=False),
    *_draining(S.QUARANTINED),
    *_resolution(S.REPAIRING),
    *_manual(S.REPAIRING, quarantine=False),
    *_draining(S.REPAIRING),
    # Verifying: the stricter suite decides whether the repair worked.
    _row(
        S.VERIFYING,
        E.VERIFICATION_PASSED,
        S.QUALIFIED,
        *RELEASE_ACTIONS,
        CloseTicket(),
        MarkQualified(),
        EmitEvent("Qualified", "{node} passed repair verification: {detail}"),
    ),
    _row(
        S.VERIFYING,
        E.VERIFICATION_FAILED,
        S.QUARANTINED,
        *SETTLED,
        # Scope Device: the devices stay tainted, the node serves again.
        _if(G.DEVICE_SCOPE)(RemoveTaint(TESTING)),
        RaiseCycle(),
        RecordHardware(FailureKind.VERIFICATION_FAILED),
        EmitEvent("RepairFailed", "{node} failed repair verification: {detail}", warning=True),
    ),
    _row(
        S.VERIFYING,
        E.DEVICES_RETURNED,
        S.QUARANTINED,
        *SETTLED,
        _if(G.DEVICE_SCOPE)(RemoveTaint(TESTING)),
        CloseTicket(),
        _if(G.DEVICE_SCOPE)(UntaintReturnedDevices()),
        RaiseCycle(),
        _if(G.DEVICES_REFAILED)(RecordHardware(FailureKind.VERIFICATION_FAILED)),
        EmitEvent("DevicesReturned", "{node}: {detail}"),
    ),
    _row(
        S.VERIFYING,
        E.REPAIR_CYCLES_EXCEEDED,
        S.RETIRED,
        *RETIRE_ACTIONS[:-1],
        RecordHardware(FailureKind.RETIRED, retire=True),
        RETIRE_ACTIONS[-1],
    ),
    _row(
        S.VERIFYING,
        E.TEST_INCONCLUSIVE,
        S.VERIFYING,
        ForgetTest(),
        BackOff(),
        EmitEvent("Inconclusive", "{node}: {detail}; verification runs again later"),
    ),
    _row(S.VERIFYING, E.RETEST_DUE, S.VERIFYING, *VERIFY_IN_PLACE),
    *_manual(S.VERIFYING, quarantine=False),
    # Retired and excluded: only a person brings them back.
    *_manual(S.RETIRED, quarantine=False),
    _row(
        S.EXCLUDED,
        E.OPTED_IN,
        S.UNQUALIFIED,
        RevokeQualification(),
        EmitEvent("OptedIn", "{node} opted in again: unqualified until it passes acceptance"),
    ),
)

TABLE: Mapping[tuple[NodeState, Event], Transition] = {(t.source, t.event): t for t in TRANSITIONS}


def transition(state: NodeState, event: Event) -> Transition:
    """The row for ``event`` in ``state``; raises :class:`IllegalTransition` if there is none."""
    row = TABLE.get((state, event))
    if row is None:
        raise IllegalTransition(state, event)
    return row
