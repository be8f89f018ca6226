"""The typed plan both tables share: every action has a stage, stages come in the
stated order, and a row's order holds within a stage."""

from __future__ import annotations

from typing import get_args

import pytest

from sdcguard.api import TicketPhase
from sdcguard.domain.lifecycle import (
    BOOKKEEPING,
    TABLE,
    Action,
    AddTaint,
    Cordon,
    CreateTicket,
    DeleteNode,
    Drain,
    EmitEvent,
    Event,
    ForgetTest,
    NodeState,
    Retire,
    SetLabel,
    SetTicketPhase,
    TaintRole,
    Template,
)
from sdcguard.domain.plan import STAGE_OF, OpenTicketStatus, Plan, Stage
from sdcguard.domain.testphase import TEST_TRANSITIONS, TestAction, TestTransition


def test_every_action_of_either_table_has_a_stage() -> None:
    bound = [t for t in get_args(Action) if t not in BOOKKEEPING]
    assert all(t in STAGE_OF for t in bound), [t for t in bound if t not in STAGE_OF]
    assert {STAGE_OF[t] for t in get_args(TestAction)} == {Stage.OBJECTS}
    assert not set(BOOKKEEPING) & set(STAGE_OF), "bookkeeping is bound before planning"
    assert not set(get_args(Template)) & set(STAGE_OF), "templates are bound before planning"


def test_a_quarantine_plan_runs_objects_patch_evictions_statuses_events() -> None:
    event = EmitEvent("Quarantined", "gpu-1 quarantined", warning=True)
    ticket = CreateTicket("gpu-1-t-1", ("t-1",), "confirmed")
    actions: list[Action] = [
        SetLabel(NodeState.QUARANTINED),
        AddTaint(TaintRole.QUARANTINE, "q", "NoSchedule"),
        Cordon(),
        Drain(),
        ticket,
        OpenTicketStatus("gpu-1-t-1", "confirmed"),
        event,
    ]
    plan = Plan.of(actions)
    assert plan.steps == (
        ticket,
        SetLabel(NodeState.QUARANTINED),
        AddTaint(TaintRole.QUARANTINE, "q", "NoSchedule"),
        Cordon(),
        Drain(),
        OpenTicketStatus("gpu-1-t-1", "confirmed"),
        event,
    )
    stages = [STAGE_OF[type(s)] for s in plan.steps]
    assert stages == sorted(stages)
    assert not plan.deletes_node


def test_row_order_holds_within_a_stage() -> None:
    first, second = SetTicketPhase(TicketPhase.IN_REPAIR, "t"), Retire("t")
    assert Plan.of([EmitEvent("a", "a"), second, first]).steps[:2] == (second, first)


def test_a_retirement_by_deletion_deletes_the_node_last() -> None:
    plan = Plan.of([Retire("t", delete_node=True), DeleteNode(), EmitEvent("Retired", "gone")])
    assert plan.steps[-1] == DeleteNode() and plan.deletes_node
    row = TABLE[(NodeState.QUARANTINED, Event.REPLACE_DUE)]
    replace = Plan.of(a for a in row.actions if isinstance(a, (SetTicketPhase, DeleteNode)))
    assert replace.stage(Stage.NODE_DELETE) == (DeleteNode(),)
    assert replace.steps[-1] == DeleteNode()


def test_a_plan_decides_nothing() -> None:
    """A plan only orders: a ticket's Open status and the Node's deletion come from the
    bound row (see test_bound_rows), never from the plan."""
    plan = Plan.of([Retire("t", delete_node=True), CreateTicket("t", ("x",), "why")])
    assert plan.steps == (Retire("t", delete_node=True), CreateTicket("t", ("x",), "why"))


def test_an_unbound_bookkeeping_action_is_refused() -> None:
    with pytest.raises(ValueError, match="ForgetTest has no stage"):
        Plan.of([ForgetTest()])


@pytest.mark.parametrize("row", TEST_TRANSITIONS, ids=lambda r: f"{r.source}-{r.event}")
def test_an_sdctest_row_plans_its_actions_in_row_order(row: TestTransition) -> None:
    assert Plan.of(row.actions).steps == row.actions
