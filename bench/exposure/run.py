"""Exposure benchmark: the hours a corrupting node serves work before quarantine, per
policy, from a simulated fleet scheduled by the operator's own pure code.

    python -m bench.exposure.run [--nodes 2000] [--days 180] [--seed 1] [--jobs N] [--out DIR]

Every policy sees the same fleet model (``sim.Model``: workloads, fault onsets,
reports, repairs); what changes is the policy or the order. Exposure per fault is the
hours from its onset to its quarantine during which the node held work; a fault not
caught by the horizon counts its hours up to the horizon (so its exposure is a lower
bound) and is also counted as never caught. The policies' simulations are independent
and run side by side, one process per CPU (``--jobs``).
Results: ``bench/results/exposure.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.exposure.sim import Model, Outcome, Policy, simulate
from sdcguard.api import SDCPolicySpec
from sdcguard.api.policy import Budgets, Repair, Triggers
from sdcguard.domain.fleetstats import FaultClass, exposure_estimate
from sdcguard.domain.risk import RiskOrder, TypeHistory

RESULTS = Path(__file__).resolve().parents[1] / "results"
#: The risk order must cut mean exposure by this much at equal screening node-hours.
TARGET_CUT = 0.30


def policies(quick: bool = False) -> list[tuple[Policy, str]]:
    """The compared policies, each with what it is."""
    defaults = SDCPolicySpec()
    recommended = defaults.model_copy(
        update={
            "budgets": Budgets(
                max_concurrent_tests=4,
                max_unavailable="10%",
                pool_label="node.kubernetes.io/instance-type",
            ),
            "repair": Repair(max_repair_cycles=3),
        }
    )
    triggers = defaults.triggers
    no_return = defaults.model_copy(
        update={
            "triggers": triggers.model_copy(
                update={
                    "on_return_from_use": triggers.on_return_from_use.model_copy(
                        update={"enabled": False}
                    )
                }
            )
        }
    )
    no_expiry = defaults.model_copy(
        update={"triggers": Triggers(max_qualification_age="0")},
    )
    wider = defaults.model_copy(
        update={"budgets": defaults.budgets.model_copy(update={"max_concurrent_tests": 4})}
    )
    chosen = [
        (Policy("defaults", defaults), "today's defaults, today's order"),
        (Policy("defaults, risk order", defaults, risk=True), "today's defaults, risk order"),
        (
            Policy("recommended", recommended, pools=True),
            "the policies guide's example: 4 tests per pool, pools by instance type, "
            "3 repair cycles",
        ),
        (Policy("no return-from-use", no_return), "defaults, onReturnFromUse off"),
        (Policy("no expiry", no_expiry), "defaults, maxQualificationAge 0"),
        (Policy("no training library", defaults, library=False), "defaults, no job runs sdctrain"),
        (Policy("4 tests", wider), "defaults with maxConcurrentTests 4, today's order"),
        (Policy("4 tests, risk order", wider, risk=True), "maxConcurrentTests 4, risk order"),
    ]
    return chosen[:2] if quick else chosen


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def compare(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Risk order against today's order at the defaults' budget (equal node-hours: both
    spend what the budget allows)."""
    today = next(r for r in rows if r["policy"] == "defaults")
    risk = next(r for r in rows if r["policy"] == "defaults, risk order")
    mean = _ratio(risk["exposure_mean_h"], today["exposure_mean_h"])
    p95 = _ratio(risk["exposure_p95_h"], today["exposure_p95_h"])
    hours = _ratio(risk["screening_node_hours"], today["screening_node_hours"])
    met = mean is not None and p95 is not None and mean <= 1 - TARGET_CUT and p95 <= 1.0
    # No order can remove the hours a fault serves before the job running at its onset
    # ends: the node is screened only between jobs. What is left is what order can cut.
    floor = today["floor_mean_h"]
    reducible = today["exposure_mean_h"] - floor
    cut = today["exposure_mean_h"] - risk["exposure_mean_h"]
    return {
        "floor_mean_h": floor,
        "floor_share": _ratio(floor, today["exposure_mean_h"]),
        "reducible_cut": _ratio(cut, reducible) if reducible > 0 else None,
        "best_possible_ratio": _ratio(floor, today["exposure_mean_h"]),
        "mean_ratio": mean,
        "p95_ratio": p95,
        "node_hours_ratio": hours,
        "target": f"mean exposure at most {1 - TARGET_CUT:.2f} of today's order, p95 no worse",
        "met": met,
    }


