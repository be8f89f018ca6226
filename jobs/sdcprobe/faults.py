"""The fault injector: applies a :class:`~sdcprobe.faultspec.FaultSpec` to hooked outputs.

Design points:

* Each fault draws from its own ``torch.Generator`` seeded from ``fault.seed`` and
  kept on the host, so injection never touches the workload's random streams and
  a run with faults computes exactly what a healthy run does everywhere else.
* Selection (which elements, which bit) happens on the host and only the chosen
  elements travel to the host and back, so the same code serves CPU, CUDA and XLA
  (on XLA the changing number of hit elements costs recompilations, which is
  acceptable for tests and benchmarks).
* The generator is not rewound between the two passes of a replay: a random
  fault is transient, as in hardware, and a replay sees different hits. A fault
  with ``rate`` 1 (for instance behind an ``operand_mask``) repeats exactly,
  like a deterministic defect, and only a baseline or another device exposes it.
* Every device uses the same seed, so an unrestricted fault hits every device
  identically; ``device`` restricts a fault to one device.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable

import torch

from sdcprobe.faultspec import Fault, FaultSpec

# (exponent bits, mantissa bits) of the float formats we corrupt.
_FORMATS: dict[torch.dtype, tuple[int, int]] = {
    torch.float32: (8, 23),
    torch.bfloat16: (8, 7),
    torch.float16: (5, 10),
    torch.float64: (11, 52),
}
_INT_VIEW: dict[torch.dtype, torch.dtype] = {
    torch.float32: torch.int32,
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
    torch.float64: torch.int64,
}


def map_bit(fp32_bit: int, dtype: torch.dtype) -> int:
    """Map an fp32 bit position onto ``dtype``'s bit layout.

    Sign maps to sign; exponent and mantissa bits keep their relative position
    counted from the top of their field, so "high mantissa" stays high mantissa
    (the class of error is what a fault spec describes, not the exact bit).
    """
    exp_bits, mant_bits = _FORMATS[dtype]
    if fp32_bit == 31:
        return exp_bits + mant_bits
    if fp32_bit >= 23:
        from_top = 30 - fp32_bit
        return mant_bits + exp_bits - 1 - round(from_top * (exp_bits - 1) / 7)
    from_top = 22 - fp32_bit
    return mant_bits - 1 - round(from_top * (mant_bits - 1) / 22)


def target_bits(fault: Fault, dtype: torch.dtype) -> list[int]:
    """The distinct bit positions of ``dtype`` that ``fault`` may flip."""
    lo, hi = fault.bit_range()
    return sorted({map_bit(b, dtype) for b in range(lo, hi + 1)})


def _xor_masks(bits: list[int], dtype: torch.dtype) -> torch.Tensor:
    width = torch.finfo(dtype).bits
    # Two's complement: the top bit's mask is negative in the signed int view.
    values = [(1 << b) - (1 << width) if b == width - 1 else 1 << b for b in bits]
    return torch.tensor(values, dtype=_INT_VIEW[dtype])


class _PassGradient(torch.autograd.Function):
    """Forward returns the corrupted value, backward behaves as if it were clean:
    the hardware computed a wrong number, the autograd graph does not know."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx, clean: torch.Tensor, corrupted: torch.Tensor
    ) -> torch.Tensor:
        return corrupted

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
    ) -> tuple[torch.Tensor, None]:
        return grad, None


