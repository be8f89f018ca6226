"""Intermittent and data-dependent faults over repeated screenings of the same node.

    python -m bench.detection.screenings --mode quick|full [--out DIR]

(also run by ``make bench-detection`` after the golden-model benchmark). Two probes
screen the same simulated node 10 times, in the same run:

- **sdcguard**: the probe as it is now: rounds per check from its plan (read from
  a real ``run_probe`` at the mode's budget at the start of this run), and its two
  seeds as the operator gives them (``sdcguard.domain.seeds``): the rounds a
  baseline covers (the probe's ``baseline_rounds``: compute 2, collective 2,
  memory 5 patterns, golden 16 steps) draw from the operator's fixed baseline seed
  (the same for every screening), every later round from the test's own data seed
  (from its uid and name: new for every screening). A node's screenings are created
  every ``INTERVAL`` (12 h); a first SDC verdict is followed ``CONFIRM_AFTER`` later
  by a confirmation re-run that takes the failed test's data seed, as the operator's
  default confirmation policy (one re-run, same check) does;
- **today (fixed seed)**: the probe before the plan and the seeds: rounds from its
  fixed formula of the budget (compute 257, collective 3, memory 5, golden 120
  steps at 15 s; 388 / 5 / 5 / 570 at 60 s) and seed 0 for every round of every
  screening and confirmation.

Both run the real checks through the probe worker's own dispatch
(``sdcprobe.worker._run_check``, which routes each round to its seed) and are
judged by the probe's ``judge_check``. Shapes are the probes' own divided by a
constant (GEMM sides by 16, collective messages by 256, memory 1 MiB instead of
64), so that the data a screening examines keeps the two probes' proportions; the
golden model is the probe's own.

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
  withdrawn). A node's screenings stop at its first SDC verdict (what detection
  within k needs), whose confirmation re-run draws its own rounds. The ceiling is
  ``1 - (1 - p) ** (rounds * k)``: a screening can catch the fault only if it is
  active in some round.
- **data-dependent**: a defect on device 1 that fires on every element whose input
  operand has the node's own low-bit pattern in one lane of every few
  (``operand_mask`` and ``lane_stride``, one fixed bit flipped, so replay repeats
  it exactly and only the healthy device 0 shows it). Whether a screening
  triggers it depends on the data alone. The mask width is set so that about a
  third of sdcguard's screenings' data contain the pattern; the measured share q
  is reported (over all ten screenings of every node). The first SDC verdict's
  confirmation is run twice: with the failed test's data seed (what the operator
  does) and, for comparison, with a fresh one (what a confirmation that drew new
  data would see). The fixed-seed probe feeds the same data at every screening
  and confirmation, so its first screening decides all ten and its confirmation:
  it is run once per node and its outcome counted for every screening.

Detection over k screenings = the share of nodes with an SDC verdict in at least
one of their first k screenings (k = 1, 3, 10): from then on the node is Suspect
and held. Confirmed = of those, the share whose first verdict's re-run failed
again on the same check (quarantined at once; otherwise the node is Flaky: held,
and screened again after the inconclusive back-off).
"""

from __future__ import annotations

import argparse
import datetime as dt
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
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from sdcguard.domain.seeds import data_seed, screening_seed
from sdcprobe.backends import Backend, setup_backend
from sdcprobe.checks.collective import init_group
from sdcprobe.config import CHECK_NAMES, ProbeConfig, catch_probability, plan_config, with_rounds
from sdcprobe.faults import Injector
from sdcprobe.faultspec import FaultSpec
from sdcprobe.judge import judge_check
from sdcprobe.runner import RunOptions, run_probe
from sdcprobe.trace import CheckTrace
from sdcprobe.worker import _Peaks, _run_check

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
#: When a node's screenings are created: node n's first at START + n * NODE_OFFSET, then
#: one every INTERVAL (two a day: a node that returns from use twice a day, or is
#: screened in two idle windows); a confirmation re-run CONFIRM_AFTER a first SDC verdict.
START = dt.datetime(2026, 12, 1, 6, 0, tzinfo=dt.UTC)
NODE_OFFSET = dt.timedelta(minutes=7)
INTERVAL = dt.timedelta(hours=12)
CONFIRM_AFTER = dt.timedelta(minutes=15)


