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

from sdcprobe.config import ProbeConfig, with_rounds
from sdcprobe.deadline import RoundClock
from sdcprobe.devices import BackendName, apply_determinism_env
from sdcprobe.trace import CheckTrace, WorkerReport

#: How often a worker looks for the parent's plan after its warm-up.
_PLAN_POLL_S = 0.01

if TYPE_CHECKING:  # the worker imports torch only after setting the environment
    from sdcprobe.backends import Backend
    from sdcprobe.faults import Injector
    from sdcprobe.telemetry import Telemetry


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
    calibrate: bool = True
    plan_timeout_s: float = 600.0
    #: Seconds the warm-up may hold the device busy until its power and temperature
    #: settle (0: no stress phase).
    stress_s: float = 0.0
    #: MIG instances to screen, one per worker (each worker sees only its own, as
    #: CUDA device 0); empty when the GPUs are whole.
    mig: list[str] = []


class Calibration(BaseModel):
    """What one worker measured in its warm-up: the cost of one round of each check
    and the device's peaks, which the parent turns into the plan of rounds."""

    model_config = ConfigDict(extra="forbid")
    rank: int
    world: int
    round_s: dict[str, float]
    #: Spread of each check's warm-up round times (standard deviation over mean).
    round_cv: dict[str, float] = {}
    errors: dict[str, str] = {}
    warmup_s: float = 0.0
    #: ``time.monotonic()`` when the worker's ``main`` began (after Python started).
    entered_at: float | None = None
    #: Seconds of each start-up phase: ``import`` (torch and the device runtime, device
    #: set-up), ``group`` (joining the process group), ``peaks`` (the same-run peak
    #: measurements), ``warmup`` (the timed warm-up rounds).
    phases: dict[str, float] = {}


class RoundsPlan(BaseModel):
    """The parent's answer: rounds per check, or why the run stops here; and per check
    the deadline (``time.monotonic()``) past which no round may end."""

    model_config = ConfigDict(extra="forbid")
    rounds: dict[str, int] = {}
    deadlines: dict[str, float] = {}
    #: Estimated seconds of one round per check, and the safety share on it.
    round_s: dict[str, float] = {}
    margin: float = 0.0
    #: The last check's upper bound on rounds: it runs until its deadline stops it
    #: (at least its planned rounds' worth of time is its own), so the run fills
    #: its budget however wrong the estimates were.
    fill_to: dict[str, int] = {}
    abort: str | None = None


def report_path(workdir: str | Path, rank: int) -> Path:
    """Where worker ``rank`` leaves its report."""
    return Path(workdir) / f"worker-{rank}.json"


def calibration_path(workdir: str | Path, rank: int) -> Path:
    """Where worker ``rank`` leaves its warm-up measurements."""
    return Path(workdir) / f"calibration-{rank}.json"


def rounds_path(workdir: str | Path, stage: int = 0) -> Path:
    """Where the parent leaves the plan of rounds for every worker: stage 0 after the
    warm-up, stage i after the i-th check (the rounds of the checks still to run)."""
    return Path(workdir) / f"rounds-{stage}.json"


class Progress(BaseModel):
    """A worker's word at a check boundary: how long the check it just ran took."""

    model_config = ConfigDict(extra="forbid")
    rank: int
    check: str
    wall_s: float
    rounds: int
    round_cv: float = 0.0


def progress_path(workdir: str | Path, rank: int, stage: int) -> Path:
    """Where worker ``rank`` reports the end of its ``stage``-th check."""
    return Path(workdir) / f"progress-{stage}-{rank}.json"