def _estimate(outcome: Outcome, model: Model) -> dict[str, Any]:
    """The fleet-figure estimate of exposure from what the run measured: the mean
    screening interval per node, the busy share, and per fault kind, on nodes with and
    without the training library, its catch chance and report rate at the kind's mean
    activity."""
    hours_between = outcome.horizon / max(outcome.screenings, 1)
    mean_active = 0.225  # the mean of the uniform activity draw (0.05 to 0.4)
    reports = model.report_rate
    kinds = dict(model.kinds)
    per_kind = [
        (kinds["persistent"], 1.0, reports),
        (
            kinds["intermittent"],
            mean_active * outcome.catch["intermittent_round_p"],
            reports * mean_active,
        ),
        (
            kinds["data-dependent"],
            mean_active * outcome.catch["data_round_p"],
            reports * mean_active,
        ),
    ]
    # A fault on a node whose jobs run without the library is never reported.
    classes = [
        FaultClass(share * part, catch, rate if library else 0.0)
        for share, catch, rate in per_kind
        for library, part in ((True, model.library_share), (False, 1 - model.library_share))
    ]
    est = exposure_estimate(hours_between, outcome.busy_hours / outcome.horizon, classes)
    return {
        "hours_between_screenings": round(hours_between, 1),
        "estimate_h": round(est.hours, 1),
        "note": est.explain(),
    }


