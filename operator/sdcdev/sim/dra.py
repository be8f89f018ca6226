"""The DRA view of simulated GPU nodes: ResourceSlices as NVIDIA's DRA driver publishes them.

A node entry with ``dra: true`` (NVIDIA GPU instance types only) gets what the
kubelet plugin of NVIDIA's DRA driver for GPUs publishes on a real node:

- one ResourceSlice per node, driver ``gpu.nvidia.com``, one pool named after
  the node (``spec.pool.name``), owned by the Node (so it goes with it);
- one device per GPU named ``gpu-<minor>`` (minor = the GPU's index here),
  with the attributes ``type`` (``gpu``), ``uuid``, ``productName``, ``brand``,
  ``architecture``, ``cudaComputeCapability``, ``driverVersion``,
  ``cudaDriverVersion`` and ``resource.kubernetes.io/pciBusID``, and the
  capacity ``memory``;
- the DeviceClass ``gpu.nvidia.com`` selecting those devices with the driver's
  CEL expression.

The UUIDs are :func:`sdcdev.sim.commands.gpu_uuids`, the ones the simulated
kubelet puts in a container's ``NVIDIA_VISIBLE_DEVICES``, so a probe's
``devices`` list name published devices. With ``dra: true`` the node keeps
advertising its ``nvidia.com/gpu`` extended resource as well, so slices and
extended resource are two views of the same GPUs: a test uses one or the other on
a node, as the simulator does not keep both from handing out one GPU twice. With
``dra: only`` it does not (a DRA-only node): its Pods get GPUs through claims alone,
and the simulated kubelet gives a container the GPUs its claims were allocated
(:func:`claimed_minors`). Manifests are pure functions; :class:`DraPublisher`
writes them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import structlog

from sdcdev.sim.commands import gpu_uuids
from sdcdev.sim.fleet import NodeConfig
from sdcdev.sim.kube import Kube, status_of

log = structlog.get_logger("sdcdev.sim")

#: The driver the simulator plays (the simulator stays outside the operator's
#: import graph, so this is not ``sdcguard.domain.dra.NVIDIA_GPU_DRIVER``).
NVIDIA_GPU_DRIVER = "gpu.nvidia.com"
RESOURCE_API = "resource.k8s.io/v1"
DEVICE_CLASS = NVIDIA_GPU_DRIVER
"""The DeviceClass NVIDIA's chart installs for whole GPUs (same name as the driver)."""
GPU_RESOURCE = "nvidia.com/gpu"
_SLICES = "/apis/resource.k8s.io/v1/resourceslices"
_CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"


@dataclass(frozen=True)
class GpuModel:
    """What NVIDIA's driver reads from a GPU model (NVML) for its device attributes."""

    architecture: str
    compute_capability: str
    memory: str
    """``memory`` capacity as a Kubernetes quantity (the GPU's total memory)."""


#: By ``InstanceType.accelerator_model``; the public specifications of each GPU.
GPU_MODELS = {
    "NVIDIA H100 80GB HBM3": GpuModel("Hopper", "9.0.0", "81559Mi"),
    "NVIDIA A100-SXM4-40GB": GpuModel("Ampere", "8.0.0", "40960Mi"),
}
DRIVER_VERSION = "570.172.8"
CUDA_DRIVER_VERSION = "12.8.0"


def publishes_gpus(cfg: NodeConfig) -> bool:
    """Whether NVIDIA's DRA driver would publish this node's accelerators."""
    itype = cfg.instance_type
    return itype.accelerator_resource == GPU_RESOURCE and itype.accelerator_model in GPU_MODELS


def slice_name(node: str) -> str:
    return f"{node}-{NVIDIA_GPU_DRIVER}"


def _pci_bus_id(node: str, minor: int) -> str:
    h = hashlib.sha256(f"pci:{node}".encode()).digest()
    return f"0000:{(h[0] + 16 * minor) % 256:02x}:00.0"


def gpu_devices(node: str, cfg: NodeConfig, *, first_minor: int = 0) -> list[dict[str, Any]]:
    """The node's GPUs as ResourceSlice devices (``gpu-<minor>``)."""
    itype = cfg.instance_type
    model = GPU_MODELS[itype.accelerator_model]
    devices = []
    for i, uuid in enumerate(gpu_uuids(node, itype.accelerator_count)):
        minor = first_minor + i
        devices.append(
            {
                "name": f"gpu-{minor}",
                "attributes": {
                    "type": {"string": "gpu"},
                    "uuid": {"string": uuid},
                    "productName": {"string": itype.accelerator_model},
                    "brand": {"string": "Nvidia"},
                    "architecture": {"string": model.architecture},
                    "cudaComputeCapability": {"version": model.compute_capability},
                    "driverVersion": {"version": DRIVER_VERSION},
                    "cudaDriverVersion": {"version": CUDA_DRIVER_VERSION},
                    "resource.kubernetes.io/pciBusID": {"string": _pci_bus_id(node, minor)},
                },
                "capacity": {"memory": {"value": model.memory}},
            }
        )
    return devices


