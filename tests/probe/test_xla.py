"""torch-xla on PJRT CPU: the golden check is deterministic under XLA too, and the
memory check runs there.

This runs in CI (torch-xla is a probe dependency); it is not skipped when the
package is present, and fails loudly when it is missing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.probe.conftest import run_cli

#: Golden's steps pinned; the budget only has to hold the smallest plan on a loaded
#: machine (XLA's start-up leaves nothing for more rounds anyway). The hard limit is set:
#: the default (132 s at this budget) refused the smallest plan on a slow CI machine,
#: where XLA's start-up took 64 s and a golden round 13 s; this test is about
#: determinism, not about the limit.
XLA = [
    "--timeout",
    "420",
    "--device",
    "xla",
    "--cpu-devices",
    "1",
    "--budget",
    "12",
    "--steps",
    "8",
    "--checks",
    "golden,memory",
    "--memory-mib",
    "4",
]


@pytest.mark.xla
@pytest.mark.timeout(1000)
def test_xla_golden_runs_are_bitwise_identical(tmp_path: Path) -> None:
    env = {"PJRT_DEVICE": "CPU"}
    recorded = run_cli(["baseline", *XLA], tmp_path, env=env, timeout=480)
    assert recorded.rc == 0, recorded.stderr[-3000:]
    baseline = json.loads(recorded.stdout)
    assert baseline["fingerprint"]["backend"] == "xla"
    assert baseline["fingerprint"]["runtime"] == "pjrt-cpu"
    path = tmp_path / "xla-baseline.json"
    path.write_text(recorded.stdout)

    run = run_cli(["run", *XLA, "--baseline", str(path)], tmp_path, env=env, timeout=480)
    assert run.rc == 0, run.stderr[-3000:]
    golden = run.check("golden")
    assert golden["verdict"] == "pass" and golden["baseline"] == "match"
    assert golden["digest"] == baseline["digests"]["golden"]
    assert golden["metrics"]["loss_last"] < golden["metrics"]["loss_first"]
    # The memory check runs on the XLA device too; its patterns read back intact.
    memory = run.check("memory")
    assert memory["verdict"] == "pass" and memory["baseline"] == "match"
    assert memory["metrics"]["bytes_tested"] == 4 << 20 and memory["metrics"]["flips"] == 0
