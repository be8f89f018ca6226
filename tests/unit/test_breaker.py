"""The circuit breaker: trips on a storm, stays open until reset, rebuilt from samples."""

from __future__ import annotations

import datetime as dt

from hypothesis import given, settings
from hypothesis import strategies as st

from sdcguard.api import BreakerState, CircuitBreaker
from sdcguard.domain.breaker import (
    Reset,
    Sample,
    Sweep,
    advance,
    breaker_status,
    evaluate,
    observe_reset,
    prune,
    samples_from_status,
)
from tests.unit.factories import NOW

CONFIG = CircuitBreaker(window="1h", min_samples=5, max_failure_fraction=0.5)
MIN = dt.timedelta(minutes=1)


def samples(*failed: bool, start: dt.datetime = NOW - 30 * MIN) -> list[Sample]:
    return [Sample(start + i * MIN, f, f"n{i}", f"t{i}") for i, f in enumerate(failed)]


def test_three_of_five_failing_trips() -> None:
    view = evaluate(samples(True, False, True, False, True), CONFIG, NOW)
    assert view.open and view.tripped_at == NOW - 26 * MIN
    assert view.explain().startswith(
        "3 of 5 nodes screened had confirmed failures in the last 1h (limit 50%)"
    )
    assert "sdcguard.dev/reset-breaker" in view.explain()


def test_passes_that_complete_the_minimum_trip_it() -> None:
    """Three failures first, then two passes: the fifth sample makes the window count."""
    view = evaluate(samples(True, True, True, False, False), CONFIG, NOW)
    assert view.open and view.tripped_at == NOW - 26 * MIN
    assert view.explain().startswith("3 of 5 nodes screened had confirmed failures")


def test_half_is_not_more_than_half() -> None:
    view = evaluate(samples(True, False, True, False, False, False), CONFIG, NOW)
    assert not view.open
    assert view.explain() == (
        "2 of 6 nodes screened had confirmed failures in the last 1h (limit 50%)"
    )


def test_too_few_samples_never_trip() -> None:
    view = evaluate(samples(True, True, True, True), CONFIG, NOW)
    assert not view.open
    assert "at least 5 nodes screened" in view.explain()


def test_failures_spread_beyond_the_window_do_not_trip() -> None:
    spread = [Sample(NOW - i * 40 * MIN, i % 2 == 0, f"n{i}") for i in range(6)]
    assert not evaluate(spread, CONFIG, NOW).open


def test_open_breaker_stays_open_until_reset() -> None:
    storm = samples(True, True, True, True, True, start=NOW - 30 * MIN)
    view, status = advance(None, CONFIG, NOW, new_samples=storm)
    assert view.open and status.state == BreakerState.OPEN
    later = NOW + 5 * dt.timedelta(hours=1)
    view, status = advance(status, CONFIG, later)
    assert view.open, "latched: a person looks before quarantines resume"
    assert status.tripped_at == NOW - 26 * MIN and status.window_failures == 5
    view, status = advance(status, CONFIG, later, reset_annotation="oncall-1")
    assert not view.open and status.reset_marker == "oncall-1" and status.reset_at == later
    assert status.samples == [], "samples before the reset no longer count"
    view, status = advance(status, CONFIG, later + MIN, reset_annotation="oncall-1")
    assert not view.open and status.reset_at == later, "same value: no new reset"


def test_reset_marker() -> None:
    reset = observe_reset("2025-06-01-oncall", Reset(None, None), NOW)
    assert reset == Reset("2025-06-01-oncall", NOW)
    assert observe_reset("2025-06-01-oncall", reset, NOW + MIN) == reset
    assert observe_reset(None, reset, NOW + MIN) == reset


def test_status_round_trip_rebuilds_the_same_state() -> None:
    recorded = samples(True, False, True, False, True)
    view = evaluate(recorded, CONFIG, NOW)
    kept = prune(recorded, CONFIG, NOW, tripped_at=view.tripped_at)
    status = breaker_status(view, kept, Reset(None, None))
    assert status.state == BreakerState.OPEN and status.window_failures == 3
    assert evaluate(samples_from_status(status), CONFIG, NOW, tripped_at=status.tripped_at) == view


times = st.integers(min_value=0, max_value=6 * 60).map(lambda m: NOW - m * MIN)


nodes = st.integers(min_value=0, max_value=7).map(lambda i: f"n{i}")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(times, st.booleans(), nodes), max_size=40), st.sampled_from([1, 2]))
def test_pruning_never_changes_the_state(
    raw: list[tuple[dt.datetime, bool, str]], confirm: int
) -> None:
    recorded = [Sample(at, failed, node) for at, failed, node in raw]
    view = evaluate(recorded, CONFIG, NOW, confirm=confirm)
    kept = prune(recorded, CONFIG, NOW, tripped_at=view.tripped_at)
    assert evaluate(kept, CONFIG, NOW, confirm=confirm) == view
    assert all(s.at > NOW - 2 * dt.timedelta(hours=1) for s in kept)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 300), st.booleans(), nodes), max_size=40))
