"""Algorithm-based fault tolerance (ABFT) checksums for GEMMs, with honest tolerances.

For ``C = A @ B`` the column sums of ``C`` must equal ``(1ᵀA) B`` and the row sums
``A (B 1)``. Both references are computed in fp64 on the host from the exact
inputs, so the only legitimate difference is the rounding of the GEMM itself.
The tolerance is the worst-case rounding bound of a correct GEMM (Higham,
*Accuracy and Stability of Numerical Algorithms*, 2nd ed., §3.5), summed over the
checksum direction:

    |sum_i C_ij - ref_j| <= gamma_k(u_acc) * sum_i (|A||B|)_ij + u_out * sum_i |C_ij| + fp64

with ``k`` the reduction length, ``u_acc`` the unit roundoff of the accumulator
(fp32 for fp32/bf16/fp16 GEMMs; fp64 for fp64) and ``u_out`` that of the output
type. A correct GEMM can never exceed it in any summation order, so a residual
above it (times a safety factor of 2 for accumulators that round partial sums
once more) is corruption, never a false alarm. The price of honesty: errors
smaller than the bound pass, which is why this check alone misses most SDC and
the probe relies on bitwise comparisons first.

Residuals are also expressed in "fp32 terms" and "bf16 terms": the residual
divided by the bound a correct GEMM with fp32 (resp. bf16) output would have,
so a benchmark can ask which corruptions an ABFT at either precision would see.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

SAFETY = 2.0
_U64 = 2.0**-53
_UNIT_ROUNDOFF: dict[torch.dtype, float] = {
    torch.float64: 2.0**-53,
    torch.float32: 2.0**-24,
    torch.bfloat16: 2.0**-8,
    torch.float16: 2.0**-11,
}


def unit_roundoff(dtype: torch.dtype) -> float:
    """Unit roundoff of ``dtype`` (half the machine epsilon)."""
    return _UNIT_ROUNDOFF.get(dtype, 2.0**-8)


def accumulator_roundoff(dtype: torch.dtype) -> float:
    """Unit roundoff of the accumulator a correct GEMM of ``dtype`` uses."""
    return _U64 if dtype == torch.float64 else 2.0**-24


def _gamma(n: int, u: float) -> float:
    nu = n * u
    return nu / (1.0 - nu) if nu < 1.0 else math.inf


@dataclass(frozen=True)
class GemmResidual:
    """ABFT outcome of one GEMM.

    ``ratio`` > 1 means the residual exceeds the tolerance (corruption).
    ``fp32_units`` / ``bf16_units``: residual over the rounding bound of a correct
    GEMM of this shape with fp32 / bf16 output (no safety factor).
    """

    label: str
    step: int
    dtype: str
    m: int
    k: int
    n: int
    max_residual: float
    ratio: float
    fp32_units: float
    bf16_units: float

    @property
    def detected(self) -> bool:
        """Whether the residual exceeds the tolerance."""
        return self.ratio > 1.0


def _safe_div(num: torch.Tensor, den: torch.Tensor) -> float:
    if not bool(torch.isfinite(num).all()):
        return math.inf
    q = torch.where(den > 0, num / den.clamp_min(1e-300), torch.where(num > 0, math.inf, 0.0))
    return float(q.max()) if q.numel() else 0.0


def abft_residual(
    a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, label: str = "", step: int = 0
) -> GemmResidual:
    """Row and column checksum residuals of ``c ≈ a @ b`` (batched shapes allowed).

    ``a``: ``[..., m, k]``, ``b``: ``[..., k, n]`` or ``[k, n]``, ``c``: ``[..., m, n]``,
    on any device; the arithmetic runs in fp64 on the host.
    """
    dtype = c.dtype
    a64 = a.detach().to("cpu", torch.float64)
    b64 = b.detach().to("cpu", torch.float64)
    c64 = c.detach().to("cpu", torch.float64)
    m, k, n = a64.shape[-2], a64.shape[-1], b64.shape[-1]
    aa, ba, ca = a64.abs(), b64.abs(), c64.abs()

    col_res = (c64.sum(-2) - (a64.sum(-2).unsqueeze(-2) @ b64).squeeze(-2)).abs()
    col_ab = (aa.sum(-2).unsqueeze(-2) @ ba).squeeze(-2)
    col_c = ca.sum(-2)
    row_res = (c64.sum(-1) - (a64 @ b64.sum(-1, keepdim=True)).squeeze(-1)).abs()
    row_ab = (aa @ ba.sum(-1, keepdim=True)).squeeze(-1)
    row_c = ca.sum(-1)

    g_acc = _gamma(k, accumulator_roundoff(dtype))
    g_ref = _gamma(m + k + n + 2, _U64)  # the fp64 checksums' own rounding

    def bound(u_out: float, ab: torch.Tensor, cs: torch.Tensor) -> torch.Tensor:
        return g_acc * ab + u_out * cs + g_ref * (ab + cs)

    u_out = unit_roundoff(dtype)
    ratio = max(
        _safe_div(col_res, SAFETY * bound(u_out, col_ab, col_c)),
        _safe_div(row_res, SAFETY * bound(u_out, row_ab, row_c)),
    )
    fp32 = max(
        _safe_div(col_res, bound(2.0**-24, col_ab, col_c)),
        _safe_div(row_res, bound(2.0**-24, row_ab, row_c)),
    )
    bf16 = max(
        _safe_div(col_res, bound(2.0**-8, col_ab, col_c)),
        _safe_div(row_res, bound(2.0**-8, row_ab, row_c)),
    )
    finite = bool(torch.isfinite(col_res).all()) and bool(torch.isfinite(row_res).all())
    max_res = max(float(col_res.max()), float(row_res.max())) if finite else math.inf
    return GemmResidual(
        label=label,
        step=step,
        dtype=str(dtype).removeprefix("torch."),
        m=int(m),
        k=int(k),
        n=int(n),
        max_residual=max_res,
        ratio=ratio,
        fp32_units=fp32,
        bf16_units=bf16,
    )
