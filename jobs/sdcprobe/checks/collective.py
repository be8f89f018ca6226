"""``collective``: all-reduce, all-gather and broadcast between this node's devices.

Inputs are integer-valued fp32 tensors, small enough that every partial sum is
exact (|x| < 2^24 / world), so the correct result is known exactly on every
rank: any difference is corruption, with no tolerance to argue about. Every rank
can recompute every other rank's input from the seed, so a wrong all-gather
chunk also names the device it came from. Bus bandwidth is measured the way
nccl-tests defines it.
"""

from __future__ import annotations

import math
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from sdcprobe.backends import Backend
from sdcprobe.config import CollectiveConfig, round_seed
from sdcprobe.deadline import RoundClock, round_spread
from sdcprobe.instrument import Instrumentation, tensor_digest
from sdcprobe.trace import STEP_DIGEST_CHARS, CheckTrace, Evidence, trace_digest, typical_round

#: How long a rank waits for its peers before the check is inconclusive.
TIMEOUT = timedelta(seconds=120)


def rank_input(seed: int, step: int, rank: int, world: int, elements: int) -> torch.Tensor:
    """Rank ``rank``'s host input in round ``step``: exact integers in fp32."""
    bound = 2 ** (23 - math.ceil(math.log2(max(world, 2))))
    gen = torch.Generator().manual_seed(seed * 1_000_037 + step * 7_013 + rank * 31 + 3)
    return torch.randint(-bound, bound, (elements,), generator=gen, dtype=torch.int64).to(
        torch.float32
    )


def init_group(backend_name: str, rank: int, world: int, store_path: str) -> None:
    """Join the node-local process group: through a file store (no ports to pick)
    for gloo and NCCL, through torch-xla's own rendezvous for XLA collectives."""
    if backend_name == "xla":
        import torch_xla.distributed.xla_backend  # noqa: F401  (registers the backend)

        dist.init_process_group("xla", init_method="xla://", timeout=TIMEOUT)
        return
    store = dist.FileStore(store_path, world)  # type: ignore[attr-defined]
    dist.init_process_group(backend_name, store=store, rank=rank, world_size=world, timeout=TIMEOUT)


#: Message sizes (fp32 elements) the bus-bandwidth sweep tries, per backend.
BUSBW_LADDER: dict[str, tuple[int, ...]] = {
    "cpu": (1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22),
    "cuda": (1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28),
    "xla": (1 << 20, 1 << 22, 1 << 24, 1 << 26),
}


def _allreduce_factor(world: int) -> float:
    n = max(world, 1)
    return 2 * (n - 1) / n


