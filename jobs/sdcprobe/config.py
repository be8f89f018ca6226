"""Check parameters, derived deterministically from the time budget.

Sizes come from a fixed formula of (budget, backend), never from timing the
machine: two runs with the same flags must compute the same thing, or their
digests could not be compared. The parameters' hash is part of the fingerprint.
Torch-free.
"""

from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel, ConfigDict, Field

from sdcprobe.devices import BackendName

#: Bump when the way digests are computed changes: old baselines stop matching.
DIGEST_VERSION = 1

CHECK_NAMES: tuple[str, ...] = ("compute", "collective", "golden")


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
    golden: GoldenConfig

    def config_hash(self) -> str:
        """Short stable hash of the parameters (goes into the fingerprint)."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def plan_config(
    budget: float, backend: BackendName, steps: int | None = None, seed: int = 0
) -> ProbeConfig:
    """Check sizes for a wall-clock ``budget`` in seconds on ``backend``.

    On the CPU the split is calibrated for one thread per device worker (see
    README.md for measured timings); accelerators get larger problems in the
    same budget. The result depends only on the arguments.
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
        from sdcprobe.devices import xla_on_host

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
        golden=golden,
    )
