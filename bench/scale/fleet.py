"""The benchmark's side of the cluster: nodes, a fast fake kubelet, and watchers.

Everything here talks raw JSON to the API server (``_preload_content=False``):
on thousands of nodes, deserializing into the client's models would cost the
benchmark process more CPU than the operator it measures, on the same cores.

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

from sdcdev.harness import NS, result_message, terminated_probe

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


# Workload Pods ------------------------------------------------------------------------

WORK_NAMESPACES = tuple(f"bench-team-{i}" for i in range(4))
WORK_LABEL = "sdcguard.bench/work"
OWNER_GROUP = "kubeflow.org"
OWNER_VERSION = "v1"
OWNER_KIND = "PyTorchJob"
OWNER_PLURAL = "pytorchjobs"
GPU_PODS_PER_NODE = 4
"""GPU Pods on a node that carries GPU work: two GPUs each, the node's eight in use."""
GPUS_PER_POD = 2
WORKERS_PER_JOB = 8
"""Worker Pods per training job (each on its own node), as a PyTorchJob places them."""


def owner_crd() -> dict[str, Any]:
    """A minimal stand-in for the training operator's PyTorchJob CRD (same group, kind
    and plural), so GPU Pods have an owner that no controller here acts on: the
    operator's owner resolver reads it by discovery like the real one."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{OWNER_PLURAL}.{OWNER_GROUP}"},
        "spec": {
            "group": OWNER_GROUP,
            "scope": "Namespaced",
            "names": {"plural": OWNER_PLURAL, "singular": "pytorchjob", "kind": OWNER_KIND},
            "versions": [
                {
                    "name": OWNER_VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }


def pod_body(
    name: str, namespace: str, node: str, *, gpus: int = 0, owner: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A Pod bound to ``node`` (no scheduler): a CPU worker, or a training worker holding
    ``gpus`` GPUs and owned by ``owner`` (an ownerReference)."""
    resources: dict[str, Any] = {"requests": {"cpu": "100m", "memory": "128Mi"}}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
        resources["requests"]["nvidia.com/gpu"] = str(gpus)
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": {WORK_LABEL: "gpu" if gpus else "cpu", "app": name.rsplit("-", 1)[0]},
    }
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": "bench/worker:1",
                    "command": ["sleep", "infinity"],
                    "resources": resources,
                }
            ],
        },
    }


def _running_status(image: str = "bench/worker:1") -> dict[str, Any]:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "phase": "Running",
        "startTime": stamp,
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": stamp}],
        "containerStatuses": [
            {
                "name": "main",
                "image": image,
                "imageID": "",
                "ready": True,
                "restartCount": 0,
                "started": True,
                "state": {"running": {"startedAt": stamp}},
            }
        ],
    }


class RawPods:
    """Pod create / status / delete as pre-encoded JSON over one urllib3 pool: the
    client library's models and request building cost the benchmark more CPU per Pod
    than the API server spends, on the same cores."""

    def __init__(self, api: client.ApiClient, connections: int) -> None:
        import urllib3

        cfg = api.configuration
        self.host = cfg.host.rstrip("/")
        self.pool = urllib3.PoolManager(
            num_pools=2,
            maxsize=connections,
            block=True,
            cert_reqs="CERT_REQUIRED",
            ca_certs=cfg.ssl_ca_cert,
            cert_file=cfg.cert_file,
            key_file=cfg.key_file,
        )
        self.headers = {"Accept": "application/json"}
        token = cfg.get_api_key_with_prefix("authorization") or cfg.api_key.get("BearerToken")
        if token:
            self.headers["Authorization"] = token if " " in token else f"Bearer {token}"

    def _call(self, method: str, path: str, body: Any = None, ctype: str = "") -> int:
        headers = dict(self.headers)
        data = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            headers["Content-Type"] = ctype or "application/json"
        resp = self.pool.request(
            method, self.host + path, body=data, headers=headers, retries=False, timeout=30.0
        )
        resp.drain_conn()
        return int(resp.status)

    def create(self, namespace: str, body: dict[str, Any]) -> int:
        return self._call("POST", f"/api/v1/namespaces/{namespace}/pods", body)

    def set_status(self, namespace: str, name: str, status: dict[str, Any]) -> int:
        return self._call(
            "PATCH",
            f"/api/v1/namespaces/{namespace}/pods/{name}/status",
            {"status": status},
            "application/merge-patch+json",
        )

    def delete(self, namespace: str, name: str) -> int:
        return self._call(
            "DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}?gracePeriodSeconds=0"
        )