def write_atomically(path: Path, text: str) -> None:
    """Write so that a reader never sees half a file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class _Peaks:
    """Same-run reference throughputs the checks report their ratios against, the
    stress phase's figures, and the device's telemetry."""

    def __init__(self, telemetry: Telemetry | None = None) -> None:
        self.gemm: dict[str, float] = {}
        self.busbw: float | None = None
        self.copy: float | None = None
        self.stress: dict[str, int | float | str | None] = {}
        self.telemetry = telemetry


def run_worker(
    plan: WorkerPlan, rank: int, world: int, entered_at: float | None = None
) -> WorkerReport:
    """Set the device up, warm up and calibrate, run the planned checks; never raises."""
    start = time.perf_counter()
    phases: dict[str, float] = {}
    report = WorkerReport(rank=rank)
    try:
        apply_determinism_env()
        # Imported here: the environment above must be in place before torch and
        # the device runtime load.
        from sdcprobe.backends import setup_backend
        from sdcprobe.checks.collective import init_group
        from sdcprobe.faults import Injector
        from sdcprobe.faultspec import parse_fault_spec
        from sdcprobe.fingerprint import device_facts
        from sdcprobe.telemetry import Telemetry

        # A MIG instance is the only device its worker sees (CUDA_VISIBLE_DEVICES).
        backend = setup_backend(plan.backend, 0 if plan.mig else rank, plan.threads)
        report.facts = device_facts(backend)
        spec = parse_fault_spec(plan.faults_json) if plan.faults_json else None
        phases["import"] = time.perf_counter() - start
        if "collective" in plan.checks:
            t0 = time.perf_counter()
            init_group(backend.dist_backend, rank, world, str(Path(plan.workdir) / "store"))
            phases["group"] = time.perf_counter() - t0
        telemetry = Telemetry(backend.name, backend.index, report.facts.device_id)
        peaks = _Peaks(telemetry)
        config = plan.config
        clocks: dict[str, RoundClock] = {}
        if plan.calibrate:
            calibration = _warm_up(plan, backend, rank, world, peaks)
            calibration.warmup_s = time.perf_counter() - start
            calibration.entered_at = entered_at
            calibration.phases = {**phases, **calibration.phases}
            write_atomically(calibration_path(plan.workdir, rank), calibration.model_dump_json())
            answer = _wait_for_rounds(plan, 0)
            if answer.abort is not None:
                report.error = answer.abort
                report.wall_s = time.perf_counter() - start
                return report
            config = with_rounds(config, {**answer.rounds, **answer.fill_to})
            clocks.update(_clocks(answer, config))
        injector = Injector(spec, rank)
        for stage, check in enumerate(plan.checks, start=1):
            t0, c0 = time.perf_counter(), time.process_time()
            before = telemetry.read(0.0).clock_mhz
            try:
                report.checks[check] = _run_check(
                    check, config, backend, injector, rank, world, peaks, clocks.get(check)
                )
                # Clocks at the check's start and end: a device that throttles shows here.
                report.checks[check].metrics["clock_mhz_start"] = before
                report.checks[check].metrics["clock_mhz_end"] = telemetry.read(0.0).clock_mhz
            except Exception as exc:  # a broken check must not hide the others
                traceback.print_exc(file=sys.stderr)
                report.checks[check] = CheckTrace(
                    error=f"{type(exc).__name__}: {exc}"[:300],
                    wall_s=time.perf_counter() - t0,
                    cpu_s=time.process_time() - c0,
                )
            if plan.calibrate and stage < len(plan.checks):
                # The parent re-plans the checks still to run from the time this took.
                done = report.checks[check]
                progress = Progress(
                    rank=rank,
                    check=check,
                    wall_s=done.wall_s,
                    rounds=len(done.steps),
                    round_cv=done.round_cv,
                )
                write_atomically(
                    progress_path(plan.workdir, rank, stage), progress.model_dump_json()
                )
                answer = _wait_for_rounds(plan, stage)
                if answer.abort is not None:
                    report.error = answer.abort
                    break
                config = with_rounds(config, {**answer.rounds, **answer.fill_to})
                clocks.update(_clocks(answer, config))
        report.injections = injector.by_site()
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        report.error = f"{type(exc).__name__}: {exc}"[:300]
    report.wall_s = time.perf_counter() - start
    return report


#: Warm-up rounds per check; those after the first are timed (it pays for lazy set-up).
_WARMUP_ROUNDS = {"compute": 2, "collective": 2, "memory": 2, "golden": 3}


def _warm_up(
    plan: WorkerPlan, backend: Backend, rank: int, world: int, peaks: _Peaks
) -> Calibration:
    """Measure the peaks and one round of every check, fault-free and off the record."""
    from sdcprobe.checks.collective import measure_busbw
    from sdcprobe.checks.compute import measure_peak, stress_until_settled
    from sdcprobe.checks.memory import measure_copy
    from sdcprobe.devices import xla_on_host
    from sdcprobe.faults import Injector
    from sdcprobe.instrument import Instrumentation

    cfg = with_rounds(plan.config, _WARMUP_ROUNDS)
    calibration = Calibration(rank=rank, world=world, round_s={})
    # XLA on the host CPU (tests, CI): lazy tensors put compilation into every
    # timing, so peaks would mean nothing there and only cost compilations.
    measure = not (backend.name == "xla" and xla_on_host())
    peaks_s = warmup_s = stress_s = 0.0
    for check in plan.checks:
        try:
            t0 = time.perf_counter()
            if check == "compute" and plan.stress_s > 0 and peaks.telemetry is not None:
                peaks.stress = stress_until_settled(
                    cfg.compute, backend, peaks.telemetry, plan.stress_s
                )
                stress_s = time.perf_counter() - t0
                t0 = time.perf_counter()
            if check == "compute" and measure:
                peaks.gemm = measure_peak(cfg.compute, backend)
            elif check == "collective":
                peaks.busbw = measure_busbw(cfg.collective, Instrumentation(backend), world)
            elif check == "memory" and measure:
                peaks.copy = measure_copy(cfg.memory, backend)
            t1 = time.perf_counter()
            peaks_s += t1 - t0
            trace = _run_check(check, cfg, backend, Injector(None, rank), rank, world, _Peaks())
            warmup_s += time.perf_counter() - t1
            if trace.error:
                raise RuntimeError(trace.error)
            calibration.round_s[check] = trace.round_s
            calibration.round_cv[check] = trace.round_cv
        except Exception as exc:  # the real run reports it; plan its minimum
            traceback.print_exc(file=sys.stderr)
            calibration.errors[check] = f"{type(exc).__name__}: {exc}"[:300]
    calibration.phases = {"peaks": peaks_s, "warmup": warmup_s}
    if stress_s:
        calibration.phases["stress"] = stress_s
    return calibration


def _clocks(answer: RoundsPlan, config: ProbeConfig) -> dict[str, RoundClock]:
    """A deadline clock for every check the answer gives one."""
    return {
        check: RoundClock(
            deadline=deadline,
            minimum=config.baseline_rounds.get(check, 1),
            margin=answer.margin,
            round_s=answer.round_s.get(check, 0.0),
        )
        for check, deadline in answer.deadlines.items()
    }


def _wait_for_rounds(plan: WorkerPlan, stage: int) -> RoundsPlan:
    path = rounds_path(plan.workdir, stage)
    end = time.monotonic() + plan.plan_timeout_s
    while not path.exists():
        if time.monotonic() > end:
            return RoundsPlan(abort="no plan of rounds arrived from the parent")
        time.sleep(_PLAN_POLL_S)
    return RoundsPlan.model_validate_json(path.read_text())


def _run_check(
    check: str,
    cfg: ProbeConfig,
    backend: Backend,
    injector: Injector,
    rank: int,
    world: int,
    peaks: _Peaks,
    clock: RoundClock | None = None,
) -> CheckTrace:
    from sdcprobe.checks.collective import run_collective
    from sdcprobe.checks.compute import run_compute
    from sdcprobe.checks.golden import golden_check
    from sdcprobe.checks.memory import run_memory
    from sdcprobe.instrument import Instrumentation

    # Rounds after those a baseline covers draw the screening's own data (data_seed).
    data, base = cfg.data_seed, cfg.baseline_rounds.get(check, 0)
    if check == "compute":
        ins = Instrumentation(backend, injector)
        trace = run_compute(
            cfg.compute, cfg.seed, ins, peaks.gemm, clock, data, base, peaks.telemetry
        )
        trace.metrics.update(peaks.stress)
        return trace
    if check == "collective":
        ins = Instrumentation(backend, injector)
        return run_collective(
            cfg.collective, cfg.seed, ins, rank, world, peaks.busbw, clock, data, base
        )
    if check == "memory":
        return run_memory(
            cfg.memory, cfg.seed, Instrumentation(backend, injector), peaks.copy, clock, data, base
        )
    if check == "golden":
        return golden_check(cfg.golden, backend, injector, clock)
    raise ValueError(f"unknown check {check!r}")


def write_report(report: WorkerReport, workdir: str | Path) -> None:
    """Write atomically, so the parent never reads half a report."""
    write_atomically(report_path(workdir, report.rank), report.model_dump_json())


def _xla_entry(index: int, plan_path: str) -> None:
    import torch_xla.runtime as xr

    entered = time.monotonic()
    plan = WorkerPlan.model_validate_json(Path(plan_path).read_text())
    rank, world = xr.global_ordinal(), xr.world_size()
    write_report(run_worker(plan, rank, world, entered), plan.workdir)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m sdcprobe.worker``."""
    entered = time.monotonic()
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
    write_report(run_worker(plan, args.rank, world, entered), plan.workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
