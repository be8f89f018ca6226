"""Re-certification that cannot stall: a pending pod that fits no node holds no
screening back (the issue's case: 16 GPUs asked of 8-GPU nodes), on the real API
server."""

from __future__ import annotations

import time

from kubernetes import client

from sdcdev.harness import (
    ProbeKubelet,
    create_policy,
    gpu_nodes,
    gpu_pod,
    list_custom,
    new_case,
    node_state,
    trusted_baseline,
    wait_for,
)


def _reasons(api: client.ApiClient, node: str) -> list[str]:
    return [t["spec"]["reason"] for t in list_custom(api, "sdctests", node)]


def _pending(name: str, gpus: str) -> client.V1Pod:
    """A pod left for the scheduler asking for ``gpus`` GPUs."""
    pod = gpu_pod(name, None)
    assert pod.spec is not None
    pod.spec.containers[0].resources = client.V1ResourceRequirements(
        requests={"nvidia.com/gpu": gpus}, limits={"nvidia.com/gpu": gpus}
    )
    return pod


def test_a_pod_that_fits_no_node_does_not_hold_back_rescreening(api_client, operator) -> None:
    """A node returns from use while two pods wait: one asks for 16 GPUs of 8-GPU
    nodes (it can never run), one for 8 but only on a zone no node is in. Neither is
    demand for the node, so its return-from-use screening starts."""
    case = new_case()
    node = f"stall-{case}"
    trusted_baseline(api_client)
    core = client.CoreV1Api(api_client)
    with gpu_nodes(api_client, [node], case=case), ProbeKubelet(api_client, {node: "pass"}):
        create_policy(api_client, case)
        wait_for(lambda: node_state(api_client, node) == "Qualified", 60, "qualification")
        core.create_namespaced_pod("default", _pending(f"huge-{case}", "16"))
        elsewhere = _pending(f"zoned-{case}", "8")
        assert elsewhere.spec is not None
        elsewhere.spec.node_selector = {"topology.kubernetes.io/zone": f"nowhere-{case}"}
        core.create_namespaced_pod("default", elsewhere)
        try:
            # The node is used, then idle: it returns from use.
            core.create_namespaced_pod("default", gpu_pod(f"train-{case}", node))
            core.patch_namespaced_pod_status(
                f"train-{case}", "default", {"status": {"phase": "Running"}}
            )
            time.sleep(2)
            core.delete_namespaced_pod(f"train-{case}", "default", grace_period_seconds=0)
            wait_for(
                lambda: "ReturnFromUse" in _reasons(api_client, node),
                60,
                "the return-from-use screening despite the pods that fit no node",
            )
            wait_for(lambda: node_state(api_client, node) == "Qualified", 60, "re-qualified")
        finally:
            for name in (f"huge-{case}", f"zoned-{case}"):
                core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
