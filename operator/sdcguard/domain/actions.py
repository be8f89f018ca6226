"""The actions a lifecycle row holds: what the adapters apply, the bookkeeping the
node's annotations remember, and the templates (guards, scope) the binder resolves.

Fields left empty in a row are filled in by ``domain.binding`` from the node, the
policy and the objects involved.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from enum import StrEnum

from sdcguard.api import FailureKind, QuarantineRecord, ScreeningReason, Suite, TicketPhase
from sdcguard.domain import keys
from sdcguard.domain.devicetaints import SliceDevice
from sdcguard.domain.states import NodeState


class TaintRole(StrEnum):
    """Which of the policy's three taint keys an action means."""

    GATE = "gate"
    TESTING = "testing"
    QUARANTINE = "quarantine"


# Actions: what the adapters apply. Fields left empty in the table are bound by the binder.


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
    """Record the qualification time and the fingerprint it was earned under, and add
    the passing test's seeds to the node's ``seeds-passed`` record."""

    at: dt.datetime | None = None
    fingerprint: str = ""
    test: str = ""
    seed: int | None = None
    data_seed: int | None = None


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
    """Mark the ticket Retired. With retireAction Delete the row also deletes the Node
    (a DeleteNode of its own, applied last)."""

    name: str = ""
    delete_node: bool = False
    """The policy's retireAction is Delete (the row's DeleteNode does it; this says so
    to whoever reads the ticket action alone)."""


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


@dataclass(frozen=True)
class DrainDeadline:
    """A drain begins: remember until when it may go on (``drain-until``, now plus
    ``quarantine.drainTimeoutSeconds``; none when that is 0)."""


@dataclass(frozen=True)
class RecordWait:
    """Record why the node's next step waits, or forget a wait that ended (``waiting``,
    ``waiting-since``, ``waiting-told``); once a wait has lasted a minute, say it in one
    ``Waiting`` Event (see ``domain.waits``)."""


@dataclass(frozen=True)
class CorrectLabel:
    """A state label someone wrote by hand (or mangled) disagrees with the records: the
    records win, and a ``StateLabelCorrected`` Warning says so."""


@dataclass(frozen=True)
class EnterState:
    """A node whose label changes remembers since when it is in its state
    (``state-since``)."""


@dataclass(frozen=True)
class LeaveTest:
    """A transition that neither starts, adopts nor forgets a test leaves the current
    one behind: its outcome no longer counts (``current-test``)."""


@dataclass(frozen=True)
class NoteHistory:
    """The hardware history this decision writes after its node patch is noted on the
    node (``history``) so a pass after an interruption writes it then; a node entering
    another state without history forgets the note of the state it leaves."""


BOOKKEEPING: tuple[type, ...] = (
    ForgetTest,
    ForgetSuspicion,
    KeepSuspicion,
    HoldQuarantine,
    BackOff,
    AdoptTest,
    EndDrain,
    DrainDeadline,
    RecordWait,
    CorrectLabel,
    EnterState,
    LeaveTest,
    NoteHistory,
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


@dataclass(frozen=True)
class OpenTicketStatus:
    """Write a ticket's first status (Open, the cycle it begins, its history; Retired
    when it is born so): bound for every ticket a decision opens, and written only when
    this decision created the ticket."""

    name: str = ""
    message: str = ""
    cycle: int = 1
    retired: bool = False


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
    | DrainDeadline
    | RecordWait
    | CorrectLabel
    | EnterState
    | LeaveTest
    | NoteHistory
    | EmitEvent
    | OpenTicketStatus
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
TICKET_ACTIONS: tuple[type, ...] = (
    CreateTicket,
    OpenTicketStatus,
    SetTicketPhase,
    CloseTicket,
    RaiseCycle,
    Retire,
)
"""Actions that open, move or close repair tickets (and so reach repair systems)."""
OBSERVE_SUPPRESSED: tuple[type, ...] = NODE_MUTATIONS + TICKET_ACTIONS + (RecordHardware,)
"""What Observe mode does not do. It still labels, annotates, tests and emits Events (it
starts no repair cycle, so it writes no hardware history either)."""


# Row templates: the parts of a row that the binder resolves; a bound transition holds
# none of them, only actions.


class Guard(StrEnum):
    """A condition a row states as data: the actions under it (:class:`Only`) happen
    only where it holds, for the node, its quarantine's scope or the policy's settings."""

    NODE_SCOPE = "NodeScope"
    """The quarantine takes the whole node (taint, cordon, drain)."""
    DEVICE_SCOPE = "DeviceScope"
    """Quarantine scope Device: DeviceTaintRules take the failed devices out, and the
    node serves with the others."""
    DEVICES_REFAILED = "DevicesRefailed"
    """Scope Device: some device under verification failed again."""
    GATED = "Gated"
    """Acceptance is on (``triggers.onJoin``) and the node never qualified."""
    HOLD_SUSPECTS = "HoldSuspects"
    """``triggers.holdSuspects``: a suspect takes no new work until its re-test."""
    CORDON = "Cordon"
    """``quarantine.cordon``."""
    DRAIN = "Drain"
    """``quarantine.drain``, in Enforce mode."""
    IN_PLACE = "InPlace"
    """``repair.strategy`` InPlace: autoscalers are asked to keep the node."""
    RETIRE_BY_CORDON = "RetireByCordon"
    """``repair.retireAction`` Cordon."""
    RETIRE_BY_DELETE = "RetireByDelete"
    """``repair.retireAction`` Delete."""


@dataclass(frozen=True)
class Only:
    """``actions`` happen only where every guard of ``when`` holds."""

    when: tuple[Guard, ...]
    actions: tuple[Action | Template, ...]


@dataclass(frozen=True)
class UntaintReturnedDevices:
    """Scope Device: delete the DeviceTaintRules of the devices that passed verification
    (all of the node's rules when the outcome names none)."""


@dataclass(frozen=True)
class KeepDeviceRules:
    """Scope Device: ensure the DeviceTaintRules of the open incident (a rule deleted by
    hand comes back; a device renamed in its ResourceSlice is selected anew)."""


@dataclass(frozen=True)
class AcknowledgedIntoRepair:
    """Scope Device: a device ticket acknowledged after its node entered repair enters
    repair too (InRepair)."""


Template = Only | UntaintReturnedDevices | KeepDeviceRules | AcknowledgedIntoRepair
RowAction = Action | Template
"""What a row of the table (or of the upkeep table) holds."""
