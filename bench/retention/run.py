"""Retention against a preloaded year of history, beside an empty one, in one run.

    python -m bench.retention.run [--nodes 200] [--tests-per-node 40]
        [--tickets-per-node 1] [--deletes-per-second 500] [--starts 3]
        [--out bench/results/retention.md]

    full size (a year of weekly expiry plus daily return-from-use screenings on 2,000
    nodes; 800,000 SDCTests, hours to create on a small machine):
    python -m bench.retention.run --nodes 2000 --tests-per-node 400

On a local control plane with one policy, the operator (a real process, started as
``bench.scale.startup`` starts it, whose helpers this reuses) is timed from its start
to its first reconcile pass, with its peak RSS until then, twice: with no history, then
with ``nodes x tests-per-node`` finished SDCTests (the statuses a probe writes) and
``tickets-per-node`` RepairTickets per node (nine in ten closed). The ratios say what
the history costs a start. Then retention (``adapters/retention.py``, in this process,
its clock a year ahead so that all of it is old) sweeps until nothing is left to
delete: the objects before and after, the deletes, and how long that took at the rate
asked for. A third start, on the pruned history, shows what retention gives back.
The SDCTests name nodes that do not exist (as in ``bench.scale.startup``), so the
operator screens nothing while it is timed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import client, config

from bench.scale.startup import POLICY, create, sdctest_body, ticket_body, time_start
from sdcdev import harness
from sdcdev.cluster.localcluster import LocalCluster
from sdcdev.harness import REPO, apply_crds, ensure_namespace, policy_body
from sdcguard.adapters.kube import KubeWriter
from sdcguard.adapters.observe import TicketSnapshot
from sdcguard.adapters.pass_state import TestSnapshot
from sdcguard.adapters.retention import (
    MirroredCopy,
    RetentionSweeper,
    TokenBucket,
    list_custom,
    read_history,
)
from sdcguard.api import GROUP, VERSION
from sdcguard.domain.observed import NodeSnapshot
from sdcguard.domain.retention import RetentionLimits
from sdcguard.metrics import Metrics
from sdcguard.runtime.mirror import NODES, Mirror, cluster_custom

RESULTS = REPO / "bench" / "results"
AHEAD = dt.timedelta(days=400)


def history_test(i: int, per_node: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """``bench.scale.startup``'s SDCTest, ``per_node`` of them per node."""
    body, status = sdctest_body(i)
    node = f"gpu-{i // per_node:06d}"
    body["metadata"] = {"name": f"{node}-{i % per_node + 1}"}
    body["spec"]["nodeName"] = node
    return body, status


def preload(api: client.ApiClient, args: argparse.Namespace) -> float:
    """Create the history (8 threads); seconds it took."""
    from concurrent.futures import ThreadPoolExecutor

    custom = client.CustomObjectsApi(api)
    started = time.monotonic()
    tests = args.nodes * args.tests_per_node
    tickets = args.nodes * args.tickets_per_node
    with ThreadPoolExecutor(8) as pool:
        jobs = [
            pool.submit(create, custom, "sdctests", history_test(i, args.tests_per_node))
            for i in range(tests)
        ]
        jobs += [
            pool.submit(create, custom, "repairtickets", ticket_body(i)) for i in range(tickets)
        ]
        for job in jobs:
            job.result()
    return time.monotonic() - started


