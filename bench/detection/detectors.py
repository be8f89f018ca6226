"""The five detectors, as pure functions of one trial's trace.

* ``golden``: the probe's own judge (:func:`sdcprobe.judge.judge_check`) on a
  two-device node: device 1 ran the trial, device 0 is healthy, and a baseline
  recorded on a healthy run of the same fingerprint is given. A healthy device
  computes the healthy bits (profile H0 checks exactly that), so device 0's trace
  *is* the recorded healthy trace. Detected = verdict ``fail`` (SDC): some digest
  of some step (a submodule output, the loss, a gradient, an update, a parameter)
  differs bitwise from the baseline or from the other device.
* ``abft_bf16`` / ``abft_fp32``: the checksum residual of every GEMM of the run,
  per GEMM kind (``attention.qkv``, ``ffn.down``, ...), divided by a threshold
  calibrated on healthy runs; a step alarms when any GEMM exceeds it.
* ``loss`` / ``grad_norm``: a spike monitor, the z-score of each step's value
  against the trailing window of the previous ``window`` steps; a step alarms
  when z exceeds a calibrated threshold or the value is not finite.

Every non-golden detector reduces a trial to one score per step (see
:class:`Signals`); thresholds are applied afterwards, so the same trials serve
calibration and evaluation.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from sdcprobe.abft import GemmResidual
from sdcprobe.checks.golden import GoldenTrace
from sdcprobe.judge import judge_check
from sdcprobe.result import Baseline, CheckResult, Fingerprint
from sdcprobe.trace import CheckTrace, Evidence, Steps

DETECTORS: tuple[str, ...] = ("golden", "abft_bf16", "abft_fp32", "loss", "grad_norm")
SERIES: tuple[str, ...] = DETECTORS[1:]
LABELS: dict[str, str] = {
    "golden": "golden (ours)",
    "abft_bf16": "ABFT bf16",
    "abft_fp32": "ABFT fp32",
    "loss": "loss z-score",
    "grad_norm": "grad-norm z-score",
}

#: Smallest z-score threshold of the monitors (the usual three-sigma rule).
Z_FLOOR = 3.0

#: The GEMMs of the golden model (what ``matmul`` hits and ABFT checks).
GEMM_KINDS: tuple[str, ...] = (
    "attention.qkv",
    "attention.scores",
    "attention.context",
    "attention.output",
    "ffn.up",
    "ffn.down",
    "lm_head",
)


def gemm_kind(label: str) -> str:
    """``layers.1.ffn.down`` -> ``ffn.down``."""
    parts = label.split(".")
    return ".".join(parts[2:]) if parts[0] == "layers" and len(parts) > 2 else label


def zscores(values: Sequence[float], window: int) -> list[float]:
    """Per step: (x_t - mean) / std of the ``window`` previous values; inf for a
    non-finite x_t, -inf where the window is not full yet (no judgement possible)."""
    out: list[float] = []
    for t, x in enumerate(values):
        if not math.isfinite(x):
            out.append(math.inf)
            continue
        if t < window:
            out.append(-math.inf)
            continue
        past = values[t - window : t]
        if not all(math.isfinite(v) for v in past):
            out.append(math.inf)
            continue
        mean = sum(past) / window
        sd = math.sqrt(sum((v - mean) ** 2 for v in past) / (window - 1))
        if sd == 0.0:
            out.append(0.0 if x == mean else math.copysign(math.inf, x - mean))
        else:
            out.append((x - mean) / sd)
    return out


def abft_units(residuals: Sequence[GemmResidual], steps: int, unit: str) -> dict[str, list[float]]:
    """Per GEMM kind, the worst residual of each step in ``unit`` (``bf16`` or ``fp32``)."""
    out: dict[str, list[float]] = {}
    for r in residuals:
        value = r.bf16_units if unit == "bf16" else r.fp32_units
        if not math.isfinite(value) or value != value:
            value = math.inf
        series = out.setdefault(gemm_kind(r.label), [0.0] * steps)
        series[r.step] = max(series[r.step], value)
    return out


@dataclass
class Signals:
    """One trial reduced to scores per step, before any threshold is applied."""

    loss: list[float]
    grad_norm: list[float]
    abft: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # unit -> kind -> steps
    monitor_cpu_s: float = 0.0  # what the two z-score monitors cost on this trial

    @classmethod
    def from_trace(cls, trace: GoldenTrace, window: int) -> Signals:
        steps = len(trace.steps)
        cpu0 = time.process_time()
        loss, grad = zscores(trace.losses, window), zscores(trace.grad_norms, window)
        return cls(
            loss=loss,
            grad_norm=grad,
            abft={u: abft_units(trace.residuals, steps, u) for u in ("bf16", "fp32")},
            monitor_cpu_s=time.process_time() - cpu0,
        )


@dataclass(frozen=True)
class Thresholds:
    """Alarm thresholds: z-scores for the monitors, per GEMM kind for ABFT."""

    loss: float
    grad_norm: float
    abft_bf16: dict[str, float]
    abft_fp32: dict[str, float]


def calibrate(
    healthy: Sequence[Signals], bf16_noise: dict[str, float], headroom: float
) -> Thresholds:
    """Thresholds that no healthy calibration run reaches: the largest healthy score
    times ``1 + headroom`` (for the z-score monitors at least :data:`Z_FLOOR`: a loss
    that only ever falls has negative z-scores on healthy runs).

    ABFT at fp32 resolution is calibrated on the runs' own (fp32) residuals. ABFT at
    bf16 resolution is calibrated on ``bf16_noise``: the residuals of the same GEMMs
    with their outputs rounded to bf16, which is what a checksum on a bf16 GEMM sees
    on healthy hardware; it is capped at 1 (the worst-case rounding bound, which a
    correct bf16 GEMM can never exceed).
    """
    scale = 1.0 + headroom

    def top(values: Sequence[float]) -> float:
        finite = [v for v in values if math.isfinite(v)]
        return max(finite, default=0.0)

    fp32: dict[str, float] = {}
    for s in healthy:
        for kind, series in s.abft.get("fp32", {}).items():
            fp32[kind] = max(fp32.get(kind, 0.0), top(series))
    return Thresholds(
        loss=max(Z_FLOOR, scale * top([z for s in healthy for z in s.loss])),
        grad_norm=max(Z_FLOOR, scale * top([z for s in healthy for z in s.grad_norm])),
        abft_bf16={k: min(scale * v, 1.0) for k, v in sorted(bf16_noise.items())},
        abft_fp32={k: scale * v for k, v in sorted(fp32.items())},
    )


def first_alarm(signals: Signals, detector: str, thresholds: Thresholds, start: int) -> int | None:
    """First step >= ``start`` at which ``detector`` alarms; None if it never does."""
    if detector in ("loss", "grad_norm"):
        series = signals.loss if detector == "loss" else signals.grad_norm
        limit = getattr(thresholds, detector)
        return next((t for t, z in enumerate(series) if t >= start and z > limit), None)
    unit = "bf16" if detector == "abft_bf16" else "fp32"
    limits = thresholds.abft_bf16 if unit == "bf16" else thresholds.abft_fp32
    hits = [
        t
        for kind, series in signals.abft.get(unit, {}).items()
        for t, v in enumerate(series)
        if t >= start and v > limits.get(kind, 1.0)
    ]
    return min(hits, default=None)


def peak(signals: Signals, detector: str, thresholds: Thresholds) -> float:
    """The trial's largest score relative to the threshold (> 1: alarm somewhere)."""
    if detector in ("loss", "grad_norm"):
        series = signals.loss if detector == "loss" else signals.grad_norm
        limit = getattr(thresholds, detector)
        z = max(series, default=-math.inf)
        return math.inf if z == math.inf else (z / limit if limit > 0 else z)
    unit = "bf16" if detector == "abft_bf16" else "fp32"
    limits = thresholds.abft_bf16 if unit == "bf16" else thresholds.abft_fp32
    return max(
        (
            max(series) / limits.get(kind, 1.0)
            for kind, series in signals.abft.get(unit, {}).items()
        ),
        default=0.0,
    )


