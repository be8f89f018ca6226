"""The GPU check's sdctrain scenarios (bench.training.cuda), dry-run on CPU ranks.

On a GPU they run with ``--device cuda`` from bench/device/cuda-check.sh; here the
same scenarios, expectations and summary run on the CPU, so the script that can only
run where a GPU is lent is known to work before it gets there.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.training import cuda


def test_every_scenario_meets_its_expectation_on_cpu_ranks(tmp_path: Path) -> None:
    assert cuda.main(["--device", "cpu", "--steps", "8", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "training-cuda.json").read_text())
    got = {s["name"]: s["outcome"] for s in doc["scenarios"]}
    assert got == {
        "healthy": "clean",
        "forward": "rank1",
        "at-rest": "rank1",
        "receive": "rank1",
        "nondeterministic": "refused",
        "overhead none": "clean",
        "overhead 2%": "clean",
    }
    forward = next(s for s in doc["scenarios"] if s["name"] == "forward")
    assert forward["detections"][0]["node"] == "gpu-1"
    assert doc["overhead_ratio"] > 0


def test_an_unmet_expectation_fails_the_run(tmp_path: Path, monkeypatch) -> None:
    real = cuda.trials

    def wrong(steps: int, device: str = "cuda"):
        plan = real(steps, device)
        return [(t, "clean" if t.name == "at-rest" else e) for t, e in plan[:3]] + plan[-2:]

    monkeypatch.setattr(cuda, "trials", wrong)
    assert cuda.main(["--device", "cpu", "--steps", "6", "--out", str(tmp_path)]) == 1
