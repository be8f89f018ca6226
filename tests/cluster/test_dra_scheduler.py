"""DRA device taints on the real scheduler and controller-manager (Kubernetes 1.37).

Two simulated A100 nodes (8 GPUs each) publish their GPUs as NVIDIA's DRA
driver does (:mod:`sdcdev.sim.dra`); the simulated kubelet runs the Pods the
real kube-scheduler binds to them. ResourceClaims ask for GPUs through the
``gpu.nvidia.com`` DeviceClass. The tests write ``DeviceTaintRule`` objects
(``resource.k8s.io/v1``) themselves and show what per-device quarantine rests on:

- a ``NoSchedule`` taint on one device: the scheduler allocates the node's
  other devices and never the tainted one; a claim that tolerates the taint
  (a re-test) may have it;
- ``NoExecute``: the controller-manager's device-taint-eviction-controller
  evicts the Pod using that device, and only that Pod;
- a taint on every device of a node (a selector naming the pool only): that
  node's claims cannot be scheduled, the other node takes the work.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from sdcdev.cluster.localcluster import LocalCluster
from sdcdev.harness import wait_for
from sdcdev.sim import SimOptions, Simulator, parse_fleet
from sdcdev.sim.kube import Kube
from sdcguard.domain.dra import NVIDIA_GPU_DRIVER, published_devices
from tests.cluster.dra_claims import SLICES, TAINT_KEY, Env


@pytest.fixture(scope="module")
def module_env(api_client: Any) -> Iterator[Env]:
    prefix = f"dra-{uuid.uuid4().hex[:6]}"
    doc = {
        "name": prefix,
        "defaults": {"dra": True},
        "nodes": [
            {"name": f"{prefix}-a", "instanceType": "p4d.24xlarge"},
            {"name": f"{prefix}-b", "instanceType": "p4d.24xlarge"},
        ],
    }
    fleet = parse_fleet(doc, "test")
    kube = Kube(api_client)
    kube.ensure_namespace(prefix)
    sim = Simulator(fleet, api_client, SimOptions(workloads=False, repair=False))
    sim.start()
    try:
        assert sim.wait_synced(30)
        yield Env(kube, prefix)
    finally:
        sim.stop(cleanup=True)
        kube.request("DELETE", f"/api/v1/namespaces/{prefix}")


@pytest.fixture
def env(module_env: Env) -> Iterator[Env]:
    yield module_env
    module_env.cleanup()


def test_device_taint_rules_are_served_in_resource_v1_with_no_flag_set(
    cluster: LocalCluster, env: Env
) -> None:
    version = env.kube.request("GET", "/version")
    assert (version["major"], version["minor"]) == ("1", "37"), version
    resources = env.kube.request("GET", "/apis/resource.k8s.io/v1")["resources"]
    names = {r["name"] for r in resources}
    assert {"devicetaintrules", "resourceslices", "deviceclasses", "resourceclaims"} <= names
    rule = next(r for r in resources if r["name"] == "devicetaintrules")
    assert rule["kind"] == "DeviceTaintRule" and rule["namespaced"] is False
    # Nothing was switched on for it: DRA device taints are on by default in 1.37.
    for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
        argv = cluster.processes[name].args
        assert isinstance(argv, list)
        assert not [a for a in argv if a.startswith(("--feature-gates", "--runtime-config"))]


def test_the_nodes_gpus_are_published_like_nvidias_driver(env: Env) -> None:
    slices = env.kube.request("GET", SLICES)["items"]
    for node in (env.a, env.b):
        devices = published_devices(slices, node, NVIDIA_GPU_DRIVER)
        assert [d.device for d in devices] == [f"gpu-{i}" for i in range(8)]
        assert {d.pool for d in devices} == {node}
        assert all(d.uuid and d.uuid.startswith("GPU-") for d in devices)


def test_a_noschedule_device_is_never_allocated_its_healthy_neighbours_are(env: Env) -> None:
    env.taint("a-gpu0", "NoSchedule", pool=env.a, device="gpu-0")
    # All of the node's healthy devices: gpu-1..gpu-7, never gpu-0 (the first in order).
    env.pod("seven", count=7, node=env.a)
    wait_for(lambda: env.running_on("seven"), 30, "the 7-GPU pod to run on node a")
    assert env.allocated("seven") == [(env.a, f"gpu-{i}") for i in range(1, 8)]
    # An eighth GPU on that node is the tainted one: not to be had.
    env.pod("one-more", count=1, node=env.a)
    message = wait_for(lambda: env.unschedulable("one-more"), 30, "one-more to be unschedulable")
    assert env.allocated("one-more") is None
    assert env.get_pod("one-more")["spec"].get("nodeName") is None  # type: ignore[index]
    assert message


def test_a_claim_that_tolerates_the_taint_gets_the_device(env: Env) -> None:
    env.taint("a-every-device", "NoSchedule", pool=env.a)
    toleration = [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]
    env.pod("retest", count=8, node=env.a, tolerations=toleration)
    wait_for(lambda: env.running_on("retest"), 30, "the tolerating pod to run on node a")
    assert env.allocated("retest") == sorted((env.a, f"gpu-{i}") for i in range(8))


def test_noexecute_evicts_the_pod_on_that_device_and_only_that_pod(env: Env) -> None:
    env.pod("victim", count=1, node=env.b)
    env.pod("neighbour", count=1, node=env.b)
    for pod in ("victim", "neighbour"):
        wait_for(lambda pod=pod: env.running_on(pod), 30, f"{pod} to run")  # type: ignore[misc]
    victim = env.allocated("victim")
    neighbour = env.allocated("neighbour")
    assert victim and neighbour and victim != neighbour
    (pool, device) = victim[0]
    env.taint("b-victim", "NoExecute", pool=pool, device=device)

    def evicted() -> dict[str, Any] | None:
        pod = env.get_pod("victim")
        if pod is None:
            return {"gone": True}
        for c in (pod.get("status") or {}).get("conditions") or []:
            if c["type"] == "DisruptionTarget" and c["status"] == "True":
                return dict(c)
        return None

    seen = wait_for(evicted, 60, "the device-taint eviction controller to evict the victim")
    if "reason" in seen:
        assert seen["reason"] == "DeletionByDeviceTaintManager"
    wait_for(lambda: env.get_pod("victim") is None, 30, "the evicted pod to be gone")
    # The neighbour on a healthy device of the same node keeps running.
    time.sleep(2)
    assert env.running_on("neighbour") == env.b


def test_a_node_with_every_device_tainted_takes_no_claims_others_take_the_work(
    env: Env,
) -> None:
    env.taint("a-whole-node", "NoSchedule", pool=env.a)
    pinned = "pinned-to-a"
    env.pod(pinned, count=1, node=env.a)
    for i in range(3):
        env.pod(f"work-{i}", count=2)
    for i in range(3):
        node = wait_for(
            lambda i=i: env.running_on(f"work-{i}"),  # type: ignore[misc]
            30,
            f"work-{i} to run",
        )
        assert node == env.b
        assert {pool for pool, _ in env.allocated(f"work-{i}") or []} == {env.b}
    wait_for(lambda: env.unschedulable(pinned), 30, "the pod pinned to node a to be unschedulable")
    assert env.allocated(pinned) is None
