"""``compute``: seeded GEMMs per dtype, replayed bitwise and checksummed (ABFT).

Each round draws fresh inputs on the host from (seed, round, dtype), so every
device and every run multiplies the same matrices. Each GEMM is computed twice
in a row (a replay on the same device must agree to the bit) and its output is
checked with row/column checksums against an fp64 reference (see
:mod:`sdcprobe.abft`). The trace item per (round, dtype) is the output's digest.
"""

from __future__ import annotations

import time

import torch

from sdcprobe.abft import GemmResidual, abft_residual
from sdcprobe.backends import Backend
from sdcprobe.config import ComputeConfig, round_seed
from sdcprobe.deadline import RoundClock, round_spread
from sdcprobe.instrument import Instrumentation, tensor_digest
from sdcprobe.trace import STEP_DIGEST_CHARS, CheckTrace, Evidence, trace_digest, typical_round

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}


def gemm_inputs(
    seed: int, step: int, dtype_name: str, size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Host operands of one GEMM, identical on every device and run."""
    order = list(_DTYPES).index(dtype_name)
    gen = torch.Generator().manual_seed(seed * 1_000_033 + step * 101 + order + 5)
    dtype = _DTYPES[dtype_name]
    a = torch.randn(size, size, generator=gen, dtype=torch.float32).to(dtype)
    b = torch.randn(size, size, generator=gen, dtype=torch.float32).to(dtype)
    return a, b


#: GEMM sizes the peak microbenchmark tries, per backend (largest last).
PEAK_LADDER: dict[str, tuple[int, ...]] = {
    "cpu": (128, 256, 512, 1024),
    "cuda": (1024, 2048, 4096, 8192),
    "xla": (512, 1024, 2048, 4096),
}
#: Stop growing a dtype's ladder once one GEMM takes longer than this (CPU fp16).
_PEAK_GEMM_CAP_S = 0.05


def compute_dtypes(cfg: ComputeConfig, backend: Backend) -> list[str]:
    """The dtypes of ``cfg`` this device runs, in order."""
    return [d for d in cfg.sizes if d in _DTYPES and backend.supports(_DTYPES[d])]


def measure_peak(cfg: ComputeConfig, backend: Backend) -> dict[str, float]:
    """This device's GEMM throughput per dtype in GFLOP/s, measured now: the best
    over square GEMMs of the ladder's sizes (and the check's own size), each timed
    after one untimed call. A dtype whose GEMMs get slow stops early (CPU fp16
    has no fast kernel and is fastest small), and so does one whose throughput fell
    at a size at least twice the check's own (past its peak: the larger sizes cost
    the most start-up time and only fall further)."""
    ladder = PEAK_LADDER["xla" if backend.name == "xla" else backend.name]
    peaks: dict[str, float] = {}
    for name in compute_dtypes(cfg, backend):
        best = last = 0.0
        for size in sorted({*ladder, cfg.sizes[name]}):
            if size > 2 * cfg.sizes[name] and best > last:
                break  # the size before fell below the best: past the peak
            gen = torch.Generator().manual_seed(size)
            a = torch.randn(size, size, generator=gen).to(_DTYPES[name]).to(backend.device)
            b = torch.randn(size, size, generator=gen).to(_DTYPES[name]).to(backend.device)
            (a @ b).sum()
            backend.sync()
            reps, elapsed, fastest = 0, 0.0, float("inf")
            while reps < 5 or (elapsed < 0.05 and reps < 64):
                t0 = time.perf_counter()
                out = a @ b
                backend.step_boundary()
                backend.sync()
                took = time.perf_counter() - t0
                fastest, elapsed, reps = min(fastest, took), elapsed + took, reps + 1
                if took > _PEAK_GEMM_CAP_S and reps >= 2:
                    break
            del out
            # The fastest call: a load spike on a shared machine is not the device's peak.
            last = 2 * size**3 / fastest / 1e9
            best = max(best, last)
            if fastest > _PEAK_GEMM_CAP_S:
                break
        peaks[name] = best
    return peaks


def run_compute(
    cfg: ComputeConfig,
    seed: int,
    ins: Instrumentation,
    peaks: dict[str, float] | None = None,
    clock: RoundClock | None = None,
    data_seed: int | None = None,
    fresh_from: int = 0,
) -> CheckTrace:
    """Run the compute check on ``ins.backend``; residuals are left in ``ins.residuals``.

    Rounds from ``fresh_from`` on draw their inputs from ``data_seed`` (the
    screening's own seed), the rounds before it from ``seed`` (what a baseline covers).

    ``peaks`` (GFLOP/s per dtype, from :func:`measure_peak` in the same run) turn
    the checked GEMMs' measured throughput into a ratio to the device's peak.
    ``clock``: no round starts that would end past its deadline.
    """
    backend = ins.backend
    ins.abft_enabled = False  # residuals are computed below, outside the GEMM timing
    start, cpu0 = time.perf_counter(), time.process_time()
    steps: list[dict[str, str]] = []
    evidence: list[Evidence] = []
    dtypes = compute_dtypes(cfg, backend)
    gemm_s = dict.fromkeys(dtypes, 0.0)
    fastest = dict.fromkeys(dtypes, float("inf"))
    round_times: list[float] = []
    cut = False
    for step in range(cfg.rounds):
        if clock is not None and not clock.allows(step, typical_round(round_times)):
            cut = True
            break
        r0 = time.perf_counter()
        ins.set_step(step)
        items: dict[str, str] = {}
        for name in dtypes:
            size = cfg.sizes[name]
            a_host, b_host = gemm_inputs(
                round_seed(seed, data_seed, step, fresh_from), step, name, size
            )
            a, b = a_host.to(backend.device), b_host.to(backend.device)
            backend.sync()
            t0 = time.perf_counter()
            first = ins.matmul(a, b, "matmul")
            again = ins.matmul(a, b, "matmul")
            backend.step_boundary()
            backend.sync()
            took = time.perf_counter() - t0
            gemm_s[name] += took
            fastest[name] = min(fastest[name], took / 2)
            first_digest = tensor_digest(first)
            residual = abft_residual(a, b, first, label="matmul", step=step)
            # A replay equal to the bit has the same residual: computed once (the fp64
            # checksums cost about as much as the GEMM itself on the CPU).
            replayed = tensor_digest(again) == first_digest
            again_residual = (
                residual if replayed else abft_residual(a, b, again, label="matmul", step=step)
            )
            ins.residuals += [residual, again_residual]
            if not replayed:
                diff = int((backend.to_host(first) != backend.to_host(again)).sum())
                evidence.append(
                    Evidence(
                        kind="replay",
                        step=step,
                        item=name,
                        detail=f"replay differs in {diff} elements",
                    )
                )
            items[name] = first_digest[:STEP_DIGEST_CHARS]
        steps.append(items)
        round_times.append(time.perf_counter() - r0)
    residuals = ins.residuals
    for r in residuals:
        if r.detected:
            evidence.append(
                Evidence(
                    kind="abft",
                    step=r.step,
                    item=r.dtype,
                    detail=f"ABFT residual {r.ratio:.3g}x tolerance ({r.m}x{r.k}x{r.n})",
                )
            )
    wall = time.perf_counter() - start
    ran = len(steps)
    gflops = {n: 2 * 2 * cfg.sizes[n] ** 3 * ran / s / 1e9 for n, s in gemm_s.items() if s > 0}
    metrics: dict[str, int | float | str | None] = {
        "rounds": ran,
        "gemms": 2 * ran * len(dtypes),
        "dtypes": ",".join(dtypes),
        "sizes": ",".join(str(cfg.sizes[n]) for n in dtypes),
        "gflops": " ".join(f"{n}:{g:.4g}" for n, g in gflops.items()),
        # Share of the check's time spent inside the GEMMs (the rest: drawing
        # inputs, checksums, digests).
        "gemm_busy": round(sum(gemm_s.values()) / wall, 3) if wall > 0 else None,
    }
    if peaks:
        # Fastest checked GEMM against the fastest microbenchmark GEMM: whether the
        # shapes reach the device's peak, independent of load spikes in between.
        ratios = {
            n: 2 * cfg.sizes[n] ** 3 / fastest[n] / 1e9 / peaks[n]
            for n in dtypes
            if peaks.get(n) and fastest[n] < float("inf")
        }
        metrics["peak_gflops"] = " ".join(f"{n}:{peaks[n]:.4g}" for n in dtypes if n in peaks)
        metrics["peak_ratio"] = " ".join(f"{n}:{r:.3f}" for n, r in ratios.items())
        metrics["peak_ratio_min"] = round(min(ratios.values()), 3) if ratios else None
    metrics.update(_abft_metrics(residuals))
    return CheckTrace(
        digest=trace_digest(steps),
        steps=steps,
        evidence=evidence,
        metrics=metrics,
        wall_s=wall,
        cpu_s=time.process_time() - cpu0,
        round_s=typical_round(round_times),
        round_cv=round(round_spread(round_times), 4),
        cut_at_deadline=cut,
    )


def _abft_metrics(residuals: list[GemmResidual]) -> dict[str, int | float | str | None]:
    """Worst ABFT residual per dtype, as tolerance ratio and in fp32/bf16 terms."""
    out: dict[str, int | float | str | None] = {}
    for dtype in sorted({r.dtype for r in residuals}):
        worst = max((r for r in residuals if r.dtype == dtype), key=lambda r: r.ratio)
        out[f"abft_ratio_{dtype}"] = _finite(worst.ratio)
        out[f"abft_fp32_units_{dtype}"] = _finite(worst.fp32_units)
        out[f"abft_bf16_units_{dtype}"] = _finite(worst.bf16_units)
    return out


def _finite(x: float) -> float | str:
    # JSON has no infinity; keep the metric readable instead of dropping it.
    return float(f"{x:.4g}") if x == x and abs(x) != float("inf") else str(x)
