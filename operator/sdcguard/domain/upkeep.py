"""Upkeep: what a decision with no event does, a table of its own beside the lifecycle's.

When no event applies, the node is kept consistent with its state: in Enforce mode the
taints, cordon, device rules and ticket its state implies are ensured (added, never
removed: the binder writes only what is missing), and in every mode the state label,
the wait record and the bookkeeping every decision keeps. A row here is bound by the
same binder as a lifecycle row, with the same guards.

Scope Device (an open ticket whose devices are tainted, the node serving with the
others) has rows of its own: its rules are ensured on every look (a rule deleted by
hand comes back, a device renamed in its ResourceSlice is selected anew), the node is
reserved only to verify, and a device ticket acknowledged after its node entered
repair enters repair too.

One node is left unwritten: a gated node never labelled that only waits for its
acceptance test. Its gate taint says all there is to say, so a node costs no write
until its test starts (:func:`stays_unwritten`). Not so a wait that lasts until a
person changes the cluster or the policy (a taint the probe does not tolerate, a node
with whole GPUs and MIG instances at once): that node is written, so it says why.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from sdcguard.api import Mode
from sdcguard.domain import keys
from sdcguard.domain.lifecycle import (
    DRAINED_STATES,
    OPEN_TICKET,
    QUARANTINE_TAINT,
    RETIRE_CORDON,
    AcknowledgedIntoRepair,
    AddTaint,
    Cordon,
    CorrectLabel,
    EndDrain,
    EnterState,
    Guard,
    KeepDeviceRules,
    NoteHistory,
    Only,
    RecordWait,
    RowAction,
    SetLabel,
    TaintRole,
)
from sdcguard.domain.reading import Reader, Reading
from sdcguard.domain.states import NodeState
from sdcguard.domain.waits import WaitReason

S = NodeState
G = Guard
GATE, TESTING = TaintRole.GATE, TaintRole.TESTING


class Scope(StrEnum):
    """What the node's quarantine (if any) takes out of service."""

    NODE = "Node"
    DEVICE = "Device"


QUARANTINE_CORDON = Only((G.NODE_SCOPE, G.CORDON), (Cordon(),))
GATE_IF_GATED = Only((G.GATED,), (AddTaint(GATE),))

UPKEEP: Mapping[tuple[NodeState, Scope], tuple[RowAction, ...]] = {
    (S.UNQUALIFIED, Scope.NODE): (GATE_IF_GATED,),
    (S.TESTING, Scope.NODE): (GATE_IF_GATED, AddTaint(TESTING)),
    (S.QUARANTINED, Scope.NODE): (*QUARANTINE_TAINT, QUARANTINE_CORDON, *OPEN_TICKET),
    (S.REPAIRING, Scope.NODE): (*QUARANTINE_TAINT, QUARANTINE_CORDON),
    (S.VERIFYING, Scope.NODE): (*QUARANTINE_TAINT, QUARANTINE_CORDON),
    (S.RETIRED, Scope.NODE): (*QUARANTINE_TAINT, RETIRE_CORDON),
    (S.QUARANTINED, Scope.DEVICE): (KeepDeviceRules(),),
    (S.REPAIRING, Scope.DEVICE): (KeepDeviceRules(), AcknowledgedIntoRepair()),
    (S.VERIFYING, Scope.DEVICE): (AddTaint(TESTING), KeepDeviceRules()),
    (S.UNQUALIFIED, Scope.DEVICE): (KeepDeviceRules(),),
    (S.SUSPECT, Scope.DEVICE): (KeepDeviceRules(),),
    (S.EXCLUDED, Scope.DEVICE): (KeepDeviceRules(),),
}
"""What each state implies for the node (Enforce mode), by the scope of its quarantine.
A pair not here implies nothing. (Qualified never has scope Device: a ticket
contradicts the label, and the state is read from the ticket.)"""


def scope_of(reader: Reader) -> Scope:
    """Scope Device when an open ticket's devices are tainted, except where the state
    says the node is held whole: gated, testing, or retired."""
    ticket, state = reader.obs.ticket, reader.state
    if ticket is None or not ticket.devices or state in (S.TESTING, S.RETIRED):
        return Scope.NODE
    policy = reader.policy
    if state == S.UNQUALIFIED and policy.triggers.on_join and reader.node.qualified_at is None:
        return Scope.NODE
    return Scope.DEVICE


def upkeep_row(reader: Reader) -> tuple[RowAction, ...]:
    """The upkeep row of the node's state: its label, what its state implies (Enforce
    only: Observe changes no scheduling), then the bookkeeping every decision keeps."""
    state = reader.state
    observe = reader.policy.mode == Mode.OBSERVE
    return _ROWS[(state, Scope.NODE if observe else scope_of(reader), observe)]


def _upkeep_row(state: NodeState, scope: Scope, observe: bool) -> tuple[RowAction, ...]:
    implied = () if observe else UPKEEP.get((state, scope), ())
    ends_drain = (EndDrain(),) if state not in DRAINED_STATES else ()
    return (
        SetLabel(state),
        *implied,
        RecordWait(),
        CorrectLabel(),
        EnterState(),
        *ends_drain,
        NoteHistory(),
    )


_ROWS: Mapping[tuple[NodeState, Scope, bool], tuple[RowAction, ...]] = {
    (state, scope, observe): _upkeep_row(state, scope, observe)
    for state in NodeState
    for scope in Scope
    for observe in (False, True)
}


NEEDS_A_PERSON = frozenset(
    {WaitReason.FOREIGN_TAINT, WaitReason.MIXED_MIG, WaitReason.RUNTIME_CLASS_MISSING}
)
"""Waits that last until a person changes the cluster or the policy: even a gated node
never labelled is written to say them (the others pass on their own: a node not yet
Ready, a device plugin not yet up, a budget)."""


def stays_unwritten(reader: Reader, reading: Reading) -> bool:
    """Never labelled, still Unqualified, gated, and nothing to do but wait: no write
    (its only action would adopt the gate taint it already carries). A test a person
    created that waits is said, on it and the node; Observe lets the gate go at once."""
    node = reader.node
    return (
        reading.event is None
        and node.state_label is None
        and reader.state == S.UNQUALIFIED
        and reading.waiting_test is None
        and not reading.changes
        and not node.annotations.get(keys.CURRENT_TEST)
        and node.has_taint(reader.policy.taints.gate)
        and reader.policy.mode != Mode.OBSERVE
        and (reading.wait is None or reading.wait.reason not in NEEDS_A_PERSON)
    )
