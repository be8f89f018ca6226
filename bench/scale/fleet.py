"""The benchmark's side of the cluster: nodes, a fast fake kubelet, and watchers.

Everything here talks raw JSON to the API server (``_preload_content=False``):
at 5,000 nodes, deserializing into the client's models would cost the benchmark
process more CPU than the operator it measures, on the same cores.

- :func:`register_nodes` creates Ready GPU nodes (``nvidia.com/gpu: 8``) with the
  gate taint, as kubelet ``--register-with-taints`` would; nothing heartbeats them
  (the control plane runs without the node-lifecycle controller).
- :class:`FastKubelet` watches probe Pods and completes each one as soon as it is
  bound, with a canned probe result per node (pass, or SDC on a few nodes), and
  records when each Pod terminated.
- :class:`NodeWatch` and :class:`JobWatch` record when each node changed taints or
  state and when each probe Job appeared, on the benchmark's clock.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from tests.operator.harness import NS, result_message, terminated_probe

GATE = "sdcguard.dev/unqualified"
TESTING = "sdcguard.dev/testing"
QUARANTINE = "sdcguard.dev/quarantined"
STATE_LABEL = "sdcguard.dev/state"
FLEET_LABEL = "sdcguard.bench/fleet"
PROBE_SELECTOR = "app.kubernetes.io/component=sdcprobe"
NODE_LABEL = "sdcguard.dev/node"


def node_name(i: int) -> str:
    return f"gpu-{i:05d}"


def node_body(
    name: str, *, gpus: int = 8, fleet: bool = True, gated: bool = True
) -> dict[str, Any]:
    """A Ready node as a kubelet registers it (capacity for one full-node probe Pod)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    resources = {"cpu": "192", "memory": "2048Gi", "pods": "110"}
    if gpus:
        resources["nvidia.com/gpu"] = str(gpus)
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}
    if fleet:
        labels[FLEET_LABEL] = "true"
    spec: dict[str, Any] = {"providerID": f"bench://{name}"}
    if gated:
        spec["taints"] = [{"key": GATE, "effect": "NoSchedule"}]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": name,
                "containerRuntimeVersion": "containerd://1.7.0",
                "kernelVersion": "6.1.0",
                "kubeProxyVersion": "",
                "kubeletVersion": "v1.37.2",
                "machineID": name,
                "operatingSystem": "linux",
                "osImage": "bench",
                "systemUUID": name,
            },
        },
    }


def register_nodes(
    api: client.ApiClient,
    names: list[str],
    *,
    threads: int = 8,
    progress: Callable[[int], None] | None = None,
    created_at: dict[str, float] | None = None,
) -> None:
    """Create the nodes (in parallel), without the not-ready taint admission adds."""
    core = client.CoreV1Api(api)

    def one(name: str) -> None:
        body = node_body(name)
        try:
            core.create_node(body, _preload_content=False)
        except ApiException as exc:
            if exc.status != 409:
                raise
        if created_at is not None:
            created_at[name] = time.time()
        # Admission adds node.kubernetes.io/not-ready at creation; the node-lifecycle
        # controller (not running here) would lift it once the node is Ready.
        taints = body["spec"].get("taints", [])
        core.patch_node(name, {"spec": {"taints": taints}}, _preload_content=False)

    done = 0
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for _ in pool.map(one, names):
            done += 1
            if progress and done % 250 == 0:
                progress(done)
    # Status sent with create is kept for Nodes; check once, patch if a server dropped it.
    sample = json.loads(core.read_node(names[0], _preload_content=False).data)
    if not (sample.get("status") or {}).get("conditions"):
        for name in names:
            core.patch_node_status(name, {"status": node_body(name)["status"]})


def _lines(resp: Any) -> Iterator[dict[str, Any]]:
    buf = b""
    for chunk in resp.stream(65536):
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip():
                yield json.loads(line)


