"""The budget as a plan: rounds per check from measured round costs (pure, no torch runs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sdcprobe.config import (
    BASELINE_ROUNDS,
    PlanError,
    catch_probability,
    plan_config,
    plan_rounds,
    rounds_of,
    with_rounds,
)
from sdcprobe.judge import judge, judge_check
from sdcprobe.result import Baseline, RunPlan, encode_for_termination, parse_result
from sdcprobe.runner import RunOptions, _Planner, _say_overrun
from sdcprobe.trace import CheckTrace, DeviceFacts, WorkerReport, trace_digest
from sdcprobe.worker import Calibration, Progress, RoundsPlan

#: Round costs measured on this 2-core machine at the default shapes (bench/probe).
MEASURED = {"compute": 0.10, "collective": 0.22, "memory": 0.15, "golden": 0.03}


def test_equal_rounds_fill_the_time_and_never_exceed_it() -> None:
    available = 50.0
    rounds = plan_rounds(MEASURED, available, BASELINE_ROUNDS)
    used = sum(MEASURED[c] * n for c, n in rounds.items())
    assert used <= available
    assert used >= 0.99 * available  # what is left is less than the cheapest round
    assert available - used < min(MEASURED.values())
    # The smallest count is as large as it can be: one more round of every check
    # at that count would not fit.
    low = min(rounds.values())
    assert sum(MEASURED[c] * max(low + 1, rounds[c]) for c in MEASURED) > available
    assert max(rounds.values()) - low <= 2 or rounds["golden"] > low  # only leftovers differ


def test_default_budget_reaches_099_at_p_01_for_every_check() -> None:
    # Default budget 60 s, of which ~8 s go to start-up and warm-up on a busy node.
    rounds = plan_rounds(MEASURED, 60.0 - 8.0 - 1.0, BASELINE_ROUNDS)
    for check, n in rounds.items():
        assert catch_probability(0.1, n) >= 0.99, (check, n)
    assert catch_probability(0.1, 44) >= 0.99 > catch_probability(0.1, 43)


def test_minimum_and_pinned_rounds_are_respected() -> None:
    rounds = plan_rounds(MEASURED, 2.5, BASELINE_ROUNDS)
    assert all(rounds[c] >= BASELINE_ROUNDS[c] for c in MEASURED)
    pinned = plan_rounds(MEASURED, 20.0, BASELINE_ROUNDS, fixed={"golden": 24})
    assert pinned["golden"] == 24 and pinned["compute"] > 24


def test_a_budget_below_the_smallest_complete_plan_is_an_error() -> None:
    with pytest.raises(PlanError, match="smallest complete plan"):
        plan_rounds(MEASURED, 0.5, BASELINE_ROUNDS)


def test_catch_probability() -> None:
    assert catch_probability(0.1, 0) == 0.0
    assert catch_probability(1.0, 1) == 1.0
    assert abs(catch_probability(0.1, 5) - (1 - 0.9**5)) < 1e-12


def test_round_counts_are_not_in_the_config_hash_but_shapes_and_seed_are() -> None:
    config = plan_config(60, "cpu")
    longer = with_rounds(config, {"compute": 500, "golden": 300, "memory": 40})
    assert rounds_of(longer) == {"compute": 500, "collective": 2, "memory": 40, "golden": 300}
    assert longer.config_hash() == config.config_hash()
    assert plan_config(60, "cpu", seed=7).config_hash() != config.config_hash()
    assert plan_config(60, "cpu", steps=6).config_hash() != config.config_hash()
    # Shapes are a function of the backend, not of the budget.
    assert plan_config(8, "cpu").config_hash() == config.config_hash()
    # On accelerators the memory check's size cap follows the budget (8 GiB per second
    # of work); the digest does not cover the size, so neither does the hash: an H200
    # baseline recorded at 120 s must match a screening at 900 s.
    short, long = plan_config(30, "cuda"), plan_config(900, "cuda")
    assert short.memory.max_mib < long.memory.max_mib
    assert short.config_hash() == long.config_hash()


def _steps(n: int, bad_from: int | None = None) -> list[dict[str, str]]:
    return [{"x": "ff" * 8 if bad_from is not None and i >= bad_from else f"{i:016x}"} for i in
            range(n)]  # fmt: skip


def _trace(n: int, bad_from: int | None = None) -> CheckTrace:
    steps = _steps(n, bad_from)
    return CheckTrace(digest=trace_digest(steps), steps=steps)


def test_digest_covers_the_baseline_rounds_and_devices_compare_everything() -> None:
    short = judge_check("compute", {0: _trace(5), 1: _trace(5)}, None, None, 2, 5)
    long = judge_check("compute", {0: _trace(40), 1: _trace(40)}, None, None, 2, 40)
    assert short.verdict == long.verdict == "pass"
    assert short.digest == long.digest == trace_digest(_steps(2))
    late = judge_check("compute", {0: _trace(40), 1: _trace(40, bad_from=30)}, None, None, 2, 40)
    assert late.verdict == "fail" and late.first_divergent_step == 30


def test_fewer_rounds_than_planned_is_never_a_pass() -> None:
    partial = judge_check("golden", {0: _trace(40), 1: _trace(12)}, None, None, 8, 40)
    assert partial.verdict == "inconclusive" and "ran 12 of 40 planned rounds" in partial.reason


FACTS = DeviceFacts(backend="cpu", device_model="cpu: test", torch="2.9.0", cpu_isa="x", threads=1)


def _reports(n: int) -> dict[int, WorkerReport | None]:
    return {r: WorkerReport(rank=r, facts=FACTS, checks={"compute": _trace(n)}) for r in range(2)}


def test_baseline_of_another_seed_is_inconclusive_with_the_reason() -> None:
    config = plan_config(8, "cpu", seed=3)
    run = judge(["compute"], _reports(4), config, None, False, 1.0)
    assert run.verdict == "pass" and run.seed == 3
    assert run.fingerprint is not None
    other = Baseline(fingerprint=run.fingerprint, seed=4, digests={"compute": "ab" * 32})
    result = judge(["compute"], _reports(4), config, other, False, 1.0)
    assert result.verdict == "inconclusive"
    assert "seed 4" in result.reason and "seed 3" in result.reason


def test_a_plan_error_makes_the_run_inconclusive() -> None:
    config = plan_config(8, "cpu")
    plan = RunPlan(budget_s=3, startup_s=2.5, planned_s=2.5, error="budget 3s is too small")
    reports: dict[int, WorkerReport | None] = {
        r: WorkerReport(rank=r, facts=FACTS, error="plan: budget 3s is too small") for r in range(2)
    }
    result = judge(["compute"], reports, config, None, False, 3.0, plan=plan)
    assert result.verdict == "inconclusive" and "too small" in result.reason


def test_result_with_plan_fits_the_termination_message() -> None:
    config = plan_config(60, "cpu")
    checks = ["compute", "collective", "memory", "golden"]
    plan = RunPlan(
        budget_s=60,
        startup_s=7.5,
        planned_s=59.1,
        rounds=dict.fromkeys(checks, 123456),
        run=dict.fromkeys(checks, 123456),
        round_ms=dict.fromkeys(checks, 123.456),
        catch={c: [0.7101, 0.9999, 1.0] for c in checks},
    )
    reports: dict[int, WorkerReport | None] = {
        r: WorkerReport(
            rank=r,
            facts=FACTS,
            checks={
                c: CheckTrace(
                    digest=trace_digest(_steps(4)),
                    steps=_steps(4),
                    metrics={f"metric_{i}": "x" * 40 for i in range(30)},
                )
                for c in checks
            },
        )
        for r in range(2)
    }
    result = judge(checks, reports, config, None, False, 59.0, plan=plan)
    text = encode_for_termination(result)
    assert len(text.encode()) <= 4096
    back = parse_result(text)
    assert back.plan is not None and back.plan.rounds == plan.rounds and back.seed == 0


def _planner(tmp_path: Path, budget: float) -> _Planner:
    import time

    opts = RunOptions(device="cpu", budget=budget, started=time.perf_counter())
    planner = _Planner(opts, plan_config(budget, "cpu"), str(tmp_path), 2)
    cals = [Calibration(rank=r, world=2, round_s=dict(MEASURED)) for r in range(2)]
    planner.decide(cals)
    return planner


def _loaded_planner(tmp_path: Path, **limits: float) -> _Planner:
    """A planner for an 8 s budget on a node whose rounds cost five times the measured
    ones (two busy cores shared with other work): the smallest plan needs more than 8 s."""
    import time

    opts = RunOptions(device="cpu", budget=8.0, started=time.perf_counter(), **limits)
    planner = _Planner(opts, plan_config(8.0, "cpu"), str(tmp_path), 2)
    slow = {c: 5 * s for c, s in MEASURED.items()}
    planner.decide([Calibration(rank=r, world=2, round_s=dict(slow)) for r in range(2)])
    return planner


def test_a_loaded_node_runs_its_smallest_plan_over_budget(tmp_path: Path) -> None:
    planner = _loaded_planner(tmp_path)
    assert planner.plan is not None and planner.plan.error is None
    assert planner.answer is not None and planner.answer.abort is None
    assert planner.rounds == BASELINE_ROUNDS
    assert planner.plan.planned_s > 8.0  # the plan says it overruns


@pytest.mark.parametrize("limits", [{"timeout": 9.0}, {"deadline": 18.0}])
def test_a_smallest_plan_past_the_hard_limit_is_refused(
    tmp_path: Path, limits: dict[str, float]
) -> None:
    """--timeout 9, or a Job deadline of 18 s (workers stop 10 s before it): the
    smallest plan's 9.5 s of work cannot end in time, so no check starts."""
    planner = _loaded_planner(tmp_path, **limits)
    assert planner.plan is not None and planner.plan.error is not None
    assert planner.answer is not None and planner.answer.abort is not None
    error = planner.plan.error
    assert "budget 8s is too small" in error and "of work alone" in error, error
    assert "cannot end before the workers' hard limit of" in error, error
    assert planner.plan.rounds == {}


