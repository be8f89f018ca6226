"""Start-up on a large fleet, A/B between two operator trees in one control plane (run
once to test asking for the next list page while the operator slims the one before).

    python -m bench.scale.listing --before-src DIR [--nodes 20000] [--pods-per-node 9]
        [--repeats 3] [--out bench/results]

``DIR`` holds another ``operator/`` tree, for instance an older commit's:
``mkdir -p DIR && git archive COMMIT operator | tar -x -C DIR``.

A local control plane gets the scale benchmark's fleet and policy (``bench.scale.run``:
the same Node bodies, and ``--pods-per-node`` CPU Pods a node, bound and Running, the
same Pod bodies). The operator is then started as a real process in dry run (it decides
and sends no mutating request, so every start finds the same cluster), alternately from
``DIR`` and from this tree, ``--repeats`` times each, and timed from its process start
to, as its own log says:

- **nodes / pods copied**: its copy of that kind is complete (the list's last page);
- **first pass**: its first reconcile pass over every node, which waits for the whole
  copy (the scale benchmark's "start → first pass over all nodes");

with its CPU time and peak RSS at that pass, and the API server's CPU seconds meanwhile.
Results go to ``listing.json``, ``listing.md`` and ``listing.png`` in ``--out``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psutil
from kubernetes import client, config

from bench.scale.fleet import PodWorkload, node_name, register_nodes
from bench.scale.run import BENCH_CONTROLLERS, fleet_policy, log, needed_mb
from bench.scale.startup import OperatorLog, start_operator, stop, until_first_pass
from sdcdev.cluster.localcluster import LocalCluster
from sdcdev.harness import GROUP, REPO, TESTING, VERSION, apply_crds, ensure_namespace

VARIANTS = ("before", "now")


def one_start(
    kubeconfig: Path, log_path: Path, src: Path, apiserver: psutil.Process
) -> dict[str, Any]:
    """One operator start in dry run, until its first pass; its milestones (seconds
    from the process start), CPU, peak RSS, and the API server's CPU meanwhile."""
    served = apiserver.cpu_times()
    started = time.monotonic()
    proc = start_operator(kubeconfig, log_path, src, SDCGUARD_DRY_RUN="true")
    try:
        ps = psutil.Process(proc.pid)
        watch = OperatorLog(log_path, proc)
        peak = until_first_pass(ps, watch, started)
        cpu = ps.cpu_times()
    finally:
        stop(proc)
    after = apiserver.cpu_times()

    def at(what: str) -> float | None:
        seen = watch.seen.get(what)
        return None if seen is None else round(seen - started, 2)

    return {
        "nodes copied": at("synced nodes"),
        "pods copied": at("synced pods"),
        "first pass": at("reconcile pass"),
        "operator cpu": round(cpu.user + cpu.system, 1),
        "peak rss mb": round(peak / 2**20),
        "apiserver cpu": round(after.user + after.system - served.user - served.system, 1),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    sources = {"before": args.before_src.resolve() / "operator", "now": REPO / "operator"}
    names = [node_name(i) for i in range(args.nodes)]
    pods = round(args.pods_per_node * args.nodes)
    run: dict[str, Any] = {
        "benchmark": "listing",
        "command": f"python -m bench.scale.listing --before-src DIR --nodes {args.nodes} "
        f"--pods-per-node {args.pods_per_node:g} --repeats {args.repeats}",
        "before": args.label,
        "now": args.now_label,
        "nodes": args.nodes,
        "pods": pods,
        "machine": {
            "cpus": os.cpu_count(),
            "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
            "load_avg_1m_at_start": round(os.getloadavg()[0], 2),
            "python": platform.python_version(),
        },
        "starts": [],
    }
    with LocalCluster(controllers=BENCH_CONTROLLERS) as cluster:
        admin = config.new_client_from_config(str(cluster.kubeconfig))
        admin.configuration.connection_pool_maxsize = 16
        apply_crds(admin)
        ensure_namespace(admin)
        t0 = time.monotonic()
        register_nodes(admin, names, progress=lambda k: log(f"registered {k}/{args.nodes} nodes"))
        log(f"registered {args.nodes} nodes in {time.monotonic() - t0:.0f}s")
        workload = PodWorkload(admin)
        workload.prepare()
        took = workload.add_cpu_pods(
            names, pods, progress=lambda k: log(f"created {k}/{pods} CPU Pods")
        )
        log(f"created {pods} CPU Pods in {took:.0f}s")
        client.CustomObjectsApi(admin).create_cluster_custom_object(
            GROUP, VERSION, "sdcpolicies", fleet_policy()
        )
        apiserver = psutil.Process(cluster.processes["kube-apiserver"].pid)
        for k in range(args.repeats):
            for variant in VARIANTS:
                log(
                    f"start {k + 1}/{args.repeats} of the operator {variant}: "
                    "waiting for its first pass"
                )
                row = one_start(
                    cluster.kubeconfig,
                    Path(cluster.state_dir) / f"operator-{variant}-{k}.log",
                    sources[variant],
                    apiserver,
                )
                row = {"variant": variant, "start": k + 1, **row}
                log(json.dumps(row))
                run["starts"].append(row)
        # Dry run: no start left an SDCTest or a reserved node for the next to find.
        custom, core = client.CustomObjectsApi(admin), client.CoreV1Api(admin)
        run["sdctests_after"] = len(
            custom.list_cluster_custom_object(GROUP, VERSION, "sdctests")["items"]
        )
        run["reserved_after"] = sum(
            1
            for node in core.list_node().items
            if any(t.key == TESTING for t in node.spec.taints or [])
        )
    run["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    run["generated_at"] = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    run["medians"] = {
        v: {
            key: round(statistics.median(r[key] for r in run["starts"] if r["variant"] == v), 2)
            for key in (
                "nodes copied",
                "pods copied",
                "first pass",
                "operator cpu",
                "apiserver cpu",
            )
        }
        for v in VARIANTS
    }
    before, now = run["medians"]["before"], run["medians"]["now"]
    run["ratio_now_over_before"] = {
        key: round(now[key] / before[key], 2) for key in before if before[key]
    }
    return run


def markdown(run: dict[str, Any]) -> str:
    m = run["machine"]
    lines = [
        "# Start-up on a large fleet: one operator tree against another",
        "",
        f"`{run['command']}` on {m['cpus']} CPUs, Python {m['python']}, load average "
        f"{m['load_avg_1m_at_start']} at start and {run['load_avg_1m_at_end']} at the end, "
        f"{run['generated_at']}. {run['nodes']:,} nodes and {run['pods']:,} Pods; the operator "
        "in dry run, started alternately from each tree (after the last start: "
        f"{run['sdctests_after']} SDCTests, {run['reserved_after']} nodes reserved). Before: "
        f"{run['before'] or 'an older operator tree'}. Now: {run.get('now') or 'this tree'}.",
        "",
        "| start | operator | nodes copied | pods copied | first pass | operator CPU "
        "| peak RSS | API server CPU |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in run["starts"]:
        lines.append(
            f"| {r['start']} | {r['variant']} | {r['nodes copied']} s | {r['pods copied']} s "
            f"| {r['first pass']} s | {r['operator cpu']} s | {r['peak rss mb']} MB "
            f"| {r['apiserver cpu']} s |"
        )
    lines += [
        "",
        "| median | nodes copied | pods copied | first pass | operator CPU | API server CPU |",
    ]
    lines += ["|---|---|---|---|---|---|"]
    for v in VARIANTS:
        d = run["medians"][v]
        lines.append(
            f"| {v} | {d['nodes copied']} s | {d['pods copied']} s | {d['first pass']} s "
            f"| {d['operator cpu']} s | {d['apiserver cpu']} s |"
        )
    ratio = run["ratio_now_over_before"]
    lines.append(
        "| now ÷ before | "
        + " | ".join(f"{ratio.get(k, '-')}x" for k in run["medians"]["now"])
        + " |"
    )
    return "\n".join(lines) + "\n"


def plot(run: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    keys = ("nodes copied", "pods copied", "first pass")
    for offset, (variant, colour) in enumerate(
        zip(VARIANTS, ("tab:grey", "tab:blue"), strict=True)
    ):
        rows = [r for r in run["starts"] if r["variant"] == variant]
        for i, key in enumerate(keys):
            xs = [i + (offset - 0.5) * 0.3] * len(rows)
            ax.scatter(xs, [r[key] for r in rows], color=colour, label=variant if i == 0 else None)
            ax.hlines(run["medians"][variant][key], xs[0] - 0.12, xs[0] + 0.12, color=colour)
    ax.set_xticks(range(len(keys)), [f"{k}" for k in keys])
    ax.set_ylabel("seconds from the operator's start")
    ax.set_title(f"{run['nodes']:,} nodes, {run['pods']:,} Pods: each start, and the medians")
    ax.set_ylim(bottom=0)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(title="operator")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench.scale.listing",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--before-src", type=Path, required=True, help="holds an older operator/")
    parser.add_argument("--label", default="", help="what the other tree is, for the table")
    parser.add_argument("--now-label", default="", help="what this tree is, for the table")
    parser.add_argument("--nodes", type=int, default=20000)
    parser.add_argument("--pods-per-node", type=float, default=9.0)
    parser.add_argument("--repeats", type=int, default=3, help="starts of each operator")
    parser.add_argument("--out", type=Path, default=REPO / "bench/results")
    args = parser.parse_args(argv)
    if not (args.before_src / "operator" / "sdcguard").is_dir():
        parser.error(f"--before-src {args.before_src}: no operator/sdcguard in it")
    if args.nodes < 10 or args.repeats < 1 or args.pods_per_node < 0:
        parser.error("--nodes must be at least 10, --repeats at least 1, --pods-per-node >= 0")
    free = psutil.virtual_memory().available / 2**20
    if needed_mb(args.nodes) > free:
        log(
            f"refusing {args.nodes} nodes: about {needed_mb(args.nodes):.0f} MB needed, "
            f"{free:.0f} MB free"
        )
        return 2
    run = measure(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "listing.json").write_text(json.dumps(run, indent=2) + "\n")
    (args.out / "listing.md").write_text(markdown(run))
    plot(run, args.out / "listing.png")
    print(markdown(run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
