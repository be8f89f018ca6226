"""Which DRA device a node's accelerator is: (driver, pool, device) from ResourceSlices.

A ``DeviceTaintRule`` (``resource.k8s.io/v1``) selects devices by driver, pool and
device name, the names a DRA driver publishes in its ResourceSlices. The probe
names a device by its index in the probe Pod and, where it can read it, by the
GPU's UUID (the probe result's ``devices``, kept as the SDCTest's
``status.deviceIDs``). NVIDIA's DRA driver (driver ``gpu.nvidia.com``) publishes
one pool per node, named after the node, with one device per GPU named
``gpu-<minor>`` and the GPU's UUID in its ``uuid`` attribute. The device's minor
number and the probe's device index are different numbers (a container sees only
its GPUs, in CUDA's order), so a device is matched by UUID only, never by guessing a
name from an index.

:func:`published_devices` reads a node's devices out of ResourceSlice objects
(dicts as the API returns them, camelCase); :func:`resolve_device` turns
``(node, UUID or probe index)`` into a :class:`DeviceRef`, or raises
:class:`DeviceMatchError` whose ``reason`` says why not (the caller quarantines
the whole node then, and says so). Pure: no I/O, slices are passed in.

Rules, each tested:

- only slices for this node (``spec.nodeName``) count; network-attached pools
  (``allNodes``, ``nodeSelector``) are not a node's devices;
- of a pool, only the slices of its newest ``spec.pool.generation`` count (a
  driver that restarts publishes a new generation and deletes the old slices
  afterwards; until then both exist);
- a UUID is read from the ``uuid`` attribute, bare or qualified with the
  driver's domain (``gpu.nvidia.com/uuid``), and compared without case;
- a UUID published twice on one node (two drivers, two pools) is ambiguous and
  is refused: tainting the wrong device is worse than tainting the node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

#: DRA's ResourceSlices (GA in Kubernetes 1.34): group, version, plural.
RESOURCE_SLICES = ("resource.k8s.io", "v1", "resourceslices")
#: NVIDIA's DRA driver for GPUs.
NVIDIA_GPU_DRIVER = "gpu.nvidia.com"
#: The device attribute holding a GPU's UUID (``GPU-…``).
UUID_ATTRIBUTE = "uuid"

MatchFailure = Literal["NoSlices", "NoUUID", "NotPublished", "Ambiguous"]


@dataclass(frozen=True)
class DeviceRef:
    """One published device: what a ``DeviceTaintRule``'s ``deviceSelector`` names."""

    driver: str
    pool: str
    device: str
    uuid: str | None = None
    """The device's ``uuid`` attribute, when it has one."""

    def selector(self) -> dict[str, str]:
        """``spec.deviceSelector`` of a ``DeviceTaintRule`` selecting exactly this device."""
        return {"driver": self.driver, "pool": self.pool, "device": self.device}


class DeviceMatchError(LookupError):
    """A device that cannot be matched to exactly one published device.

    ``reason``: ``NoSlices`` (nothing of this node is published through DRA),
    ``NoUUID`` (the probe could not tell the device's UUID), ``NotPublished``
    (no published device has that UUID), ``Ambiguous`` (more than one has).
    """

    def __init__(self, reason: MatchFailure, message: str) -> None:
        super().__init__(message)
        self.reason: MatchFailure = reason
        self.message = message


def _attribute_string(attributes: Mapping[str, Any], driver: str, name: str) -> str | None:
    for key in (name, f"{driver}/{name}"):
        value = attributes.get(key)
        if isinstance(value, Mapping) and isinstance(value.get("string"), str):
            return str(value["string"])
    return None


def published_devices(
    slices: Iterable[Mapping[str, Any]], node: str, driver: str | None = None
) -> list[DeviceRef]:
    """Every device ``node``'s ResourceSlices publish (of ``driver`` only, when given),
    newest pool generation only, in (driver, pool, device) order."""
    newest: dict[tuple[str, str], int] = {}
    mine: list[tuple[str, str, int, Mapping[str, Any]]] = []
    for obj in slices:
        spec = obj.get("spec")
        if not isinstance(spec, Mapping) or spec.get("nodeName") != node:
            continue
        slice_driver = spec.get("driver")
        pool = spec.get("pool")
        if not isinstance(slice_driver, str) or not isinstance(pool, Mapping):
            continue
        if driver is not None and slice_driver != driver:
            continue
        pool_name = pool.get("name")
        generation = pool.get("generation", 0)
        if not isinstance(pool_name, str) or not isinstance(generation, int):
            continue
        key = (slice_driver, pool_name)
        newest[key] = max(newest.get(key, generation), generation)
        mine.append((slice_driver, pool_name, generation, spec))
    found: dict[tuple[str, str, str], DeviceRef] = {}
    for slice_driver, pool_name, generation, spec in mine:
        if generation != newest[(slice_driver, pool_name)]:
            continue
        for device in spec.get("devices") or ():
            if not isinstance(device, Mapping) or not isinstance(device.get("name"), str):
                continue
            attributes = device.get("attributes")
            uuid = (
                _attribute_string(attributes, slice_driver, UUID_ATTRIBUTE)
                if isinstance(attributes, Mapping)
                else None
            )
            ref = DeviceRef(slice_driver, pool_name, str(device["name"]), uuid)
            found[(ref.driver, ref.pool, ref.device)] = ref
    return [found[k] for k in sorted(found)]


