"""The pass-cost benchmark measures real passes, and its A/B report says which is which."""

from __future__ import annotations

import json
from pathlib import Path

from bench.scale import passcost


def test_a_small_fleet_measures_every_figure() -> None:
    row = passcost.measure(40, 2)
    timed = {"fleet_copy_s", "full_pass_s", "probe_end_pass_s", "longest_wait_s"}
    assert set(row) == timed | {"collector_in_full_pass_s"}
    assert all(row[k] > 0 for k in timed)
    assert row["collector_in_full_pass_s"] >= 0  # forty nodes rarely start a full one
    assert row["full_pass_s"] > row["probe_end_pass_s"], "one node costs less than forty"
    assert row["longest_wait_s"] <= row["full_pass_s"], "a stretch of the pass, not more"


def test_an_a_b_run_in_child_processes_writes_its_table(tmp_path: Path) -> None:
    """Both trees are this one here: the run, the report and the picture still work."""
    repo = Path(passcost.__file__).resolve().parents[2]
    assert (
        passcost.main(
            ["--before-src", str(repo), "--sizes", "30", "--repeats", "1", "--out", str(tmp_path)]
        )
        == 0
    )
    doc = json.loads((tmp_path / "passcost.json").read_text())
    assert [r["nodes"] for r in doc["rows"]] == [30]
    assert set(doc["rows"][0]) == {"nodes", "before", "now"}
    text = (tmp_path / "passcost.md").read_text()
    assert "| 30 |" in text and "probe end: before / now" in text
    assert (tmp_path / "passcost.png").stat().st_size > 0
