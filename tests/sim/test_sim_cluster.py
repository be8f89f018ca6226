"""The simulator against the real local control plane.

One simulated fleet serves the module: a healthy H100 node and a sick one
(both gated, as at join) and an ungated Trainium node for customer pods. Probe
Jobs run the real probe on the CPU, one at a time.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from sdcdev.cluster.localcluster import LocalCluster
from sdcdev.sim import SimOptions, Simulator, parse_fleet
from sdcdev.sim.commands import gpu_uuids
from sdcdev.sim.kube import TICKET_VERSION, TICKETS_PATH, Kube
from sdcdev.sim.workloads import WorkloadRequest, workload_pod

REPO = Path(__file__).resolve().parents[2]
GATE = "sdcguard.dev/unqualified"
T = TypeVar("T")
#: One real probe run in a simulated probe Pod: 10-40 s on an idle machine, past 90 s on a
#: slow one loaded by the other test groups.
PROBE_RUN_S = 240
# Caught by the compute check (GEMM outputs), so a short probe run sees it.
MATMUL_FAULT = {"site": "matmul", "rate": 1e-3, "bits": "exp", "mode": "flip"}


def wait_for(fn: Callable[[], T | None], timeout: float, what: str, every: float = 0.5) -> T:
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def ready_status(node: dict[str, Any]) -> str | None:
    for c in node.get("status", {}).get("conditions", []):
        if c["type"] == "Ready":
            return str(c["status"])
    return None


class Env:
    """The module's fleet, simulator and namespace."""

    def __init__(self, kube: Kube, sim: Simulator, prefix: str, namespace: str) -> None:
        self.kube = kube
        self.sim = sim
        self.prefix = prefix
        self.namespace = namespace
        self.started = time.monotonic()
        self.healthy = f"{prefix}-h100"
        self.sick = f"{prefix}-sick"
        self.free = f"{prefix}-trn"

    def node(self, name: str) -> dict[str, Any]:
        return self.kube.request("GET", f"/api/v1/nodes/{name}")

    def pod(self, name: str) -> dict[str, Any] | None:
        try:
            return self.kube.request("GET", f"/api/v1/namespaces/{self.namespace}/pods/{name}")
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def job_pod(self, job: str) -> dict[str, Any] | None:
        pods = self.kube.list_pods(self.namespace, label_selector=f"job-name={job}")
        return pods[0] if pods else None

    def create_probe_job(
        self, name: str, node: str, *, checks: str = "compute", budget: int = 5
    ) -> None:
        """A Job shaped like the operator's probe Job (node affinity, own tolerations)."""
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {
                "backoffLimit": 0,
                "activeDeadlineSeconds": 300,
                "template": {
                    "spec": probe_pod_spec(node, checks=checks, budget=budget),
                },
            },
        }
        self.kube.request("POST", f"/apis/batch/v1/namespaces/{self.namespace}/jobs", body=job)

    def create_pod(self, name: str, spec: dict[str, Any], **meta: Any) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": self.namespace, **meta},
            "spec": spec,
        }
        self.kube.create_pod(self.namespace, body)


def probe_pod_spec(
    node: str, *, checks: str = "compute", budget: int = 5, deadline: int | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 10,
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                }
            }
        },
        "tolerations": [{"key": GATE, "operator": "Exists"}],
        "containers": [
            {
                "name": "sdcprobe",
                "image": "sdcguard/sdcprobe:test",
                "command": ["python", "-m", "sdcprobe"],
                "args": [
                    "run",
                    "--checks",
                    checks,
                    "--device",
                    "auto",
                    "--budget",
                    str(budget),
                    "--result-file",
                    "/dev/termination-log",
                ],
                "env": [
                    {
                        "name": "SDCPROBE_NODE",
                        "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
                    }
                ],
                "resources": {
                    "limits": {"nvidia.com/gpu": "8"},
                    "requests": {"nvidia.com/gpu": "8"},
                },
            }
        ],
    }
    if deadline is not None:
        spec["activeDeadlineSeconds"] = deadline
    return spec


def terminated(pod: dict[str, Any]) -> dict[str, Any]:
    return dict(pod["status"]["containerStatuses"][0]["state"]["terminated"])


def finished(env: Env, get: Callable[[], dict[str, Any] | None]) -> Callable[[], Any]:
    def check() -> dict[str, Any] | None:
        pod = get()
        if pod and pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            return pod
        return None

    return check