def resolve_device(
    slices: Iterable[Mapping[str, Any]],
    node: str,
    *,
    uuid: str | None = None,
    index: int | None = None,
    index_uuids: Sequence[str | None] = (),
    driver: str | None = None,
) -> DeviceRef:
    """The published device of ``node`` with GPU UUID ``uuid``, or the one the probe saw
    as device ``index`` (its UUID is ``index_uuids[index]``, the probe result's
    ``devices``). Give exactly one of ``uuid`` and ``index``.

    Raises :class:`DeviceMatchError` when there is not exactly one such device.
    """
    if (uuid is None) == (index is None):
        raise ValueError("give exactly one of uuid and index")
    if index is not None:
        if index < 0:
            raise ValueError(f"device index {index} is negative")
        known = index_uuids[index] if index < len(index_uuids) else None
        if not known:
            raise DeviceMatchError(
                "NoUUID",
                f"the probe on node {node} did not report the UUID of its device {index} "
                f"(it reported {len(index_uuids)} UUID(s)); the device cannot be matched "
                "to a published DRA device",
            )
        uuid = known
    assert uuid is not None
    devices = published_devices(slices, node, driver)
    if not devices:
        which = f"driver {driver}" if driver else "any DRA driver"
        raise DeviceMatchError(
            "NoSlices", f"node {node} has no devices published through {which} (no ResourceSlice)"
        )
    matches = [d for d in devices if d.uuid is not None and d.uuid.lower() == uuid.lower()]
    if not matches:
        raise DeviceMatchError(
            "NotPublished",
            f"no device published for node {node} has UUID {uuid} "
            f"({len(devices)} device(s) published)",
        )
    if len(matches) > 1:
        names = ", ".join(f"{d.driver}/{d.pool}/{d.device}" for d in matches)
        raise DeviceMatchError(
            "Ambiguous", f"UUID {uuid} is published more than once for node {node}: {names}"
        )
    return matches[0]


@dataclass(frozen=True)
class SliceSnapshot:
    """What the operator keeps of a ResourceSlice: whose devices, and how many (for
    DRA-only nodes, spec.dra). Slices for no single node (``allNodes``,
    ``nodeSelector``) are not kept."""

    node: str
    driver: str
    pool: str
    generation: int
    devices: int

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> SliceSnapshot | None:
        spec = body.get("spec")
        if not isinstance(spec, Mapping):
            return None
        node, driver, pool = spec.get("nodeName"), spec.get("driver"), spec.get("pool")
        if not (isinstance(node, str) and node and isinstance(driver, str)):
            return None
        if not isinstance(pool, Mapping) or not isinstance(pool.get("name"), str):
            return None
        generation = pool.get("generation", 0)
        devices = [d for d in spec.get("devices") or () if isinstance(d, Mapping) and d.get("name")]
        return cls(
            node=node,
            driver=driver,
            pool=str(pool["name"]),
            generation=generation if isinstance(generation, int) else 0,
            devices=len(devices),
        )


def device_counts(slices: Iterable[SliceSnapshot]) -> tuple[tuple[str, int], ...]:
    """Devices per driver of one node's slices, newest pool generation only (a driver
    that restarts publishes a new generation before it deletes the old one), sorted
    by driver; drivers that publish none are left out."""
    newest: dict[tuple[str, str], int] = {}
    kept = list(slices)
    for s in kept:
        key = (s.driver, s.pool)
        newest[key] = max(newest.get(key, s.generation), s.generation)
    counts: dict[str, int] = {}
    for s in kept:
        if s.generation == newest[(s.driver, s.pool)]:
            counts[s.driver] = counts.get(s.driver, 0) + s.devices
    return tuple(sorted((d, n) for d, n in counts.items() if n > 0))
