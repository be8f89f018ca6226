"""Check parameters, derived deterministically from the time budget.

Sizes come from a fixed formula of (budget, backend), never from timing the
machine: two runs with the same flags must compute the same thing, or their
digests could not be compared. The parameters' hash is part of the fingerprint.
Torch-free.
"""

from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sdcprobe.devices import BackendName, xla_on_host

#: Bump when the way digests are computed changes: old baselines stop matching.
DIGEST_VERSION = 1

#: Every check, in the order a run performs them.
CHECK_NAMES: tuple[str, ...] = ("compute", "collective", "memory", "golden")

#: The memory check's patterns, in the order they are written.
MEMORY_PATTERNS: tuple[str, ...] = (
    "walking-ones",
    "walking-zeros",
    "checkerboard",
    "checkerboard-inverse",
    "random",
)


class ComputeConfig(BaseModel):
    """Seeded GEMMs: ``rounds`` rounds of one square GEMM per dtype."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    sizes: dict[str, int] = Field(
        description="Matrix size per dtype name (float32, bfloat16, ...)."
    )
    rounds: int = Field(ge=1)


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


class ProbeConfig(BaseModel):
    """Everything that decides what the checks compute."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    digest_version: int = DIGEST_VERSION
    seed: int = 0
    compute: ComputeConfig
    collective: CollectiveConfig
    memory: MemoryConfig
    golden: GoldenConfig

    def config_hash(self) -> str:
        """Short stable hash of the parameters (goes into the fingerprint)."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def plan_config(
    budget: float,
    backend: BackendName,
    steps: int | None = None,
    seed: int = 0,
    memory_fraction: float | None = None,
    memory_mib: int | None = None,
) -> ProbeConfig:
    """Check sizes for a wall-clock ``budget`` in seconds on ``backend``.

    On the CPU the split is calibrated for one thread per device worker (see
    README.md for measured timings); accelerators get larger problems in the
    same budget. The result depends only on the arguments.

    The memory check fills ``memory_fraction`` (default 0.8) of free device
    memory on accelerators, capped by the budget, and a fixed ``memory_mib``
    (default 64) per CPU replica, where filling a share of host RAM would
    endanger the node; an explicit ``memory_mib`` wins everywhere.
    """
    budget = max(float(budget), 3.0)
    # Seconds left for work after starting workers and importing torch.
    work = max(budget - (3.0 if backend == "cpu" else 20.0), 2.0)
    if backend == "cpu":
        # Calibrated on one core per device worker (bench/probe): a GEMM round
        # costs ~7 ms at 128 and ~22 ms at 256, a golden step with its replay
        # ~40 ms. The run is planned to use ~55% of the budget, leaving headroom
        # for busy nodes.
        size = 256 if budget >= 30 else 128
        # CPU fp16 GEMMs have no fast kernel and run ~30x slower than bf16.
        sizes = {"float32": size, "bfloat16": size, "float16": 64, "float64": size}
        rounds = int(min(max(work * 0.15 / (0.022 if size == 256 else 0.007), 2), 512))
        elements = 1 << 16 if budget < 30 else 1 << 18
        coll_rounds = 3 if budget < 30 else 5
        golden_steps = int(min(max(work * 0.4 / 0.04, 8), 1000))
    else:
        size = 1024 if backend == "cuda" else 512
        sizes = {"float32": size, "bfloat16": size, "float16": size}
        sizes["float64"] = size // 2
        rounds = int(min(max(work * 0.3 / 0.01, 4), 256))
        elements = 1 << 24
        coll_rounds = 5
        golden_steps = int(min(max(work * 0.5 / 0.05, 20), 1000))
    if backend == "xla":
        if xla_on_host():  # PJRT CPU: tests and CI
            sizes = {"float32": 128, "bfloat16": 128, "float16": 64, "float64": 128}
            rounds, elements, coll_rounds = 2, 1 << 16, 2
            golden_steps = int(min(max(work * 0.3 / 0.1, 8), 100))
        else:  # TPU and Neuron cores have no fp64 units
            sizes.pop("float64")
    golden = GoldenConfig(steps=steps if steps is not None else golden_steps, seed=seed)
    return ProbeConfig(
        seed=seed,
        compute=ComputeConfig(sizes=sizes, rounds=rounds),
        collective=CollectiveConfig(elements=elements, rounds=coll_rounds),
        memory=_plan_memory(budget, work, backend, memory_fraction, memory_mib),
        golden=golden,
    )


def _plan_memory(
    budget: float,
    work: float,
    backend: BackendName,
    fraction: float | None,
    mib: int | None,
) -> MemoryConfig:
    on_host = backend == "cpu" or (backend == "xla" and xla_on_host())
    if on_host:
        # Calibrated on one core: ~0.2 s per 64 MiB for all five patterns.
        return MemoryConfig(
            mib=mib if mib is not None else 64,
            fraction=fraction if fraction is not None else 0.8,
            max_mib=4096,
            block_mib=16,
            dwell_s=0.05 if budget < 30 else 0.25,
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
        dwell_s=0.5 if budget >= 30 else 0.1,
    )
