"""Faults in a training loop, through the probe's injector (:mod:`sdcprobe.faults`).

Sites, in the probe's vocabulary:

* ``matmul`` (forward): the output of every ``nn.Linear`` on the faulty rank;
* ``grad.weight`` (backward): each parameter's local gradient before DDP reduces it;
* ``allreduce``: the reduced gradient as the faulty rank received it (the loop
  calls :meth:`TrainingFaults.after_reduce` after backward);
* ``optimizer``: the update the optimizer applies on the faulty rank;
* ``param`` (weights at rest): parameters change in memory between steps.

Only the faulty rank attaches an injector; ``set_step`` is called every step.
``first_pass_only`` limits forward and backward faults to the step's first forward
pass (and its backward): a re-run of the same micro-batch in the same step is
then clean, as after a transient upset.
"""

from __future__ import annotations

from typing import Any

import torch

from sdcprobe.faults import Injector
from sdcprobe.faultspec import Fault, FaultSpec

FORWARD, BACKWARD, RECEIVE, OPTIMIZER, AT_REST = (
    "matmul",
    "grad.weight",
    "allreduce",
    "optimizer",
    "param",
)


class TrainingFaults:
    """Hooks one rank's model and optimizer so the injector corrupts one site."""

    def __init__(
        self,
        fault: Fault,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        first_pass_only: bool = False,
    ) -> None:
        self.injector = Injector(FaultSpec(faults=[fault]))
        self.site = fault.site
        self.first_pass_only = first_pass_only
        self.passes = 0
        self.handles: list[Any] = [model.register_forward_pre_hook(self._count_pass)]
        params = [p for p in model.parameters() if p.requires_grad]
        if self.site == FORWARD:
            for module in model.modules():
                if isinstance(module, torch.nn.Linear):
                    self.handles.append(module.register_forward_hook(self._forward))
        elif self.site == BACKWARD:
            for p in params:
                self.handles.append(p.register_hook(self._gradient))  # type: ignore[no-untyped-call]
        elif self.site == RECEIVE:
            pass  # the loop calls after_reduce() once DDP's backward has returned
        elif self.site == OPTIMIZER:
            self._before: list[torch.Tensor] = []
            self.handles.append(optimizer.register_step_pre_hook(self._snapshot))
            self.handles.append(optimizer.register_step_post_hook(self._update))
        elif self.site == AT_REST:
            self.handles.append(optimizer.register_step_post_hook(self._at_rest))
        else:
            raise ValueError(f"no training hook for site {self.site!r}")
        self.params = params

    def set_step(self, step: int) -> None:
        self.injector.set_step(step)
        self.passes = 0

    def _count_pass(self, module: torch.nn.Module, args: Any) -> None:
        self.passes += 1

    def _live(self) -> bool:
        return not self.first_pass_only or self.passes <= 1

    @property
    def hits(self) -> int:
        return sum(self.injector.counts.values())

    def _forward(self, module: torch.nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor:
        return self.injector.corrupt(out, (FORWARD,)) if self._live() else out

    def _gradient(self, grad: torch.Tensor) -> torch.Tensor:
        return self.injector.corrupt(grad, (BACKWARD,)) if self._live() else grad

    def after_reduce(self) -> None:
        """Corrupt the all-reduced gradients as received (site ``allreduce`` only)."""
        if self.site != RECEIVE:
            return
        for p in self.params:
            if p.grad is not None:
                self.injector.corrupt_in_place(p.grad, (RECEIVE,))

    def _snapshot(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._before = [p.detach().clone() for p in self.params]

    def _update(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        with torch.no_grad():
            for p, old in zip(self.params, self._before, strict=True):
                delta = p - old
                bad = self.injector.corrupt(delta, (OPTIMIZER,))
                if bad is not delta:
                    p.copy_(old + bad)

    def _at_rest(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        for p in self.params:
            self.injector.corrupt_in_place(p.data, (AT_REST,))
