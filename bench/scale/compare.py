"""Two scale runs of one fleet size side by side: the code before a change and after.

    python -m bench.scale.compare BEFORE.json AFTER.json [--nodes 5000]
        [--out bench/results/scale-before-after.md]

Each file is ``bench.scale.run``'s ``scale.json`` (run it with ``--out`` into a folder
of its own for each tree, one after the other on the same idle machine). The table
gives each figure, its ratio after/before and whether it is better, the same (within
``SAME``) or worse; a plot shows the ratios. Writes ``.md``, ``.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "results"

SAME = 0.10
"""A ratio within 10% of 1 is the same: single runs on a shared 2-core machine vary by
about that much."""


@dataclass(frozen=True)
class Figure:
    name: str
    unit: str
    read: Callable[[dict[str, Any]], float]
    """Lower is better for every figure."""


FIGURES = (
    Figure("operator peak RSS", "MB", lambda r: r["operator"]["peak_rss_mb"]),
    Figure("operator CPU while qualifying", "s", lambda r: r["operator"]["cpu_s_qualification"]),
    Figure("first pass over all nodes", "s", lambda r: r["first_full_pass_done_s"]),
    Figure("time to qualify the fleet", "s", lambda r: r["qualify_s"]),
    Figure(
        "release p99 while qualifying, / the phase's raw patch p99",
        "x",
        lambda r: r["release_latency_s"]["p99"] / r["raw_node_patch_while_qualifying_s"]["p99"],
    ),
    Figure(
        "quarantine p99 while qualifying, / the phase's raw patch p99",
        "x",
        lambda r: r["quarantine_latency_s"]["p99"] / r["raw_node_patch_while_qualifying_s"]["p99"],
    ),
    Figure("qualified fleet: release p99", "s", lambda r: r["fresh_join_release_latency_s"]["p99"]),
    Figure(
        "qualified fleet: quarantine p99",
        "s",
        lambda r: r["fresh_join_quarantine_latency_s"]["p99"],
    ),
    Figure("join to probe Job, p99", "s", lambda r: r["join_to_job_s"]["p99"]),
    Figure(
        "reconcile pass, all nodes (in-process)", "s", lambda r: r["pass_cost"]["pass_s_median"]
    ),
    Figure("API writes per node", "", lambda r: r["requests"]["writes_per_node"]),
    Figure(
        "writes per clean qualification (max)",
        "",
        lambda r: r["writes_per_clean_qualification"]["max"],
    ),
    Figure(
        "restart: first quarantine (median)",
        "s",
        lambda r: r["restart"]["first_quarantine_after_restart_s"],
    ),
    Figure("restart: copy complete (median)", "s", lambda r: r["restart"]["mirrors_synced_s"]),
    Figure(
        "standby: first write after a kill (max)",
        "s",
        lambda r: r["standby"]["first_write_s"]["max"],
    ),
    Figure("steady state: node writes", "", lambda r: r["idle"]["node_writes"]),
)


YARDSTICKS = (
    Figure("registering the fleet (no operator yet)", "s", lambda r: r["register_s"]),
    Figure("creating the CPU Pods (no operator yet)", "s", lambda r: r["pods"]["cpu_create_s"]),
    Figure(
        "raw node patch p50, quiet moment (operator idle)",
        "s",
        lambda r: r["raw_node_patch_s"]["p50"],
    ),
)
"""The machine and API server in each run, the operator's work left out: a drift between
the two runs shows here, and the operator's figures carry it too."""


def run_of(path: Path, nodes: int) -> dict[str, Any]:
    runs = [r for r in json.loads(path.read_text())["runs"] if r.get("nodes") == nodes]
    if not runs:
        raise SystemExit(f"{path}: no run of {nodes} nodes")
    return dict(runs[-1])


def verdict(before: float, after: float) -> tuple[float | None, str]:
    """The ratio after/before (None where before is zero) and what it says: within
    ``SAME`` of 1 the same, lower better."""
    if before == after:
        return (1.0 if before else None), "same"
    if before == 0:
        return None, "worse" if after > 0 else "better"
    ratio = after / before
    if abs(ratio - 1) <= SAME:
        return ratio, "same"
    return ratio, "better" if ratio < 1 else "worse"


