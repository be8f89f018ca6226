"""The demo's end: what still stands between a run and its end (``pending_goals``)."""

from __future__ import annotations

import time

from sdcdev.sim.demo import DemoConfig, _watch, progress_marks
from sdcdev.sim.demo_watch import NodeTrack, RecorderView, Transition, pending_goals
from sdcdev.sim.demo_watch import TestRecord as Record


def _test(name: str, phase: str, created: float) -> Record:
    return Record(
        name=name,
        node="n1",
        reason="ReturnFromUse",
        suite="requalification",
        attempt=1,
        phase=phase,
        verdict=None,
        why="",
        message="",
        created=created,
        started=None,
        completed=None,
        failed_checks=(),
        awaiting_baseline=False,
        ticket=None,
    )


def _view(*tests: Record) -> RecorderView:
    track = NodeTrack("n1", "p5.48xlarge", "pool", faulty=False, intermittent=False)
    track.states = [(1.0, "Testing"), (10.0, "Qualified"), (20.0, "Testing"), (30.0, "Qualified")]
    track.state = "Qualified"
    return RecorderView(
        t=31.0,
        nodes={"n1": track},
        tests={t.name: t for t in tests},
        tickets={},
        baseline=None,
        activity={},
        probing_since={},
        probes=[],
        probes_running=0,
        probes_queued=0,
        transitions=[],
    )


def test_a_run_waits_to_see_the_end_of_the_test_its_qualified_node_had() -> None:
    """The node's return and its test's end come through separate watches: a node seen
    Qualified while its re-screening still reads Running holds the run's end."""
    done = _view(_test("n1-1", "Passed", 1.0), _test("n1-2", "Passed", 20.0))
    assert pending_goals(done, allow_rescreening=True) == []
    behind = _view(_test("n1-1", "Passed", 1.0), _test("n1-2", "Running", 20.0))
    assert pending_goals(behind, allow_rescreening=True) == [
        "the end of n1-2 to be seen (n1 Qualified)"
    ]
    # A test created after the node's return is the next screening's, not a lag.
    later = _view(_test("n1-2", "Passed", 20.0), _test("n1-3", "Pending", 30.5))
    assert pending_goals(later, allow_rescreening=True) == []


def test_a_run_moves_while_its_tests_and_transitions_advance() -> None:
    """What the stall limit watches: a node's transition, a test's start or end, a new
    ticket; an unchanged view leaves the marks as they were."""
    before = _view(_test("n1-1", "Running", 1.0))
    assert progress_marks(before) == progress_marks(_view(_test("n1-1", "Running", 1.0)))
    ended = _view(_test("n1-1", "Passed", 1.0))
    assert progress_marks(ended) != progress_marks(before)
    moved = _view(_test("n1-1", "Running", 1.0))
    moved.transitions.append(Transition(t=2.0, node="n1", old="Testing", new="Qualified"))
    assert progress_marks(moved) != progress_marks(before)


class _StillRecorder:
    """A recorder whose fleet never moves: one node, never Qualified."""

    def __init__(self) -> None:
        self.view_ = _view()
        self.view_.nodes["n1"].state = "Testing"
        self.view_.nodes["n1"].exists = True

    def poll(self) -> None:
        pass

    def view(self) -> RecorderView:
        return self.view_


class _Quiet:
    alive = True

    def update(self, view: RecorderView, pending: list[str]) -> None:
        pass

    def note(self, text: str) -> None:
        pass


def test_a_run_where_nothing_moves_ends_at_the_stall_limit_not_the_timeout() -> None:
    cfg = DemoConfig(timeout_seconds=60, stall_seconds=0.3, poll_seconds=0.05)
    started = time.monotonic()
    ok, outcome = _watch(_StillRecorder(), cfg, _Quiet(), _Quiet(), None)  # type: ignore[arg-type]
    assert not ok and outcome.startswith("nothing moved for 0.3s"), outcome
    assert "n1" in outcome
    assert time.monotonic() - started < 10
