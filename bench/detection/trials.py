"""One trial of one profile, in process, through the probe's Python API.

Functions here are module-level and take and return plain picklable data, so a
process pool can run them (``--jobs``). A trial returns an :class:`Outcome`: what
was injected and when, the golden check's verdict, and the per-step scores of the
other detectors (thresholds are applied later, see :mod:`bench.detection.detectors`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from functools import cache

from bench.detection.adapters import (
    TrialInjector,
    bf16_noise_instrumentation,
    golden_instrumentation,
    reordered_instrumentation,
)
from bench.detection.detectors import Signals, gemm_kind, golden_verdict, names_site
from bench.detection.profiles import BY_ID, Context
from sdcprobe.backends import setup_backend
from sdcprobe.checks.golden import GoldenTrace, run_golden
from sdcprobe.config import GoldenConfig, plan_config
from sdcprobe.faults import Injector
from sdcprobe.faultspec import SITES, FaultSpec
from sdcprobe.fingerprint import device_facts
from sdcprobe.judge import build_fingerprint
from sdcprobe.result import Baseline, CheckResult, Fingerprint
from sdcprobe.trace import Steps, first_divergence

#: The node every trial runs on: two devices, faults on device 1.
DEVICES = 2
FAULTY = 1


@dataclass(frozen=True)
class Setup:
    """What every trial of a benchmark run shares."""

    model: GoldenConfig  # steps included; the seed is set per trial
    window: int  # trailing window of the z-score monitors
    ctx: Context


@dataclass
class Reference:
    """The healthy run of one model seed: the baseline every trial of that seed is judged by."""

    seed: int
    items: Steps
    digest: str
    step_digests: list[str]
    cpu_s: float


@dataclass
class Outcome:
    """One trial, before thresholds."""

    profile: str
    trial: int
    seed: int
    injected: int
    hit_steps: list[int]
    masked: bool  # injected, yet the trained parameters came out bitwise healthy
    verdict: str  # the golden check's verdict: pass | fail | inconclusive
    reason: str
    first_step: int | None
    first_item: str | None
    site_named: bool
    signals: Signals | None
    cpu_s: float
    trace_item: str | None = None  # first divergent item of the raw trace comparison
    reused: bool = False  # no fault was ever active: the H0 run of this seed stands in


def fault_seed(profile_id: str, trial: int) -> int:
    """Seed of trial ``trial``'s faults (distinct across profiles and trials)."""
    return 1000 * (1 + list(BY_ID).index(profile_id)) + trial


def _spec(setup: Setup, profile_id: str, trial: int) -> FaultSpec | None:
    faults = BY_ID[profile_id].faults(setup.ctx, fault_seed(profile_id, trial))
    return FaultSpec.model_validate({"faults": faults}) if faults else None


def ever_active(setup: Setup, profile_id: str, trial: int) -> bool:
    """Whether any of the trial's faults is active in some step of the run.

    Replays the injector's own per-step draws without the model. Until a fault is
    first active its generator serves only those draws, so the answer is exact: a
    trial that is never active computes bit for bit the healthy rerun of its model
    seed (H0), whose outcome then stands in for it (see :func:`stand_in`).
    """
    spec = _spec(setup, profile_id, trial)
    if spec is None:
        return False
    injector = Injector(spec, FAULTY)
    every_site = tuple(SITES)
    for step in range(setup.model.steps):
        injector.set_step(step)
        if injector.wants(every_site):
            return True
    return False


def stand_in(healthy: Outcome, profile_id: str, trial: int) -> Outcome:
    """The H0 outcome of a seed, as the outcome of a never-active trial on that seed."""
    return replace(healthy, profile=profile_id, trial=trial, reused=True)


def model_config(setup: Setup, seed: int) -> GoldenConfig:
    """The golden model of ``setup`` with its own model/data seed."""
    return setup.model.model_copy(update={"seed": seed})


@cache
def _facts(threads: int) -> object:
    return device_facts(setup_backend("cpu", 0, threads))


def fingerprint(cfg: GoldenConfig, threads: int = 1) -> Fingerprint:
    """The two-device CPU node's fingerprint for this golden configuration."""
    # The other checks' parameters as the CLI would plan them; the golden one is ours.
    config = plan_config(60, "cpu", steps=cfg.steps, seed=cfg.seed).model_copy(
        update={"golden": cfg}
    )
    facts = _facts(threads)
    return build_fingerprint([facts] * DEVICES, DEVICES, config)  # type: ignore[list-item]


def _baseline(digest: str, step_digests: list[str], fp: Fingerprint) -> Baseline:
    """The baseline document ``sdcprobe baseline`` would record for this healthy run."""
    return Baseline(
        fingerprint=fp, digests={"golden": digest}, step_digests={"golden": step_digests}
    )


