"""Launch one worker process per device, wait for them, and judge their reports.

The parent never imports torch (except to count CUDA devices), so it starts
fast and stays small. Workers are started as ``python -m sdcprobe.worker`` in
their own process groups: a worker that hangs (say, in a collective whose peer
died) is killed at the deadline and the run is inconclusive, not stuck.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sdcprobe
from sdcprobe.config import (
    CATCH_PROBABILITIES,
    CHECK_NAMES,
    DEFAULT_CATCH_FRACTION,
    DEFAULT_CATCH_TARGET,
    PlanError,
    ProbeConfig,
    catch_probability,
    plan_config,
    plan_rounds,
    rounds_for_target,
    with_rounds,
)
from sdcprobe.deadline import safety_margin
from sdcprobe.devices import (
    BackendName,
    apply_determinism_env,
    ensure_pjrt_device,
    local_device_count,
    mig_enabled_gpus,
    mig_instances,
    mig_refusal,
    resolve_backend,
)
from sdcprobe.faultspec import FaultSpec
from sdcprobe.judge import judge
from sdcprobe.result import Baseline, ProbeResult, RunPlan
from sdcprobe.trace import WorkerReport
from sdcprobe.worker import (
    Calibration,
    Progress,
    RoundsPlan,
    WorkerPlan,
    progress_path,
    report_path,
    rounds_path,
    write_atomically,
)

# Resolved in the parent: between fork and exec only async-signal-safe work is allowed.
_PR_SET_PDEATHSIG = 1
_LIBC: ctypes.CDLL | None = None
if sys.platform == "linux":
    with contextlib.suppress(OSError, AttributeError):
        _LIBC = ctypes.CDLL(None)
        _LIBC.prctl  # noqa: B018  (fail here, not in the child, if it is missing)

#: After one worker dies, how long the others get to finish what does not need it.
CRASH_GRACE_S = 5.0
#: The last check may run up to this many times its planned rounds (and 16 more),
#: until its deadline stops it: the run then fills its budget.
FILL_FACTOR = 4
#: How long workers that have written their reports get to exit by themselves.
EXIT_GRACE_S = 0.2
#: The stress phase's cap on CUDA: it ends earlier once power and temperature settle.
CUDA_STRESS_S = 30.0
#: Seconds before the Job's deadline at which the workers are stopped.
DEADLINE_MARGIN_S = 10.0
#: Held back from the budget for what follows the last round: reports, judging,
#: exit. Seconds, plus a share of the budget.
TAIL_S, TAIL_SHARE = 0.6, 0.02


@dataclass
class RunOptions:
    """Everything ``sdcprobe run`` was asked to do, already validated."""

    device: str = "auto"
    checks: list[str] = field(default_factory=lambda: list(CHECK_NAMES))
    cpu_devices: int = 2
    budget: float = 60.0
    seed: int = 0
    #: The screening's own seed for the rounds a baseline does not cover (None: seed).
    data_seed: int | None = None
    #: The probe image reference (SDCPROBE_IMAGE): part of the fingerprint.
    image: str = ""
    steps: int | None = None
    threads: int = 1
    memory_fraction: float | None = None
    memory_mib: int | None = None
    #: Seconds each memory pattern sits before read-back (None: the backend's default).
    memory_dwell: float | None = None
    #: Longest stress phase before the peaks (None: the backend's default).
    stress: float | None = None
    faults: FaultSpec | None = None
    baseline: Baseline | None = None
    timeout: float | None = None
    #: The Job's deadline in seconds, when known: workers stop in time to report.
    deadline: float | None = None
    #: When the probe started (``time.perf_counter()``); the budget counts from here.
    started: float | None = None
    #: The catch chance every check should reach for a fault active in ``catch_fraction``
    #: of rounds; the plan says before any check runs whether the budget reaches it.
    catch_target: float = DEFAULT_CATCH_TARGET
    catch_fraction: float = DEFAULT_CATCH_FRACTION
    #: ``flag``: run anyway and report the shortfall; ``refuse``: stop before the checks
    #: (inconclusive) when the plan cannot reach the target.
    catch_shortfall: str = "flag"

    def config(self, backend: BackendName) -> ProbeConfig:
        """Check parameters for this run."""
        return plan_config(
            self.budget,
            backend,
            self.steps,
            self.seed,
            self.memory_fraction,
            self.memory_mib,
            self.data_seed,
            self.memory_dwell,
            self.image,
        )

    def stress_seconds(self, backend: BackendName) -> float:
        """How long the warm-up may hold the device busy until it settles: the asked
        value, else 30 s on CUDA (GPUs settle in tens of seconds under load) and none
        elsewhere (CPU replicas and XLA report no power to settle)."""
        if self.stress is not None:
            return self.stress
        return CUDA_STRESS_S if backend == "cuda" else 0.0

    def deadline_s(self) -> float:
        """Hard limit for the workers: generous, because a slow node is not a sick one."""
        limit = (
            self.timeout
            if self.timeout is not None
            else max(4.0 * self.budget, self.budget + 120.0)
        )
        if self.deadline is not None:  # leave time to judge and write the result
            limit = min(limit, max(self.deadline - DEADLINE_MARGIN_S, self.budget))
        return limit


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


def _less_tail(seconds: float) -> float:
    """Seconds from the start by which the checks must be done to end within
    ``seconds``: the tail (results and exit) taken off."""
    return seconds - (TAIL_S + TAIL_SHARE * seconds)


class _Planner:
    """Waits for every worker's warm-up, then writes the plan of rounds they all run."""

    def __init__(self, opts: RunOptions, config: ProbeConfig, workdir: str, count: int | None):
        self.opts, self.config, self.workdir, self.count = opts, config, workdir, count
        self.started = opts.started if opts.started is not None else time.perf_counter()
        # The same start on the clock every process of the host shares.
        self.started_monotonic = time.monotonic() - (time.perf_counter() - self.started)
        self.answer: RoundsPlan | None = None
        self.plan: RunPlan | None = None
        self.round_s: dict[str, float] = {}
        self.world: int | None = count
        self.stage = 0  # check boundaries re-planned so far
        self.rounds: dict[str, int] = {}
        self.spent: dict[str, float] = {}  # wall seconds of the checks done (slowest device)
        self.fixed: dict[str, int] = {}
        self.first_rounds: dict[str, int] = {}
        self.ran: dict[str, int] = {}  # rounds every device ran, per check done
        self.spreads: list[float] = []  # round-time spreads measured so far
        self.margin = 0.0

    def _calibrations(self) -> list[Calibration] | None:
        found = sorted(Path(self.workdir).glob("calibration-*.json"))
        if not found:
            return None
        cals = [Calibration.model_validate_json(p.read_text()) for p in found]
        world = self.count if self.count is not None else cals[0].world
        return cals if len(cals) >= world else None

    def poll(self) -> None:
        """Plan once every worker has reported its warm-up, and re-plan at every check
        boundary once every worker has reached it (cheap when they have not)."""
        if self.answer is None:
            cals = self._calibrations()
            if cals is not None:
                self.world = len(cals)
                self.decide(cals)
            return
        if self.answer.abort is not None or self.world is None:
            return
        checks = [c for c in CHECK_NAMES if c in self.opts.checks]
        stage = self.stage + 1
        if stage >= len(checks):
            return
        paths = [progress_path(self.workdir, r, stage) for r in range(self.world)]
        if not all(p.exists() for p in paths):
            return
        progress = [Progress.model_validate_json(p.read_text()) for p in paths]
        self.replan(stage, checks, progress)

    def abort(self, why: str) -> None:
        """Tell workers still waiting for a plan to stop."""
        if self.answer is None:
            self.answer = RoundsPlan(abort=why)
            write_atomically(rounds_path(self.workdir), self.answer.model_dump_json())
        elif self.answer.abort is None:
            stop = RoundsPlan(abort=why).model_dump_json()
            for stage in range(self.stage + 1, len(CHECK_NAMES)):
                write_atomically(rounds_path(self.workdir, stage), stop)

    def _costs(self, checks: list[str], factor: float = 1.0) -> dict[str, float]:
        """Planned seconds per round: measured, scaled by how the checks done so far
        compared with their estimate, stretched by the safety margin."""
        return {c: self.round_s[c] * factor * (1.0 + self.margin) for c in checks}

    def _end(self) -> float:
        """``perf_counter()`` by which every check must be done: the budget less the tail."""
        return self.started + _less_tail(self.opts.budget)

    def _deadlines(
        self, rest: list[str], rounds: dict[str, int], costs: dict[str, float]
    ) -> dict[str, float]:
        """Per check still to run, the ``time.monotonic()`` past which none of its rounds
        may end: where the plan expects it to end plus the plan's unused time, and
        never so late that the checks after it could not run their minimum. Pinned
        checks (``--steps``) get none: they run what was asked."""
        now = time.perf_counter()
        end = self._end()
        minimum = self.config.baseline_rounds
        ends: dict[str, float] = {}
        t = now
        for c in rest:
            t += costs[c] * rounds[c]
            ends[c] = t
        slack = max(end - t, 0.0)
        to_monotonic = time.monotonic() - now
        out: dict[str, float] = {}
        for i, c in enumerate(rest):
            if c in self.fixed:
                continue
            after = sum(costs[d] * self.fixed.get(d, minimum[d]) for d in rest[i + 1 :])
            out[c] = min(ends[c] + slack, end - after) + to_monotonic
        return out

    def _answer(
        self, stage: int, rest: list[str], rounds: dict[str, int], costs: dict[str, float]
    ) -> None:
        last = rest[-1]
        answer = RoundsPlan(
            rounds=rounds,
            deadlines=self._deadlines(rest, rounds, costs),
            round_s={c: round(costs[c] / (1.0 + self.margin), 6) for c in rest},
            margin=self.margin,
            fill_to={} if last in self.fixed else {last: FILL_FACTOR * rounds[last] + 16},
        )
        if stage == 0:
            self.answer = answer
        write_atomically(rounds_path(self.workdir, stage), answer.model_dump_json())

    def replan(self, stage: int, checks: list[str], progress: list[Progress]) -> None:
        """After the ``stage``-th check: the rounds of the checks still to run, from the
        time left and the warm-up costs scaled by how the checks done so far compared
        with their estimate (a node's load changes; the plan follows it); the safety
        margin follows the spread of the round times seen so far."""
        done = checks[stage - 1]
        self.spent[done] = max(p.wall_s for p in progress)
        self.spreads.extend(p.round_cv for p in progress)
        self.margin = safety_margin(self.spreads)
        estimated = sum(self.round_s[c] * n for c, n in self.done_rounds(progress, done).items())
        factor = sum(self.spent.values()) / estimated if estimated > 0 else 1.0
        factor = min(max(factor, 0.25), 4.0)
        rest = checks[stage:]
        available = self._end() - time.perf_counter()
        costs = self._costs(rest, factor)
        minimum = self.config.baseline_rounds
        fixed = {c: n for c, n in self.fixed.items() if c in rest}
        need = sum(costs[c] * fixed.get(c, minimum[c]) for c in rest)
        try:
            rounds = plan_rounds(costs, max(available, need), minimum, fixed)
        except PlanError:  # cannot happen with max(); keep the plan as it was
            rounds = {c: self.rounds[c] for c in rest}
        # Running late, every remaining check gives up rounds alike; running early,
        # the time won goes to the last check only, so an estimate that is wrong
        # again later cannot starve it below the others.
        for c in rest[:-1]:
            rounds[c] = min(rounds[c], max(self.first_rounds[c], fixed.get(c, 0)))
        spare = available - sum(costs[c] * rounds[c] for c in rest)
        last = rest[-1]
        if last not in fixed and costs[last] > 0 and spare > costs[last] * rounds[last]:
            rounds[last] = int(spare // costs[last])
        self.rounds.update(rounds)
        self.stage = stage
        self._answer(stage, rest, rounds, costs)
        self.config = with_rounds(self.config, rounds)
        if self.plan is not None:
            self.plan = self.plan.model_copy(
                update={"rounds": dict(self.rounds), "margin": round(self.margin, 4)}
            )

    def done_rounds(self, progress: list[Progress], done: str) -> dict[str, int]:
        """Rounds of the checks done so far, as run (a check cut at its deadline ran
        fewer than planned): what their measured time is compared with."""
        self.ran[done] = min(p.rounds for p in progress)
        return {c: self.ran.get(c, self.rounds[c]) for c in self.spent}

    def startup_parts(self, cals: list[Calibration]) -> dict[str, float]:
        """Where the start-up went: per part, the slowest device's seconds."""
        parts: dict[str, float] = {}
        entered = [c.entered_at for c in cals if c.entered_at is not None]
        if entered:
            parts["launch"] = max(max(entered) - self.started_monotonic, 0.0)
        for cal in cals:
            for name, seconds in cal.phases.items():
                parts[name] = max(parts.get(name, 0.0), seconds)
        return {k: round(v, 3) for k, v in parts.items()}

    def decide(self, cals: list[Calibration]) -> None:
        checks = [c for c in CHECK_NAMES if c in self.opts.checks]
        elapsed = time.perf_counter() - self.started
        parts = self.startup_parts(cals)
        budget = self.opts.budget
        minimum = self.config.baseline_rounds
        fixed: dict[str, int] = {}
        if self.config.golden_steps_fixed:
            fixed["golden"] = self.config.golden.steps
        for cal in cals:  # a check that failed its warm-up runs its minimum only
            for check in cal.errors:
                fixed.setdefault(check, minimum.get(check, 1))
        self.fixed = fixed
        self.round_s = {c: max(cal.round_s.get(c, 0.0) for cal in cals) for c in checks}
        self.spreads = [cv for cal in cals for cv in cal.round_cv.values()]
        self.margin = safety_margin(self.spreads)
        costs = self._costs(checks)
        available = self._end() - time.perf_counter()
        try:
            need_alone = sum(costs[c] * fixed.get(c, minimum[c]) for c in checks)
            # The budget is what the plan aims for; the workers' hard limit (the Job's
            # deadline less the time to report, or --timeout) is what it must end by.
            # A node slow to start, or whose rounds cost more than the budget holds
            # under its load, still runs the smallest complete plan, never less, and
            # the result says it overran and why. Only a plan that cannot end before
            # the hard limit is refused: the workers would be killed in it.
            hard = self.opts.deadline_s()
            if elapsed + need_alone > _less_tail(hard):
                raise PlanError(
                    f"budget {budget:g}s is too small: one round of every check "
                    f"({', '.join(f'{c} {1000 * costs[c]:.0f}ms' for c in checks)}) and the "
                    f"minimum a baseline covers need {need_alone:.1f}s of work alone, and "
                    f"after a start-up of {elapsed:.1f}s that cannot end before the "
                    f"workers' hard limit of {hard:g}s"
                )
            rounds = plan_rounds(costs, max(available, need_alone), minimum, fixed)
        except PlanError as exc:
            self.abort(f"plan: {exc}")
            self.plan = RunPlan(
                budget_s=budget,
                startup_s=round(elapsed, 3),
                startup_parts=parts,
                planned_s=round(elapsed, 3),
                rounds={},
                round_ms={c: round(1000 * s, 3) for c, s in costs.items()},
                error=str(exc)[:300],
            )
            return
        work = sum(costs[c] * rounds[c] for c in checks)
        shortfall = self.target_shortfall(checks, rounds, costs, elapsed)
        if shortfall is not None and self.opts.catch_shortfall == "refuse":
            self.abort(f"plan: {shortfall}")
            self.plan = RunPlan(
                budget_s=budget,
                startup_s=round(elapsed, 3),
                startup_parts=parts,
                planned_s=round(elapsed + work, 3),
                rounds=rounds,
                round_ms={c: round(1000 * s, 3) for c, s in self.round_s.items()},
                error=f"refused: {shortfall}"[:300],
            ).model_copy(update=self.target_fields(False, shortfall))
            return
        if shortfall is not None:  # said before any check runs, in the log and the result
            print(f"sdcprobe: plan: {shortfall}", file=sys.stderr, flush=True)
        self.rounds = dict(rounds)
        self.first_rounds = dict(rounds)
        self._answer(0, checks, rounds, costs)
        self.config = with_rounds(self.config, rounds)
        self.plan = RunPlan(
            budget_s=budget,
            startup_s=round(elapsed, 3),
            startup_parts=parts,
            planned_s=round(elapsed + work, 3),
            rounds=rounds,
            round_ms={c: round(1000 * s, 3) for c, s in self.round_s.items()},
            margin=round(self.margin, 4),
        ).model_copy(update=self.target_fields(shortfall is None, shortfall))

    def needed(self) -> int:
        """Rounds every check needs for the catch target."""
        return rounds_for_target(self.opts.catch_target, self.opts.catch_fraction)

    def target_fields(self, met: bool, shortfall: str | None) -> dict[str, Any]:
        """The plan's statement about the catch target, made before any check runs."""
        return {
            "catch_target": self.opts.catch_target,
            "catch_fraction": self.opts.catch_fraction,
            "rounds_needed": self.needed(),
            "planned_target_met": met,
            "shortfall": shortfall,
        }

    def target_shortfall(
        self, checks: list[str], rounds: dict[str, int], costs: dict[str, float], elapsed: float
    ) -> str | None:
        """Why the planned rounds cannot reach the catch target, with the budget that
        would (at this run's measured round costs and start-up); None when they reach it."""
        needed = self.needed()
        short = {c: rounds[c] for c in checks if rounds[c] < needed}
        if not short:
            return None
        work = sum(costs[c] * max(rounds[c], needed) for c in checks)
        budget = (elapsed + work + TAIL_S) / (1.0 - TAIL_SHARE)
        target, fraction = self.opts.catch_target, self.opts.catch_fraction
        return (
            f"catch target {target:g} for a fault in {100 * fraction:g}% of rounds needs "
            f"{needed} rounds per check; budget {self.opts.budget:g}s plans "
            + ", ".join(f"{c} {n}" for c, n in short.items())
            + f" (reaching {min(catch_probability(fraction, n) for n in short.values()):.3f}); "
            f"a budget of about {math.ceil(budget)}s would reach it"
        )


def _supervise(
    procs: list[subprocess.Popen[bytes]],
    deadline_s: float,
    planner: _Planner | None = None,
    reports: list[Path] | None = None,
) -> str | None:
    """Wait for all workers; returns why the wait was cut short, if it was.

    Once every worker's report is written (``reports``), the wait ends after a short
    grace even if a worker is still exiting: tearing down torch and the process
    group can take seconds that belong to no check (the caller kills what is left)."""
    end = time.monotonic() + deadline_s
    crash_at: float | None = None
    reported_at: float | None = None
    while any(p.poll() is None for p in procs):
        if planner is not None:
            planner.poll()
        now = time.monotonic()
        if reported_at is None and reports and all(r.exists() for r in reports):
            reported_at = now
        if reported_at is not None and now - reported_at > EXIT_GRACE_S:
            return None
        if now > end:
            _kill(procs)
            return f"timed out after {deadline_s:.0f}s"
        if crash_at is None and any(p.returncode not in (None, 0) for p in procs):
            crash_at = now
            if planner is not None:
                planner.abort("a worker crashed before the plan was made")
        if crash_at is not None and now - crash_at > CRASH_GRACE_S:
            _kill(procs)
            return "a worker crashed; the others were stopped"
        time.sleep(0.02)
    return None


def run_probe(opts: RunOptions) -> ProbeRun:
    """Run the checks on every local device and judge the outcome.

    Workers start, warm up and measure one round of every check; the rounds
    are then planned to fill the budget (see :func:`sdcprobe.config.plan_rounds`)
    and every worker runs the same plan."""
    start = opts.started if opts.started is not None else time.perf_counter()
    opts.started = start
    backend = resolve_backend(opts.device)
    if backend == "xla":
        ensure_pjrt_device()  # workers inherit it
    config = opts.config(backend)
    mig = mig_instances() if backend == "cuda" else []
    if backend == "cuda":
        refusal = mig_refusal(list(opts.checks), mig, [] if mig else mig_enabled_gpus())
        if refusal is not None:
            result = ProbeResult(
                verdict="inconclusive",
                reason=f"refused: {refusal}",
                duration_s=round(time.perf_counter() - start, 3),
            )
            return ProbeRun(result=result, reports={}, config=config)
    count = len(mig) if mig else local_device_count(backend, opts.cpu_devices)
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
            plan_timeout_s=opts.deadline_s(),
            stress_s=opts.stress_seconds(backend),
            mig=mig,
        )
        planner = _Planner(opts, config, workdir, count)
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
        envs = [dict(env) for _ in commands]
        for rank, instance in enumerate(mig):  # each worker sees only its own instance
            envs[rank]["CUDA_VISIBLE_DEVICES"] = instance
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for cmd, cmd_env in zip(commands, envs, strict=True):
                # stdout belongs to the result document: worker chatter goes to stderr.
                # Own process group, so a hung worker and anything it started can be
                # killed together; and it dies with us (see _die_with_parent).
                procs.append(
                    subprocess.Popen(
                        cmd,
                        env=cmd_env,
                        stdout=sys.stderr.fileno(),
                        start_new_session=True,
                        preexec_fn=_die_with_parent,
                    )
                )
            written = [report_path(workdir, r) for r in range(count)] if count else None
            cut_short = _supervise(procs, opts.deadline_s(), planner, written)
        finally:
            _kill(procs)  # no-op for workers that finished; never leaves orphans behind
        reports = _collect(workdir, count, procs, cut_short)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    config = planner.config
    run_plan = planner.plan
    if run_plan is not None and planner.answer is not None and not planner.answer.abort:
        done = {
            c: min(
                (len(r.checks[c].steps) if r is not None and c in r.checks else 0)
                for r in reports.values()
            )
            for c in plan.checks
        }
        run_plan = run_plan.model_copy(
            update={
                "run": done,
                "cut": [
                    c
                    for c in plan.checks
                    if done[c] < run_plan.rounds.get(c, 0)
                    and any(
                        r is not None and c in r.checks and r.checks[c].cut_at_deadline
                        for r in reports.values()
                    )
                ],
                "catch": {
                    c: [round(catch_probability(p, n), 4) for p in CATCH_PROBABILITIES]
                    for c, n in done.items()
                },
            }
            | _reached(opts, done)
        )
    result = judge(
        plan.checks,
        reports,
        config,
        opts.baseline,
        injection_enabled=opts.faults is not None,
        duration_s=time.perf_counter() - start,
        plan=run_plan,
    )
    return ProbeRun(result=_say_overrun(result), reports=reports, config=config)


