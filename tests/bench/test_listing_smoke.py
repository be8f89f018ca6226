"""The start-up A/B benchmark measures what it says, at a size that runs in seconds:
both operators copy every kind before their first pass, in dry run (every start finds
the same cluster), and its table, medians and ratios come from those starts."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from bench.scale.listing import main, markdown, measure

from sdcdev.harness import REPO

pytestmark = pytest.mark.cluster


def test_a_small_run_times_both_operators_from_copy_to_first_pass(tmp_path: Path) -> None:
    args = argparse.Namespace(
        before_src=REPO,
        label="this tree",
        now_label="this tree again",
        nodes=30,
        pods_per_node=2.0,
        repeats=1,
    )
    run = measure(args)
    assert [(r["variant"], r["start"]) for r in run["starts"]] == [("before", 1), ("now", 1)]
    assert run["pods"] == 60
    for r in run["starts"]:
        assert 0 < r["nodes copied"] <= r["first pass"]
        assert 0 < r["pods copied"] <= r["first pass"]
        assert r["operator cpu"] > 0 and r["peak rss mb"] > 0
    for v in ("before", "now"):
        assert run["medians"][v]["first pass"] == next(
            r["first pass"] for r in run["starts"] if r["variant"] == v
        )
    assert run["ratio_now_over_before"]["first pass"] == round(
        run["medians"]["now"]["first pass"] / run["medians"]["before"]["first pass"], 2
    )
    # Dry run: no start left anything for the next to find.
    assert run["sdctests_after"] == 0 and run["reserved_after"] == 0
    text = markdown(run)
    assert "| 1 | before |" in text and "| now ÷ before |" in text


def test_a_tree_without_the_operator_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--before-src", str(tmp_path), "--nodes", "30"])
    assert exc.value.code == 2  # argparse's usage error
