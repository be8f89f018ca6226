"""The node lifecycle: states, events, actions, and the one table of allowed transitions.

::

    Unqualified ──Joined──▶ Testing ──TestPassed──▶ Qualified ──IdleDue, ExpiryDue──▶ Testing
    Testing ──AcceptanceInconclusive──▶ Unqualified     (never qualified: still gated)
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

Rows name taints by role (gate, testing, quarantine) and tests and tickets without
names; ``decide`` binds them to the policy's keys, the node, and the objects
involved. A row also says what the node remembers afterwards (its bookkeeping:
forget the test, keep or settle the suspicion, back off, hold a quarantine; see
``BOOKKEEPING``), so one row tells all a (state, event) pair does. A (state, event)
pair that is not a row raises :class:`IllegalTransition`.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from sdcguard.api import FailureKind, QuarantineRecord, ScreeningReason, Suite, TicketPhase
from sdcguard.domain import keys
from sdcguard.domain.devicetaints import SliceDevice


class NodeState(StrEnum):
    """A node's place in the lifecycle; the value is the ``sdcguard.dev/state`` label."""

    UNQUALIFIED = "Unqualified"
    TESTING = "Testing"
    QUALIFIED = "Qualified"
    SUSPECT = "Suspect"
    QUARANTINED = "Quarantined"
    REPAIRING = "Repairing"
    VERIFYING = "Verifying"
    RETIRED = "Retired"
    EXCLUDED = "Excluded"


class Event(StrEnum):
    """What happened to a node, as ``decide`` reads it from the observations."""

    JOINED = "Joined"
    """A gated node can take its acceptance test now."""
    REJOINED = "Rejoined"
    """A gated node whose hardware failed before (under this or another Node name) can
    take its test: the repair-verification suite, not plain acceptance."""
    HARDWARE_RETIRED = "HardwareRetired"
    """A node joined with hardware that was retired before: retired at once."""
    ADMITTED = "Admitted"
    """A node is admitted without acceptance: triggers.onJoin is off, or it already ran
    workloads when sdcguard first saw it. It is screened in its first idle window."""
    TEST_STARTED = "TestStarted"
    """Someone else started a test on the node (kubectl sdc test): adopt it."""
    TEST_PASSED = "TestPassed"
    TEST_FAILED = "TestFailed"
    """A confirmed SDC verdict (or the first one, when no re-runs are configured)."""
    TEST_FAILED_UNCONFIRMED = "TestFailedUnconfirmed"
    """An SDC verdict that a re-run must confirm before quarantine."""
    CONFIRMATION_PASSED = "ConfirmationPassed"
    """A confirmation re-run passed and more re-runs are configured."""
    FLAKY = "Flaky"
    """Every confirmation re-run passed after an SDC verdict: still suspect."""
    QUARANTINE_HELD = "QuarantineHeld"
    """A confirmed failure while the circuit breaker is open."""
    TEST_INCONCLUSIVE = "TestInconclusive"
    ACCEPTANCE_INCONCLUSIVE = "AcceptanceInconclusive"
    """A never-qualified node's test was inconclusive: back to the gate."""
    IDLE_DUE = "IdleDue"
    EXPIRY_DUE = "ExpiryDue"
    SUSPECTED = "Suspected"
    RETEST_DUE = "RetestDue"
    REPAIR_STARTED = "RepairStarted"
    REPLACE_DUE = "ReplaceDue"
    TICKET_RESOLVED = "TicketResolved"
    """The ticket's resolution is Repaired, Replaced or FalseAlarm."""
    TICKET_RETIRE = "TicketRetire"
    """The ticket's resolution is Retire."""
    VERIFICATION_PASSED = "VerificationPassed"
    VERIFICATION_FAILED = "VerificationFailed"
    DEVICES_RETURNED = "DevicesReturned"
    """Scope Device: the verification returned some of the node's quarantined devices
    (their tickets close, their rules go); others stay out (not yet repaired, or failed
    again: their tickets' cycle is raised)."""
    REPAIR_CYCLES_EXCEEDED = "RepairCyclesExceeded"
    """A confirmed failure (of a test or a repair's verification) found the hardware's
    repair cycles within the policy's window used up."""
    OPTED_OUT = "OptedOut"
    OPTED_IN = "OptedIn"
    MANUAL_QUARANTINE = "ManualQuarantine"
    MANUAL_RELEASE = "ManualRelease"
    DRAIN_DUE = "DrainDue"
    """A quarantine drain left pods that a PodDisruptionBudget kept: evict them again."""
    DRAIN_TIMED_OUT = "DrainTimedOut"
    """The drain's time (spec.quarantine.drainTimeoutSeconds) ran out with pods left."""