def _types(outcome: Outcome) -> list[dict[str, Any]]:
    rows = []
    for kind, history in sorted(outcome.history.items()):
        h = TypeHistory(*history)
        low, high = h.interval
        rows.append(
            {
                "type": kind,
                "screenings": h.screenings,
                "failures": h.failures,
                "rate": round(h.per_screening, 5),
                "low": round(low, 5),
                "high": round(high, 5),
            }
        )
    return rows


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for order, marker in (("today's order", "o"), ("risk order", "s")):
        points = [r for r in rows if r["order"] == order]
        ax.plot(
            [r["screening_node_hours"] for r in points],
            [r["exposure_mean_h"] for r in points],
            marker=marker,
            label=order,
            linestyle="none",
        )
        for r in points:
            ax.annotate(r["policy"], (r["screening_node_hours"], r["exposure_mean_h"]), fontsize=7)
    ax.set_xlabel("screening node-hours over the horizon")
    ax.set_ylabel("mean exposure per fault (hours of work)")
    ax.set_title("Exposure against screening spent, per policy")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _markdown(doc: dict[str, Any]) -> str:
    lines = [
        "# Exposure benchmark",
        "",
        f"`{doc['command']}`: {doc['model']['nodes']} nodes over {doc['model']['days']} "
        f"days, {doc['wall_s']} s of wall time. Exposure per fault: hours from onset "
        "to quarantine while the node held work (faults not caught by the horizon count "
        "their hours so far).",
        "",
        "| policy | faults | mean h | p50 h | p95 h | never caught | screening node-h "
        "| false quarantines | mean vs defaults |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["policies"]:
        lines.append(
            f"| {r['policy']} | {r['faults']} | {r['exposure_mean_h']} | {r['exposure_p50_h']} "
            f"| {r['exposure_p95_h']} | {r['never_caught']} | {r['screening_node_hours']} "
            f"| {r['false_quarantines']} | {r['mean_vs_defaults']} |"
        )
    c = doc["risk_vs_today"]
    lines += [
        "",
        f"Risk order against today's order at the defaults' budget: mean x{c['mean_ratio']}, "
        f"p95 x{c['p95_ratio']}, screening node-hours x{c['node_hours_ratio']}; "
        f"target ({c['target']}) met: {c['met']}. Hours no order can remove (served "
        f"before the job running at onset ended): {c['floor_mean_h']} h a fault on average, "
        f"x{c['floor_share']} of today's mean; the risk order removed x{c['reducible_cut']} "
        "of the rest.",
        "",
        f"Estimate from the fleet figures for the defaults: {doc['estimate']['note']}.",
        "",
    ]
    return "\n".join(lines)


def _simulate_timed(model: Model, policy: Policy, seed: int) -> tuple[Outcome, float]:
    """One policy's simulation and its wall seconds (run in a worker process)."""
    t0 = time.monotonic()
    outcome = simulate(model, policy, seed)
    return outcome, time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--days", type=float, default=180.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="defaults and risk order only")
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="simulations run side by side"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    model = Model(nodes=args.nodes, days=args.days)
    started = time.monotonic()
    outcomes: dict[str, Outcome] = {}
    walls: dict[str, float] = {}
    chosen = policies(args.quick)
    print(
        f"[exposure] {len(chosen)} policies, {args.nodes} nodes over {args.days:g} days, "
        f"{args.jobs} at a time",
        file=sys.stderr,
        flush=True,
    )
    with concurrent.futures.ProcessPoolExecutor(max_workers=args.jobs) as pool:
        running = {
            pool.submit(_simulate_timed, model, policy, args.seed): policy.name
            for policy, _ in chosen
        }
        for done in concurrent.futures.as_completed(running):
            outcome, wall = done.result()
            outcomes[outcome.policy], walls[outcome.policy] = outcome, wall
            print(
                f"[exposure] {outcome.policy} done in {wall:.0f}s "
                f"({len(outcomes)}/{len(chosen)}; waiting on "
                f"{' | '.join(n for f, n in running.items() if not f.done()) or 'nothing'})",
                file=sys.stderr,
                flush=True,
            )
    rows = []
    for policy, what in chosen:
        row = {"description": what, **outcomes[policy.name].summary()}
        row["wall_s"] = round(walls[policy.name], 1)
        rows.append(row)
    base = rows[0]
    for row in rows:
        row["mean_vs_defaults"] = _ratio(row["exposure_mean_h"], base["exposure_mean_h"])
        row["p95_vs_defaults"] = _ratio(row["exposure_p95_h"], base["exposure_p95_h"])
    sweep = [
        {
            "policy": r["policy"],
            "order": "risk order" if "risk order" in r["policy"] else "today's order",
            "screening_node_hours": r["screening_node_hours"],
            "exposure_mean_h": r["exposure_mean_h"],
        }
        for r in rows
    ]
    defaults = outcomes["defaults"]
    doc: dict[str, Any] = {
        "benchmark": "exposure",
        "command": "python -m bench.exposure.run " + " ".join(argv or sys.argv[1:]),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_avg_1m": round(os.getloadavg()[0], 2),
        },
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wall_s": round(time.monotonic() - started, 1),
        "seed": args.seed,
        "model": {
            **{k: v for k, v in asdict(model).items() if k not in ("types", "kinds", "round_ms")},
            "types": [asdict(t) for t in model.types],
            "kinds": dict(model.kinds),
            "round_ms": dict(model.round_ms),
        },
        "risk_order": asdict(RiskOrder()),
        "catch": {k: round(v, 6) for k, v in defaults.catch.items()},
        "policies": rows,
        "risk_vs_today": compare(rows),
        "sweep": sweep,
        "estimate": {
            **_estimate(defaults, model),
            "simulated_mean_h": base["exposure_mean_h"],
        },
        "types_measured": _types(defaults),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "exposure.json").write_text(json.dumps(doc, indent=2) + "\n")
    (args.out / "exposure.md").write_text(_markdown(doc))
    _plot(sweep, args.out / "exposure.png")
    print(_markdown(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
