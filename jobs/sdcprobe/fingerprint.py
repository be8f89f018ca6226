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


def device_id(backend: Backend) -> str | None:
    """This device's UUID or serial, when the runtime names it: on CUDA the GPU UUID as
    nvidia-smi writes it (``GPU-...``); otherwise the entry for this device in
    ``NVIDIA_VISIBLE_DEVICES`` (the NVIDIA device plugin lists the allocated GPUs' UUIDs
    there), if it holds UUIDs rather than indexes."""
    if backend.name == "cuda":
        with contextlib.suppress(Exception):  # a build or driver without the field
            uuid = str(torch.cuda.get_device_properties(backend.index).uuid)
            if uuid:
                return _ascii(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}", 96)
    visible = [v.strip() for v in os.environ.get("NVIDIA_VISIBLE_DEVICES", "").split(",")]
    if 0 <= backend.index < len(visible) and visible[backend.index].startswith(("GPU-", "MIG-")):
        return _ascii(visible[backend.index], 96)
    return None


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
        device_id=device_id(backend),
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
