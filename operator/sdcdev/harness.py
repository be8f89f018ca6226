"""Helpers that run the operator against the real local control plane (tests, benchmarks).

- :class:`OperatorProcess` runs ``python -m sdcguard`` as a real process (so a
  test can SIGKILL it) with the test cluster's kubeconfig.
- :class:`ProbeKubelet` completes probe Pods bound to test nodes with probe
  result documents built from the probe's own result models, per node: pass,
  SDC, digest mismatch, garbage, truncated, or never. (The fleet simulator runs
  the real probe; these tests are about the operator's decisions.)
- Nodes are registered and kept Ready by the simulator's heartbeat loop.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, cast

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from sdcdev import REPO
from sdcdev.sim.fleet import Fleet, NodeConfig, load_fleet
from sdcdev.sim.kube import Kube
from sdcdev.sim.nodes import Heartbeats
from sdcdev.sim.ports import free_port
from sdcguard.api import baseline_name
from sdcprobe.result import CheckResult, Fingerprint, ProbeResult, encode_for_termination

NS = "sdcguard-system"
RESYNC_SECONDS = 5
"""The test operator's resync period: a full pass over every node at least this often."""
GROUP, VERSION = "sdcguard.dev", "v1alpha1"


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, every: float = 0.3) -> Any:
    """Poll until ``predicate()`` is truthy; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


MetricsSource = str | Callable[[], str | None]
"""Where an operator's /metrics is read: its URL, or a function that returns the page
(None while it does not answer), for an operator reached another way (a Pod, through
the API server's proxy)."""


def reconcile_passes(metrics: MetricsSource, policy: str, kind: str = "full") -> int | None:
    """How many reconcile passes of ``kind`` an operator finished for ``policy``, read from
    its own ``sdcguard_reconcile_passes_total`` at ``metrics``; None while /metrics
    does not answer (the process is starting, restarting or gone)."""
    if callable(metrics):
        text = metrics()
    else:
        try:
            with urllib.request.urlopen(metrics, timeout=5) as resp:
                text = resp.read().decode()
        except OSError:
            text = None
    if text is None:
        return None
    wanted = {"policy": policy, "kind": kind}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "sdcguard_reconcile_passes_total" and sample.labels == wanted:
                return int(sample.value)
    return 0


def wait_passes(
    metrics: MetricsSource,
    policy: str,
    count: int = 2,
    kind: str = "full",
    *,
    resync: float = RESYNC_SECONDS,
    timeout: float | None = None,
) -> int:
    """Return once the operator whose /metrics page ``metrics`` reads (its URL, or a
    function that returns the page) has finished ``count`` more passes of ``kind`` for
    ``policy`` than it had at the call; returns the count reached.

    This is how a test proves that nothing happened: a full pass decides every node of
    the policy, and a pass is counted once its writes are done. The first pass counted
    may have begun before the call, so ``count=2`` means at least one whole full pass
    after it. Fails when the operator stalls: no such passes within ``timeout`` (by
    default ``count`` resync periods three times over, plus a margin for a loaded
    machine)."""
    read = wait_for(
        lambda: [n] if (n := reconcile_passes(metrics, policy, kind)) is not None else None,
        30,
        "the operator's /metrics to answer",
    )
    start: int = read[0]
    limit = timeout if timeout is not None else 3 * count * resync + 30
    done = wait_for(
        lambda: (
            (n := reconcile_passes(metrics, policy, kind)) is not None
            and n >= start + count
            and [n]
        ),
        limit,
        f"{count} more {kind} passes of policy {policy} after pass {start} "
        "(has the operator stalled?)",
    )
    return cast(int, done[0])


def create_or_replace_crds(api: client.ApiClient, crd_dir: Path) -> None:
    """Create every CRD in ``crd_dir``, or replace the one already there."""
    ext = client.ApiextensionsV1Api(api)
    for path in sorted(crd_dir.glob("*.yaml")):
        body = yaml.safe_load(path.read_text())
        try:
            ext.create_custom_resource_definition(body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            current = ext.read_custom_resource_definition(body["metadata"]["name"])
            assert current.metadata is not None
            body["metadata"]["resourceVersion"] = current.metadata.resource_version
            ext.replace_custom_resource_definition(body["metadata"]["name"], body)


def apply_crds(api: client.ApiClient) -> None:
    create_or_replace_crds(api, REPO / "crds")
    custom = client.CustomObjectsApi(api)
    for plural in ("sdcpolicies", "sdctests", "repairtickets", "sdcbaselines", "sdchardwares"):
        wait_for(functools.partial(_served, custom, plural), 30, f"CRD {plural} to be served")


def create_sdctest(
    custom: client.CustomObjectsApi,
    name: str,
    spec: dict[str, Any],
    status: dict[str, Any] | None = None,
) -> None:
    """An SDCTest as a person or the operator writes one: created, then its status (a
    subresource, so the create alone never sets it) when ``status`` is given."""
    custom.create_cluster_custom_object(
        GROUP,
        VERSION,
        "sdctests",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SDCTest",
            "metadata": {"name": name},
            "spec": spec,
        },
    )
    if status is not None:
        custom.patch_cluster_custom_object_status(
            GROUP, VERSION, "sdctests", name, {"status": status}
        )


def _served(custom: client.CustomObjectsApi, plural: str) -> bool:
    try:
        custom.list_cluster_custom_object(GROUP, VERSION, plural, limit=1)
    except ApiException:
        return False
    return True


def ensure_namespace(api: client.ApiClient, name: str = NS) -> None:
    with contextlib.suppress(ApiException):
        client.CoreV1Api(api).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=name))
        )


