"""What a reconcile pass costs the operator's CPU, by fleet size, A/B between two operator
trees in one run.

    python -m bench.scale.passcost [--before-src DIR] [--sizes 1000,5000,20000]
        [--repeats 5] [--out bench/results]

``DIR`` holds another ``operator/`` tree, for instance an older commit's:
``mkdir -p DIR && git archive COMMIT operator | tar -x -C DIR``. Without it only this
tree is measured.

In-process and without an API server (the end-to-end benchmark, ``bench.scale.run``,
has the API server's part): a qualified fleet of N nodes is put into the operator's own
copy (:class:`sdcguard.adapters.inventory.Inventory`, its mirrors filled as a list would
fill them): every node Qualified with one finished acceptance SDCTest (so the circuit
breaker's window holds N screenings, as after a fleet's qualification), and four GPU
training Pods on a quarter of the nodes. The policy is the scale benchmark's. Measured,
as CPU seconds of one process per tree and size (the median of ``--repeats``):

- **fleet copy**: the pass's copy of the fleet (``adapters.pass_view.fleet_view``);
- **full pass**: every node decided, in dry run (the safety net of every resync);
- **probe end**: the pass that serves one node whose screening has just ended (a new
  finished SDCTest in its view, so a new sample for the breaker): what stands between
  a probe's end and the node's release or quarantine;
- **longest wait**: the longest CPU stretch of a full pass between two of its checks
  for urgent work (a probe's end offered during the pass waits at most this long);
- **collector in a pass**: the pauses of Python's full (generation 2) collections
  during a full pass, which stop every thread, the one that serves probe ends
  included. The tree's heap keeper (``sdcguard.runtime.heap``, where it has one)
  settles the heap after each full pass as the operator's policy loop does.

Results go to ``passcost.json``, ``passcost.md`` and ``passcost.png`` in ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
VARIANTS = ("before", "now")


def measure(nodes: int, repeats: int) -> dict[str, float]:
    """Run in a child process whose sdcguard is the tree under test."""
    import datetime as dt
    import types

    from kubernetes import client

    from bench.scale.fleet import node_body, pod_body
    from bench.scale.run import fleet_policy
    from sdcguard.adapters.inventory import Inventory, _pod_entry
    from sdcguard.adapters.kube import KubeWriter
    from sdcguard.adapters.pass_state import TestSnapshot
    from sdcguard.adapters.reconciler import Reconciler
    from sdcguard.api import SDCPolicy
    from sdcguard.domain.observed import NodeSnapshot
    from sdcguard.logs import configure_logging
    from sdcguard.metrics import Metrics
    from sdcguard.settings import Settings

    configure_logging("console", "error")
    now = dt.datetime.now(dt.UTC)

    def name(i: int) -> str:
        return f"gpu-{i:05d}"

    def test_body(i: int, seq: int, at: dt.datetime) -> dict[str, Any]:
        return {
            "apiVersion": "sdcguard.dev/v1alpha1",
            "kind": "SDCTest",
            "metadata": {
                "name": f"{name(i)}-{i:05d}-{seq}",
                "resourceVersion": str(10**6 * seq + i),
                "creationTimestamp": at.strftime("%Y-%m-%dT%H:%M:%SZ"),
            },
            "spec": {
                "nodeName": name(i),
                "policyRef": "bench",
                "suite": "acceptance",
                "reason": "Join",
            },
            "status": {
                "phase": "Passed",
                "verdict": "Pass",
                "completionTime": at.isoformat().replace("+00:00", "Z"),
                "checks": [
                    {"name": c, "verdict": "Pass"}
                    for c in ("compute", "collective", "golden", "memory")
                ],
            },
        }

    inv = Inventory(client.ApiClient(), "sdcguard", test_node=lambda _: None, clock=lambda: now)
    fleet = {}
    for i in range(nodes):
        body = node_body(name(i), gated=False)
        body["metadata"].update(uid=f"{i:08d}-0000", resourceVersion=str(i + 1))
        body["metadata"]["labels"]["sdcguard.dev/state"] = "Qualified"
        fleet[name(i)] = NodeSnapshot.from_body(body)
    inv.nodes._replace(fleet)
    pods = {}
    for i in range(0, nodes, 4):
        for k in range(4):
            body = pod_body(f"w-{i}-{k}", "train", name(i), gpus=2)
            body["status"] = {"phase": "Running"}
            pods[f"train/w-{i}-{k}"] = _pod_entry(body)
    inv.pods._replace(pods)
    # The fleet qualified over the last half hour: one finished screening a node.
    start = now - dt.timedelta(seconds=1800)
    qualified = [
        TestSnapshot.slim(test_body(i, 1, start + dt.timedelta(seconds=i * 0.05)))
        for i in range(nodes)
    ]
    inv.tests._replace({snap.name: snap for snap in qualified})
    for mirror in inv.mirrors:
        mirror.synced.set()
    rt = types.SimpleNamespace(inventory=inv, started=now)
    indexes: dict[str, Any] = {"baselines_index": {}, "policies_index": {}}
    body = fleet_policy()
    body["metadata"].update(resourceVersion="1", generation=1)
    policy = SDCPolicy.model_validate(body)
    metrics = Metrics()
    reconciler = Reconciler(
        writer=KubeWriter(api=client.ApiClient(), metrics=metrics, dry_run=True),
        settings=Settings(metrics_port=0),
        metrics=metrics,
    )
    # No policy status is written (dry run); older trees wrote it from a mixin method.
    reporter = getattr(reconciler, "reporter", reconciler)
    setattr(reporter, "write" if reporter is not reconciler else "_write_policy_status", _no_write)

    def cpu(fn: Any) -> float:
        t0 = time.process_time()
        fn()
        return time.process_time() - t0

    import gc

    keeper: Any = None
    try:  # the operator's heap keeper, in trees that have one (where each tree keeps it)
        from sdcguard.runtime.heap import Heap

        keeper = Heap()
    except ImportError:
        with contextlib.suppress(ImportError):
            from sdcguard.adapters.heap import Heap  # type: ignore[no-redef]

            keeper = Heap()
    full_pauses: list[float] = []
    started: list[float] = []

    def on_collect(phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            full_pauses.append(time.perf_counter() - started.pop())

    serve = reconciler._serve_urgent
    last_check = [0.0]
    longest = [0.0]

    def checked() -> None:
        t = time.process_time()
        longest[0] = max(longest[0], t - last_check[0])
        last_check[0] = t
        serve()

    reconciler._serve_urgent = checked  # type: ignore[method-assign]
    try:  # where each tree builds a pass's view
        from sdcguard.adapters.pass_view import fleet_view

        def view_of(rt: Any, indexes: Any, only: Any = None) -> Any:
            return fleet_view(rt.inventory, indexes, rt.started, only)

    except ImportError:
        from sdcguard import handlers

        view_of = handlers._view
    copies, fulls, ends, waits, collector = [], [], [], [], []
    view = view_of(rt, indexes)
    reconciler.run_pass(policy, view, now)  # the first pass parses every node and test
    if keeper is not None:
        keeper.settle()
    gc.callbacks.append(on_collect)
    for _ in range(repeats):
        copies.append(cpu(lambda: view_of(rt, indexes)))
        full = view_of(rt, indexes)
        at = dt.datetime.now(dt.UTC)
        full_pauses.clear()
        last_check[0], longest[0] = time.process_time(), 0.0
        fulls.append(cpu(lambda: reconciler.run_pass(policy, full, at)))  # noqa: B023
        longest[0] = max(longest[0], time.process_time() - last_check[0])
        waits.append(longest[0])
        collector.append(sum(full_pauses))
        if keeper is not None:
            keeper.settle()
    gc.callbacks.remove(on_collect)
    for k in range(repeats):
        # A probe's end: the node's next screening has just finished.
        i = (k * 7919) % nodes
        ended = TestSnapshot.slim(test_body(i, 2 + k, dt.datetime.now(dt.UTC)))
        inv.tests._put(ended.name, ended)
        only = frozenset({name(i)})
        urgent = view_of(rt, indexes, only=only)
        at = dt.datetime.now(dt.UTC)
        ends.append(
            cpu(lambda: reconciler._run_pass(policy, urgent, at, only, fill=False))  # noqa: B023
        )
    return {
        "fleet_copy_s": statistics.median(copies),
        "full_pass_s": statistics.median(fulls),
        "probe_end_pass_s": statistics.median(ends),
        "longest_wait_s": statistics.median(waits),
        "collector_in_full_pass_s": statistics.median(collector),
    }


def run_child(src: Path, nodes: int, repeats: int) -> dict[str, float]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(src), str(REPO / "jobs"), str(REPO)])
    out = subprocess.run(
        [sys.executable, "-m", "bench.scale.passcost", "--child", str(nodes), str(repeats)],
        env=env,
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def say(message: str) -> None:
    print(f"[bench.passcost] {message}", file=sys.stderr, flush=True)


def _no_write(*_: Any, **__: Any) -> None:
    """Stands in for the policy status write."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.scale.passcost", description=__doc__)
    parser.add_argument("--before-src", type=Path, help="a tree holding another operator/")
    parser.add_argument("--label", default="before", help="what the --before-src tree is")
    parser.add_argument("--now-label", default="this tree")
    parser.add_argument("--sizes", default="1000,5000,20000")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=REPO / "bench/results")
    parser.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(*args.child)))
        return 0
    sources = {"now": REPO / "operator"}
    if args.before_src:
        sources["before"] = args.before_src.resolve() / "operator"
        if not sources["before"].is_dir():
            parser.error(f"{args.before_src} holds no operator/ tree")
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    for n in sizes:
        row: dict[str, Any] = {"nodes": n}
        for variant in [v for v in VARIANTS if v in sources]:
            say(f"{n:,} nodes, {variant} ...")
            row[variant] = run_child(sources[variant], n, args.repeats)
            say(f"  {row[variant]}")
        rows.append(row)
    doc = {
        "benchmark": "passcost",
        "command": "python -m bench.scale.passcost"
        + (" --before-src DIR" if args.before_src else "")
        + f" --sizes {args.sizes} --repeats {args.repeats}",
        "before": args.label if args.before_src else None,
        "now": args.now_label,
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "load_avg_1m_at_start": round(os.getloadavg()[0], 2),
            "python": platform.python_version(),
        },
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "passcost.json").write_text(json.dumps(doc, indent=2) + "\n")
    text = report(doc)
    (args.out / "passcost.md").write_text(text)
    plot(doc, args.out / "passcost.png")
    print(text)
    return 0


