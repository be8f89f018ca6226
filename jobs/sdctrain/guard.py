"""The training-loop guard: replica consensus, shadow audits, confirmation, reports.

Adopted in three lines of a DDP loop::

    guard = TrainingGuard(ddp_model, optimizer, loss_fn)   # loss_fn(model, batch) -> loss
    for batch in loader:
        optimizer.zero_grad(set_to_none=True)
        loss = guard.backward(batch)        # was: loss = loss_fn(model, batch); loss.backward()
        outcome = guard.step()              # was: optimizer.step()
        if outcome.stop:
            save_checkpoint(); break

Gradient accumulation works as with plain DDP: call ``guard.backward`` once per
micro-batch, inside ``ddp_model.no_sync()`` for all but the last, then
``guard.step()`` once. An audit step audits its first micro-batch, whose gradients
are then the only ones in ``.grad``; DDP's own reduction on the last micro-batch
reduces the sum, as without the guard.

Every rank takes part in every collective in the same order, and every
judgement is made from gathered facts by the pure functions in
:mod:`sdctrain.verdicts`, so all ranks reach the same verdict and the same
action without a coordinator.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils import _pytree as pytree

from sdctrain.detection import Detection, Reporter
from sdctrain.digest import differing_rows, digest_all, tensor_digest
from sdctrain.identity import RankInfo, local_info
from sdctrain.verdicts import (
    Confirmation,
    Method,
    attribute_recompute,
    confirm_divergence,
    refusals,
    replica_consensus,
)

log = logging.getLogger("sdctrain")

LossFn = Callable[[torch.nn.Module, Any], torch.Tensor]
TensorsFn = Callable[[], Sequence[tuple[str, torch.Tensor]]]


@dataclass
class GuardConfig:
    """How often to look and what to do about what is found."""

    consensus_every: int = 50
    """Steps between replica-consensus checks (digests of parameters and optimizer state)."""
    audit_budget: float = 0.02
    """Share of step time spent on shadow audits (0.02 = 2%); 0 turns audits off."""
    audit_every: int | None = None
    """A fixed audit interval in steps instead of the budget (tests, benchmarks)."""
    first_audit_step: int = 1
    """The first audit (step 0 is warm-up); later ones follow from the measured cost."""
    watch_nodes: frozenset[str] = frozenset()
    """Nodes reported before: audited ``watch_factor`` times as often, and picked first."""
    watch_factor: float = 4.0
    """Budget multiplier while a watched node is in the group, and its pick weight."""
    on_transient: Literal["skip-step", "continue"] = "skip-step"
    """After a transient wrong gradient: drop the step (its all-reduced gradient is
    wrong on every rank) or apply it anyway."""
    on_persistent: Literal["stop", "continue"] = "stop"
    """After a GPU reproduced a wrong result: stop (checkpoint from a healthy rank and
    exit, so the job restarts elsewhere) or continue."""
    repair_replicas: bool = True
    """Copy the majority's tensors over a replica that diverged, then continue."""
    include_optimizer_state: bool = True
    """Digest optimizer state (e.g. Adam moments) along with parameters."""
    report_transient: bool = True
    """Report transient detections too (the node is screened when next idle)."""
    seed: int = 0
    """Seed of the audit-target choice (identical on every rank)."""


@dataclass
class Outcome:
    """What a step found and what the loop should do."""

    step: int
    detections: list[Detection] = field(default_factory=list)
    skip_step: bool = False
    stop: bool = False
    repaired: list[int] = field(default_factory=list)
    audited: tuple[int, int] | None = None
    notes: list[str] = field(default_factory=list)
    micro_batches: int = 0
    """Micro-batches (``backward`` calls) the step accumulated."""


@dataclass(frozen=True)
class ReplicaSet:
    """Tensors that must be identical across ``group`` (one per parallel coordinate).

    The default set is the data-parallel group with every parameter and optimizer
    state tensor. With tensor or pipeline parallelism, pass the data-parallel group
    of this rank's coordinate; expert parameters replicated over an expert-data
    group get a set of their own.
    """

    name: str
    group: dist.ProcessGroup | None
    tensors: TensorsFn


def _rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict[str, torch.Tensor], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def _key(table: torch.Tensor) -> tuple[int, ...]:
    """A host tuple of a (small) digest table: the hashable value verdicts compare."""
    return tuple(int(v) for v in table.reshape(-1).tolist())