def resource_slice_manifest(
    cfg: NodeConfig, node_uid: str | None = None, *, generation: int = 1, first_minor: int = 0
) -> dict[str, Any]:
    """The ResourceSlice of ``cfg``'s GPUs. ``generation`` and ``first_minor`` let a test
    play a driver restart that republishes (or renames) the devices."""
    if not publishes_gpus(cfg):
        raise ValueError(
            f"node {cfg.name}: instance type {cfg.instance_type.name} has no NVIDIA GPU "
            f"that {NVIDIA_GPU_DRIVER} publishes (known: {', '.join(sorted(GPU_MODELS))})"
        )
    metadata: dict[str, Any] = {"name": slice_name(cfg.name)}
    if node_uid:
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": cfg.name, "uid": node_uid}
        ]
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceSlice",
        "metadata": metadata,
        "spec": {
            "driver": NVIDIA_GPU_DRIVER,
            "nodeName": cfg.name,
            "pool": {"name": cfg.name, "generation": generation, "resourceSliceCount": 1},
            "devices": gpu_devices(cfg.name, cfg, first_minor=first_minor),
        },
    }


def device_class_manifest() -> dict[str, Any]:
    """The DeviceClass for whole NVIDIA GPUs, with the selector NVIDIA's chart uses."""
    return {
        "apiVersion": RESOURCE_API,
        "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS},
        "spec": {
            "selectors": [
                {
                    "cel": {
                        "expression": (
                            f"device.driver == '{NVIDIA_GPU_DRIVER}' && "
                            f"device.attributes['{NVIDIA_GPU_DRIVER}'].type == 'gpu'"
                        )
                    }
                }
            ]
        },
    }


def claimed_minors(kube: Kube, namespace: str, claims: Iterable[str], node: str) -> list[int]:
    """The minors of ``node``'s GPUs that these ResourceClaims were allocated (as the
    kubelet plugin of NVIDIA's driver prepares them for a container), in order; a
    claim not allocated (yet) or gone gives none."""
    minors: set[int] = set()
    for name in claims:
        try:
            claim = kube.request(
                "GET", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
            )
        except Exception as exc:
            if status_of(exc) != 404:
                raise
            continue
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            device = str(result.get("device", ""))
            if result.get("driver") != NVIDIA_GPU_DRIVER or result.get("pool") != node:
                continue
            if device.startswith("gpu-") and device[4:].isdigit():
                minors.add(int(device[4:]))
    return sorted(minors)


class DraError(RuntimeError):
    """The cluster cannot take the DRA objects (no resource.k8s.io/v1, say)."""


class DraPublisher:
    """Publishes the DeviceClass and each DRA node's ResourceSlice; removes them again."""

    def __init__(self, kube: Kube, nodes: Iterable[NodeConfig]) -> None:
        self.kube = kube
        self.nodes = [n for n in nodes if n.dra]

    def publish_all(self, node_uids: dict[str, str]) -> int:
        """The DeviceClass (once) and every DRA node's slice; returns the slices written."""
        if not self.nodes:
            return 0
        self._create_or_replace(_CLASSES, device_class_manifest())
        for cfg in self.nodes:
            self.publish(cfg, node_uids.get(cfg.name))
        log.info("sim.dra.published", nodes=len(self.nodes), driver=NVIDIA_GPU_DRIVER)
        return len(self.nodes)

    def publish(
        self,
        cfg: NodeConfig,
        node_uid: str | None = None,
        *,
        generation: int = 1,
        first_minor: int = 0,
    ) -> dict[str, Any]:
        """Write ``cfg``'s ResourceSlice (replacing the one there)."""
        body = resource_slice_manifest(
            cfg, node_uid, generation=generation, first_minor=first_minor
        )
        return self._create_or_replace(_SLICES, body)

    def unpublish_all(self) -> None:
        for cfg in self.nodes:
            try:
                self.kube.request("DELETE", f"{_SLICES}/{slice_name(cfg.name)}")
            except Exception as exc:
                if status_of(exc) != 404:
                    log.warning("sim.dra.delete_failed", node=cfg.name, error=repr(exc)[:200])

    def _create_or_replace(self, collection: str, body: dict[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        try:
            return self.kube.request("POST", collection, body=body)
        except Exception as exc:
            status = status_of(exc)
            if status == 404:
                raise DraError(
                    f"the API server does not serve {RESOURCE_API} ({collection}): DRA needs "
                    "Kubernetes 1.34 or newer; set dra: false for these nodes"
                ) from None
            if status != 409:
                raise
        current = self.kube.request("GET", f"{collection}/{name}")
        body = {**body, "metadata": {**body["metadata"], **_keep(current["metadata"])}}
        return self.kube.request("PUT", f"{collection}/{name}", body=body)


def _keep(metadata: dict[str, Any]) -> dict[str, Any]:
    return {"resourceVersion": metadata["resourceVersion"]}