def prune(api: client.ApiClient, rate: float) -> dict[str, Any]:
    """Sweep (clock a year ahead) until a sweep deletes nothing; what it did."""
    stop = threading.Event()
    tests: Mirror[TestSnapshot] = Mirror(
        api, cluster_custom(GROUP, VERSION, "sdctests"), TestSnapshot.slim
    )
    tickets: Mirror[TicketSnapshot] = Mirror(
        api, cluster_custom(GROUP, VERSION, "repairtickets"), TicketSnapshot.from_body
    )
    nodes: Mirror[NodeSnapshot] = Mirror(api, NODES, NodeSnapshot.from_body)
    mirrors = (tests, tickets, nodes)
    for mirror in mirrors:
        mirror.start(stop)
    for mirror in mirrors:
        mirror.synced.wait(600)
    before = {"sdctests": len(tests), "repairtickets": len(tickets)}
    metrics = Metrics()
    copy = MirroredCopy(tests, tickets, nodes)
    sweeper = RetentionSweeper(
        writer=KubeWriter(api=api, metrics=metrics),
        metrics=metrics,
        limits=RetentionLimits(),
        bucket=TokenBucket(rate, max(1, int(rate))),
        read=lambda: read_history(copy, lambda plural: list_custom(api, plural)),
        clock=lambda: dt.datetime.now(dt.UTC) + AHEAD,
    )
    started = time.monotonic()
    deleted = 0
    sweeps = 0
    while True:
        done = sweeper.sweep()
        sweeps += 1
        gone = sum(v for k, v in done.items() if k.endswith("-deleted"))
        deleted += gone
        if not gone:
            break
        # The next sweep reads the copy: wait until it saw this one's deletes.
        target = before["sdctests"] + before["repairtickets"] - deleted
        deadline = time.monotonic() + 60
        while len(tests) + len(tickets) > target and time.monotonic() < deadline:
            time.sleep(0.1)
    seconds = time.monotonic() - started
    after = {"sdctests": len(tests), "repairtickets": len(tickets)}
    stop.set()
    for mirror in mirrors:
        mirror.stop_watch()
    return {
        "before": before,
        "after": after,
        "deleted": deleted,
        "sweeps": sweeps,
        "seconds": seconds,
        "deletes_per_second": deleted / seconds if seconds else 0.0,
        "rate_limit": rate,
    }


def set_selectable(api: client.ApiClient, on: bool) -> None:
    """Replace the CRDs that declare selectableFields with themselves, with them (``on``)
    or without (as an older chart's), and wait until the API server answers a selector
    accordingly."""
    from kubernetes.client.exceptions import ApiException

    from sdcguard.api import RESOURCES
    from sdcguard.api.crdgen import crd_manifest

    ext = client.ApiextensionsV1Api(api)
    custom = client.CustomObjectsApi(api)
    for resource in RESOURCES:
        if not resource.selectable:
            continue
        body = crd_manifest(resource)
        if not on:
            for version in body["spec"]["versions"]:
                version.pop("selectableFields", None)
        current = ext.read_custom_resource_definition(body["metadata"]["name"])
        body["metadata"]["resourceVersion"] = current.metadata.resource_version
        ext.replace_custom_resource_definition(body["metadata"]["name"], body)

    def answered() -> bool:
        try:
            custom.list_cluster_custom_object(
                GROUP, VERSION, "sdctests", limit=1, field_selector="spec.nodeName=x"
            )
        except ApiException as exc:
            return exc.status == 400 and not on
        return on

    harness.wait_for(answered, 60, f"selectable fields {'on' if on else 'off'}")


def plugin_reads(
    api: client.ApiClient, kubeconfig: Path, node: str, repeats: int = 3
) -> dict[str, Any]:
    """``kubectl sdc status`` and ``history NODE`` on this history, median seconds of
    ``repeats``: with the API server selecting (the CRDs as generated), then against
    CRDs without selectableFields, where the plugin lists everything and filters."""
    import contextlib
    import io

    from sdcguard.cli import main as sdc

    def timed(*args: str) -> float:
        seconds = []
        for _ in range(repeats):
            out, err = io.StringIO(), io.StringIO()
            t0 = time.perf_counter()
            code = sdc([*args, "--kubeconfig", str(kubeconfig), "-o", "json"], out, err)
            seconds.append(time.perf_counter() - t0)
            assert code == 0, err.getvalue()
        return statistics.median(seconds)

    commands = {"status": ("status",), "history": ("history", node)}
    result: dict[str, Any] = {}
    try:
        for mode, on in (("selected", True), ("unselected", False)):
            set_selectable(api, on)
            result[mode] = {name: timed(*argv) for name, argv in commands.items()}
    finally:
        with contextlib.suppress(Exception):
            set_selectable(api, True)
    result["ratio"] = {
        name: result["unselected"][name] / result["selected"][name] for name in commands
    }
    return result