def golden_verdict(
    trial: GoldenTrace | None,
    healthy_items: Steps,
    healthy_digest: str,
    baseline: Baseline,
    fingerprint: Fingerprint,
    error: str | None = None,
) -> CheckResult:
    """The golden check's verdict as the probe's judge gives it for a two-device node:
    device 0 healthy, device 1 the trial (or ``error`` if its run raised)."""
    if trial is None:
        faulty = CheckTrace(error=error or "no result")
    else:
        evidence = []
        bad = next((s.step for s in trial.steps if not math.isfinite(s.loss)), None)
        if bad is not None:  # what the probe's golden check adds on a non-finite loss
            evidence.append(
                Evidence(kind="nonfinite", step=bad, item="loss", detail="loss is not finite")
            )
        faulty = CheckTrace(digest=trial.digest, steps=trial.items, evidence=evidence)
    healthy = CheckTrace(digest=healthy_digest, steps=healthy_items)
    return judge_check("golden", {0: healthy, 1: faulty}, baseline, fingerprint)


def names_site(item: str | None, sites: Sequence[str]) -> bool:
    """Whether a first divergent item (``layers.0.ffn.down``, ``grad.embedding``) lies at
    one of the injected fault sites."""
    if item is None:
        return False
    kind = gemm_kind(item)
    for site in sites:
        if site == "*":
            return True
        if site == "matmul" and kind in GEMM_KINDS:
            return True
        if site == "grad.weight" and item.startswith("grad."):
            return True
        if site in ("optimizer", "param") and item.startswith(site + "."):
            return True
        if site == "norm" and kind in ("norm1", "norm2", "final_norm"):
            return True
        if site == "activation" and kind == "ffn.activation":
            return True
        if site == kind:
            return True
    return False


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion k/n ((0, 1) when n = 0)."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, centre - half), min(1.0, centre + half)
