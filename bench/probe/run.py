"""How the probe uses its budget: plan, rounds, catch chances, peaks; wall and CPU seconds.

    python -m bench.probe.run [--budgets 15,60] [--devices cpu,xla] [--cpu-devices 2]

Runs the real probe (worker processes and all) the way ``sdcprobe run`` does and
writes ``bench/results/probe.json``: for every budget the total wall time and
its share of the budget, the plan (start-up, planned seconds, rounds planned and
run, the measured cost of a round, 1-(1-p)^rounds for p = 0.01/0.05/0.1), the
CPU seconds of the probe and its workers, per check the slowest device's wall
time and the CPU seconds summed over devices, and the near-peak ratios (compute
GEMMs against the same run's peak GEMM throughput, all-reduce bus bandwidth
against the best of a size sweep, memory passes against a plain copy). The
targets of issue 18 are checked for the default budget (60 s) and printed. One
more CPU run (``--slowdown-budget``, 30 s) slows its memory rounds down three
times in the middle of the check, after the plan was made: it too must end at
or under its budget.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from sdcprobe.faultspec import Fault, FaultSpec
from sdcprobe.runner import RunOptions, run_probe

RESULTS = Path(__file__).resolve().parent.parent / "results" / "probe.json"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _children_cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


#: The slow-down run: from round 8 on, every memory round waits 50 ms per block
#: (about three times its cost), after the plan was made from fast warm-up rounds.
SLOWDOWN = FaultSpec(faults=[Fault(site="memory", mode="delay", delay_s=0.05, onset_step=8)])


def measure(
    device: str,
    budget: float,
    cpu_devices: int,
    checks: list[str],
    faults: FaultSpec | None = None,
) -> dict[str, Any]:
    """One probe run: verdict, total wall/CPU, per-check wall (slowest device) and CPU (sum)."""
    load = os.getloadavg()[0]  # other work on the machine stretches wall time
    cpu0, wall0 = _children_cpu(), time.perf_counter()
    run = run_probe(
        RunOptions(
            device=device,
            budget=budget,
            cpu_devices=cpu_devices,
            checks=checks,
            faults=faults,
            started=wall0,
        )
    )
    wall, cpu = time.perf_counter() - wall0, _children_cpu() - cpu0
    per_check: dict[str, Any] = {}
    worker_walls = []
    for name in checks:
        traces = [
            r.checks[name] for r in run.reports.values() if r is not None and name in r.checks
        ]
        per_check[name] = {
            "wall_s": round(max((t.wall_s for t in traces), default=0.0), 3),
            "cpu_s": round(sum(t.cpu_s for t in traces), 3),
            "verdict": run.result.checks[name].verdict,
            "metrics": run.result.checks[name].metrics,
        }
    for report in run.reports.values():
        if report is not None:
            worker_walls.append(report.wall_s)
    checks_wall = sum(c["wall_s"] for c in per_check.values())
    plan = run.result.plan.model_dump(mode="json") if run.result.plan is not None else None
    return {
        "device": device,
        "slowdown": faults is not None,
        "budget_s": budget,
        "cpu_devices": cpu_devices,
        "verdict": run.result.verdict,
        "load_avg_1m_before": round(load, 2),
        "load_avg_1m_after": round(os.getloadavg()[0], 2),
        "wall_s": round(wall, 3),
        "budget_used": round(wall / budget, 3),
        "cpu_s": round(cpu, 3),
        "plan": plan,
        # Process start, imports and device setup: what the checks' own time does not cover.
        "startup_s": round(wall - checks_wall, 3),
        "worker_wall_s": round(max(worker_walls, default=0.0), 3),
        "checks": per_check,
        "config": run.config.model_dump(mode="json"),
    }


def _ratio(metrics: dict[str, Any], key: str) -> float | None:
    value = metrics.get(key)
    return float(value) if isinstance(value, int | float) else None


def _only_minimum(run: dict[str, Any]) -> bool:
    """Whether the run's last check ran only the rounds every plan runs."""
    plan = run["plan"] or {}
    ran = plan.get("run") or {}
    last = [c for c in run["checks"] if c in ran][-1:] or [None]
    minimum = run["config"]["baseline_rounds"]
    return last[0] is not None and ran[last[0]] <= minimum.get(last[0], 0)