@pytest.fixture(scope="module")
def env(api_client: Any) -> Iterator[Env]:
    prefix = f"sim{uuid.uuid4().hex[:5]}"
    kube = Kube(api_client)
    namespace = f"{prefix}-tests"
    kube.request(
        "POST",
        "/api/v1/namespaces",
        body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
    )
    wait_for(
        lambda: kube.request("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts").get("items"),
        30,
        "the default service account",
    )
    fleet = parse_fleet(
        {
            "name": prefix,
            "seed": 1,
            "defaults": {"cpuDevices": 2},
            "nodes": [
                {
                    "name": f"{prefix}-h100",
                    "instanceType": "p5.48xlarge",
                    "taints": [f"{GATE}:NoSchedule"],
                },
                {
                    "name": f"{prefix}-sick",
                    "instanceType": "p5.48xlarge",
                    "taints": [f"{GATE}:NoSchedule"],
                    "faultProfile": {"faults": [MATMUL_FAULT]},
                },
                {"name": f"{prefix}-trn", "instanceType": "trn1.32xlarge"},
            ],
            "workloads": {"enabled": False},
            "repair": {"delaySeconds": 1},
        },
        "test fleet",
    )
    sim = Simulator(
        fleet,
        api_client,
        SimOptions(max_parallel_probes=1, heartbeat_seconds=3, crd_retry_seconds=1),
    )
    sim.start()
    assert sim.wait_synced(30)
    try:
        yield Env(kube, sim, prefix, namespace)
    finally:
        sim.stop(cleanup=True)
        with pytest.raises(ApiException):
            kube.request("GET", f"/api/v1/nodes/{prefix}-h100")
        kube.request("DELETE", f"/api/v1/namespaces/{namespace}")


