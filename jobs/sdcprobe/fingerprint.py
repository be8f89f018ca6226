"""The hardware+software fingerprint: everything a healthy device's bits depend on.

:func:`device_facts` runs inside a device worker (it needs torch and the device);
:func:`sdcprobe.judge.build_fingerprint` combines those facts with the device
count and the check configuration's hash into the fingerprint.
Every value is read, never measured, so it is stable across runs.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import re
from pathlib import Path

import torch

from sdcprobe.backends import Backend
from sdcprobe.devices import xla_on_host
from sdcprobe.trace import DeviceFacts


def _ascii(text: str, limit: int = 128) -> str:
    """Fingerprint fields are printable ASCII of bounded length."""
    return re.sub(r"[^\x20-\x7e]", "?", " ".join(text.split()))[:limit]


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    """The CPU's model name (MKL/oneDNN kernels, hence bits, depend on it)."""
    info = _read("/proc/cpuinfo") or ""
    for line in info.splitlines():
        if line.startswith("model name") or line.startswith("Model"):
            return _ascii(line.split(":", 1)[1])
    return _ascii(platform.processor() or platform.machine())


def cpu_isa() -> str:
    """Architecture and the SIMD level torch dispatches to, e.g. ``x86_64-AVX512``."""
    return _ascii(f"{platform.machine()}-{torch.backends.cpu.get_cpu_capability()}")


def _nvidia_driver() -> str | None:
    text = _read("/proc/driver/nvidia/version")
    if text:
        match = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?([0-9][0-9.]+)", text)
        if match:
            return match.group(1)
    return None


#: Set by the NVIDIA container toolkit (device plugin or DRA driver): the GPUs this
#: container may use, by UUID, in the order the container sees them.
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
_UUID_PREFIXES = ("GPU-", "MIG-")


def visible_device_uuids(value: str | None) -> list[str]:
    """The UUIDs in an ``NVIDIA_VISIBLE_DEVICES`` value; empty when it lists indices,
    ``all``, ``none`` or ``void`` (no identity to read from it)."""
    entries = [e.strip() for e in (value or "").split(",") if e.strip()]
    if not entries or not all(e.startswith(_UUID_PREFIXES) for e in entries):
        return []
    return [_ascii(e, 64) for e in entries]


def device_uuid(backend: Backend, visible: str | None = None) -> str | None:
    """The identity of this worker's device: what a DRA driver publishes as its ``uuid``.

    On CUDA it is read from the device itself (CUDA's device order need not be the
    order of ``NVIDIA_VISIBLE_DEVICES``). Elsewhere device ``i`` is entry ``i`` of
    ``NVIDIA_VISIBLE_DEVICES`` when that lists UUIDs (the CPU backend of a simulated
    GPU node); otherwise None.
    """
    if backend.name == "cuda":
        props = torch.cuda.get_device_properties(backend.index)
        raw = getattr(props, "uuid", None)
        if raw is not None:
            text = str(raw)
            return _ascii(text if text.startswith(_UUID_PREFIXES) else f"GPU-{text}", 64)
    uuids = visible_device_uuids(
        visible if visible is not None else os.environ.get(VISIBLE_DEVICES_ENV)
    )
    return uuids[backend.index] if 0 <= backend.index < len(uuids) else None


def device_facts(backend: Backend) -> DeviceFacts:
    """Facts about this worker's device and software stack."""
    driver: str | None = None
    runtime: str | None = None
    if backend.name == "cpu":
        model = f"cpu: {cpu_model()}"
    elif backend.name == "cuda":
        props = torch.cuda.get_device_properties(backend.index)
        model = f"{props.name} sm_{props.major}{props.minor}"
        driver = _nvidia_driver()
        cudnn = torch.backends.cudnn.version()  # type: ignore[no-untyped-call]
        parts = [f"cuda-{torch.version.cuda}", f"cudnn-{cudnn}"]
        with contextlib.suppress(Exception):  # NCCL missing from a build
            nccl = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
            parts.append("nccl-" + ".".join(str(v) for v in nccl))
        runtime = " ".join(parts)
    else:
        model, driver, runtime = _xla_facts(backend)
    return DeviceFacts(
        backend=backend.name,
        device_model=_ascii(model),
        driver=_ascii(driver) if driver else None,
        runtime=_ascii(runtime) if runtime else None,
        torch=torch.__version__,
        torch_xla=_version("torch-xla") or _version("torch_xla"),
        cpu_isa=cpu_isa(),
        threads=backend.threads,
        device_id=device_uuid(backend),
    )


def _xla_facts(backend: Backend) -> tuple[str, str | None, str | None]:
    import torch_xla.core.xla_model as xm

    hw = str(xm.xla_device_hw(backend.device))
    if xla_on_host():
        # XLA:CPU compiles for the host CPU: its model matters like on the cpu backend.
        return f"XLA:CPU {cpu_model()}", None, "pjrt-cpu"
    if hw == "TPU":
        accel = None
        with contextlib.suppress(Exception):
            from torch_xla._internal import tpu

            accel = tpu.get_tpu_type() if hasattr(tpu, "get_tpu_type") else f"v{tpu.version()}"
        libtpu = _version("libtpu") or _version("libtpu-nightly")
        return f"TPU {accel or 'unknown'}", None, f"pjrt-tpu libtpu-{libtpu}"
    if hw == "NEURON":
        driver = _read("/sys/module/neuron/version")
        versions = [f"{d}-{v}" for d in ("libneuronxla", "neuronx-cc") if (v := _version(d))]
        instance = _read("/sys/devices/virtual/dmi/id/product_name") or "unknown"
        return f"NEURON {instance}", driver, " ".join(versions) or None
    return f"XLA:{hw}", None, None