def compare(
    before: dict[str, Any], after: dict[str, Any], figures: tuple[Figure, ...] = FIGURES
) -> list[dict[str, Any]]:
    rows = []
    for f in figures:
        b, a = float(f.read(before)), float(f.read(after))
        ratio, word = verdict(b, a)
        rows.append({"figure": f.name, "unit": f.unit, "before": b, "after": a,
                     "ratio": ratio, "verdict": word})  # fmt: skip
    return rows


def write(
    out: Path, before: dict[str, Any], after: dict[str, Any], rows: list[dict[str, Any]]
) -> None:
    machine = compare(before, after, YARDSTICKS)
    out.with_suffix(".json").write_text(
        json.dumps(
            {"before": _ident(before), "after": _ident(after), "rows": rows, "machine": machine},
            indent=2,
        )
        + "\n"
    )
    counts = {w: sum(r["verdict"] == w for r in rows) for w in ("better", "same", "worse")}
    lines = [
        f"# Scale before and after: {before['nodes']:,} nodes",
        "",
        f"`python -m bench.scale.run --sizes {before['nodes']}` twice on the same machine, "
        f"one run after the other: the operator at `{_commit(before)}` (before), "
        f"then at `{_commit(after)}` (after). Load average (start / median / "
        f"max): before {_load(before)}, after {_load(after)}. Written by "
        "`python -m bench.scale.compare`.",
        "",
        f"{_figures(counts['better'])} better, {counts['same']} the same (within "
        f"{SAME:.0%}), {counts['worse']} worse.",
        "",
        "| figure | before | after | after / before | |",
        "|---|---:|---:|---:|---|",
    ]
    for r in rows:
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}"
        unit = f" {r['unit']}" if r["unit"] else ""
        lines.append(
            f"| {r['figure']} | {_num(r['before'])}{unit} | {_num(r['after'])}{unit} "
            f"| {ratio} | {r['verdict']} |"
        )
    lines += [
        "",
        "Single runs on a shared 2-core machine: a figure within 10% is the same. "
        "Lower is better for every figure.",
        "",
        "The machine in each run: the benchmark's own steps before the operator starts "
        "(each run with its tree's benchmark) and one node patch while the operator is "
        "idle. A ratio above 1 here means the second run's machine or API server was "
        "slower, and the operator's figures above carry that too.",
        "",
        "| yardstick | before | after | after / before |",
        "|---|---:|---:|---:|",
    ]
    for m in machine:
        ratio = "" if m["ratio"] is None else f"{m['ratio']:.2f}"
        lines.append(
            f"| {m['figure']} | {_num(m['before'])} {m['unit']} | {_num(m['after'])} "
            f"{m['unit']} | {ratio} |"
        )
    lines.append("")
    out.with_suffix(".md").write_text("\n".join(lines))
    plot(rows, out.with_suffix(".png"), before["nodes"])


def plot(rows: list[dict[str, Any]], path: Path, nodes: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r["ratio"] is not None]
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(shown) + 1.2))
    colours = {"better": "#4a4", "same": "#888", "worse": "#c44"}
    ax.barh([r["figure"] for r in shown], [r["ratio"] for r in shown],
            color=[colours[r["verdict"]] for r in shown])  # fmt: skip
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.axvspan(1 - SAME, 1 + SAME, color="#ddd", zorder=0)
    ax.invert_yaxis()
    ax.set_xlabel("after / before (lower is better)")
    ax.set_title(f"{nodes:,} nodes: after / before")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _ident(run: dict[str, Any]) -> dict[str, Any]:
    return {k: run[k] for k in ("nodes", "operator_version", "run_at", "load")}


def _figures(n: int) -> str:
    return f"{n} figure" if n == 1 else f"{n} figures"


def _commit(run: dict[str, Any]) -> str:
    version = run["operator_version"]
    return str(version.get("commit") if isinstance(version, dict) else version)


def _load(run: dict[str, Any]) -> str:
    load = run["load"]
    return f"{load['start']:.1f} / {load['median']:.1f} / {load['max']:.1f}"


def _num(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.scale.compare", description=__doc__)
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--out", type=Path, default=RESULTS / "scale-before-after.md")
    args = parser.parse_args(argv)
    before, after = run_of(args.before, args.nodes), run_of(args.after, args.nodes)
    rows = compare(before, after)
    write(args.out, before, after, rows)
    print(args.out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