def _progress(check: str, wall_s: float, rounds: int) -> list[Progress]:
    return [Progress(rank=r, check=check, wall_s=wall_s, rounds=rounds) for r in range(2)]


def test_running_late_every_remaining_check_gives_up_rounds_alike(tmp_path: Path) -> None:
    planner = _planner(tmp_path, 30.0)
    first = dict(planner.rounds)
    assert planner.plan is not None and planner.plan.planned_s <= 30.0
    assert max(first.values()) - min(first.values()) <= 5  # leftovers only
    checks = list(MEASURED)
    # compute took twice its estimate: the node got slower.
    slow = 2 * 1.03 * MEASURED["compute"] * first["compute"]
    time_passed = slow  # pretend the clock moved by that much
    planner.started -= time_passed
    planner.replan(1, checks, _progress("compute", slow, first["compute"]))
    later = planner.rounds
    assert later["compute"] == first["compute"]
    assert all(later[c] < first[c] for c in checks[1:])
    assert abs(later["collective"] - later["memory"]) <= 1
    stage = RoundsPlan.model_validate_json((tmp_path / "rounds-1.json").read_text())
    assert stage.rounds == {c: later[c] for c in checks[1:]}


def test_running_early_the_time_won_goes_to_the_last_check(tmp_path: Path) -> None:
    planner = _planner(tmp_path, 30.0)
    first = dict(planner.rounds)
    checks = list(MEASURED)
    fast = 0.5 * 1.03 * MEASURED["compute"] * first["compute"]
    planner.started -= fast
    planner.replan(1, checks, _progress("compute", fast, first["compute"]))
    later = planner.rounds
    assert later["collective"] == first["collective"] and later["memory"] == first["memory"]
    assert later["golden"] > first["golden"]