@dataclass(frozen=True)
class Screening:
    """One SDCTest of a node: its name and the probe's two seeds, as the operator sets them."""

    name: str
    created: dt.datetime
    #: The rounds a baseline covers (the fixed baseline seed).
    seed: int
    #: Every later round (the test's own; None: ``seed``, as the probe before the seeds).
    data_seed: int | None


def _uid(*parts: object) -> str:
    return str(uuid.UUID(int=_rng("uid", *parts).getrandbits(128)))


def screening(variant: str, node: int, k: int) -> Screening:
    """Screening ``k`` of ``node``: for sdcguard the operator's seeds
    (``sdcguard.domain.seeds``: the fixed baseline seed, the test's own data seed); for
    the probe before the seeds, seed 0 for everything."""
    created = START + node * NODE_OFFSET + k * INTERVAL
    name = f"node-{node}-screening-{k}"
    if variant == "today":
        return Screening(name, created, 0, None)
    uid = _uid(node, k)
    return Screening(name, created, screening_seed(None), data_seed(None, None, uid, name))


def confirmation(variant: str, failed: Screening, repeat: bool = True) -> Screening:
    """The confirmation re-run of ``failed``: the operator's seeds for a test created
    ``CONFIRM_AFTER`` later with reason Confirmation (the failed test's data seed);
    ``repeat=False``: a fresh data seed instead, the comparison for data-dependent faults."""
    created = failed.created + CONFIRM_AFTER
    name = f"{failed.name}-confirm"
    if variant == "today":
        return Screening(name, created, 0, None)
    confirmed = failed.data_seed if repeat else None
    uid = _uid(name, repeat)
    return Screening(
        name,
        created,
        screening_seed(None),
        data_seed(None, None, uid, name, confirmed),
    )


@dataclass(frozen=True)
class Mode:
    """How big a run is."""

    budget: float
    nodes: int
    screenings: int = 10
    #: Nodes of the golden profiles, if fewer (a golden screening costs the most by far).
    golden_nodes: int | None = None

    def nodes_of(self, check: str) -> int:
        """Nodes per profile of ``check``."""
        if check == "golden" and self.golden_nodes is not None:
            return self.golden_nodes
        return self.nodes


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
        self._shapes = {
            "sdcguard": (dict(base.compute.sizes), base.collective.elements),
            "today": todays_shapes(mode.budget),
        }
        self._healthy: dict[tuple[str, str, int, int | None, int], CheckTrace] = {}
        self.runs = 0

    def config(self, variant: str, s: Screening, rounds: int, check: str) -> ProbeConfig:
        """What ``check`` computes in screening ``s``: the probe's own config for its
        seeds (``plan_config``: which rounds a baseline covers and so which seed each
        round draws from), at the benchmark's shapes, with ``rounds`` rounds."""
        cfg = plan_config(self.mode.budget, "cpu", seed=s.seed, data_seed=s.data_seed)
        return with_rounds(_scaled(cfg, *self._shapes[variant]), {check: rounds})

    def shapes(self, variant: str) -> ProbeConfig:
        """The variant's config at the benchmark's shapes (seeds and rounds aside)."""
        return _scaled(plan_config(self.mode.budget, "cpu"), *self._shapes[variant])

    def run(self, check: str, cfg: ProbeConfig, faults: list[dict[str, Any]] | None) -> CheckTrace:
        """The real check on device 1 (with ``faults``) or device 0 (without), through
        the probe worker's own dispatch (each round's seed as in a probe run)."""
        spec = FaultSpec.model_validate({"faults": faults}) if faults else None
        injector = Injector(spec, 1 if faults else 0)
        self.runs += 1
        return _run_check(check, cfg, self.backend, injector, 0, 1, _Peaks())

    def healthy(self, check: str, variant: str, s: Screening, rounds: int) -> CheckTrace:
        key = (check, variant, s.seed, s.data_seed, rounds)  # same data, same bits
        if key not in self._healthy:
            self._healthy[key] = self.run(check, self.config(variant, s, rounds, check), None)
        return self._healthy[key]

    def close(self) -> None:
        dist.destroy_process_group()


