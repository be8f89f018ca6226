"""Smoke test of the detection benchmark: a couple of trials on a tiny golden model."""

from __future__ import annotations

import json
from pathlib import Path

from bench.detection.profiles import select
from bench.detection.run import Plan, run_benchmark, write_results

TINY = Plan(
    steps=8,
    window=4,
    calibration_runs=2,
    healthy_runs=2,
    trials=2,
    model={"d_model": 32, "d_ff": 64, "seq_len": 16, "batch": 4},
)


def test_golden_detects_f1_and_passes_healthy_runs(tmp_path: Path) -> None:
    lines: list[str] = []
    doc = run_benchmark(TINY, select("H0,F1"), progress=lines.append, mode="smoke")
    rows = {r["id"]: r for r in doc["profiles"]}

    f1 = rows["F1"]
    assert f1["activated"] == 2
    assert f1["detectors"]["golden"]["activated"]["k"] == 2
    assert f1["golden_site_named"]["k"] == 2  # first divergence at attention.output
    assert f1["detectors"]["golden"]["ttd_steps_median"] == 0

    h0 = rows["H0"]
    assert h0["golden_verdicts"] == {"pass": 2}
    assert h0["detectors"]["golden"]["alarms"]["k"] == 0

    assert any(line.startswith("[F1] 2 trials, 2 activated") for line in lines), lines
    paths = write_results(doc, tmp_path)
    assert json.loads(paths[0].read_text())["profiles"][1]["id"] == "F1"
    assert "| F1 |" in paths[1].read_text()
    assert paths[2].read_bytes()[:4] == b"\x89PNG"
