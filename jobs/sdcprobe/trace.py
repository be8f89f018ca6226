"""What a device worker reports to the parent, and how traces are digested and compared.

Every check produces a *trace*: a list of steps (GEMM rounds, collective rounds,
training steps), each an ordered mapping of item name (dtype, collective op,
submodule) to a short digest of that item's bits. Comparing two traces finds the
first divergent step and, within it, the first divergent item in execution
order. A baseline keeps one compact digest per step, enough to find the step.
Torch-free: the parent process and the judge import this without torch.
"""

from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel, ConfigDict, Field

from sdcprobe.faultspec import SITES

STEP_DIGEST_CHARS = 16

#: Golden trace items named differently from the fault site whose hook makes them.
_GOLDEN_ITEM_SITES = {
    "norm1": "norm",
    "norm2": "norm",
    "final_norm": "norm",
    "ffn.activation": "activation",
    "attention.context": "matmul",  # only the catch-all GEMM site reaches these two
    "lm_head": "matmul",
}

Steps = list[dict[str, str]]


def step_digest(items: dict[str, str]) -> str:
    """Compact digest of one step (order-sensitive), as stored in baselines."""
    canonical = json.dumps(list(items.items()), separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:STEP_DIGEST_CHARS]


def trace_digest(steps: Steps) -> str:
    """The check digest: sha256 over all step digests."""
    h = hashlib.sha256()
    for items in steps:
        h.update(step_digest(items).encode())
    return h.hexdigest()


def typical_round(times: list[float]) -> float:
    """A check's cost per round: the mean over its rounds after the first (which pays
    for lazy set-up), or the only one."""
    later = times[1:] or times
    return sum(later) / len(later) if later else 0.0


def first_divergence(a: Steps, b: Steps) -> tuple[int, str | None] | None:
    """First (step, item) where two traces differ; None when they agree.

    A length difference counts as a divergence at the first missing step.
    """
    for step, (sa, sb) in enumerate(zip(a, b, strict=False)):
        if sa != sb:
            for name, digest in sa.items():
                if sb.get(name) != digest:
                    return step, name
            extra = [name for name in sb if name not in sa]
            return step, extra[0] if extra else None
    if len(a) != len(b):
        return min(len(a), len(b)), None
    return None


def site_of_item(check: str, item: str | None) -> str | None:
    """The fault-injection site class (one of ``faultspec.SITES``) whose hook
    produced trace item ``item`` of ``check``; None when no site does.

    Golden items carry layer prefixes and their own names: ``layers.0.norm1``
    and ``final_norm`` are ``norm``, ``layers.1.ffn.activation`` is
    ``activation``, ``grad.lm_head`` is ``grad.weight``, ``optimizer.<param>``
    and ``param.<param>`` are ``optimizer`` and ``param``. ``loss`` and
    ``grad_norm`` are computed from hooked values but not hooked themselves.
    """
    if item is None:
        return None
    if check == "compute":
        return "matmul"
    if check == "memory":
        return "memory"
    head, _, rest = item.partition(".")
    if head == "grad":
        site = "grad.weight"
    elif head in ("optimizer", "param"):
        site = head
    else:
        name = rest.partition(".")[2] if head == "layers" else item
        site = _GOLDEN_ITEM_SITES.get(name, name)
    return site if site in SITES else None


def first_step_divergence(steps: Steps, baseline_steps: list[str]) -> int | None:
    """First step whose compact digest differs from a baseline's; None if all agree."""
    ours = [step_digest(items) for items in steps]
    for step, (x, y) in enumerate(zip(ours, baseline_steps, strict=False)):
        if x != y:
            return step
    if len(ours) != len(baseline_steps):
        return min(len(ours), len(baseline_steps))
    return None


class Evidence(BaseModel):
    """A direct sign of corruption seen inside one worker (not by comparison)."""

    model_config = ConfigDict(extra="forbid")
    kind: str = Field(description="replay | abft | collective | memory | nonfinite")
    step: int | None = None
    item: str | None = None
    detail: str = ""
    source: int | None = Field(default=None, description="Device the bad data came from, if known.")


class CheckTrace(BaseModel):
    """One check's outcome on one device."""

    model_config = ConfigDict(extra="forbid")
    digest: str | None = None
    steps: Steps = Field(default_factory=list)
    evidence: list[Evidence] = Field(default_factory=list)
    metrics: dict[str, int | float | str | None] = Field(default_factory=dict)
    error: str | None = None
    wall_s: float = 0.0
    cpu_s: float = 0.0
    round_s: float = Field(default=0.0, description="Wall seconds of a typical round.")
    round_cv: float = Field(
        default=0.0, description="Spread of the round times (standard deviation over mean)."
    )
    cut_at_deadline: bool = Field(
        default=False,
        description="Stopped before its planned rounds: the next round would have ended "
        "past the check's deadline (the rounds a baseline covers always run).",
    )


class DeviceFacts(BaseModel):
    """What one worker learned about its device and software (for the fingerprint)."""

    model_config = ConfigDict(extra="forbid")
    backend: str
    device_model: str
    driver: str | None = None
    runtime: str | None = None
    torch: str
    torch_xla: str | None = None
    cpu_isa: str
    threads: int
    uuid: str | None = None
    """The device's identity (a GPU's ``GPU-…`` UUID), when it can be read."""


class WorkerReport(BaseModel):
    """Everything one device worker sends back."""

    model_config = ConfigDict(extra="forbid")
    rank: int
    facts: DeviceFacts | None = None
    checks: dict[str, CheckTrace] = Field(default_factory=dict)
    injections: dict[str, int] = Field(default_factory=dict)
    error: str | None = None
    wall_s: float = 0.0
