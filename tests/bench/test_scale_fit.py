"""The scale report's fits against fleet size: a line through the newest run of each
size, and the targets' memory limit by size."""

from __future__ import annotations

from typing import Any

import pytest
from bench.scale import report
from bench.scale.run import (
    evaluate_targets,
    percentile,
    qualify_seconds,
    quarantine_samples,
    summary,
)


def _run(nodes: int, at: str, first_pass: float, rss: float) -> dict[str, Any]:
    return {
        "nodes": nodes,
        "run_at": at,
        "first_full_pass_done_s": first_pass,
        "operator": {"peak_rss_mb": rss},
        "qualify_s": None,
    }


def test_a_line_is_fitted_exactly_and_a_curve_is_not() -> None:
    assert report.linear_fit([(1.0, 3.0), (2.0, 5.0), (4.0, 9.0)]) == pytest.approx((1, 2, 1))
    squares = report.linear_fit([(x, x * x) for x in (1.0, 2.0, 3.0, 4.0, 10.0)])
    assert squares is not None and squares[2] < 0.99
    assert report.linear_fit([(1.0, 1.0), (2.0, 2.0)]) is None  # two points prove nothing
    assert report.linear_fit([(5.0, 1.0), (5.0, 2.0), (5.0, 3.0)]) is None


def test_the_fit_takes_the_newest_run_of_each_size() -> None:
    runs = [
        _run(1000, "2026-12-01T10:00Z", 99.0, 100),  # older: left out
        _run(1000, "2026-12-02T10:00Z", 4.0, 100),
        _run(5000, "2026-12-02T11:00Z", 12.0, 200),
        _run(10000, "2026-12-02T12:00Z", 22.0, 325),
    ]
    lines = report._fit_lines(runs)
    first = next(line for line in lines if line.startswith("- operator start"))
    assert "2 s per 1,000 nodes" in first and "r² = 1.000" in first
    assert "(1,000, 5,000, 10,000 nodes)" in first
    assert not any("qualify" in line for line in lines)  # no values, no line


def test_memory_is_held_to_300_mb_to_5000_nodes_and_1_gb_above() -> None:
    def run(nodes: int, rss: float) -> dict[str, Any]:
        latency = {"p99": 0.1}
        return {
            "nodes": nodes,
            "operator": {"peak_rss_mb": rss},
            "raw_node_patch_s": {"p99": 0.05},
            "idle": {"node_writes": 0},
            "quarantine_latency_s": latency,
            "release_latency_s": latency,
            "fresh_join_quarantine_latency_s": latency,
            "fresh_join_release_latency_s": latency,
            "writes_per_clean_qualification": {"max": 6, "max_without_events": 6},
        }

    assert evaluate_targets([run(5000, 310)])["rss_under_300mb"]["met"] is False
    big = evaluate_targets([run(5000, 240), run(10000, 450)])
    assert big["at_nodes"] == 10000 and big["rss_under_1gb"] == {"value": 450, "met": True}
    assert "rss_under_300mb" not in big


def test_the_qualify_timeout_grows_with_the_fleet() -> None:
    assert qualify_seconds(100) == 1500
    assert qualify_seconds(5000) == pytest.approx(1750)
    assert qualify_seconds(20000) == pytest.approx(7000)


def test_quarantine_samples_are_counted_in_the_newest_run_of_each_size() -> None:
    def run(nodes: int, at: str, qualifying: int, qualified: int) -> dict[str, Any]:
        return {
            "nodes": nodes,
            "run_at": at,
            "quarantine_latency_s": {"n": qualifying, "p99": 0.1},
            "fresh_join_quarantine_latency_s": {"n": qualified, "p99": 0.1},
        }

    runs = [
        run(100, "2026-12-02T02:01Z", 20, 2),  # below 1,000 nodes: not held to it
        run(5000, "2026-12-04T21:35Z", 5, 20),  # an older run of the size: replaced
        run(5000, "2026-12-05T01:00Z", 100, 20),
        run(20000, "2026-12-04T22:07Z", 25, 20),
    ]
    counted = quarantine_samples(runs)
    assert counted == {"value": {5000: 20, 20000: 20}, "at_least": 20, "met": True}
    short = quarantine_samples([*runs, run(1000, "2026-12-05T02:00Z", 100, 12)])
    assert short["value"][1000] == 12 and short["met"] is False
    assert quarantine_samples([run(100, "2026-12-02T02:01Z", 20, 2)])["met"] is False


def test_percentiles_are_nearest_rank() -> None:
    hundred = [float(v) for v in range(1, 101)]
    assert percentile(hundred, 99) == 99.0  # the 99th of 100, not the slowest
    assert percentile(hundred, 50) == 50.0
    assert percentile(hundred, 100) == 100.0
    assert percentile([float(v) for v in range(1, 26)], 99) == 25.0  # of 25: the slowest
    assert percentile([float(v) for v in range(1, 201)], 99) == 198.0
    assert percentile([float(v) for v in range(1, 4901)], 99) == 4851.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 99) is None
    assert summary([float(v) for v in range(1, 101)]) == {
        "n": 100,
        "p50": 50.0,
        "p99": 99.0,
        "max": 100.0,
    }


def test_each_target_renders_as_one_line() -> None:
    samples = {"value": {"1000": 20, "5000": 100}, "at_least": 20, "met": True}
    assert report.target_line("quarantine_samples_at_every_size", samples) == (
        "- quarantine samples at every size: 20 at 1,000, 100 at 5,000 (at least 20) — met"
    )
    partial = {"value": {"before_probe_copy": 0, "other_nodes_before_pod_copy": 2}, "met": False}
    line = report.target_line("restart_no_action_on_a_partial_copy", partial)
    assert "'other_nodes_before_pod_copy': 2" in line and line.endswith("**missed**")
    ratio = {"value": 3.1, "yardstick": "raw patch during the phase", "over_quiet_patch": 9.9}
    line = report.target_line("p99_quarantine_under_10x", {**ratio, "met": True})
    assert line == (
        "- p99 quarantine under 10x: 3.1 (against the raw patch during the phase; 9.9x the"
        " quiet one) — met"
    )
