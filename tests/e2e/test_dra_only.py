"""DRA-only GPU nodes end to end on the simulated fleet (Kubernetes 1.37 DRA).

Two simulated 8-GPU H100 nodes publish their GPUs only as NVIDIA's DRA driver does
(``dra: only``: a ResourceSlice of ``gpu.nvidia.com``, no ``nvidia.com/gpu`` in their
allocatable). The operator runs as a process with the chart's ServiceAccount (the
chart's default values) under a policy with the default ``spec.dra``; every probe runs
for real (the CPU backend), on the GPUs its claim was allocated: the real
controller-manager makes the claim from the operator's ResourceClaimTemplate, the real
kube-scheduler allocates it, and the simulated kubelet hands the container the UUIDs
of the allocated GPUs, as NVIDIA's kubelet plugin does. Both nodes qualify on a
consensus baseline of their own results, and each screening names GPUs of its node.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

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
from sdcdev.sim.kube import Kube

pytestmark = pytest.mark.cluster

STATE_LABEL = "sdcguard.dev/state"


def _state(kube: Kube, node: str) -> str | None:
    labels = kube.request("GET", f"/api/v1/nodes/{node}")["metadata"].get("labels")
    return (labels or {}).get(STATE_LABEL)


@pytest.fixture
def fleet_run(cluster: LocalCluster, tmp_path: Path) -> Iterator[tuple[Kube, list[str]]]:
    suffix = uuid.uuid4().hex[:5]
    fleet_name = f"draonly-{suffix}"
    release = namespace = f"sdcguard-draonly-{suffix}"
    policy = fleet_name
    nodes = [f"{fleet_name}-a", f"{fleet_name}-b"]
    api: client.ApiClient = config.new_client_from_config(str(cluster.kubeconfig))
    kube = Kube(api)
    inst: Installation | None = None
    operator: LocalOperator | None = None
    sim: Simulator | None = None
    try:
        inst = install(cluster, api, release=release, namespace=namespace)
        operator = start_operator(
            cluster, api, inst, workdir=tmp_path, log_path=tmp_path / "operator.log"
        )
        settings = PolicySettings(quorum=2, idle_for="300s", max_unavailable=2)
        client.CustomObjectsApi(api).create_cluster_custom_object(
            GROUP, VERSION, "sdcpolicies", policy_body(policy, fleet_name, settings)
        )
        doc = {
            "name": fleet_name,
            "defaults": {"dra": "only", "taints": ["sdcguard.dev/unqualified:NoSchedule"]},
            "nodes": [{"name": n, "instanceType": "p5.48xlarge", "pool": "h100"} for n in nodes],
            "workloads": {"enabled": False},
            "repair": {"enabled": False},
        }
        sim = Simulator(parse_fleet(doc, "test"), api, SimOptions(workdir=tmp_path / "sim"))
        sim.start()
        yield kube, nodes
    finally:
        with contextlib.suppress(Exception):
            delete_policy(api, policy, operator)
        if sim is not None:
            sim.stop(cleanup=True)
        if operator is not None:
            print("--- operator log (tail) ---\n" + operator.log_tail(60))
            operator.stop()
        with contextlib.suppress(Exception):
            for item in kube.request("GET", f"/apis/{GROUP}/{VERSION}/sdctests")["items"]:
                if (item.get("spec") or {}).get("nodeName") in nodes:
                    delete_custom(api, "sdctests", item["metadata"]["name"])
        if inst is not None:
            uninstall(api, inst)
        api.close()


@pytest.mark.timeout(600)
def test_dra_only_nodes_qualify_with_the_real_probe_on_their_claimed_gpus(
    fleet_run: tuple[Kube, list[str]],
) -> None:
    kube, nodes = fleet_run
    t0 = time.monotonic()
    for node in nodes:
        allocatable = kube.request("GET", f"/api/v1/nodes/{node}")["status"]["allocatable"]
        assert "nvidia.com/gpu" not in allocatable
    for node in nodes:
        wait_for(lambda node=node: _state(kube, node) == "Qualified", 420, f"{node} qualified")
    print(f"both DRA-only nodes qualified in {time.monotonic() - t0:.0f} s")
    tests = kube.request("GET", f"/apis/{GROUP}/{VERSION}/sdctests")["items"]
    for node in nodes:
        passed = [
            t
            for t in tests
            if t["spec"]["nodeName"] == node and (t.get("status") or {}).get("verdict") == "Pass"
        ]
        assert passed, f"{node}: no passing screening"
        # The probe ran on GPUs its claim was allocated on this node (by UUID).
        named = {d for t in passed for d in t["status"].get("deviceIDs") or []}
        assert named and named <= set(gpu_uuids(node, 8)), named