class TrainingGuard:
    """Watches one data-parallel training loop for silent data corruption."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: LossFn,
        *,
        group: dist.ProcessGroup | None = None,
        config: GuardConfig | None = None,
        reporter: Reporter | Literal["auto"] | None = "auto",
        replica_sets: Sequence[ReplicaSet] = (),
    ) -> None:
        if not dist.is_initialized():
            raise RuntimeError("TrainingGuard needs torch.distributed initialised first")
        self.model = model
        self.ddp = model if isinstance(model, DistributedDataParallel) else None
        inner = self.ddp.module if self.ddp is not None else model
        assert isinstance(inner, torch.nn.Module)
        self.module: torch.nn.Module = inner
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.group = group
        self.config = config or GuardConfig()
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.params = [p for p in self.module.parameters() if p.requires_grad]
        self.param_names = [n for n, p in self.module.named_parameters() if p.requires_grad]
        self.device = self.params[0].device if self.params else torch.device("cpu")
        if reporter == "auto":
            from sdctrain.report import KubeReporter

            reporter = KubeReporter.from_environment()
        self.reporter = reporter

        # Every rank of the job (not only this group): replica sets of other groups
        # (experts, pipeline coordinates) name their ranks by global rank too.
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, local_info(dist.get_rank(), self.device))
        self.by_global: dict[int, RankInfo] = {i: info for i, info in enumerate(gathered)}
        self.ranks: list[RankInfo] = [self._info(group, r) for r in range(self.world)]
        """This data-parallel group's ranks, by their rank in the group."""
        self.refused = refusals(
            [r.fingerprint for r in gathered], [r.deterministic for r in gathered]
        )
        if self.config.audit_budget <= 0 and self.config.audit_every is None:
            self.refused.setdefault("audit", "audits are off (audit_budget 0)")
        elif self.ddp is None:
            self.refused.setdefault(
                "audit",
                "the model is not wrapped in DistributedDataParallel (the audit needs no_sync)",
            )
        for check, why in self.refused.items():
            if self.rank == 0:
                log.warning("sdctrain: %s refused: %s", check, why)
        self.replica_sets: list[ReplicaSet] = [
            ReplicaSet("data-parallel", group, self._dp_tensors),
            *replica_sets,
        ]
        self.watch: set[str] = set(self.config.watch_nodes)
        self.step_count = 0
        self.detections: list[Detection] = []
        self._captured = torch.zeros((len(self.params), 2), dtype=torch.int64, device=self.device)
        self._pending: Outcome | None = None
        self._micro = 0
        """``backward`` calls since the last ``step`` (micro-batches accumulated)."""
        self._next_audit = self.config.first_audit_step
        self._step_ema: float | None = None
        self._last_step_end: float | None = None
        self._audit_seconds = 0.0
        self.audits = 0
        self.audit_share = self.config.audit_budget
        """The share of step time the last audit interval was planned for (the budget,
        times ``watch_factor`` while a watched node is in the group)."""
        self.consensus_seconds = 0.0
        self.consensus_checks = 0

    # Tensors ---------------------------------------------------------------

    def _dp_tensors(self) -> list[tuple[str, torch.Tensor]]:
        out = [(n, p.data) for n, p in zip(self.param_names, self.params, strict=True)]
        if self.config.include_optimizer_state:
            for n, p in zip(self.param_names, self.params, strict=True):
                for key, value in sorted(self.optimizer.state.get(p, {}).items()):
                    if isinstance(value, torch.Tensor):
                        out.append((f"{n}:{key}", value))
        return out

    # Collectives -----------------------------------------------------------

    def _global(self, group_rank: int) -> int:
        return dist.get_global_rank(self.group, group_rank) if self.group else group_rank

    def _info(self, group: dist.ProcessGroup | None, group_rank: int) -> RankInfo:
        """The identity of ``group_rank`` of ``group`` (None: the default group)."""
        return self.by_global[dist.get_global_rank(group, group_rank) if group else group_rank]

    def _gather(self, table: torch.Tensor) -> list[torch.Tensor]:
        out = [torch.empty_like(table) for _ in range(self.world)]
        dist.all_gather(out, table.contiguous(), group=self.group)
        return out

    # Shadow audit ----------------------------------------------------------

    def _local_backward(self, batch: Any, capture: bool, reduce: bool) -> torch.Tensor:
        """An audit step's backward: DDP's reduction held back (``no_sync``) so the
        target can digest the gradients it computed itself, then (``reduce``: this
        micro-batch is the step's last) the same average DDP computes (divide by the
        group size, sum), bucketed into one buffer. Under gradient accumulation the
        reduction is DDP's own, on the step's last micro-batch. Ordinary steps use
        DDP's own reduction and pay nothing."""
        assert self.ddp is not None
        with self.ddp.no_sync():
            loss = self.loss_fn(self.model, batch)
            loss.backward()  # type: ignore[no-untyped-call]
        grads = [p.grad for p in self.params]
        if capture:
            for i, g in enumerate(grads):
                if g is not None:
                    self._captured[i] = tensor_digest(g)
        present = [g for g in grads if g is not None]
        if present and reduce:
            flat = torch.cat([g.reshape(-1) for g in present])
            flat.div_(self.world)
            dist.all_reduce(flat, group=self.group)
            at = 0
            for g in present:
                g.copy_(flat[at : at + g.numel()].view_as(g))
                at += g.numel()
        return loss

    def _audit_due(self, step: int) -> bool:
        return "audit" not in self.refused and step >= self._next_audit

    def _roles(self, step: int) -> tuple[int, int, int | None]:
        """Target, auditor and third opinion of an audit step (identical on every rank)."""
        weights = [
            self.config.watch_factor if info.node in self.watch else 1.0 for info in self.ranks
        ]
        target = random.Random(self.config.seed * 1_000_003 + step).choices(
            range(self.world), weights
        )[0]
        auditor = (target + 1) % self.world
        third = (target + 2) % self.world if self.world > 2 else None
        return target, auditor, third

    def _recompute(self, batch: Any, rng: dict[str, torch.Tensor]) -> torch.Tensor:
        """Digests of the gradients of ``batch`` on this rank, touching no ``.grad``."""
        saved = _rng_state(self.device)
        _set_rng_state(rng, self.device)
        try:
            loss = self.loss_fn(self.module, batch)
            grads = torch.autograd.grad(loss, self.params, allow_unused=True)
        finally:
            _set_rng_state(saved, self.device)
        table = torch.zeros_like(self._captured)
        for i, g in enumerate(grads):
            if g is not None:
                table[i] = tensor_digest(g)
        return table

    def _share_batch(
        self, batch: Any, target: int, rng: dict[str, torch.Tensor]
    ) -> tuple[Any, Any]:
        """Broadcast the target's micro-batch and RNG state to every rank."""
        leaves, spec = pytree.tree_flatten(batch)
        meta = [
            ("t", tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else ("o", x)
            for x in leaves
        ]
        box: list[Any] = [(meta, {k: v.cpu() for k, v in rng.items()})]
        dist.broadcast_object_list(box, src=self._global(target), group=self.group)
        their_meta, their_rng = box[0]
        received: list[Any] = []
        for i, m in enumerate(their_meta):
            if m[0] == "o":
                received.append(m[1])
                continue
            if self.rank == target:
                buf = leaves[i].contiguous()
            else:
                buf = torch.empty(m[1], dtype=m[2], device=self.device)
            dist.broadcast(buf, src=self._global(target), group=self.group)
            received.append(buf)
        # Data-parallel ranks feed batches of one structure; only the values differ.
        return pytree.tree_unflatten(received, spec), their_rng

    def _audit(self, step: int, batch: Any, rng: dict[str, torch.Tensor], outcome: Outcome) -> None:
        start = time.perf_counter()
        target, auditor, third = self._roles(step)
        outcome.audited = (target, auditor)
        shared, their_rng = self._share_batch(batch, target, rng)
        mine = torch.zeros_like(self._captured)
        if self.rank == target:
            mine = self._captured.clone()
        elif self.rank == auditor:
            mine = self._recompute(shared, their_rng)
        first = self._gather(mine)
        mismatch = differing_rows(first[target], first[auditor])
        if mismatch:
            again = torch.zeros_like(self._captured)
            if self.rank in (target, auditor, third):
                again = self._recompute(shared, their_rng)
            second = self._gather(again)
            opinions = {
                target: [_key(first[target]), _key(second[target])],
                auditor: [_key(first[auditor]), _key(second[auditor])],
            }
            if third is not None:
                opinions[third] = [_key(second[third])]
            verdict = attribute_recompute(opinions)
            names = ", ".join(self.param_names[i] for i in mismatch[:4])
            if not verdict.faulty:
                outcome.notes.append(
                    f"step {step}: gradients of rank {target} and rank {auditor} differ "
                    f"({names}) but {verdict.reason}; nobody is blamed"
                )
                outcome.skip_step = True
            for rank, kind in verdict.faulty.items():
                detail = (
                    f"shadow audit at step {step}: {self.ranks[rank].describe()} computed "
                    f"gradients that differ from the other replicas' recompute of the same "
                    f"micro-batch ({names}); confirmation: {kind}"
                )
                self._detect(
                    outcome,
                    Method.SHADOW_AUDIT,
                    step,
                    self.group,
                    rank,
                    kind,
                    detail,
                    (
                        ("target", str(target)),
                        ("auditor", str(auditor)),
                        ("thirdOpinion", "none" if third is None else str(third)),
                        ("tensors", names[:256]),
                    ),
                )
                if rank == target:
                    # Its wrong gradient went into the all-reduce: every rank holds it.
                    if kind == Confirmation.PERSISTENT:
                        outcome.stop = self.config.on_persistent == "stop"
                        outcome.skip_step = True
                    else:
                        outcome.skip_step = self.config.on_transient == "skip-step"
                elif kind == Confirmation.PERSISTENT:
                    outcome.stop = outcome.stop or self.config.on_persistent == "stop"
        self._schedule_next_audit(step, time.perf_counter() - start)

    def _schedule_next_audit(self, step: int, spent: float) -> None:
        self.audits += 1
        self._audit_seconds += spent
        timing = torch.tensor([spent, self._step_ema or spent], dtype=torch.float64)
        rows = self._gather(timing.to(self.device))
        cost = max(float(r[0]) for r in rows)
        step_time = max(float(r[1]) for r in rows)
        if self.config.audit_every is not None:
            interval = self.config.audit_every
        else:
            budget = self.config.audit_budget
            if any(info.node in self.watch for info in self.ranks):
                budget *= self.config.watch_factor
            self.audit_share = budget
            interval = max(1, math.ceil(cost / (budget * max(step_time, 1e-9))))
        self._next_audit = step + interval

    # The loop's two calls ----------------------------------------------------

    def backward(self, batch: Any) -> torch.Tensor:
        """``loss_fn(model, batch).backward()``, audited when an audit step comes.

        Called once per micro-batch; an audit step audits its first one.
        """
        step = self.step_count
        if self._pending is None:
            self._pending = Outcome(step=step)
        outcome = self._pending
        audit = self._micro == 0 and self._audit_due(step) and self._grads_clear(outcome)
        rng = _rng_state(self.device) if audit else {}
        if audit:
            self._captured.zero_()
            assert self.ddp is not None
            loss = self._local_backward(
                batch,
                capture=self.rank == self._roles(step)[0],
                # Inside the loop's own no_sync (accumulation): DDP reduces the sum later.
                reduce=bool(self.ddp.require_backward_grad_sync),
            )
            self._audit(step, batch, rng, outcome)
        else:
            loss = self.loss_fn(self.model, batch)
            loss.backward()  # type: ignore[no-untyped-call]
        self._micro += 1
        outcome.micro_batches = self._micro
        return loss

    def _grads_clear(self, outcome: Outcome) -> bool:
        """Whether no rank holds gradients before the audited micro-batch.

        The target digests ``.grad`` after its backward: gradients left from before
        (``zero_grad(set_to_none=False)``, no ``zero_grad``) would be digested with it
        and make a healthy GPU look wrong, so the audit is skipped and says why. The
        answer is all-reduced, so every rank skips or audits alike.
        """
        held = any(p.grad is not None for p in self.params)
        flag = torch.tensor([1 if held else 0], dtype=torch.int64, device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        if int(flag.item()) == 0:
            return True
        outcome.notes.append(
            f"step {outcome.step} not audited: gradients already held values before its "
            "first micro-batch; call optimizer.zero_grad(set_to_none=True) before it"
        )
        return False

    def step(self) -> Outcome:
        """``optimizer.step()`` unless the step must be dropped, then consensus when due."""
        outcome = self._pending or Outcome(step=self.step_count)
        self._pending = None
        self._micro = 0
        if outcome.skip_step:
            self.optimizer.zero_grad(set_to_none=True)
            outcome.notes.append(f"step {outcome.step} skipped: its gradient was computed wrongly")
        else:
            self.optimizer.step()
        every = self.config.consensus_every
        if every > 0 and (outcome.step + 1) % every == 0:
            self.check_replicas(outcome)
        now = time.perf_counter()
        if self._last_step_end is not None and outcome.audited is None:
            took = now - self._last_step_end
            self._step_ema = took if self._step_ema is None else 0.9 * self._step_ema + 0.1 * took
        self._last_step_end = now
        self.step_count += 1
        return outcome

    # Replica consensus -----------------------------------------------------

    def check_replicas(self, outcome: Outcome | None = None) -> Outcome:
        """Digest every replica set, compare across its group, confirm and repair."""
        outcome = outcome or Outcome(step=self.step_count)
        if "consensus" in self.refused:
            return outcome
        start = time.perf_counter()
        for replica_set in self.replica_sets:
            self._consensus(replica_set, outcome)
        self.consensus_seconds += time.perf_counter() - start
        self.consensus_checks += 1
        return outcome

    def _consensus(self, rs: ReplicaSet, outcome: Outcome) -> None:
        named = list(rs.tensors())
        group = rs.group
        world = dist.get_world_size(group)
        count = torch.tensor([len(named)], dtype=torch.int64, device=self.device)
        counts = [torch.empty_like(count) for _ in range(world)]
        dist.all_gather(counts, count, group=group)
        if len({int(c) for c in counts}) > 1:
            outcome.notes.append(f"{rs.name}: replicas hold different numbers of tensors")
            return
        local = digest_all([t for _, t in named], self.device)
        tables = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(tables, local, group=group)
        verdict = replica_consensus({r: _key(t) for r, t in enumerate(tables)})
        if verdict.agree:
            return
        step = outcome.step
        if not verdict.attributed:
            outcome.notes.append(f"step {step}: {rs.name} replicas differ; {verdict.reason}")
            outcome.stop = True
            return
        me = dist.get_rank(group)
        keeper = verdict.majority_ranks[0]
        for odd in verdict.odd_ranks:
            rows = differing_rows(tables[odd], tables[keeper])
            redigest = digest_all([named[i][1] for i in rows], self.device)
            cross = torch.zeros_like(redigest)
            for j, i in enumerate(rows):
                tensor = named[i][1]
                buf = tensor.detach().clone() if me == odd else torch.empty_like(tensor)
                src = dist.get_global_rank(group, odd) if group else odd
                dist.broadcast(buf, src=src, group=group)
                if me == keeper:
                    cross[j] = tensor_digest(buf)
            both = torch.stack([redigest, cross])
            seen = [torch.empty_like(both) for _ in range(world)]
            dist.all_gather(seen, both, group=group)
            kind, why = confirm_divergence(
                _key(tables[odd][rows]), _key(seen[odd][0]), _key(seen[keeper][1])
            )
            names = ", ".join(named[i][0] for i in rows[:4])
            confirmation = (
                Confirmation.TRANSIENT if kind == "transient-digest" else (Confirmation.PERSISTENT)
            )
            detail = (
                f"replica consensus after step {step}: {self._info(group, odd).describe()} holds "
                f"{len(rows)} tensor(s) ({names}) that differ from the "
                f"{len(verdict.majority_ranks)} other replicas; {why}"
            )
            self._detect(
                outcome,
                Method.REPLICA_CONSENSUS,
                step,
                group,
                odd,
                confirmation,
                detail,
                (("replicaSet", rs.name), ("tensors", names[:256]), ("kind", kind)),
            )
            if kind == "state" and self.config.repair_replicas:
                src = dist.get_global_rank(group, keeper) if group else keeper
                with torch.no_grad():
                    for i in rows:
                        dist.broadcast(named[i][1], src=src, group=group)
                outcome.repaired.append(odd)
            elif kind == "digest":
                outcome.stop = outcome.stop or self.config.on_persistent == "stop"

    # Detections and reports --------------------------------------------------

    def _detect(
        self,
        outcome: Outcome,
        method: Method,
        step: int,
        group: dist.ProcessGroup | None,
        group_rank: int,
        confirmation: Confirmation,
        detail: str,
        evidence: Iterable[tuple[str, str]],
    ) -> None:
        info = self._info(group, group_rank)
        detection = Detection(
            method=method,
            step=step,
            rank=info.rank,
            confirmation=confirmation,
            detail=detail,
            node=info.node,
            pod=info.pod,
            namespace=info.namespace,
            job=info.job,
            gpu_uuid=info.gpu_uuid,
            evidence=tuple(evidence),
        )
        outcome.detections.append(detection)
        self.detections.append(detection)
        if info.node:
            self.watch.add(info.node)
        if self.rank == 0:
            log.error("sdctrain: %s", detail)
        if self.reporter is None:
            return
        if confirmation == Confirmation.TRANSIENT and not self.config.report_transient:
            return
        # One rank of the group that judged reports: the lowest one not blamed.
        members = [self._info(group, r).rank for r in range(dist.get_world_size(group))]
        blamed = {d.rank for d in outcome.detections}
        reporter = min((r for r in members if r not in blamed), default=None)
        if reporter == dist.get_rank():
            try:
                self.reporter.report(detection)
            except Exception as exc:  # a failed report must never stop training
                log.warning("sdctrain: report not delivered: %s", exc)

    # Introspection -----------------------------------------------------------

    @property
    def audit_overhead_seconds(self) -> float:
        """Seconds this rank spent in audits so far."""
        return self._audit_seconds
