"""The scale benchmark's workload Pods are what its table says: bound, Running, GPU
workers owned by a PyTorchJob that exists, and churn replaces Pods without changing
the counts."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator

import pytest
from bench.scale.fleet import (
    GPU_PODS_PER_NODE,
    GPUS_PER_POD,
    OWNER_GROUP,
    OWNER_PLURAL,
    OWNER_VERSION,
    WORK_LABEL,
    WORK_NAMESPACES,
    PodWorkload,
    node_body,
)
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from sdcdev.cluster.localcluster import LocalCluster

pytestmark = pytest.mark.cluster

NODES = ["gpu-90001", "gpu-90002"]


@pytest.fixture
def api(cluster: LocalCluster) -> Iterator[client.ApiClient]:
    admin = config.new_client_from_config(str(cluster.kubeconfig))
    core = client.CoreV1Api(admin)
    for name in NODES:
        core.create_node(node_body(name, fleet=False, gated=False))
    try:
        yield admin
    finally:
        for name in NODES:
            with contextlib.suppress(ApiException):
                core.delete_node(name)
        for ns in WORK_NAMESPACES:
            with contextlib.suppress(ApiException):
                core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
            with contextlib.suppress(ApiException):
                core.delete_namespace(ns)
        with contextlib.suppress(ApiException):
            client.ApiextensionsV1Api(admin).delete_custom_resource_definition(
                f"{OWNER_PLURAL}.{OWNER_GROUP}"
            )


def _pods(admin: client.ApiClient) -> list[dict]:
    resp = client.CoreV1Api(admin).list_pod_for_all_namespaces(
        label_selector=WORK_LABEL, _preload_content=False
    )
    return [p for p in json.loads(resp.data)["items"] if p["spec"]["nodeName"] in NODES]


def test_pods_are_bound_running_owned_and_churn_keeps_the_counts(
    api: client.ApiClient,
) -> None:
    work = PodWorkload(api, threads=4)
    work.prepare()
    work.add_cpu_pods(NODES, 6)
    work.add_gpu_pods(NODES[:1])
    pods = _pods(api)
    assert len(pods) == 6 + GPU_PODS_PER_NODE
    assert all(p["status"]["phase"] == "Running" for p in pods)
    assert (
        sorted(p["spec"]["nodeName"] for p in pods if "cpu" in p["metadata"]["name"])
        == [NODES[0]] * 3 + [NODES[1]] * 3
    )
    gpu = [p for p in pods if p["metadata"]["labels"][WORK_LABEL] == "gpu"]
    assert len(gpu) == GPU_PODS_PER_NODE
    custom = client.CustomObjectsApi(api)
    for pod in gpu:
        assert pod["spec"]["nodeName"] == NODES[0]
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == str(GPUS_PER_POD)
        (ref,) = pod["metadata"]["ownerReferences"]
        owner = custom.get_namespaced_custom_object(
            OWNER_GROUP, OWNER_VERSION, pod["metadata"]["namespace"], OWNER_PLURAL, ref["name"]
        )
        assert owner["metadata"]["uid"] == ref["uid"]
    before = {p["metadata"]["name"] for p in pods}

    work.start_churn(6.0)  # 60 Pods a minute of 10: one a second
    time.sleep(4.5)
    work.stop_churn()
    counts = work.counts()
    assert counts["errors"] == 0
    assert counts["created"] - len(before) >= 3
    after = _pods(api)
    assert len(after) == len(pods)
    assert len({p["metadata"]["name"] for p in after} - before) == counts["created"] - len(before)
    assert all(p["status"]["phase"] == "Running" for p in after)
    # A GPU worker is replaced on its node for its job; its changes are recorded there.
    replaced_gpu = [p for p in after if p["metadata"]["labels"][WORK_LABEL] == "gpu"]
    assert len(replaced_gpu) == GPU_PODS_PER_NODE
    assert all(p["spec"]["nodeName"] == NODES[0] for p in replaced_gpu)
    assert set(work.changes) <= {NODES[0]}