def test_the_plan_says_where_the_start_up_went(tmp_path: Path) -> None:
    """``startup_parts``: per part the slowest device's seconds; ``launch`` from the
    probe's start to the worker's entry on the clock every process shares."""
    import time

    started = time.perf_counter() - 5.0  # the probe started five seconds ago
    opts = RunOptions(device="cpu", budget=30.0, started=started)
    planner = _Planner(opts, plan_config(30.0, "cpu"), str(tmp_path), 2)
    entered = time.monotonic() - 4.0  # ...and the slower worker came up one second later
    cals = [
        Calibration(
            rank=r,
            world=2,
            round_s=dict(MEASURED),
            entered_at=entered - r,
            phases={"import": 2.0 + r, "group": 0.1, "peaks": 1.0, "warmup": 0.5 - 0.1 * r},
        )
        for r in range(2)
    ]
    planner.decide(cals)
    assert planner.plan is not None
    parts = planner.plan.startup_parts
    assert parts["import"] == 3.0 and parts["warmup"] == 0.5 and parts["peaks"] == 1.0
    assert 0.9 <= parts["launch"] <= 1.2, parts


def test_a_run_over_its_budget_says_why() -> None:
    config = plan_config(15, "cpu")
    minimum = dict(BASELINE_ROUNDS)
    parts = {"launch": 0.7, "import": 9.5, "peaks": 2.0, "warmup": 2.1}
    plan = RunPlan(
        budget_s=15,
        startup_s=14.3,
        planned_s=19.2,
        rounds=minimum,
        run=minimum,
        startup_parts=parts,
    )
    reports: dict[int, WorkerReport | None] = {
        r: WorkerReport(
            rank=r,
            facts=FACTS,
            checks={"compute": CheckTrace(digest=trace_digest(_steps(2)), steps=_steps(2))},
        )
        for r in range(2)
    }
    over = judge(["compute"], reports, config, None, False, 20.7, plan=plan)
    said = _say_overrun(over)
    assert said.verdict == over.verdict == "pass"
    assert said.plan is not None and said.plan.overrun is not None
    for text in (said.reason, said.plan.overrun):
        assert "over budget: 20.7s against 15s" in text and "start-up took 14.3s" in text
        assert "largest part import 9.5s" in text
        assert "4.9s of work at the round costs measured" in text
    assert said.reason.startswith(over.reason)
    within = judge(["compute"], reports, config, None, False, 14.9, plan=plan)
    assert _say_overrun(within) == within  # within its budget: nothing to say
    assert parse_result(encode_for_termination(said)).plan is not None