def measure_busbw(cfg: CollectiveConfig, ins: Instrumentation, world: int) -> float:
    """The best all-reduce bus bandwidth (GB/s, nccl-tests' definition) this node's
    devices reach now, over a sweep of message sizes up to and including the
    check's own. Every rank must call it (it runs collectives)."""
    backend = ins.backend
    device = backend.collective_device
    ladder = BUSBW_LADDER["cpu" if device.type == "cpu" else backend.name]
    best = 0.0
    for elements in sorted({*(e for e in ladder if e <= cfg.elements), cfg.elements}):
        buf = torch.ones(elements, dtype=torch.float32, device=device)
        dist.all_reduce(buf)  # untimed: connection and buffer set-up
        backend.sync()
        dist.barrier()
        # A fixed count: every rank must issue the same collectives.
        reps, t0 = 4, time.perf_counter()
        for _ in range(reps):
            dist.all_reduce(buf)
        backend.sync()
        # The slowest rank's time is the collective's time.
        elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64).to(device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        seconds = float(backend.to_host(elapsed)[0])
        best = max(best, elements * 4 * _allreduce_factor(world) * reps / seconds / 1e9)
    return best


def run_collective(
    cfg: CollectiveConfig,
    seed: int,
    ins: Instrumentation,
    rank: int,
    world: int,
    best_busbw: float | None = None,
    clock: RoundClock | None = None,
    data_seed: int | None = None,
    fresh_from: int = 0,
) -> CheckTrace:
    """Run the collective check; the process group must already be initialised.

    Rounds from ``fresh_from`` on draw their inputs from ``data_seed`` (the
    screening's own seed), the rounds before it from ``seed`` (what a baseline covers).

    ``best_busbw`` (GB/s, from :func:`measure_busbw` in the same run) turns the
    checked all-reduces' bus bandwidth into a ratio to the best. ``clock``: no
    round starts that would end past its deadline on any rank (the ranks agree
    on it with one small all-reduce per round, outside the checked traffic)."""
    backend = ins.backend
    device = backend.collective_device
    start, cpu0 = time.perf_counter(), time.process_time()
    steps: list[dict[str, str]] = []
    evidence: list[Evidence] = []
    timings: dict[str, float] = {"allreduce": 0.0, "allgather": 0.0, "broadcast": 0.0}
    nbytes = cfg.elements * 4
    round_times: list[float] = []
    cut = False
    for step in range(cfg.rounds):
        if _stop_here(clock, step, typical_round(round_times), device, backend):
            cut = True
            break
        r0 = time.perf_counter()
        ins.set_step(step)
        data = round_seed(seed, data_seed, step, fresh_from)
        inputs = [rank_input(data, step, r, world, cfg.elements) for r in range(world)]
        expected_sum = torch.stack(inputs).sum(0)  # exact: integers below 2^24
        items: dict[str, str] = {}

        buf = inputs[rank].to(device, copy=True)  # collectives write in place
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(buf, op=dist.ReduceOp.SUM)
        backend.sync()
        timings["allreduce"] += time.perf_counter() - t0
        buf = ins.output(buf, "allreduce", operand=inputs[rank].to(device))
        got = backend.to_host(buf)
        wrong = int((got != expected_sum).sum())
        if wrong:
            evidence.append(
                Evidence(
                    kind="collective",
                    step=step,
                    item="allreduce",
                    detail=f"all-reduce result wrong in {wrong} elements",
                )
            )
        items["allreduce"] = tensor_digest(got)[:STEP_DIGEST_CHARS]

        gathered = [
            torch.empty(cfg.elements, dtype=torch.float32, device=device) for _ in range(world)
        ]
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_gather(gathered, inputs[rank].to(device))
        backend.sync()
        timings["allgather"] += time.perf_counter() - t0
        for src, chunk in enumerate(gathered):
            wrong = int((backend.to_host(chunk) != inputs[src]).sum())
            if wrong:
                evidence.append(
                    Evidence(
                        kind="collective",
                        step=step,
                        item="allgather",
                        source=src,
                        detail=f"all-gather chunk from device {src} wrong in {wrong} elements",
                    )
                )
        items["allgather"] = tensor_digest(torch.cat([backend.to_host(c) for c in gathered]))[
            :STEP_DIGEST_CHARS
        ]

        root = step % world
        buf = inputs[rank].to(device, copy=True)  # collectives write in place
        dist.barrier()
        t0 = time.perf_counter()
        dist.broadcast(buf, src=root)
        backend.sync()
        timings["broadcast"] += time.perf_counter() - t0
        got = backend.to_host(buf)
        wrong = int((got != inputs[root]).sum())
        if wrong:
            evidence.append(
                Evidence(
                    kind="collective",
                    step=step,
                    item="broadcast",
                    source=root,
                    detail=f"broadcast from device {root} wrong in {wrong} elements",
                )
            )
        items["broadcast"] = tensor_digest(got)[:STEP_DIGEST_CHARS]
        steps.append(items)
        round_times.append(time.perf_counter() - r0)

    # nccl-tests bus bandwidth: the traffic each link carries, comparable across sizes.
    n = max(world, 1)
    rounds = len(steps)
    factors = {"allreduce": _allreduce_factor(n), "allgather": (n - 1) / n * n, "broadcast": 1.0}
    metrics: dict[str, int | float | str | None] = {
        "world": world,
        "bytes": nbytes,
        "rounds": rounds,
    }
    for op, secs in timings.items():
        if secs > 0:
            metrics[f"{op}_busbw_gbps"] = round(nbytes * factors[op] * rounds / secs / 1e9, 4)
    checked = metrics.get("allreduce_busbw_gbps")
    if best_busbw and isinstance(checked, float) and world > 1:
        metrics["best_busbw_gbps"] = round(best_busbw, 4)
        metrics["busbw_ratio"] = round(checked / best_busbw, 3)
    return CheckTrace(
        digest=trace_digest(steps),
        steps=steps,
        evidence=evidence,
        metrics=metrics,
        wall_s=time.perf_counter() - start,
        cpu_s=time.process_time() - cpu0,
        round_s=typical_round(round_times),
        round_cv=round(round_spread(round_times), 4),
        cut_at_deadline=cut,
    )


def _stop_here(
    clock: RoundClock | None, done: int, next_s: float, device: torch.device, backend: Backend
) -> bool:
    """Whether every rank stops before round ``done``: stopped if any rank's clock
    says so. The condition for asking is the same on every rank (same plan), so
    every rank issues the same collectives."""
    if clock is None or clock.deadline is None or done < clock.minimum:
        return False
    flag = torch.tensor([0.0 if clock.allows(done, next_s) else 1.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(backend.to_host(flag)[0] > 0)
