"""``probe.md`` and ``probe.png`` from ``probe.json``, with the figures before issue 38.

python -m bench.probe.report   # rewrites both from the stored results
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent.parent / "results" / "probe.json"


def _m(run: dict[str, Any], check: str, key: str) -> Any:
    return run.get("checks", {}).get(check, {}).get("metrics", {}).get(key)


def _catch5(run: dict[str, Any]) -> dict[str, float]:
    """Catch chance at p = 0.05 per check (the old results list it in ``catch``)."""
    plan = run.get("plan") or {}
    if plan.get("catch_chance"):
        return dict(plan["catch_chance"])
    probs = plan.get("catch_p") or []
    at = probs.index(0.05) if 0.05 in probs else None
    return {c: v[at] for c, v in (plan.get("catch") or {}).items() if at is not None}


def _by_budget(doc: dict[str, Any] | None, budget: float) -> dict[str, Any] | None:
    for run in (doc or {}).get("runs", []):
        if run["device"] == "cpu" and run["budget_s"] == budget and not run["slowdown"]:
            return run
    return None


def _row(label: str, run: dict[str, Any] | None) -> str:
    if run is None:
        return f"| {label} | - | - | - | - | - | - | - |"
    plan = run.get("plan") or {}
    catch = _catch5(run)
    low = min(catch.values()) if catch else None
    host = {c: _m(run, c, "host_bytes_per_round") for c in run.get("checks", {})}
    shown = ", ".join(f"{c} {v}" for c, v in host.items() if v is not None) or "not measured"
    return (
        f"| {label} | {run['verdict']} | {_m(run, 'compute', 'gemm_busy')} | "
        f"{_m(run, 'compute', 'peak_ratio_min')} | {_m(run, 'memory', 'read_vs_copy')} | "
        f"{plan.get('startup_s')} | {low if low is None else round(low, 4)} | {shown} |"
    )


def markdown(doc: dict[str, Any], before: dict[str, Any] | None) -> str:
    """The results page."""
    machine = doc.get("machine", {})
    lines = [
        "# Probe on the CPU: device-resident rounds, sustained stress, a stated catch chance",
        "",
        f"`make bench-probe` ({doc.get('command', '').strip()}), {machine.get('cpus')} CPU "
        f"cores ({machine.get('cpu_model')}), shared with other work (1-minute load average "
        f"{machine.get('load_avg_1m')} at the end; each run's load is in probe.json). Two CPU "
        "replicas, one thread each. Ratios are taken within one run; wall times are noisy.",
        "",
        "All figures here were measured on this CPU. No GPU figure is claimed: the CUDA "
        "path awaits a run of `bench/device/cuda-check.sh` on a GPU.",
        "",
        "| run | verdict | gemm_busy | peak ratio (min over dtypes) | read-back / copy | "
        "start-up s | catch at 5% (worst check) | host bytes per round |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for budget in (60.0, 120.0):
        lines.append(_row(f"before, {budget:g} s", _by_budget(before, budget)))
        lines.append(_row(f"now, {budget:g} s", _by_budget(doc, budget)))
    lines += ["", "## Targets (issue 38 and issue 18)", ""]
    for t in doc.get("targets", []):
        lines.append(f"- {'met' if t['met'] else '**missed**'}: {t['target']} ({t['detail']})")
    now = _by_budget(doc, 60.0)
    if now is not None:
        plan = now.get("plan") or {}
        lines += [
            "",
            "## The 60 s run in detail",
            "",
            f"- start-up parts (s): {plan.get('startup_parts')}",
            f"- rounds planned / run: {plan.get('rounds')} / {plan.get('run')}",
            f"- round cost (ms): {plan.get('round_ms')}",
            f"- catch target {plan.get('catch_target')} at {plan.get('catch_fraction')}: "
            f"{plan.get('rounds_needed')} rounds needed; planned to meet it: "
            f"{plan.get('planned_target_met')}; met: {plan.get('target_met')}; reached "
            f"{plan.get('catch_chance')}",
            f"- compute: gflops {_m(now, 'compute', 'gflops')}; peaks "
            f"{_m(now, 'compute', 'peak_gflops')}; ratios {_m(now, 'compute', 'peak_ratio')}; "
            f"GEMMs per dtype per round {_m(now, 'compute', 'repeats')}",
            f"- compute telemetry on this CPU: clocks {_m(now, 'compute', 'clock_mhz_min')}-"
            f"{_m(now, 'compute', 'clock_mhz_max')} MHz; absent: "
            f"{_m(now, 'compute', 'telemetry_absent')}",
            f"- memory: write / read-back / copy GB/s {_m(now, 'memory', 'write_gbps')} / "
            f"{_m(now, 'memory', 'read_gbps')} / {_m(now, 'memory', 'copy_gbps')}, dwell "
            f"{_m(now, 'memory', 'dwell_s')} s",
            "- host syncs per round: "
            + ", ".join(f"{c} {_m(now, c, 'host_syncs_per_round')}" for c in now["checks"]),
        ]
    sweep = doc.get("replicas") or []
    if sweep:
        lines += [
            "",
            "## Collective rounds against the number of devices (CPU replicas, gloo)",
            "",
            "| replicas | verdict | round ms | host share | host bytes per round | "
            "host syncs per round | all-reduce busbw GB/s | load before |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in sweep:
            lines.append(
                f"| {r['replicas']} | {r['verdict']} | {r['round_ms']} | {r['host_share']} | "
                f"{r['host_bytes_per_round']} | {r['host_syncs_per_round']} | "
                f"{r['allreduce_busbw_gbps']} | {r['load_avg_1m_before']} |"
            )
        lines += [
            "",
            "Eight replicas on two shared cores make every round slower (the processes take "
            "turns); what must not grow is the host's part: the bytes and syncs per round "
            "are the same at every count, and each rank draws only its own input.",
        ]
    return "\n".join(lines) + "\n"


def plot(doc: dict[str, Any], before: dict[str, Any] | None, path: Path) -> None:
    """Before/after bars of the stress ratios and the catch chance at 5%."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    names = ["gemm_busy", "peak ratio min", "read-back / copy"]
    keys = [("compute", "gemm_busy"), ("compute", "peak_ratio_min"), ("memory", "read_vs_copy")]
    for offset, (label, source) in enumerate((("before", before), ("now", doc))):
        run = _by_budget(source, 60.0)
        values = [float(_m(run, c, k) or 0) if run else 0.0 for c, k in keys]
        left.bar([i + 0.4 * offset for i in range(3)], values, width=0.4, label=label)
        catch = _catch5(run) if run else {}
        right.bar(
            [i + 0.4 * offset for i in range(len(catch))],
            list(catch.values()),
            width=0.4,
            label=label,
        )
        right.set_xticks([i + 0.2 for i in range(len(catch))], list(catch))
    left.axhline(0.9, color="grey", linestyle=":", linewidth=1)
    left.axhline(0.5, color="grey", linestyle=":", linewidth=1)
    left.set_xticks([i + 0.2 for i in range(3)], names)
    left.set_title("stress on the CPU, 60 s run (targets 0.9 / 0.8 / 0.5)")
    right.axhline(0.99, color="grey", linestyle=":", linewidth=1)
    right.set_title("catch chance for a fault in 5% of rounds, 60 s")
    right.set_ylim(0, 1.05)
    left.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(doc: dict[str, Any], before: dict[str, Any] | None, md: Path, png: Path) -> None:
    """Write the page and the plot."""
    md.write_text(markdown(doc, before))
    plot(doc, before, png)


def main() -> int:
    """Re-judge the targets of the stored results and rewrite probe.md and probe.png."""
    from bench.probe.run import _targets, stress_targets

    doc = json.loads(RESULTS.read_text())
    doc["targets"] = _targets(doc["runs"]) + stress_targets(doc["runs"])
    RESULTS.write_text(json.dumps(doc, indent=2) + "\n")
    before_path = RESULTS.with_name("probe-before.json")
    before = json.loads(before_path.read_text()) if before_path.exists() else None
    write_report(doc, before, RESULTS.with_suffix(".md"), RESULTS.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