def _sample_words(fault: Fault, gen: torch.Generator, n: int) -> torch.Tensor:
    """Sorted flat indices of the words ``fault`` hits among ``n`` (host tensor).

    Each eligible word is hit with probability ``rate``. Large buffers (device
    memory runs to hundreds of GiB) draw the number of hits and then their
    places, instead of one random number per word.
    """
    stride, offset = fault.lane_stride, fault.lane_offset
    eligible = max((n - offset + stride - 1) // stride, 0)
    if eligible == 0 or fault.rate == 0.0:
        return torch.empty(0, dtype=torch.int64)
    chunk = 1 << 22
    if eligible <= chunk or fault.rate > 1e-2:
        parts = [
            (torch.rand(min(chunk, eligible - at), generator=gen) < fault.rate).nonzero() + at
            for at in range(0, eligible, chunk)
        ]
        picked = torch.cat(parts).reshape(-1)
    else:
        count = torch.tensor([float(eligible)], dtype=torch.float64)
        k = int(torch.binomial(count, torch.tensor([fault.rate], dtype=torch.float64), gen))
        picked = torch.unique(torch.randint(eligible, (k,), generator=gen))
    return picked * stride + offset


#: An operand tensor aligned with the output, or a function that builds it on demand
#: (only faults with an ``operand_mask`` need it).
Operand = torch.Tensor | Callable[[], torch.Tensor] | None


class Injector:
    """Corrupts hooked tensors according to a fault spec, for one device.

    Call :meth:`set_step` at every step (training step, GEMM round, collective
    round) and :meth:`corrupt` at every hook. ``counts`` holds the number of
    corrupted elements per hook label.
    """

    def __init__(self, spec: FaultSpec | None, device_index: int = 0) -> None:
        faults = spec.faults if spec is not None else []
        self.device_index = device_index
        self.faults: list[Fault] = [
            f for f in faults if f.device is None or f.device == device_index
        ]
        self._generators = [torch.Generator().manual_seed(f.seed) for f in self.faults]
        self._active = [False] * len(self.faults)
        self.step = -1
        self.counts: Counter[str] = Counter()

    @property
    def enabled(self) -> bool:
        """Whether any fault applies to this device."""
        return bool(self.faults)

    def set_step(self, step: int) -> None:
        """Enter ``step``: decide which faults are active in it (one draw per fault)."""
        self.step = step
        for i, fault in enumerate(self.faults):
            active = fault.active_at(step)
            if active and fault.step_probability < 1.0:
                draw = torch.rand((), generator=self._generators[i]).item()
                active = draw < fault.step_probability
            self._active[i] = active

    def wants(self, labels: tuple[str, ...]) -> bool:
        """Whether any active fault targets a hook carrying ``labels`` (cheap pre-check)."""
        return any(a and f.matches(labels) for f, a in zip(self.faults, self._active, strict=True))

    def corrupt(
        self, out: torch.Tensor, labels: tuple[str, ...], operand: Operand = None
    ) -> torch.Tensor:
        """Return ``out`` with the active faults for ``labels`` applied (out of place).

        ``labels[0]`` names the hook for counting; the rest are the sites it also
        answers to (e.g. ``("attention.qkv", "matmul")``). ``operand`` is the
        input element tensor aligned with ``out`` that ``operand_mask`` inspects
        (``out`` itself when omitted). Gradients flow as if nothing happened.
        """
        if not self.faults or not out.is_floating_point() or not self.wants(labels):
            return out
        self._hold(labels)
        result = out
        for i, fault in enumerate(self.faults):
            if self._active[i] and fault.matches(labels) and fault.mode != "delay":
                result = self._apply(fault, self._generators[i], result, operand, labels[0])
        if result is out:
            return out
        if out.requires_grad:
            passed: torch.Tensor = _PassGradient.apply(out, result.detach())  # type: ignore[no-untyped-call]
            return passed
        return result

    def _select(
        self, fault: Fault, gen: torch.Generator, out: torch.Tensor, operand: Operand
    ) -> torch.Tensor:
        """Flat indices of the elements to corrupt (host tensor)."""
        hit = torch.rand(out.numel(), generator=gen) < fault.rate
        if fault.lane_stride > 1:
            cols = out.shape[-1] if out.dim() else 1
            lane = (torch.arange(cols) % fault.lane_stride) == fault.lane_offset
            hit &= lane.expand(*out.shape).reshape(-1) if out.dim() else lane
        if fault.operand_mask is not None and bool(hit.any()):
            if callable(operand):
                operand = operand()
            ref = (operand if operand is not None else out).detach().to("cpu")
            if ref.dtype not in _INT_VIEW:
                ref = ref.float()
            low = ref.contiguous().view(_INT_VIEW[ref.dtype]).to(torch.int64)
            mask = (1 << fault.operand_mask.bits) - 1
            ok = (low & mask) == fault.operand_mask.value
            hit &= ok.expand(*out.shape).reshape(-1)
        return hit.nonzero().reshape(-1)

    def _apply(
        self, fault: Fault, gen: torch.Generator, out: torch.Tensor, operand: Operand, label: str
    ) -> torch.Tensor:
        idx = self._select(fault, gen, out, operand)
        n = int(idx.numel())
        if n == 0:
            return out
        flat = out.detach().reshape(-1)
        device_idx = idx.to(out.device)
        values = flat[device_idx].to("cpu")
        new = self._corrupt_values(fault, gen, values)
        self.counts[label] += n
        return flat.index_put((device_idx,), new.to(out.device)).view_as(out)

    def _corrupt_values(
        self, fault: Fault, gen: torch.Generator, values: torch.Tensor
    ) -> torch.Tensor:
        dtype = values.dtype
        if fault.mode == "zero":
            return torch.zeros_like(values)
        if fault.mode == "nan":
            return torch.full_like(values, math.nan)
        if fault.mode == "inf":
            return torch.copysign(torch.full_like(values, math.inf), values)
        if fault.mode == "scale":
            lo, hi = fault.scale
            rel = lo + (hi - lo) * torch.rand(values.numel(), generator=gen, dtype=torch.float64)
            sign = torch.where(torch.rand(values.numel(), generator=gen) < 0.5, -1.0, 1.0)
            return (values.double() * (1.0 + sign.double() * rel)).to(dtype)
        if dtype not in _INT_VIEW:  # an exotic float type: flip in fp32 and round back
            return self._corrupt_values(fault, gen, values.float()).to(dtype)
        bits = target_bits(fault, dtype)
        masks = _xor_masks(bits, dtype)
        choice = torch.randint(len(bits), (values.numel(),), generator=gen)
        ints = values.contiguous().view(_INT_VIEW[dtype])
        return (ints ^ masks[choice]).view(dtype)

    def corrupt_in_place(self, tensor: torch.Tensor, labels: tuple[str, ...]) -> None:
        """Corrupt a tensor that is not part of an autograd graph (grads, params)."""
        with torch.no_grad():
            view = tensor.detach()
            new = self.corrupt(view, labels)
            if new is not view:
                tensor.copy_(new)

    def corrupt_words(self, words: torch.Tensor, labels: tuple[str, ...] = ("memory",)) -> int:
        """Flip bits of a buffer of 32-bit words in place (the ``memory`` site).

        ``rate`` is the fraction of eligible words hit: ``lane_stride`` and
        ``lane_offset`` select flat word indices, ``operand_mask`` tests the
        word's low bits as written. A hit word gets one bit of the fault's class
        flipped (fp32 numbering is the word's own numbering) or, with ``zero``,
        is cleared. Only words that actually change are counted; returns how many.
        """
        if words.dtype != torch.int32:
            raise TypeError(f"memory faults apply to int32 words, not {words.dtype}")
        if not self.faults or not self.wants(labels):
            return 0
        self._hold(labels)
        flat = words.view(-1)
        changed = 0
        for i, fault in enumerate(self.faults):
            if not (self._active[i] and fault.matches(labels)) or fault.mode == "delay":
                continue
            gen = self._generators[i]
            idx = _sample_words(fault, gen, flat.numel())
            if idx.numel() == 0:
                continue
            values = flat[idx.to(flat.device)].to("cpu")
            if fault.operand_mask is not None:
                low = values.to(torch.int64) & ((1 << fault.operand_mask.bits) - 1)
                keep = low == fault.operand_mask.value
                idx, values = idx[keep], values[keep]
            if fault.mode == "zero":
                new = torch.zeros_like(values)
            else:
                lo, hi = fault.bit_range()
                masks = _xor_masks(list(range(lo, hi + 1)), torch.float32)
                new = values ^ masks[torch.randint(len(masks), (values.numel(),), generator=gen)]
            diff = new != values
            idx, new = idx[diff], new[diff]
            if idx.numel() == 0:
                continue
            flat.index_put_((idx.to(flat.device),), new.to(flat.device))
            self.counts[labels[0]] += int(idx.numel())
            changed += int(idx.numel())
        return changed

    def _hold(self, labels: tuple[str, ...]) -> None:
        """Mode ``delay``: wait as a slow device would, corrupting nothing."""
        wait = sum(
            f.delay_s
            for f, a in zip(self.faults, self._active, strict=True)
            if a and f.mode == "delay" and f.matches(labels)
        )
        if wait > 0:  # not counted: nothing was corrupted
            time.sleep(wait)

    def by_site(self) -> dict[str, int]:
        """Corrupted element counts per hook label."""
        return dict(sorted(self.counts.items()))
