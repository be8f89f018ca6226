"""Intermittent and data-dependent faults over repeated screenings of the same node.

    python -m bench.detection.screenings --mode quick|full [--out DIR]

(also run by ``make bench-detection`` after the golden-model benchmark). Two probes
screen the same simulated node 10 times, in the same run:

- **sdcguard**: the probe as it is now: rounds per check from its plan (read from
  a real ``run_probe`` at the mode's budget at the start of this run: equal
  rounds for every check, filling the budget), a fresh seed per screening (as the
  operator gives it: a new one every day);
- **today (fixed seed)**: the probe before the plan: rounds from its fixed
  formula of the budget (compute 257, collective 3, memory 5, golden 120 steps at
  15 s; 388 / 5 / 5 / 570 at 60 s) and seed 0 at every screening.

Both run the real checks (``run_compute``, ``run_collective``, ``run_memory``,
``golden_check``) and are judged by the probe's ``judge_check``. Shapes are the
probes' own divided by a constant (GEMM sides by 16, collective messages by
256, memory 1 MiB instead of 64), so that the data a screening examines keeps
the two probes' proportions; the golden model is the probe's own.

Profiles, one per check and kind:

- **intermittent** (p = 0.02, 0.05, 0.1): a fault active in each round with
  probability p; when active it corrupts a share of the round's elements on
  device 1 (GEMM outputs, all-reduce results, memory words at rest, ffn.down
  outputs) with high-mantissa flips; the share is set so an active round
  corrupts at least one element at these shapes. A screening draws the fault's
  rounds; if none is active it is not run (no element would be touched, so its
  trace is the healthy one by construction and the verdict a pass); otherwise
  the check runs up to and including the first active round, with the fault
  confined to that round (the verdict cannot change after it: evidence is never
  withdrawn). The ceiling is ``1 - (1 - p) ** rounds``: a screening can catch the
  fault only if it is active in some round.
- **data-dependent**: a defect on device 1 that fires on every element whose input
  operand has the node's own low-bit pattern in one lane of every few
  (``operand_mask`` and ``lane_stride``, one fixed bit
  flipped, so replay repeats it exactly and only the healthy device 0 shows it).
  Whether a screening triggers it depends on the data alone. The mask width is
  set so that about a third of sdcguard's screenings' data contain the pattern;
  the measured share is reported. The fixed-seed probe feeds the same data at
  every screening, so its first screening decides all ten: it is run once per
  node and its outcome counted for every screening.

Detection over k screenings = the share of nodes caught by at least one of their
first k screenings (k = 1, 3, 10).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import random
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from sdcprobe.backends import Backend, setup_backend
from sdcprobe.checks.collective import init_group, run_collective
from sdcprobe.checks.compute import run_compute
from sdcprobe.checks.golden import golden_check
from sdcprobe.checks.memory import run_memory
from sdcprobe.config import CHECK_NAMES, ProbeConfig, catch_probability, plan_config, with_rounds
from sdcprobe.faults import Injector
from sdcprobe.faultspec import FaultSpec
from sdcprobe.instrument import Instrumentation
from sdcprobe.judge import judge_check
from sdcprobe.runner import RunOptions, run_probe
from sdcprobe.trace import CheckTrace

RESULTS = Path(__file__).resolve().parent.parent / "results"
P_VALUES = (0.02, 0.05, 0.1)
SCREENINGS = (1, 3, 10)
VARIANTS = ("sdcguard", "today")
#: Fault site, share of elements hit when active, per check (intermittent profiles).
INTERMITTENT = {
    "compute": ("matmul", 0.1),
    "collective": ("allreduce", 0.1),
    "memory": ("memory", 1e-3),
    "golden": ("ffn.down", 0.01),
}
#: Expected pattern matches in one sdcguard screening's data (about a third trigger).
DATA_MATCHES = 0.4


@dataclass(frozen=True)
class Mode:
    """How big a run is."""

    budget: float
    nodes: int
    screenings: int = 10


MODES = {"quick": Mode(budget=30, nodes=5), "full": Mode(budget=60, nodes=40)}


def todays_rounds(budget: float) -> dict[str, int]:
    """Rounds of the probe before its budget became a plan (its fixed formula on the CPU)."""
    work = max(budget - 3.0, 2.0)
    size = 256 if budget >= 30 else 128
    compute = int(min(max(work * 0.15 / (0.022 if size == 256 else 0.007), 2), 512))
    return {
        "compute": compute,
        "collective": 3 if budget < 30 else 5,
        "memory": 5,
        "golden": int(min(max(work * 0.4 / 0.04, 8), 1000)),
    }


def todays_shapes(budget: float) -> tuple[dict[str, int], int]:
    """GEMM sizes and collective elements of the probe before the plan."""
    size = 256 if budget >= 30 else 128
    sizes = {"float32": size, "bfloat16": size, "float16": 64, "float64": size}
    return sizes, (1 << 16 if budget < 30 else 1 << 18)


def _scaled(config: ProbeConfig, sizes: dict[str, int], elements: int) -> ProbeConfig:
    """The benchmark's shapes: the probe's, scaled down in proportion."""
    small = {k: max(v // 16, 2) for k, v in sizes.items()}
    memory = config.memory.model_copy(update={"mib": 1, "block_mib": 1, "dwell_s": 0.0})
    return config.model_copy(
        update={
            "compute": config.compute.model_copy(update={"sizes": small}),
            "collective": config.collective.model_copy(
                update={"elements": max(elements // 256, 16)}
            ),
            "memory": memory,
        }
    )


class Bench:
    """One device (in this process) running checks as device 0 or 1 of a node."""

    def __init__(self, mode: Mode, rounds: dict[str, dict[str, int]]) -> None:
        self.mode = mode
        self.rounds = rounds
        self.backend: Backend = setup_backend("cpu", 0, 1)
        self._store = tempfile.mkdtemp(prefix="sdcbench-")
        init_group("gloo", 0, 1, str(Path(self._store) / "store"))
        base = plan_config(mode.budget, "cpu")
        old_sizes, old_elements = todays_shapes(mode.budget)
        self.shapes = {
            "sdcguard": _scaled(base, dict(base.compute.sizes), base.collective.elements),
            "today": _scaled(base, old_sizes, old_elements),
        }
        self._healthy: dict[tuple[str, str, int, int], CheckTrace] = {}
        self.runs = 0

    def config(self, variant: str, seed: int, rounds: int, check: str) -> ProbeConfig:
        cfg = self.shapes[variant]
        cfg = cfg.model_copy(
            update={"seed": seed, "golden": cfg.golden.model_copy(update={"seed": seed})}
        )
        return with_rounds(cfg, {check: rounds})

    def run(self, check: str, cfg: ProbeConfig, faults: list[dict[str, Any]] | None) -> CheckTrace:
        """The real check on device 1 (with ``faults``) or device 0 (without)."""
        spec = FaultSpec.model_validate({"faults": faults}) if faults else None
        injector = Injector(spec, 1 if faults else 0)
        ins = Instrumentation(self.backend, injector)
        self.runs += 1
        if check == "compute":
            return run_compute(cfg.compute, cfg.seed, ins)
        if check == "collective":
            return run_collective(cfg.collective, cfg.seed, ins, 0, 1)
        if check == "memory":
            return run_memory(cfg.memory, cfg.seed, ins)
        return golden_check(cfg.golden, self.backend, injector)

    def healthy(self, check: str, variant: str, seed: int, rounds: int) -> CheckTrace:
        key = (check, variant, seed, rounds)
        if key not in self._healthy:
            self._healthy[key] = self.run(check, self.config(variant, seed, rounds, check), None)
        return self._healthy[key]

    def close(self) -> None:
        dist.destroy_process_group()


def _rng(*parts: object) -> random.Random:
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def screening_seed(node: int, screening: int) -> int:
    """sdcguard's seed for one screening (a new one every time, as every day)."""
    return _rng("seed", node, screening).randrange(1, 1 << 31)


