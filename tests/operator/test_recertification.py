"""Re-certification that cannot stall, on the real API server: a pending pod that fits
no node holds no screening back (the issue's case: 16 GPUs asked of 8-GPU nodes), and a
node kept busy past its qualification's age is Overdue."""

from __future__ import annotations

import time

from kubernetes import client

from sdcdev.harness import (
    TESTING,
    ProbeKubelet,
    create_policy,
    gpu_nodes,
    gpu_pod,
    list_custom,
    new_case,
    node_state,
    read_node,
    taint_keys,
    trusted_baseline,
    wait_for,
)
from sdcguard.domain.recertification import LABEL_OVERDUE


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


def _labels(api: client.ApiClient, node: str) -> dict[str, str]:
    return dict(read_node(api, node).metadata.labels or {})


def test_a_busy_node_past_its_age_is_overdue_held_and_rescreened_when_idle(
    api_client, operator
) -> None:
    """maxQualificationAge 1m with overdue.action Drain: a node kept busy past it is
    labelled overdue and held (no new work lands); once its work ends it is screened
    (Expiry), and both the label and the hold go."""
    case = new_case()
    node = f"overdue-{case}"
    trusted_baseline(api_client)
    core = client.CoreV1Api(api_client)
    with gpu_nodes(api_client, [node], case=case), ProbeKubelet(api_client, {node: "pass"}):
        create_policy(
            api_client,
            case,
            triggers={
                "maxQualificationAge": "1m",
                "overdue": {"action": "Drain", "gracePeriod": "1h"},
            },
        )
        wait_for(lambda: node_state(api_client, node) == "Qualified", 60, "qualification")
        core.create_namespaced_pod("default", gpu_pod(f"train-{case}", node))
        core.patch_namespaced_pod_status(
            f"train-{case}", "default", {"status": {"phase": "Running"}}
        )
        try:
            wait_for(
                lambda: _labels(api_client, node).get(LABEL_OVERDUE) == "true",
                120,
                "the overdue label on a node kept busy",
            )
            wait_for(lambda: TESTING in taint_keys(api_client, node), 30, "the hold")
            assert node_state(api_client, node) == "Qualified"
            assert "Expiry" not in _reasons(api_client, node), "screened under a workload"
        finally:
            core.delete_namespaced_pod(f"train-{case}", "default", grace_period_seconds=0)
        wait_for(lambda: "Expiry" in _reasons(api_client, node), 60, "the expiry screening")
        wait_for(
            lambda: (
                node_state(api_client, node) == "Qualified"
                and LABEL_OVERDUE not in _labels(api_client, node)
                and TESTING not in taint_keys(api_client, node)
            ),
            60,
            "re-qualified: no overdue label, no hold",
        )
