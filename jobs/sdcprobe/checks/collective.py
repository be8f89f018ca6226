"""``collective``: all-reduce, all-gather and broadcast between this node's devices.

Inputs are integer-valued fp32 tensors, small enough that every partial sum is
exact, so the correct result is known exactly on every rank: any difference is
corruption, with no tolerance to argue about. Each rank draws its own input on
its device, ``h + rank * g`` from two vectors every rank draws alike, so every
rank knows every other rank's input and the exact sum without drawing theirs,
and a wrong all-gather chunk names the device it came from. Results are checked
and digested on the device; the host gets a few integers per round. Bus
bandwidth is measured the way nccl-tests defines it.
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist

from sdcprobe.backends import Backend
from sdcprobe.config import CollectiveConfig, round_seed
from sdcprobe.deadline import RoundClock, round_spread
from sdcprobe.devicedata import (
    device_generator,
    digest_hex,
    draw_integers,
    seed_of,
    tensor_kind,
    word_digest,
)
from sdcprobe.instrument import Instrumentation
from sdcprobe.trace import STEP_DIGEST_CHARS, CheckTrace, Evidence, trace_digest, typical_round

#: How long a rank waits for its peers before the check is inconclusive.
TIMEOUT = timedelta(seconds=120)


def input_bound(world: int) -> int:
    """Inputs are integers in [-bound, bound): every partial sum of the ranks' inputs
    ``h + r * g`` stays below 2^24 in magnitude, so fp32 holds it exactly."""
    w = max(world, 1)
    return max(1, min(1 << 20, (1 << 24) // (w + w * (w - 1) // 2 + 1)))


def round_operands(
    seed: int, step: int, world: int, elements: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The round's two shared vectors ``h`` and ``g`` (exact integers in fp32), drawn on
    ``device``: every rank draws the same two, and rank ``r``'s input is ``h + r * g``.
    So each rank makes only its own input, yet knows every other rank's input and the
    exact sum ``world * h + world (world - 1) / 2 * g`` without drawing theirs: the
    device work and the host work per round do not grow with the number of devices."""
    bound = input_bound(world)
    gen = device_generator(device, seed_of(seed, step, elements, 3))
    h = draw_integers((elements,), -bound, bound, gen, device).to(torch.float32)
    g = draw_integers((elements,), -bound, bound, gen, device).to(torch.float32)
    return h, g