class TaintRole(StrEnum):
    """Which of the policy's three taint keys an action means."""

    GATE = "gate"
    TESTING = "testing"
    QUARANTINE = "quarantine"


# Actions: what the adapters apply. Fields left empty in the table are bound by decide().


@dataclass(frozen=True)
class AddTaint:
    """Add a taint and record it as ours (``sdcguard.dev/owned-taints``).

    A gate taint already on the node (put there at registration) is adopted: it
    exists for sdcguard to remove.
    """

    role: TaintRole
    key: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True)
class RemoveTaint:
    """Remove a taint, only if it is recorded as ours (or, with ``registered``, the gate
    taint a node registered with: it exists only for sdcguard to remove)."""

    role: TaintRole
    key: str = ""
    registered: bool = False


@dataclass(frozen=True)
class Cordon:
    """Mark the node unschedulable and record that we did (``sdcguard.dev/cordoned-by-us``)."""


@dataclass(frozen=True)
class Uncordon:
    """Mark the node schedulable again; only ever emitted when we cordoned it."""


@dataclass(frozen=True)
class Drain:
    """Evict the node's pods (respecting PodDisruptionBudgets); only when the policy says so.

    Applied after the node patch (the quarantine taint and cordon are on before any pod
    is asked to leave, so evicted pods cannot land on the node again). Evictions that a
    PodDisruptionBudget refuses are retried (``DrainDue``) until
    ``sdcguard.dev/drain-until``."""


@dataclass(frozen=True)
class SetLabel:
    """Set the ``sdcguard.dev/state`` label."""

    state: NodeState


@dataclass(frozen=True)
class Annotate:
    """Set (or, with None, remove) sdcguard's bookkeeping annotations on the node."""

    changes: tuple[tuple[str, str | None], ...]


@dataclass(frozen=True)
class MarkQualified:
    """Record the qualification time and the fingerprint it was earned under."""

    at: dt.datetime | None = None
    fingerprint: str = ""


@dataclass(frozen=True)
class RevokeQualification:
    """Forget the qualification: a released node is screened again in its next idle window."""


@dataclass(frozen=True)
class SetAutoscalerAnnotations:
    """Ask Cluster Autoscaler and Karpenter to keep (on) or stop keeping (off) the node.

    Off removes only the annotations sdcguard set.
    """

    on: bool


@dataclass(frozen=True)
class TaintDevices:
    """Quarantine scope Device: write one DeviceTaintRule per failed device (instead of
    the quarantine taint and cordon), marked as sdcguard's and naming the ticket."""

    ticket: str = ""
    devices: tuple[SliceDevice, ...] = ()
    reason: str = ""
    effect: str = "NoSchedule"
    tickets: tuple[str, ...] = ()
    """Each device's own ticket, in ``devices``' order (empty: all are ``ticket``'s)."""

    def ticket_of(self, index: int) -> str:
        """The ticket the rule of ``devices[index]`` names."""
        return self.tickets[index] if index < len(self.tickets) else self.ticket


@dataclass(frozen=True)
class UntaintDevices:
    """Delete DeviceTaintRules sdcguard wrote for the node (only those): the rules of
    ``devices``, or with none named every rule of ours on the node."""

    ticket: str = ""
    devices: tuple[SliceDevice, ...] = ()


@dataclass(frozen=True)
class DeleteNode:
    """Delete the Node (replace strategy, or retirement by deletion)."""


@dataclass(frozen=True)
class CreateTest:
    """Create an SDCTest. ``suite`` None: the suite of the test whose outcome led here."""

    suite: Suite | None
    reason: ScreeningReason
    name: str = ""
    attempt: int = 1
    ticket: str | None = None


@dataclass(frozen=True)
class CancelTest:
    """End the node's running SDCTest as Cancelled and delete its probe Job: a person
    decided the node's fate, so the test's outcome no longer counts (and a test left
    running would be adopted again, undoing the decision)."""

    name: str = ""
    message: str = ""


