"""Smoke test of ``make bench-training``: a tiny run writes its table, JSON and plot."""

from __future__ import annotations

import json
from pathlib import Path

from bench.training.run import main


def test_bench_writes_results(tmp_path: Path) -> None:
    assert (
        main(
            [
                "--steps",
                "6",
                "--seeds",
                "1",
                "--overhead-steps",
                "12",
                "--reps",
                "1",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    doc = json.loads((tmp_path / "training.json").read_text())
    sites = {r["site"] for r in doc["detection"]}
    assert sites == {"forward", "backward", "optimizer", "weights at rest", "healthy"}
    healthy = [r for r in doc["detection"] if r["site"] == "healthy"]
    assert all(r["detected"] == 0 for r in healthy)  # no false alarm on healthy runs
    assert [r["budget"] for r in doc["overhead"]] == [0.0, 0.01, 0.02, 0.05]
    assert "| audit budget |" in (tmp_path / "training.md").read_text()
    assert (tmp_path / "training.png").stat().st_size > 10_000
