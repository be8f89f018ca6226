"""The before/after scale comparison reads two runs of one size and judges each figure
by its ratio: within 10% the same, lower better, a figure that was zero and is not
worse; its table, JSON and plot are written."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from bench.scale.compare import FIGURES, compare, main, verdict


def scale_run(nodes: int, commit: str) -> dict[str, Any]:
    """A run with every figure the comparison reads (the shape of ``scale.json``)."""
    p99 = {"p50": 0.05, "p99": 0.2, "max": 0.3, "n": 20}
    return {
        "nodes": nodes,
        "operator_version": {"commit": commit, "sources_changed": False},
        "run_at": "2026-01-01T00:00Z",
        "load": {"start": 1.0, "median": 3.0, "max": 4.0},
        "operator": {"peak_rss_mb": 240.0, "cpu_s_qualification": 100.0},
        "first_full_pass_done_s": 9.0,
        "qualify_s": 500.0,
        "release_latency_s": dict(p99),
        "quarantine_latency_s": dict(p99),
        "raw_node_patch_while_qualifying_s": {"p99": 0.1},
        "fresh_join_release_latency_s": dict(p99),
        "fresh_join_quarantine_latency_s": dict(p99),
        "join_to_job_s": dict(p99),
        "pass_cost": {"pass_s_median": 0.6},
        "requests": {"writes_per_node": 6.3},
        "writes_per_clean_qualification": {"max": 6},
        "restart": {"first_quarantine_after_restart_s": 12.0, "mirrors_synced_s": 18.0},
        "standby": {"first_write_s": {"max": 9.5}},
        "idle": {"node_writes": 0},
        "register_s": 70.0,
        "pods": {"cpu_create_s": 230.0},
        "raw_node_patch_s": {"p50": 0.01},
    }


def test_verdicts_by_ratio() -> None:
    assert verdict(10.0, 10.5) == (pytest.approx(1.05), "same")
    assert verdict(10.0, 8.0) == (pytest.approx(0.8), "better")
    assert verdict(10.0, 12.0) == (pytest.approx(1.2), "worse")
    assert verdict(0.0, 0.0) == (None, "same")
    assert verdict(0.0, 3.0) == (None, "worse")


def test_two_runs_compare_figure_by_figure_and_write_their_files(tmp_path: Path) -> None:
    before, after = scale_run(5000, "aaaaaaa"), scale_run(5000, "bbbbbbb")
    after["qualify_s"] = 400.0  # better
    after["operator"]["peak_rss_mb"] = 300.0  # worse
    after["idle"]["node_writes"] = 2  # worse: none before
    rows = {r["figure"]: r for r in compare(before, after)}
    assert len(rows) == len(FIGURES)
    assert rows["time to qualify the fleet"]["verdict"] == "better"
    assert rows["operator peak RSS"]["verdict"] == "worse"
    assert rows["steady state: node writes"]["verdict"] == "worse"
    assert rows["first pass over all nodes"]["verdict"] == "same"

    files = []
    for name, run in (("before", before), ("after", after)):
        other = copy.deepcopy(run)
        other["nodes"] = 100  # another size in the same file is not read
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"runs": [run, other]}))
        files.append(str(path))
    out = tmp_path / "cmp.md"
    assert main([*files, "--nodes", "5000", "--out", str(out)]) == 0
    text = out.read_text()
    assert "`aaaaaaa` (before)" in text and "`bbbbbbb` (after)" in text
    assert "1 figure better" in text and "2 worse" in text
    written = json.loads(out.with_suffix(".json").read_text())
    assert written["after"]["nodes"] == 5000
    assert [m["ratio"] for m in written["machine"]] == [1.0, 1.0, 1.0]
    assert "| registering the fleet (no operator yet) | 70 s | 70 s | 1.00 |" in text
    assert out.with_suffix(".png").stat().st_size > 0
    with pytest.raises(SystemExit, match="no run of 7 nodes"):
        main([*files, "--nodes", "7", "--out", str(out)])
