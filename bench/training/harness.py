"""Runs small DDP trainings in a gloo process group of spawned CPU ranks.

One spawn serves a list of trials (torch imports once per rank); each trial
builds a fresh model, optimizer, DDP wrapper and guard, trains ``steps`` steps
with an optional fault on one rank, and returns what every rank saw. Used by the
tests (tests/training) and the benchmark (``bench.training.run``).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


@dataclass
class Trial:
    """One training run."""

    name: str
    steps: int = 30
    fault: dict[str, Any] | None = None
    faulty_rank: int = 1
    guard: bool = True
    config: dict[str, Any] = field(default_factory=dict)
    deterministic: bool = True
    baseline: bool = False
    """Also run a digest-after-reduction check every step (the comparison baseline)."""
    width: int = 64
    depth: int = 3
    batch: int = 16
    seed: int = 0
    env: dict[int, dict[str, str]] = field(default_factory=dict)
    """Per-rank environment overrides (node names, a different fingerprint)."""
    fingerprint_override: dict[int, dict[str, str]] = field(default_factory=dict)
    """Per-rank fingerprint entries to change (mixed software versions)."""
    dropout: float = 0.0
    first_pass_only: bool = False
    """Forward/backward faults hit only the step's first pass (a transient upset)."""
    head_replica_set: bool = False
    """Also check the output layer as its own replica set, over a group of its own."""
    report: bool = False
    """Report detections to the API server (``KubeReporter.from_environment``; set
    ``SDCGUARD_API_SERVER``, ``SDCGUARD_TOKEN_FILE``, ``SDCGUARD_CA_FILE`` in ``env``)."""
    micro_batches: int = 1
    """Micro-batches accumulated per optimizer step (all but the last under no_sync)."""
    set_to_none: bool = True
    """``optimizer.zero_grad(set_to_none=...)`` before each step."""
    device: str = "cpu"
    """Where the model and batches live: ``cpu``, or ``cuda`` (every rank on the first
    GPU, still in the gloo group: a stand-in for one GPU per rank over NCCL)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _model(trial: Trial) -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    for _ in range(trial.depth):
        layers += [torch.nn.Linear(trial.width, trial.width), torch.nn.Tanh()]
        if trial.dropout:
            layers.append(torch.nn.Dropout(trial.dropout))
    layers.append(torch.nn.Linear(trial.width, 1))
    return torch.nn.Sequential(*layers)


def _batch(trial: Trial, rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(trial.seed * 7919 + step * 131 + rank)
    x = torch.randn(trial.batch, trial.width, generator=gen)
    y = x[:, :1].sin()
    return x, y


def _loss(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return torch.nn.functional.mse_loss(model(x), y)


def _after_reduction_check(model: torch.nn.Module, world: int) -> int | None:
    """Baseline: digests taken after the all-reduce (the reduced gradients and the
    updated parameters), compared across replicas after every step.

    Returns the rank a strict majority names as odd, -1 for a split without a
    majority, None when all replicas agree (hashing after the reduction, as
    replayers and weight-hash checks do).
    """
    from sdctrain.digest import digest_all
    from sdctrain.verdicts import replica_consensus

    grads = [p.grad for p in model.parameters() if p.grad is not None]
    local = digest_all(grads + [p.data for p in model.parameters()])
    tables = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(tables, local)
    verdict = replica_consensus({r: tuple(t.reshape(-1).tolist()) for r, t in enumerate(tables)})
    if verdict.agree:
        return None
    return verdict.odd_ranks[0] if verdict.attributed else -1


def _run_trial(trial: Trial, rank: int, world: int) -> dict[str, Any]:
    from bench.training.inject import TrainingFaults
    from sdcprobe.faultspec import Fault
    from sdctrain import GuardConfig, TrainingGuard, identity

    saved_env = dict(os.environ)
    os.environ.update(trial.env.get(rank, {}))
    original_fp = identity.fingerprint
    override = trial.fingerprint_override.get(rank)
    if override:
        identity.fingerprint = lambda device: {**original_fp(device), **override}
    torch.use_deterministic_algorithms(trial.deterministic)
    device = torch.device(trial.device)
    if device.type == "cuda":
        device = torch.device("cuda", device.index or 0)
        torch.cuda.set_device(device)
    torch.manual_seed(trial.seed)
    model = _model(trial).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    faults = None
    if trial.fault is not None and rank == trial.faulty_rank:
        faults = TrainingFaults(
            Fault.model_validate(trial.fault), model, optimizer, trial.first_pass_only
        )
    guard = None
    extra = []
    if trial.head_replica_set:
        from sdctrain import ReplicaSet

        head = dist.new_group(list(range(world)))
        last = list(model.children())[-1]
        extra.append(ReplicaSet("head", head, lambda: list(last.named_parameters())))
    try:
        if trial.guard:
            guard = TrainingGuard(
                ddp,
                optimizer,
                _loss,
                config=GuardConfig(**trial.config),
                reporter="auto" if trial.report else None,
                replica_sets=extra,
            )
    finally:
        identity.fingerprint = original_fp
    detections: list[dict[str, Any]] = []
    baseline: list[dict[str, Any]] = []
    times: list[float] = []
    cpu: list[float] = []
    notes: list[str] = []
    skipped = stopped_at = 0
    first_hit: int | None = None
    stop_step: int | None = None
    torch.manual_seed(trial.seed + 1 + rank)
    dist.barrier()
    for step in range(trial.steps):
        if faults is not None:
            faults.set_step(step)
            hits_before = faults.hits
        micro = trial.micro_batches
        batches = [_batch(trial, rank, step * micro + m) for m in range(micro)]
        batches = [(x.to(device), y.to(device)) for x, y in batches]
        start = time.perf_counter()
        cpu_start = time.process_time()
        optimizer.zero_grad(set_to_none=trial.set_to_none)
        if guard is not None:
            for m, batch in enumerate(batches):
                with ddp.no_sync() if m < micro - 1 else contextlib.nullcontext():
                    guard.backward(batch)
            if faults is not None:
                faults.after_reduce()
            outcome = guard.step()
            if trial.baseline:
                odd = _after_reduction_check(model, world)
                if odd is not None:
                    baseline.append({"step": step, "rank": odd})
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - cpu_start)
            skipped += outcome.skip_step
            notes += outcome.notes
            for d in outcome.detections:
                detections.append(
                    {
                        "step": step,
                        "method": str(d.method),
                        "rank": d.rank,
                        "node": d.node,
                        "confirmation": str(d.confirmation),
                        "replica_set": dict(d.evidence).get("replicaSet"),
                        "detail": d.detail,
                    }
                )
            if faults is not None and first_hit is None and faults.hits > hits_before:
                first_hit = step
            if outcome.stop:
                stop_step = step
                stopped_at += 1
                break
        else:
            for m, batch in enumerate(batches):
                with ddp.no_sync() if m < micro - 1 else contextlib.nullcontext():
                    loss = _loss(ddp, batch)
                    loss.backward()  # type: ignore[no-untyped-call]
            if faults is not None:
                faults.after_reduce()
            optimizer.step()
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - cpu_start)
            if trial.baseline:
                odd = _after_reduction_check(model, world)
                if odd is not None:
                    baseline.append({"step": step, "rank": odd})
            if faults is not None and first_hit is None and faults.hits > hits_before:
                first_hit = step
    from sdctrain.digest import digest_all

    final = digest_all([p.data for p in model.parameters()]).reshape(-1).tolist()
    dist.barrier()
    os.environ.clear()
    os.environ.update(saved_env)
    return {
        "trial": trial.name,
        "rank": rank,
        "detections": detections,
        "baseline": baseline,
        "times": times,
        "cpu_times": cpu,
        "skipped": skipped,
        "stop_step": stop_step,
        "notes": notes,
        "refused": dict(guard.refused) if guard is not None else {},
        "audits": guard.audits if guard is not None else 0,
        "audit_share": guard.audit_share if guard is not None else 0.0,
        "audit_seconds": guard.audit_overhead_seconds if guard is not None else 0.0,
        "consensus_seconds": guard.consensus_seconds if guard is not None else 0.0,
        "consensus_checks": guard.consensus_checks if guard is not None else 0,
        "fault_hits": faults.hits if faults is not None else 0,
        "first_hit_step": first_hit,
        "final_digest": final,
    }


def _worker(rank: int, world: int, port: int, trials_json: str, out_dir: str, threads: int) -> None:
    torch.set_num_threads(threads)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        results = []
        for raw in json.loads(trials_json):
            raw["env"] = {int(k): v for k, v in raw.get("env", {}).items()}
            raw["fingerprint_override"] = {
                int(k): v for k, v in raw.get("fingerprint_override", {}).items()
            }
            results.append(_run_trial(Trial(**raw), rank, world))
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
        dist.barrier()  # every rank done with its collectives before any tears down
    finally:
        dist.destroy_process_group()
    # A clean exit skips the interpreter's teardown, where a rank can abort ("terminate
    # called without an active exception": a C++ thread still joinable as the process
    # ends) after every rank has written its results.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_trials(trials: list[Trial], world: int = 3, threads: int = 1) -> list[list[dict[str, Any]]]:
    """Run every trial on ``world`` spawned ranks; ``result[i][rank]`` is trial i on rank."""
    with tempfile.TemporaryDirectory(prefix="sdctrain-") as out:
        mp.start_processes(  # type: ignore[attr-defined]
            _worker,
            args=(world, free_port(), json.dumps([asdict(t) for t in trials]), out, threads),
            nprocs=world,
            join=True,
            start_method="spawn",
        )
        per_rank = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world)]
    return [[per_rank[r][i] for r in range(world)] for i in range(len(trials))]