def measure(args: argparse.Namespace) -> dict[str, Any]:
    run: dict[str, Any] = {
        "nodes": args.nodes,
        "tests_per_node": args.tests_per_node,
        "tickets_per_node": args.tickets_per_node,
        "cpus": os.cpu_count(),
        "load": os.getloadavg()[0],
        "python": platform.python_version(),
        "bound": {"tests_per_node": RetentionLimits().tests_per_node},
    }
    src = REPO / "operator"
    with LocalCluster() as cluster:
        admin = config.new_client_from_config(str(cluster.kubeconfig))
        admin.configuration.connection_pool_maxsize = 16
        apply_crds(admin)
        ensure_namespace(admin)
        client.CustomObjectsApi(admin).create_cluster_custom_object(
            GROUP, harness.VERSION, "sdcpolicies", policy_body(POLICY)
        )
        logs = Path(cluster.state_dir)

        def starts(name: str) -> None:
            timed = [
                time_start(cluster.kubeconfig, logs / f"{name}-{k}.log", src)
                for k in range(args.starts)
            ]
            run[f"{name}_starts"] = timed
            run[name] = {key: statistics.median(t[key] for t in timed) for key in timed[0]}
            print(name, json.dumps(run[name]), flush=True)

        starts("empty")
        run["preload_seconds"] = preload(admin, args)
        starts("preloaded")
        run["retention"] = prune(admin, args.deletes_per_second)
        print("retention", json.dumps(run["retention"]), flush=True)
        starts("pruned")
        # Last: replacing the CRDs (to take their selectable fields away and back)
        # must not touch the operator's timed starts.
        run["plugin"] = plugin_reads(admin, cluster.kubeconfig, "gpu-000001")
        print("plugin", json.dumps(run["plugin"]), flush=True)
    for name in ("preloaded", "pruned"):
        run[f"{name}_ratio"] = {
            key: run[name][key] / run["empty"][key] for key in ("first pass", "rss")
        }
    run["when"] = f"{dt.datetime.now(dt.UTC):%Y-%m-%dT%H:%M:%SZ}"
    return run


def summary(run: dict[str, Any]) -> dict[str, Any]:
    """The figures the docs quote, under names a placeholder can hold."""
    r = run["retention"]
    preloaded = r["before"]["sdctests"] + r["before"]["repairtickets"]
    return {
        "objects_preloaded": preloaded,
        "objects_after": r["after"]["sdctests"] + r["after"]["repairtickets"],
        "tests_after": r["after"]["sdctests"],
        "first_pass_ratio": run["preloaded_ratio"]["first pass"],
        "rss_ratio": run["preloaded_ratio"]["rss"],
        "pruned_first_pass_ratio": run["pruned_ratio"]["first pass"],
        "pruned_rss_ratio": run["pruned_ratio"]["rss"],
        "empty_first_pass_s": run["empty"]["first pass"],
        "preloaded_first_pass_s": run["preloaded"]["first pass"],
        "rss_kib_per_object": (run["preloaded"]["rss"] - run["empty"]["rss"])
        / 1024
        / max(1, preloaded),
        "cpu_us_per_object": (run["preloaded"]["cpu"] - run["empty"]["cpu"])
        * 1e6
        / max(1, preloaded),
        "prune_seconds": r["seconds"],
        "deleted": r["deleted"],
        "deletes_per_second": r["deletes_per_second"],
        **(
            {
                "plugin_status_s": plugin["selected"]["status"],
                "plugin_status_unselected_s": plugin["unselected"]["status"],
                "plugin_history_s": plugin["selected"]["history"],
                "plugin_history_unselected_s": plugin["unselected"]["history"],
            }
            if (plugin := run.get("plugin"))
            else {}
        ),
    }


