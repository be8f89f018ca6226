"""The screening's own data seed: fresh data in every round a baseline does not cover,
the shared seed in those it does (so consensus baselines still form)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sdcprobe.backends import setup_backend
from sdcprobe.checks.compute import run_compute
from sdcprobe.checks.golden import golden_check
from sdcprobe.checks.memory import run_memory
from sdcprobe.config import BASELINE_ROUNDS, plan_config, round_seed, with_rounds
from sdcprobe.faults import Injector
from sdcprobe.instrument import Instrumentation
from sdcprobe.trace import CheckTrace
from tests.probe.conftest import FAST, run_cli

CPU = setup_backend("cpu", 0, 1)


def test_round_seed_keeps_the_baseline_rounds_on_the_shared_seed() -> None:
    assert [round_seed(5, 9, r, 2) for r in range(4)] == [5, 5, 9, 9]
    assert [round_seed(5, None, r, 2) for r in range(4)] == [5, 5, 5, 5]


def test_data_seed_is_not_part_of_the_fingerprint() -> None:
    plain = plan_config(60, "cpu", seed=3)
    assert plan_config(60, "cpu", seed=3, data_seed=11).config_hash() == plain.config_hash()
    assert plan_config(60, "cpu", seed=3, data_seed=3).config_hash() == plain.config_hash()
    assert plan_config(60, "cpu", seed=4, data_seed=11).config_hash() != plain.config_hash()


def _traces(check: str, data_seeds: tuple[int | None, ...]) -> list[CheckTrace]:
    rounds = {"compute": 4, "golden": 18}
    out = []
    for data in data_seeds:
        cfg = with_rounds(plan_config(60, "cpu", seed=1, data_seed=data, memory_mib=1), rounds)
        base = cfg.baseline_rounds[check]
        ins = Instrumentation(CPU, Injector(None, 0))
        if check == "compute":
            trace = run_compute(cfg.compute, cfg.seed, ins, None, None, data, base)
        else:
            trace = golden_check(cfg.golden, CPU, Injector(None, 0))
        assert trace.error is None and not trace.evidence, trace.evidence
        out.append(trace)
    return out


@pytest.mark.parametrize("check", ["compute", "golden"])
def test_rounds_after_the_baseline_rounds_draw_the_screenings_data(check: str) -> None:
    """Same baseline digest (the baseline rounds), other data in every later round;
    no data seed at all is the shared seed in every round, as before."""
    base = BASELINE_ROUNDS[check]
    none, same, seven, eight = _traces(check, (None, 1, 7, 8))
    assert none.steps == same.steps  # --data-seed equal to --seed: the plain run
    for other in (seven, eight):
        assert other.steps[:base] == none.steps[:base]
    assert len(none.steps) > base
    assert all(seven.steps[i] != none.steps[i] for i in range(base, len(none.steps)))
    assert all(seven.steps[i] != eight.steps[i] for i in range(base, len(none.steps)))


def test_memory_random_pattern_of_later_cycles_is_the_screenings() -> None:
    rounds = {"memory": 10}
    steps = []
    for data in (None, 7):
        cfg = with_rounds(plan_config(60, "cpu", seed=1, data_seed=data, memory_mib=1), rounds)
        trace = run_memory(cfg.memory, cfg.seed, Instrumentation(CPU, Injector(None, 0)),
                           None, None, data, cfg.baseline_rounds["memory"])  # fmt: skip
        steps.append(trace.steps)
    plain, fresh = steps
    assert plain[:9] == fresh[:9]  # first cycle (baseline) and the fixed patterns after it
    assert plain[9] != fresh[9]  # the second cycle's random pattern


def test_run_records_both_seeds_and_devices_agree_on_fresh_data(tmp_path: Path) -> None:
    """End to end on two CPU replicas: the data seed is reported, the fingerprint and
    the baseline-covered digests stay those of the shared seed, every check passes."""
    runs = [
        run_cli(
            ["run", "--device", "cpu", "--budget", "12", "--seed", "3", "--steps", "20", *extra],
            tmp_path,
        )
        for extra in ([], ["--data-seed", "12345"])
    ]
    for run in runs:
        assert run.rc == 0, run.stderr[-3000:]
    plain, fresh = (r.doc for r in runs)
    assert plain["seed"] == 3 and plain["data_seed"] == 3
    assert fresh["seed"] == 3 and fresh["data_seed"] == 12345
    assert fresh["fingerprint"]["hash"] == plain["fingerprint"]["hash"]
    for name in ("compute", "collective", "memory", "golden"):
        assert fresh["checks"][name]["digest"] == plain["checks"][name]["digest"], name
    # Golden's steps 16-19 (pinned) trained on the screening's data on both devices.
    assert fresh["plan"]["run"]["golden"] == 20 > BASELINE_ROUNDS["golden"]
    assert (
        fresh["checks"]["golden"]["metrics"]["loss_last"]
        != plain["checks"]["golden"]["metrics"]["loss_last"]
    )


def test_bad_data_seed_is_inconclusive_with_a_reason(tmp_path: Path) -> None:
    for seed in ("abc", "-1", str(1 << 31)):
        run = run_cli(["run", "--device", "cpu", *FAST, "--data-seed", seed], tmp_path)
        assert run.rc == 2 and "--data-seed" in run.doc["reason"], run.doc["reason"]
