"""The workload record's cost at fleet scale: writes and memory under pod churn.

    python -m bench.scale.blast [--sizes 1000,5000] [--minutes 30]

In-process, on a simulated clock: the operator's :class:`WorkloadBook` is fed the Pod
starts and stops the mirror would report, and flushes every period as the operator's
flusher does; its writer is the operator's ``KubeWriter`` in dry-run (every write is
counted, none is sent). Owners are read through the real :class:`OwnerResolver` from a
local HTTP server that answers like an API server (discovery, Job objects), so owner
reads are counted too. The fleet per size:

- every node runs one training Job's Pod (8 GPUs) at a time; each Job runs for a random
  10-60 minutes, then the next Job's Pod starts on the node (ordinary churn, about one
  Pod start and stop per node per half hour);
- 1% of the nodes are idle and never used (they must cost no write);
- one node runs a Job that starts a 1 GPU Pod every second, each living 2 s (huge
  numbers of short-lived Pods on one node).

Measured: writes in all and per second, the most writes one node got in one period
(bound: 1, plus 1 for the create of its first record), writes to nodes with no change
(must be 0), owner reads, CPU per flush, the memory the book and the resolver keep
(tracemalloc) and the largest record's size (bytes of JSON).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import random
import threading
import time
import tracemalloc
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from kubernetes import client

from sdcguard.adapters.kube import KubeWriter
from sdcguard.adapters.observe import OwnerRef, PodUse
from sdcguard.adapters.owners import OwnerResolver
from sdcguard.adapters.workload_record import WorkloadBook
from sdcguard.domain.observed import NodeSnapshot
from sdcguard.logs import configure_logging
from sdcguard.metrics import Metrics

PERIOD = 5.0  # the operator's default workload_record_seconds
T0 = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)


class _FakeApi(BaseHTTPRequestHandler):
    """Discovery of batch/v1 and any Job (no owner of its own)."""

    reads = 0

    def do_GET(self) -> None:
        type(self).reads += 1
        if self.path.rstrip("/") == "/apis/batch/v1":
            body: dict[str, Any] = {
                "kind": "APIResourceList",
                "resources": [{"name": "jobs", "kind": "Job", "namespaced": True}],
            }
        else:
            name = self.path.rsplit("/", 1)[-1]
            body = {"kind": "Job", "metadata": {"name": name, "uid": f"uid-{name}"}}
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def fake_api() -> Iterator[client.ApiClient]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = client.Configuration()
    config.host = f"http://127.0.0.1:{server.server_port}"
    try:
        yield client.ApiClient(config)
    finally:
        server.shutdown()


class Fleet:
    """The simulated fleet's Pods (module docstring), advanced one period at a time."""

    def __init__(self, nodes: int, seed: int = 7) -> None:
        self.rng = random.Random(seed)
        self.names = [f"gpu-{i:05d}" for i in range(nodes)]
        self.idle = set(self.names[: max(1, nodes // 100)])
        self.hot = self.names[-1]
        self.live: dict[str, dict[str, PodUse]] = {n: {} for n in self.names}
        self.ends: dict[tuple[str, str], float] = {}
        self.jobs = 0

    def _pod(self, node: str, job: str, pod: str, gpus: int) -> PodUse:
        owner = OwnerRef("batch/v1", "Job", job, f"uid-{job}")
        return PodUse("train", pod, node, frozenset({"nvidia.com/gpu"}), gpus, owner)

    def step(self, now: float) -> tuple[list[PodUse], list[PodUse]]:
        started: list[PodUse] = []
        stopped: list[PodUse] = []
        for (node, pod), end in list(self.ends.items()):
            if end <= now:
                stopped.append(self.live[node].pop(pod))
                del self.ends[(node, pod)]
        for node in self.names:
            if node in self.idle or node == self.hot or self.live[node]:
                continue
            self.jobs += 1
            job = f"job-{self.jobs}"
            use = self._pod(node, job, f"{job}-0", 8)
            self.live[node][use.name] = use
            self.ends[(node, use.name)] = now + self.rng.uniform(600, 3600)
            started.append(use)
        for k in range(int(PERIOD)):  # the hot node: a Pod a second, each lives 2 s
            use = self._pod(self.hot, "sweep", f"sweep-{int(now) + k}", 1)
            self.live[self.hot][use.name] = use
            self.ends[(self.hot, use.name)] = now + k + 2
            started.append(use)
        return started, stopped


class _CountingWriter(KubeWriter):
    """The operator's writer in dry-run, remembering which record each write was for."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.per_node: Counter[str] = Counter()

    def create_custom(self, plural: str, body: dict[str, Any]) -> dict[str, Any] | None:
        self.per_node[str(body["metadata"]["name"])] += 1
        return super().create_custom(plural, body)

    def patch_custom_status(self, plural: str, name: str, status: dict[str, Any]) -> None:
        self.per_node[name] += 1
        self.largest = max(getattr(self, "largest", 0), len(json.dumps(status)))
        super().patch_custom_status(plural, name, status)


def measure(nodes: int, minutes: float) -> dict[str, Any]:
    """Writes and CPU from one run, memory from a second, traced one (tracemalloc slows
    every allocation, so it would inflate the CPU figures)."""
    row = _run(nodes, minutes, trace=False)
    row.update({k: v for k, v in _run(nodes, minutes, trace=True).items() if k.startswith("kept")})
    return row


def _run(nodes: int, minutes: float, *, trace: bool) -> dict[str, Any]:
    configure_logging("console", "warning")  # each dry-run write logs at info
    fleet = Fleet(nodes)
    sim = [0.0]
    snapshots = {n: NodeSnapshot(name=n) for n in fleet.names}
    with fake_api() as api:
        writer = _CountingWriter(api=api, metrics=Metrics(), dry_run=True)
        resolver = OwnerResolver(api)
        if trace:
            tracemalloc.start()
            base = tracemalloc.take_snapshot()
        book = WorkloadBook(
            writer,
            resolver,
            node=snapshots.get,
            live=lambda n: list(fleet.live.get(n, {}).values()),
            clock=lambda: T0 + dt.timedelta(seconds=sim[0]),
        )
        book.loaded.set()
        periods = int(minutes * 60 / PERIOD)
        max_per_period = 0
        untouched_writes = 0
        first_period_writes = 0
        flush_cpu: list[float] = []
        for p in range(periods):
            sim[0] = p * PERIOD
            started, stopped = fleet.step(sim[0])
            touched = {u.node_name for u in started} | {u.node_name for u in stopped}
            book.note(started, stopped)
            writer.per_node.clear()
            t = time.process_time()
            book.flush()
            flush_cpu.append(time.process_time() - t)
            max_per_period = max(max_per_period, max(writer.per_node.values(), default=0))
            if p == 0:
                first_period_writes = sum(writer.per_node.values())
            untouched_writes += sum(c for n, c in writer.per_node.items() if n not in touched)
        kept_bytes = 0
        if trace:
            kept = tracemalloc.take_snapshot().compare_to(base, "filename")
            kept_bytes = sum(s.size_diff for s in kept)
            tracemalloc.stop()
        hot = book.record(fleet.hot)
    writes = sum(writer.writes.values())
    first_flush = flush_cpu[0]
    flush_cpu = sorted(flush_cpu[1:])
    return {
        "nodes": nodes,
        "minutes": minutes,
        "period_seconds": PERIOD,
        "pods_started": fleet.jobs + int(minutes * 60),
        "writes": writes,
        "writes_by_kind": dict(writer.writes),
        "writes_per_second": round(writes / (minutes * 60), 2),
        "first_period_writes": first_period_writes,
        "steady_writes_per_second": round(
            (writes - first_period_writes) / (minutes * 60 - PERIOD), 2
        ),
        "max_writes_one_node_one_period": max_per_period,
        "writes_to_nodes_without_change": untouched_writes,
        "idle_nodes": len(fleet.idle),
        "idle_nodes_written": sum(1 for n in fleet.idle if n in book.nodes()),
        "owner_reads": resolver.reads,
        "first_flush_cpu_s": round(first_flush, 2),
        "flush_cpu_p50_ms": round(1000 * flush_cpu[len(flush_cpu) // 2], 2),
        "flush_cpu_max_ms": round(1000 * flush_cpu[-1], 2),
        "kept_mb": round(kept_bytes / 1e6, 1),
        "kept_bytes_per_node": round(kept_bytes / nodes),
        "largest_record_bytes": getattr(writer, "largest", 0),
        "hot_node_pod_count": hot.workloads[0].pod_count if hot and hot.workloads else 0,
        "hot_node_entries": len(hot.workloads) if hot else 0,
    }


def write_results(rows: list[dict[str, Any]], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    meta = {"machine": platform.machine(), "python": platform.python_version()}
    (out / "blast.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    lines = [
        "# Workload record at scale (`python -m bench.scale.blast`)",
        "",
        "In-process, simulated clock; writes counted by the operator's writer in dry-run;",
        "owners read from a local HTTP server. See the module docstring for the fleet.",
        "",
        "| nodes | minutes | Pods started | writes | first period (every record new) "
        "| steady writes/s | max writes one node one period | writes to unchanged nodes "
        "| idle nodes written | owner reads | first flush CPU | later flushes CPU p50 / max "
        "| kept | largest record | hot node: Pods, entries |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['nodes']:,} | {r['minutes']:g} | {r['pods_started']:,} | {r['writes']:,} "
            f"| {r['first_period_writes']:,} | {r['steady_writes_per_second']} "
            f"| {r['max_writes_one_node_one_period']} "
            f"| {r['writes_to_nodes_without_change']} | {r['idle_nodes_written']} of "
            f"{r['idle_nodes']} | {r['owner_reads']:,} | {r['first_flush_cpu_s']} s "
            f"| {r['flush_cpu_p50_ms']} / "
            f"{r['flush_cpu_max_ms']} ms | {r['kept_mb']} MB ({r['kept_bytes_per_node']} B/node) "
            f"| {r['largest_record_bytes']:,} B | {r['hot_node_pod_count']:,}, "
            f"{r['hot_node_entries']} |"
        )
    (out / "blast.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.2))
    sizes = [r["nodes"] for r in rows]
    left.plot(sizes, [r["steady_writes_per_second"] for r in rows], "o-")
    left.set_title("record writes per second (churn)")
    left.set_xlabel("nodes")
    right.plot(sizes, [r["kept_mb"] for r in rows], "s-", color="tab:orange")
    right.set_title("memory kept (MB)")
    right.set_xlabel("nodes")
    for ax in (left, right):
        ax.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(out / "blast.png", dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,5000")
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    rows = [measure(int(n), args.minutes) for n in args.sizes.split(",")]
    for row in rows:
        print(json.dumps(row))
    write_results(rows, args.out)


if __name__ == "__main__":
    main()
