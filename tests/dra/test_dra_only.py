"""DRA-only GPU nodes on the real control plane: the GPUs are published only in a
ResourceSlice (NVIDIA's DRA driver, no device plugin, no nvidia.com/gpu in the
node's allocatable). The operator counts them from its copy of the slices, its
probe Pod claims every one through a ResourceClaimTemplate, the real
controller-manager makes the claim and the real scheduler allocates it; a claim the
scheduler cannot satisfy is a wait that quotes the scheduler, and the node is
released when the Job's deadline ends the test."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sdcdev.harness import (
    NS,
    TESTING,
    ProbeKubelet,
    create_policy,
    list_custom,
    new_case,
    node_state,
    registered_nodes,
    taint_keys,
    trusted_baseline,
    wait_for,
)
from sdcdev.sim.dra import DraPublisher
from sdcdev.sim.fleet import Fleet, parse_fleet
from sdcdev.sim.kube import Kube
from sdcguard.builders.probe_job import claim_template_name

pytestmark = pytest.mark.cluster
GPU = "gpu.nvidia.com"
RESOURCE = ("resource.k8s.io", "v1")


def dra_only_fleet(names: list[str], case: str) -> Fleet:
    return parse_fleet(
        {
            "name": "dra-only",
            "nodes": [
                {
                    "name": n,
                    "instanceType": "p5.48xlarge",
                    "pool": "test",
                    "labels": {"sdcguard.test/case": case},
                    "dra": "only",
                }
                for n in names
            ],
            "workloads": {"enabled": False},
            "repair": {"enabled": False},
        }
    )


@contextlib.contextmanager
def dra_only_nodes(api: client.ApiClient, names: list[str], case: str) -> Iterator[None]:
    """Register DRA-only H100 nodes and publish their ResourceSlices (and the DeviceClass
    NVIDIA's chart installs); remove the slices afterwards."""
    fleet = dra_only_fleet(names, case)
    publisher = DraPublisher(Kube(api), fleet.nodes)
    with registered_nodes(api, list(fleet.nodes)):
        core = client.CoreV1Api(api)
        uids = {n: str(core.read_node(n).metadata.uid) for n in names}
        publisher.publish_all(uids)
        try:
            yield
        finally:
            publisher.unpublish_all()


def _probe_pods(api: client.ApiClient, node: str) -> list[client.V1Pod]:
    return list(
        client.CoreV1Api(api)
        .list_namespaced_pod(NS, label_selector=f"sdcguard.dev/node={node}")
        .items
    )


def _claim_of(api: client.ApiClient, pod: client.V1Pod) -> dict[str, Any] | None:
    statuses = (pod.status.resource_claim_statuses if pod.status else None) or []
    names = [s.resource_claim_name for s in statuses if s.resource_claim_name]
    if not names:
        return None
    custom = client.CustomObjectsApi(api)
    try:
        claim: dict[str, Any] = custom.get_namespaced_custom_object(
            *RESOURCE, NS, "resourceclaims", names[0]
        )
    except ApiException:
        return None
    return claim


def _allocated(api: client.ApiClient, node: str) -> list[dict[str, Any]] | None:
    for pod in _probe_pods(api, node):
        claim = _claim_of(api, pod)
        if claim is None:
            continue
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
            "results"
        )
        if results and pod.spec and pod.spec.node_name == node:
            return list(results)
    return None


def _waiting(api: client.ApiClient, node: str) -> str:
    annotations = client.CoreV1Api(api).read_node(node).metadata.annotations or {}
    return str(annotations.get("sdcguard.dev/waiting", ""))


def test_a_dra_only_node_is_screened_with_every_gpu_claimed(
    dra_api: client.ApiClient, dra_operator: object
) -> None:
    case = new_case()
    node = f"draonly-{case}"
    trusted_baseline(dra_api)
    outcomes = {node: "never"}
    with dra_only_nodes(dra_api, [node], case), ProbeKubelet(dra_api, outcomes):
        allocatable = client.CoreV1Api(dra_api).read_node(node).status.allocatable or {}
        assert "nvidia.com/gpu" not in allocatable, "a DRA-only node advertises no GPU"
        create_policy(dra_api, case)
        # The scheduler placed the probe with all eight GPUs of this node in its claim.
        results = wait_for(lambda: _allocated(dra_api, node), 90, "the probe's claim allocated")
        assert sorted(r["device"] for r in results) == [f"gpu-{i}" for i in range(8)]
        assert {(r["driver"], r["pool"]) for r in results} == {(GPU, node)}
        template = client.CustomObjectsApi(dra_api).get_namespaced_custom_object(
            *RESOURCE, NS, "resourceclaimtemplates", claim_template_name(GPU)
        )
        (request,) = template["spec"]["spec"]["devices"]["requests"]
        assert request["exactly"]["allocationMode"] == "All"

        outcomes[node] = "pass"
        wait_for(lambda: node_state(dra_api, node) == "Qualified", 90, "qualification")
        (test,) = [t for t in list_custom(dra_api, "sdctests", node)]
        assert test["status"]["verdict"] == "Pass"
        assert TESTING not in taint_keys(dra_api, node)


def test_the_probes_claim_takes_a_gpu_sdcguards_device_taint_took_out(
    dra_api: client.ApiClient, dra_operator: object
) -> None:
    """Quarantine scope Device on a DRA-only node: the GPU sdcguard tainted is still
    claimed by the probe (a verification screens it with the others)."""
    case = new_case()
    node = f"drataint-{case}"
    trusted_baseline(dra_api)
    custom = client.CustomObjectsApi(dra_api)
    rule = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": f"test-{case}-gpu3"},
        "spec": {
            "deviceSelector": {"driver": GPU, "pool": node, "device": "gpu-3"},
            "taint": {"key": "sdcguard.dev/sdc", "value": "t", "effect": "NoSchedule"},
        },
    }
    with dra_only_nodes(dra_api, [node], case), ProbeKubelet(dra_api, {node: "never"}):
        custom.create_cluster_custom_object(*RESOURCE, "devicetaintrules", rule)
        try:
            create_policy(dra_api, case)
            results = wait_for(lambda: _allocated(dra_api, node), 90, "the probe's claim allocated")
            assert "gpu-3" in {r["device"] for r in results}
            assert len(results) == 8
        finally:
            custom.delete_cluster_custom_object(
                *RESOURCE, "devicetaintrules", rule["metadata"]["name"]
            )


def test_a_claim_the_scheduler_cannot_satisfy_waits_with_its_reason_and_releases_the_node(
    dra_api: client.ApiClient, dra_operator: object
) -> None:
    case = new_case()
    node = f"draclass-{case}"
    trusted_baseline(dra_api)
    with dra_only_nodes(dra_api, [node], case), ProbeKubelet(dra_api, {node: "pass"}):
        # The class the probe claims through does not exist (a typo in spec.dra).
        create_policy(
            dra_api,
            case,
            dra=[{"deviceClassName": "gpu.example.invalid", "driver": GPU}],
            probe={"activeDeadlineSeconds": 60, "budgetSeconds": 30},
        )
        wait_for(
            lambda: "cannot be scheduled" in _waiting(dra_api, node),
            90,
            "the node's wait quoting the scheduler",
        )
        assert "gpu.example.invalid" in _waiting(dra_api, node)
        # The Job's deadline ends the test; the node is not left reserved.
        wait_for(lambda: TESTING not in taint_keys(dra_api, node), 150, "the reservation ends")
        (test,) = [t for t in list_custom(dra_api, "sdctests", node)]
        assert test["status"]["verdict"] in ("Inconclusive", "Timeout")
