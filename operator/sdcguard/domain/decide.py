"""``decide(observed, policy, now)``: the next state of one node, what to do, when to look again.

A decision is three pure steps, each in a module of its own:

1. reading (``domain.reading``): the observations give the event that applies, or a
   typed wait (``domain.waits``), or nothing;
2. the row: the lifecycle table's row for (state, event) (``domain.lifecycle``), or,
   with no event, the upkeep table's row for the state (``domain.upkeep``);
3. binding (``domain.binding``): the row with the node's names and keys filled in.
   The bound row is the whole transition; nothing is added or changed after it.

The adapters apply the actions in the order the plan states (``domain/plan.py``'s
docstring, the one place that says it); names derived from the node's
``sdcguard.dev/seq`` make a repeat after a crash create nothing twice. Scheduling a
pass across nodes (budgets, priority) is ``domain.scheduling``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sdcguard.api import ScreeningReason, SDCPolicySpec
from sdcguard.domain import keys
from sdcguard.domain.believed import (
    believed_state,
    closes_as_replaced,
    node_gone_closing,
    recover_state,
)
from sdcguard.domain.binding import Binder, taint_devices
from sdcguard.domain.lifecycle import (
    Action,
    AddTaint,
    CreateTest,
    Event,
    IllegalTransition,
    NodeState,
    TaintRole,
    transition,
)
from sdcguard.domain.observed import Observed
from sdcguard.domain.plan import Plan
from sdcguard.domain.reading import (
    REQUEUE_AFTER_TRANSITION,
    REQUEUE_MAX,
    REQUEUE_TEST_RUNNING,
    REQUEUE_WAITING,
    Reader,
)
from sdcguard.domain.upkeep import stays_unwritten, upkeep_row
from sdcguard.domain.waits import Wait

__all__ = [
    "REQUEUE_AFTER_TRANSITION",
    "REQUEUE_MAX",
    "REQUEUE_TEST_RUNNING",
    "REQUEUE_WAITING",
    "Decision",
    "believed_state",
    "closes_as_replaced",
    "decide",
    "node_gone_closing",
    "recover_state",
    "taint_devices",
]

S = NodeState


@dataclass(frozen=True)
class Decision:
    """What to do with one node; the adapters apply ``actions`` and requeue."""

    node: str
    previous: NodeState | None
    """The state label before (None: never seen)."""
    state: NodeState
    event: Event | None
    actions: tuple[Action, ...]
    suppressed: tuple[Action, ...] = ()
    """Actions Observe mode dropped (for "would have" Events and logs)."""
    requeue_after: float | None = None
    """Seconds until the node should be decided again (None: only on change)."""
    note: str = ""
    """Why, in one line (logs, conditions)."""
    starts_test: bool = False
    takes_node: bool = False
    """Whether the decision holds a node that was serving (counts against maxUnavailable)."""
    waits_for_budget: bool = False
    """A test is due but the pool's budget is used up: a candidate when budget frees up."""
    illegal: IllegalTransition | None = None
    """The event chosen has no row in this state (a bug): nothing is done for the node."""
    held: bool = False
    """The node's confirmed failure is held by the open circuit breaker."""
    wait: Wait | None = None
    """Why sdcguard holds back the node's next step (None: it does not); its reason is
    the Waiting condition's."""
    waiting_test: str | None = None
    """The SDCTest that waits (its Waiting condition says why), when the wait is a test's."""

    @property
    def waiting(self) -> str | None:
        """The wait's message (None: no wait)."""
        return self.wait.message if self.wait is not None else None

    @property
    def changed(self) -> bool:
        """Whether the node changes state."""
        return self.event is not None and self.state != self.previous

    @property
    def plan(self) -> Plan:
        """``actions`` in the order the executor applies them (see ``domain.plan``)."""
        return Plan.of(self.actions)


def decide(observed: Observed, policy: SDCPolicySpec, now: dt.datetime) -> Decision:
    """The next state of ``observed.node``, the actions that get it there, and when to look again.

    Pure: reads only its arguments. Raises IllegalTransition only on a bug (an event
    chosen for a state that has no row for it).
    """
    reader = Reader(observed, policy, now)
    node, state = observed.node, reader.state
    reading = reader.step()
    if stays_unwritten(reader, reading):
        return Decision(
            node=node.name,
            previous=None,
            state=state,
            event=None,
            actions=(),
            requeue_after=reading.requeue,
            note=reading.detail,
            waits_for_budget=reader.budget_blocked,
        )
    if reading.event is None:
        target, row, requeue = state, upkeep_row(reader), reading.requeue
    else:
        found = transition(state, reading.event)
        target, row = found.target, found.actions
        requeue = REQUEUE_AFTER_TRANSITION if reading.requeue is None else reading.requeue
    bound = Binder(reader, reading, target, requeue).bind_all(row)
    tests = [a for a in bound.actions if isinstance(a, CreateTest)]
    starts_test = bool(tests)
    ticket = observed.ticket
    # Only a node that was serving counts against maxUnavailable when we reserve it: a
    # Qualified or Suspect node, or (in either mode) one whose quarantine of scope
    # Device left it serving and that a verification reserves.
    in_service = (
        ticket is not None
        and bool(ticket.devices)
        and any(t.reason == ScreeningReason.REPAIR_VERIFICATION for t in tests)
    )
    takes_node = (in_service and _reserves(bound.actions + bound.suppressed)) or (
        state in (S.QUALIFIED, S.SUSPECT) and _reserves(bound.actions)
    )
    held = target == S.SUSPECT and bound.changes.get(keys.HELD, node.annotations.get(keys.HELD))
    wait = reading.wait
    return Decision(
        node=node.name,
        previous=node.state,
        state=target,
        event=reading.event,
        actions=bound.actions,
        suppressed=bound.suppressed,
        requeue_after=bound.requeue,
        note=reading.detail,
        starts_test=starts_test,
        takes_node=takes_node,
        waits_for_budget=reader.budget_blocked and not starts_test,
        held=bool(held),
        wait=wait,
        waiting_test=reading.waiting_test if wait is not None else None,
    )


def _reserves(actions: tuple[Action, ...]) -> bool:
    return any(isinstance(a, AddTaint) and a.role == TaintRole.TESTING for a in actions)