def intermittent(bench: Bench, check: str, p: float, variant: str) -> list[list[bool]]:
    """Per node, per screening: caught?"""
    site, rate = INTERMITTENT[check]
    rounds = bench.rounds[variant][check]
    out: list[list[bool]] = []
    for node in range(bench.mode.nodes):
        caught: list[bool] = []
        for k in range(bench.mode.screenings):
            draw = _rng("active", check, p, variant, node, k)
            active = [r for r in range(rounds) if draw.random() < p]
            if not active:
                caught.append(False)
                continue
            first = active[0]
            seed = screening_seed(node, k) if variant == "sdcguard" else 0
            fault = {"site": site, "rate": rate, "bits": "hi-mant", "device": 1,
                     "onset_step": first, "end_step": first, "seed": node * 1000 + k}  # fmt: skip
            cfg = bench.config(variant, seed, first + 1, check)
            trace = bench.run(check, cfg, [fault])
            verdict = judge_check(check, {1: trace}, None, None).verdict
            caught.append(verdict == "fail")
        out.append(caught)
    return out


def _operands_per_screening(cfg: ProbeConfig, check: str, rounds: int) -> int:
    """How many operand elements one screening's data offers the pattern."""
    if check == "compute":
        return rounds * sum(s * s for s in cfg.compute.sizes.values())
    if check == "collective":
        return rounds * cfg.collective.elements
    if check == "memory":
        # Only the random pattern's words vary with the seed (one round in five).
        return max(rounds // len(cfg.memory.patterns), 1) * cfg.memory.mib * (1 << 18)
    g = cfg.golden
    return rounds * g.batch * g.seq_len * g.d_ff * g.n_layers


#: Site and the bit flipped (fp32 numbering) of the data-dependent defects.
DATA_SITES = {"compute": "matmul", "collective": "allreduce", "memory": "memory",
              "golden": "ffn.down"}  # fmt: skip


def data_dependent(bench: Bench, check: str) -> dict[str, Any]:
    """Per variant, per node, per screening: caught?; and how often the data triggered it."""
    rounds_new = bench.rounds["sdcguard"][check]
    matches = _operands_per_screening(bench.shapes["sdcguard"], check, rounds_new)
    # A 16-bit operand pattern (the most a fault spec takes), in every stride-th lane.
    bits = min(16, max(2, round(math.log2(matches / DATA_MATCHES))))
    stride = max(1, round(matches / (DATA_MATCHES * (1 << bits))))
    out: dict[str, Any] = {"mask_bits": bits, "lane_stride": stride}
    for variant in VARIANTS:
        rounds = bench.rounds[variant][check]
        caught_all: list[list[bool]] = []
        triggered = screened = 0
        for node in range(bench.mode.nodes):
            value = _rng("mask", check, node).randrange(1 << bits)
            if check == "collective":
                value &= ~0xF  # integer-valued fp32 inputs have zero low mantissa bits
            fault = {"site": DATA_SITES[check], "rate": 1.0, "bits": [21, 21], "device": 1,
                     "operand_mask": {"bits": bits, "value": value}, "seed": node,
                     "lane_stride": stride, "lane_offset": value % stride}  # fmt: skip
            caught: list[bool] = []
            once: bool | None = None
            for k in range(bench.mode.screenings):
                if variant == "today" and once is not None:
                    caught.append(once)  # same data, same defect: the same outcome
                    continue
                seed = screening_seed(node, k) if variant == "sdcguard" else 0
                trace = bench.run(check, bench.config(variant, seed, rounds, check), [fault])
                healthy = bench.healthy(check, variant, seed, rounds)
                verdict = judge_check(check, {0: healthy, 1: trace}, None, None).verdict
                hit = verdict == "fail"
                triggered += int(trace.digest != healthy.digest)
                screened += 1
                caught.append(hit)
                once = hit
            caught_all.append(caught)
        out[variant] = {"caught": caught_all, "trigger_rate": round(triggered / screened, 3)}
    return out


def _detection(caught: list[list[bool]]) -> dict[str, float]:
    nodes = max(len(caught), 1)
    return {str(k): round(sum(any(c[:k]) for c in caught) / nodes, 3) for k in SCREENINGS}


def probe_rounds(budget: float) -> tuple[dict[str, int], dict[str, Any]]:
    """sdcguard's plan at ``budget`` on this machine, from a real probe run."""
    run = run_probe(RunOptions(device="cpu", budget=budget, cpu_devices=2))
    plan = run.result.plan
    if plan is None or plan.error or run.result.verdict != "pass":
        raise SystemExit(f"the probe run for the plan failed: {run.result.reason}")
    return dict(plan.run), plan.model_dump(mode="json")


def run_screenings(
    mode: Mode,
    progress: Callable[[str], None] = print,
    new_rounds: dict[str, int] | None = None,
    checks: tuple[str, ...] = CHECK_NAMES,
) -> dict[str, Any]:
    """Every profile, both probes; the document written to screenings.json.

    ``new_rounds`` skips the probe run that plans sdcguard's rounds (tests)."""
    wall0 = time.perf_counter()
    plan: dict[str, Any] | None = None
    if new_rounds is None:
        new_rounds, plan = probe_rounds(mode.budget)
    rounds = {"sdcguard": new_rounds, "today": todays_rounds(mode.budget)}
    progress(f"rounds at {mode.budget:g}s: sdcguard {new_rounds}, today {rounds['today']}")
    bench = Bench(mode, rounds)
    rows: list[dict[str, Any]] = []
    try:
        for check in checks:
            for p in P_VALUES:
                row: dict[str, Any] = {"check": check, "kind": "intermittent", "p": p}
                for variant in VARIANTS:
                    t0 = time.process_time()
                    caught = intermittent(bench, check, p, variant)
                    n = rounds[variant][check]
                    row[variant] = {
                        "rounds": n,
                        "detection": _detection(caught),
                        "ceiling": {
                            str(k): round(catch_probability(p, n * k), 3) for k in SCREENINGS
                        },
                        "cpu_s": round(time.process_time() - t0, 1),
                    }
                rows.append(row)
                progress(
                    f"[{check} p={p}] sdcguard {row['sdcguard']['detection']} "
                    f"today {row['today']['detection']}"
                )
            t0 = time.process_time()
            data = data_dependent(bench, check)
            row = {
                "check": check,
                "kind": "data-dependent",
                "mask_bits": data["mask_bits"],
                "lane_stride": data["lane_stride"],
            }
            for variant in VARIANTS:
                q = data[variant]["trigger_rate"]
                row[variant] = {
                    "rounds": rounds[variant][check],
                    "detection": _detection(data[variant]["caught"]),
                    "trigger_rate": q,
                    # Fresh data every screening: 1-(1-q)^k; the same data: q, whatever k.
                    "ceiling": {
                        str(k): round(1 - (1 - q) ** k if variant == "sdcguard" else q, 3)
                        for k in SCREENINGS
                    },
                }
            row["cpu_s"] = round(time.process_time() - t0, 1)
            rows.append(row)
            progress(
                f"[{check} data-dependent] sdcguard {row['sdcguard']['detection']} "
                f"today {row['today']['detection']}"
            )
    finally:
        bench.close()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "benchmark": "screenings",
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "load_avg_1m": round(os.getloadavg()[0], 2),
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
        "mode": {"budget_s": mode.budget, "nodes": mode.nodes, "screenings": mode.screenings},
        "rounds": rounds,
        "probe_plan": plan,
        "profiles": rows,
        "check_runs": bench.runs,
        "runtime": {
            "wall_s": round(time.perf_counter() - wall0, 1),
            "cpu_s": round(usage.ru_utime + usage.ru_stime + kids.ru_utime + kids.ru_stime, 1),
        },
    }


