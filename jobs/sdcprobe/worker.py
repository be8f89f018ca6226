"""A device worker: one process per device, running the checks on that device.

Started by :mod:`sdcprobe.runner` as ``python -m sdcprobe.worker PLAN RANK``
(or, on TPU/Neuron, through torch-xla's launcher with ``--xla-spawn``, which
sets up one process per chip). It writes ``worker-RANK.json`` next to the plan
and never prints to stdout (the parent's stdout carries the result document).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from sdcprobe.config import ProbeConfig
from sdcprobe.devices import BackendName, apply_determinism_env
from sdcprobe.trace import CheckTrace, WorkerReport

if TYPE_CHECKING:  # the worker imports torch only after setting the environment
    from sdcprobe.backends import Backend
    from sdcprobe.faults import Injector


class WorkerPlan(BaseModel):
    """What every worker of one run does."""

    model_config = ConfigDict(extra="forbid")
    backend: BackendName
    checks: list[str]
    config: ProbeConfig
    threads: int
    faults_json: str | None = None
    world: int | None = None
    workdir: str


def report_path(workdir: str | Path, rank: int) -> Path:
    """Where worker ``rank`` leaves its report."""
    return Path(workdir) / f"worker-{rank}.json"


def run_worker(plan: WorkerPlan, rank: int, world: int) -> WorkerReport:
    """Set the device up and run the planned checks; never raises."""
    start = time.perf_counter()
    report = WorkerReport(rank=rank)
    try:
        apply_determinism_env()
        # Imported here: the environment above must be in place before torch and
        # the device runtime load.
        from sdcprobe.backends import setup_backend
        from sdcprobe.faults import Injector
        from sdcprobe.faultspec import parse_fault_spec
        from sdcprobe.fingerprint import device_facts

        backend = setup_backend(plan.backend, rank, plan.threads)
        report.facts = device_facts(backend)
        spec = parse_fault_spec(plan.faults_json) if plan.faults_json else None
        injector = Injector(spec, rank)
        for check in plan.checks:
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                report.checks[check] = _run_check(check, plan, backend, injector, rank, world)
            except Exception as exc:  # a broken check must not hide the others
                traceback.print_exc(file=sys.stderr)
                report.checks[check] = CheckTrace(
                    error=f"{type(exc).__name__}: {exc}"[:300],
                    wall_s=time.perf_counter() - t0,
                    cpu_s=time.process_time() - c0,
                )
        report.injections = injector.by_site()
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        report.error = f"{type(exc).__name__}: {exc}"[:300]
    report.wall_s = time.perf_counter() - start
    return report


def _run_check(
    check: str, plan: WorkerPlan, backend: Backend, injector: Injector, rank: int, world: int
) -> CheckTrace:
    from sdcprobe.checks.collective import init_group, run_collective
    from sdcprobe.checks.compute import run_compute
    from sdcprobe.checks.golden import golden_check
    from sdcprobe.checks.memory import run_memory
    from sdcprobe.instrument import Instrumentation

    cfg = plan.config
    if check == "compute":
        return run_compute(cfg.compute, cfg.seed, Instrumentation(backend, injector))
    if check == "collective":
        init_group(backend.dist_backend, rank, world, str(Path(plan.workdir) / "store"))
        return run_collective(
            cfg.collective, cfg.seed, Instrumentation(backend, injector), rank, world
        )
    if check == "memory":
        return run_memory(cfg.memory, cfg.seed, Instrumentation(backend, injector))
    if check == "golden":
        return golden_check(cfg.golden, backend, injector)
    raise ValueError(f"unknown check {check!r}")


def write_report(report: WorkerReport, workdir: str | Path) -> None:
    """Write atomically, so the parent never reads half a report."""
    path = report_path(workdir, report.rank)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(report.model_dump_json())
    os.replace(tmp, path)


def _xla_entry(index: int, plan_path: str) -> None:
    import torch_xla.runtime as xr

    plan = WorkerPlan.model_validate_json(Path(plan_path).read_text())
    rank, world = xr.global_ordinal(), xr.world_size()
    write_report(run_worker(plan, rank, world), plan.workdir)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m sdcprobe.worker``."""
    parser = argparse.ArgumentParser(prog="sdcprobe.worker", description=__doc__)
    parser.add_argument("plan")
    parser.add_argument("rank", type=int, nargs="?", default=0)
    parser.add_argument("--xla-spawn", action="store_true", help="launch one process per XLA chip")
    args = parser.parse_args(argv)
    if args.xla_spawn:
        apply_determinism_env()
        import torch_xla.distributed.xla_multiprocessing as xmp

        xmp.spawn(_xla_entry, args=(args.plan,))  # type: ignore[no-untyped-call]
        return 0
    plan = WorkerPlan.model_validate_json(Path(args.plan).read_text())
    world = plan.world if plan.world is not None else 1
    write_report(run_worker(plan, args.rank, world), plan.workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
