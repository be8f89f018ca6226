"""``golden``: train a tiny transformer deterministically and digest every step.

This is also the benchmark API. :func:`run_golden` trains the model of
:mod:`sdcprobe.model` for ``cfg.steps`` steps on synthetic tokens and returns a
:class:`GoldenTrace`: per step the loss (value and bits), the gradient norm, a
digest of every submodule output, gradient, optimizer update and parameter, and
(with ``abft=True``) the ABFT residual of every GEMM. Faults, if given, are
injected through the same hooks, so one trial yields both what a bitwise
comparison would see and what ABFT or a loss/grad-norm monitor would see::

    from sdcprobe.checks.golden import run_golden
    from sdcprobe.config import GoldenConfig
    from sdcprobe.faultspec import FaultSpec

    fault = {"site": "ffn.down", "rate": 1e-4, "bits": "exp-hi"}
    spec = FaultSpec.model_validate({"faults": [fault]})
    healthy = run_golden(GoldenConfig(steps=20), None, "cpu")
    faulty = run_golden(GoldenConfig(steps=20), spec, "cpu", abft=True)
    healthy.first_divergence(faulty)        # (step, "layers.0.ffn.down") or None
    [s.loss for s in faulty.steps]          # loss curve
    max(r.bf16_units for r in faulty.residuals)
"""

from __future__ import annotations

import statistics
import struct
import time
from dataclasses import dataclass, field

import torch

from sdcprobe.abft import GemmResidual
from sdcprobe.backends import Backend, setup_backend
from sdcprobe.config import GoldenConfig
from sdcprobe.deadline import RoundClock, round_spread
from sdcprobe.devices import resolve_backend
from sdcprobe.faults import Injector
from sdcprobe.faultspec import FaultSpec
from sdcprobe.instrument import Instrumentation
from sdcprobe.model import AdamW, forward, init_params, synthetic_batch
from sdcprobe.trace import (
    CheckTrace,
    Evidence,
    Steps,
    first_divergence,
    step_digest,
    trace_digest,
    typical_round,
)


def _bits(x: float) -> str:
    return struct.pack(">f", x).hex()


@dataclass
class StepTrace:
    """One training step: loss, gradient norm and item digests in execution order.

    ``digests`` keys: forward submodules (``embedding``, ``layers.0.norm1``,
    ``layers.0.attention.qkv`` ... ``lm_head``), ``loss``, ``grad.<param>``,
    ``grad_norm``, ``optimizer.<param>`` (the update), ``param.<param>``.
    """

    step: int
    loss: float
    loss_bits: str
    grad_norm: float
    grad_norm_bits: str
    digests: dict[str, str]
    wall_s: float = 0.0

    @property
    def digest(self) -> str:
        """Compact digest of the whole step (what a baseline stores)."""
        return step_digest(self.digests)


@dataclass
class GoldenTrace:
    """Everything one golden training run computed, for comparison and benchmarks."""

    config: GoldenConfig
    device_index: int
    steps: list[StepTrace]
    residuals: list[GemmResidual] = field(default_factory=list)
    injections: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def items(self) -> Steps:
        """Per-step item digests (the comparable part of the trace)."""
        return [s.digests for s in self.steps]

    @property
    def digest(self) -> str:
        """The check digest (sha256 over step digests)."""
        return trace_digest(self.items)

    def step_digests(self) -> list[str]:
        """Compact per-step digests, as a baseline stores them."""
        return [s.digest for s in self.steps]

    def first_divergence(self, other: GoldenTrace) -> tuple[int, str | None] | None:
        """First (step, item) where this run and ``other`` differ; None if bitwise equal."""
        return first_divergence(self.items, other.items)

    @property
    def losses(self) -> list[float]:
        """Per-step training loss."""
        return [s.loss for s in self.steps]

    @property
    def grad_norms(self) -> list[float]:
        """Per-step global gradient norm (before clipping)."""
        return [s.grad_norm for s in self.steps]


class _Training:
    """One deterministic training run of the golden model, a step at a time (so a run
    and its replay can advance in lockstep)."""

    def __init__(self, cfg: GoldenConfig, injector: Injector, backend: Backend, abft: bool):
        self.cfg, self.backend = cfg, backend
        self.ins = Instrumentation(backend, injector, record=True, abft=abft)
        self.params = init_params(cfg, backend.device)
        self.opt = AdamW(self.params, cfg)
        # XLA: materialise the initialisation on its own, so that it never joins the
        # other run's step graph (each would then compile anew instead of hitting
        # the cache: a run and its replay must build identical graphs).
        backend.step_boundary()
        self.steps: list[StepTrace] = []

    def step(self) -> StepTrace:
        """Train one more step and return its trace."""
        cfg, backend, ins, params = self.cfg, self.backend, self.ins, self.params
        step = len(self.steps)
        t_step = time.perf_counter()
        ins.set_step(step)
        tokens, targets = synthetic_batch(cfg, step)
        tokens, targets = tokens.to(backend.device), targets.to(backend.device)
        for p in params.values():
            p.grad = None
        logits = forward(params, tokens, cfg, ins)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab), targets.reshape(-1))
        ins.record("loss", loss)
        loss.backward()  # type: ignore[no-untyped-call]
        grads: list[torch.Tensor] = []
        for name, p in params.items():
            assert p.grad is not None
            ins.corrupt_in_place(p.grad, "grad.weight")
            ins.record(f"grad.{name}", p.grad)
            grads.append(p.grad)
        grad_norm = torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(g) for g in grads])
        )
        ins.record("grad_norm", grad_norm)
        # Clip out of place so the recorded raw gradients stay as they were.
        coef = torch.clamp(cfg.clip / (grad_norm + 1e-6), max=1.0)
        for p in params.values():
            assert p.grad is not None
            p.grad = p.grad * coef
        self.opt.step(ins)
        with torch.no_grad():
            for name, p in params.items():
                ins.corrupt_in_place(p, "param")
                ins.record(f"param.{name}", p)
        backend.step_boundary()
        digests = ins.digests()
        # The loss and gradient norm as numbers for the curves: two floats, one transfer.
        scalars = torch.stack([loss.detach().double(), grad_norm.detach().double()])
        loss_v, norm_v = backend.to_host(scalars, what=f"step {step} loss").tolist()
        wall = time.perf_counter() - t_step
        trace = StepTrace(step, loss_v, _bits(loss_v), norm_v, _bits(norm_v), digests, wall)
        self.steps.append(trace)
        return trace

    def trace(self, injector: Injector, wall_s: float) -> GoldenTrace:
        """The run so far, as a :class:`GoldenTrace`."""
        cfg = self.cfg.model_copy(update={"steps": len(self.steps)})
        return GoldenTrace(
            config=cfg,
            device_index=self.backend.index,
            steps=self.steps,
            residuals=self.ins.residuals,
            injections=injector.by_site(),
            wall_s=wall_s,
        )