def _rng(*parts: object) -> random.Random:
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


@dataclass
class NodeOutcome:
    """One node's screenings: the first with an SDC verdict, and its confirmation."""

    #: Index of the first screening with an SDC verdict (None: never flagged).
    flagged: int | None = None
    #: Its confirmation re-run failed again (None: never flagged).
    confirmed: bool | None = None
    #: The same re-run with fresh data instead (data-dependent profiles of sdcguard).
    confirmed_fresh: bool | None = None

    def as_json(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if v is not None}


def _intermittent_screening(
    bench: Bench, check: str, p: float, variant: str, s: Screening, rounds: int, fault_seed: int
) -> bool:
    """Does screening ``s`` catch the intermittent fault (draws which rounds it is active)?"""
    site, rate = INTERMITTENT[check]
    draw = _rng("active", check, p, variant, s.name)
    active = [r for r in range(rounds) if draw.random() < p]
    if not active:
        return False
    first = active[0]
    fault = {"site": site, "rate": rate, "bits": "hi-mant", "device": 1,
             "onset_step": first, "end_step": first, "seed": fault_seed}  # fmt: skip
    trace = bench.run(check, bench.config(variant, s, first + 1, check), [fault])
    return judge_check(check, {1: trace}, None, None).verdict == "fail"


def intermittent(bench: Bench, check: str, p: float, variant: str) -> list[NodeOutcome]:
    """Per node: the first screening that caught the fault, and its confirmation."""
    rounds = bench.rounds[variant][check]
    out: list[NodeOutcome] = []
    for node in range(bench.mode.nodes_of(check)):
        outcome = NodeOutcome()
        for k in range(bench.mode.screenings):
            s = screening(variant, node, k)
            if _intermittent_screening(bench, check, p, variant, s, rounds, node * 1000 + k):
                again = confirmation(variant, s)
                outcome.flagged = k
                outcome.confirmed = _intermittent_screening(
                    bench, check, p, variant, again, rounds, node * 1000 + 500 + k
                )
                break  # detection within k needs nothing after the first verdict
        out.append(outcome)
    return out


