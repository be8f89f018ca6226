"""``make bench-training``: sdctrain in a CPU gloo group, faults on one rank.

1. Detection and attribution: 3 ranks train a small MLP with Adam for ``steps``
   steps; one fault site at a time fires on rank 1 with a per-step probability.
   The guard (consensus every 5 steps, audits at the 5% budget and, as the
   mechanism's ceiling, every step) is compared with a digest-after-reduction
   baseline run on the same seeds: reduced gradients and updated parameters
   digested on every rank after every step, odd replica by majority.
2. Overhead: 2 ranks, a larger MLP; the same loop without the guard and with it
   at audit budgets of 1%, 2% and 5%, interleaved in one run, twice.

Writes bench/results/training.{json,md,png}. CPU only: no accelerator was used.
``--steps``, ``--seeds``, ``--overhead-steps`` and ``--reps`` size it (the defaults
take minutes on a CPU).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from bench.training.harness import Trial, run_trials

RESULTS = Path(__file__).resolve().parents[1] / "results"
SITES = {
    "forward": "matmul",
    "backward": "grad.weight",
    "optimizer": "optimizer",
    "weights at rest": "param",
}
RATES = (0.1, 0.3)
SETTINGS: dict[str, dict[str, Any]] = {
    "budget 5%": {"audit_budget": 0.05, "consensus_every": 5},
    "audit every step": {"audit_every": 1, "consensus_every": 5},
}
BUDGETS = (0.01, 0.02, 0.05)


def _fault(site: str, rate: float, seed: int) -> dict[str, Any]:
    return {
        "site": site,
        "rate": 1e-3 if site in ("matmul", "grad.weight") else 1e-2,
        "onset_step": 3,
        "step_probability": rate,
        "seed": 100 + seed,
    }


def detection_trials(steps: int, seeds: int) -> list[Trial]:
    trials = []
    for label, site in SITES.items():
        for rate in RATES:
            for seed in range(seeds):
                fault = _fault(site, rate, seed)
                for setting, cfg in SETTINGS.items():
                    trials.append(
                        Trial(
                            f"{label}|{rate}|{seed}|{setting}",
                            steps=steps,
                            fault=fault,
                            seed=seed,
                            config={**cfg, "on_persistent": "continue"},
                        )
                    )
                trials.append(
                    Trial(
                        f"{label}|{rate}|{seed}|baseline",
                        steps=steps,
                        fault=fault,
                        seed=seed,
                        guard=False,
                        baseline=True,
                    )
                )
    for seed in range(seeds):  # healthy runs: false alarms
        trials.append(
            Trial(
                f"healthy|0|{seed}|audit every step",
                steps=steps,
                seed=seed,
                config={"audit_every": 1, "consensus_every": 5},
            )
        )
        trials.append(
            Trial(f"healthy|0|{seed}|baseline", steps=steps, seed=seed, guard=False, baseline=True)
        )
    return trials


def overhead_trials(steps: int, reps: int) -> list[Trial]:
    shape: dict[str, Any] = {"width": 256, "depth": 4, "batch": 64, "steps": steps}
    trials = []
    for rep in range(reps):
        trials.append(Trial(f"none|{rep}", guard=False, **shape))
        trials.append(
            Trial(f"consensus|{rep}", config={"audit_budget": 0, "consensus_every": 50}, **shape)
        )
        for budget in BUDGETS:
            trials.append(
                Trial(
                    f"{budget}|{rep}",
                    config={"audit_budget": budget, "consensus_every": 50},
                    **shape,
                )
            )
    return trials


def _summarise_detection(
    trials: list[Trial], results: list[list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    cells: dict[tuple[str, str, str], dict[str, Any]] = {}
    for trial, ranks in zip(trials, results, strict=True):
        label, rate, _seed, setting = trial.name.split("|")
        cell = cells.setdefault(
            (label, rate, setting),
            {
                "site": label,
                "rate": float(rate),
                "setting": setting,
                "trials": 0,
                "fired": 0,
                "detected": 0,
                "correct": 0,
                "wrong": 0,
                "steps_to_detection": [],
            },
        )
        cell["trials"] += 1
        first_hit = ranks[trial.faulty_rank]["first_hit_step"]
        if trial.fault is not None and first_hit is None:
            continue
        cell["fired"] += 1
        if setting == "baseline":
            flagged = ranks[0]["baseline"]
            named = [b["rank"] for b in flagged]
            first = flagged[0]["step"] if flagged else None
        else:
            found = ranks[0]["detections"]
            named = [d["rank"] for d in found]
            first = found[0]["step"] if found else None
        if first is None:
            continue
        cell["detected"] += 1
        cell["correct"] += named[0] == trial.faulty_rank if trial.fault else 0
        cell["wrong"] += named[0] != trial.faulty_rank or trial.fault is None
        if first_hit is not None:
            cell["steps_to_detection"].append(first - first_hit)
    rows = []
    for cell in cells.values():
        ttd = cell.pop("steps_to_detection")
        cell["steps_to_detection_median"] = statistics.median(ttd) if ttd else None
        rows.append(cell)
    return rows


def _summarise_overhead(
    trials: list[Trial], results: list[list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    by_rep: dict[str, dict[str, float]] = {}
    cpu_by_rep: dict[str, dict[str, float]] = {}
    audits: dict[str, list[float]] = {}
    for trial, ranks in zip(trials, results, strict=True):
        config, rep = trial.name.split("|")
        # Wall: the slowest rank sets the pace. CPU: summed over ranks (waiting in a
        # collective costs none, so other processes' load matters less). Warm-up skipped.
        by_rep.setdefault(rep, {})[config] = max(statistics.fmean(r["times"][10:]) for r in ranks)
        cpu_by_rep.setdefault(rep, {})[config] = sum(
            statistics.fmean(r["cpu_times"][10:]) for r in ranks
        )
        if config != "none":
            total = sum(ranks[0]["times"])
            audits.setdefault(config, []).append(
                max(r["audit_seconds"] for r in ranks) / total if total else 0.0
            )
            audits.setdefault(config + ":count", []).append(float(ranks[0]["audits"]))
            checks = ranks[0]["consensus_checks"]
            audits.setdefault(config + ":consensus_ms", []).append(
                max(r["consensus_seconds"] for r in ranks) / checks * 1e3 if checks else 0.0
            )
    rows = []
    for key, budget in [("consensus", 0.0)] + [(str(b), b) for b in BUDGETS]:
        overheads = [rep[key] / rep["none"] - 1 for rep in by_rep.values()]
        cpu_overheads = [rep[key] / rep["none"] - 1 for rep in cpu_by_rep.values()]
        rows.append(
            {
                "budget": budget,
                "label": "consensus only" if key == "consensus" else f"{budget:.0%}",
                "consensus_ms_per_check": round(
                    statistics.median(audits[key + ":consensus_ms"]), 2
                ),
                "cpu_overhead": [round(o, 4) for o in cpu_overheads],
                "cpu_overhead_median": round(statistics.median(cpu_overheads), 4),
                "wall_overhead_median": round(statistics.median(overheads), 4),
                "step_ms_without": [round(rep["none"] * 1e3, 3) for rep in by_rep.values()],
                "step_ms_with": [round(rep[key] * 1e3, 3) for rep in by_rep.values()],
                "overhead": [round(o, 4) for o in overheads],
                "audit_time_share": [round(a, 4) for a in audits[key]],
                "audits": [int(a) for a in audits[key + ":count"]],
            }
        )
    return rows


def _markdown(doc: dict[str, Any]) -> str:
    lines = [
        "# Training-loop SDC detection (sdctrain), CPU gloo",
        "",
        f"Run {doc['date']} on {doc['machine']} (torch {doc['torch']}); "
        f"{doc['wall_seconds']:.0f} s wall. No accelerator: CPU ranks in a gloo group.",
        "",
        "## Detection and attribution (3 ranks, fault on rank 1)",
        "",
        f"{doc['detection_steps']} steps per trial, fault from step 3 with the given chance "
        "per step; consensus every 5 steps. *fired*: trials where the fault hit at least once. "
        "*named right*: the first detection named rank 1. Steps to detection: median from "
        "the first hit. Baseline: digests of the reduced gradients and updated parameters, "
        "compared across replicas after every step.",
        "",
        "| site | chance/step | setting | fired | detected | named right | named wrong "
        "| steps to detection |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["detection"]:
        ttd = (
            "-" if r["steps_to_detection_median"] is None else f"{r['steps_to_detection_median']:g}"
        )
        lines.append(
            f"| {r['site']} | {r['rate']:g} | {r['setting']} | {r['fired']}/{r['trials']} | "
            f"{r['detected']}/{r['fired']} | {r['correct']}/{r['fired']} | {r['wrong']} | {ttd} |"
        )
    lines += [
        "",
        "## Step-time overhead (2 ranks, MLP 4x256, batch 64)",
        "",
        f"{doc['overhead_steps']} steps per run, consensus every 50 steps; the same loop "
        f"without the guard in the same run, {doc['reps']} interleaved repetitions (one value "
        "per repetition, median in bold). CPU: per-step process CPU time summed over the "
        "ranks (time waiting in a collective costs none). Wall: mean step time of the slower "
        "rank. Both after 10 warm-up steps. The machine is shared, so wall times stretch "
        "with other people's load; CPU times less so. Audit time share: the guard's own "
        "measurement of its audit seconds over the run's seconds.",
        "",
        "| audit budget | CPU overhead | wall overhead | wall ms without / with "
        "| audit time share | audits | ms per consensus check |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in doc["overhead"]:
        lines.append(
            f"| {r['label']} | **{r['cpu_overhead_median']:+.1%}** "
            f"({', '.join(f'{o:+.1%}' for o in r['cpu_overhead'])}) | "
            f"**{r['wall_overhead_median']:+.1%}** "
            f"({', '.join(f'{o:+.1%}' for o in r['overhead'])}) | "
            f"{', '.join(map(str, r['step_ms_without']))} / "
            f"{', '.join(map(str, r['step_ms_with']))} | "
            f"{', '.join(f'{a:.1%}' for a in r['audit_time_share'])} | "
            f"{', '.join(map(str, r['audits']))} | {r['consensus_ms_per_check']} |"
        )
    lines += ["", "![training](training.png)", ""]
    return "\n".join(lines)


def _plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    settings = ["budget 5%", "audit every step", "baseline"]
    rows = [r for r in doc["detection"] if r["site"] != "healthy"]
    groups = sorted(
        {(r["site"], r["rate"]) for r in rows}, key=lambda g: (list(SITES).index(g[0]), g[1])
    )
    width = 0.8 / len(settings)
    for i, setting in enumerate(settings):
        values = []
        for g in groups:
            cell = next(
                (r for r in rows if (r["site"], r["rate"]) == g and r["setting"] == setting), None
            )
            values.append(cell["correct"] / cell["fired"] if cell and cell["fired"] else 0.0)
        ax1.bar([j + i * width for j in range(len(groups))], values, width, label=setting)
    ax1.set_xticks([j + width for j in range(len(groups))])
    ax1.set_xticklabels([f"{s}\np={r:g}" for s, r in groups], fontsize=7)
    ax1.set_ylabel("detected and named the faulty rank")
    ax1.set_ylim(0, 1.05)
    ax1.legend(fontsize=7)
    ax1.set_title("Attribution, fault on rank 1 of 3")
    audited = [r for r in doc["overhead"] if r["budget"] > 0]
    budgets = [r["budget"] * 100 for r in audited]
    ax2.plot(
        budgets,
        [r["cpu_overhead_median"] * 100 for r in audited],
        "o-",
        label="CPU-time overhead (median)",
    )
    ax2.plot(
        budgets,
        [r["wall_overhead_median"] * 100 for r in audited],
        "s-",
        label="wall-time overhead (median)",
    )
    ax2.plot(budgets, budgets, "k--", label="budget")
    ax2.set_xlabel("audit budget (% of step time)")
    ax2.set_ylabel("%")
    ax2.legend(fontsize=7)
    ax2.set_title("Overhead vs budget (2 CPU ranks)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--overhead-steps", type=int, default=100)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    start = time.time()
    det = detection_trials(args.steps, args.seeds)
    det_results = run_trials(det, world=3)
    over = overhead_trials(args.overhead_steps, args.reps)
    over_results = run_trials(over, world=2)
    doc = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} threads available, "
        f"{platform.processor() or 'cpu'}",
        "torch": torch.__version__,
        "device": "cpu (gloo); no accelerator used",
        "detection_steps": args.steps,
        "overhead_steps": args.overhead_steps,
        "reps": args.reps,
        "seeds": args.seeds,
        "detection": _summarise_detection(det, det_results),
        "overhead": _summarise_overhead(over, over_results),
        "wall_seconds": time.time() - start,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "training.json").write_text(json.dumps(doc, indent=1) + "\n")
    (args.out / "training.md").write_text(_markdown(doc))
    _plot(doc, args.out / "training.png")
    print(_markdown(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
