"""Thin adapters over the probe's Python API for what the benchmark needs beyond it.

The probe's :func:`~sdcprobe.checks.golden.run_golden` gives one trial's whole
trace. A benchmark also needs to know *when* a fault first hit (for time to
detect), faults that hit an exact number of elements (profile F6), the checksum
noise of a GEMM with bf16 outputs (to calibrate ABFT at bf16 resolution), a
reduction whose order changes from run to run (profile H1), and a fault rate
that produces a given gradient error (profile F4). Each is a small subclass or
a helper here; nothing in ``jobs/`` is changed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch

import sdcprobe.checks.golden as golden_module
from sdcprobe.abft import abft_residual
from sdcprobe.backends import setup_backend
from sdcprobe.config import GoldenConfig
from sdcprobe.faults import Injector
from sdcprobe.faultspec import Fault, FaultSpec
from sdcprobe.instrument import Instrumentation
from sdcprobe.model import forward, init_params, synthetic_batch


class TrialInjector(Injector):
    """The probe's injector, plus the steps it hit and exact-count faults.

    ``exact_counts`` maps a fault's index in the spec to an inclusive range
    ``(lo, hi)``: when that fault is active in a step it corrupts exactly k
    elements, k uniform in the range, of one of the step's ``calls_per_step``
    hooked tensors (chosen uniformly), instead of a random fraction ``rate`` of
    every tensor. Its selection draws from the fault's own generator, so trials
    stay reproducible from the fault seed.
    """

    def __init__(
        self,
        spec: FaultSpec | None,
        device_index: int = 0,
        exact_counts: dict[int, tuple[int, int]] | None = None,
        calls_per_step: int = 1,
    ) -> None:
        super().__init__(spec, device_index)
        faults = spec.faults if spec is not None else []
        self._exact = {id(faults[i]): rng for i, rng in (exact_counts or {}).items()}
        self._calls_per_step = calls_per_step
        self._calls: dict[int, int] = {}
        self._done: set[int] = set()
        self._seen = 0
        self.hit_steps: list[int] = []

    def set_step(self, step: int) -> None:
        self._close_step()
        super().set_step(step)
        self._calls.clear()
        self._done.clear()

    def finish(self) -> None:
        """Account for the last step (call once after the run)."""
        self._close_step()

    @property
    def first_hit(self) -> int | None:
        """First step in which any element was corrupted; None if none was."""
        return self.hit_steps[0] if self.hit_steps else None

    def _close_step(self) -> None:
        total = sum(self.counts.values())
        if self.step >= 0 and total > self._seen:
            self.hit_steps.append(self.step)
        self._seen = total

    def _select(
        self, fault: Fault, gen: torch.Generator, out: torch.Tensor, operand: object
    ) -> torch.Tensor:
        rng = self._exact.get(id(fault))
        if rng is None:
            return super()._select(fault, gen, out, operand)  # type: ignore[arg-type]
        key = id(fault)
        call = self._calls.get(key, 0)
        self._calls[key] = call + 1
        left = self._calls_per_step - call
        # Reservoir choice: every hooked tensor of the step is equally likely to be the one.
        if key in self._done or left <= 0:
            return torch.empty(0, dtype=torch.int64)
        if left > 1 and float(torch.rand((), generator=gen)) >= 1.0 / left:
            return torch.empty(0, dtype=torch.int64)
        self._done.add(key)
        lo, hi = rng
        k = int(torch.randint(lo, hi + 1, (), generator=gen))
        return torch.randperm(out.numel(), generator=gen)[: min(k, out.numel())]


@contextmanager
def golden_instrumentation(cls: type[Instrumentation]) -> Iterator[None]:
    """Make :func:`run_golden` build its hooks from ``cls`` for the duration."""
    names = vars(golden_module)  # the name run_golden looks up at call time
    saved = names["Instrumentation"]
    names["Instrumentation"] = cls
    try:
        yield
    finally:
        names["Instrumentation"] = saved


def bf16_noise_instrumentation(sink: list[tuple[str, float]]) -> type[Instrumentation]:
    """Hooks that also record, per GEMM, ``(label, residual)``: the checksum residual of
    its output rounded to bf16, in bf16 units. That is the noise floor an ABFT at bf16
    resolution has to tolerate on a healthy device (the run itself stays fp32)."""

    class Bf16Noise(Instrumentation):
        def matmul(
            self, a: torch.Tensor, b: torch.Tensor, label: str, name: str | None = None
        ) -> torch.Tensor:
            out = super().matmul(a, b, label, name)
            rounded = out.detach().to(torch.bfloat16)
            sink.append((name or label, abft_residual(a, b, rounded).bf16_units))
            return out

    return Bf16Noise


class NondeterministicReduction(RuntimeError):
    """What a kernel without a deterministic implementation raises in strict mode."""


def reordered_instrumentation(site: str, seed: int, guarded: bool) -> type[Instrumentation]:
    """Hooks whose ``site`` GEMMs sum their reduction dimension in a random order, drawn
    anew at every call: benign run-to-run non-determinism (atomics, split-K), the same
    numbers to rounding.

    ``guarded``: behave like a torch kernel without a deterministic implementation, which
    raises when deterministic algorithms are enforced (the probe enforces them). Unguarded,
    it runs as in a training job that does not ask for determinism, or as a kernel that
    fails to declare itself.
    """
    gen = torch.Generator().manual_seed(seed)

    class Reordered(Instrumentation):
        def matmul(
            self, a: torch.Tensor, b: torch.Tensor, label: str, name: str | None = None
        ) -> torch.Tensor:
            if label == site:
                if guarded and torch.are_deterministic_algorithms_enabled():
                    raise NondeterministicReduction(
                        f"{name or label}: reduction with a run-dependent order has no "
                        "deterministic implementation (torch.use_deterministic_algorithms)"
                    )
                perm = torch.randperm(a.shape[-1], generator=gen).to(a.device)
                a, b = a.index_select(-1, perm), b.index_select(-2, perm)
            return super().matmul(a, b, label, name)

    return Reordered


def gradient_error(cfg: GoldenConfig, fault: dict[str, object], draws: int = 4) -> float:
    """Mean relative L2 difference ``|g' - g| / |g|`` that ``fault`` (at site
    ``grad.weight``) causes in the full gradient of the golden model's first step."""
    backend = setup_backend("cpu", 0, 1)
    params = init_params(cfg, backend.device)
    tokens, targets = synthetic_batch(cfg, 0)
    logits = forward(params, tokens, cfg, Instrumentation(backend))
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab), targets.reshape(-1))
    loss.backward()  # type: ignore[no-untyped-call]
    clean = [p.grad.detach().clone() for p in params.values() if p.grad is not None]
    ref = torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in clean]))
    errors = []
    for draw in range(draws):
        spec = FaultSpec.model_validate({"faults": [{**fault, "seed": 10_000 + draw}]})
        injector = Injector(spec)
        injector.set_step(0)
        diff = 0.0
        for g in clean:
            hit = g.clone()
            injector.corrupt_in_place(hit, ("grad.weight",))
            diff += float(torch.sum((hit.double() - g.double()) ** 2))
        errors.append(math.sqrt(diff) / float(ref))
    return sum(errors) / len(errors)


def calibrate_gradient_rate(
    cfg: GoldenConfig, target: float, bits: str = "hi-mant", iterations: int = 18
) -> tuple[float, float]:
    """The ``grad.weight`` flip rate whose mean per-step gradient error is ``target``
    (bisection in log rate); returns (rate, achieved error)."""
    lo, hi = math.log(1e-5), math.log(1.0)
    for _ in range(iterations):
        mid = (lo + hi) / 2
        err = gradient_error(cfg, {"site": "grad.weight", "rate": math.exp(mid), "bits": bits})
        if err < target:
            lo = mid
        else:
            hi = mid
    rate = float(f"{math.exp((lo + hi) / 2):.3g}")
    return rate, gradient_error(cfg, {"site": "grad.weight", "rate": rate, "bits": bits})