class RawWatch(threading.Thread):
    """List then watch one collection as raw JSON, calling ``handle(type, obj)``."""

    def __init__(
        self,
        lister: Callable[..., Any],
        handle: Callable[[str, dict[str, Any]], None],
        name: str,
        **params: Any,
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.lister = lister
        self.handle = handle
        self.params = params
        self.stop = threading.Event()
        self.synced = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                listed = json.loads(self.lister(**self.params, _preload_content=False).data)
                for item in listed.get("items", []):
                    self.handle("ADDED", item)
                self.synced.set()
                rv = listed["metadata"]["resourceVersion"]
                while not self.stop.is_set():
                    resp = self.lister(
                        **self.params,
                        watch=True,
                        resource_version=rv,
                        allow_watch_bookmarks=True,
                        timeout_seconds=60,
                        _preload_content=False,
                        _request_timeout=(5, 90),
                    )
                    try:
                        for event in _lines(resp):
                            obj = event.get("object") or {}
                            if event.get("type") == "ERROR":
                                raise RuntimeError(f"watch error: {obj.get('message')}")
                            rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                            if event.get("type") != "BOOKMARK":
                                self.handle(str(event.get("type")), obj)
                            if self.stop.is_set():
                                break
                    finally:
                        resp.release_conn()
            except Exception:  # relist after any trouble (410 Gone, a dropped stream)
                if not self.stop.is_set():
                    time.sleep(0.5)


@dataclass
class NodeRecord:
    """What the benchmark saw happen to one node, on its own clock."""

    state: str | None = None
    taints: frozenset[str] = frozenset()
    released: list[float] = field(default_factory=list)
    """Times the gate/testing taints went away (the node was returned to service)."""
    quarantined: list[float] = field(default_factory=list)
    """Times the quarantine taint appeared."""


class NodeWatch:
    """Taints and state label of every fleet node, with the times they changed."""

    def __init__(self, api: client.ApiClient) -> None:
        self.nodes: dict[str, NodeRecord] = defaultdict(NodeRecord)
        self.lock = threading.Lock()
        self.watch = RawWatch(
            client.CoreV1Api(api).list_node,
            self._handle,
            "bench-node-watch",
            label_selector=f"{FLEET_LABEL}=true",
        )

    def start(self) -> NodeWatch:
        self.watch.start()
        return self

    def _handle(self, kind: str, obj: dict[str, Any]) -> None:
        now = time.time()
        meta = obj.get("metadata") or {}
        name = meta.get("name", "")
        if kind == "DELETED":
            return
        taints = frozenset(t.get("key", "") for t in (obj.get("spec") or {}).get("taints") or [])
        state = (meta.get("labels") or {}).get(STATE_LABEL)
        with self.lock:
            rec = self.nodes[name]
            held_before = bool(rec.taints & {GATE, TESTING})
            held_now = bool(taints & {GATE, TESTING})
            if held_before and not held_now:
                rec.released.append(now)
            if QUARANTINE in taints and QUARANTINE not in rec.taints:
                rec.quarantined.append(now)
            rec.taints, rec.state = taints, state

    def states(self) -> dict[str, str | None]:
        with self.lock:
            return {name: rec.state for name, rec in self.nodes.items()}

    def record(self, name: str) -> NodeRecord:
        with self.lock:
            rec = self.nodes[name]
            return NodeRecord(rec.state, rec.taints, list(rec.released), list(rec.quarantined))


class JobWatch:
    """When each probe Job appeared, by node."""

    def __init__(self, api: client.ApiClient) -> None:
        self.created: dict[str, list[float]] = defaultdict(list)
        self.seen: set[str] = set()
        self.lock = threading.Lock()
        self.watch = RawWatch(
            client.BatchV1Api(api).list_namespaced_job,
            self._handle,
            "bench-job-watch",
            namespace=NS,
            label_selector=PROBE_SELECTOR,
        )

    def start(self) -> JobWatch:
        self.watch.start()
        return self

    def _handle(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        name = meta.get("name", "")
        if kind != "ADDED" or name in self.seen:
            return
        node = (meta.get("labels") or {}).get(NODE_LABEL, "")
        with self.lock:
            self.seen.add(name)
            self.created[node].append(time.time())


class FastKubelet:
    """Completes probe Pods as soon as they are bound, with canned probe results.

    One watch finds bound, unfinished probe Pods; a few worker threads write their
    terminal status (exit code and termination message, as a kubelet reports them).
    ``terminated[node]`` lists the times (after the status write returned) at which
    that node's probe Pods ended.
    """

    def __init__(self, api: client.ApiClient, sdc_nodes: set[str], workers: int = 4) -> None:
        self.core = client.CoreV1Api(api)
        self.sdc_nodes = sdc_nodes
        self.hold: set[str] = set()
        """Nodes whose probe Pods are kept running until :meth:`release`."""
        self._held: list[tuple[str, str, tuple[str, ...], str]] = []
        self.terminated: dict[str, list[float]] = defaultdict(list)
        self.completed = 0
        self._handled: set[str] = set()
        self._queue: queue.Queue[tuple[str, str, tuple[str, ...], str] | None] = queue.Queue()
        self._messages: dict[tuple[str, tuple[str, ...]], tuple[int, str]] = {}
        self.lock = threading.Lock()
        self.watch = RawWatch(
            self.core.list_namespaced_pod,
            self._handle,
            "bench-kubelet-watch",
            namespace=NS,
            label_selector=PROBE_SELECTOR,
        )
        self._workers = [
            threading.Thread(target=self._work, name=f"bench-kubelet-{i}", daemon=True)
            for i in range(workers)
        ]

    def start(self) -> FastKubelet:
        for worker in self._workers:
            worker.start()
        self.watch.start()
        return self

    def stop(self) -> None:
        self.watch.stop.set()
        for _ in self._workers:
            self._queue.put(None)

    def _handle(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            return
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        node = spec.get("nodeName")
        phase = (obj.get("status") or {}).get("phase")
        name = meta.get("name", "")
        if not node or phase in ("Succeeded", "Failed") or name in self._handled:
            return
        self._handled.add(name)
        args = list((spec.get("containers") or [{}])[0].get("args") or [])
        checks = tuple(args[args.index("--checks") + 1].split(",")) if "--checks" in args else ()
        image = (spec.get("containers") or [{}])[0].get("image", "")
        with self.lock:
            if node in self.hold:
                self._held.append((name, node, checks, image))
                return
        self._queue.put((name, node, checks, image))

    def release(self) -> int:
        """Complete the held probe Pods now (and hold no more); returns how many."""
        with self.lock:
            held, self._held = self._held, []
            self.hold.clear()
        for item in held:
            self._queue.put(item)
        return len(held)

    def _message(self, outcome: str, checks: tuple[str, ...]) -> tuple[int, str]:
        key = (outcome, checks)
        if key not in self._messages:
            default = ("compute", "collective", "golden")
            self._messages[key] = result_message(outcome, checks or default)
        return self._messages[key]

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            name, node, checks, image = item
            outcome = "sdc" if node in self.sdc_nodes else "pass"
            code, message = self._message(outcome, checks)
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            status = {
                "phase": "Succeeded" if code == 0 else "Failed",
                "startTime": stamp,
                "containerStatuses": [terminated_probe(image, code, message, stamp)],
            }
            for _attempt in range(5):
                try:
                    self.core.patch_namespaced_pod_status(
                        name, NS, {"status": status}, _preload_content=False
                    )
                except ApiException as exc:
                    if exc.status == 404:
                        break
                    time.sleep(0.2)
                    continue
                with self.lock:
                    self.terminated[node].append(time.time())
                    self.completed += 1
                break
