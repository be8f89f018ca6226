"""Pure decisions: the node lifecycle, budgets, the circuit breaker, judging and baselines.

Nothing here performs I/O or reads the clock: observations and ``now`` come in,
decisions and actions go out, and the adapters apply them.
"""

from sdcguard.domain.decide import Decision, decide
from sdcguard.domain.lifecycle import Event, IllegalTransition, NodeState, transition
from sdcguard.domain.nodepatch import NodePatch, plan_node_patch
from sdcguard.domain.observed import NodeFacts, Observed, Taint, TestFacts, TicketFacts
from sdcguard.domain.scheduling import decide_all

__all__ = [
    "Decision",
    "Event",
    "IllegalTransition",
    "NodeFacts",
    "NodePatch",
    "NodeState",
    "Observed",
    "Taint",
    "TestFacts",
    "TicketFacts",
    "decide",
    "decide_all",
    "plan_node_patch",
    "transition",
]
