"""``memory``: write known patterns into device memory, let them sit, read them back.

A share of the device's free memory (80% of free HBM by default on
accelerators, a fixed 64 MiB per CPU replica) is filled, block by block, with
each pattern in turn. A pattern gives every row of the buffer (``row_words``
32-bit words, 64 KiB by default) one word, repeated along the row:

* ``walking-ones``: row *r* holds ``1 << ((r + cycle) mod 32)``, so over a plan
  every bit position of every word holds the lone one among zeros;
* ``walking-zeros``: its complement;
* ``checkerboard`` / ``checkerboard-inverse``: ``0x55555555`` and ``0xAAAAAAAA``
  alternating from row to row, then swapped, so every bit holds both values;
* ``random``: a seeded random word per row, drawn anew every cycle, so rows hold
  different data and an address that aliases another row shows up.

After a dwell (``dwell_s``, the time the data sits unread: what retention faults
need) every row is read back with one minimum and one maximum along the row, on
the device: a row is intact exactly when both equal the row's word, so the
read-back is a single streaming pass with no tolerance and no cancellation
(a word-sum could let two opposite flips cancel). Only the count of bad rows
crosses to the host per round; where there are any, the bad blocks are then
compared word for word and flips are reported with their byte offset in the
tested buffer and bit position in the 32-bit word.

The digest covers the patterns, their device-drawn row words and the configured
sizes (and, if there were any, the flips), not the number of bytes tested: that
depends on how much memory was free, which may differ between devices and runs
that are healthy.
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
from sdcprobe.devicedata import device_generator, draw_integers, seed_of, word_digest
from sdcprobe.instrument import Instrumentation
from sdcprobe.trace import STEP_DIGEST_CHARS, CheckTrace, Evidence, trace_digest, typical_round

WORD_BYTES = 4
_MIB = 1 << 20
#: How many examples of flips one evidence line quotes.
_QUOTED = 3


def _int32(values: torch.Tensor) -> torch.Tensor:
    """Unsigned 32-bit values held in int64 -> the same bits as int32."""
    return torch.where(values >= 1 << 31, values - (1 << 32), values).to(torch.int32)


def pattern_values(
    name: str, seed: int, rows: int, cycle: int = 0, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """The word each of ``rows`` rows holds under pattern ``name``, as int32 on ``device``.

    ``cycle`` counts how often the pattern list came round before: walking patterns
    move on by one bit, and the random words are drawn anew."""
    device = torch.device(device)
    r = torch.arange(rows, dtype=torch.int64, device=device)
    if name in ("walking-ones", "walking-zeros"):
        ones = torch.bitwise_left_shift(torch.ones_like(r), (r + cycle) % 32)
        values = ones if name == "walking-ones" else 0xFFFFFFFF ^ ones
    elif name in ("checkerboard", "checkerboard-inverse"):
        even, odd = (0x55555555, 0xAAAAAAAA)[:: 1 if name == "checkerboard" else -1]
        values = torch.where(r % 2 == 0, even, odd)
    elif name == "random":
        gen = device_generator(device, seed_of(seed, cycle, 11))
        values = draw_integers((rows,), 0, 1 << 32, gen, device)
    else:
        raise ValueError(f"unknown memory pattern {name!r}")
    return _int32(values)


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


def along_row(
    name: str, seed: int, words: int, cycle: int, device: torch.device
) -> torch.Tensor | None:
    """The random pattern's words along a row (drawn on the device anew every cycle),
    which every row XORs with its own word; None for the fixed patterns, constant
    along a row. Random data in every word is what a data-dependent defect needs
    to be triggered by."""
    if name != "random":
        return None
    gen = device_generator(device, seed_of(seed, cycle, 13))
    return _int32(draw_integers((words,), 0, 1 << 32, gen, device))


def _expected(
    shape: tuple[int, int], words: torch.Tensor, along: torch.Tensor | None
) -> torch.Tensor:
    """What a block should hold, as a broadcast view (fixed patterns) or materialised."""
    rows = words.unsqueeze(1).expand(shape)
    return rows if along is None else torch.bitwise_xor(rows, along.unsqueeze(0))


def _fill(block: torch.Tensor, words: torch.Tensor, along: torch.Tensor | None) -> None:
    """Write one block: row i holds ``words[i]`` (XOR-ed with ``along`` word by word)."""
    rows = words.unsqueeze(1).expand_as(block)
    if along is None:
        block.copy_(rows)
    else:
        torch.bitwise_xor(rows, along.unsqueeze(0).expand_as(block), out=block)


#: Bytes of rows read back per step: small enough on the CPU that a step's rows stay in
#: the core's L2 between the step's reductions (the read-back then streams the buffer
#: from memory once; half an L2 of 1.25 MiB read back faster than a whole one), a
#: share of a GPU's L2 elsewhere.
_CHUNK_BYTES = {"cpu": 1 << 19}
_DEVICE_CHUNK_BYTES = 16 << 20


def _chunk_rows(block: torch.Tensor) -> int:
    chunk_bytes = _CHUNK_BYTES.get(block.device.type, _DEVICE_CHUNK_BYTES)
    return max(1, min(block.shape[0], chunk_bytes // (block.shape[1] * WORD_BYTES)))


def _bad_rows(block: torch.Tensor, words: torch.Tensor, along: torch.Tensor | None) -> torch.Tensor:
    """Rows of one XLA block that do not hold their pattern, as a device count: a row
    is intact exactly when its minimum and its maximum both equal its word. XLA has
    no ``out=`` reductions into views, so these are whole-block passes (every other
    backend reads back through :class:`_RowReader`)."""
    if along is not None:
        block = torch.bitwise_xor(block, along.unsqueeze(0).expand_as(block))
    wrong = (block.amax(dim=1) != words) | (block.amin(dim=1) != words)
    return wrong.sum()  # not count_nonzero: torch-xla types its result as bool


class _RowReader:
    """The read-back of blocks allocated once (every backend but XLA): which rows do
    not hold their pattern. A row is intact exactly when its minimum and its maximum
    both equal its word.

    One streaming pass over memory: the rows are taken a cache-sized chunk at a
    time, and the chunk's maximum and minimum (and, for the random pattern, the XOR
    that takes its words along the row off first, into a scratch chunk) all read it
    while it is still in the cache. Every round reduces the same chunks into the
    same places, so the views of the blocks, of the per-row minimum and maximum and
    of the scratch chunk are made once, and one comparison covers every block: on a
    CPU a round's read-back takes milliseconds, and making its views anew took about
    a tenth of that."""

    def __init__(self, blocks: list[torch.Tensor], whole: bool | None = None) -> None:
        rows, words = blocks[0].shape
        step = _chunk_rows(blocks[0])
        self.blocks = len(blocks)
        self.low = blocks[0].new_empty(self.blocks * rows)
        self.high = torch.empty_like(self.low)
        # An accelerator reduces a fixed pattern's block in one pass that yields both
        # the minimum and the maximum (``aminmax``): one kernel per block where the
        # chunks took two per chunk, thousands per round over a GPU's memory, each
        # costing more to launch than its chunk takes to read. A CPU core reduces
        # faster through the cache-sized chunks. The random pattern's XOR stays
        # chunked everywhere: its scratch is one chunk, not one block.
        self.whole = blocks[0].device.type != "cpu" if whole is None else whole
        self.rows = [
            (block, self.high[b * rows : (b + 1) * rows], self.low[b * rows : (b + 1) * rows])
            for b, block in enumerate(blocks)
        ]
        scratch = blocks[0].new_empty((step, words))
        self.chunks = [
            (
                block[r0 : r0 + step],
                self.high[b * rows + r0 : b * rows + r0 + step],
                self.low[b * rows + r0 : b * rows + r0 + step],
                scratch[: min(step, rows - r0)],
            )
            for b, block in enumerate(blocks)
            for r0 in range(0, rows, step)
        ]

    def bad_rows(self, words: torch.Tensor, along: torch.Tensor | None) -> torch.Tensor:
        """Rows that do not hold their pattern, counted per block on the device
        (``words``: every block's row words, block after block)."""
        row = along.unsqueeze(0) if along is not None else None
        if row is None and self.whole:
            for block, high, low in self.rows:
                torch.aminmax(block, dim=1, out=(low, high))
        else:
            for part, high, low, scratch in self.chunks:
                if row is not None:
                    part = torch.bitwise_xor(part, row, out=scratch)
                torch.amax(part, 1, out=high)
                torch.amin(part, 1, out=low)
        wrong: torch.Tensor = (self.low != words) | (self.high != words)
        return wrong.view(self.blocks, -1).sum(1)


def _describe(
    diff: torch.Tensor, base_offset: int, pattern: str, flips: _Flips, backend: Backend
) -> tuple[int, int, list[tuple[int, int]]]:
    """Count and locate the flipped bits in one block's XOR difference.

    Returns (words, bits, examples) for this block; ``flips`` is updated.
    """
    flat = diff.reshape(-1)
    flipped = flat.nonzero().reshape(-1)
    idx = backend.to_host(flipped, what="memory flipped words")
    values = backend.to_host(flat[flipped], what="memory flipped bits").to(torch.int64) & 0xFFFFFFFF
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


def measure_copy(cfg: MemoryConfig, backend: Backend) -> float:
    """Plain device-to-device copy bandwidth now (GB/s, bytes read plus written, as
    STREAM counts a copy) over up to four blocks of the check's size (as the check
    streams through its blocks, not one block that may stay in a cache), timed with
    the same stopwatch as the check's passes."""
    plan = plan_memory(cfg, backend)
    words = min(plan.blocks, 4) * plan.block_bytes // WORD_BYTES
    src = torch.ones(words, dtype=torch.int32, device=backend.device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    backend.step_boundary()
    backend.sync()
    watch = backend.stopwatch()
    reps, t0, w0 = 0, time.perf_counter(), watch.mark()
    while reps < 4 or (time.perf_counter() - t0 < 0.02 and reps < 64):
        dst.copy_(src)
        backend.step_boundary()
        reps += 1
    w1 = watch.mark()
    backend.sync()
    return 2 * words * WORD_BYTES * reps / max(watch.seconds(w0, w1), 1e-9) / 1e9


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
    watch = backend.stopwatch()
    start, cpu0 = time.perf_counter(), time.process_time()
    bytes0, transfers0 = backend.traffic.snapshot()
    plan = plan_memory(cfg, backend)
    flips = _Flips(limit=cfg.listed_flips)
    steps: list[dict[str, str]] = []
    evidence: list[Evidence] = []
    write_s = read_s = 0.0
    rows = plan.rows_per_block
    round_times: list[float] = []
    reuse = backend.name != "xla"
    held: list[torch.Tensor] = []
    reader: _RowReader | None = None
    cut = False
    for step in range(cfg.rounds):
        if clock is not None and not clock.allows(step, typical_round(round_times)):
            cut = True
            break
        r0 = time.perf_counter()
        name = cfg.patterns[step % len(cfg.patterns)]
        cycle = step // len(cfg.patterns)
        ins.set_step(step)
        data = round_seed(seed, data_seed, step, fresh_from)
        if reuse and not held:  # allocated once, rewritten every round
            held, plan = _allocate(plan, backend)
            reader = _RowReader(held)
        words = pattern_values(name, data, plan.blocks * rows, cycle, backend.device)
        per_block = [words[b * rows : (b + 1) * rows] for b in range(plan.blocks)]
        along = along_row(name, data, plan.block_bytes // WORD_BYTES // rows, cycle, backend.device)

        w0 = watch.mark()
        if reuse:
            for b, block in enumerate(held):
                _fill(block, per_block[b], along)
            blocks = held
        else:  # XLA tensors are immutable: every pattern gets fresh buffers
            blocks = []
            for b in range(plan.blocks):
                shape = (rows, plan.block_bytes // WORD_BYTES // rows)
                blocks.append(_expected(shape, per_block[b], along).clone())
                backend.step_boundary()  # XLA: materialise each block before the next
        w1 = watch.mark()
        if cfg.dwell_s > 0:
            backend.sync()  # the dwell starts once the pattern is written
            time.sleep(cfg.dwell_s)
        for block in blocks:  # the fault site: bits flip while the data sits in memory
            ins.corrupt_words(block)

        t0 = watch.mark()
        if reader is not None:
            counts = reader.bad_rows(words, along)
        else:
            counts = torch.stack(
                [_bad_rows(block, per_block[b], along) for b, block in enumerate(blocks)]
            )
        backend.step_boundary()
        t1 = watch.mark()
        summary = torch.cat(
            [
                counts.sum().reshape(1),
                word_digest(per_block[0] if along is None else torch.cat([per_block[0], along])),
                (counts > 0).sum().reshape(1),
            ]
        )
        bad_rows, row_digest, _ = backend.to_host(
            summary, what=f"memory round {step} summary"
        ).tolist()
        write_s += watch.seconds(w0, w1)
        read_s += watch.seconds(t0, t1)

        digest = hashlib.sha256(
            f"memory:{name}:{cfg.row_words}:{cfg.block_mib}:{row_digest}".encode()
        )
        if bad_rows:
            # Rare (a failing device): find the blocks, then every flipped word in them.
            wrong = backend.to_host(counts, what=f"memory round {step} bad blocks").tolist()
            nwords, nbits = 0, 0
            examples: list[tuple[int, int]] = []
            for b, n in enumerate(wrong):
                if not n:
                    continue
                shape = (blocks[b].shape[0], blocks[b].shape[1])
                expected = _expected(shape, per_block[b], along)
                w, n_bits, ex = _describe(
                    blocks[b] ^ expected, b * plan.block_bytes, name, flips, backend
                )
                nwords, nbits = nwords + w, nbits + n_bits
                examples.extend(ex[: _QUOTED - len(examples)])
            digest.update(f"|flips:{nwords}:{nbits}:{examples}".encode())
            quoted = ", ".join(f"byte 0x{off:x} bit {bit}" for off, bit in examples)
            evidence.append(
                Evidence(
                    kind="memory",
                    step=step,
                    item=name,
                    detail=f"{nbits} bit flip(s) in {nwords} word(s) read back ({quoted})",
                )
            )
        steps.append({name: digest.hexdigest()[:STEP_DIGEST_CHARS]})
        del blocks
        round_times.append(time.perf_counter() - r0)
    del held, reader
    if backend.name == "cuda":
        torch.cuda.empty_cache()  # give the memory back to the checks that follow

    ran = len(steps)
    passes = ran * plan.bytes
    write_gbps = passes / write_s / 1e9 if write_s > 0 else None
    read_gbps = passes / read_s / 1e9 if read_s > 0 else None
    host_bytes, host_transfers = (
        x - x0 for x, x0 in zip(backend.traffic.snapshot(), (bytes0, transfers0), strict=True)
    )
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
        "host_bytes_per_round": round(host_bytes / ran) if ran else None,
        "host_syncs_per_round": round(host_transfers / ran, 2) if ran else None,
    }
    if copy_gbps:
        # A write or read pass moves each byte once and a copy twice (read and write):
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
