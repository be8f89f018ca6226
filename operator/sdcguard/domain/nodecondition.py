"""The ``SDCQualified`` Node condition: the verdict in the form other remediators read.

Karpenter's node repair, Medik8s Node Health Check and most dashboards act on Node
conditions, not on labels. sdcguard keeps one condition of its own, derived from the
node's lifecycle state after a decision (a pure function of the state, whether the node
holds a qualification, and the policy's mode):

=====================================  =======  ====================
state                                  status   reason
=====================================  =======  ====================
Qualified; Testing while certified     True     Certified
Unqualified; Testing a new node        Unknown  NotYetCertified
Suspect (a failure not yet confirmed)  Unknown  Suspected
Quarantined                            False    Quarantined
Repairing                              False    InRepair
Verifying                              False    VerifyingRepair
Retired                                False    Retired
Excluded                               Unknown  Excluded
any state, policy in Observe mode      Unknown  ObserveMode
=====================================  =======  ====================

A re-screening of a certified node keeps it True (its certificate holds until a
confirmed failure), so a clean re-qualification writes nothing here. A suspicion stays
Unknown: a remediator that deletes nodes on False must not act on an unconfirmed
verdict. Observe mode acts on nothing, so it never says False.

The condition is written only when its status or reason changes, and
``lastTransitionTime`` moves only when the status flips.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sdcguard.domain import keys
from sdcguard.domain.states import NodeState

TRUE, FALSE, UNKNOWN = "True", "False", "Unknown"


@dataclass(frozen=True)
class NodeCondition:
    """The condition's status, reason and message."""

    status: str
    reason: str
    message: str


_BY_STATE: dict[NodeState, NodeCondition] = {
    NodeState.QUALIFIED: NodeCondition(
        TRUE, "Certified", "sdcguard certified the node: its last screening passed"
    ),
    NodeState.UNQUALIFIED: NodeCondition(
        UNKNOWN, "NotYetCertified", "sdcguard has not certified the node yet"
    ),
    NodeState.SUSPECT: NodeCondition(
        UNKNOWN,
        "Suspected",
        "a screening found silent data corruption; sdcguard is re-running it to confirm",
    ),
    NodeState.QUARANTINED: NodeCondition(
        FALSE, "Quarantined", "sdcguard confirmed silent data corruption; see its RepairTicket"
    ),
    NodeState.REPAIRING: NodeCondition(
        FALSE, "InRepair", "the node is in repair for silent data corruption"
    ),
    NodeState.VERIFYING: NodeCondition(
        FALSE, "VerifyingRepair", "sdcguard is verifying the node's repair"
    ),
    NodeState.RETIRED: NodeCondition(
        FALSE, "Retired", "sdcguard retired the node after silent data corruption"
    ),
    NodeState.EXCLUDED: NodeCondition(
        UNKNOWN, "Excluded", "the node opted out of sdcguard (sdcguard.dev/exclude=true)"
    ),
}
OBSERVE = NodeCondition(
    UNKNOWN, "ObserveMode", "sdcguard's policy is in Observe mode: verdicts are not acted on"
)


def condition_for(state: NodeState, *, certified: bool, enforce: bool) -> NodeCondition:
    """The condition for a node in ``state``; ``certified``: it holds a qualification
    (``sdcguard.dev/qualified-at``), ``enforce``: its policy is in Enforce mode."""
    if not enforce:
        return OBSERVE
    if state == NodeState.TESTING:
        return _BY_STATE[NodeState.QUALIFIED if certified else NodeState.UNQUALIFIED]
    return _BY_STATE[state]


def condition_patch(
    current: tuple[str, str] | None, wanted: NodeCondition, now: dt.datetime
) -> dict[str, Any] | None:
    """The Node status patch (strategic merge, keyed by ``type``) that sets ``wanted``,
    or None when ``current`` (status, reason) already says it. A node without the
    condition and an Unknown one wanted: None (absent already means unknown, and a new
    node's screening writes no extra request for it)."""
    if current is None and wanted.status == UNKNOWN:
        return None
    if current is not None and current == (wanted.status, wanted.reason):
        return None
    condition: dict[str, Any] = {
        "type": keys.NODE_CONDITION,
        "status": wanted.status,
        "reason": wanted.reason,
        "message": wanted.message,
        # Node conditions carry a heartbeat; sdcguard writes it with each change only.
        "lastHeartbeatTime": keys.format_time(now),
    }
    if current is None or current[0] != wanted.status:
        condition["lastTransitionTime"] = keys.format_time(now)
    return {"status": {"conditions": [condition]}}