def test_nodes_registered_with_capacity_labels_taints_and_heartbeats(env: Env) -> None:
    h100 = env.node(env.healthy)
    assert ready_status(h100) == "True"
    assert h100["status"]["capacity"]["nvidia.com/gpu"] == "8"
    assert h100["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert h100["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert h100["metadata"]["labels"]["node.kubernetes.io/instance-type"] == "p5.48xlarge"
    assert {"key": GATE, "effect": "NoSchedule"}.items() <= h100["spec"]["taints"][0].items()
    trn = env.node(env.free)
    assert trn["status"]["capacity"]["aws.amazon.com/neuron"] == "16"
    assert not trn["spec"].get("taints")

    def lease_renew() -> str:
        lease = env.kube.request(
            "GET", f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{env.free}"
        )
        return str(lease["spec"]["renewTime"])

    first = lease_renew()
    wait_for(lambda: lease_renew() != first, 10, "the node lease to be renewed")
    beat = next(c for c in env.node(env.free)["status"]["conditions"] if c["type"] == "Ready")
    wait_for(
        lambda: (
            next(c for c in env.node(env.free)["status"]["conditions"] if c["type"] == "Ready")[
                "lastHeartbeatTime"
            ]
            != beat["lastHeartbeatTime"]
        ),
        10,
        "a newer Ready heartbeat",
    )


def test_probe_jobs_run_the_real_probe_one_at_a_time(env: Env) -> None:
    env.create_probe_job("probe-healthy", env.healthy)
    env.create_probe_job("probe-sick", env.sick)

    def both_scheduled() -> list[dict[str, Any]] | None:
        pods = [env.job_pod("probe-healthy"), env.job_pod("probe-sick")]
        ok = [p for p in pods if p and p["spec"].get("nodeName")]
        return ok if len(ok) == 2 else None

    pods = wait_for(both_scheduled, 30, "both probe pods scheduled")
    assert [p["spec"]["nodeName"] for p in pods if p] == [env.healthy, env.sick]

    # max_parallel_probes=1: while one runs, the other waits Pending, unstarted.
    def one_running_one_queued() -> bool:
        phases = []
        for job in ("probe-healthy", "probe-sick"):
            pod = env.job_pod(job)
            assert pod is not None
            phases.append((pod["status"].get("phase"), pod["status"].get("startTime")))
        running = [p for p in phases if p[0] == "Running"]
        queued = [p for p in phases if p[0] == "Pending" and p[1] is None]
        return len(running) == 1 and len(queued) == 1

    wait_for(one_running_one_queued, 30, "one probe running while the other is queued", 0.2)

    ok = wait_for(
        finished(env, lambda: env.job_pod("probe-healthy")), PROBE_RUN_S, "the healthy probe"
    )
    assert ok["status"]["phase"] == "Succeeded"
    term = terminated(ok)
    assert term["exitCode"] == 0 and term["reason"] == "Completed"
    result = json.loads(term["message"])
    assert result["kind"] == "sdcprobe.result" and result["verdict"] == "pass"
    assert len(term["message"].encode()) <= 4096
    # The simulated kubelet gave the probe its GPUs' UUIDs (NVIDIA_VISIBLE_DEVICES):
    # simulated device i is the node's GPU i, named as a DRA driver publishes it.
    assert result["devices"] == gpu_uuids(env.healthy, 8)[:2]

    bad = wait_for(
        finished(env, lambda: env.job_pod("probe-sick")), 2 * PROBE_RUN_S, "the sick node's probe"
    )
    assert bad["status"]["phase"] == "Failed"
    term = terminated(bad)
    assert term["exitCode"] == 1 and term["reason"] == "Error"
    assert json.loads(term["message"])["verdict"] == "fail"

    def job_done(name: str, cond: str) -> bool:
        job = env.kube.request("GET", f"/apis/batch/v1/namespaces/{env.namespace}/jobs/{name}")
        return any(
            c["type"] == cond and c["status"] == "True"
            for c in job.get("status", {}).get("conditions", [])
        )

    wait_for(lambda: job_done("probe-healthy", "Complete"), 30, "the healthy Job to complete")
    wait_for(lambda: job_done("probe-sick", "Failed"), 30, "the sick Job to fail")
    snap = env.sim.snapshot()
    sick, healthy = snap.node(env.sick), snap.node(env.healthy)
    assert sick.last_probe is not None and sick.last_probe.faults_injected
    assert sick.probes_failed == 1 and sick.last_probe.verdict == "fail"
    assert healthy.last_probe is not None and not healthy.last_probe.faults_injected
    assert healthy.probes_passed == 1
    print(f"probe seconds: healthy {healthy.last_probe.seconds}, sick {sick.last_probe.seconds}")


def test_active_deadline_kills_the_probe(env: Env) -> None:
    env.create_pod(
        "probe-late", probe_pod_spec(env.healthy, checks="compute,golden", budget=120, deadline=4)
    )
    pod = wait_for(finished(env, lambda: env.pod("probe-late")), 60, "the deadline to pass")
    assert pod["status"]["phase"] == "Failed"
    assert pod["status"]["reason"] == "DeadlineExceeded"
    assert terminated(pod)["exitCode"] != 0  # SIGTERM, then SIGKILL after the grace period
    assert not env.sim.kubelet.processes()
    env.kube.delete_pod(env.namespace, "probe-late")


def test_deleting_a_running_probe_pod_stops_it_and_finishes_the_deletion(env: Env) -> None:
    env.create_pod(
        "probe-deleted", probe_pod_spec(env.healthy, checks="compute,golden", budget=120)
    )
    wait_for(
        lambda: (env.pod("probe-deleted") or {}).get("status", {}).get("phase") == "Running",
        30,
        "the probe to run",
    )
    pid = wait_for(
        lambda: env.sim.kubelet.processes().get(f"{env.namespace}/probe-deleted"), 10, "pid"
    )
    env.kube.delete_pod(env.namespace, "probe-deleted")  # default grace period: needs a kubelet
    wait_for(lambda: env.pod("probe-deleted") is None, 30, "the pod to be gone")
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_customer_pods_complete_and_respect_taints(env: Env) -> None:
    fleet = env.sim.fleet
    settings = fleet.workloads.model_copy(update={"namespace": env.namespace})
    fits = workload_pod(
        fleet, WorkloadRequest("trn1.32xlarge", "aws.amazon.com/neuron", 16, 2.0), settings
    )
    created = env.kube.create_pod(env.namespace, fits)
    name = created["metadata"]["name"]
    pod = wait_for(finished(env, lambda: env.pod(name)), 30, "the customer pod")
    assert pod["spec"]["nodeName"] == env.free
    assert pod["status"]["phase"] == "Succeeded"
    assert terminated(pod)["exitCode"] == 0
    # H100 nodes still carry the gate taint: a customer pod for them waits.
    gated = workload_pod(fleet, WorkloadRequest("p5.48xlarge", "nvidia.com/gpu", 8, 2.0), settings)
    waiting = env.kube.create_pod(env.namespace, gated)["metadata"]["name"]
    time.sleep(3)
    pod = env.pod(waiting)
    assert pod is not None and pod["status"]["phase"] == "Pending"
    assert not pod["spec"].get("nodeName")
    assert env.sim.snapshot().node(env.free).workloads_run >= 1
    env.kube.delete_pod(env.namespace, waiting)


def _install_ticket_crd(kube: Kube) -> bool:
    """The real CRD when crds/ has it, else a minimal stand-in. True if we created it."""
    real = REPO / "crds" / "repairtickets.sdcguard.dev.yaml"
    if real.exists():
        crd = yaml.safe_load(real.read_text())
    else:
        crd = {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "repairtickets.sdcguard.dev"},
            "spec": {
                "group": "sdcguard.dev",
                "scope": "Cluster",
                "names": {
                    "plural": "repairtickets",
                    "singular": "repairticket",
                    "kind": "RepairTicket",
                },
                "versions": [
                    {
                        "name": TICKET_VERSION,
                        "served": True,
                        "storage": True,
                        "subresources": {"status": {}},
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
    try:
        kube.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=crd)
    except ApiException as exc:
        if exc.status == 409:
            return False
        raise
    wait_for(lambda: _served(kube), 30, "the RepairTicket CRD to be served")
    return True


def _served(kube: Kube) -> bool:
    try:
        kube.request("GET", TICKETS_PATH)
        return True
    except ApiException:
        return False


def test_repair_ticket_gets_resolved_and_the_node_is_healthy_again(env: Env) -> None:
    created_crd = _install_ticket_crd(env.kube)
    name = f"{env.prefix}-ticket"
    try:
        ticket = {
            "apiVersion": f"sdcguard.dev/{TICKET_VERSION}",
            "kind": "RepairTicket",
            "metadata": {"name": name},
            "spec": {"nodeName": env.sick, "evidence": ["probe-sick"]},
        }
        env.kube.request("POST", TICKETS_PATH, body=ticket)
        done = wait_for(
            lambda: (t := env.kube.get_ticket(name))["spec"].get("resolution") and t,
            30,
            "the ticket's resolution",
        )
        spec = done["spec"]
        assert spec["resolution"] == "Repaired"
        assert env.sick in spec["resolutionNote"]
        assert spec["external"]["system"] == "sim" and spec["external"]["id"].startswith("SIM-")
        assert not env.sim.snapshot().node(env.sick).faulty
        # The repaired node now passes the same probe it failed.
        env.create_probe_job("probe-repaired", env.sick)
        pod = wait_for(
            finished(env, lambda: env.job_pod("probe-repaired")), PROBE_RUN_S, "the re-test"
        )
        assert pod["status"]["phase"] == "Succeeded"
    finally:
        env.kube.request("DELETE", f"{TICKETS_PATH}/{name}")
        if created_crd:
            env.kube.request(
                "DELETE",
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/repairtickets.sdcguard.dev",
            )


def test_simulator_death_turns_its_nodes_not_ready(
    env: Env, cluster: LocalCluster, tmp_path: Path
) -> None:
    node = f"{env.prefix}-doomed"
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(
        yaml.safe_dump(
            {
                "name": f"{env.prefix}-doomed",
                "nodes": [{"name": node, "instanceType": "a3-highgpu-8g"}],
                "workloads": {"enabled": False},
                "repair": {"enabled": False},
            }
        )
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sdcdev.sim",
            "--kubeconfig",
            str(cluster.kubeconfig),
            "--fleet",
            str(fleet_file),
            "--heartbeat-seconds",
            "2",
            "--log-format",
            "json",
        ],
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO / "operator"), str(REPO / "jobs"), str(REPO)]),
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:

        def ready() -> bool:
            try:
                return ready_status(env.node(node)) == "True"
            except ApiException:
                return False

        wait_for(ready, 60, "the subprocess simulator's node to be Ready")
        time.sleep(3)  # a couple of heartbeats
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        killed_at = time.monotonic()
        wait_for(lambda: ready_status(env.node(node)) == "Unknown", 90, "Ready=Unknown", every=2)
        took = time.monotonic() - killed_at
        cond = next(c for c in env.node(node)["status"]["conditions"] if c["type"] == "Ready")
        assert cond["reason"] == "NodeStatusUnknown"
        print(f"NotReady {took:.0f}s after the simulator died")
        # Meanwhile the module's simulator kept its own nodes Ready.
        assert ready_status(env.node(env.healthy)) == "True"
    finally:
        if proc.poll() is None:
            proc.kill()
        for path in (
            f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}",
            f"/api/v1/nodes/{node}",
        ):
            with contextlib.suppress(ApiException):
                env.kube.request("DELETE", path)