def _reached(opts: RunOptions, done: dict[str, int]) -> dict[str, Any]:
    """The catch chance each check reached with the rounds every device ran, whether
    all of them reached the target, and if not, which fell short."""
    fraction, target = opts.catch_fraction, opts.catch_target
    chance = {c: catch_probability(fraction, n) for c, n in done.items()}
    short = {c: p for c, p in chance.items() if p < target}
    shortfall = None
    if short:
        shortfall = f"catch target {target:g} at {100 * fraction:g}% not reached by " + ", ".join(
            f"{c} ({p:.3f}, {done[c]} rounds)" for c, p in short.items()
        )
    return {
        "catch_chance": {c: round(p, 4) for c, p in chance.items()},
        "target_met": not short,
        "shortfall": shortfall,
    }


def _say_overrun(result: ProbeResult) -> ProbeResult:
    """A run that ended past its budget says why, in its plan and in its reason: how
    much of the budget the start-up took (and its largest part), and that the rounds
    every plan runs (those a baseline covers) still ran, with the work they were
    planned at (a loaded node's rounds can cost more than the budget holds)."""
    plan = result.plan
    if plan is None or plan.error or result.duration_s <= plan.budget_s:
        return result
    largest = max(plan.startup_parts.items(), key=lambda kv: kv[1], default=None)
    part = f"; largest part {largest[0]} {largest[1]:.1f}s" if largest else ""
    work = max(plan.planned_s - plan.startup_s, 0.0)
    why = (
        f"over budget: {result.duration_s:.1f}s against {plan.budget_s:g}s; the start-up "
        f"took {plan.startup_s:.1f}s{part}, and the rounds every plan runs (those a "
        f"baseline covers; {work:.1f}s of work at the round costs measured) ran in full"
    )
    return result.model_copy(
        update={
            "reason": f"{result.reason}; {why}",
            "plan": plan.model_copy(update={"overrun": why}),
        }
    )


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
