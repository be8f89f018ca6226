"""The repeated-screenings benchmark: real checks, a handful of rounds, and its model of
the probe's seeds and rounds checked against the probe and the operator themselves."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench.detection.screenings import (
    CONFIRM_AFTER,
    INTERVAL,
    Bench,
    Mode,
    Screening,
    confirmation,
    data_dependent,
    intermittent,
    merge,
    run_screenings,
    screening,
    todays_rounds,
    write,
)

from sdcguard.domain.seeds import BASELINE_SEED
from sdcprobe.config import BASELINE_ROUNDS, plan_config

ROUNDS = {"compute": 3, "collective": 3, "memory": 5, "golden": 3}


def test_faults_active_in_every_round_are_caught_and_absent_ones_never() -> None:
    mode = Mode(budget=8, nodes=2, screenings=2)
    bench = Bench(mode, {"sdcguard": ROUNDS, "today": ROUNDS})
    try:
        for check in ("compute", "collective", "memory", "golden"):
            # Caught at the first screening, and its re-run (active in every round) confirms.
            caught = intermittent(bench, check, 1.0, "sdcguard")
            assert [(o.flagged, o.confirmed) for o in caught] == [(0, True)] * 2, check
            missed = intermittent(bench, check, 0.0, "today")
            assert [(o.flagged, o.confirmed) for o in missed] == [(None, None)] * 2, check
        data = data_dependent(bench, "memory")
        # A deterministic defect reproduces on the failed test's own data seed.
        assert all(o.confirmed for o in data["sdcguard"]["nodes"] if o.flagged is not None)
        # The fixed-seed probe feeds the same data every time: its first screening decides.
        assert all(o.flagged in (0, None) for o in data["today"]["nodes"])
        assert 0.0 <= data["sdcguard"]["trigger_rate"] <= 1.0
    finally:
        bench.close()


def test_seeds_are_the_operators_and_each_round_draws_from_the_probes_own_plan() -> None:
    first, second, third = (screening("sdcguard", 0, k) for k in range(3))
    # Every screening shares the fixed baseline seed (the operator's); data seeds differ.
    assert INTERVAL.total_seconds() == 12 * 3600
    assert first.seed == second.seed == third.seed == BASELINE_SEED
    assert len({first.data_seed, second.data_seed, third.data_seed}) == 3
    again, fresh = confirmation("sdcguard", second), confirmation("sdcguard", second, False)
    assert again.created - second.created == CONFIRM_AFTER
    assert (again.seed, again.data_seed) == (second.seed, second.data_seed)
    assert fresh.data_seed not in (second.data_seed, None)
    assert screening("today", 0, 5).seed == 0 and screening("today", 0, 5).data_seed is None

    bench = Bench(Mode(budget=8, nodes=1, screenings=3), {"sdcguard": ROUNDS, "today": ROUNDS})
    try:
        cfg = bench.config("sdcguard", first, 6, "compute")
        # The rounds a baseline covers are the probe's own, not a copy in the benchmark.
        assert cfg.baseline_rounds == plan_config(8, "cpu").baseline_rounds == BASELINE_ROUNDS
        assert (cfg.seed, cfg.data_seed) == (first.seed, first.data_seed)
        assert (cfg.golden.seed, cfg.golden.data_seed) == (first.seed, first.data_seed)
        assert cfg.golden.data_from == BASELINE_ROUNDS["golden"]
        base = BASELINE_ROUNDS["compute"]

        def steps(s: Screening) -> list[dict[str, str]]:
            return bench.run("compute", bench.config("sdcguard", s, 6, "compute"), None).steps

        a, b, c = steps(first), steps(second), steps(again)
        # The baseline's rounds compute the same bits, every later round new data.
        assert a[:base] == b[:base]
        assert all(x != y for x, y in zip(a[base:], b[base:], strict=True))
        # The confirmation repeats the failed test's data in every round.
        assert b == c
        # Another day: the baseline's rounds still compute the same bits.
        assert steps(third)[:base] == a[:base]
        # The probe before the seeds: the same bits in every screening.
        old = [
            bench.run("compute", bench.config("today", s, 3, "compute"), None).steps
            for s in (screening("today", 0, 0), screening("today", 0, 7))
        ]
        assert old[0] == old[1]
    finally:
        bench.close()


def test_sdcguards_rounds_are_a_real_probe_runs_plan() -> None:
    doc = run_screenings(Mode(budget=10, nodes=1, screenings=1), lambda _: None, checks=())
    assert doc["probe_plan"] is not None
    assert doc["rounds"]["sdcguard"] == doc["probe_plan"]["run"]
    assert all(doc["rounds"]["sdcguard"][c] >= n for c, n in BASELINE_ROUNDS.items())
    assert doc["baseline_rounds"] == BASELINE_ROUNDS


def test_document_tables_and_plot(tmp_path: Path) -> None:
    assert todays_rounds(60) == {"compute": 388, "collective": 5, "memory": 5, "golden": 570}
    doc = run_screenings(
        Mode(budget=8, nodes=2, screenings=3), lambda _: None, ROUNDS, checks=("collective",)
    )
    kinds = [(r["check"], r["kind"]) for r in doc["profiles"]]
    assert kinds == [("collective", "intermittent")] * 3 + [("collective", "data-dependent")]
    for row in doc["profiles"]:
        for variant in ("sdcguard", "today"):
            det = row[variant]["detection"]
            assert det["1"] <= det["3"] <= det["10"]
            flagged = [n for n in row[variant]["nodes"] if "flagged" in n]
            assert det["10"] == len(flagged) / 2
            assert all("confirmed" in n for n in flagged)
    load = doc["machine"]["load_avg_1m"]
    assert load["min"] <= load["start"] <= load["max"]
    paths = write(doc, tmp_path)
    md = paths[1].read_text()
    assert "| collective | intermittent p=0.1 |" in md
    assert "load average (1 min)" in md
    assert paths[2].read_bytes()[:4] == b"\x89PNG"


def test_runs_of_distinct_checks_merge_into_one_document(tmp_path: Path) -> None:
    mode = Mode(budget=8, nodes=2, screenings=2, golden_nodes=1)
    parts = [
        run_screenings(mode, lambda _: None, ROUNDS, checks=(c,)) for c in ("memory", "golden")
    ]
    for part, plan_run in zip(parts, ({"memory": 7}, {"golden": 9}), strict=True):
        # As a probe run writes it (the fields the document reads).
        part["probe_plan"] = {"budget_s": 8.0, "run": plan_run, "round_ms": {"golden": 2000.0}}
    doc = merge(parts)
    assert [r["check"] for r in doc["profiles"]] == ["memory"] * 4 + ["golden"] * 4
    assert [r["nodes"] for r in doc["profiles"]] == [2] * 4 + [1] * 4
    assert doc["check_runs"] == parts[0]["check_runs"] + parts[1]["check_runs"]
    # One after the other: from the first part's start to the second's end.
    assert doc["runtime"]["wall_s"] >= sum(p["runtime"]["wall_s"] for p in parts) - 1.0
    assert [p["checks"] for p in doc["probe_plans"]] == [["memory"], ["golden"]]
    md = write(doc, tmp_path)[1].read_text()
    assert "2 nodes per profile, golden 1," in md
    assert f"(memory {parts[0]['runtime']['wall_s']} s, golden" in md
    assert "memory rounds from one probe run's plan, golden from another" in md
    # The fixed rounds' cost at the round costs the plans measured (50 golden steps of 2 s).
    assert "golden 100.0 s (its budget: 8 s)." in md
    with pytest.raises(ValueError, match="two documents have memory"):
        merge([parts[0], parts[0]])
