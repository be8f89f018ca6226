"""``memory``: write known patterns into device memory, let them sit, read them back.

A share of the device's free memory (80% of free HBM by default on
accelerators, a fixed 64 MiB per CPU replica) is filled, block by block, with
each pattern in turn:

* ``walking-ones``: word *i* holds ``1 << (i mod 32)``;
* ``walking-zeros``: its complement;
* ``checkerboard`` / ``checkerboard-inverse``: ``0x55555555`` and ``0xAAAAAAAA``
  alternating from word to word, then swapped, so every bit holds both values;
* ``random``: a seeded random row, XOR-ed with a key derived from the row's
  index, so every row of the buffer holds different data and an address that
  aliases another one shows up.

After a dwell the buffer is compared with the pattern regenerated on the
device, bit for bit. The expected content is known exactly, so any difference
is corruption: no tolerance, no baseline needed. Flips are reported with their
byte offset in the tested buffer and bit position in the 32-bit word.

The digest covers the patterns and the configured sizes (and, if there were
any, the flips), not the number of bytes tested: that depends on how much
memory was free, which may differ between devices and runs that are healthy.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from dataclasses import dataclass, field, replace

import torch

from sdcprobe.backends import Backend
from sdcprobe.config import MemoryConfig, round_seed
from sdcprobe.deadline import RoundClock, round_spread
from sdcprobe.instrument import Instrumentation
from sdcprobe.trace import STEP_DIGEST_CHARS, CheckTrace, Evidence, trace_digest, typical_round

WORD_BYTES = 4
_MIB = 1 << 20
_KEY_MULTIPLIER = 0x9E3779B1  # odd, so distinct rows get distinct keys (mod 2^32)
#: How many examples of flips one evidence line quotes.
_QUOTED = 3


def _int32(values: torch.Tensor) -> torch.Tensor:
    """Unsigned 32-bit values held in int64 -> the same bits as int32."""
    return torch.where(values >= 1 << 31, values - (1 << 32), values).to(torch.int32)


def pattern_row(name: str, seed: int, words: int, cycle: int = 0) -> torch.Tensor:
    """One row of pattern ``name`` as ``words`` int32 words, on the host.

    ``cycle`` counts how often the pattern list came round before: the fixed
    patterns repeat, the random one is drawn anew every cycle."""
    i = torch.arange(words, dtype=torch.int64)
    if name in ("walking-ones", "walking-zeros"):
        ones = torch.bitwise_left_shift(torch.ones_like(i), i % 32)
        values = ones if name == "walking-ones" else 0xFFFFFFFF ^ ones
    elif name in ("checkerboard", "checkerboard-inverse"):
        even, odd = (0x55555555, 0xAAAAAAAA)[:: 1 if name == "checkerboard" else -1]
        values = torch.where(i % 2 == 0, even, odd)
    elif name == "random":
        gen = torch.Generator().manual_seed(seed * 1_000_039 + 11 + cycle * 7_919_011)
        values = torch.randint(0, 1 << 32, (words,), generator=gen, dtype=torch.int64)
    else:
        raise ValueError(f"unknown memory pattern {name!r}")
    return _int32(values)


def row_keys(name: str, first_row: int, rows: int) -> torch.Tensor | None:
    """Per-row XOR keys of the rows ``[first_row, first_row + rows)`` (``random`` only)."""
    if name != "random":
        return None
    r = torch.arange(first_row, first_row + rows, dtype=torch.int64)
    return _int32((r * _KEY_MULTIPLIER) & 0xFFFFFFFF).reshape(rows, 1)


def free_device_bytes(backend: Backend) -> int | None:
    """Free memory of this worker's device in bytes; None where it cannot be read."""
    try:
        if backend.name == "cuda":
            torch.cuda.empty_cache()  # blocks cached by earlier checks are free for us
            free, _total = torch.cuda.mem_get_info(backend.device)
            return int(free)
        if backend.name == "xla":
            import torch_xla.core.xla_model as xm

            info = xm.get_memory_info(backend.device)
            if "bytes_limit" in info:
                return int(info["bytes_limit"]) - int(info["bytes_used"])
            if "kb_free" in info:  # older torch-xla
                return int(info["kb_free"]) * 1024
    except Exception:  # a runtime without memory statistics: use the fallback size
        return None
    return None