def markdown(doc: dict[str, Any]) -> str:
    """The tables of screenings.md."""
    mode, rounds = doc["mode"], doc["rounds"]
    lines = [
        "# Intermittent and data-dependent faults over repeated screenings",
        "",
        f"Generated {doc['generated_at']} by `python -m bench.detection.screenings` "
        f"(budget {mode['budget_s']:g} s, {mode['nodes']} nodes per profile, "
        f"{mode['screenings']} screenings each; {doc['check_runs']} check runs, "
        f"{doc['runtime']['wall_s']} s wall, {doc['runtime']['cpu_s']} s CPU). "
        "How it works: see the docstring of `bench/detection/screenings.py`.",
        "",
        "Rounds per screening: "
        + "; ".join(
            f"{v}: " + ", ".join(f"{c} {n}" for c, n in rounds[v].items()) for v in VARIANTS
        ),
        "",
        "Detection = share of nodes caught within k screenings (k = 1 / 3 / 10); "
        "ceiling = 1-(1-p)^(rounds x k) for intermittent faults, 1-(1-q)^k with fresh "
        "data (q: the measured share of screenings whose data trigger the defect) and q "
        "with the same data.",
        "",
        "| check | fault | sdcguard | ceiling | today (seed 0) | ceiling |",
        "|---|---|---|---|---|---|",
    ]

    def cells(d: dict[str, float]) -> str:
        return " / ".join(f"{d[str(k)]:.2f}" for k in SCREENINGS)

    for row in doc["profiles"]:
        fault = (
            f"intermittent p={row['p']}"
            if row["kind"] == "intermittent"
            else f"data-dependent ({row['mask_bits']}-bit pattern, 1 lane in "
            f"{row['lane_stride']}; "
            f"triggers {row['sdcguard']['trigger_rate']:.2f} / {row['today']['trigger_rate']:.2f})"
        )
        new, old = row["sdcguard"], row["today"]
        lines.append(
            f"| {row['check']} | {fault} | **{cells(new['detection'])}** | "
            f"{cells(new['ceiling'])} | {cells(old['detection'])} | {cells(old['ceiling'])} |"
        )
    lines += ["", "![detection against screening seconds](screenings.png)", ""]
    return "\n".join(lines)