FIGURES = (
    ("fleet_copy_s", "fleet copy"),
    ("full_pass_s", "full pass"),
    ("probe_end_pass_s", "probe end"),
    ("longest_wait_s", "longest wait"),
    ("collector_in_full_pass_s", "collector in a pass"),
)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def report(doc: dict[str, Any]) -> str:
    both = doc["before"] is not None
    lines = [
        "# What a reconcile pass costs (in-process, CPU seconds)",
        "",
        f"`{doc['command']}`, {doc['generated_at']}, load {doc['machine']['load_avg_1m_at_start']} "
        f"at start, Python {doc['machine']['python']}. Median of the repeats, one process per "
        "tree and size; a qualified fleet with one finished screening per node (the "
        "breaker's window holds them all) and four GPU Pods on a quarter of the nodes.",
        "",
    ]
    if both:
        lines += [
            f"before: {doc['before']}; now: {doc['now']}.",
            "",
            "| nodes | "
            + " | ".join(f"{label}: before / now (ratio)" for _, label in FIGURES)
            + " |",
            "|---|" + "---|" * len(FIGURES),
        ]
        for row in doc["rows"]:
            cells = []
            for key, _ in FIGURES:
                b, n = row["before"].get(key), row["now"].get(key)
                if b is None or n is None:
                    cells.append("-")
                else:
                    cells.append(f"{_ms(b)} / {_ms(n)} ({b / n:.1f}x)" if n else f"{_ms(b)} / 0")
            lines.append(f"| {row['nodes']:,} | " + " | ".join(cells) + " |")
    else:
        lines += [
            "| nodes | " + " | ".join(label for _, label in FIGURES) + " |",
            "|---|" + "---|" * len(FIGURES),
        ]
        for row in doc["rows"]:
            lines.append(
                f"| {row['nodes']:,} | "
                + " | ".join(
                    _ms(row["now"][key]) if key in row["now"] else "-" for key, _ in FIGURES
                )
                + " |"
            )
    lines += [
        "",
        "fleet copy: the pass's copy of the operator's copy of the fleet; full pass: every "
        "node decided (dry run); probe end: the pass that serves one node whose screening "
        "has just ended, which stands between a probe's end and the node's release or "
        "quarantine; longest wait: the longest CPU stretch of a full pass between two "
        "checks for urgent work; collector in a pass: full garbage collections during a "
        "full pass (wall time; every thread stops), with the heap settled after each "
        "full pass where the tree has the heap keeper.",
        "",
    ]
    return "\n".join(lines)


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["rows"]
    nodes = [r["nodes"] for r in rows]
    fig, axes = plt.subplots(1, len(FIGURES), figsize=(19, 3.8))
    for ax, (key, label) in zip(axes, FIGURES, strict=True):
        for variant, style in (("before", "s--"), ("now", "o-")):
            if all(variant in r and key in r[variant] for r in rows):
                # A zero (no full collection in the pass) is drawn at 0.1 ms.
                values = [max(r[variant][key], 1e-4) * 1000 for r in rows]
                ax.plot(nodes, values, style, label=variant)
        ax.set_title(label)
        ax.set_xlabel("nodes")
        ax.set_ylabel("ms (CPU; collector: wall)")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    fig.suptitle(f"before: {doc['before'] or '-'}; now: {doc['now']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
