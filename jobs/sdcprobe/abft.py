"""Algorithm-based fault tolerance (ABFT) checksums for GEMMs, with honest tolerances.

For ``C = A @ B`` the column sums of ``C`` must equal ``(1ᵀA) B`` and the row sums
``A (B 1)``. Both references are computed on the device, in fp64 where it has
fp64 (fp32 on TPU and Neuron, with the bound widened to match), from the exact
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
import os
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


def _worst_ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """max(num / den) as a 0-d device tensor, inf where a residual is not finite or a
    positive residual meets a zero bound (no host sync, no scalar tensors per call)."""
    q = torch.nan_to_num(num / den.clamp_min(1e-300), nan=math.inf)
    return q.amax() if q.numel() else torch.zeros((), dtype=num.dtype, device=num.device)


def reference_dtype(device: torch.device) -> torch.dtype:
    """The precision ABFT references are computed in on ``device``: fp64 wherever the
    device has it (CPU, CUDA, XLA on the host), fp32 on TPU and Neuron cores."""
    if device.type == "xla" and os.environ.get("PJRT_DEVICE", "CPU").upper() != "CPU":
        return torch.float32
    return torch.float64


def abft_on_device(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Row and column checksum residuals of ``c ≈ a @ b`` on the tensors' device.

    Returns a ``[4]`` tensor in the reference precision, on the device (nothing is
    copied to the host): the residual over its tolerance (> 1: corruption), the
    residual in fp32 and in bf16 terms, and the largest absolute residual.
    ``a``: ``[..., m, k]``, ``b``: ``[..., k, n]`` or ``[k, n]``, ``c``: ``[..., m, n]``.
    """
    dtype = c.dtype
    ref = reference_dtype(c.device)
    a64 = a.detach().to(ref)
    b64 = b.detach().to(ref)
    c64 = c.detach().to(ref)
    m, k, n = a64.shape[-2], a64.shape[-1], b64.shape[-1]
    aa, ba, ca = a64.abs(), b64.abs(), c64.abs()

    col_res = (c64.sum(-2) - (a64.sum(-2).unsqueeze(-2) @ b64).squeeze(-2)).abs()
    col_ab = (aa.sum(-2).unsqueeze(-2) @ ba).squeeze(-2)
    col_c = ca.sum(-2)
    row_res = (c64.sum(-1) - (a64 @ b64.sum(-1, keepdim=True)).squeeze(-1)).abs()
    row_ab = (aa @ ba.sum(-1, keepdim=True)).squeeze(-1)
    row_c = ca.sum(-1)

    g_acc = _gamma(k, accumulator_roundoff(dtype))
    g_ref = _gamma(m + k + n + 2, _U64 if ref == torch.float64 else 2.0**-24)

    def bound(u_out: float, ab: torch.Tensor, cs: torch.Tensor) -> torch.Tensor:
        return g_acc * ab + u_out * cs + g_ref * (ab + cs)

    def worst(u_out: float, safety: float) -> torch.Tensor:
        return torch.maximum(
            _worst_ratio(col_res, safety * bound(u_out, col_ab, col_c)),
            _worst_ratio(row_res, safety * bound(u_out, row_ab, row_c)),
        )

    largest = torch.nan_to_num(torch.maximum(col_res.amax(), row_res.amax()), nan=math.inf)
    return torch.stack(
        [worst(unit_roundoff(dtype), SAFETY), worst(2.0**-24, 1.0), worst(2.0**-8, 1.0), largest]
    )


def residual_from(
    values: list[float], dtype: torch.dtype, shape: tuple[int, int, int], label: str, step: int
) -> GemmResidual:
    """A :class:`GemmResidual` from the four numbers :func:`abft_on_device` returned
    (once they reached the host)."""
    ratio, fp32, bf16, largest = values
    m, k, n = shape
    return GemmResidual(
        label=label,
        step=step,
        dtype=str(dtype).removeprefix("torch."),
        m=m,
        k=k,
        n=n,
        max_residual=largest,
        ratio=ratio,
        fp32_units=fp32,
        bf16_units=bf16,
    )


def abft_residual(
    a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, label: str = "", step: int = 0
) -> GemmResidual:
    """:func:`abft_on_device`, read back at once (benchmarks and the golden model's
    optional per-GEMM residuals; the compute check batches its reads per round)."""
    values = abft_on_device(a, b, c).detach().to("cpu", torch.float64).tolist()
    shape = (int(a.shape[-2]), int(a.shape[-1]), int(b.shape[-1]))
    return residual_from(values, c.dtype, shape, label, step)