def chart(doc: dict[str, Any], path: Path) -> None:
    """Detection against screening seconds, one panel per fault kind."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budget = doc["mode"]["budget_s"]
    kinds = [("intermittent", p) for p in P_VALUES] + [("data-dependent", None)]
    fig, axes = plt.subplots(1, len(kinds), figsize=(4.2 * len(kinds), 3.6), sharey=True)
    colors = {"compute": "C0", "collective": "C1", "memory": "C2", "golden": "C3"}
    xs = [k * budget for k in SCREENINGS]
    for ax, (kind, p) in zip(axes, kinds, strict=True):
        for row in doc["profiles"]:
            if row["kind"] != kind or (p is not None and row["p"] != p):
                continue
            c = colors[row["check"]]
            for variant, style in (("sdcguard", "-"), ("today", "--")):
                ys = [row[variant]["detection"][str(k)] for k in SCREENINGS]
                label = f"{row['check']} ({'sdcguard' if style == '-' else 'today'})"
                ax.plot(xs, ys, style, color=c, marker="o", label=label)
        ax.set_title(f"{kind}" + (f", p={p}" if p is not None else ""))
        ax.set_xlabel(f"screening seconds ({budget:g} s per screening)")
        ax.set_xticks(xs)
        ax.set_ylim(-0.03, 1.03)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("nodes caught")
    axes[-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(doc: dict[str, Any], out: Path) -> list[Path]:
    """screenings.json, .md and .png into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "screenings.json", out / "screenings.md", out / "screenings.png"]
    paths[0].write_text(json.dumps(doc, indent=2) + "\n")
    paths[1].write_text(markdown(doc))
    chart(doc, paths[2])
    return paths


def main(argv: list[str] | None = None) -> int:
    """Run and write the results."""
    parser = argparse.ArgumentParser(
        prog="bench.detection.screenings",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--mode", choices=sorted(MODES), default="quick")
    parser.add_argument("--nodes", type=int, default=None, help="nodes per profile")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    mode = MODES[args.mode]
    if args.nodes:
        mode = Mode(budget=mode.budget, nodes=args.nodes, screenings=mode.screenings)
    doc = run_screenings(mode, progress=lambda s: print(s, flush=True))
    for path in write(doc, args.out):
        print(f"wrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