def test_nodes_stayed_ready_throughout(env: Env) -> None:
    """Runs last: by now the fleet has outlived the node-lifecycle grace period."""
    alive = time.monotonic() - env.started
    for name in (env.healthy, env.sick, env.free):
        node = env.node(name)
        assert ready_status(node) == "True", name
        assert not any(
            t["key"].startswith("node.kubernetes.io/") for t in node["spec"].get("taints", [])
        ), name
    print(f"fleet Ready for {alive:.0f}s")


def test_a_command_pod_runs_its_own_command_with_the_pods_identity(env: Env) -> None:
    """A Pod annotated to run its command: its process sees the downward API and a token
    of its ServiceAccount bound to it; it ends with the process's exit code."""
    script = (
        "import os, sys; "
        "print(os.environ['POD_NAME'], os.environ['KUBERNETES_SERVICE_HOST'], "
        "len(open(os.environ['SDCGUARD_TOKEN_FILE']).read()) > 100, "
        "'KUBECONFIG' in os.environ); sys.exit(3)"
    )

    def command_pod(name: str, account: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "annotations": {"sim.sdcguard.dev/run-command": "true"}},
            "spec": {
                "nodeName": env.free,
                "restartPolicy": "Never",
                "serviceAccountName": account,
                "containers": [
                    {
                        "name": "main",
                        "image": "example.invalid/any:1",
                        "command": ["python3", "-c", script],
                        "terminationMessagePolicy": "FallbackToLogsOnError",
                        "env": [
                            {
                                "name": "POD_NAME",
                                "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                            }
                        ],
                    }
                ],
            },
        }

    ran = env.kube.create_pod(env.namespace, command_pod("cmd-ok", "default"))["metadata"]
    pod = wait_for(finished(env, lambda: env.pod(ran["name"])), 60, "the command pod")
    assert pod["status"]["phase"] == "Failed"
    state = terminated(pod)
    assert state["exitCode"] == 3
    assert state["message"].strip() == "cmd-ok 127.0.0.1 True False"  # the log's tail
    # No command: the simulator has no image entrypoint to run, and says so.
    body = command_pod("cmd-none", "default")
    del body["spec"]["containers"][0]["command"]
    made = env.kube.create_pod(env.namespace, body)["metadata"]
    pod = wait_for(finished(env, lambda: env.pod(made["name"])), 30, "the unstartable pod")
    assert terminated(pod)["reason"] == "StartError"
    assert "no command" in terminated(pod)["message"]


