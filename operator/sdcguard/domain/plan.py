"""The typed plan: the writes of one decision, in the order the executor applies them.

Both tables make one: a node's lifecycle row (``decide``, bound to the node) and an
SDCTest's phase row (``testphase``). Every action belongs to one :class:`Stage`; a
plan holds its actions stage by stage, and within a stage in the row's order:

1. ``OBJECTS``: SDCTests (their probe Jobs and phase changes), RepairTickets and
   their phase changes, DeviceTaintRules (quarantine scope Device);
2. ``NODE_PATCH``: labels, annotations, taints, cordon and ownership, one guarded write;
3. ``EVICTIONS``: a drain, so evicted pods find the node tainted and cordoned;
4. ``STATUSES``: a new ticket's Open status (the ticket, created in 1, is the record of
   why, so the quarantine waits for one write less);
5. ``HISTORY``: the hardware's history (SDCHardware records, up to six writes for a
   host's three identifiers), after the taint for the same reason; the node patch
   carries what it will write (``sdcguard.dev/history``), so a pass after an
   interruption between 2 and 5 writes it then (``HardwareHistory.restore``);
6. ``EVENTS``: they only tell what the objects and the node already record;
7. ``NODE_DELETE``: deleting the Node (replacement, retirement by deletion).

A crash between stages repeats the same decision, and deterministic names make the
repeat a no-op (an Event may be lost); the history, whose decision does not repeat
once the node has entered its new state, is written from the node's annotation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum

from sdcguard.domain.lifecycle import (
    Action,
    AddTaint,
    Annotate,
    CancelTest,
    CloseTicket,
    Cordon,
    CreateTest,
    CreateTicket,
    DeleteNode,
    Drain,
    EmitEvent,
    MarkQualified,
    OpenTicketStatus,
    RaiseCycle,
    RecordHardware,
    RemoveTaint,
    Retire,
    RevokeQualification,
    SetAutoscalerAnnotations,
    SetLabel,
    SetTicketPhase,
    TaintDevices,
    Uncordon,
    UntaintDevices,
)
from sdcguard.domain.testphase import (
    CreateJob,
    DeleteJob,
    MarkAwaitingBaseline,
    TestAction,
    WriteStatus,
)

__all__ = ["STAGE_OF", "OpenTicketStatus", "Plan", "Stage", "Step"]


class Stage(IntEnum):
    """Where in a plan an action is applied (lower first)."""

    OBJECTS = 1
    NODE_PATCH = 2
    EVICTIONS = 3
    STATUSES = 4
    HISTORY = 5
    EVENTS = 6
    NODE_DELETE = 7


Step = Action | TestAction

STAGE_OF: Mapping[type, Stage] = {
    CreateTest: Stage.OBJECTS,
    CancelTest: Stage.OBJECTS,
    CreateTicket: Stage.OBJECTS,
    SetTicketPhase: Stage.OBJECTS,
    CloseTicket: Stage.OBJECTS,
    RaiseCycle: Stage.OBJECTS,
    RecordHardware: Stage.HISTORY,
    Retire: Stage.OBJECTS,
    CreateJob: Stage.OBJECTS,
    DeleteJob: Stage.OBJECTS,
    WriteStatus: Stage.OBJECTS,
    MarkAwaitingBaseline: Stage.OBJECTS,
    TaintDevices: Stage.OBJECTS,
    UntaintDevices: Stage.OBJECTS,
    SetLabel: Stage.NODE_PATCH,
    Annotate: Stage.NODE_PATCH,
    AddTaint: Stage.NODE_PATCH,
    RemoveTaint: Stage.NODE_PATCH,
    Cordon: Stage.NODE_PATCH,
    Uncordon: Stage.NODE_PATCH,
    MarkQualified: Stage.NODE_PATCH,
    RevokeQualification: Stage.NODE_PATCH,
    SetAutoscalerAnnotations: Stage.NODE_PATCH,
    Drain: Stage.EVICTIONS,
    OpenTicketStatus: Stage.STATUSES,
    EmitEvent: Stage.EVENTS,
    DeleteNode: Stage.NODE_DELETE,
}
"""Every action a plan may hold, by stage. Bookkeeping actions and row templates are not
here: the binder turns them into actions (the Annotate action, Events, guarded actions)
before a plan is made."""


@dataclass(frozen=True)
class Plan:
    """The actions of one decision, ordered by stage (see the module docstring)."""

    steps: tuple[Step, ...]

    @classmethod
    def of(cls, actions: Iterable[Step]) -> Plan:
        """The plan that applies ``actions``: stage by stage, in their order within a
        stage. It decides nothing: a bound row holds every step (a ticket's Open status,
        the Node's deletion). Raises ValueError for an action with no stage (a row's
        bookkeeping or template left unbound)."""
        steps = list(actions)
        for step in steps:
            if type(step) not in STAGE_OF:
                raise ValueError(f"{type(step).__name__} has no stage in a plan")
        steps.sort(key=lambda s: STAGE_OF[type(s)])  # stable: row order within a stage
        return cls(tuple(steps))

    def stage(self, stage: Stage) -> tuple[Step, ...]:
        return tuple(s for s in self.steps if STAGE_OF[type(s)] == stage)

    @property
    def deletes_node(self) -> bool:
        return any(isinstance(s, DeleteNode) for s in self.steps)
