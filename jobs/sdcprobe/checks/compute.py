"""``compute``: seeded GEMMs per dtype, replayed bitwise and checksummed (ABFT), on the device.

Each round draws fresh operands *on the device* from (seed, round, dtype) with a
device generator (:mod:`sdcprobe.devicedata`), so every device of the node
multiplies the same matrices and nothing crosses from the host. Each GEMM runs
``repeats`` times back to back: the first output is the reference, every
replay is compared with it bit for bit on the device, the first output is
checked with row/column checksums against a reference computed on the device
(see :mod:`sdcprobe.abft`), and its exact integer digest is taken on the device.
What reaches the host per round is one small tensor: per dtype the digest, the
number of replayed elements that differ, and four ABFT numbers. The trace item
per (round, dtype) names that digest.

The GEMMs dominate the round by construction (``gemm_busy``): drawing operands,
digesting and checksumming are O(n^2) once per dtype per round; each replay
costs one O(n^3) GEMM and one O(n^2) comparison.
"""

from __future__ import annotations

import itertools
import struct
import time

import torch

from sdcprobe.abft import GemmResidual, abft_on_device, reference_dtype, residual_from
from sdcprobe.backends import Backend
from sdcprobe.config import ComputeConfig, round_seed
from sdcprobe.deadline import RoundClock, round_spread
from sdcprobe.devicedata import (
    device_generator,
    digest_hex,
    draw_normal,
    seed_of,
    tensor_kind,
    word_digest,
)
from sdcprobe.instrument import Instrumentation
from sdcprobe.telemetry import Telemetry, settled_after, summarise
from sdcprobe.trace import STEP_DIGEST_CHARS, CheckTrace, Evidence, trace_digest, typical_round

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as flat 32-bit words (16-bit types two to a word where they
    pair up): replays are compared word for word."""
    flat = tensor.reshape(-1)
    if (flat.numel() * flat.element_size()) % 4 == 0:
        return flat.view(torch.int32)
    return flat.view(torch.int16)


def gemm_inputs(
    seed: int,
    step: int,
    dtype_name: str,
    size: int,
    device: torch.device | str = "cpu",
    pool: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Operands of one GEMM of round ``step``, made on ``device``: identical on every
    device of one model and software stack, and in every run.

    A normal draw costs a generator pass per element, as much as several GEMMs of
    the check's sizes on a fast device, so it is not repeated every round: each seed
    draws once a pair of ``pool``-sided normal matrices (``pool`` defaults to
    ``size``), and round ``step`` XORs the sign and the 23 mantissa bits of every
    fp32 value with those of the pair rolled by a shift drawn from (seed, step).
    Every round so gets fresh signs and mantissas (what a data-dependent defect is
    triggered by; 16-bit types keep the upper mantissa bits, which change too) at
    the cost of three passes, while each value keeps its binade (the magnitudes of
    a normal draw). Dtypes share the round's pair: each rounds it to its own type,
    and a smaller size takes the pair's leading block."""
    device = torch.device(device)
    side = max(size, pool or size)
    key = (str(device), seed, step, side)
    drawn = _ROUND.get(key)
    if drawn is None:
        _ROUND.clear()
        drawn = _ROUND[key] = _perturbed(_pool(device, seed, side), seed_of(seed, step, side))
    a, b = drawn
    if size < side:
        a, b = a[:size, :size], b[:size, :size]
    dtype = _DTYPES[dtype_name]
    return a.to(dtype).contiguous(), b.to(dtype).contiguous()


#: Sign and mantissa of an fp32 value: what a round's words change (the exponent stays).
_FRESH_BITS = -0x7F800001  # 0x807FFFFF as int32


def _pool(device: torch.device, seed: int, side: int) -> torch.Tensor:
    """The seed's normal pair, both matrices in one fp32 tensor, drawn once on the device."""
    key = (str(device), seed, side)
    pool = _POOLS.get(key)
    if pool is None:
        if len(_POOLS) >= 4:
            _POOLS.clear()
        gen = device_generator(device, seed_of(seed, side, 17))
        pool = _POOLS[key] = draw_normal((2, side, side), gen, device, torch.float32)
    return pool