@dataclass(frozen=True)
class CreateTicket:
    """Open a RepairTicket (its sinks are notified by the ticket adapter). ``before``: the
    repair cycles its hardware used within the window; ``cycle``: the ticket's first
    cycle (``before`` + 1 for a confirmed failure, which begins a cycle; a person's
    quarantine begins none); ``retired``: it is born Retired (no cycle left)."""

    name: str = ""
    evidence: tuple[str, ...] = ()
    message: str = ""
    cycle: int = 1
    retired: bool = False
    before: int = 0
    quarantine: QuarantineRecord | None = None
    """What the quarantine takes out of service (the node, or devices) and why."""


@dataclass(frozen=True)
class SetTicketPhase:
    """Move the ticket to ``phase`` and add a history entry."""

    phase: TicketPhase
    name: str = ""
    message: str = ""


@dataclass(frozen=True)
class CloseTicket:
    """Close the ticket: the node passed verification or was released."""

    name: str = ""
    message: str = ""


@dataclass(frozen=True)
class RaiseCycle:
    """A repair failed verification: add ``test`` to the evidence, raise the cycle, clear the
    resolution, reopen. Idempotent: a test already in the evidence raises nothing."""

    name: str = ""
    test: str = ""


@dataclass(frozen=True)
class RecordHardware:
    """Write the hardware's history (one SDCHardware per trusted identifier): the Node it
    is under now, the failure if ``failure`` names one, its retirement if ``retire``.
    Idempotent: a failure already recorded for the same ticket and test adds nothing."""

    failure: FailureKind | None = None
    retire: bool = False
    test: str = ""
    ticket: str = ""
    message: str = ""
    devices: tuple[tuple[str, str], ...] = ()
    """Scope Device: (GPU UUID, its own ticket) of each device the failure (or the
    retirement) is about; each GPU's record names its own ticket, so it counts its own
    repair cycles."""


HISTORY_MESSAGE_CHARS = 256
"""How much of a history's message the node's annotation keeps."""


def history_note(records: tuple[RecordHardware, ...], at: dt.datetime) -> str:
    """The ``sdcguard.dev/history`` annotation of a decision that writes ``records`` after
    its node patch: when (the state-since of the state it enters) and what, so a pass
    after an interruption between the patch and the history can write it again."""
    body = {
        "at": keys.format_time(at),  # as state-since is written: restore compares them
        "records": [
            {
                "failure": r.failure.value if r.failure is not None else None,
                "retire": r.retire,
                "test": r.test,
                "ticket": r.ticket,
                "message": r.message[:HISTORY_MESSAGE_CHARS],
                "devices": [list(d) for d in r.devices],
            }
            for r in records
        ],
    }
    return json.dumps(body, separators=(",", ":"), sort_keys=True)