def test_stepping_through_time_latches_the_first_trip(raw: list[tuple[int, bool, str]]) -> None:
    """Recording samples as they come, pass after pass, opens the breaker at the first
    failure whose window trips, and it stays open."""
    start = NOW - 300 * MIN
    events = sorted((start + m * MIN, failed, node) for m, failed, node in raw)
    status = None
    first_trip = None
    for at, failed, node in events:
        view, status = advance(status, CONFIG, at, new_samples=[Sample(at, failed, node)])
        if view.open and first_trip is None:
            first_trip = view.tripped_at
        assert view.open == (first_trip is not None)
        assert view.tripped_at == first_trip


def _counts(window: list[Sample], confirm: int) -> tuple[int, int]:
    """(distinct nodes screened, nodes with at least ``confirm`` SDC verdicts)."""
    nodes = {s.node for s in window}
    failed = {n for n in nodes if sum(1 for s in window if s.node == n and s.failed) >= confirm}
    return len(nodes), len(failed)


def _reference(
    ordered: list[Sample], config: CircuitBreaker, now: dt.datetime, confirm: int
) -> Sample | None:
    """The first recent screening whose window trips, window by window (quadratic)."""
    span = dt.timedelta(hours=1)
    for sample in ordered:
        if sample.at <= now - span:
            continue
        window = [s for s in ordered if sample.at - span < s.at <= sample.at]
        count, failures = _counts(window, confirm)
        if count >= config.min_samples and failures / count > config.max_failure_fraction:
            return sample
    return None


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 150), st.booleans(), nodes), max_size=60),
    st.sampled_from([1, 2]),
)
def test_one_sweep_finds_the_trip_every_window_would(
    raw: list[tuple[int, bool, str]], confirm: int
) -> None:
    """Duplicate times included: the sweep's windows are the windows of the definition."""
    ordered = sorted((Sample(NOW - m * MIN, f, n) for m, f, n in raw), key=lambda s: s.at)
    view = evaluate(ordered, CONFIG, NOW, confirm=confirm)
    first = _reference(ordered, CONFIG, NOW, confirm)
    assert view.tripped_at == (first.at if first else None)
    if first is not None:
        window = [s for s in ordered if first.at - dt.timedelta(hours=1) < s.at <= first.at]
        assert (view.samples, view.failures) == _counts(window, confirm)


def test_re_runs_and_re_tests_of_two_bad_nodes_do_not_trip_it() -> None:
    """Five nodes, two of them bad: each confirmed (two SDC verdicts) and re-tested again
    and again. Counted by screening that was 10 of 13 and tripped a 50% breaker; counted
    by node it is 2 of 5."""
    bad = [Sample(NOW - (30 - i) * MIN, True, f"bad{i % 2}", f"t{i}") for i in range(10)]
    good = [Sample(NOW - 5 * MIN, False, f"ok{i}", f"p{i}") for i in range(3)]
    view = evaluate([*bad, *good], CONFIG, NOW, confirm=2)
    assert not view.open and (view.failures, view.samples) == (2, 5)
    third = [Sample(NOW - 2 * MIN, True, "ok0", "x1"), Sample(NOW - MIN, True, "ok0", "x2")]
    assert evaluate([*bad, *good, *third], CONFIG, NOW, confirm=2).open, "3 of 5 trips"


def test_an_unconfirmed_failure_is_not_a_failed_node() -> None:
    """One SDC verdict that a re-run did not reproduce (flaky) counts the node as screened."""
    flaky = [Sample(NOW - 10 * MIN, True, f"n{i}") for i in range(3)]
    rest = [Sample(NOW - 5 * MIN, False, f"m{i}") for i in range(2)]
    assert not evaluate([*flaky, *rest], CONFIG, NOW, confirm=2).open
    assert evaluate([*flaky, *rest], CONFIG, NOW, confirm=1).open, "no re-runs: one confirms"


def test_breaker_over_thousands_of_screenings_is_quick() -> None:
    many = [
        Sample(NOW - dt.timedelta(seconds=i), i % 97 == 0, f"n{i % 5000}") for i in range(20000)
    ]
    view = evaluate(many, CONFIG, NOW)
    assert not view.open and view.samples == 3600


def test_failing_devices_are_counted_once_each_and_their_nodes_once() -> None:
    at = NOW - 30 * MIN
    window = [
        # Two bad GPUs on one node; the confirmation re-run names the same two.
        Sample(at, True, "n0", "t0", ("GPU-A", "GPU-B")),
        Sample(at + MIN, True, "n0", "t1", ("gpu-a", "GPU-B")),
        Sample(at + 2 * MIN, True, "n1", "t2", ("GPU-C",)),
        Sample(at + 3 * MIN, True, "n1", "t3", ("GPU-C",)),
        Sample(at + 4 * MIN, True, "n2", "t4", ("GPU-D",)),  # one SDC verdict: unconfirmed
        *[Sample(at + (5 + i) * MIN, False, f"ok{i}", f"p{i}") for i in range(3)],
    ]
    view = evaluate(window, CONFIG, NOW, confirm=2)
    assert (view.samples, view.failures, view.failed_devices) == (6, 2, 3)
    assert not view.open, "2 of 6 nodes: the trip counts nodes, not devices"
    assert "2 of 6 nodes screened had confirmed failures (3 device(s) named)" in view.explain()
    status = breaker_status(view, window, Reset(None, None))
    assert status.window_failed_devices == 3
    assert samples_from_status(status)[0].devices == ("GPU-A", "GPU-B"), "kept in the status"