@dataclass(frozen=True)
class MemoryPlan:
    """How much of this device one run tests, and in what blocks."""

    bytes: int
    block_bytes: int
    blocks: int
    rows_per_block: int
    free_bytes: int | None


def plan_memory(cfg: MemoryConfig, backend: Backend) -> MemoryPlan:
    """Bytes to test on ``backend``'s device: fixed, or a share of what is free now."""
    row_bytes = cfg.row_words * WORD_BYTES
    free: int | None = None
    if cfg.mib is not None:
        want = cfg.mib * _MIB
    else:
        free = free_device_bytes(backend)
        want = cfg.fallback_mib * _MIB if free is None else int(free * cfg.fraction)
        want = min(want, cfg.max_mib * _MIB)
    block = max(min(cfg.block_mib * _MIB, want) // row_bytes, 1) * row_bytes
    blocks = max(want // block, 1)
    return MemoryPlan(blocks * block, block, blocks, block // row_bytes, free)


@dataclass
class _Flips:
    """Bit flips found so far, with a bounded list of where they were."""

    limit: int
    bits: int = 0
    words: int = 0
    by_bit: Counter[int] = field(default_factory=Counter)
    listed: list[tuple[str, int, int]] = field(default_factory=list)  # (pattern, offset, bit)


def _expected(
    row: torch.Tensor, keys: torch.Tensor | None, rows: int, materialise: bool = False
) -> torch.Tensor:
    """A block of the pattern: a broadcast view to compare against (no memory), or
    materialised (a freshly written block)."""
    block = row.expand(rows, row.numel())
    if keys is not None:
        return block ^ keys
    return block.clone() if materialise else block


def _allocate(plan: MemoryPlan, backend: Backend) -> tuple[list[torch.Tensor], MemoryPlan]:
    """The blocks under test, allocated once; fewer if memory was taken since we looked."""
    rows, words = plan.rows_per_block, plan.block_bytes // WORD_BYTES // plan.rows_per_block
    blocks: list[torch.Tensor] = []
    for _ in range(plan.blocks):
        try:
            blocks.append(torch.empty(rows, words, dtype=torch.int32, device=backend.device))
        except torch.OutOfMemoryError:
            if not blocks:
                raise
            torch.cuda.empty_cache()
            break
    if len(blocks) < plan.blocks:
        plan = replace(plan, blocks=len(blocks), bytes=len(blocks) * plan.block_bytes)
    return blocks, plan


def _fill(block: torch.Tensor, row: torch.Tensor, keys: torch.Tensor | None) -> None:
    """Write one block of the pattern in place."""
    view = row.expand(block.shape[0], row.numel())
    if keys is None:
        block.copy_(view)
    else:
        torch.bitwise_xor(view, keys, out=block)


def _count_wrong(block: torch.Tensor, expected: torch.Tensor, backend: Backend) -> torch.Tensor:
    """Number of words that differ, as a device scalar (no host sync)."""
    if backend.name == "xla":
        # torch-xla's count_nonzero yields a tensor typed bool: sum instead.
        return (block != expected).sum()
    return torch.count_nonzero(block != expected)


def _describe(
    diff: torch.Tensor, base_offset: int, pattern: str, flips: _Flips
) -> tuple[int, int, list[tuple[int, int]]]:
    """Count and locate the flipped bits in one block's XOR difference.

    Returns (words, bits, examples) for this block; ``flips`` is updated.
    """
    flat = diff.reshape(-1)
    idx = flat.nonzero().reshape(-1).to("cpu")
    values = flat[idx.to(flat.device)].to("cpu").to(torch.int64) & 0xFFFFFFFF
    bits_here = 0
    examples: list[tuple[int, int]] = []
    for bit in range(32):
        set_bit = (values >> bit) & 1
        n = int(set_bit.sum())
        if n:
            flips.by_bit[bit] += n
            bits_here += n
    for word, value in zip(idx.tolist(), values.tolist(), strict=True):
        for bit in range(32):
            if value >> bit & 1:
                where = (base_offset + word * WORD_BYTES, bit)
                if len(examples) < _QUOTED:
                    examples.append(where)
                if len(flips.listed) < flips.limit:
                    flips.listed.append((pattern, *where))
        if len(examples) >= _QUOTED and len(flips.listed) >= flips.limit:
            break
    flips.words += int(idx.numel())
    flips.bits += bits_here
    return int(idx.numel()), bits_here, examples


def _pattern_digest(cfg: MemoryConfig, name: str, row: torch.Tensor) -> hashlib._Hash:
    h = hashlib.sha256(f"memory:{name}:{cfg.row_words}:{cfg.block_mib}:".encode())
    h.update(row.numpy().tobytes())
    return h


def measure_copy(cfg: MemoryConfig, backend: Backend) -> float:
    """Plain device-to-device copy bandwidth now (GB/s, bytes read plus written, as
    STREAM counts a copy) over one block of the check's size."""
    plan = plan_memory(cfg, backend)
    words = plan.block_bytes // WORD_BYTES
    src = torch.ones(words, dtype=torch.int32, device=backend.device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    backend.step_boundary()
    backend.sync()
    reps, t0 = 0, time.perf_counter()
    while reps < 3 or (time.perf_counter() - t0 < 0.02 and reps < 64):
        dst.copy_(src)
        backend.step_boundary()
        backend.sync()
        reps += 1
    elapsed = time.perf_counter() - t0
    return 2 * plan.block_bytes * reps / elapsed / 1e9


def run_memory(
    cfg: MemoryConfig,
    seed: int,
    ins: Instrumentation,
    copy_gbps: float | None = None,
    clock: RoundClock | None = None,
    data_seed: int | None = None,
    fresh_from: int = 0,
) -> CheckTrace:
    """Run the memory check on ``ins.backend``'s device: ``cfg.rounds`` rounds, round
    r writing pattern r mod len(patterns). ``copy_gbps`` (from :func:`measure_copy`
    in the same run) turns the write and read-back bandwidth into ratios.
    ``clock``: no round starts that would end past its deadline. Rounds from
    ``fresh_from`` on draw the random pattern from ``data_seed`` (the screening's own
    seed), the rounds before it from ``seed`` (what a baseline covers)."""
    backend = ins.backend
    start, cpu0 = time.perf_counter(), time.process_time()
    plan = plan_memory(cfg, backend)
    flips = _Flips(limit=cfg.listed_flips)
    steps: list[dict[str, str]] = []
    evidence: list[Evidence] = []
    write_s = read_s = 0.0
    rows = plan.rows_per_block
    round_times: list[float] = []
    reuse = backend.name != "xla"
    held: list[torch.Tensor] = []
    scratch: torch.Tensor | None = None
    cut = False
    for step in range(cfg.rounds):
        if clock is not None and not clock.allows(step, typical_round(round_times)):
            cut = True
            break
        r0 = time.perf_counter()
        name = cfg.patterns[step % len(cfg.patterns)]
        ins.set_step(step)
        data = round_seed(seed, data_seed, step, fresh_from)
        row_host = pattern_row(name, data, cfg.row_words, step // len(cfg.patterns))
        row = row_host.to(backend.device)
        keys = [row_keys(name, b * rows, rows) for b in range(plan.blocks)]
        keys_dev = [k.to(backend.device) if k is not None else None for k in keys]

        t0 = time.perf_counter()
        if reuse:
            if not held:  # allocated once, rewritten every round
                held, plan = _allocate(plan, backend)
            for b, block in enumerate(held):
                _fill(block, row, keys_dev[b])
            blocks = held
        else:  # XLA tensors are immutable: every pattern gets fresh buffers
            blocks = []
            for b in range(plan.blocks):
                blocks.append(_expected(row, keys_dev[b], rows, materialise=True))
                backend.step_boundary()  # XLA: materialise each block before the next
        backend.sync()
        write_s += time.perf_counter() - t0
        if cfg.dwell_s > 0:
            time.sleep(cfg.dwell_s)
        for block in blocks:  # the fault site: bits flip while the data sits in memory
            ins.corrupt_words(block)

        t0 = time.perf_counter()
        counts: list[torch.Tensor] = []
        for b, block in enumerate(blocks):
            expected = _expected(row, keys_dev[b], rows)
            if reuse:
                if scratch is None:
                    scratch = torch.empty_like(block)
                counts.append(torch.count_nonzero(torch.bitwise_xor(block, expected, out=scratch)))
            else:
                counts.append(_count_wrong(block, expected, backend))
                backend.step_boundary()
        wrong = backend.to_host(torch.stack(counts)).tolist()
        read_s += time.perf_counter() - t0

        digest = _pattern_digest(cfg, name, row_host)
        bad = [b for b, n in enumerate(wrong) if n]
        if bad:
            words = bits = 0
            examples: list[tuple[int, int]] = []
            for b in bad:
                diff = blocks[b] ^ _expected(row, keys_dev[b], rows)
                w, n, ex = _describe(diff, b * plan.block_bytes, name, flips)
                words, bits = words + w, bits + n
                examples.extend(ex[: _QUOTED - len(examples)])
            digest.update(f"|flips:{words}:{bits}:{examples}".encode())
            quoted = ", ".join(f"byte 0x{off:x} bit {bit}" for off, bit in examples)
            evidence.append(
                Evidence(
                    kind="memory",
                    step=step,
                    item=name,
                    detail=f"{bits} bit flip(s) in {words} word(s) read back ({quoted})",
                )
            )
        steps.append({name: digest.hexdigest()[:STEP_DIGEST_CHARS]})
        del blocks
        round_times.append(time.perf_counter() - r0)
    del held, scratch
    if backend.name == "cuda":
        torch.cuda.empty_cache()  # give the memory back to the checks that follow

    ran = len(steps)
    passes = ran * plan.bytes
    write_gbps = passes / write_s / 1e9 if write_s > 0 else None
    read_gbps = passes / read_s / 1e9 if read_s > 0 else None
    metrics: dict[str, int | float | str | None] = {
        "bytes_tested": plan.bytes,
        "free_bytes": plan.free_bytes,
        "rounds": ran,
        "patterns": len(cfg.patterns),
        "dwell_s": cfg.dwell_s,
        "write_gbps": round(write_gbps, 3) if write_gbps is not None else None,
        "read_gbps": round(read_gbps, 3) if read_gbps is not None else None,
        "flips": flips.bits,
        "flipped_words": flips.words,
    }
    if copy_gbps:
        # A write pass moves each byte once and a copy twice (read and write):
        # the ratios compare bytes per second of our passes with a copy's traffic.
        metrics["copy_gbps"] = round(copy_gbps, 3)
        if write_gbps is not None:
            metrics["write_vs_copy"] = round(write_gbps / copy_gbps, 3)
        if read_gbps is not None:
            metrics["read_vs_copy"] = round(read_gbps / copy_gbps, 3)
    if flips.bits:
        metrics["flip_bits"] = ",".join(f"{b}:{n}" for b, n in sorted(flips.by_bit.items()))
        metrics["flip_offsets"] = " ".join(
            f"{pattern}@0x{off:x}:{bit}" for pattern, off, bit in flips.listed
        )
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