@dataclass
class _Slot:
    """One Pod the workload keeps alive: where it runs and what it holds."""

    namespace: str
    node: str
    gpus: int
    owner: dict[str, Any] | None
    name: str = ""


class PodWorkload:
    """Pods bound to the fleet's nodes, kept Running, with churn (the bench's kubelet).

    CPU Pods (no accelerators: they never make a node busy for sdcguard) run on every
    fleet node; GPU Pods (``GPUS_PER_POD`` each, owned by PyTorchJobs of
    ``WORKERS_PER_JOB`` workers) are added to some nodes once the fleet is qualified.
    Churn deletes a share of the Pods per minute and creates each one's replacement
    (a CPU Pod on a random fleet node, a GPU worker on the same node for the same job),
    so the counts stay put. Everything goes through raw JSON requests from a thread pool.
    ``changes[node]`` lists when the benchmark changed a GPU Pod on that node.
    """

    def __init__(self, api: client.ApiClient, threads: int = 12, seed: int = 7) -> None:
        import random

        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.threads = threads
        self.raw = RawPods(api, threads + 4)
        self.rng = random.Random(seed)
        self.slots: list[_Slot] = []
        self.lock = threading.Lock()
        self.serial = 0
        self.created = 0
        self.deleted = 0
        self.errors: dict[str, int] = defaultdict(int)
        self.changes: dict[str, list[float]] = defaultdict(list)
        self.cpu_nodes: list[str] = []
        self.churn_per_minute = 0.0
        self._stop = threading.Event()
        self._churner: threading.Thread | None = None

    # Set-up -------------------------------------------------------------------------

    def prepare(self) -> None:
        """Namespaces (with their default ServiceAccount) and the owner CRD."""
        from kubernetes.client import ApiextensionsV1Api

        for ns in WORK_NAMESPACES:
            try:
                self.core.create_namespace({"metadata": {"name": ns}})
            except ApiException as exc:
                if exc.status != 409:
                    raise
        try:
            ApiextensionsV1Api(self.api).create_custom_resource_definition(owner_crd())
        except ApiException as exc:
            if exc.status != 409:
                raise
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                self.custom.list_namespaced_custom_object(
                    OWNER_GROUP, OWNER_VERSION, WORK_NAMESPACES[0], OWNER_PLURAL, limit=1
                )
                for ns in WORK_NAMESPACES:
                    self.core.read_namespaced_service_account("default", ns)
                return
            except ApiException:
                time.sleep(0.5)
        raise RuntimeError("work namespaces or the PyTorchJob stand-in were not ready in 60 s")

    def _next_name(self, prefix: str) -> str:
        with self.lock:
            self.serial += 1
            return f"{prefix}-{self.serial:07d}"

    def _start(self, slot: _Slot) -> bool:
        """Create the slot's Pod and set it Running; False on an API error (counted)."""
        slot.name = self._next_name("train" if slot.gpus else "cpu")
        body = pod_body(slot.name, slot.namespace, slot.node, gpus=slot.gpus, owner=slot.owner)
        try:
            code = self.raw.create(slot.namespace, body)
            if code < 300:
                code = self.raw.set_status(slot.namespace, slot.name, _running_status())
        except Exception as exc:  # a dropped connection: counted, the slot tried again later
            code = type(exc).__name__  # type: ignore[assignment]
        if not isinstance(code, int) or code >= 300:
            with self.lock:
                self.errors[f"start {code}"] += 1
            return False
        with self.lock:
            self.created += 1
            if slot.gpus:
                self.changes[slot.node].append(time.time())
        return True

    def _stop_pod(self, slot: _Slot) -> None:
        try:
            code = self.raw.delete(slot.namespace, slot.name)
        except Exception as exc:  # counted; the Pod stays and its slot is replaced anyway
            code = type(exc).__name__  # type: ignore[assignment]
        if code != 404 and (not isinstance(code, int) or code >= 300):
            with self.lock:
                self.errors[f"delete {code}"] += 1
            return
        with self.lock:
            self.deleted += 1
            if slot.gpus:
                self.changes[slot.node].append(time.time())

    def _run_all(self, slots: list[_Slot], progress: Callable[[int], None] | None) -> None:
        done = 0
        step = max(1000, len(slots) // 20)
        with ThreadPoolExecutor(max_workers=self.threads) as pool:
            for ok, slot in zip(pool.map(self._start, slots), slots, strict=True):
                if ok:
                    with self.lock:
                        self.slots.append(slot)
                done += 1
                if progress and done % step == 0:
                    progress(done)

    def add_cpu_pods(
        self, nodes: list[str], count: int, progress: Callable[[int], None] | None = None
    ) -> float:
        """``count`` CPU Pods spread round-robin over ``nodes``; returns the seconds it
        took."""
        self.cpu_nodes = list(nodes)
        slots = [
            _Slot(WORK_NAMESPACES[i % len(WORK_NAMESPACES)], nodes[i % len(nodes)], 0, None)
            for i in range(count)
        ]
        t0 = time.monotonic()
        self._run_all(slots, progress)
        return time.monotonic() - t0

    def add_gpu_pods(
        self, nodes: list[str], progress: Callable[[int], None] | None = None
    ) -> float:
        """``GPU_PODS_PER_NODE`` GPU workers on each of ``nodes``, owned by PyTorchJobs
        of ``WORKERS_PER_JOB`` nodes each; returns the seconds it took."""
        t0 = time.monotonic()
        slots: list[_Slot] = []
        groups = [nodes[i : i + WORKERS_PER_JOB] for i in range(0, len(nodes), WORKERS_PER_JOB)]
        for j, group in enumerate(groups):
            for k in range(GPU_PODS_PER_NODE):
                ns = WORK_NAMESPACES[(j + k) % len(WORK_NAMESPACES)]
                name = f"llm-{j:04d}-{k}"
                job = self.custom.create_namespaced_custom_object(
                    OWNER_GROUP,
                    OWNER_VERSION,
                    ns,
                    OWNER_PLURAL,
                    {
                        "apiVersion": f"{OWNER_GROUP}/{OWNER_VERSION}",
                        "kind": OWNER_KIND,
                        "metadata": {"name": name},
                        "spec": {"workers": len(group)},
                    },
                )
                owner = {
                    "apiVersion": f"{OWNER_GROUP}/{OWNER_VERSION}",
                    "kind": OWNER_KIND,
                    "name": name,
                    "uid": job["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": False,
                }
                slots.extend(_Slot(ns, node, GPUS_PER_POD, owner) for node in group)
        self._run_all(slots, progress)
        return time.monotonic() - t0

    # Churn --------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        with self.lock:
            gpu = sum(1 for s in self.slots if s.gpus)
            return {
                "pods": len(self.slots),
                "gpu_pods": gpu,
                "cpu_pods": len(self.slots) - gpu,
                "created": self.created,
                "deleted": self.deleted,
                "errors": sum(self.errors.values()),
            }

    def start_churn(self, share_per_minute: float) -> None:
        """Replace ``share_per_minute`` of the Pods every minute (in ticks of a second)."""
        self.churn_per_minute = share_per_minute
        if share_per_minute <= 0 or self._churner is not None:
            return
        self._churner = threading.Thread(target=self._churn, name="bench-churn", daemon=True)
        self._churner.start()

    def stop_churn(self) -> None:
        self._stop.set()
        if self._churner is not None:
            self._churner.join(timeout=30)

    def _replace(self, index: int) -> None:
        with self.lock:
            if index >= len(self.slots):
                return
            old = self.slots[index]
        self._stop_pod(old)
        node = old.node if old.gpus else self.rng.choice(self.cpu_nodes or [old.node])
        new = _Slot(old.namespace, node, old.gpus, old.owner)
        if self._start(new):
            with self.lock:
                self.slots[index] = new

    def _churn(self) -> None:
        owed = 0.0
        with ThreadPoolExecutor(max_workers=4) as pool:
            while not self._stop.wait(1.0):
                with self.lock:
                    total = len(self.slots)
                owed += total * self.churn_per_minute / 60
                take, owed = int(owed), owed - int(owed)
                if not take or not total:
                    continue
                picks = self.rng.sample(range(total), min(take, total))
                list(pool.map(self._replace, picks))
