"""The risk order and the fleet figures: pure, no cluster."""

from __future__ import annotations

import datetime as dt
import math
import random

import pytest

from sdcguard.domain.fleetstats import (
    FaultClass,
    Incident,
    Screening,
    exposure_estimate,
    failures_by_type,
    onset_to_quarantine,
    past_recertification,
    type_histories,
)
from sdcguard.domain.risk import (
    Basis,
    RiskInputs,
    RiskOrder,
    TypeHistory,
    rank_due_nodes,
    risk_score,
    todays_key,
    wilson_interval,
)

NOW = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)
H = dt.timedelta(hours=1)


def node(name: str, *, hours: float = 100, kind: str = "a", **extra: object) -> RiskInputs:
    return RiskInputs(
        node=name,
        due_since=NOW - H,
        qualified_at=NOW - hours * H,
        last_pass_at=NOW - hours * H,
        last_pass_catch=0.99,
        hardware_type=kind,
        **extra,  # type: ignore[arg-type]
    )


HISTORY = {
    "a": TypeHistory(screenings=10_000, failures=2, service_hours=1_000_000),
    "c": TypeHistory(screenings=2_000, failures=40, service_hours=200_000),
}


def test_no_history_falls_back_to_todays_order_and_says_so() -> None:
    nodes = [node("n2", hours=10), node("n1", hours=300), node("n3", hours=50)]
    ranked = rank_due_nodes(nodes, {}, NOW)
    assert [r.inputs.node for r in ranked] == [n.node for n in sorted(nodes, key=todays_key)]
    assert [r.inputs.node for r in ranked] == ["n1", "n3", "n2"]
    assert {r.basis for r in ranked} == {Basis.TODAYS_ORDER}
    assert all("no screening history" in r.reason for r in ranked)


def test_a_type_that_fails_more_goes_first() -> None:
    ranked = rank_due_nodes(
        [node("old-a", hours=300), node("young-c", hours=100, kind="c")], HISTORY, NOW
    )
    assert [r.inputs.node for r in ranked] == ["young-c", "old-a"]
    assert ranked[0].basis is Basis.RISK
    assert ranked[0].score is not None and ranked[0].score.chance > ranked[1].score.chance  # type: ignore[union-attr]


def test_repairs_reports_and_time_each_raise_the_chance() -> None:
    base = risk_score(node("x"), HISTORY["a"], NOW)
    assert risk_score(node("x", repairs=1), HISTORY["a"], NOW).chance > base.chance
    assert risk_score(node("x", reports=1), HISTORY["a"], NOW).chance > base.chance
    assert risk_score(node("x", hours=400), HISTORY["a"], NOW).chance > base.chance


def test_an_unconfirmed_report_outweighs_a_long_wait() -> None:
    """A fault that shows in spikes can be silent through a whole re-test; the job that
    saw it is evidence, so a node with such a report goes before an old quiet one."""
    ranked = rank_due_nodes(
        [node("quiet", hours=2000), node("reported", hours=1, reports=1)], HISTORY, NOW
    )
    assert ranked[0].inputs.node == "reported"
    assert "reports believed 0.50" in ranked[0].reason


def test_a_weak_pass_earns_less_credit() -> None:
    strong = risk_score(node("x"), HISTORY["c"], NOW)
    weak = risk_score(
        RiskInputs("x", NOW, last_pass_at=NOW - 100 * H, last_pass_catch=0.2, hardware_type="c"),
        HISTORY["c"],
        NOW,
    )
    assert weak.missed > strong.missed and weak.chance > strong.chance


def test_the_reason_shows_every_input() -> None:
    ranked = rank_due_nodes([node("x", kind="c", repairs=2, reports=1)], HISTORY, NOW)
    reason = ranked[0].reason
    assert "40/2000 failed" in reason and "x3 repairs" in reason and "x5 reports" in reason
    assert "100h ago" in reason


def test_tiers_of_todays_order_stay_ahead() -> None:
    suspect = RiskInputs("suspect", NOW, tier=2)
    ranked = rank_due_nodes([node("risky", kind="c", repairs=5), suspect], HISTORY, NOW)
    assert ranked[0].inputs.node == "suspect" and ranked[0].basis is Basis.TIER


def test_one_failure_in_a_thousand_screenings_has_a_wide_interval() -> None:
    low, high = wilson_interval(1, 1000)
    assert low < 0.0003 and high > 0.005  # more than a factor of 20 apart
    (row,) = failures_by_type([Screening(f"n{i}", "h", NOW, failed=i == 0) for i in range(1000)])
    assert (row.failures, row.screenings) == (1, 1000)
    assert row.low == pytest.approx(low) and row.high == pytest.approx(high)
    assert "1 of 1000" in row.explain()
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_a_clock_behind_the_last_pass_counts_no_onset() -> None:
    score = risk_score(node("x", hours=-50), HISTORY["a"], NOW)
    assert score.hours_since_pass == 0 and score.onset == 0