def parse_history_note(text: str | None) -> tuple[str, tuple[RecordHardware, ...]] | None:
    """The time (as written) and the records of a ``history_note``; None for a missing or
    unreadable one (never raises: the annotation is on a Node anyone may edit)."""
    if not text:
        return None
    try:
        body = json.loads(text)
        at = body["at"]
        records = tuple(
            RecordHardware(
                failure=FailureKind(r["failure"]) if r.get("failure") else None,
                retire=bool(r.get("retire", False)),
                test=str(r.get("test", "")),
                ticket=str(r.get("ticket", "")),
                message=str(r.get("message", "")),
                devices=tuple((str(u), str(t)) for u, t in r.get("devices", [])),
            )
            for r in body["records"]
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return (at, records) if isinstance(at, str) and records else None


@dataclass(frozen=True)
class Retire:
    """Mark the ticket Retired; delete the Node when the policy's retireAction is Delete."""

    name: str = ""
    delete_node: bool = False


# Bookkeeping: what the node's sdcguard.dev/ annotations remember across passes. Each
# is bound to annotation changes, written with the node patch (one Annotate action).


@dataclass(frozen=True)
class ForgetTest:
    """The node's current test is done with: forget its name, the count of inconclusive
    results and the back-off (``current-test``, ``inconclusive``, ``retry-after``)."""


@dataclass(frozen=True)
class ForgetSuspicion:
    """The suspicion is settled: forget the suspect checks, the evidence and a held
    quarantine (``suspect-checks``, ``evidence``, ``held``)."""


@dataclass(frozen=True)
class KeepSuspicion:
    """The node stays under suspicion: record the checks still suspect and the evidence
    (the failed tests) as the outcome judged them (``suspect-checks``, ``evidence``)."""


@dataclass(frozen=True)
class HoldQuarantine:
    """The open circuit breaker holds this confirmed failure (``held``, naming the test):
    the node is re-tested when the breaker closes or a person asks, not in a loop."""


@dataclass(frozen=True)
class BackOff:
    """Screen again only after ``triggers.inconclusiveBackoff``, growing with the count
    of inconclusive results (``retry-after``). ``count``: this outcome was inconclusive
    and is counted (``inconclusive`` + 1); else the count stays."""

    count: bool = True


@dataclass(frozen=True)
class AdoptTest:
    """Take the test someone else started on the node as its current test."""


@dataclass(frozen=True)
class EndDrain:
    """The drain is over: forget its deadline (``drain-until``)."""


BOOKKEEPING: tuple[type, ...] = (
    ForgetTest,
    ForgetSuspicion,
    KeepSuspicion,
    HoldQuarantine,
    BackOff,
    AdoptTest,
    EndDrain,
)
"""Row actions that only change what the node's annotations remember."""


@dataclass(frozen=True)
class EmitEvent:
    """A Kubernetes Event on the Node. ``message`` may use {node} and {detail}."""

    reason: str
    message: str
    warning: bool = False
    routine: bool = False
    """Part of a clean screening (started, passed): posted only when the operator's
    ``routineEvents`` setting is on, since the SDCTest already records it."""


Action = (
    AddTaint
    | RemoveTaint
    | Cordon
    | Uncordon
    | Drain
    | SetLabel
    | Annotate
    | MarkQualified
    | RevokeQualification
    | SetAutoscalerAnnotations
    | DeleteNode
    | TaintDevices
    | UntaintDevices
    | CreateTest
    | CancelTest
    | CreateTicket
    | SetTicketPhase
    | CloseTicket
    | RaiseCycle
    | RecordHardware
    | Retire
    | ForgetTest
    | ForgetSuspicion
    | KeepSuspicion
    | HoldQuarantine
    | BackOff
    | AdoptTest
    | EndDrain
    | EmitEvent
)

NODE_MUTATIONS: tuple[type, ...] = (
    AddTaint,
    RemoveTaint,
    Cordon,
    Uncordon,
    Drain,
    SetAutoscalerAnnotations,
    DeleteNode,
    TaintDevices,
    UntaintDevices,
)
"""Actions that change how the node is scheduled, or whether it exists."""
TICKET_ACTIONS: tuple[type, ...] = (CreateTicket, SetTicketPhase, CloseTicket, RaiseCycle, Retire)
"""Actions that open, move or close repair tickets (and so reach repair systems)."""
OBSERVE_SUPPRESSED: tuple[type, ...] = NODE_MUTATIONS + TICKET_ACTIONS + (RecordHardware,)
"""What Observe mode does not do. It still labels, annotates, tests and emits Events (it
starts no repair cycle, so it writes no hardware history either)."""


@dataclass(frozen=True)
class Transition:
    """One row of the table."""

    source: NodeState
    event: Event
    target: NodeState
    actions: tuple[Action, ...]


class IllegalTransition(Exception):
    """``event`` is not allowed in ``state``: a bug, surfaced as a condition and a metric."""

    def __init__(self, state: NodeState, event: Event) -> None:
        super().__init__(f"no transition from {state} on {event}")
        self.state = state
        self.event = event


def _row(source: NodeState, event: Event, target: NodeState, *actions: Action) -> Transition:
    label = (SetLabel(target),) if target != source else ()
    return Transition(source, event, target, (*label, *actions))


S = NodeState
E = Event
GATE, TESTING, QUARANTINE = TaintRole.GATE, TaintRole.TESTING, TaintRole.QUARANTINE

SETTLED: tuple[Action, ...] = (ForgetTest(), ForgetSuspicion())
"""The node's fate is decided: its test and its suspicion are done with."""
KEEP_SUSPECT: tuple[Action, ...] = (ForgetTest(), KeepSuspicion())
"""The test is done with, the suspicion is not."""

QUARANTINE_ACTIONS: tuple[Action, ...] = (
    *SETTLED,
    RemoveTaint(TESTING),
    AddTaint(QUARANTINE),
    Cordon(),
    Drain(),
    RevokeQualification(),
    CreateTicket(),
    SetAutoscalerAnnotations(on=True),
)
RELEASE_ACTIONS: tuple[Action, ...] = (
    *SETTLED,
    RemoveTaint(GATE),
    RemoveTaint(TESTING),
    RemoveTaint(QUARANTINE),
    Uncordon(),
    SetAutoscalerAnnotations(on=False),
)
QUALIFY_ACTIONS: tuple[Action, ...] = (
    *SETTLED,
    RemoveTaint(GATE),
    RemoveTaint(TESTING),
    MarkQualified(),
    EmitEvent("Qualified", "{node} passed its screening: {detail}", routine=True),
)
RETIRE_ACTIONS: tuple[Action, ...] = (
    *SETTLED,
    Cordon(),
    Retire(),
    EmitEvent("Retired", "{node} is retired: {detail}", warning=True),
)
CONFIRM = CreateTest(None, ScreeningReason.CONFIRMATION)
VERIFY = CreateTest(Suite.REPAIR_VERIFICATION, ScreeningReason.REPAIR_VERIFICATION)


CONFIRMED_FAILURE: tuple[Action, ...] = (
    *QUARANTINE_ACTIONS,
    RecordHardware(FailureKind.QUARANTINED),
    EmitEvent("Quarantined", "{node} quarantined: {detail}", warning=True),
)
OUT_OF_CYCLES: tuple[Action, ...] = (
    *SETTLED,
    RemoveTaint(TESTING),
    AddTaint(QUARANTINE),
    Cordon(),
    RevokeQualification(),
    CreateTicket(retired=True),
    RecordHardware(FailureKind.RETIRED, retire=True),
    Retire(),
    EmitEvent("Retired", "{node} is retired: {detail}", warning=True),
)
"""A confirmed failure of hardware with no repair cycle left: the ticket that records it
is born Retired, and the node never serves again."""
RERUN: tuple[Action, ...] = (
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
            VERIFY,
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
    """Evictions a PodDisruptionBudget refused: again, until the drain's time runs out."""
    return [
        _row(source, E.DRAIN_DUE, source, Drain()),
        _row(
            source,
            E.DRAIN_TIMED_OUT,
            source,
            EndDrain(),
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
        AddTaint(QUARANTINE),
        Cordon(),
        RecordHardware(),
        Retire(),
        EmitEvent("Retired", "{node} is retired: {detail}", warning=True),
    ),
    _row(
        S.UNQUALIFIED,
        E.ADMITTED,
        S.QUALIFIED,
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
        EmitEvent("Inconclusive", "{node}: {detail}; still gated, screened again later"),
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
    _row(S.QUALIFIED, E.TEST_STARTED, S.TESTING, AdoptTest(), AddTaint(TESTING)),
    _row(
        S.QUALIFIED,
        E.SUSPECTED,
        S.SUSPECT,
        # Held (triggers.holdSuspects): no new work until the re-test clears it.
        AddTaint(TESTING),
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
        RaiseCycle(),
        RecordHardware(FailureKind.VERIFICATION_FAILED),
        EmitEvent("RepairFailed", "{node} failed repair verification: {detail}", warning=True),
    ),
    _row(
        S.VERIFYING,
        E.DEVICES_RETURNED,
        S.QUARANTINED,
        *SETTLED,
        CloseTicket(),
        UntaintDevices(),
        RaiseCycle(),
        RecordHardware(FailureKind.VERIFICATION_FAILED),
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
    _row(S.VERIFYING, E.RETEST_DUE, S.VERIFYING, VERIFY),
    *_manual(S.VERIFYING, quarantine=False),
    # Retired and excluded: only a person brings them back.
    *_manual(S.RETIRED, quarantine=False),
    _row(
        S.EXCLUDED,
        E.OPTED_IN,
        S.UNQUALIFIED,
        RevokeQualification(),
        EmitEvent("OptedIn", "{node} opted in again: gated until it passes acceptance"),
    ),
)

TABLE: Mapping[tuple[NodeState, Event], Transition] = {(t.source, t.event): t for t in TRANSITIONS}


def transition(state: NodeState, event: Event) -> Transition:
    """The row for ``event`` in ``state``; raises :class:`IllegalTransition` if there is none."""
    row = TABLE.get((state, event))
    if row is None:
        raise IllegalTransition(state, event)
    return row