def _targets(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 18's targets, on the CPU run at the default budget (60 s), if there is one."""
    default = [
        r for r in runs if r["device"] == "cpu" and r["budget_s"] == 60.0 and not r["slowdown"]
    ]
    if not default:
        return []
    run = default[0]
    # Every run ends at or under its budget, slowed down or not, except where the rounds
    # that always run no longer fitted (start-up ate the budget; the last check then
    # ran only its minimum): those are listed, not counted.
    planned = [r for r in runs if r["plan"] and not r["plan"].get("error")]
    minimal = [r for r in planned if _only_minimum(r)]
    planned = [r for r in planned if not _only_minimum(r)]
    plan = run["plan"] or {}
    catch = plan.get("catch") or {}
    low = min((c[2] for c in catch.values()), default=0.0)
    peak = _ratio(run["checks"].get("compute", {}).get("metrics", {}), "peak_ratio_min")
    return [
        {
            "target": "budget used within a few percent, never over it",
            "met": plan.get("planned_s", 1e9) <= run["budget_s"]
            and 0.95 <= run["budget_used"] <= 1.0,
            "detail": f"wall {run['wall_s']:.1f}s of {run['budget_s']:g}s "
            f"({100 * run['budget_used']:.1f}%), planned {plan.get('planned_s')}s",
        },
        {
            "target": "every run, the slowed-down one included, ends at or under its budget",
            "met": all(r["budget_used"] <= 1.0 for r in planned),
            "detail": ", ".join(
                f"{r['device']} {r['budget_s']:g}s{' slowed' if r['slowdown'] else ''}: "
                f"{100 * r['budget_used']:.1f}%"
                for r in planned
            )
            + "".join(
                f"; {r['device']} {r['budget_s']:g}s ran only the minimum after "
                f"{r['plan']['startup_s']:.1f}s of start-up: {100 * r['budget_used']:.1f}%"
                for r in minimal
            ),
        },
        {
            "target": "every check catches a fault active in 10% of rounds with >= 0.99",
            "met": low >= 0.99,
            "detail": ", ".join(f"{c} {v[2]:.4f}" for c, v in catch.items()),
        },
        {
            "target": "compute GEMMs at >= 0.7 of the same run's peak, every dtype",
            "met": peak is not None and peak >= 0.7,
            "detail": str(run["checks"].get("compute", {}).get("metrics", {}).get("peak_ratio")),
        },
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write the results file."""
    parser = argparse.ArgumentParser(prog="bench.probe.run", description=__doc__)
    parser.add_argument("--budgets", default="15,60", help="comma-separated budgets in seconds")
    parser.add_argument(
        "--devices", default="cpu,xla", help="backends to time (xla runs on PJRT CPU here)"
    )
    parser.add_argument("--xla-budgets", default="15", help="budgets for the xla backend")
    parser.add_argument(
        "--slowdown-budget",
        type=float,
        default=30.0,
        help="budget of a CPU run whose memory rounds get slower mid-run (0: none)",
    )
    parser.add_argument("--cpu-devices", type=int, default=2)
    parser.add_argument("--checks", default="compute,collective,memory,golden")
    parser.add_argument("--repeat", type=int, default=1, help="runs per budget (median reported)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    # torch-xla runs on the host CPU here unless the environment names a device.
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    checks = args.checks.split(",")
    runs = []
    plan = [
        (device, float(b))
        for device in args.devices.split(",")
        for b in (args.xla_budgets if device == "xla" else args.budgets).split(",")
    ]
    runs_to_make: list[tuple[str, float, FaultSpec | None]] = [(d, b, None) for d, b in plan]
    if args.slowdown_budget > 0 and "memory" in checks:
        runs_to_make.append(("cpu", args.slowdown_budget, SLOWDOWN))
    for device, budget, faults in runs_to_make:
        trials = [
            measure(device, budget, args.cpu_devices, checks, faults) for _ in range(args.repeat)
        ]
        best = sorted(trials, key=lambda t: t["wall_s"])[len(trials) // 2]
        best["wall_s_all"] = [t["wall_s"] for t in trials]
        best["wall_s_median"] = statistics.median(best["wall_s_all"])
        runs.append(best)
        per = ", ".join(f"{n} {c['wall_s']:.1f}s" for n, c in best["checks"].items())
        print(
            f"budget {budget:g}s on {args.cpu_devices} {device} device(s)"
            f"{' slowed down' if faults else ''}: {best['verdict']} in {best['wall_s']:.1f}s "
            f"wall ({100 * best['budget_used']:.1f}%), {best['cpu_s']:.1f}s CPU ({per}); "
            f"load {best['load_avg_1m_before']} -> {best['load_avg_1m_after']}",
            file=sys.stderr,
        )
    targets = _targets(runs)
    for t in targets:
        print(f"target {'met' if t['met'] else 'MISSED'}: {t['target']} ({t['detail']})",
              file=sys.stderr)  # fmt: skip
    doc = {
        "benchmark": "probe",
        "command": "python -m bench.probe.run "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": {
            "cpus": os.cpu_count(),
            "cpu_model": _cpu_model(),
            "load_avg_1m": round(os.getloadavg()[0], 2),
            "python": platform.python_version(),
        },
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "runs": runs,
        "targets": targets,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    return 0 if all(r["verdict"] == "pass" for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