def run_golden(
    cfg: GoldenConfig,
    faults: FaultSpec | Injector | None = None,
    device: str | Backend = "cpu",
    device_index: int = 0,
    abft: bool = False,
    threads: int = 1,
) -> GoldenTrace:
    """Train the golden model once and return its full trace.

    ``faults``: a spec (a fresh injector is made for ``device_index``) or an
    injector to continue (its random streams carry on, e.g. across a replay).
    ``device``: ``"cpu"``, ``"cuda"``, ``"xla"`` or a configured :class:`Backend`.
    ``abft``: also compute ABFT residuals of every GEMM (slower; benchmarks).
    """
    if isinstance(device, Backend):
        backend = device
    else:
        backend = setup_backend(resolve_backend(device), device_index, threads)
    injector = faults if isinstance(faults, Injector) else Injector(faults, backend.index)
    start = time.perf_counter()
    run = _Training(cfg, injector, backend, abft)
    for _ in range(cfg.steps):
        run.step()
    backend.sync()
    return run.trace(injector, time.perf_counter() - start)


def golden_check(
    cfg: GoldenConfig, backend: Backend, injector: Injector, clock: RoundClock | None = None
) -> CheckTrace:
    """The ``golden`` check on one device: a run and its replay, compared step by step.

    The two advance in lockstep, a step of each per round, so ``clock`` can stop them
    together after any round: no round starts that would end past its deadline."""
    start, cpu0 = time.perf_counter(), time.process_time()
    bytes0, transfers0 = backend.traffic.snapshot()
    run = _Training(cfg, injector, backend, abft=False)
    replay = _Training(cfg, injector, backend, abft=False)
    round_times: list[float] = []
    cut = False
    for step in range(cfg.steps):
        if clock is not None and not clock.allows(step, typical_round(round_times)):
            cut = True
            break
        r0 = time.perf_counter()
        run.step()
        replay.step()
        round_times.append(time.perf_counter() - r0)
    backend.sync()
    wall = time.perf_counter() - start
    first, again = run.trace(injector, wall / 2), replay.trace(injector, wall / 2)
    evidence: list[Evidence] = []
    divergence = first.first_divergence(again)
    if divergence is not None:
        step, item = divergence
        evidence.append(Evidence(kind="replay", step=step, item=item, detail="replay diverged"))
    nonfinite = next(
        (s.step for s in first.steps if s.loss != s.loss or abs(s.loss) == float("inf")), None
    )
    if nonfinite is not None:
        evidence.append(
            Evidence(kind="nonfinite", step=nonfinite, item="loss", detail="loss is not finite")
        )
    losses = first.losses
    ran = len(first.steps)
    metrics: dict[str, int | float | str | None] = {
        "steps": ran,
        "loss_first": _round(losses[0]),
        "loss_last": _round(losses[-1]),
        "grad_norm_max": _round(max(first.grad_norms)),
        "step_ms": round(1000 * sum(round_times) / (2 * max(ran, 1)), 3),
    }
    host_bytes, host_transfers = (
        x - x0 for x, x0 in zip(backend.traffic.snapshot(), (bytes0, transfers0), strict=True)
    )
    if ran:  # a round is a step of the run and of its replay
        metrics["host_bytes_per_round"] = round(host_bytes / ran)
        metrics["host_syncs_per_round"] = round(host_transfers / ran, 2)
    return CheckTrace(
        digest=first.digest,
        steps=first.items,
        evidence=evidence,
        metrics=metrics,
        wall_s=time.perf_counter() - start,
        cpu_s=time.process_time() - cpu0,
        # A golden round is one training step, in the run and in its replay. The
        # median after the first round: the first pays for set-up, and on XLA the
        # second compiles the steady-state step once more.
        round_s=statistics.median(round_times[1:] or round_times) if round_times else 0.0,
        round_cv=round(round_spread(round_times), 4),
        cut_at_deadline=cut,
    )


def _round(x: float) -> float | str:
    return float(f"{x:.6g}") if x == x and abs(x) != float("inf") else str(x)
