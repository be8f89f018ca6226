"""domain.dra: matching a probe's device (UUID or index) to a published DRA device."""

from __future__ import annotations

from typing import Any

import pytest

from sdcguard.domain.dra import (
    NVIDIA_GPU_DRIVER,
    DeviceMatchError,
    DeviceRef,
    published_devices,
    resolve_device,
)


def gpu_slice(
    node: str,
    uuids: list[str],
    *,
    driver: str = NVIDIA_GPU_DRIVER,
    pool: str | None = None,
    generation: int = 1,
    first_minor: int = 0,
    qualified: bool = False,
) -> dict[str, Any]:
    """A ResourceSlice as NVIDIA's DRA driver publishes it for a node's GPUs."""
    key = f"{driver}/uuid" if qualified else "uuid"
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}-x"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": pool or node, "generation": generation, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": f"gpu-{first_minor + i}",
                    "attributes": {
                        "type": {"string": "gpu"},
                        key: {"string": u},
                        "productName": {"string": "NVIDIA H100 80GB HBM3"},
                    },
                    "capacity": {"memory": {"value": "80Gi"}},
                }
                for i, u in enumerate(uuids)
            ],
        },
    }


UUIDS = [f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd" for i in range(4)]


def test_uuid_resolves_to_driver_pool_and_device_name() -> None:
    slices = [gpu_slice("n1", UUIDS), gpu_slice("n2", [u.replace("GPU-0", "GPU-9") for u in UUIDS])]
    ref = resolve_device(slices, "n1", uuid=UUIDS[2])
    assert ref == DeviceRef(NVIDIA_GPU_DRIVER, "n1", "gpu-2", UUIDS[2])
    assert ref.selector() == {"driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-2"}


def test_index_goes_through_the_probe_uuid_list_not_the_device_name() -> None:
    # The probe Pod saw GPUs 5 and 7 of the node as its devices 0 and 1.
    slices = [gpu_slice("n1", [f"GPU-{i}" for i in range(8)])]
    ref = resolve_device(slices, "n1", index=1, index_uuids=["GPU-5", "GPU-7"])
    assert ref.device == "gpu-7"


def test_uuid_match_ignores_case_and_reads_the_qualified_attribute() -> None:
    slices = [gpu_slice("n1", UUIDS, qualified=True)]
    assert resolve_device(slices, "n1", uuid=UUIDS[1].lower()).device == "gpu-1"


def test_only_the_newest_pool_generation_counts() -> None:
    # A driver restart: generation 2 renamed the devices (minors shifted); generation 1
    # slices are still there until the driver deletes them.
    old = gpu_slice("n1", UUIDS, generation=1)
    new = gpu_slice("n1", UUIDS, generation=2, first_minor=4)
    assert resolve_device([old, new], "n1", uuid=UUIDS[0]).device == "gpu-4"
    assert [d.device for d in published_devices([new, old], "n1")] == [
        "gpu-4",
        "gpu-5",
        "gpu-6",
        "gpu-7",
    ]


def test_other_nodes_and_network_pools_are_not_the_nodes_devices() -> None:
    shared = gpu_slice("n1", ["GPU-net"])
    del shared["spec"]["nodeName"]
    shared["spec"]["allNodes"] = True
    slices = [gpu_slice("n2", UUIDS), shared]
    with pytest.raises(DeviceMatchError) as err:
        resolve_device(slices, "n1", uuid="GPU-net")
    assert err.value.reason == "NoSlices"
    assert "n1" in err.value.message


def test_unknown_uuid_is_not_published() -> None:
    with pytest.raises(DeviceMatchError) as err:
        resolve_device([gpu_slice("n1", UUIDS)], "n1", uuid="GPU-ffffffff")
    assert err.value.reason == "NotPublished"
    assert "GPU-ffffffff" in str(err.value) and "4 device(s)" in str(err.value)


def test_a_uuid_published_twice_is_refused() -> None:
    slices = [
        gpu_slice("n1", UUIDS),
        gpu_slice("n1", UUIDS[:1], driver="other.example.com", pool="n1-other"),
    ]
    with pytest.raises(DeviceMatchError) as err:
        resolve_device(slices, "n1", uuid=UUIDS[0])
    assert err.value.reason == "Ambiguous"
    # Restricting the driver removes the ambiguity.
    assert resolve_device(slices, "n1", uuid=UUIDS[0], driver=NVIDIA_GPU_DRIVER).pool == "n1"


def test_index_without_a_uuid_cannot_be_matched() -> None:
    slices = [gpu_slice("n1", UUIDS)]
    for index_uuids in ([], [None, None], ["GPU-x"]):
        with pytest.raises(DeviceMatchError) as err:
            resolve_device(slices, "n1", index=1, index_uuids=index_uuids)
        assert err.value.reason == "NoUUID"


def test_exactly_one_of_uuid_and_index() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        resolve_device([], "n1")
    with pytest.raises(ValueError, match="exactly one"):
        resolve_device([], "n1", uuid="GPU-1", index=0)
    with pytest.raises(ValueError, match="negative"):
        resolve_device([], "n1", index=-1, index_uuids=["GPU-1"])


def test_malformed_slices_are_skipped_not_fatal() -> None:
    good = gpu_slice("n1", UUIDS[:1])
    junk: list[dict[str, Any]] = [
        {},
        {"spec": "x"},
        {"spec": {"nodeName": "n1", "driver": 3, "pool": {}}},
        {"spec": {"nodeName": "n1", "driver": "d", "pool": {"name": "p", "generation": "1"}}},
        {"spec": {"nodeName": "n1", "driver": "d", "pool": {"name": "p"}, "devices": [{}, 1]}},
    ]
    assert [d.device for d in published_devices([*junk, good], "n1")] == ["gpu-0"]