def _operands_per_screening(cfg: ProbeConfig, check: str, rounds: int) -> int:
    """How many operand elements one screening's data offers the pattern."""
    if check == "compute":
        # fp32 operands only: the fp64 ones are widened fp32 values (low mantissa bits
        # zero) and in bf16/fp16 a pattern this wide reaches the exponent, so few match.
        return rounds * cfg.compute.sizes["float32"] ** 2
    if check == "collective":
        return rounds * cfg.collective.elements
    if check == "memory":
        # Only the random pattern's words vary with the seed (one round in five).
        return max(rounds // len(cfg.memory.patterns), 1) * (cfg.memory.mib or 1) * (1 << 18)
    g = cfg.golden
    return rounds * g.batch * g.seq_len * g.d_ff * g.n_layers


#: Site and the bit flipped (fp32 numbering) of the data-dependent defects.
DATA_SITES = {"compute": "matmul", "collective": "allreduce", "memory": "memory",
              "golden": "ffn.down"}  # fmt: skip


def _data_screening(
    bench: Bench, check: str, variant: str, s: Screening, rounds: int, fault: dict[str, Any]
) -> tuple[bool, bool]:
    """(SDC verdict, the data triggered the defect) for screening ``s`` of a node with the
    data-dependent ``fault`` on device 1, judged against the healthy device 0."""
    trace = bench.run(check, bench.config(variant, s, rounds, check), [fault])
    healthy = bench.healthy(check, variant, s, rounds)
    verdict = judge_check(check, {0: healthy, 1: trace}, None, None).verdict
    return verdict == "fail", trace.digest != healthy.digest


def data_dependent(bench: Bench, check: str) -> dict[str, Any]:
    """Per variant, per node: the first screening that caught the defect and its
    confirmation; and how often the data triggered it."""
    rounds_new = bench.rounds["sdcguard"][check]
    matches = _operands_per_screening(bench.shapes("sdcguard"), check, rounds_new)
    # A 16-bit operand pattern (the most a fault spec takes), in every stride-th lane.
    bits = min(16, max(2, round(math.log2(matches / DATA_MATCHES))))
    stride = max(1, round(matches / (DATA_MATCHES * (1 << bits))))
    out: dict[str, Any] = {"mask_bits": bits, "lane_stride": stride}
    for variant in VARIANTS:
        rounds = bench.rounds[variant][check]
        outcomes: list[NodeOutcome] = []
        triggered = screened = 0
        for node in range(bench.mode.nodes_of(check)):
            value = _rng("mask", check, node).randrange(1 << bits)
            if check == "collective":
                value &= ~0xF  # integer-valued fp32 inputs have zero low mantissa bits
            fault = {"site": DATA_SITES[check], "rate": 1.0, "bits": [21, 21], "device": 1,
                     "operand_mask": {"bits": bits, "value": value}, "seed": node,
                     "lane_stride": stride, "lane_offset": value % stride}  # fmt: skip
            outcome = NodeOutcome()
            # The fixed-seed probe sees the same data every time: its first screening
            # decides every later one and the confirmation (same data, same defect).
            for k in range(1 if variant == "today" else bench.mode.screenings):
                s = screening(variant, node, k)
                hit, fired = _data_screening(bench, check, variant, s, rounds, fault)
                triggered += int(fired)
                screened += 1
                if hit and outcome.flagged is None:
                    outcome.flagged = k
                    if variant == "today":
                        outcome.confirmed = True
                        continue
                    again, fresh = confirmation(variant, s), confirmation(variant, s, False)
                    outcome.confirmed = _data_screening(
                        bench, check, variant, again, rounds, fault
                    )[0]
                    outcome.confirmed_fresh = _data_screening(
                        bench, check, variant, fresh, rounds, fault
                    )[0]
            outcomes.append(outcome)
        out[variant] = {"nodes": outcomes, "trigger_rate": round(triggered / screened, 3)}
    return out


def _detection(outcomes: list[NodeOutcome]) -> dict[str, float]:
    nodes = max(len(outcomes), 1)
    return {
        str(k): round(sum(o.flagged is not None and o.flagged < k for o in outcomes) / nodes, 3)
        for k in SCREENINGS
    }


def _confirmed(outcomes: list[NodeOutcome], fresh: bool = False) -> float | None:
    """Of the nodes flagged within all screenings, the share whose re-run confirmed."""
    flagged = [o for o in outcomes if o.flagged is not None]
    if not flagged:
        return None
    hits = [o.confirmed_fresh if fresh else o.confirmed for o in flagged]
    return round(sum(bool(h) for h in hits) / len(flagged), 3)


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
    loads = [os.getloadavg()[0]]  # the machine is shared: its load, sampled per profile
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
                row: dict[str, Any] = {
                    "check": check,
                    "kind": "intermittent",
                    "p": p,
                    "nodes": mode.nodes_of(check),
                }
                for variant in VARIANTS:
                    t0 = time.process_time()
                    outcomes = intermittent(bench, check, p, variant)
                    n = rounds[variant][check]
                    row[variant] = {
                        "rounds": n,
                        "detection": _detection(outcomes),
                        "ceiling": {
                            str(k): round(catch_probability(p, n * k), 3) for k in SCREENINGS
                        },
                        "confirmed": _confirmed(outcomes),
                        "confirm_ceiling": round(catch_probability(p, n), 3),
                        "nodes": [o.as_json() for o in outcomes],
                        "cpu_s": round(time.process_time() - t0, 1),
                    }
                rows.append(row)
                loads.append(os.getloadavg()[0])
                progress(
                    f"[{check} p={p}] sdcguard {row['sdcguard']['detection']} "
                    f"today {row['today']['detection']}"
                )
            t0 = time.process_time()
            data = data_dependent(bench, check)
            row = {
                "check": check,
                "kind": "data-dependent",
                "nodes": mode.nodes_of(check),
                "mask_bits": data["mask_bits"],
                "lane_stride": data["lane_stride"],
            }
            for variant in VARIANTS:
                q = data[variant]["trigger_rate"]
                outcomes = data[variant]["nodes"]
                row[variant] = {
                    "rounds": rounds[variant][check],
                    "detection": _detection(outcomes),
                    "trigger_rate": q,
                    # Fresh data every screening: 1-(1-q)^k; the same data: q, whatever k.
                    "ceiling": {
                        str(k): round(1 - (1 - q) ** k if variant == "sdcguard" else q, 3)
                        for k in SCREENINGS
                    },
                    "confirmed": _confirmed(outcomes),
                    "nodes": [o.as_json() for o in outcomes],
                }
                if variant == "sdcguard":
                    row[variant]["confirmed_fresh_data"] = _confirmed(outcomes, fresh=True)
            row["cpu_s"] = round(time.process_time() - t0, 1)
            rows.append(row)
            loads.append(os.getloadavg()[0])
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
            "load_avg_1m": {
                "start": round(loads[0], 2),
                "end": round(os.getloadavg()[0], 2),
                "min": round(min(loads), 2),
                "max": round(max(loads), 2),
            },
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
        "mode": {
            "budget_s": mode.budget,
            "nodes": mode.nodes,
            "golden_nodes": mode.nodes_of("golden"),
            "screenings": mode.screenings,
        },
        "rounds": rounds,
        "baseline_rounds": dict(bench.shapes("sdcguard").baseline_rounds),
        "schedule": {
            "first": START.isoformat(),
            "node_offset_s": NODE_OFFSET.total_seconds(),
            "interval_s": INTERVAL.total_seconds(),
            "confirm_after_s": CONFIRM_AFTER.total_seconds(),
        },
        "probe_plan": plan,
        "profiles": rows,
        "check_runs": bench.runs,
        "runtime": {
            "wall_s": round(time.perf_counter() - wall0, 1),
            "cpu_s": round(usage.ru_utime + usage.ru_stime + kids.ru_utime + kids.ru_stime, 1),
        },
    }