def rank_input(seed: int, step: int, rank: int, world: int, elements: int) -> torch.Tensor:
    """Rank ``rank``'s input in round ``step`` on the host (tests; the check draws on
    its device with :func:`round_operands`)."""
    h, g = round_operands(seed, step, world, elements, torch.device("cpu"))
    return h + rank * g


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
    Inputs are drawn, results checked against their exact values and digested on the
    device; per round the host receives one row of eight integers.

    ``best_busbw`` (GB/s, from :func:`measure_busbw` in the same run) turns the
    checked all-reduces' bus bandwidth into a ratio to the best. ``clock``: no
    round starts that would end past its deadline on any rank (the ranks agree
    on it with one small all-reduce per round, outside the checked traffic)."""
    backend = ins.backend
    device = backend.collective_device
    watch = backend.stopwatch()
    start, cpu0 = time.perf_counter(), time.process_time()
    bytes0, transfers0 = backend.traffic.snapshot()
    steps: list[dict[str, str]] = []
    evidence: list[Evidence] = []
    timings: dict[str, float] = {"allreduce": 0.0, "allgather": 0.0, "broadcast": 0.0}
    nbytes = cfg.elements * 4
    round_times: list[float] = []
    host_s = 0.0
    cut = False
    pairs = world * (world - 1) // 2
    for step in range(cfg.rounds):
        if _stop_here(clock, step, typical_round(round_times), device, backend):
            cut = True
            break
        r0 = time.perf_counter()
        ins.set_step(step)
        data = round_seed(seed, data_seed, step, fresh_from)
        h, g = round_operands(data, step, world, cfg.elements, device)
        mine = h + rank * g
        marks: dict[str, tuple[object, object]] = {}

        buf = mine.clone()  # collectives write in place
        t0 = watch.mark()
        dist.all_reduce(buf, op=dist.ReduceOp.SUM)
        marks["allreduce"] = (t0, watch.mark())
        reduced = ins.output(buf, "allreduce", operand=mine)
        expected = h * world + g * pairs  # exact: integers below 2^24
        reduced_wrong = torch.count_nonzero(reduced != expected)

        gathered = [torch.empty_like(mine) for _ in range(world)]
        t0 = watch.mark()
        dist.all_gather(gathered, mine)
        marks["allgather"] = (t0, watch.mark())
        per_source = torch.stack(
            [torch.count_nonzero(chunk != h + src * g) for src, chunk in enumerate(gathered)]
        )
        bad_sources = per_source > 0
        gathered_digest = word_digest(torch.cat([word_digest(c) for c in gathered]))

        root = step % world
        sent = mine.clone()
        t0 = watch.mark()
        dist.broadcast(sent, src=root)
        marks["broadcast"] = (t0, watch.mark())
        sent_wrong = torch.count_nonzero(sent != h + root * g)

        row = torch.cat(
            [
                word_digest(reduced),
                gathered_digest,
                word_digest(sent),
                reduced_wrong.reshape(1),
                per_source.sum().reshape(1),
                bad_sources.sum().reshape(1),
                # The first source whose chunk was wrong (0 when none was).
                torch.argmax(bad_sources.to(torch.int32)).reshape(1),
                sent_wrong.reshape(1),
            ]
        )
        got = backend.to_host(row, what=f"collective round {step} summary").tolist()
        h0 = time.perf_counter()
        for op, (m0, m1) in marks.items():
            timings[op] += watch.seconds(m0, m1)
        kind = tensor_kind(mine)
        items = {
            "allreduce": digest_hex(got[0], kind)[:STEP_DIGEST_CHARS],
            "allgather": digest_hex(got[1], f"{kind}x{world}")[:STEP_DIGEST_CHARS],
            "broadcast": digest_hex(got[2], kind)[:STEP_DIGEST_CHARS],
        }
        evidence.extend(_findings(step, got[3:], root))
        steps.append(items)
        now = time.perf_counter()
        host_s += now - h0
        round_times.append(now - r0)

    # nccl-tests bus bandwidth: the traffic each link carries, comparable across sizes.
    n = max(world, 1)
    rounds = len(steps)
    factors = {"allreduce": _allreduce_factor(n), "allgather": (n - 1) / n * n, "broadcast": 1.0}
    host_bytes, host_transfers = (
        x - x0 for x, x0 in zip(backend.traffic.snapshot(), (bytes0, transfers0), strict=True)
    )
    metrics: dict[str, int | float | str | None] = {
        "world": world,
        "bytes": nbytes,
        "rounds": rounds,
        "host_bytes_per_round": round(host_bytes / rounds) if rounds else None,
        "host_syncs_per_round": round(host_transfers / rounds, 2) if rounds else None,
        # Share of a round spent on the host evaluating what came back (the rest: the
        # collectives and the device's own checks).
        "host_share": round(host_s / sum(round_times), 4) if round_times else None,
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


def _findings(step: int, counts: list[int], root: int) -> list[Evidence]:
    """Evidence from one round's counts: (all-reduce wrong, all-gather wrong, sources
    whose chunk was wrong, the first of them, broadcast wrong)."""
    reduced, gathered, sources, first, sent = counts
    found: list[Evidence] = []
    if reduced:
        found.append(
            Evidence(
                kind="collective",
                step=step,
                item="allreduce",
                detail=f"all-reduce result wrong in {reduced} elements",
            )
        )
    if gathered:
        more = f" and {sources - 1} other device(s)" if sources > 1 else ""
        found.append(
            Evidence(
                kind="collective",
                step=step,
                item="allgather",
                source=first if sources == 1 else None,
                detail=f"all-gather chunk from device {first}{more} wrong in {gathered} elements",
            )
        )
    if sent:
        found.append(
            Evidence(
                kind="collective",
                step=step,
                item="broadcast",
                source=root,
                detail=f"broadcast from device {root} wrong in {sent} elements",
            )
        )
    return found


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
