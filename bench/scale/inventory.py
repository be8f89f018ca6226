"""The fleet copy's own cost: time and memory of listing Nodes and Pods, by fleet size.

    python -m bench.scale.inventory [--sizes 1000,5000,10000,20000] [--pods-per-node 10]

In-process and without an API server: pages of 1,000 Node and Pod bodies shaped like a
kubelet's and a controller's (labels, taints, images, conditions, managedFields;
Pods with containers, env, volumes; a share requesting ``nvidia.com/gpu``, a few
pending) are served to :class:`sdcguard.runtime.mirror.Mirror` as JSON bytes, as the
API server would send them, and the mirror parses, slims and stores them exactly as in
the operator. Measured per size, one process for all sizes so they compare:

- CPU seconds to parse, slim and store everything (without tracemalloc; the time to
  make and serialize the pages is measured apart and taken out), per 1,000 objects,
  and the same list parsed with the json module instead of orjson (the ratio is what
  orjson saves);
- bytes kept per Node and per Pod after the list (tracemalloc, a second run);
- peak bytes during the list above what is kept (one page in flight).

What this leaves out (the end-to-end benchmark, ``bench.scale.run``, covers it): the
API server's own time to serve the pages, and the network.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import platform
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

from kubernetes import client

from sdcguard.adapters.inventory import _pod_entry, _pod_groups
from sdcguard.domain.observed import NodeSnapshot
from sdcguard.runtime import mirror as mirror_module
from sdcguard.runtime.mirror import INITIAL_EVENTS_END, NODES, PAGE_SIZE, PODS, Mirror, parse

PAGE = PAGE_SIZE
GPU_SHARE = 0.3
PENDING_SHARE = 0.01


def node_body(i: int) -> dict[str, Any]:
    name = f"gpu-{i:06d}"
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": f"{i:08d}-0000-4000-8000-000000000000",
            "resourceVersion": str(1000 + i),
            "creationTimestamp": "2026-12-01T00:00:00Z",
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "p5.48xlarge",
                "topology.kubernetes.io/zone": f"zone-{i % 3}",
                "topology.kubernetes.io/region": "region-1",
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/gpu.count": "8",
                "sdcguard.dev/state": "Qualified",
                "pool": f"pool-{i % 8}",
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "sdcguard.dev/last-qualified": "2026-12-01T00:00:00Z",
            },
            "managedFields": [
                {
                    "manager": "kubelet",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-12-01T00:00:00Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:status": {f"f:c{k}": {} for k in range(30)}},
                }
            ],
        },
        "spec": {"providerID": f"aws:///zone/i-{i:012x}", "podCIDR": "10.0.0.0/24"},
        "status": {
            "capacity": {"cpu": "192", "memory": "2Ti", "nvidia.com/gpu": "8", "pods": "110"},
            "allocatable": {"cpu": "191", "memory": "2Ti", "nvidia.com/gpu": "8", "pods": "110"},
            "conditions": [
                {
                    "type": t,
                    "status": "True" if t == "Ready" else "False",
                    "lastHeartbeatTime": "2026-12-01T00:00:00Z",
                    "lastTransitionTime": "2026-12-01T00:00:00Z",
                    "reason": f"Kubelet{t}",
                    "message": f"kubelet says {t}",
                }
                for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")
            ],
            "addresses": [{"type": "InternalIP", "address": f"10.1.{i // 250}.{i % 250}"}],
            "nodeInfo": {"systemUUID": f"ec2{i:029x}", "kubeletVersion": "v1.37.2"},
            "images": [
                {"names": [f"registry.example/team/image-{k}:v{k}"], "sizeBytes": 10**9}
                for k in range(25)
            ],
        },
    }


def pod_body(i: int, nodes: int) -> dict[str, Any]:
    gpu = (i % 100) < GPU_SHARE * 100
    pending = (i % 1000) < PENDING_SHARE * 1000
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "main",
                "image": "registry.example/team/train:v1",
                "env": [{"name": f"VAR_{k}", "value": "x" * 20} for k in range(10)],
                "resources": {
                    "requests": {"cpu": "4", "memory": "16Gi"}
                    | ({"nvidia.com/gpu": "8"} if gpu else {}),
                },
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            }
        ],
        "volumes": [{"name": "data", "emptyDir": {}}],
    }
    if not pending:
        spec["nodeName"] = f"gpu-{i % nodes:06d}"
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": f"job-{i // 8}-{i % 8}",
            "namespace": f"team-{i % 20}",
            "uid": f"{i:08d}-1111-4000-8000-000000000000",
            "resourceVersion": str(10**6 + i),
            "labels": {"app": "train", "batch.kubernetes.io/job-name": f"job-{i // 8}"},
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": f"job-{i // 8}", "uid": "u"}
            ],
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {f"f:x{k}": {} for k in range(20)}},
                }
            ],
        },
        "spec": spec,
        "status": {"phase": "Pending" if pending else "Running", "podIP": "10.2.0.1"},
    }


class PagedMirror(Mirror[Any]):
    """A Mirror whose pages come from a generator instead of an API server."""

    def __init__(self, kind: Any, slim: Any, make: Any, count: int, **kw: Any) -> None:
        super().__init__(client.ApiClient(client.Configuration()), kind, slim, **kw)
        self.make, self.count = make, count
        self.serving = 0.0
        """CPU seconds spent making and serializing pages (the API server's part)."""

    def _get_raw(self, **kwargs: Any) -> bytes:
        t0 = time.process_time()
        start = int(kwargs.get("_continue") or 0)
        end = min(self.count, start + PAGE)
        page = {
            "kind": "List",
            "metadata": {"resourceVersion": "1", "continue": str(end) if end < self.count else ""},
            "items": [self.make(i) for i in range(start, end)],
        }
        raw = json.dumps(page).encode()  # what the API server sends
        del page
        self.serving += time.process_time() - t0
        return raw  # the mirror parses it (with ``mirror.parse``; see list_cpu_seconds)


def mirrors(nodes: int, pods: int) -> tuple[PagedMirror, PagedMirror]:
    return (
        PagedMirror(NODES, NodeSnapshot.from_body, node_body, nodes, page_size=PAGE),
        PagedMirror(
            PODS,
            _pod_entry,
            lambda i: pod_body(i, nodes),
            pods,
            groups=_pod_groups,
            page_size=PAGE,
        ),
    )


def list_cpu_seconds(
    nodes: int, pods: int, parser: Any = parse, *, gc_paused: bool = True
) -> tuple[float, int]:
    """The operator's CPU seconds to list every Node and Pod, and the Pods it kept.

    ``parser``: what parses the pages (the mirror's orjson, or the json module for the
    comparison); ``gc_paused`` False: the garbage collector runs during each page, as it
    did before the mirror paused it (the comparison says what the pause saves)."""
    node_m, pod_m = mirrors(nodes, pods)
    stop = threading.Event()
    saved = mirror_module.parse, mirror_module._gc_paused
    mirror_module.parse = parser
    if not gc_paused:
        mirror_module._gc_paused = contextlib.nullcontext
    try:
        t0 = time.process_time()
        node_m.relist(stop)
        pod_m.relist(stop)
        took = time.process_time() - t0
    finally:
        mirror_module.parse, mirror_module._gc_paused = saved
    return took - node_m.serving - pod_m.serving, len(pod_m)


class Events:
    """A streaming list's response as the mirror reads it: one chunk a watch event (the
    API server flushes each), every object ``ADDED``, then the end bookmark."""

    def __init__(self, lines: list[bytes]) -> None:
        self.lines = lines

    def stream(self, amt: Any = None, decode_content: bool = False) -> Any:
        return iter(self.lines)

    def release_conn(self) -> None:
        pass


def stream_cpu_seconds(nodes: int, pods: int) -> float:
    """The operator's CPU seconds to take every Node and Pod in by streaming lists (the
    events are made and serialized before the clock starts)."""

    def events(make: Any, count: int) -> Events:
        lines = [
            json.dumps({"type": "ADDED", "object": make(i)}).encode() + b"\n" for i in range(count)
        ]
        end = {"metadata": {"resourceVersion": "2", "annotations": {INITIAL_EVENTS_END: "true"}}}
        lines.append(json.dumps({"type": "BOOKMARK", "object": end}).encode() + b"\n")
        return Events(lines)

    node_m, pod_m = mirrors(nodes, pods)
    took = 0.0
    for m, make, count in ((node_m, node_body, nodes), (pod_m, lambda i: pod_body(i, nodes), pods)):
        response = events(make, count)
        m._stream_request = lambda r=response: r  # type: ignore[method-assign]
        stop = threading.Event()
        t0 = time.process_time()
        # The stream ends after its bookmark: the mirror would watch on from there.
        m.stream_list(stop, stop.set)
        took += time.process_time() - t0
        assert m.synced.is_set() and m.stats.initial_events == count
        del response
        gc.collect()
    return took


def measure(nodes: int, pods_per_node: int) -> dict[str, Any]:
    pods = nodes * pods_per_node
    # CPU time of this process (the machine may be shared), without tracemalloc (its
    # hooks slow allocation several times over). Making and serializing the pages is
    # the API server's part, timed per page and taken out; parsing, slimming and
    # storing are the operator's.
    listed, kept_pods = list_cpu_seconds(nodes, pods)
    gc.collect()
    with_json, _ = list_cpu_seconds(nodes, pods, json.loads)
    gc.collect()
    gc_running, _ = list_cpu_seconds(nodes, pods, gc_paused=False)
    gc.collect()
    streamed = stream_cpu_seconds(nodes, pods)
    gc.collect()
    stop = threading.Event()
    # Memory.
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    node_m = PagedMirror(NODES, NodeSnapshot.from_body, node_body, nodes, page_size=PAGE)
    node_m.relist(stop)
    after_nodes = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    pod_m = PagedMirror(
        PODS, _pod_entry, lambda i: pod_body(i, nodes), pods, groups=_pod_groups, page_size=PAGE
    )
    pod_m.relist(stop)
    after_pods, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    node_bytes = (after_nodes - base) / nodes
    pod_bytes = (after_pods - after_nodes) / pods
    busy = sum(len(v) for v in pod_m.grouped().values())
    del node_m, pod_m
    gc.collect()
    return {
        "nodes": nodes,
        "pods": pods,
        "pods_kept": kept_pods,
        "pods_grouped": busy,
        "list_seconds": round(listed, 3),
        "list_seconds_json_module": round(with_json, 3),
        "list_seconds_gc_running": round(gc_running, 3),
        "stream_seconds": round(streamed, 3),
        "seconds_per_1000_objects": round(listed / (nodes + pods) * 1000, 4),
        "kept_mb": round((after_pods - base) / 2**20, 1),
        "bytes_per_node": round(node_bytes),
        "bytes_per_pod_listed": round(pod_bytes),
        "peak_above_kept_mb": round((peak - after_pods) / 2**20, 1),
    }


def linear_fit(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least squares y = a + b x; returns (a, b, r²)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    b = sxy / sxx
    a = my - b * mx
    ss_res = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys, strict=True))
    ss_tot = sum((y - my) ** 2 for y in ys) or 1.0
    return a, b, 1 - ss_res / ss_tot


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,5000,10000,20000")
    parser.add_argument("--pods-per-node", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    for n in sizes:
        print(f"[inventory] {n:,} nodes, {n * args.pods_per_node:,} pods ...", flush=True)
        row = measure(n, args.pods_per_node)
        print(f"[inventory]   {row}", flush=True)
        rows.append(row)
    objects = [float(r["nodes"] + r["pods"]) for r in rows]
    a, b, r2 = linear_fit(objects, [r["list_seconds"] for r in rows])
    result = {
        "machine": f"{platform.machine()}, {platform.python_version()}",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "pods_per_node": args.pods_per_node,
        "rows": rows,
        "fit": {"intercept_s": round(a, 4), "seconds_per_object": b, "r2": round(r2, 5)},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "inventory.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# The fleet copy's own cost (in-process, no API server)",
        "",
        "CPU seconds of the listing process; "
        f"`python -m bench.scale.inventory --sizes {args.sizes}`, {result['when']}, "
        f"{args.pods_per_node} pods per node ({GPU_SHARE:.0%} holding GPUs, "
        f"{PENDING_SHARE:.0%} pending); pages of {PAGE}.",
        "",
        "| nodes | pods | pods kept | paged list CPU time | with the json module (ratio) |"
        " with the collector running (ratio) | streaming list (ratio) |"
        " CPU s per 1,000 objects | kept | per node | per pod listed | peak above kept |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        listed = r["list_seconds"] or 1e-9
        ratio = r["list_seconds_json_module"] / listed
        lines.append(
            f"| {r['nodes']:,} | {r['pods']:,} | {r['pods_kept']:,} | {r['list_seconds']} s |"
            f" {r['list_seconds_json_module']} s ({ratio:.2f}x) |"
            f" {r['list_seconds_gc_running']} s ({r['list_seconds_gc_running'] / listed:.2f}x) |"
            f" {r['stream_seconds']} s ({r['stream_seconds'] / listed:.2f}x) |"
            f" {r['seconds_per_1000_objects']} | {r['kept_mb']} MB | {r['bytes_per_node']} B |"
            f" {r['bytes_per_pod_listed']} B | {r['peak_above_kept_mb']} MB |"
        )
    lines += [
        "",
        f"Linear fit of the paged list's time against objects: {b * 1e6:.1f} µs per object, "
        f"intercept {a:.3f} s, r² = {r2:.4f}.",
        "",
        "Ratios are against the paged list of the same row. The mirror pauses the garbage"
        " collector while a page is parsed and slimmed (a page's 150,000 objects alive at"
        " once otherwise make it scan the whole copy again and again); the collector"
        " column is the same list without that pause. The operator lists by streaming"
        " lists where the API server serves them (its events come one at a time, so the"
        " collector is not paused); paged lists are the fallback.",
        "",
    ]
    (args.out / "inventory.md").write_text("\n".join(lines))
    plot(rows, a, b, args.out / "inventory.png")
    print("\n".join(lines))


def plot(rows: list[dict[str, Any]], a: float, b: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    objects = [r["nodes"] + r["pods"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(objects, [r["list_seconds"] for r in rows], "o", label="measured")
    left.plot(objects, [a + b * x for x in objects], "-", label="linear fit")
    left.set_xlabel("Nodes + Pods listed")
    left.set_ylabel("CPU seconds")
    left.set_title("Initial list (parse, slim, store)")
    left.legend()
    right.plot([r["nodes"] for r in rows], [r["kept_mb"] for r in rows], "o-", label="kept")
    right.plot(
        [r["nodes"] for r in rows],
        [r["kept_mb"] + r["peak_above_kept_mb"] for r in rows],
        "s--",
        label="peak during the list",
    )
    right.set_xlabel("nodes (pods = 10 per node)")
    right.set_ylabel("MB")
    right.set_title("Memory of the fleet copy")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
