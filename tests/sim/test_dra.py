"""The simulator's DRA view: ResourceSlices shaped like NVIDIA's DRA driver's."""

from __future__ import annotations

import pytest

from sdcdev.sim.commands import gpu_uuids
from sdcdev.sim.dra import (
    device_class_manifest,
    resource_slice_manifest,
)
from sdcdev.sim.fleet import Fleet, FleetError, parse_fleet
from sdcguard.domain.dra import resolve_device


def fleet(*nodes: dict[str, object], **top: object) -> Fleet:
    return parse_fleet({"name": "t", "nodes": list(nodes), **top}, "fleet.yaml")


def test_dra_is_per_node_with_a_default() -> None:
    f = fleet(
        {"name": "a", "instanceType": "p5.48xlarge"},
        {"name": "b", "instanceType": "p4d.24xlarge", "dra": False},
        defaults={"dra": True},
    )
    assert [n.dra for n in f.nodes] == [True, False]
    assert not fleet({"name": "a", "instanceType": "p5.48xlarge"}).nodes[0].dra


def test_dra_on_a_node_without_nvidia_gpus_names_the_entry() -> None:
    with pytest.raises(FleetError, match=r"nodes\[0\] \(name 'trn'\).*no NVIDIA GPUs"):
        fleet({"name": "trn", "instanceType": "trn1.32xlarge", "dra": True})


def test_slice_is_one_pool_per_node_with_a_device_per_gpu() -> None:
    node = fleet({"name": "h100-a", "instanceType": "p5.48xlarge", "dra": True}).nodes[0]
    body = resource_slice_manifest(node, "uid-1")
    spec = body["spec"]
    assert body["apiVersion"] == "resource.k8s.io/v1" and body["kind"] == "ResourceSlice"
    assert body["metadata"]["ownerReferences"][0] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": "h100-a",
        "uid": "uid-1",
    }
    assert spec["driver"] == "gpu.nvidia.com" and spec["nodeName"] == "h100-a"
    assert spec["pool"] == {"name": "h100-a", "generation": 1, "resourceSliceCount": 1}
    names = [d["name"] for d in spec["devices"]]
    assert names == [f"gpu-{i}" for i in range(8)]
    gpu3 = spec["devices"][3]
    assert gpu3["attributes"]["uuid"] == {"string": gpu_uuids("h100-a", 8)[3]}
    assert gpu3["attributes"]["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert gpu3["attributes"]["type"] == {"string": "gpu"}
    assert gpu3["attributes"]["cudaComputeCapability"] == {"version": "9.0.0"}
    assert gpu3["capacity"] == {"memory": {"value": "81559Mi"}}
    buses = {d["attributes"]["resource.kubernetes.io/pciBusID"]["string"] for d in spec["devices"]}
    assert len(buses) == 8


def test_the_probes_uuid_resolves_to_the_published_device() -> None:
    # The simulated kubelet gives the probe the node's GPU UUIDs in
    # NVIDIA_VISIBLE_DEVICES; the probe reports device i's UUID; the published
    # slice names that GPU gpu-i.
    nodes = fleet(
        {"namePrefix": "h-", "count": 2, "instanceType": "p4d.24xlarge", "dra": True}
    ).nodes
    slices = [resource_slice_manifest(n) for n in nodes]
    seen_by_probe = gpu_uuids("h-01", 2)
    ref = resolve_device(slices, "h-01", index=1, index_uuids=seen_by_probe)
    assert ref.selector() == {"driver": "gpu.nvidia.com", "pool": "h-01", "device": "gpu-1"}


def test_a_driver_restart_can_rename_the_devices() -> None:
    node = fleet({"name": "h", "instanceType": "p5.48xlarge", "dra": True}).nodes[0]
    old = resource_slice_manifest(node)
    new = resource_slice_manifest(node, generation=2, first_minor=8)
    uuid = gpu_uuids("h", 8)[0]
    assert resolve_device([old], "h", uuid=uuid).device == "gpu-0"
    assert resolve_device([old, new], "h", uuid=uuid).device == "gpu-8"


def test_device_class_selects_whole_gpus_of_the_driver() -> None:
    body = device_class_manifest()
    assert body["metadata"]["name"] == "gpu.nvidia.com"
    expr = body["spec"]["selectors"][0]["cel"]["expression"]
    assert expr == (
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
    )


def test_a_node_without_published_gpus_gets_no_slice() -> None:
    node = fleet({"name": "trn", "instanceType": "trn1.32xlarge"}).nodes[0]
    with pytest.raises(ValueError, match="no NVIDIA GPU"):
        resource_slice_manifest(node)


def test_the_simulated_driver_is_the_one_the_operator_resolves() -> None:
    from sdcdev.sim import dra as sim_dra
    from sdcguard.domain import dra as domain_dra

    assert sim_dra.NVIDIA_GPU_DRIVER == domain_dra.NVIDIA_GPU_DRIVER
