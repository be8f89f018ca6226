"""The SDCTest phase table, row by row, everything outside it, and the event chooser."""

from __future__ import annotations

import itertools

import pytest

from sdcguard.api import SDCTestPhase, Verdict
from sdcguard.domain.testphase import (
    TEST_TABLE,
    TEST_TRANSITIONS,
    CreateJob,
    DeleteJob,
    IllegalTestTransition,
    MarkAwaitingBaseline,
    PolicyChange,
    TestEvent,
    WriteStatus,
    ended_by_policy_change,
    phase_event,
    phase_transition,
    policy_change_ending,
    verdict_phase,
)

P, E = SDCTestPhase, TestEvent
UNFINISHED = (P.PENDING, P.RESERVING, P.RUNNING)

EXPECTED: dict[tuple[SDCTestPhase, TestEvent], tuple[SDCTestPhase, tuple[object, ...]]] = {
    (P.PENDING, E.NOT_RESERVED): (P.RESERVING, (WriteStatus(),)),
    (P.RESERVING, E.NOT_RESERVED): (P.RESERVING, ()),
    (P.PENDING, E.RESERVED): (P.RUNNING, (CreateJob(), WriteStatus())),
    (P.RESERVING, E.RESERVED): (P.RUNNING, (CreateJob(), WriteStatus())),
    (P.RUNNING, E.PROBE_RUNNING): (P.RUNNING, ()),
    (P.RUNNING, E.AWAITING_BASELINE): (P.RUNNING, (MarkAwaitingBaseline(),)),
    (P.RUNNING, E.PASSED): (P.PASSED, (WriteStatus(),)),
    (P.RUNNING, E.SDC_FOUND): (P.FAILED, (WriteStatus(),)),
    (P.RUNNING, E.NO_EVIDENCE): (P.INCONCLUSIVE, (WriteStatus(), DeleteJob())),
    **{(p, E.NODE_GONE): (P.INCONCLUSIVE, (WriteStatus(), DeleteJob())) for p in UNFINISHED},
    **{(p, E.CANCELLED): (P.CANCELLED, (WriteStatus(), DeleteJob())) for p in UNFINISHED},
    **{(p, E.POLICY_CHANGED): (P.CANCELLED, (WriteStatus(), DeleteJob())) for p in UNFINISHED},
}


def test_table_is_exactly_the_expected_rows() -> None:
    assert len(TEST_TABLE) == len(TEST_TRANSITIONS), "duplicate (phase, event) rows"
    assert set(TEST_TABLE) == set(EXPECTED)


@pytest.mark.parametrize(("phase", "event"), sorted(EXPECTED), ids=str)
def test_row(phase: SDCTestPhase, event: TestEvent) -> None:
    target, actions = EXPECTED[(phase, event)]
    row = phase_transition(phase, event)
    assert (row.target, row.actions) == (target, actions)


@pytest.mark.parametrize(
    ("phase", "event"),
    [pe for pe in itertools.product(SDCTestPhase, TestEvent) if pe not in EXPECTED],
    ids=str,
)
def test_everything_else_is_illegal(phase: SDCTestPhase, event: TestEvent) -> None:
    with pytest.raises(IllegalTestTransition):
        phase_transition(phase, event)


def test_a_finished_test_never_moves() -> None:
    for phase in SDCTestPhase:
        if phase.finished:
            assert not [k for k in TEST_TABLE if k[0] == phase]
            assert phase_event(phase, node_exists=False, reserved=True, verdict=None) is None


@pytest.mark.parametrize(
    ("verdict", "phase"),
    [
        (Verdict.PASS, P.PASSED),
        (Verdict.SDC, P.FAILED),
        (Verdict.CRASH, P.INCONCLUSIVE),
        (Verdict.TIMEOUT, P.INCONCLUSIVE),
        (Verdict.INCONCLUSIVE, P.INCONCLUSIVE),
    ],
)
def test_one_verdict_to_phase_mapping(verdict: Verdict, phase: SDCTestPhase) -> None:
    assert verdict_phase(verdict) == phase
    event = phase_event(P.RUNNING, node_exists=True, reserved=True, verdict=verdict)
    assert event is not None and phase_transition(P.RUNNING, event).target == phase


def test_the_event_follows_the_observations() -> None:
    def event(phase: SDCTestPhase, **kw: object) -> TestEvent | None:
        args: dict[str, object] = {"node_exists": True, "reserved": True, "verdict": None}
        return phase_event(phase, **{**args, **kw})  # type: ignore[arg-type]

    assert event(P.RUNNING, node_exists=False, verdict=Verdict.PASS) == E.NODE_GONE
    assert event(P.PENDING, reserved=False) == E.NOT_RESERVED
    assert event(P.RESERVING) == E.RESERVED
    assert event(P.RUNNING) == E.PROBE_RUNNING
    awaiting = event(P.RUNNING, verdict=Verdict.INCONCLUSIVE, awaiting_baseline=True)
    assert awaiting == E.AWAITING_BASELINE
    assert event(P.RUNNING, verdict=Verdict.SDC) == E.SDC_FOUND
    assert event(P.RUNNING, owned=False, verdict=Verdict.PASS) == E.POLICY_CHANGED
    assert event(P.PENDING, owned=False, reserved=False) == E.POLICY_CHANGED
    assert event(P.RUNNING, owned=False, node_exists=False) == E.NODE_GONE


@pytest.mark.parametrize(
    ("phase", "reason", "by_policy_change"),
    [
        (P.CANCELLED, "NodeLeftPolicy", True),
        (P.CANCELLED, "PolicyDeleted", True),
        (P.INCONCLUSIVE, "NodeLeftPolicy", True),  # as an operator before this rule wrote it
        (P.CANCELLED, "Cancelled", False),  # a person's decision: their row decides
        (P.INCONCLUSIVE, "NodeGone", False),
        (P.INCONCLUSIVE, "CheckMissing", False),
        (P.PASSED, "NodeLeftPolicy", False),
    ],
)
def test_which_endings_are_a_policy_change(
    phase: SDCTestPhase, reason: str, by_policy_change: bool
) -> None:
    assert ended_by_policy_change(phase, reason) is by_policy_change


@pytest.mark.parametrize("change", list(PolicyChange))
def test_a_policy_change_ending_names_the_node_the_policy_and_no_result(
    change: PolicyChange,
) -> None:
    reason, message = policy_change_ending("gpu-1", "h100", change)
    assert reason == change.value and ended_by_policy_change(P.CANCELLED, reason)
    assert "gpu-1" in message and "h100" in message and "no result" in message


def test_a_test_that_ends_without_its_own_verdict_takes_its_job_with_it() -> None:
    """Inconclusive, node gone, Cancelled: the Job (and a Pod that may hold every
    accelerator of the node) goes with the test, so the next screening can schedule."""
    for row in TEST_TRANSITIONS:
        if row.target in (P.INCONCLUSIVE, P.CANCELLED):
            assert DeleteJob() in row.actions, row
            assert row.actions.index(DeleteJob()) > row.actions.index(WriteStatus()), row
