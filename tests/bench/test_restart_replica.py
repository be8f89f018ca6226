"""The scale benchmark's restart phase treats the operator as a container: a process
that ends (a leader that could not renew its Lease exits) is started again, and only
the new process's log counts for its copy and its passes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from bench.scale.restart import Replica


class _Process:
    """An OperatorProcess stand-in: a real child process that exits at once."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> _Process:
        self.starts += 1
        self.proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
        self.proc.wait(timeout=30)
        return self


def _line(event: str, at: float, **fields: object) -> str:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at % 1 * 1e6):06d}Z"
    return json.dumps({"event": event, "timestamp": stamp, **fields})


def test_an_ended_process_is_started_again_and_read_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "operator.log"
    proc = _Process(log).start()
    replica = Replica(proc, "operator", log, "replica-restarted")  # type: ignore[arg-type]
    before = time.time() - 10
    log.write_text(
        _line("mirror synced", before, kind="nodes", objects=5)
        + "\n"
        + _line("reconcile pass", before, nodes=5)
        + "\n"
    )
    replica.read_log()
    assert replica.synced["nodes"][1] == 5 and replica.passes
    replica.keep_running()
    assert proc.starts == 2 and replica.restarts == [3]
    replica.read_log()
    assert replica.synced == {} and replica.passes == [], "the ended process's log is left out"
    with log.open("a") as out:
        out.write(_line("mirror synced", time.time() + 1, kind="nodes", objects=7) + "\n")
    replica.read_log()
    assert replica.synced["nodes"][1] == 7
