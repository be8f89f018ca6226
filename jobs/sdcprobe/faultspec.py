"""The fault-injection spec: which operation outputs to corrupt, where, when and how.

Only the spec lives here (pydantic, no torch) so the CLI can reject a bad spec
before it starts any device worker. The injector that applies it is
:mod:`sdcprobe.faults`.

A spec is ``{"faults": [fault, ...]}``; every field of a fault is described on
:class:`Fault`. Bit positions use fp32 numbering (mantissa 0-22, exponent 23-30,
sign 31) and are mapped onto the corrupted tensor's own format, so
``"bits": "exp"`` means "a low exponent bit" in bf16, fp16 and fp64 as well.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

#: Every hook point in the probe, by the name a fault's ``site`` uses.
SITES: tuple[str, ...] = (
    "matmul",  # every GEMM: the compute check's and every one in the golden model
    "attention.qkv",
    "attention.scores",
    "attention.softmax",
    "attention.output",
    "ffn.up",
    "ffn.down",
    "activation",  # SiLU * gate
    "norm",  # RMSNorm outputs
    "embedding",  # looked-up rows
    "grad.weight",  # weight gradients after backward
    "optimizer",  # the parameter update before it is applied
    "param",  # a weight changes in memory between steps
    "allreduce",  # all-reduce outputs in the collective check
    "memory",  # words of the memory check's buffer, between write and read-back
)
Site = Literal[
    "matmul",
    "attention.qkv",
    "attention.scores",
    "attention.softmax",
    "attention.output",
    "ffn.up",
    "ffn.down",
    "activation",
    "norm",
    "embedding",
    "grad.weight",
    "optimizer",
    "param",
    "allreduce",
    "memory",
    "*",
]
BitClass = Literal["lo-mant", "hi-mant", "exp", "exp-hi", "sign"]
Mode = Literal["flip", "zero", "nan", "inf", "scale", "delay"]

#: fp32 bit ranges (inclusive) of each named bit class.
BIT_CLASSES: dict[str, tuple[int, int]] = {
    "lo-mant": (0, 15),
    "hi-mant": (16, 22),
    "exp": (23, 26),
    "exp-hi": (27, 30),
    "sign": (31, 31),
}


class FaultSpecError(ValueError):
    """A fault spec that cannot be used; the message says what to fix."""


class OperandMask(BaseModel):
    """Corrupt only outputs whose input operand element has its low ``bits``
    mantissa bits equal to ``value`` (a data-dependent defect)."""

    model_config = ConfigDict(extra="forbid")
    bits: int = Field(ge=1, le=16)
    value: int = Field(ge=0)

    @model_validator(mode="after")
    def _value_fits(self) -> OperandMask:
        if self.value >= 1 << self.bits:
            raise ValueError(f"operand_mask.value {self.value} does not fit in {self.bits} bits")
        return self


class Fault(BaseModel):
    """One fault: a class of corruption applied to the outputs of one hook site."""

    model_config = ConfigDict(extra="forbid")
    site: Site = Field(description="Hook point to corrupt; '*' hits every site.")
    rate: float = Field(
        default=1e-3,
        ge=0.0,
        le=1.0,
        description="Fraction of eligible elements (words, for 'memory') of each hit tensor.",
    )
    bits: BitClass | tuple[int, int] = Field(
        default="lo-mant",
        description="Bit class or inclusive [lo, hi] in fp32 numbering (flip only).",
    )
    mode: Mode = Field(
        default="flip",
        description="How hit elements change; 'delay' changes none and holds the hook up "
        "'delay_s' seconds instead (a slow device, not a wrong one).",
    )
    delay_s: float = Field(
        default=0.0,
        ge=0.0,
        le=10.0,
        description="Mode 'delay' only: seconds each hooked output of an active step waits.",
    )
    scale: tuple[float, float] = Field(
        default=(1e-3, 1e-2), description="Relative error range [lo, hi] for mode 'scale'."
    )
    onset_step: int = Field(default=0, ge=0, description="First step (or GEMM round) that is hit.")
    end_step: int | None = Field(
        default=None, ge=0, description="Last step hit (inclusive); none = no end."
    )
    step_probability: float = Field(
        default=1.0,
        ge=0.0,
        le=1.0,
        description="Chance per step (or round) that the fault is active.",
    )
    operand_mask: OperandMask | None = None
    lane_stride: int = Field(
        default=1, ge=1, description="Only columns j with j % stride == offset."
    )
    lane_offset: int = Field(default=0, ge=0)
    device: int | None = Field(
        default=None, ge=0, description="Only this device index; none = all."
    )
    seed: int = Field(default=0, ge=0, description="Seed of this fault's own random stream.")

    @model_validator(mode="after")
    def _consistent(self) -> Fault:
        if isinstance(self.bits, tuple):
            lo, hi = self.bits
            if not 0 <= lo <= hi <= 31:
                raise ValueError(f"bits [{lo}, {hi}] must satisfy 0 <= lo <= hi <= 31")
        lo_s, hi_s = self.scale
        if not 0 <= lo_s <= hi_s:
            raise ValueError(f"scale [{lo_s}, {hi_s}] must satisfy 0 <= lo <= hi")
        if self.end_step is not None and self.end_step < self.onset_step:
            raise ValueError(f"end_step {self.end_step} is before onset_step {self.onset_step}")
        if (self.mode == "delay") != (self.delay_s > 0):
            raise ValueError(
                "delay_s > 0 goes with mode 'delay' and with no other mode "
                f"(mode {self.mode!r}, delay_s {self.delay_s:g})"
            )
        if self.site == "memory" and self.mode not in ("flip", "zero", "delay"):
            raise ValueError(
                f"mode {self.mode!r} does not apply to site 'memory' (raw 32-bit words): "
                "use 'flip', 'zero' or 'delay'"
            )
        if self.lane_offset >= self.lane_stride:
            raise ValueError(
                f"lane_offset {self.lane_offset} must be < lane_stride {self.lane_stride}"
            )
        return self

    def bit_range(self) -> tuple[int, int]:
        """Inclusive fp32 bit range of this fault."""
        return BIT_CLASSES[self.bits] if isinstance(self.bits, str) else self.bits

    def matches(self, labels: tuple[str, ...]) -> bool:
        """Whether a hook point carrying ``labels`` is one of this fault's sites."""
        return self.site == "*" or self.site in labels

    def active_at(self, step: int) -> bool:
        """Whether ``step`` lies in [onset_step, end_step] (before the step draw)."""
        return step >= self.onset_step and (self.end_step is None or step <= self.end_step)


class FaultSpec(BaseModel):
    """``{"faults": [...]}``: the whole injection plan of one run."""

    model_config = ConfigDict(extra="forbid")
    faults: list[Fault] = Field(min_length=1)


def parse_fault_spec(text: str, origin: str = "fault spec") -> FaultSpec:
    """Parse and validate a JSON fault spec; :class:`FaultSpecError` names the problem."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FaultSpecError(f"{origin} is not JSON ({exc.msg} at char {exc.pos})") from exc
    try:
        return FaultSpec.model_validate(doc)
    except ValidationError as exc:
        problems = []
        for err in exc.errors()[:5]:
            where = ".".join(str(p) for p in err["loc"]) or "spec"
            problems.append(f"{where}: {err['msg']}")
        raise FaultSpecError(f"invalid {origin}: " + "; ".join(problems)) from exc
