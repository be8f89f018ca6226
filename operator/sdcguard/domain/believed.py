"""The state a node is in, as its records say (its label is output, never input), and
what becomes of a ticket whose Node is gone."""

from __future__ import annotations

from sdcguard.api import RepairStrategy, SDCPolicySpec, TicketPhase
from sdcguard.domain.observed import Observed, TicketFacts
from sdcguard.domain.states import NodeState

S = NodeState


def recover_state(observed: Observed, policy: SDCPolicySpec) -> NodeState | None:
    """The state a node's resources imply when its state label is missing or mangled.

    A person or a tool may delete or overwrite ``sdcguard.dev/state``; the node's
    tickets, our taints, its current test and its qualification still say where it
    is, so it is neither re-gated nor re-tested nor released by accident. None: a
    node sdcguard never handled.
    """
    node, ticket, test = observed.node, observed.ticket, observed.test
    if ticket is not None:
        return {
            TicketPhase.VERIFYING: S.VERIFYING,
            TicketPhase.IN_REPAIR: S.REPAIRING,
            TicketPhase.ACKNOWLEDGED: S.QUARANTINED,
            TicketPhase.RETIRED: S.RETIRED,
        }.get(ticket.phase, S.QUARANTINED)
    quarantine = policy.taints.quarantine
    if node.has_taint(quarantine) and quarantine in node.owned_taints:
        return S.QUARANTINED
    if test is not None and not test.finished and test.name == node.current_test:
        return S.SUSPECT if node.suspect_checks else S.TESTING
    if node.suspect_checks:
        return S.SUSPECT
    if node.qualified_at is not None:
        return S.QUALIFIED
    return None


def believed_state(observed: Observed, policy: SDCPolicySpec) -> NodeState:
    """The node's state: its label, unless the label is absent, names no state, or
    claims ``Qualified`` against the records (a gate or quarantine taint of ours, our
    testing reservation, or an open ticket); then the state the records imply.

    The label is output, never input: ``kubectl label node N sdcguard.dev/state=Qualified``
    on a gated node does not let the node in.

    A ticket whose status was never written does not contradict ``Qualified``: the
    decision that created it was cut off before its node patch (a 409 on a node that
    changed meanwhile, a crash), and the request that caused it is still on the node.
    The node stays Qualified until that decision is made again, whole: taint, cordon,
    drain and its deadline, the revoked qualification, the ticket's status, the Events.
    Read as Quarantined instead, it would only get what upkeep ensures (taint, cordon)
    and never be drained. After ``TICKET_STATUS_GRACE`` the operator writes the missing
    status itself, and then the ticket says Quarantined.
    """
    label = observed.node.state
    if label == S.QUALIFIED and _contradicts_qualified(observed, policy):
        label = None
    return label or recover_state(observed, policy) or S.UNQUALIFIED


def _contradicts_qualified(observed: Observed, policy: SDCPolicySpec) -> bool:
    node, taints = observed.node, policy.taints
    if (observed.ticket is not None and observed.ticket.opened) or node.has_taint(taints.gate):
        return True
    return any(
        node.has_taint(key) and key in node.owned_taints
        for key in (taints.quarantine, taints.testing)
    )


def closes_as_replaced(ticket: TicketFacts, policy: SDCPolicySpec, node_exists: bool) -> bool:
    """With the Replace strategy, a ticket InRepair whose Node is gone is done: the
    replacement joins as a new node (acceptance), so the ticket closes as Replaced."""
    return (
        not node_exists
        and policy.repair.strategy == RepairStrategy.REPLACE
        and ticket.phase == TicketPhase.IN_REPAIR
    )


def node_gone_closing(ticket: TicketFacts, policy: SDCPolicySpec, node: str) -> str | None:
    """The closing message for an unfinished ticket whose Node is gone, or None when
    the ticket is finished already.

    Deleted for replacement (Replace strategy, InRepair) it closes as Replaced. Deleted
    by someone else (an autoscaler's expiry or node repair, a person) the quarantined
    hardware left the cluster all the same: nothing is left to repair or verify here, and
    a Node of the same name or instance later joins as a new node (acceptance)."""
    if ticket.phase in (TicketPhase.CLOSED, TicketPhase.RETIRED):
        return None
    if closes_as_replaced(ticket, policy, False):
        return f"node {node} deleted for replacement; its successor joins as new"
    return (
        f"node {node} was deleted while its ticket was {ticket.phase.value}, not by "
        "sdcguard (an autoscaler's expiry or node repair, or a person); nothing is left "
        "to repair or verify, and a successor joins as new"
    )
