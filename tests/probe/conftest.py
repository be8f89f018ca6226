"""Helpers for probe tests: run the real CLI in a subprocess, as a Pod would.

Runs use small budgets (8 s each on two CPU replicas: a run fills its budget);
a healthy baseline is recorded once per session and shared.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Small enough for a quick test, large enough for start-up, warm-up and every
#: check's baseline rounds on two busy cores.
FAST = ["--budget", "8"]


@dataclass
class CliRun:
    """One finished ``python -m sdcprobe ...`` invocation."""

    rc: int
    stdout: str
    stderr: str
    termination: str | None

    @property
    def doc(self) -> dict[str, Any]:
        """The JSON document on stdout."""
        return json.loads(self.stdout)

    def check(self, name: str) -> dict[str, Any]:
        """One check's result."""
        return self.doc["checks"][name]


def probe_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for the probe: importable package, PJRT on the CPU, no stray specs."""
    env = {k: v for k, v in os.environ.items() if k not in ("SDCPROBE_FAULTS", "SDCPROBE_BASELINE")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "jobs"), env.get("PYTHONPATH", "")])
    env.setdefault("PJRT_DEVICE", "CPU")
    env.update(extra or {})
    return env


#: The workers' hard limit for a test run that sets none (see :func:`run_cli`).
TEST_HARD_LIMIT_S = 200.0


def run_cli(
    args: list[str], tmp_path: Path, env: Mapping[str, str] | None = None, timeout: float = 240
) -> CliRun:
    """Run the CLI; for ``run`` the termination message is captured too.

    A run or baseline that names no limit of its own gets ``--timeout`` of
    :data:`TEST_HARD_LIMIT_S`: the default limit (``max(4 x budget, budget + 120)``) made
    a slow machine, loaded by the other test groups, refuse the smallest plan (start-ups
    of 64-76 s), and these tests are about verdicts, not the limit. The tests of the limit
    pass ``--timeout`` or ``--deadline`` themselves.
    """
    result_file = tmp_path / f"termination-{len(list(tmp_path.glob('termination-*')))}.json"
    argv = list(args)
    if argv and argv[0] in ("run", "baseline") and not {"--timeout", "--deadline"} & set(argv):
        argv += ["--timeout", f"{min(TEST_HARD_LIMIT_S, timeout - 30):g}"]
    if argv and argv[0] == "run" and "--result-file" not in argv:
        argv += ["--result-file", str(result_file)]
    proc = subprocess.run(
        [sys.executable, "-m", "sdcprobe", *argv],
        capture_output=True,
        text=True,
        env=probe_env(env),
        timeout=timeout,
        cwd=tmp_path,
    )
    termination = result_file.read_text() if result_file.exists() else None
    return CliRun(proc.returncode, proc.stdout, proc.stderr, termination)


def write_faults(tmp_path: Path, *faults: dict[str, Any]) -> str:
    """A fault spec file; returns its path."""
    path = tmp_path / f"faults-{len(list(tmp_path.glob('faults-*')))}.json"
    path.write_text(json.dumps({"faults": list(faults)}))
    return str(path)


@pytest.fixture(scope="session")
def healthy_baseline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A baseline recorded by ``sdcprobe baseline`` on a healthy 2-replica CPU run (FAST)."""
    tmp = tmp_path_factory.mktemp("baseline")
    run = run_cli(["baseline", "--device", "cpu", *FAST], tmp)
    assert run.rc == 0, run.stderr[-2000:]
    path = tmp / "baseline.json"
    path.write_text(run.stdout)
    return path


@pytest.fixture(scope="session")
def matched_run(tmp_path_factory: pytest.TempPathFactory, healthy_baseline: Path) -> CliRun:
    """A healthy run of every check (FAST) against ``healthy_baseline``, which another
    process recorded; shared by the tests that read it (each would run the same)."""
    tmp = tmp_path_factory.mktemp("matched")
    return run_cli(["run", "--device", "cpu", *FAST, "--baseline", str(healthy_baseline)], tmp)
