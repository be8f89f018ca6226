"""bench.suite.slowest: the suite's slowest tests from pytest's --durations lines."""

from __future__ import annotations

import json
from pathlib import Path

from bench.suite.slowest import durations, main, slowest, summary

LOG = """\
============================= slowest 20 durations =============================
35.24s setup    tests/probe/test_cli.py::test_healthy_run
15.00s call     tests/probe/test_cli.py::test_healthy_run
7.95s call     tests/probe/test_cli.py::test_baseline[a-b]
0.01s teardown tests/probe/test_cli.py::test_healthy_run
2 passed in 62.59s (0:01:02)
"""


def test_phases_add_up_per_test_and_other_lines_are_ignored() -> None:
    per_test = durations(LOG.splitlines())
    assert per_test == {
        "tests/probe/test_cli.py::test_healthy_run": 35.24 + 15.00 + 0.01,
        "tests/probe/test_cli.py::test_baseline[a-b]": 7.95,
    }
    top = slowest(per_test, top=1)
    assert top == [
        {
            "rank": 1,
            "test": "tests/probe/test_cli.py::test_healthy_run",
            "directory": "tests/probe",
            "seconds": 50.2,
        }
    ]


def test_a_label_is_recorded_beside_the_others(tmp_path: Path) -> None:
    log = tmp_path / "A.log"
    log.write_text(LOG)
    results = tmp_path / "suite.json"
    results.write_text(json.dumps({"runs": {"before": {"note": "x", "slowest": []}}}))
    assert main([str(log), "--label", "after", "--note", "n", "--results", str(results)]) == 0
    doc = json.loads(results.read_text())
    assert set(doc["runs"]) == {"before", "after"}
    assert doc["runs"]["after"]["slowest"][0]["seconds"] == 50.2
    assert doc["runs"]["after"]["logs"] == [{"log": "A", "outcome": "2 passed", "seconds": 62.59}]
    assert "| 1 | `tests/probe/test_cli.py::test_healthy_run` | 50.2 |" in (
        results.with_suffix(".md").read_text()
    )


def test_a_log_without_durations_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "empty.log"
    log.write_text("nothing timed\n")
    assert (
        main([str(log), "--label", "x", "--note", "n", "--results", str(tmp_path / "s.json")]) == 2
    )


def test_the_summary_line_gives_the_wall_time() -> None:
    assert summary(["x", "155 passed in 558.88s (0:09:18)"]) == {
        "outcome": "155 passed",
        "seconds": 558.88,
    }
    line = "===== 1 failed, 49 passed, 9 deselected in 6.42s ====="
    assert summary([line]) == {"outcome": "1 failed, 49 passed, 9 deselected", "seconds": 6.42}
    assert summary(["no summary"]) is None