def _perturbed(pair: torch.Tensor, shift_seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The pair with every value's sign and mantissa XOR-ed by those of the value
    ``shift`` places before it (cyclically, over both matrices; never itself): the
    bits of a normal draw are the round's random words, so nothing more is drawn."""
    bits = pair.view(torch.int32).reshape(-1)
    shift = 1 + shift_seed % (bits.numel() - 1)
    fresh = torch.roll(bits, shift).bitwise_and_(_FRESH_BITS).bitwise_xor_(bits)
    out = fresh.view(torch.float32).reshape(pair.shape)
    return out[0], out[1]


#: Drawn pools per (device, seed, side), and the last round's operands, reused by the
#: dtypes of the same round.
_POOLS: dict[tuple[str, int, int], torch.Tensor] = {}
_ROUND: dict[tuple[str, int, int, int], tuple[torch.Tensor, torch.Tensor]] = {}


def release_operands() -> None:
    """Give the operands' device memory back to the checks that follow."""
    _POOLS.clear()
    _ROUND.clear()


#: GEMM sizes the peak microbenchmark tries, per backend (largest last).
PEAK_LADDER: dict[str, tuple[int, ...]] = {
    "cpu": (256, 512),
    "cuda": (2048, 4096, 8192),
    "xla": (512, 1024, 2048, 4096),
}
#: Stop growing a dtype's ladder before a size whose GEMM would take longer than this,
#: predicted from the size before (time grows with the cube of the side): CPU fp16,
#: with no fast kernel, would otherwise spend most of the start-up on one size.
_PEAK_GEMM_CAP_S = 0.05
#: How long each size of the ladder is timed (at least six calls): long enough that one
#: call lands in a quiet moment of a shared machine, short enough for the start-up.
_PEAK_WINDOW_S = 0.03


def compute_dtypes(cfg: ComputeConfig, backend: Backend) -> list[str]:
    """The dtypes of ``cfg`` this device runs, in order."""
    return [d for d in cfg.sizes if d in _DTYPES and backend.supports(_DTYPES[d])]


def measure_peak(cfg: ComputeConfig, backend: Backend) -> dict[str, float]:
    """This device's GEMM throughput per dtype in GFLOP/s, measured now: the best
    over square GEMMs of the ladder's sizes (and the check's own size), each timed
    after one untimed call. A dtype whose GEMMs get slow stops early (CPU fp16
    has no fast kernel and is fastest small), and so does one whose throughput fell
    at a size at least twice the check's own (past its peak: the larger sizes cost
    the most start-up time and only fall further). Timed with the same stopwatch as
    the check's GEMMs (device events on CUDA), one host sync per size."""
    ladder = PEAK_LADDER["xla" if backend.name == "xla" else backend.name]
    watch = backend.stopwatch()
    peaks: dict[str, float] = {}
    for name in compute_dtypes(cfg, backend):
        best = last = 0.0
        fastest, before = 0.0, 0
        for size in sorted({*ladder, cfg.sizes[name]}):
            if size > 2 * cfg.sizes[name] and best > last:
                break  # the size before fell below the best: past the peak
            if before and fastest * (size / before) ** 3 > _PEAK_GEMM_CAP_S:
                break  # this size's GEMMs would be slow: the smaller ones are its peak
            a, b = gemm_inputs(size, 0, name, size, backend.device)
            out = a @ b  # untimed: kernel selection, caches
            # The fastest of several calls (at least 5, up to _PEAK_WINDOW_S or 32): one
            # call can land in a slow moment of a shared machine, the peak cannot.
            marks = [watch.mark()]
            t0 = time.perf_counter()
            while len(marks) <= 5 or (
                time.perf_counter() - t0 < _PEAK_WINDOW_S and len(marks) <= 32
            ):
                # Into one buffer, as the check's GEMMs write theirs.
                out = a @ b if backend.name == "xla" else torch.matmul(a, b, out=out)
                backend.step_boundary()
                marks.append(watch.mark())
                if backend.name == "cuda" and len(marks) > 5:
                    break  # events: the wall clock does not see the GEMMs finish
            backend.sync()
            fastest = min(watch.seconds(s, e) for s, e in itertools.pairwise(marks))
            del out
            # The fastest call: a load spike on a shared machine is not the device's peak.
            last = 2 * size**3 / max(fastest, 1e-9) / 1e9
            best = max(best, last)
            before = size
        peaks[name] = best
    release_operands()
    return peaks


def stress_until_settled(
    cfg: ComputeConfig, backend: Backend, telemetry: Telemetry, cap_s: float
) -> dict[str, int | float | str | None]:
    """Hold the device busy with back-to-back GEMMs of its tensor-core dtype (bf16 where it
    runs; the check's first dtype elsewhere) until its power and temperature settle, or
    for ``cap_s`` seconds where the device does not report them, sampling the telemetry
    twice a second. Run before the peaks are measured, so the peaks and the check's
    ratios are those of a device at its steady clocks, as a fleet's stress test sees
    it (DCGM's targeted power holds a GPU near its power limit the same way)."""
    dtypes = compute_dtypes(cfg, backend)
    if cap_s <= 0 or not dtypes:
        return {}
    name = "bfloat16" if "bfloat16" in dtypes else dtypes[0]
    a, b = gemm_inputs(0, 0, name, cfg.sizes[name], backend.device)
    start = time.perf_counter()
    samples = [telemetry.read(0.0)]
    settled: float | None = None
    while True:
        for _ in range(4):
            out = a @ b
        backend.step_boundary()
        backend.sync()  # before any round: a sync here costs no round anything
        elapsed = time.perf_counter() - start
        if elapsed - samples[-1].at >= 0.5:
            samples.append(telemetry.read(elapsed))
            window = samples[-6:]
            if len(window) == 6 and settled_after(window) == 0.0:
                settled = elapsed
                break
        if elapsed >= cap_s:
            break
    del out
    release_operands()
    summary = {f"stress_{k}": v for k, v in summarise(samples).items()}
    summary["stress_s"] = round(time.perf_counter() - start, 3)
    summary["stress_settled_s"] = round(settled, 3) if settled is not None else None
    return summary


def run_compute(
    cfg: ComputeConfig,
    seed: int,
    ins: Instrumentation,
    peaks: dict[str, float] | None = None,
    clock: RoundClock | None = None,
    data_seed: int | None = None,
    fresh_from: int = 0,
    telemetry: Telemetry | None = None,
) -> CheckTrace:
    """Run the compute check on ``ins.backend``; residuals are left in ``ins.residuals``.

    Rounds from ``fresh_from`` on draw their inputs from ``data_seed`` (the
    screening's own seed), the rounds before it from ``seed`` (what a baseline covers).

    ``peaks`` (GFLOP/s per dtype, from :func:`measure_peak` in the same run) turn
    the checked GEMMs' measured throughput into a ratio to the device's peak.
    ``clock``: no round starts that would end past its deadline. ``telemetry`` is read
    at every round's end (power, temperature, clocks; absent figures stay null).
    """
    backend = ins.backend
    ins.abft_enabled = False  # the check takes its own residuals, on the device
    watch = backend.stopwatch()
    start, cpu0 = time.perf_counter(), time.process_time()
    bytes0, transfers0 = backend.traffic.snapshot()
    steps: list[dict[str, str]] = []
    evidence: list[Evidence] = []
    dtypes = compute_dtypes(cfg, backend)
    repeats = max(cfg.repeats, 2)
    gemm_s = dict.fromkeys(dtypes, 0.0)
    fastest = dict.fromkeys(dtypes, float("inf"))
    round_times: list[float] = []
    cut = False
    ref = reference_dtype(backend.device)
    samples = [telemetry.read(0.0)] if telemetry is not None else []
    unchecked = torch.full((4,), -1, dtype=torch.int64, device=backend.device)
    # Every dtype's operands come from one pool at the largest size (see gemm_inputs).
    pool = max((cfg.sizes[n] for n in dtypes), default=None)
    # Output buffers per dtype, reused every round (XLA tensors are immutable: none).
    reuse = backend.name != "xla"
    buffers: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
    for step in range(cfg.rounds):
        if clock is not None and not clock.allows(step, typical_round(round_times)):
            cut = True
            break
        r0 = time.perf_counter()
        ins.set_step(step)
        data = round_seed(seed, data_seed, step, fresh_from)
        marks: dict[str, list[object]] = {}
        summaries: list[torch.Tensor] = []
        kinds: list[str] = []
        for order, name in enumerate(dtypes):
            size = cfg.sizes[name]
            # ABFT checks one dtype per round, in turn: its O(n^2) fp64 passes cost about
            # one GEMM each, and what only ABFT sees (a fault that repeats identically on
            # every replay and every device) repeats in the rounds that check it too.
            checksum = (step + order) % len(dtypes) == 0
            a, b = gemm_inputs(data, step, name, size, backend.device, pool)
            first_out, acc_out, again_out = buffers.get(name, (None, None, None))
            watched = [watch.mark()]
            first = ins.matmul(a, b, "matmul", out=first_out)
            watched.append(watch.mark())
            first_bits = _bits(first)
            # The replays' bits XOR-ed into one accumulator: one pass per replay. With an
            # odd number of replays a healthy device leaves exactly the reference there;
            # any replay that differs leaves the bits it got wrong (two replays would have
            # to err identically, in the same words and bits, to cancel; a fault that
            # hits every replay alike is left standing by the odd count). The words that
            # differ from the reference are counted once per round. The first replay's
            # output is the accumulator (no zero fill); outputs go to buffers reused
            # round after round (no allocation, no page faults, between GEMMs).
            acc: torch.Tensor | None = None
            for _ in range(repeats - 1):
                watched.append(watch.mark())
                again = ins.matmul(a, b, "matmul", out=again_out if acc is not None else acc_out)
                watched.append(watch.mark())
                if acc is None:
                    acc = _bits(again)
                else:
                    acc.bitwise_xor_(_bits(again))
            assert acc is not None  # repeats >= 2
            if reuse and name not in buffers:
                buffers[name] = (first, torch.empty_like(first), torch.empty_like(first))
            # Odd replays: a healthy accumulator equals the reference (one fused pass).
            # Not count_nonzero: torch-xla types its result as bool.
            differ = (acc != (first_bits if (repeats - 1) % 2 else 0)).sum()
            backend.step_boundary()
            marks[name] = watched
            kinds.append(tensor_kind(first))
            summaries.append(
                torch.cat(
                    [
                        word_digest(first),
                        differ.reshape(1),
                        _as_int64(abft_on_device(a, b, first)) if checksum else unchecked,
                    ]
                )
            )
        # The round's only crossing: per dtype (digest, differing elements, the four ABFT
        # numbers' bits), as one small int64 table.
        table = backend.to_host(torch.stack(summaries), what=f"compute round {step} summary")
        rows = table.tolist()
        items: dict[str, str] = {}
        for name, kind, row in zip(dtypes, kinds, rows, strict=True):
            watched = marks[name]
            times = [watch.seconds(s, e) for s, e in zip(watched[0::2], watched[1::2], strict=True)]
            gemm_s[name] += sum(times)
            fastest[name] = min(fastest[name], min(times))
            digest = digest_hex(int(row[0]), kind)
            items[name] = digest[:STEP_DIGEST_CHARS]
            size = cfg.sizes[name]
            if row[2:6] != [-1, -1, -1, -1]:
                abft = _from_int64(row[2:6], ref)
                shape = (size, size, size)
                ins.residuals.append(residual_from(abft, _DTYPES[name], shape, "matmul", step))
            if row[1]:
                evidence.append(
                    Evidence(
                        kind="replay",
                        step=step,
                        item=name,
                        detail=f"replays differ in {int(row[1])} words",
                    )
                )
        steps.append(items)
        round_times.append(time.perf_counter() - r0)
        if telemetry is not None:
            samples.append(telemetry.read(time.perf_counter() - start))
    release_operands()  # operands are device memory: give it back to the checks that follow
    residuals = ins.residuals
    for r in residuals:
        if r.detected:
            evidence.append(
                Evidence(
                    kind="abft",
                    step=r.step,
                    item=r.dtype,
                    detail=f"ABFT residual {r.ratio:.3g}x tolerance ({r.m}x{r.k}x{r.n})",
                )
            )
    wall = time.perf_counter() - start
    ran = len(steps)
    host_bytes, host_transfers = (
        n - n0 for n, n0 in zip(backend.traffic.snapshot(), (bytes0, transfers0), strict=True)
    )
    gflops = {
        n: 2 * repeats * cfg.sizes[n] ** 3 * ran / s / 1e9 for n, s in gemm_s.items() if s > 0
    }
    metrics: dict[str, int | float | str | None] = {
        "rounds": ran,
        "gemms": repeats * ran * len(dtypes),
        "repeats": repeats,
        "dtypes": ",".join(dtypes),
        "sizes": ",".join(str(cfg.sizes[n]) for n in dtypes),
        "gflops": " ".join(f"{n}:{g:.4g}" for n, g in gflops.items()),
        # Share of the check's wall time the device spent inside the GEMMs (the rest:
        # drawing operands, comparing replays, checksums, digests, the host's share).
        "gemm_busy": round(sum(gemm_s.values()) / wall, 3) if wall > 0 else None,
        "host_bytes_per_round": round(host_bytes / ran) if ran else None,
        "host_syncs_per_round": round(host_transfers / ran, 2) if ran else None,
    }
    if peaks:
        # Fastest checked GEMM against the fastest microbenchmark GEMM: whether the
        # shapes reach the device's peak, independent of load spikes in between.
        ratios = {
            n: 2 * cfg.sizes[n] ** 3 / fastest[n] / 1e9 / peaks[n]
            for n in dtypes
            if peaks.get(n) and 0 < fastest[n] < float("inf")
        }
        metrics["peak_gflops"] = " ".join(f"{n}:{peaks[n]:.4g}" for n in dtypes if n in peaks)
        metrics["peak_ratio"] = " ".join(f"{n}:{r:.3f}" for n, r in ratios.items())
        metrics["peak_ratio_min"] = round(min(ratios.values()), 3) if ratios else None
    metrics.update(_abft_metrics(residuals))
    metrics.update(summarise(samples))
    return CheckTrace(
        digest=trace_digest(steps),
        steps=steps,
        evidence=evidence,
        metrics=metrics,
        wall_s=wall,
        cpu_s=time.process_time() - cpu0,
        round_s=typical_round(round_times),
        round_cv=round(round_spread(round_times), 4),
        cut_at_deadline=cut,
    )


def _as_int64(values: torch.Tensor) -> torch.Tensor:
    """Float values as int64 carrying their exact bits (one table, one transfer)."""
    if values.dtype == torch.float64:
        return values.view(torch.int64)
    return values.to(torch.float32).view(torch.int32).to(torch.int64)


def _from_int64(bits: list[int], ref: torch.dtype) -> list[float]:
    """The floats :func:`_as_int64` packed, back on the host (plain Python: the table
    is already here)."""
    if ref == torch.float64:
        return [struct.unpack("<d", struct.pack("<q", b))[0] for b in bits]
    return [struct.unpack("<f", struct.pack("<I", b & 0xFFFFFFFF))[0] for b in bits]


def _abft_metrics(residuals: list[GemmResidual]) -> dict[str, int | float | str | None]:
    """Worst ABFT residual per dtype, as tolerance ratio and in fp32/bf16 terms."""
    out: dict[str, int | float | str | None] = {}
    for dtype in sorted({r.dtype for r in residuals}):
        worst = max((r for r in residuals if r.dtype == dtype), key=lambda r: r.ratio)
        out[f"abft_ratio_{dtype}"] = _finite(worst.ratio)
        out[f"abft_fp32_units_{dtype}"] = _finite(worst.fp32_units)
        out[f"abft_bf16_units_{dtype}"] = _finite(worst.bf16_units)
    return out


def _finite(x: float) -> float | str:
    # JSON has no infinity; keep the metric readable instead of dropping it.
    return float(f"{x:.4g}") if x == x and abs(x) != float("inf") else str(x)
