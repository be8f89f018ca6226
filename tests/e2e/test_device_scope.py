"""Per-device quarantine end to end on the simulated fleet (Kubernetes 1.37 DRA).

Two simulated 8-GPU H100 nodes publish their GPUs as NVIDIA's DRA driver does
(``dra: true``: ResourceSlices of ``gpu.nvidia.com``, the ``gpu.nvidia.com``
DeviceClass). The operator runs as a process with the chart's ServiceAccount (the chart
rendered with ``rbac.allowDeviceTaints``) under a policy with ``quarantine.scope:
Device``; every probe runs for real (the CPU backend, its two devices standing for GPUs 0
and 1, each reporting its GPU's UUID); the real kube-scheduler allocates ResourceClaims
and the real controller-manager runs beside it.

After both nodes qualify, GPU 1 of one node starts computing wrong answers (the
simulator injects exponent flips into that device's GEMMs from its next probe run), and
a workload reports the node. Then:

- the screening and its confirmation fail on device 1: the operator writes one
  DeviceTaintRule for that GPU (by UUID) and nothing else; the node stays schedulable
  and untainted;
- the scheduler places a 7-GPU claim on the node's other seven GPUs and finds no eighth
  there; ``kubectl get devicetaintrules`` lists only rules with sdcguard's marks;
- the GPU is repaired (the fault cleared, ``kubectl sdc repaired``), the verification
  probe passes with every device, the rule is removed, the ticket closed, and a claim
  for all eight GPUs of the node is placed, the repaired one included.

The tickets are read through :func:`quarantined_devices`, which takes every open ticket
of the node, so one ticket listing the devices and one ticket per device read the same.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from sdcdev.cluster.localcluster import LocalCluster
from sdcdev.harness import wait_for
from sdcdev.sim import SimOptions, Simulator, parse_fleet
from sdcdev.sim.commands import gpu_uuids
from sdcdev.sim.demo import delete_custom, delete_policy
from sdcdev.sim.demo_install import (
    GROUP,
    VERSION,
    Installation,
    LocalOperator,
    PolicySettings,
    install,
    policy_body,
    start_operator,
    uninstall,
)
from sdcdev.sim.dra import NVIDIA_GPU_DRIVER
from sdcdev.sim.fleet import FaultProfile
from sdcdev.sim.kube import Kube
from sdcguard.cli.main import main as sdc
from tests.cluster.dra_claims import RULES, Env
from tests.e2e.helpers import refusals

pytestmark = pytest.mark.cluster

STATE_LABEL = "sdcguard.dev/state"
MANAGED_BY = "app.kubernetes.io/managed-by"
#: Exponent flips in every GEMM output of device 1 (the probe's second device: GPU 1).
GPU1_FAULT = {"site": "matmul", "rate": 0.01, "bits": "exp", "mode": "flip", "device": 1}
#: What marks a rule as sdcguard's (README, "Rules and ownership").
OWNERSHIP_ANNOTATIONS = ("sdcguard.dev/ticket", "sdcguard.dev/reason", "sdcguard.dev/device-uuid")


@dataclass
class Run:
    """One run's fleet, operator and objects; ``claims`` makes the ResourceClaims and
    their Pods (nodes ``claims.a``, the sick one, and ``claims.b``)."""

    kube: Kube
    sim: Simulator
    cluster: LocalCluster
    operator: LocalOperator
    claims: Env

    def state(self, node: str) -> str | None:
        labels = self.node(node)["metadata"].get("labels")
        return (labels or {}).get(STATE_LABEL)

    def node(self, name: str) -> dict[str, Any]:
        return self.kube.request("GET", f"/api/v1/nodes/{name}")

    def tickets(self, node: str) -> list[dict[str, Any]]:
        items = self.kube.request("GET", f"/apis/{GROUP}/{VERSION}/repairtickets")["items"]
        return [t for t in items if (t.get("spec") or {}).get("nodeName") == node]

    def rules_on(self, node: str) -> list[dict[str, Any]]:
        """Every DeviceTaintRule that selects a device of ``node``'s pool (anyone's)."""
        return [
            r
            for r in self.kube.request("GET", RULES)["items"]
            if r["spec"]["deviceSelector"].get("pool") == node
        ]


def quarantined_devices(tickets: list[dict[str, Any]]) -> list[tuple[int, str, str]]:
    """(index, device, uuid) of each device the node's open tickets quarantine by device
    taint, sorted: a ticket that lists several devices and one ticket per device give the
    same list. A ticket whose quarantine is not per device contributes nothing."""
    found = set()
    for ticket in tickets:
        if (ticket.get("status") or {}).get("phase") in ("Closed", "Retired"):
            continue
        record = (ticket.get("spec") or {}).get("quarantine") or {}
        if record.get("scope") != "Device":
            continue
        for d in record.get("devices") or []:
            found.add((int(d["index"]), str(d["device"]), str(d["uuid"])))
    return sorted(found)


def fleet_doc(name: str, sick: str, healthy: str) -> dict[str, Any]:
    return {
        "name": name,
        "defaults": {"dra": True, "taints": ["sdcguard.dev/unqualified:NoSchedule"]},
        "nodes": [
            {"name": sick, "instanceType": "p5.48xlarge", "pool": "h100"},
            {"name": healthy, "instanceType": "p5.48xlarge", "pool": "h100"},
        ],
        "workloads": {"enabled": False},
        # The repair is done by hand below (kubectl sdc repaired), once the claims ran.
        "repair": {"enabled": False},
    }


@pytest.fixture
def run(cluster: LocalCluster, tmp_path: Path) -> Iterator[Run]:
    suffix = uuid.uuid4().hex[:5]
    fleet_name = f"dev-{suffix}"
    release, namespace = f"sdcguard-dev-{suffix}", f"sdcguard-dev-{suffix}"
    policy = f"dev-{suffix}"
    api: client.ApiClient = config.new_client_from_config(str(cluster.kubeconfig))
    kube = Kube(api)
    claims = Env(kube, fleet_name)  # nodes <fleet>-a (to fail) and <fleet>-b
    sick, healthy = claims.a, claims.b
    kube.ensure_namespace(claims.namespace)
    baselines_before: set[str] = set()
    inst: Installation | None = None
    operator: LocalOperator | None = None
    sim: Simulator | None = None
    try:
        inst = install(
            cluster,
            api,
            release=release,
            namespace=namespace,
            values={"rbac": {"allowDeviceTaints": True}},
        )
        baselines_before = {
            b["metadata"]["name"]
            for b in kube.request("GET", f"/apis/{GROUP}/{VERSION}/sdcbaselines")["items"]
        }
        operator = start_operator(
            cluster, api, inst, workdir=tmp_path, log_path=tmp_path / "operator.log"
        )
        settings = PolicySettings(quorum=2, idle_for="300s", max_unavailable=1)
        body = policy_body(policy, fleet_name, settings)
        body["spec"]["quarantine"] = {"scope": "Device", "deviceTaintEffect": "NoSchedule"}
        client.CustomObjectsApi(api).create_cluster_custom_object(
            GROUP, VERSION, "sdcpolicies", body
        )
        fleet = parse_fleet(fleet_doc(fleet_name, sick, healthy), "test")
        sim = Simulator(fleet, api, SimOptions(workdir=tmp_path / "sim"))
        sim.start()
        yield Run(kube, sim, cluster, operator, claims)
    finally:
        with contextlib.suppress(Exception):
            claims.cleanup()
        with contextlib.suppress(Exception):
            kube.request("DELETE", f"/api/v1/namespaces/{claims.namespace}")
        with contextlib.suppress(Exception):
            delete_policy(api, policy, operator)
        if sim is not None:
            sim.stop(cleanup=True)
        if operator is not None:
            print("--- operator log (tail) ---\n" + operator.log_tail(60))
            operator.stop()
        with contextlib.suppress(Exception):
            for plural in ("sdctests", "repairtickets"):
                for item in kube.request("GET", f"/apis/{GROUP}/{VERSION}/{plural}")["items"]:
                    if (item.get("spec") or {}).get("nodeName") in (sick, healthy):
                        delete_custom(api, plural, item["metadata"]["name"])
            for b in kube.request("GET", f"/apis/{GROUP}/{VERSION}/sdcbaselines")["items"]:
                if b["metadata"]["name"] not in baselines_before:
                    delete_custom(api, "sdcbaselines", b["metadata"]["name"])
            for rule in kube.request("GET", RULES)["items"]:
                if rule["spec"]["deviceSelector"].get("pool") in (sick, healthy):
                    kube.request("DELETE", f"{RULES}/{rule['metadata']['name']}")
        if inst is not None:
            uninstall(api, inst)
        api.close()


def kubectl_rules(cluster: LocalCluster) -> list[dict[str, Any]]:
    """``kubectl get devicetaintrules -o json``: what a person sees."""
    proc = subprocess.run(
        ["kubectl", "get", "devicetaintrules", "-o", "json"],
        env=cluster.env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return list(json.loads(proc.stdout)["items"])


def sdc_cli(cluster: LocalCluster, *args: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    code = sdc([*args, "--kubeconfig", str(cluster.kubeconfig)], stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    return out.getvalue()


@pytest.mark.timeout(900)
def test_a_node_with_one_failing_gpu_keeps_serving_claims_on_the_others(run: Run) -> None:
    env = run.claims
    sick, healthy = env.a, env.b
    t0 = time.monotonic()
    marks: dict[str, float] = {}
    for node in (sick, healthy):
        wait_for(lambda node=node: run.state(node) == "Qualified", 360, f"{node} qualified")
    marks["qualified"] = time.monotonic() - t0
    assert not run.rules_on(sick) and not run.rules_on(healthy)

    # GPU 1 of the sick node goes bad; a training job reports the node.
    run.sim.set_fault_profile(sick, FaultProfile(faults=[GPU1_FAULT]))
    t_fault = time.monotonic()
    run.kube.request(
        "PATCH",
        f"/api/v1/nodes/{sick}",
        body={"metadata": {"annotations": {"sdcguard.dev/suspect": "loss spike on rank 1"}}},
        content_type="application/merge-patch+json",
    )
    wait_for(lambda: run.state(sick) == "Quarantined", 300, f"{sick} quarantined")
    rules = wait_for(lambda: run.rules_on(sick) or None, 60, "a device taint rule")
    marks["quarantined"] = time.monotonic() - t_fault
    gpu1 = gpu_uuids(sick, 1, 1)[0]
    assert len(rules) == 1, rules
    (rule,) = rules
    assert rule["spec"]["deviceSelector"] == {
        "driver": NVIDIA_GPU_DRIVER,
        "pool": sick,
        "device": "gpu-1",
    }
    assert rule["spec"]["taint"]["key"] == "sdcguard.dev/sdc"
    assert rule["spec"]["taint"]["effect"] == "NoSchedule"
    meta = rule["metadata"]
    assert meta["labels"][MANAGED_BY] == "sdcguard"
    assert meta["labels"]["sdcguard.dev/node"] == sick
    assert meta["annotations"]["sdcguard.dev/device-uuid"] == gpu1
    tickets = run.tickets(sick)
    assert quarantined_devices(tickets) == [(1, "gpu-1", gpu1)], tickets
    assert meta["annotations"]["sdcguard.dev/ticket"] in {t["metadata"]["name"] for t in tickets}
    for ticket in tickets:
        assert gpu1 in ticket["spec"]["hardware"]["deviceIDs"]
        assert ticket["spec"]["quarantine"]["reason"] == "DeviceTainted"
    # The evidence: every located finding names device 1 (the probe's odd device).
    odd = {
        f["oddDevice"]
        for t in tickets
        for f in t["spec"].get("findings") or []
        if f.get("oddDevice") is not None
    }
    assert odd == {1}, [t["spec"].get("findings") for t in tickets]

    # The node stays in service: schedulable, without sdcguard's node taints.
    node = run.node(sick)
    assert not node["spec"].get("unschedulable")
    keys = {t["key"] for t in node["spec"].get("taints") or []}
    assert not keys & {"sdcguard.dev/quarantined", "sdcguard.dev/testing"}, keys

    # The scheduler places claims on the node's seven other GPUs, and has no eighth.
    env.pod("seven", count=7, node=sick)
    wait_for(lambda: env.running_on("seven"), 60, "the 7-GPU pod to run on the sick node")
    assert env.allocated("seven") == [(sick, f"gpu-{i}") for i in range(8) if i != 1]
    env.pod("eighth", count=1, node=sick)
    wait_for(lambda: env.unschedulable("eighth"), 60, "an eighth GPU claim to be unschedulable")
    assert env.allocated("eighth") is None
    # The healthy node takes all eight.
    env.pod("other", count=8, node=healthy)
    wait_for(lambda: env.running_on("other"), 60, "the 8-GPU pod on the healthy node")

    # What a person sees: only rules with sdcguard's marks (every rule on this run's
    # nodes), none on the healthy node.
    seen = [
        r
        for r in kubectl_rules(run.cluster)
        if r["spec"]["deviceSelector"].get("pool") in (sick, healthy)
    ]
    assert [r["metadata"]["name"] for r in seen] == [meta["name"]]
    for r in seen:
        assert r["metadata"]["labels"].get(MANAGED_BY) == "sdcguard"
        assert all(a in r["metadata"]["annotations"] for a in OWNERSHIP_ANNOTATIONS)
    status = json.loads(sdc_cli(run.cluster, "status", "-o", "json"))
    out_of_service = [d for d in status["devicesOutOfService"] if d["node"] == sick]
    assert [(d["device"], d["uuid"]) for d in out_of_service] == [
        (f"{NVIDIA_GPU_DRIVER}/{sick}/gpu-1", gpu1)
    ]

    # The work on the node ends; the GPU is repaired and the repair recorded.
    env.cleanup()
    run.sim.set_fault_profile(sick, None)
    t_repair = time.monotonic()
    for ticket in tickets:
        sdc_cli(run.cluster, "repaired", ticket["metadata"]["name"], "--note", "GPU 1 reseated")

    # Verification re-tests the node with every device, then the rule goes.
    wait_for(lambda: run.state(sick) == "Qualified", 300, f"{sick} verified and returned")
    wait_for(lambda: not run.rules_on(sick), 60, "sdcguard's rule removed")
    marks["returned"] = time.monotonic() - t_repair
    tests = [
        t
        for t in run.kube.request("GET", f"/apis/{GROUP}/{VERSION}/sdctests")["items"]
        if t["spec"].get("nodeName") == sick
    ]
    verifications = [t for t in tests if t["spec"].get("suite") == "repairVerification"]
    assert verifications and verifications[-1]["status"]["verdict"] == "Pass", verifications
    assert all((t.get("status") or {}).get("phase") == "Closed" for t in run.tickets(sick)), (
        run.tickets(sick)
    )
    assert quarantined_devices(run.tickets(sick)) == []

    # Back in full service: a claim for all eight GPUs gets the repaired one too.
    env.pod("all-eight", count=8, node=sick)
    wait_for(lambda: env.running_on("all-eight"), 60, "the 8-GPU pod on the returned node")
    assert env.allocated("all-eight") == [(sick, f"gpu-{i}") for i in range(8)]
    env.cleanup()
    # The chart's RBAC (rbac.allowDeviceTaints) let the operator do all of it.
    log = run.operator.log_path.read_text(errors="replace").splitlines()
    refused = refusals(log)
    assert not refused, refused[:10]
    print("device scope e2e seconds:", {k: round(v, 1) for k, v in marks.items()})
