"""bench.suite.testcpu, and the per-test CPU lines tests/conftest.py writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.suite.testcpu import main, read, report

from tests.conftest import SESSION_TEARDOWN

ROOT = Path(__file__).resolve().parents[2]

BUSY_CHILD = """
import subprocess, sys

def test_spins_in_a_child() -> None:
    subprocess.run([sys.executable, "-c", "import time\\nt = time.process_time()\\n"
                    "while time.process_time() - t < 0.6: pass"], check=True)

def test_idles() -> None:
    pass
"""


def test_conftest_writes_each_tests_cpu_with_its_children(tmp_path: Path) -> None:
    """A test whose child spins 0.6 CPU-s gets at least that as its
    children's CPU; one that does nothing gets next to none; the session's end is
    apart."""
    probe = tmp_path / "test_cpu_probe.py"
    probe.write_text(BUSY_CHILD)
    log = tmp_path / "A-cpu.jsonl"
    # The suite's conftest as a plugin, on a test file outside the tree.
    run = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"),
            *("-c", str(ROOT / "pyproject.toml"), "-p", "tests.conftest", str(probe)),
        ],
        cwd=ROOT,
        env={**os.environ, "SUITE_CPU_LOG": str(log)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    tests = {t.test.rsplit("::", 1)[-1]: t for t in read([log])}
    # The last test's teardown ends the session's fixtures: a line of its own.
    assert set(tests) == {"test_spins_in_a_child", "test_idles", SESSION_TEARDOWN}
    assert tests["test_spins_in_a_child"].children_cpu_s >= 0.5
    assert tests["test_idles"].children_cpu_s < 0.1
    assert all(t.group == "A" for t in tests.values())


def test_ranks_tests_and_sums_directories_skipping_broken_lines(tmp_path: Path) -> None:
    log = tmp_path / "B-cpu.jsonl"
    lines = [
        {"test": "tests/e2e/test_a.py::test_x", "wall_s": 9, "self_cpu_s": 1, "children_cpu_s": 8},
        {"test": "tests/e2e/test_a.py::test_y", "wall_s": 2, "self_cpu_s": 1, "children_cpu_s": 0},
        {"test": "tests/unit/test_b.py::test_z", "wall_s": 1, "self_cpu_s": 3, "children_cpu_s": 0},
    ]
    lines.append({"test": "(session teardown)", "wall_s": 1, "self_cpu_s": 0, "children_cpu_s": 50})
    log.write_text("\n".join(json.dumps(x) for x in lines) + '\n{"test": "cut sho')
    doc = report(read([log]), top=2)
    assert doc["tests"] == 4 and doc["cpu_s"] == 63.0 and doc["groups"] == {"B": 63.0}
    assert [r["test"] for r in doc["top"]] == [
        "tests/e2e/test_a.py::test_x",
        "tests/unit/test_b.py::test_z",
    ]
    # The session's end is a directory of its own, never among the tests.
    assert doc["directories"][0]["directory"] == "(session teardown)"
    e2e = doc["directories"][1]
    assert (e2e["directory"], e2e["tests"], e2e["cpu_s"], e2e["children_cpu_s"]) == (
        "tests/e2e",
        2,
        10.0,
        8.0,
    )
    out = tmp_path / "out"
    assert main([str(log), "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} == {
        "suite-testcpu.json",
        "suite-testcpu.md",
        "suite-testcpu.png",
    }
    assert "tests/e2e" in (out / "suite-testcpu.md").read_text()
    empty = tmp_path / "C-cpu.jsonl"
    empty.write_text("")
    assert main([str(empty), "--out", str(out)]) == 2