def test_a_probe_pod_mounts_its_attestation_secret_and_seals_its_result(env: Env) -> None:
    """As a kubelet does, the simulator mounts the Pod's Secret volume; the probe finds
    it through SDCPROBE_ATTEST_DIR (the mount path) and seals its result, which the
    screening's own key opens (an operator Pod with attestation on judges simulated
    nodes as it judges real ones)."""
    from sdcguard.builders.probe_job import ATTEST_MOUNT_PATH, build_attestation_secret
    from sdcguard.domain.attestation import Attestation

    sealing = Attestation.derive(bytes(range(32)), "uid-sealed")
    secret = build_attestation_secret("sealed", "uid-sealed", env.namespace, sealing.secret_data())
    del secret["metadata"]["ownerReferences"]  # no SDCTest here
    env.kube.request("POST", f"/api/v1/namespaces/{env.namespace}/secrets", body=secret)
    spec = probe_pod_spec(env.healthy)
    container = spec["containers"][0]
    container["env"].append({"name": "SDCPROBE_ATTEST_DIR", "value": ATTEST_MOUNT_PATH})
    container["volumeMounts"] = [{"name": "attest", "mountPath": ATTEST_MOUNT_PATH}]
    spec["volumes"] = [{"name": "attest", "secret": {"secretName": secret["metadata"]["name"]}}]
    env.create_pod("probe-sealed", spec)

    pod = wait_for(finished(env, lambda: env.pod("probe-sealed")), PROBE_RUN_S, "the sealed probe")
    message = terminated(pod)["message"]
    document, why = sealing.open(message)
    assert document is not None, why
    assert json.loads(document)["verdict"] == "pass"
    other = Attestation.derive(bytes(range(32)), "uid-another")
    assert other.open(message)[0] is None