def _worst_wait(order: RiskOrder, jump_hours: float, risky: float = 0.8) -> tuple[int, int]:
    """One screening a pass; risky nodes arrive most passes, a low-risk one every tenth
    (0.9 a pass in all with ``risky`` 0.8); the clock jumps by ``jump_hours`` either way every pass.
    Returns the longest wait in passes (of those started, and of those still due) and
    the most nodes due at once."""
    rng = random.Random(4)
    due: dict[str, RiskInputs] = {}
    waited: dict[str, int] = {}
    worst = peak = 0
    clock = NOW
    for step in range(300):
        clock += dt.timedelta(hours=jump_hours * rng.choice((-1, 1)) + 0.25)
        arrivals = [f"a{step}"] if step % 10 == 0 else []
        arrivals += [f"c{step}"] if rng.random() < risky else []
        for fresh in arrivals:
            kind = fresh[0]
            due[fresh] = RiskInputs(fresh, clock, last_pass_at=clock - 300 * H, hardware_type=kind)
            waited[fresh] = 0
        peak = max(peak, len(due))
        if not due:
            continue
        ranked = rank_due_nodes(list(due.values()), HISTORY, clock, order)
        chosen = ranked[0].inputs.node
        worst = max(worst, waited.pop(chosen))
        del due[chosen]
        for name, inputs in due.items():
            waited[name] += 1
            due[name] = RiskInputs(
                inputs.node,
                inputs.due_since,
                last_pass_at=inputs.last_pass_at,
                hardware_type=inputs.hardware_type,
                overtaken=inputs.overtaken + 1,
            )
    return max(worst, *waited.values(), 0), peak


@pytest.mark.parametrize("jump_hours", [0.0, 500.0, -500.0])
def test_clocks_that_jump_never_starve_a_due_node(jump_hours: float) -> None:
    """Within the stated bound: overtaken at most max_overtaken times, then behind at
    most the nodes overdue before it."""
    order = RiskOrder(max_overtaken=20)
    worst, peak = _worst_wait(order, jump_hours)
    assert worst <= order.max_overtaken + peak


def test_without_the_bound_low_risk_nodes_starve() -> None:
    """More arrivals than screenings and no bound: a low-risk node waits to the end (the
    test above has teeth); with the bound it waits its turn."""
    bounded, peak = _worst_wait(RiskOrder(max_overtaken=20), 0.0, risky=1.0)
    unbounded, _ = _worst_wait(RiskOrder(max_overtaken=10**9), 0.0, risky=1.0)
    assert bounded <= 20 + peak
    assert unbounded > 250


def test_overdue_nodes_go_first_most_overtaken_first() -> None:
    order = RiskOrder(max_overtaken=3)
    ranked = rank_due_nodes(
        [node("risky", kind="c"), node("old", overtaken=3), node("older", overtaken=9)],
        HISTORY,
        NOW,
        order,
    )
    assert [r.inputs.node for r in ranked] == ["older", "old", "risky"]
    assert ranked[0].basis is Basis.OVERDUE and "9 routine screenings" in ranked[0].reason


def test_type_histories_feed_the_order() -> None:
    screenings = [Screening("n", "c", NOW, failed=i < 5) for i in range(50)]
    history = type_histories(screenings, {"c": 5000.0})
    assert history["c"] == TypeHistory(50, 5, 5000.0)


def test_onset_to_quarantine_is_bracketed() -> None:
    summary = onset_to_quarantine(
        [
            Incident("a", NOW, NOW - 2 * H, NOW - 50 * H),
            Incident("b", NOW, NOW - 4 * H, None),
        ]
    )
    assert summary.incidents == 2 and summary.bounded == 1
    assert summary.median_low_hours == 3 and summary.median_high_hours == 50
    assert "between 3.0h and 50.0h" in summary.explain()
    assert onset_to_quarantine([]).explain() == "no quarantine yet"


def test_share_past_recertification() -> None:
    share = past_recertification([NOW - 200 * H, NOW - H, None], dt.timedelta(hours=168), NOW)
    assert (share.count, share.of) == (2, 3) and share.fraction == pytest.approx(2 / 3)
    assert past_recertification([], dt.timedelta(hours=1), NOW).fraction == 0.0


def test_exposure_estimate() -> None:
    # Screenings every 100h that always catch: half an interval, all of it busy.
    est = exposure_estimate(100, 1.0, [FaultClass(1.0, 1.0)])
    assert est.hours == pytest.approx(50) and est.screening_hours == pytest.approx(50)
    # Reports shorten it; a fault screenings rarely see lengthens it.
    assert exposure_estimate(100, 1.0, [FaultClass(1.0, 1.0, 0.5)]).hours < 2
    assert exposure_estimate(100, 1.0, [FaultClass(1.0, 0.1)]).hours == pytest.approx(950)
    assert exposure_estimate(100, 1.0, []).hours == 0
    assert math.isfinite(exposure_estimate(100, 0.5, [FaultClass(1.0, 0.0)]).hours)
