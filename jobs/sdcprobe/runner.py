"""Launch one worker process per device, wait for them, and judge their reports.

The parent never imports torch (except to count CUDA devices), so it starts
fast and stays small. Workers are started as ``python -m sdcprobe.worker`` in
their own process groups: a worker that hangs (say, in a collective whose peer
died) is killed at the deadline and the run is inconclusive, not stuck.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import sdcprobe
from sdcprobe.config import CHECK_NAMES, ProbeConfig, plan_config
from sdcprobe.devices import (
    BackendName,
    apply_determinism_env,
    ensure_pjrt_device,
    local_device_count,
    resolve_backend,
)
from sdcprobe.faultspec import FaultSpec
from sdcprobe.judge import judge
from sdcprobe.result import Baseline, ProbeResult
from sdcprobe.trace import WorkerReport
from sdcprobe.worker import WorkerPlan, report_path

# Resolved in the parent: between fork and exec only async-signal-safe work is allowed.
_PR_SET_PDEATHSIG = 1
_LIBC: ctypes.CDLL | None = None
if sys.platform == "linux":
    with contextlib.suppress(OSError, AttributeError):
        _LIBC = ctypes.CDLL(None)
        _LIBC.prctl  # noqa: B018  (fail here, not in the child, if it is missing)

#: After one worker dies, how long the others get to finish what does not need it.
CRASH_GRACE_S = 5.0


@dataclass
class RunOptions:
    """Everything ``sdcprobe run`` was asked to do, already validated."""

    device: str = "auto"
    checks: list[str] = field(default_factory=lambda: list(CHECK_NAMES))
    cpu_devices: int = 2
    budget: float = 60.0
    seed: int = 0
    steps: int | None = None
    threads: int = 1
    memory_fraction: float | None = None
    memory_mib: int | None = None
    faults: FaultSpec | None = None
    baseline: Baseline | None = None
    timeout: float | None = None

    def config(self, backend: BackendName) -> ProbeConfig:
        """Check parameters for this run."""
        return plan_config(
            self.budget, backend, self.steps, self.seed, self.memory_fraction, self.memory_mib
        )

    def deadline_s(self) -> float:
        """Hard limit for the workers: generous, because a slow node is not a sick one."""
        return (
            self.timeout
            if self.timeout is not None
            else max(4.0 * self.budget, self.budget + 120.0)
        )


@dataclass
class ProbeRun:
    """A finished run: the judged result and what each worker reported."""

    result: ProbeResult
    reports: dict[int, WorkerReport | None]
    config: ProbeConfig


def _worker_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    apply_determinism_env(env)
    # Workers must find this package however the parent found it.
    root = str(Path(sdcprobe.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    # One intra-op thread pool size everywhere: OpenMP/MKL read these at load.
    env["OMP_NUM_THREADS"] = str(threads)
    env["MKL_NUM_THREADS"] = str(threads)
    # CPU replicas talk over gloo on this host only; do not depend on the Pod's
    # hostname resolving to a reachable interface.
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env


def _die_with_parent() -> None:
    """In the child before exec: get SIGKILL when the parent dies (Linux), so a probe
    killed from outside (Pod deadline, simulator) never leaves workers running."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _kill(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    for proc in procs:
        proc.wait()


def _supervise(procs: list[subprocess.Popen[bytes]], deadline_s: float) -> str | None:
    """Wait for all workers; returns why the wait was cut short, if it was."""
    end = time.monotonic() + deadline_s
    crash_at: float | None = None
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if now > end:
            _kill(procs)
            return f"timed out after {deadline_s:.0f}s"
        if crash_at is None and any(p.returncode not in (None, 0) for p in procs):
            crash_at = now
        if crash_at is not None and now - crash_at > CRASH_GRACE_S:
            _kill(procs)
            return "a worker crashed; the others were stopped"
        time.sleep(0.02)
    return None


def run_probe(opts: RunOptions) -> ProbeRun:
    """Run the checks on every local device and judge the outcome."""
    start = time.perf_counter()
    backend = resolve_backend(opts.device)
    if backend == "xla":
        ensure_pjrt_device()  # workers inherit it
    config = opts.config(backend)
    count = local_device_count(backend, opts.cpu_devices)
    workdir = tempfile.mkdtemp(prefix="sdcprobe-")
    try:
        plan = WorkerPlan(
            backend=backend,
            checks=[c for c in CHECK_NAMES if c in opts.checks],
            config=config,
            threads=opts.threads,
            faults_json=opts.faults.model_dump_json() if opts.faults is not None else None,
            world=count,
            workdir=workdir,
        )
        plan_path = Path(workdir) / "plan.json"
        plan_path.write_text(plan.model_dump_json())
        env = _worker_env(opts.threads)
        base = [sys.executable, "-m", "sdcprobe.worker", str(plan_path)]
        if count is None:  # TPU / Neuron: torch-xla launches one process per chip
            commands = [[*base, "--xla-spawn"]]
        elif count == 0:
            commands = []
        else:
            commands = [[*base, str(rank)] for rank in range(count)]
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for cmd in commands:
                # stdout belongs to the result document: worker chatter goes to stderr.
                # Own process group, so a hung worker and anything it started can be
                # killed together; and it dies with us (see _die_with_parent).
                procs.append(
                    subprocess.Popen(
                        cmd,
                        env=env,
                        stdout=sys.stderr.fileno(),
                        start_new_session=True,
                        preexec_fn=_die_with_parent,
                    )
                )
            cut_short = _supervise(procs, opts.deadline_s())
        finally:
            _kill(procs)  # no-op for workers that finished; never leaves orphans behind
        reports = _collect(workdir, count, procs, cut_short)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result = judge(
        plan.checks,
        reports,
        config,
        opts.baseline,
        injection_enabled=opts.faults is not None,
        duration_s=time.perf_counter() - start,
    )
    return ProbeRun(result=result, reports=reports, config=config)


def _collect(
    workdir: str, count: int | None, procs: list[subprocess.Popen[bytes]], cut_short: str | None
) -> dict[int, WorkerReport | None]:
    reports: dict[int, WorkerReport | None] = {}
    if count is None:
        found = sorted(Path(workdir).glob("worker-*.json"))
        ranks = [int(p.stem.split("-")[1]) for p in found]
    else:
        ranks = list(range(count))
    for rank in ranks:
        path = report_path(workdir, rank)
        if path.exists():
            reports[rank] = WorkerReport.model_validate_json(path.read_text())
        else:
            code = procs[rank].returncode if count is not None and rank < len(procs) else None
            why = cut_short or f"worker exited with code {code} without a report"
            reports[rank] = WorkerReport(rank=rank, error=why)
    if not reports:
        why = cut_short or "no device found"
        reports[0] = WorkerReport(rank=0, error=why)
    return reports
