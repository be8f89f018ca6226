"""The fault profiles: what each trial injects, and what it stands for.

Rates and bit classes follow the fp32 numbering of the probe's fault spec
(``jobs/sdcprobe/faultspec.py``); the figures come from arXiv 2502.12340 (15
nodes pulled from a fleet for SDC) and related work. Every fault targets device 1
of a two-device node, and every trial draws its own fault seed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["healthy", "reorder", "fingerprint", "fault"]
FaultDicts = list[dict[str, Any]]

#: Sites of issue 9 (one small-error profile each) and the probe site they use.
SITE_PROFILES: dict[str, str] = {
    "S-softmax": "attention.softmax",
    "S-norm": "norm",
    "S-activation": "activation",
    "S-embedding": "embedding",
    "S-optimizer": "optimizer",
    "S-param": "param",
}
#: Relative error range of the small-error faults: below bf16 resolution (2^-8 = 3.9e-3).
SMALL = (1e-5, 1e-3)


@dataclass(frozen=True)
class Context:
    """What fault specs depend on: the run length and calibrated rates."""

    steps: int
    n_layers: int
    grad_rate: float  # F4: grad.weight flip rate for a 5.1% per-step gradient error


@dataclass(frozen=True)
class Profile:
    """One row of the results: a fault class, or a healthy control."""

    id: str
    title: str
    anchor: str
    kind: Kind = "fault"
    group: Literal["control", "issue5", "issue9"] = "issue5"
    build: Callable[[Context], FaultDicts] = field(default=lambda ctx: [])
    #: index of a fault in the spec -> exact number of elements (lo, hi) per active step
    exact_counts: dict[int, tuple[int, int]] = field(default_factory=dict)
    persistent: bool = False  # active from step 0 on every step (recall target 100%)
    step_probability: float | None = None  # for the ceiling 1 - (1 - p)^S
    onset: Callable[[Context], int] | None = None

    def faults(self, ctx: Context, seed: int) -> FaultDicts:
        """The spec's faults for one trial: on device 1, seeded per trial and fault."""
        return [{**f, "device": 1, "seed": seed * 16 + i} for i, f in enumerate(self.build(ctx))]

    def sites(self, ctx: Context) -> list[str]:
        """Sites this profile injects at (for "does golden name the site")."""
        return sorted({f["site"] for f in self.build(ctx)})


def _one(**fault: Any) -> Callable[[Context], FaultDicts]:
    return lambda ctx: [dict(fault)]


def _f5(after: bool) -> Callable[[Context], FaultDicts]:
    def build(ctx: Context) -> FaultDicts:
        onset = ctx.steps if after else (3 * ctx.steps) // 4
        return [{"site": "attention.output", "rate": 1e-3, "bits": "lo-mant", "onset_step": onset}]

    return build


def _small(site: str) -> Callable[[Context], FaultDicts]:
    return _one(site=site, rate=1e-3, mode="scale", scale=SMALL)


PROFILES: tuple[Profile, ...] = (
    Profile("H0", "healthy", "false-positive rate", kind="healthy", group="control"),
    Profile(
        "H1",
        "benign non-determinism: ffn.down reduction order permuted per call",
        "must be inconclusive or pass, never SDC",
        kind="reorder",
        group="control",
    ),
    Profile(
        "H1u",
        "as H1, but the kernel escapes the determinism guard (not in the issue's table)",
        "shows what the guard buys; a bitwise check alone calls this SDC",
        kind="reorder",
        group="control",
    ),
    Profile(
        "H2",
        "baseline recorded under another fingerprint (2 threads instead of 1)",
        "must be inconclusive",
        kind="fingerprint",
        group="control",
    ),
    Profile(
        "F1",
        "attention.output, rate 2.89e-2, lo-mant flips, persistent",
        "node with the highest mismatch frequency",
        build=_one(site="attention.output", rate=2.89e-2, bits="lo-mant"),
        persistent=True,
    ),
    Profile(
        "F2",
        "attention.output + ffn.up + ffn.down, rate 4.78e-3, lo+hi mantissa (bits 0-22)",
        "second node",
        build=lambda ctx: [
            {"site": s, "rate": 4.78e-3, "bits": [0, 22]}
            for s in ("attention.output", "ffn.up", "ffn.down")
        ],
        persistent=True,
    ),
    Profile(
        "F3",
        "ffn.down, rate 1e-5, exponent bits 26-27",
        "rare severe node (severity >100x)",
        build=_one(site="ffn.down", rate=1e-5, bits=[26, 27]),
        persistent=True,
    ),
    Profile(
        "F4",
        "grad.weight, hi-mant flips at a rate calibrated to a 5.1% per-step gradient error",
        "worst gradient noise (5.1% of the gradient's L2 norm)",
        build=lambda ctx: [{"site": "grad.weight", "rate": ctx.grad_rate, "bits": "hi-mant"}],
        persistent=True,
    ),
    Profile(
        "F5",
        "attention.output, rate 1e-3, lo-mant, onset at 75% of the run",
        "drift appearing only after step ~450",
        build=_f5(after=False),
        onset=lambda ctx: (3 * ctx.steps) // 4,
    ),
    Profile(
        "F5-after",
        "as F5, onset after the last step of the screening",
        "drift that starts after the screening: must be missed",
        build=_f5(after=True),
        onset=lambda ctx: ctx.steps,
    ),
    Profile(
        "F6",
        "ffn.up, exp-hi flips of 1-3 elements, step probability 0.02",
        "occasional spikes; ceiling 1-(1-p)^S",
        build=_one(site="ffn.up", rate=1e-5, bits="exp-hi", step_probability=0.02),
        exact_counts={0: (1, 3)},
        step_probability=0.02,
    ),
    Profile(
        "F7",
        "attention.qkv, rate 1e-3, lo-mant",
        "faults that barely move the loss",
        build=_one(site="attention.qkv", rate=1e-3, bits="lo-mant"),
        persistent=True,
    ),
    Profile(
        "F11",
        "every matmul, rate 1e-3, relative error 1e-5..1e-3",
        "below bf16 resolution: bf16 checksums cannot see these",
        build=_one(site="matmul", rate=1e-3, mode="scale", scale=SMALL),
        persistent=True,
    ),
    Profile(
        "F12",
        "any matmul, rate 1e-6 (half NaN, half Inf)",
        "sanity: everything should catch it",
        build=lambda ctx: [
            {"site": "matmul", "rate": 5e-7, "mode": "nan"},
            {"site": "matmul", "rate": 5e-7, "mode": "inf"},
        ],
        persistent=True,
    ),
    *(
        Profile(
            pid,
            f"{site}, rate 1e-3, relative error 1e-5..1e-3",
            "site coverage (issue 9), below bf16 resolution",
            group="issue9",
            build=_small(site),
        )
        for pid, site in SITE_PROFILES.items()
    ),
)

BY_ID: dict[str, Profile] = {p.id: p for p in PROFILES}


def select(ids: str | None) -> list[Profile]:
    """Profiles by comma-separated id (all when ``ids`` is empty); H0 always comes first."""
    if not ids:
        return list(PROFILES)
    wanted = [i.strip() for i in ids.split(",") if i.strip()]
    unknown = [i for i in wanted if i not in BY_ID]
    if unknown:
        raise SystemExit(f"unknown profile(s) {', '.join(unknown)}; known: {', '.join(BY_ID)}")
    if "H0" not in wanted:
        wanted.insert(0, "H0")  # healthy runs record the baselines every trial is judged against
    return [p for p in PROFILES if p.id in wanted]