# Probe results ----------------------------------------------------------------

FINGERPRINT = Fingerprint.build(
    backend="cpu",
    device_model="test-cpu",
    device_count=2,
    driver=None,
    runtime=None,
    torch="2.9.0",
    torch_xla=None,
    cpu_isa="x86_64-avx2",
    threads=1,
    config_hash="test",
)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


HEALTHY = {c: _digest(f"healthy-{c}") for c in ("compute", "collective", "golden", "memory")}


def result_message(
    outcome: str,
    checks: tuple[str, ...] = ("compute", "collective", "golden"),
    devices: tuple[str, ...] = (),
) -> tuple[int, str]:
    """(exit code, termination message) of a probe run with ``outcome``.

    ``sdc@D@S``: SDC found by golden on device D from step S (plain ``sdc``: 1 and 3);
    ``sdc@D+E@S``: and by compute on device E.
    ``devices``: the device UUIDs the probe names, by index."""
    outcome, _, where = outcome.partition("@")
    device, _, step = where.partition("@")
    device, _, other = device.partition("+")
    odd_device, first_step = int(device or 1), int(step or 3)
    if outcome == "garbage":
        return 0, "Segmentation fault (core dumped)"
    if outcome == "empty":
        return 0, ""
    results: dict[str, CheckResult] = {}
    for check in checks:
        digest = HEALTHY[check]
        if outcome == "mismatch" and check == "golden":
            digest = _digest("corrupted")
        if outcome == "sdc" and check == "golden":
            results[check] = CheckResult(
                verdict="fail",
                reason=f"device {odd_device} disagrees with the others from step {first_step}",
                digest=_digest("corrupted"),
                odd_device=odd_device,
                first_divergent_step=first_step,
                first_divergent_submodule="layers.0.attention.output",
            )
            continue
        if outcome == "sdc" and check == "compute" and other:
            results[check] = CheckResult(
                verdict="fail",
                reason=f"device {other} disagrees with the others",
                digest=_digest("corrupted"),
                odd_device=int(other),
            )
            continue
        results[check] = CheckResult(verdict="pass", digest=digest)
    verdict: Literal["fail", "pass"] = "fail" if outcome == "sdc" else "pass"
    result = ProbeResult(
        verdict=verdict,
        fingerprint=FINGERPRINT,
        checks=results,
        duration_s=1.0,
        devices=list(devices),
    )
    text = encode_for_termination(result)
    if outcome == "truncated":
        return 0, text[: len(text) // 2]
    return (1 if outcome == "sdc" else 0), text


def terminated_probe(image: str | None, code: int, message: str, at: str) -> dict[str, Any]:
    """The status of a probe container that ended at ``at`` with ``code`` and ``message``,
    as the kubelet reports it."""
    return {
        "name": "sdcprobe",
        "image": image,
        "imageID": "",
        "ready": False,
        "restartCount": 0,
        "state": {
            "terminated": {
                "exitCode": code,
                "reason": "Completed" if code == 0 else "Error",
                "message": message,
                "startedAt": at,
                "finishedAt": at,
            }
        },
    }


class ProbeKubelet:
    """Completes probe Pods bound to known nodes, as a kubelet would report them."""

    def __init__(
        self,
        api: client.ApiClient,
        outcomes: dict[str, str],
        namespace: str = NS,
        devices: dict[str, tuple[str, ...]] | None = None,
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.namespace = namespace
        self.outcomes = outcomes
        self.devices = devices or {}
        """node -> the device UUIDs its probe names."""
        """node -> pass | sdc | sdc@DEVICE@STEP | mismatch | garbage | empty | truncated |
        never."""
        self.completed: list[tuple[str, str, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ProbeKubelet:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                pods = self.core.list_namespaced_pod(
                    self.namespace, label_selector="app.kubernetes.io/component=sdcprobe"
                ).items
            except Exception:
                time.sleep(0.5)
                continue
            for pod in pods:
                node = pod.spec.node_name if pod.spec else None
                if not node or node not in self.outcomes:
                    continue
                if pod.status and pod.status.phase in ("Succeeded", "Failed"):
                    continue
                outcome = self.outcomes[node]
                if outcome == "never":
                    continue
                self._complete(pod, outcome)
            time.sleep(0.2)

    def _complete(self, pod: client.V1Pod, outcome: str) -> None:
        assert pod.spec is not None and pod.spec.node_name is not None
        assert pod.metadata is not None and pod.metadata.name is not None
        node, name = pod.spec.node_name, pod.metadata.name
        args = list(pod.spec.containers[0].args or [])
        checks = tuple(args[args.index("--checks") + 1].split(",")) if "--checks" in args else ()
        code, message = result_message(
            outcome,
            checks or ("compute", "collective", "golden"),
            self.devices.get(node, ()),
        )
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        status = {
            "phase": "Succeeded" if code == 0 else "Failed",
            "startTime": now,
            "containerStatuses": [
                terminated_probe(pod.spec.containers[0].image, code, message, now)
            ],
        }
        try:
            self.core.patch_namespaced_pod_status(name, self.namespace, {"status": status})
            self.completed.append((node, name, outcome))
        except ApiException:
            pass


# Nodes -------------------------------------------------------------------------


def gpu_fleet(names: list[str], *, case: str, gated: bool = True, pool: str = "test") -> Fleet:
    """The simulator's fleet of H100-like nodes (p5.48xlarge, 8 GPUs) that
    :func:`gpu_nodes` registers."""
    fleet = {
        "name": "operator-test",
        "defaults": {"taints": ["sdcguard.dev/unqualified:NoSchedule"] if gated else []},
        "nodes": [
            {
                "name": n,
                "instanceType": "p5.48xlarge",
                "pool": pool,
                "labels": {"sdcguard.test/case": case},
            }
            for n in names
        ],
        "workloads": {"enabled": False},
        "repair": {"enabled": False},
    }
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
        yaml.safe_dump(fleet, fh)
    try:
        loaded = load_fleet(Path(fh.name))
    finally:
        os.unlink(fh.name)
    return loaded


@contextlib.contextmanager
def gpu_nodes(
    api: client.ApiClient,
    names: list[str],
    *,
    case: str,
    gated: bool = True,
    pool: str = "test",
) -> Iterator[Heartbeats]:
    """Register H100-like nodes (8 GPUs), gated like kubelet --register-with-taints, and keep
    them Ready until the block ends; then delete them."""
    loaded = gpu_fleet(names, case=case, gated=gated, pool=pool)
    with registered_nodes(api, list(loaded.nodes)) as beats:
        yield beats


@contextlib.contextmanager
def registered_nodes(api: client.ApiClient, nodes: list[NodeConfig]) -> Iterator[Heartbeats]:
    """Register these simulated nodes and keep them Ready until the block ends; then
    delete them."""
    beats = Heartbeats(Kube(api), nodes, interval=5.0)
    beats.register_all()
    beats.start()
    try:
        yield beats
    finally:
        beats.stop()
        core = client.CoreV1Api(api)
        for cfg in nodes:
            with contextlib.suppress(ApiException):
                core.delete_node(cfg.name)


# The operator --------------------------------------------------------------------


class OperatorProcess:
    """``python -m sdcguard`` against the test cluster, as a real process."""

    def __init__(self, kubeconfig: Path, log_path: Path, env: dict[str, str] | None = None):
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.metrics_port = free_port()

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def start(self) -> OperatorProcess:
        env = dict(os.environ)
        env.update(
            {
                "KUBECONFIG": str(self.kubeconfig),
                "SDCGUARD_NAMESPACE": NS,
                "SDCGUARD_METRICS_PORT": str(self.metrics_port),
                "SDCGUARD_LOG_FORMAT": "json",
                "SDCGUARD_RESYNC_SECONDS": str(RESYNC_SECONDS),
                "SDCGUARD_DEFAULT_PROBE_IMAGE": "example.invalid/sdcprobe:test",
                # The tests' webhook receivers are plain HTTP on loopback.
                "SDCGUARD_SINK_ALLOW_HTTP": "true",
                "SDCGUARD_SINK_ALLOW_LOOPBACK": "true",
                "PYTHONPATH": os.pathsep.join(
                    [str(REPO / "operator"), str(REPO / "jobs"), env.get("PYTHONPATH", "")]
                ),
                **self.env,
            }
        )
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sdcguard", "--liveness", ""],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        return self

    @property
    def resync_seconds(self) -> float:
        return float(self.env.get("SDCGUARD_RESYNC_SECONDS", RESYNC_SECONDS))

    def passes(self, policy: str, kind: str = "full") -> int | None:
        """:func:`reconcile_passes` of this process."""
        return reconcile_passes(self.metrics_url, policy, kind)

    def wait_passes(
        self, policy: str, count: int = 2, kind: str = "full", timeout: float | None = None
    ) -> int:
        """:func:`wait_passes` of this process: how a test proves that nothing happened."""
        return wait_passes(
            self.metrics_url, policy, count, kind, resync=self.resync_seconds, timeout=timeout
        )

    def kill(self) -> None:
        """SIGKILL: no clean-up, as when a node dies under the operator."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


# Policies and reads ----------------------------------------------------------------


def policy_body(name: str, **spec: Any) -> dict[str, Any]:
    """A fast test policy: short budgets, one re-run to confirm, consensus of 2."""
    base: dict[str, Any] = {
        "nodeSelector": {"matchLabels": spec.pop("match_labels", {})},
        "probe": {"budgetSeconds": 30, "activeDeadlineSeconds": 120, "cpuDevices": 2},
        "budgets": {"maxConcurrentTests": 10, "maxUnavailable": "100%"},
        "triggers": {
            "onReturnFromUse": {"enabled": True, "idleFor": "5s"},
            "inconclusiveBackoff": "5s",
        },
        "baseline": {"mode": "Consensus", "quorum": 2},
        "confirmation": {"reruns": 1},
        "repair": {"maxRepairCycles": 2},
    }
    for key, value in spec.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SDCPolicy",
        "metadata": {"name": name},
        "spec": base,
    }


def trusted_baseline(api: client.ApiClient) -> None:
    """An approved baseline for the test fingerprint (skips consensus where a test wants)."""
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SDCBaseline",
        "metadata": {"name": baseline_name(FINGERPRINT.hash)},
        "spec": {
            "fingerprint": {
                "hash": FINGERPRINT.hash,
                "backend": "cpu",
                "deviceModel": "test-cpu",
                "deviceCount": 2,
            },
            "digests": HEALTHY,
            "source": "Approved",
            "trusted": True,
        },
    }
    custom = client.CustomObjectsApi(api)
    try:
        custom.create_cluster_custom_object(GROUP, VERSION, "sdcbaselines", body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        custom.patch_cluster_custom_object(
            GROUP, VERSION, "sdcbaselines", body["metadata"]["name"], {"spec": body["spec"]}
        )


def node_state(api: client.ApiClient, name: str) -> str | None:
    node = client.CoreV1Api(api).read_node(name)
    labels = node.metadata.labels if node.metadata else None
    return (labels or {}).get("sdcguard.dev/state")


def list_custom(
    api: client.ApiClient, plural: str, node: str | None = None
) -> list[dict[str, Any]]:
    listed = client.CustomObjectsApi(api).list_cluster_custom_object(GROUP, VERSION, plural)
    items: list[dict[str, Any]] = cast(dict[str, Any], listed)["items"]
    return [i for i in items if node is None or i["spec"].get("nodeName") == node]


def ticket_in_phase(api: client.ApiClient, node: str, phase: str) -> dict[str, Any] | None:
    """The node's RepairTicket whose status says ``phase``, or None. A new ticket's
    status is written after the node's patch (plan stage STATUSES): wait on this."""
    for ticket in list_custom(api, "repairtickets", node):
        if (ticket.get("status") or {}).get("phase") == phase:
            return ticket
    return None


def gpu_pod(
    name: str,
    node: str | None,
    *,
    labels: Mapping[str, str] | None = None,
    owner: client.V1Job | None = None,
    tolerate_all: bool = False,
) -> client.V1Pod:
    """A training worker asking for a node's eight GPUs, bound to ``node`` (None: left
    for the scheduler). ``owner`` makes it a Job's Pod; ``tolerate_all`` gives it the
    catch-all toleration some DaemonSets carry, so it lands on a held node too."""
    refs = None
    if owner is not None:
        assert owner.metadata is not None
        assert owner.metadata.name is not None and owner.metadata.uid is not None
        refs = [
            client.V1OwnerReference(
                api_version="batch/v1", kind="Job", name=owner.metadata.name, uid=owner.metadata.uid
            )
        ]
    return client.V1Pod(
        metadata=client.V1ObjectMeta(
            name=name,
            labels=dict(labels) if labels else None,
            owner_references=refs,
        ),
        spec=client.V1PodSpec(
            node_name=node,
            restart_policy="Never",
            tolerations=[client.V1Toleration(operator="Exists")] if tolerate_all else None,
            containers=[
                client.V1Container(
                    name="train",
                    image="example.invalid/train",
                    resources=client.V1ResourceRequirements(
                        requests={"nvidia.com/gpu": "8"}, limits={"nvidia.com/gpu": "8"}
                    ),
                )
            ],
        ),
    )


@contextlib.contextmanager
def workload_record(
    api: client.ApiClient, node: str, status: Mapping[str, Any]
) -> Iterator[dict[str, Any]]:
    """A WorkloadRecord of ``node`` holding ``status``, written as the operator writes one
    (created, then its status subresource patched); yields what the API server stored and
    deletes it afterwards."""
    custom = client.CustomObjectsApi(api)
    custom.create_cluster_custom_object(
        GROUP,
        VERSION,
        "workloadrecords",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "WorkloadRecord",
            "metadata": {"name": node},
            "spec": {"nodeName": node},
        },
    )
    try:
        custom.patch_cluster_custom_object_status(
            GROUP, VERSION, "workloadrecords", node, {"status": dict(status)}
        )
        yield cast(
            dict[str, Any],
            custom.get_cluster_custom_object(GROUP, VERSION, "workloadrecords", node),
        )
    finally:
        custom.delete_cluster_custom_object(GROUP, VERSION, "workloadrecords", node)


def delete_all(api: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(api)
    for plural in ("sdcpolicies", "sdctests", "repairtickets", "sdcbaselines", "sdchardwares"):
        listed = cast(dict[str, Any], custom.list_cluster_custom_object(GROUP, VERSION, plural))
        for item in listed["items"]:
            with contextlib.suppress(ApiException):
                custom.delete_cluster_custom_object(
                    GROUP, VERSION, plural, item["metadata"]["name"]
                )
    batch = client.BatchV1Api(api)
    with contextlib.suppress(ApiException):
        batch.delete_collection_namespaced_job(NS, propagation_policy="Background")
    core = client.CoreV1Api(api)
    with contextlib.suppress(ApiException):
        core.delete_collection_namespaced_pod(NS, grace_period_seconds=0)


# Shared by the operator test modules -------------------------------------------

GATE, TESTING, QUARANTINE = (
    "sdcguard.dev/unqualified",
    "sdcguard.dev/testing",
    "sdcguard.dev/quarantined",
)


def new_case() -> str:
    """A short random id: each test's nodes and policy carry it, so tests never meet."""
    import uuid

    return uuid.uuid4().hex[:6]


def create_policy(api: client.ApiClient, case: str, **spec: Any) -> str:
    """A fast test policy selecting the nodes of ``case``; returns its name."""
    name = f"p-{case}"
    body = policy_body(name, match_labels={"sdcguard.test/case": case}, **spec)
    client.CustomObjectsApi(api).create_cluster_custom_object(GROUP, VERSION, "sdcpolicies", body)
    return name


def read_node(api: client.ApiClient, name: str) -> client.V1Node:
    return client.CoreV1Api(api).read_node(name)


def taint_keys(api: client.ApiClient, name: str) -> set[str]:
    spec = read_node(api, name).spec
    return {t.key for t in ((spec.taints if spec else None) or [])}


def annotate(api: client.ApiClient, name: str, annotations: Mapping[str, str | None]) -> None:
    """Set (or, with None, remove) annotations on a node, as a person or tool would."""
    client.CoreV1Api(api).patch_node(name, {"metadata": {"annotations": annotations}})