def write(out: Path, run: dict[str, Any]) -> None:
    run["summary"] = summary(run)
    out.with_suffix(".json").write_text(json.dumps(run, indent=2) + "\n")
    r = run["retention"]
    rows = [
        "| history | objects | first pass (s) | CPU to first pass (s) | peak RSS (MiB) "
        "| first pass vs empty | RSS vs empty |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    counts = {
        "empty": 0,
        "preloaded": r["before"]["sdctests"] + r["before"]["repairtickets"],
        "pruned": r["after"]["sdctests"] + r["after"]["repairtickets"],
    }
    for name in ("empty", "preloaded", "pruned"):
        row = run[name]
        ratio = run.get(f"{name}_ratio", {"first pass": 1.0, "rss": 1.0})
        rows.append(
            f"| {name} | {counts[name]} | {row['first pass']:.2f} | {row['cpu']:.2f} "
            f"| {row['rss'] / 2**20:.0f} "
            f"| {ratio['first pass']:.2f}x | {ratio['rss']:.2f}x |"
        )
    text = [
        "# Retention: start-up with a year of history, and pruning it",
        "",
        f"{run['nodes']} nodes x {run['tests_per_node']} SDCTests, "
        f"{run['tickets_per_node']} RepairTicket per node; {run['cpus']} CPUs, "
        f"load {run['load']:.1f}; written by `python -m bench.retention.run`.",
        "",
        *rows,
        "",
        f"Retention deleted {r['deleted']} objects in {r['seconds']:.1f} s "
        f"({r['sweeps']} sweeps, {r['deletes_per_second']:.0f}/s under a limit of "
        f"{r['rate_limit']:.0f}/s), leaving {r['after']['sdctests']} SDCTests "
        f"({run['bound']['tests_per_node']} per node) and "
        f"{r['after']['repairtickets']} RepairTickets (any left are open: the tickets "
        "name nodes that do not exist, so the operator closes the open ones during the "
        "preloaded start, and retention then deletes them as closed).",
        "",
        f"Each figure is the median of {len(run['empty_starts'])} operator starts on "
        "that history (a single start's first pass varies by about 15% on a shared "
        "2-core machine); the operator's CPU seconds to its first pass are the steadier "
        "figure. This is a reduced scale; the issue's size is "
        "`--nodes 2000 --tests-per-node 400`.",
        "",
        *plugin_rows(run),
    ]
    out.with_suffix(".md").write_text("\n".join(text))
    plot(run, out.with_suffix(".png"))


def plugin_rows(run: dict[str, Any]) -> list[str]:
    """The plugin's table (runs before the plugin step have none)."""
    if "plugin" not in run:
        return []
    return [
        f"`kubectl sdc` on the pruned history ({run['retention']['after']['sdctests']} "
        "SDCTests), median of 3 runs each: with the API "
        "server selecting by node and phase (the CRDs' selectableFields), and against "
        "the same CRDs without them, where the plugin lists every object and filters:",
        "",
        "| command | server selects (s) | lists everything (s) | ratio |",
        "|---|---:|---:|---:|",
        *(
            f"| `kubectl sdc {name}` | {run['plugin']['selected'][name]:.2f} "
            f"| {run['plugin']['unselected'][name]:.2f} | {run['plugin']['ratio'][name]:.1f}x |"
            for name in ("status", "history")
        ),
        "",
    ]


def plot(run: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["empty", "preloaded", "pruned"]
    plugin = run.get("plugin")
    fig, axes = plt.subplots(1, 3 if plugin else 2, figsize=(13 if plugin else 9, 3.5))
    for ax, key, label, scale in (
        (axes[0], "first pass", "start to first pass (s)", 1.0),
        (axes[1], "rss", "peak RSS to first pass (MiB)", 2**20),
    ):
        values = [run[n][key] / scale for n in names]
        ax.bar(names, values, color=["#888", "#c44", "#48c"])
        ax.set_ylabel(label)
        for x, v in enumerate(values):
            ax.text(x, v, f"{v:.1f}", ha="center", va="bottom")
    if plugin:
        ax = axes[2]
        commands = ["status", "history"]
        for k, (mode, label, color) in enumerate(
            (("selected", "server selects", "#48c"), ("unselected", "lists everything", "#c44"))
        ):
            values = [plugin[mode][c] for c in commands]
            xs = [x + (k - 0.5) * 0.38 for x in range(len(commands))]
            ax.bar(xs, values, width=0.38, color=color, label=label)
            for x, v in zip(xs, values, strict=True):
                ax.text(x, v, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(commands)), [f"kubectl sdc {c}" for c in commands])
        ax.set_ylabel("kubectl sdc seconds (pruned history)")
        ax.legend(fontsize=8)
    objects = run["retention"]["before"]["sdctests"]
    fig.suptitle(f"{run['nodes']} nodes, {objects} SDCTests preloaded, then pruned")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--tests-per-node", type=int, default=40)
    parser.add_argument("--tickets-per-node", type=int, default=1)
    parser.add_argument("--deletes-per-second", type=float, default=500.0)
    parser.add_argument(
        "--starts", type=int, default=3, help="operator starts per history (medians kept)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "retention.md")
    parser.add_argument(
        "--render", type=Path, help="write the table and plot again from a run's JSON"
    )
    args = parser.parse_args(argv)
    if args.render:
        write(args.out, json.loads(args.render.read_text()))
        return 0
    write(args.out, measure(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
