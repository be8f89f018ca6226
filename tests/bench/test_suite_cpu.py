"""bench.suite.cpu: CPU by component and test group, and the files it writes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bench.suite.cpu import OTHER, Proc, Tally, component_of, group_of, main, suite_groups

GROUPS = {"A": ("tests/unit", "tests/probe"), "B": ("tests/cluster",)}


def test_components_are_named_by_command_line() -> None:
    assert component_of("/v/bin/python -m sdcprobe run --device cpu") == "real probe runs"
    assert component_of("/c/k8s/kube-apiserver --etcd-servers=x") == "kube-apiserver"
    assert component_of("/c/etcd-3.7/etcd --data-dir /tmp/x") == "etcd"
    assert component_of("/v/bin/python -m sdcguard --liveness=x") == "operator"
    assert component_of("/opt/venv/bin/sdcguard-operator --liveness=x") == "operator"
    assert component_of("/c/helm upgrade --install x") == "helm and kubectl"
    assert component_of("/v/bin/python -m pytest -q tests/unit") == "pytest (tests, simulator)"
    # A path that merely contains a tool's name is not that tool.
    assert component_of("/srv/agent --env /usr/local/go/bin") == OTHER


def test_a_pytest_command_line_names_its_group() -> None:
    assert group_of("python -m pytest -q --durations=20 tests/unit tests/probe", GROUPS) == "A"
    assert group_of("python -m pytest -q tests/cluster", GROUPS) == "B"
    assert group_of("python -m pytest -q tests/unitary", GROUPS) is None


def test_the_groups_are_read_from_the_suite_script() -> None:
    groups = suite_groups(Path(__file__).resolve().parents[2] / "tests" / "run-suites.sh")
    assert set(groups) == set("ABCDEFG") and "tests/unit" in groups["A"]
    # A group that names single files of another group's directory.
    assert "tests/operator" in groups["F"] and all(f.endswith(".py") for f in groups["E"])


def test_a_group_of_single_files_is_not_taken_for_their_directory() -> None:
    groups = {"E": ("tests/operator/test_lifecycle.py",), "F": ("tests/operator",)}
    files = "python -m pytest -q tests/operator/test_lifecycle.py"
    rest = "python -m pytest -q tests/operator --ignore=tests/operator/test_lifecycle.py"
    assert group_of(files, groups) == "E"
    assert group_of(rest, groups) == "F"


def test_growth_counts_with_the_component_and_group_of_its_ancestors() -> None:
    def procs(cpu: float) -> dict[tuple[int, str], Proc]:
        return {
            (10, "1"): Proc("python -m pytest -q tests/unit tests/probe", 1, 5 * cpu),
            (11, "2"): Proc("python -m sdcprobe run", 10, 3 * cpu),
            (12, "3"): Proc("python -c from multiprocessing.spawn import spawn_main", 11, 2 * cpu),
            (20, "4"): Proc("/srv/agent --env /usr/local/go/bin", 2, 7 * cpu),
        }

    tally = Tally(GROUPS, root=1)
    tally.sample(procs(1.0), first=True)  # starting points only
    tally.sample(procs(2.0))
    assert dict(tally.by_component) == {
        "pytest (tests, simulator)": 5.0,
        "real probe runs": 5.0,  # the replica counts with its probe
        OTHER: 7.0,  # not the command's: keeps its own (no) component
    }
    assert dict(tally.by_group) == {"group A": 10.0, "outside the test groups": 7.0}
    # A process first seen later counts from zero.
    later = procs(2.0) | {(13, "5"): Proc("python -m sdcprobe run", 10, 4.0)}
    tally.sample(later)
    assert tally.by_component["real probe runs"] == 9.0


def test_a_run_writes_its_table_and_picture_and_keeps_the_exit_status(tmp_path: Path) -> None:
    busy = "import time\nt = time.time()\nwhile time.time() - t < 0.6: pass\nraise SystemExit(3)"
    rc = main(["--out", str(tmp_path), "--every", "0.2", "--", sys.executable, "-c", busy])
    assert rc == 3
    doc = json.loads((tmp_path / "suite-cpu.json").read_text())
    assert doc["exit_status"] == 3 and doc["busy_cpu_s"] > 0 and doc["cores"] >= 1
    # Both are rounded to 0.1 from the unrounded busy time.
    assert abs(doc["cpu_floor_s"] - doc["busy_cpu_s"] / doc["cores"]) <= 0.1
    assert sum(r["cpu_s"] for r in doc["components"]) > 0
    assert "CPU-seconds" in (tmp_path / "suite-cpu.md").read_text()
    assert (tmp_path / "suite-cpu.png").stat().st_size > 1000