def test_devices_leave_the_count_with_their_samples() -> None:
    old = [Sample(NOW - 90 * MIN, True, "n0", "t0", ("GPU-A",))]
    recent = [Sample(NOW - 5 * MIN, True, "n0", "t1", ("GPU-B",))]
    assert evaluate(old + recent, CONFIG, NOW).failed_devices == 1


# The sweep: evaluate's answers, kept current as screenings finish ---------------------

CONFIGS = [CONFIG, CircuitBreaker(window="30m", min_samples=3, max_failure_fraction=0.3)]
step = st.one_of(
    # add (or change) the sample of test k: minutes before NOW + 100, failed, node
    st.tuples(st.just("add"), st.integers(0, 30), st.integers(-20, 200), st.booleans(), nodes),
    st.tuples(st.just("remove"), st.integers(0, 30)),
    # a look: minutes after NOW (mostly forward), a stored trip, a reset, confirm, config
    st.tuples(
        st.just("look"),
        st.integers(0, 40),
        st.one_of(st.none(), st.integers(-100, 100)),
        st.one_of(st.none(), st.sampled_from([-90, -10, 30])),
        st.sampled_from([1, 2]),
        st.sampled_from([0, 0, 0, 1]),
    ),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(step, max_size=80))
def test_the_sweep_answers_as_evaluate_does(steps: list[tuple[object, ...]]) -> None:
    """Whatever order samples come, go and are looked at in: the same view, and what is
    kept evaluates the same (and is what prune keeps)."""
    sweep, samples = Sweep(), {}
    clock = 0
    for op in steps:
        if op[0] == "add":
            _, k, minute, failed, node = op
            sample = Sample(NOW + minute * MIN, bool(failed), str(node), f"t{k}")
            samples[f"t{k}"] = sample
            sweep.add(f"t{k}", sample)
        elif op[0] == "remove":
            samples.pop(f"t{op[1]}", None)
            sweep.remove(f"t{op[1]}")
        else:
            _, forward, trip, reset, confirm, which = op
            clock += forward if forward < 35 else -(forward - 34)  # now and then, back in time
            now = NOW + clock * MIN
            tripped = None if trip is None else NOW + int(trip) * MIN  # type: ignore[call-overload]
            reset_at = None if reset is None else NOW + int(reset) * MIN  # type: ignore[call-overload]
            config = CONFIGS[int(which)]  # type: ignore[call-overload]
            view = sweep.evaluate(config, now, reset_at, tripped, int(confirm))  # type: ignore[call-overload]
            want = evaluate(samples.values(), config, now, reset_at, tripped, int(confirm))  # type: ignore[call-overload]
            assert view == want
            kept = sweep.kept(config, now, reset_at, view.tripped_at)
            pruned = prune(samples.values(), config, now, reset_at, view.tripped_at)
            assert sorted(kept, key=repr) == sorted(pruned, key=repr)
    assert len(sweep) == len(samples)


def test_screenings_that_finish_in_order_are_swept_once() -> None:
    """The fleet's case: each probe's end adds one later sample, and a look sweeps just
    that one (no sweep from the start, whatever the window holds)."""
    sweep, added = Sweep(), []
    start = NOW - 50 * MIN
    for i in range(3000):
        at = start + dt.timedelta(seconds=i)
        added.append(Sample(at, i % 97 == 0, f"n{i}", f"t{i}"))
        sweep.add(f"t{i}", added[-1])
        view = sweep.evaluate(CONFIG, at, confirm=1)
    assert not view.open and view.samples == 3000
    assert sweep.rebuilds == 1, "swept from the start only at the first look"
    late = Sample(start, False, "late", "late")
    sweep.add("late", late)
    assert sweep.evaluate(CONFIG, at) == evaluate([*added, late], CONFIG, at)
    assert sweep.rebuilds == 2, "a sample earlier than those swept starts again"


def test_a_storm_trips_the_sweep_at_its_first_tripping_window_and_it_latches() -> None:
    sweep = Sweep()
    status = None
    for i, failed in enumerate((False, True, True, True, False, True)):
        at = NOW + i * MIN
        sweep.add(f"t{i}", Sample(at, failed, f"n{i}", f"t{i}"))
        view, status, _ = sweep.advance(status, CONFIG, at)
    assert view.open and view.tripped_at == NOW + 4 * MIN, "3 of 5 at the fifth"
    later = NOW + 3 * dt.timedelta(hours=1)
    view, status, _ = sweep.advance(status, CONFIG, later)
    assert view.open and view.tripped_at == NOW + 4 * MIN and view.failures == 3
    view, status, reset = sweep.advance(status, CONFIG, later, reset_annotation="oncall")
    assert not view.open and reset.at == later and view.samples == 0