def _span(docs: list[dict[str, Any]]) -> float:
    """Seconds from the earliest part's start to the latest part's end (``generated_at``
    is when a part ended): parts may run side by side or one after the other."""
    ends = [dt.datetime.strptime(d["generated_at"], "%Y-%m-%dT%H:%M:%SZ").timestamp() for d in docs]
    starts = [end - float(d["runtime"]["wall_s"]) for end, d in zip(ends, docs, strict=True)]
    return round(max(ends) - min(starts), 1)


def merge(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """One document from runs of different checks (``--checks``), e.g. run side by side.

    Each part planned sdcguard's rounds with its own probe run; every row keeps its
    part's rounds, and ``probe_plans`` says which plan each check's rows come from. The
    wall time runs from the first part's start to the last part's end (each part's own
    is kept in ``runtime.parts``), CPU seconds add up."""
    if not docs:
        raise ValueError("nothing to merge")
    by_check: dict[str, dict[str, Any]] = {}
    for doc in docs:
        for check in {row["check"] for row in doc["profiles"]}:
            if check in by_check:
                raise ValueError(f"two documents have {check} profiles; merge distinct checks")
            by_check[check] = doc
    checks = [c for c in CHECK_NAMES if c in by_check]
    loads = [d["machine"]["load_avg_1m"] for d in docs]
    first = docs[0]
    out = dict(first)
    out["generated_at"] = max(d["generated_at"] for d in docs)
    out["machine"] = dict(first["machine"])
    out["machine"]["load_avg_1m"] = {
        "start": min(x["start"] for x in loads),
        "end": max(x["end"] for x in loads),
        "min": min(x["min"] for x in loads),
        "max": max(x["max"] for x in loads),
    }
    out["mode"] = dict(by_check[checks[0]]["mode"])
    if "golden" in by_check:
        out["mode"]["golden_nodes"] = by_check["golden"]["mode"]["golden_nodes"]
    out["rounds"] = {v: {c: by_check[c]["rounds"][v][c] for c in checks} for v in VARIANTS}
    out.pop("probe_plan", None)
    out["probe_plans"] = [
        {"checks": [c for c in checks if by_check[c] is d], "plan": d["probe_plan"]} for d in docs
    ]
    out["profiles"] = [r for c in checks for r in by_check[c]["profiles"] if r["check"] == c]
    out["check_runs"] = sum(d["check_runs"] for d in docs)
    out["runtime"] = {
        "wall_s": _span(docs),
        "cpu_s": round(sum(d["runtime"]["cpu_s"] for d in docs), 1),
        "parts": [
            {"checks": [c for c in checks if by_check[c] is d], **d["runtime"]} for d in docs
        ],
    }
    return out


def _plans_note(doc: dict[str, Any]) -> str:
    """Which probe plan sdcguard's rounds come from (a merged document), and what the
    fixed rounds of the probe before the plan would cost at the round costs measured."""
    parts = [p for p in doc.get("probe_plans", []) if p["plan"] is not None]
    if not parts and doc.get("probe_plan") is not None:
        parts = [{"checks": [r["check"] for r in doc["profiles"]], "plan": doc["probe_plan"]}]
    notes = []
    if len(parts) > 1:
        each = " and ".join(f"{'/'.join(p['checks'])} from another" for p in parts[1:])
        notes.append(
            f" (sdcguard's {'/'.join(parts[0]['checks'])} rounds from one probe run's plan, "
            f"{each}, each made under the load at its part's start)"
        )
    today = doc["rounds"]["today"]
    # Compute and golden keep the shapes of the probe before the plan (fp16 GEMMs aside).
    costs = [
        f"{c} {today[c] * p['plan']['round_ms'][c] / 1000:.1f} s"
        for p in parts
        for c in ("compute", "golden")
        if c in p["checks"] and c in today and c in p["plan"].get("round_ms", {})
    ]
    if costs:
        notes.append(
            ". At the round costs those plans measured, the fixed rounds of the probe "
            f"before the plan would take {', '.join(costs)} (its budget: "
            f"{doc['mode']['budget_s']:g} s)."
        )
    return "".join(notes)


def _parts_wall(doc: dict[str, Any]) -> str:
    parts = doc["runtime"].get("parts", [])
    if len(parts) < 2:
        return ""
    return " (" + ", ".join(f"{'/'.join(p['checks'])} {p['wall_s']} s" for p in parts) + ")"


def markdown(doc: dict[str, Any]) -> str:
    """The tables of screenings.md."""
    mode, rounds, load = doc["mode"], doc["rounds"], doc["machine"]["load_avg_1m"]
    sched = doc["schedule"]
    lines = [
        "# Intermittent and data-dependent faults over repeated screenings",
        "",
        f"Generated {doc['generated_at']} by `python -m bench.detection.screenings` "
        f"(budget {mode['budget_s']:g} s, {mode['nodes']} nodes per profile"
        + (f", golden {g}" if (g := mode["golden_nodes"]) != mode["nodes"] else "")
        + ", "
        f"{mode['screenings']} screenings each; {doc['check_runs']} check runs, "
        f"{doc['runtime']['wall_s']} s wall{_parts_wall(doc)}, {doc['runtime']['cpu_s']} s CPU on "
        f"{doc['machine']['cpus']} shared cores, load average (1 min) {load['min']:g}-"
        f"{load['max']:g}). How it works: see the docstring of "
        "`bench/detection/screenings.py`.",
        "",
        "Rounds per screening: "
        + "; ".join(
            f"{v}: " + ", ".join(f"{c} {n}" for c, n in rounds[v].items()) for v in VARIANTS
        )
        + _plans_note(doc),
        "",
        "Seeds: sdcguard's first "
        + ", ".join(f"{c} {n}" for c, n in doc["baseline_rounds"].items())
        + " rounds (what a baseline covers) use the operator's fixed baseline seed, "
        "every later round the test's own data seed (both as the operator sets "
        f"them); a node is screened every {sched['interval_s'] / 3600:g} h; a "
        "confirmation re-run "
        f"{sched['confirm_after_s'] / 60:g} min after a first SDC verdict repeats its data "
        "seed. Today: seed 0 for everything.",
        "",
        "Detection = share of nodes with an SDC verdict within k screenings (k = 1 / 3 / "
        "10); ceiling = 1-(1-p)^(rounds x k) for intermittent faults, 1-(1-q)^k with fresh "
        "data (q: the measured share of screenings whose data trigger the defect) and q "
        "with the same data. Confirmed = share of the flagged nodes whose first verdict's "
        "re-run failed again (quarantined at once; the rest stay held as Flaky); for "
        "intermittent faults its ceiling is 1-(1-p)^rounds, for data-dependent ones "
        "sdcguard's re-run with fresh data instead is shown in brackets.",
        "",
        "| check | fault | sdcguard | ceiling | confirmed | today (seed 0) | ceiling | confirmed |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def cells(d: dict[str, float]) -> str:
        return " / ".join(f"{d[str(k)]:.2f}" for k in SCREENINGS)

    def share(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    for row in doc["profiles"]:
        new, old = row["sdcguard"], row["today"]
        if row["kind"] == "intermittent":
            fault = f"intermittent p={row['p']}"
            conf_new = f"{share(new['confirmed'])} (of {new['confirm_ceiling']:.2f})"
            conf_old = f"{share(old['confirmed'])} (of {old['confirm_ceiling']:.2f})"
        else:
            fault = (
                f"data-dependent ({row['mask_bits']}-bit pattern, 1 lane in "
                f"{row['lane_stride']}; triggers {new['trigger_rate']:.2f} / "
                f"{old['trigger_rate']:.2f})"
            )
            conf_new = f"{share(new['confirmed'])} ({share(new['confirmed_fresh_data'])})"
            conf_old = share(old["confirmed"])
        lines.append(
            f"| {row['check']} | {fault} | **{cells(new['detection'])}** | "
            f"{cells(new['ceiling'])} | {conf_new} | {cells(old['detection'])} | "
            f"{cells(old['ceiling'])} | {conf_old} |"
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
    parser.add_argument(
        "--golden-nodes", type=int, default=None, help="nodes per golden profile (default: --nodes)"
    )
    parser.add_argument(
        "--checks",
        default=",".join(CHECK_NAMES),
        help="comma-separated checks whose profiles run (default: all)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        metavar="JSON",
        help="write one document from screenings.json files of distinct --checks runs",
    )
    args = parser.parse_args(argv)
    if args.merge:
        doc = merge([json.loads(path.read_text()) for path in args.merge])
        for path in write(doc, args.out):
            print(f"wrote {path}", flush=True)
        return 0
    checks = tuple(c for c in args.checks.split(",") if c)
    if unknown := sorted(set(checks) - set(CHECK_NAMES)):
        known = ", ".join(CHECK_NAMES)
        parser.error(f"--checks: unknown {', '.join(unknown)}; choose from {known}")
    mode = MODES[args.mode]
    mode = Mode(
        budget=mode.budget,
        nodes=args.nodes or mode.nodes,
        screenings=mode.screenings,
        golden_nodes=args.golden_nodes,
    )
    doc = run_screenings(mode, progress=lambda s: print(s, flush=True), checks=checks)
    for path in write(doc, args.out):
        print(f"wrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