def record_reference(setup: Setup, seed: int) -> Reference:
    """Run healthy once (no ABFT: what the golden check costs) and keep its digests."""
    cpu0 = time.process_time()
    trace = run_golden(model_config(setup, seed), None, "cpu", device_index=0)
    cpu = time.process_time() - cpu0
    return Reference(seed, trace.items, trace.digest, trace.step_digests(), cpu)


def run_calibration(setup: Setup, seed: int, bf16: bool = True) -> tuple[Signals, dict[str, float]]:
    """A healthy run's scores and (with ``bf16``) per GEMM kind its largest bf16
    checksum noise."""
    sink: list[tuple[str, float]] = []
    if bf16:
        with golden_instrumentation(bf16_noise_instrumentation(sink)):
            trace = run_golden(model_config(setup, seed), None, "cpu", abft=True)
    else:
        trace = run_golden(model_config(setup, seed), None, "cpu", abft=True)
    noise: dict[str, float] = {}
    for label, value in sink:
        kind = gemm_kind(label)
        noise[kind] = max(noise.get(kind, 0.0), value)
    return Signals.from_trace(trace, setup.window), noise


def _params(items: Steps) -> dict[str, str]:
    return {k: v for k, v in items[-1].items() if k.startswith("param.")} if items else {}


def run_trial(setup: Setup, profile_id: str, trial: int, ref: Reference) -> list[Outcome]:
    """Every outcome of one trial (H1 yields two: guarded H1 and unguarded H1u)."""
    profile = BY_ID[profile_id]
    cfg = model_config(setup, ref.seed)
    fp = fingerprint(cfg)
    baseline = _baseline(ref.digest, ref.step_digests, fp)
    seed = fault_seed(profile_id, trial)
    cpu0 = time.process_time()

    if profile.kind == "reorder":
        # The probe enforces deterministic algorithms: the reordering kernel refuses to run.
        error = None
        try:
            with golden_instrumentation(reordered_instrumentation("ffn.down", seed, True)):
                run_golden(cfg, None, "cpu", device_index=FAULTY)
        except RuntimeError as exc:
            error = f"{type(exc).__name__}: {exc}"
        guarded = golden_verdict(None, ref.items, ref.digest, baseline, fp, error=error)
        # The training job (and a kernel that escapes the guard) runs it anyway.
        with golden_instrumentation(reordered_instrumentation("ffn.down", seed, False)):
            trace = run_golden(cfg, None, "cpu", device_index=FAULTY, abft=True)
        cpu = time.process_time() - cpu0
        signals = Signals.from_trace(trace, setup.window)
        loose = golden_verdict(trace, ref.items, ref.digest, baseline, fp)
        return [
            _outcome("H1", trial, ref, guarded, signals, cpu, trace, None),
            _outcome("H1u", trial, ref, loose, signals, cpu, trace, None),
        ]

    if profile.kind == "fingerprint":
        other = fingerprint(cfg, threads=2)
        recorded = run_golden(cfg, None, "cpu", threads=2)
        baseline = _baseline(recorded.digest, recorded.step_digests(), other)

    spec = _spec(setup, profile_id, trial)
    injector = TrialInjector(spec, FAULTY, profile.exact_counts, cfg.n_layers)
    trace = run_golden(cfg, injector, "cpu", device_index=FAULTY, abft=True, threads=1)
    injector.finish()
    cpu = time.process_time() - cpu0
    result = golden_verdict(trace, ref.items, ref.digest, baseline, fp)
    return [
        _outcome(
            profile.id,
            trial,
            ref,
            result,
            Signals.from_trace(trace, setup.window),
            cpu,
            trace,
            injector,
            profile.sites(setup.ctx),
            first_divergence(ref.items, trace.items),
        )
    ]


def _outcome(
    pid: str,
    trial: int,
    ref: Reference,
    result: CheckResult,
    signals: Signals,
    cpu: float,
    trace: GoldenTrace,
    injector: TrialInjector | None,
    sites: list[str] | None = None,
    divergence: tuple[int, str | None] | None = None,
) -> Outcome:
    injected = sum(injector.counts.values()) if injector is not None else 0
    masked = injected > 0 and _params(trace.items) == _params(ref.items)
    return Outcome(
        profile=pid,
        trial=trial,
        seed=ref.seed,
        injected=injected,
        hit_steps=list(injector.hit_steps) if injector is not None else [],
        masked=masked,
        verdict=result.verdict,
        reason=result.reason[:200],
        first_step=result.first_divergent_step,
        first_item=result.first_divergent_submodule,
        site_named=names_site(result.first_divergent_submodule, sites or []),
        signals=signals,
        cpu_s=cpu,
        trace_item=divergence[1] if divergence else None,
    )
