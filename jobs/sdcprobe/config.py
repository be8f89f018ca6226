"""Check parameters, and the plan of rounds that fills the time budget.

What a round computes (shapes, dtypes, patterns, the model) comes from a fixed
formula of (budget, backend, flags), never from timing the machine: two runs
with the same flags compute the same thing in every round, so their digests
can be compared, and those parameters' hash is part of the fingerprint. How
*many* rounds each check runs is measured: the runner times a warm-up round
of every check on every device and plans rounds to fill the budget
(:func:`plan_rounds`). Round counts are not in the hash; a baseline digest
covers the first ``baseline_rounds`` rounds of each check, which every plan
runs. Torch-free.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sdcprobe.devices import BackendName, xla_on_host

#: Bump when the way digests are computed changes: old baselines stop matching.
#: 3: operands drawn and outputs digested on the device; 4: compute operands drawn once
#: per seed and varied per round (sign and mantissa), float16 and float64 sizes on the CPU.
DIGEST_VERSION = 4

#: Every check, in the order a run performs them.
CHECK_NAMES: tuple[str, ...] = ("compute", "collective", "memory", "golden")

#: Rounds every plan runs, and that a baseline digest covers, per check.
BASELINE_ROUNDS: dict[str, int] = {"compute": 2, "collective": 2, "memory": 5, "golden": 16}

#: Host syncs (device-to-host transfers and scalar reads) one round of each check may
#: make: compute, collective and memory send one small summary per round (collective
#: one more for the ranks' agreement on the deadline); a golden round trains a step of
#: the run and of its replay, each sending its digests and its loss. The structural
#: test in tests/probe holds the checks to these, and results report what they made.
HOST_SYNCS_PER_ROUND: dict[str, int] = {"compute": 1, "collective": 2, "memory": 1, "golden": 4}
#: The most bytes one crossing may carry in a healthy round: summaries, not tensors.
HOST_BYTES_PER_CROSSING = 4096

#: Seconds a memory pattern sits unread before read-back, by default. DRAM and HBM
#: refresh every cell once per refresh window (64 ms, 32 ms when hot); a cell whose
#: charge leaks faster than that (a retention fault) loses its bit between refreshes.
#: A dwell of several windows makes every tested cell hold its pattern through several
#: refreshes in every round, at a cost the plan can afford 90 times. Cells with variable
#: retention (flipping over seconds to minutes) need the long dwells a policy can set
#: (``--memory-dwell``, e.g. for repair verification). CPU replicas stand in for devices
#: (tests, the fleet simulator) and host RAM is not what is screened: a short dwell.
DEVICE_DWELL_S = 0.25
HOST_DWELL_S = 0.05
#: The longest dwell accepted: one round must stay short against the budget.
MAX_DWELL_S = 600.0

#: The memory check's patterns, in the order they are written.
MEMORY_PATTERNS: tuple[str, ...] = (
    "walking-ones",
    "walking-zeros",
    "checkerboard",
    "checkerboard-inverse",
    "random",
)


class ComputeConfig(BaseModel):
    """Seeded GEMMs: ``rounds`` rounds of one square GEMM per dtype, each run
    ``repeats`` times (the first is the reference, the others replays of it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    sizes: dict[str, int] = Field(
        description="Matrix size per dtype name (float32, bfloat16, ...)."
    )
    rounds: int = Field(ge=1)
    repeats: int = Field(
        default=2,
        ge=2,
        description="GEMMs per dtype per round: one reference and repeats-1 bitwise replays "
        "(an odd number of them, so that replays XOR-ed together equal the reference). "
        "Not in the config hash: the digest covers the reference output.",
    )

    @model_validator(mode="after")
    def _odd_replays(self) -> ComputeConfig:
        if (self.repeats - 1) % 2 == 0:
            raise ValueError(f"repeats {self.repeats}: the replays (repeats - 1) must be odd")
        return self


class CollectiveConfig(BaseModel):
    """All-reduce / all-gather / broadcast of ``elements`` integer-valued fp32 values."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    elements: int = Field(ge=1)
    rounds: int = Field(ge=1)


class MemoryConfig(BaseModel):
    """Fill device memory with known patterns, let them sit, read them back.

    The share of memory tested is ``fraction`` of the free device memory,
    capped at ``max_mib``, unless ``mib`` fixes it. The bytes actually tested
    depend on what is free when the check starts, so they are reported but are
    not part of the digest (two devices with different free memory must agree).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    mib: int | None = Field(
        default=None, ge=1, description="Fixed MiB per device; none = a share of free memory."
    )
    fraction: float = Field(
        default=0.8, gt=0.0, le=0.95, description="Share of free device memory to fill."
    )
    max_mib: int = Field(ge=1, description="Upper bound from the budget, in MiB per device.")
    fallback_mib: int = Field(
        default=1024, ge=1, description="MiB per device where free memory cannot be read."
    )
    block_mib: int = Field(ge=1, description="Allocation and comparison unit, in MiB.")
    row_words: int = Field(
        default=1 << 14, ge=64, description="32-bit words per pattern row (the tile)."
    )
    patterns: tuple[str, ...] = MEMORY_PATTERNS
    dwell_s: float = Field(ge=0.0, description="Seconds each pattern sits before read-back.")
    rounds: int = Field(
        default=5, ge=1, description="Rounds; round r writes pattern r mod len(patterns)."
    )
    listed_flips: int = Field(
        default=16, ge=0, description="How many flips are listed with offset and bit."
    )

    @model_validator(mode="after")
    def _known_patterns(self) -> MemoryConfig:
        unknown = [p for p in self.patterns if p not in MEMORY_PATTERNS]
        if unknown or not self.patterns:
            raise ValueError(
                f"unknown memory pattern(s) {unknown}; choose from {', '.join(MEMORY_PATTERNS)}"
            )
        if (self.block_mib << 18) % self.row_words:
            raise ValueError(f"block_mib {self.block_mib} is not a whole number of rows")
        return self


class GoldenConfig(BaseModel):
    """The tiny decoder-only transformer and its deterministic training run."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    vocab: int = 64
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 128
    seq_len: int = 32
    batch: int = 8
    steps: int = Field(default=20, ge=1)
    lr: float = 3e-3
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.01
    clip: float = 1.0
    seed: int = 0
    #: Steps from ``data_from`` on draw their tokens from this seed (None: ``seed``).
    #: Not part of the config hash: a baseline covers only the steps before it.
    data_seed: int | None = None
    data_from: int = Field(default=16, ge=0)

    def step_seed(self, step: int) -> int:
        """The seed of step ``step``'s tokens (see :func:`round_seed`)."""
        return round_seed(self.seed, self.data_seed, step, self.data_from)


class ProbeConfig(BaseModel):
    """Everything that decides what the checks compute."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    digest_version: int = DIGEST_VERSION
    seed: int = 0
    #: The screening's own seed for the rounds after the ones a baseline covers (None:
    #: ``seed``). Not part of the config hash: those rounds are judged without a
    #: baseline (replay, cross-device agreement, checksums, exact values).
    data_seed: int | None = None
    #: The probe image reference the probe runs from (``SDCPROBE_IMAGE``, set by the
    #: operator; a digest when the reference pins one). Part of the config hash, so of
    #: the fingerprint: another image's code may compute other bits. "": not known.
    image: str = Field(default="", max_length=512)
    baseline_rounds: dict[str, int] = Field(default_factory=lambda: dict(BASELINE_ROUNDS))
    golden_steps_fixed: bool = False
    compute: ComputeConfig
    collective: CollectiveConfig
    memory: MemoryConfig
    golden: GoldenConfig

    def config_hash(self) -> str:
        """Short stable hash of the parameters (goes into the fingerprint).

        Round counts are left out: they are planned from measured costs, and a
        round's bits do not depend on how many rounds follow it. So is the memory
        check's size cap: it follows the budget on accelerators, and the digest does
        not cover how many bytes were tested (a baseline holds at every budget), nor is
        the memory dwell: how long a pattern sits changes what can flip, not the bits a
        healthy device reads back. The image is in when known (a run outside the
        operator, with no image named, hashes as it always did)."""
        left_out: dict[str, Any] = {} if self.image else {"image": True}
        doc = self.model_dump(
            mode="json",
            exclude={
                **left_out,
                "data_seed": True,
                "compute": {"rounds", "repeats"},
                "collective": {"rounds"},
                "memory": {"rounds", "max_mib", "dwell_s"},
                "golden": {"steps", "data_seed", "data_from"},
                "golden_steps_fixed": True,
            },
        )
        canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def plan_config(
    budget: float,
    backend: BackendName,
    steps: int | None = None,
    seed: int = 0,
    memory_fraction: float | None = None,
    memory_mib: int | None = None,
    data_seed: int | None = None,
    memory_dwell: float | None = None,
    image: str = "",
) -> ProbeConfig:
    """What every round of every check computes on ``backend``, for a ``budget`` in seconds.

    Shapes are a fixed function of the backend, chosen so that each check's work
    runs near the device's peak (the compute GEMMs at sizes whose measured
    throughput is close to a large GEMM's, collective messages of a size that
    reaches the link's best bus bandwidth); the result depends only on the
    arguments, so equal flags compute equal bits and digests stay comparable.
    How many rounds each check runs is not decided here: the runner measures a
    round of every check and plans the rounds to fill the budget
    (:func:`plan_rounds`). The rounds start at the minimum every plan runs
    (``baseline_rounds``: the rounds a baseline digest covers).

    The memory check fills ``memory_fraction`` (default 0.8) of free device
    memory on accelerators, capped by the budget, and a fixed ``memory_mib``
    (default 64) per CPU replica, where filling a share of host RAM would
    endanger the node; an explicit ``memory_mib`` wins everywhere.
    """
    budget = max(float(budget), 1.0)
    # Seconds left for work after starting workers and importing torch.
    work = max(budget - (3.0 if backend == "cpu" else 20.0), 2.0)
    if backend == "cpu":
        # On one core per worker, fp32 and bf16 GEMMs of 512 run at their large-GEMM
        # throughput and fill most of a round (gemm_busy, peak ratio:
        # bench/results/probe.md). fp64 stays off 512: a 4 KiB row stride makes the
        # blocked kernel's loads alias in the cache (a fraction of its 384's
        # throughput). fp16 at 256: where the CPU has fp16 units that is near its best,
        # and where it has none the GEMM stays affordable.
        sizes = {"float32": 512, "bfloat16": 512, "float16": 256, "float64": 384}
        # Each replay costs one comparison pass over its output besides its GEMM, and
        # every dtype's round a fixed share (operands, digest, ABFT in turn): 15
        # replays keep that share small without making a round much dearer than the
        # other checks' (the plan gives every check the same number of rounds).
        repeats = 16
        elements = 1 << 20  # 4 MiB messages: gloo on loopback is near its best from here
    elif backend == "cuda":
        # Tensor-core dtypes reach their peak only from 8192, fp32 and fp64 already at
        # 4096 (bench/results/cuda.md).
        sizes = {"float32": 4096, "bfloat16": 8192, "float16": 8192, "float64": 4096}
        repeats = 8
        elements = 1 << 26  # 256 MiB messages: NVLink / ICI bus bandwidth saturates
    else:
        sizes = {"float32": 2048, "bfloat16": 2048, "float16": 2048, "float64": 1024}
        repeats = 4  # three replays: an odd number (see ComputeConfig)
        elements = 1 << 26
    if backend == "xla":
        if xla_on_host():  # PJRT CPU: tests and CI
            sizes = {"float32": 128, "bfloat16": 128, "float16": 64, "float64": 128}
            elements = 1 << 16
        else:  # TPU and Neuron cores have no fp64 units
            sizes.pop("float64")
    golden_min = min(steps, BASELINE_ROUNDS["golden"]) if steps is not None else None
    base = dict(BASELINE_ROUNDS)
    if golden_min is not None:
        base["golden"] = golden_min
    golden = GoldenConfig(
        steps=steps if steps is not None else base["golden"],
        seed=seed,
        data_seed=data_seed,
        data_from=base["golden"],
    )
    return ProbeConfig(
        seed=seed,
        data_seed=data_seed,
        image=image,
        baseline_rounds=base,
        golden_steps_fixed=steps is not None,
        compute=ComputeConfig(sizes=sizes, rounds=base["compute"], repeats=repeats),
        collective=CollectiveConfig(elements=elements, rounds=base["collective"]),
        memory=_plan_memory(
            budget, work, backend, memory_fraction, memory_mib, base["memory"], memory_dwell
        ),
        golden=golden,
    )


def round_seed(seed: int, data_seed: int | None, step: int, baseline_rounds: int) -> int:
    """The seed of round ``step``'s data: ``seed`` for the rounds a baseline covers (the
    first ``baseline_rounds``), the screening's ``data_seed`` for every later round.

    A baseline (by consensus of several nodes) needs those nodes to see the same data,
    so the rounds it covers use the shared ``seed``; every later round is judged by
    checks whose right answer the probe knows without a baseline (bitwise replay,
    agreement between the node's devices, ABFT checksums against an fp64 reference,
    exact collective sums, regenerated memory patterns), so it can draw fresh data
    every screening."""
    if data_seed is None or step < baseline_rounds:
        return seed
    return data_seed


def rounds_of(config: ProbeConfig) -> dict[str, int]:
    """Rounds per check in ``config`` (golden: training steps)."""
    return {
        "compute": config.compute.rounds,
        "collective": config.collective.rounds,
        "memory": config.memory.rounds,
        "golden": config.golden.steps,
    }


def with_rounds(config: ProbeConfig, rounds: dict[str, int]) -> ProbeConfig:
    """``config`` with the planned rounds per check (the config hash does not change)."""
    current = rounds_of(config)
    current.update(rounds)
    return config.model_copy(
        update={
            "compute": config.compute.model_copy(update={"rounds": current["compute"]}),
            "collective": config.collective.model_copy(update={"rounds": current["collective"]}),
            "memory": config.memory.model_copy(update={"rounds": current["memory"]}),
            "golden": config.golden.model_copy(update={"steps": current["golden"]}),
        }
    )


#: Intermittent-fault activation probabilities per round the plan reports.
CATCH_PROBABILITIES: tuple[float, ...] = (0.01, 0.05, 0.1)


def catch_probability(p: float, rounds: int) -> float:
    """Chance that a fault active in a fraction ``p`` of rounds is active in at least one
    of ``rounds`` independent rounds: ``1 - (1 - p) ** rounds``."""
    return 1.0 - (1.0 - p) ** max(rounds, 0)


#: The catch chance a screening aims for, for a fault active in this share of rounds
#: (the policy can set both): 0.99 at 5% needs 90 independent rounds per check.
DEFAULT_CATCH_TARGET = 0.99
DEFAULT_CATCH_FRACTION = 0.05


def rounds_for_target(target: float, fraction: float) -> int:
    """The fewest independent rounds with ``1 - (1 - fraction) ** rounds >= target``."""
    if not (0.0 < target < 1.0 and 0.0 < fraction < 1.0):
        raise ValueError(f"catch target {target} and fraction {fraction} must be in (0, 1)")
    rounds = math.ceil(math.log1p(-target) / math.log1p(-fraction) - 1e-9)
    while catch_probability(fraction, rounds) < target:  # rounding of the logarithms
        rounds += 1
    return max(rounds, 1)


class PlanError(ValueError):
    """The budget cannot hold the smallest complete plan."""


def plan_rounds(
    round_s: dict[str, float],
    available_s: float,
    minimum: dict[str, int],
    fixed: dict[str, int] | None = None,
) -> dict[str, int]:
    """Rounds per check that fit in ``available_s`` seconds and maximise the smallest
    per-check catch probability ``1 - (1 - p) ** rounds``.

    ``round_s`` is the measured cost of one round of each check (the slowest
    device's); ``minimum`` the rounds every plan runs (a baseline covers them);
    ``fixed`` pins a check's rounds (``--steps``). The catch probability grows
    with the rounds for every p, so the smallest one is largest when the
    smallest round count is: every free check gets the same count ``r``, the
    largest that fits (checks whose minimum is above ``r`` keep their minimum),
    and time left over goes, one round at a time, to the cheapest checks, which
    never lowers the smallest. Raises :class:`PlanError` when even the minimum
    plan does not fit.
    """
    fixed = fixed or {}
    names = list(round_s)
    floor = {n: fixed.get(n, minimum.get(n, 1)) for n in names}
    need = sum(round_s[n] * floor[n] for n in names)
    if need > available_s:
        raise PlanError(
            f"the smallest complete plan ({', '.join(f'{floor[n]} {n}' for n in names)} "
            f"rounds) needs {need:.2f}s of work, but only {max(available_s, 0.0):.2f}s "
            "of the budget is left for it"
        )
    free = [n for n in names if n not in fixed]

    def cost(r: int) -> float:
        return sum(round_s[n] * (max(r, floor[n]) if n in free else floor[n]) for n in names)

    lo, hi = 1, 1
    while cost(hi * 2) <= available_s and hi < 1 << 24:
        hi *= 2
    hi *= 2
    while hi - lo > 1:  # the largest common round count that fits
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if cost(mid) <= available_s else (lo, mid)
    rounds = {n: (max(lo, floor[n]) if n in free else floor[n]) for n in names}
    left = available_s - sum(round_s[n] * rounds[n] for n in names)
    # Time left over: one more round at a time to the check with the fewest rounds
    # among those that still fit, which never lowers the smallest count.
    while True:
        fits = [n for n in free if 0 < round_s[n] <= left]
        if not fits:
            break
        n = min(fits, key=lambda n: (rounds[n], round_s[n]))
        rounds[n] += 1
        left -= round_s[n]
    return rounds


def _plan_memory(
    budget: float,
    work: float,
    backend: BackendName,
    fraction: float | None,
    mib: int | None,
    rounds: int,
    dwell: float | None = None,
) -> MemoryConfig:
    on_host = backend == "cpu" or (backend == "xla" and xla_on_host())
    if on_host:
        # Host RAM stands in for a device here: a small buffer keeps a round short.
        # The dwell is per round, and every pattern comes back many times in a long plan.
        return MemoryConfig(
            mib=mib if mib is not None else 64,
            fraction=fraction if fraction is not None else 0.8,
            max_mib=4096,
            block_mib=16,
            dwell_s=HOST_DWELL_S if dwell is None else dwell,
            rounds=rounds,
        )
    # Accelerators: write, dwell and read back each pattern, at most ~5 passes
    # over the buffer per pattern. Capping the size at 40 GiB per second of the
    # check's share fits the share on any device that moves 1 TB/s (every HBM
    # accelerator), so the cap only bites for short budgets.
    share_s = work * 0.2
    return MemoryConfig(
        mib=mib,
        fraction=fraction if fraction is not None else 0.8,
        max_mib=max(int(share_s * 40 * 1024), 1024),
        block_mib=256,
        dwell_s=DEVICE_DWELL_S if dwell is None else dwell,
        rounds=rounds,
    )
