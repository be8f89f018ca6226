"""The demo's end: what still stands between a run and its end (``pending_goals``)."""

from __future__ import annotations

from sdcdev.sim.demo_watch import NodeTrack, RecorderView, pending_goals
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
