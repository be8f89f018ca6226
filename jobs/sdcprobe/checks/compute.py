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

from sdcprobe.abft import GemmResidual
from sdcprobe.config import ComputeConfig
from sdcprobe.instrument import Instrumentation, tensor_digest
from sdcprobe.trace import STEP_DIGEST_CHARS, CheckTrace, Evidence, trace_digest

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


def run_compute(cfg: ComputeConfig, seed: int, ins: Instrumentation) -> CheckTrace:
    """Run the compute check on ``ins.backend``; residuals are left in ``ins.residuals``."""
    backend = ins.backend
    ins.abft_enabled = True
    start, cpu0 = time.perf_counter(), time.process_time()
    steps: list[dict[str, str]] = []
    evidence: list[Evidence] = []
    flops = 0.0
    gemm_s = 0.0
    dtypes = [d for d in cfg.sizes if d in _DTYPES and backend.supports(_DTYPES[d])]
    for step in range(cfg.rounds):
        ins.set_step(step)
        items: dict[str, str] = {}
        for name in dtypes:
            size = cfg.sizes[name]
            a_host, b_host = gemm_inputs(seed, step, name, size)
            a, b = a_host.to(backend.device), b_host.to(backend.device)
            t0 = time.perf_counter()
            first = ins.matmul(a, b, "matmul")
            again = ins.matmul(a, b, "matmul")
            backend.sync()
            gemm_s += time.perf_counter() - t0
            flops += 2 * 2 * size**3
            first_digest = tensor_digest(first)
            if tensor_digest(again) != first_digest:
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
    metrics: dict[str, int | float | str | None] = {
        "rounds": cfg.rounds,
        "gemms": 2 * cfg.rounds * len(dtypes),
        "dtypes": ",".join(dtypes),
        "gflops": round(flops / gemm_s / 1e9, 3) if gemm_s > 0 else None,
    }
    metrics.update(_abft_metrics(residuals))
    return CheckTrace(
        digest=trace_digest(steps),
        steps=steps,
        evidence=evidence,
        metrics=metrics,
        wall_s=time.perf_counter() - start,
        cpu_s=time.process_time() - cpu0,
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
