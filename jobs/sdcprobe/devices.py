"""Which backend and how many devices, decided without starting a device runtime.

This module imports no torch at load time: the parent process that launches
the device workers stays light (and never initialises CUDA before forking).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

BackendName = Literal["cpu", "cuda", "xla"]

#: Environment every worker needs before the device runtime starts. The parent
#: sets it before spawning workers (they inherit it) and workers set it again.
DETERMINISM_ENV: dict[str, str] = {
    # cuBLAS picks reduction strategies by workspace size; fix it (needs to be set
    # before the first cuBLAS handle is created).
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    # Neuron rounds stochastically by default: no two runs would agree bitwise.
    "NEURON_RT_STOCHASTIC_ROUNDING_EN": "0",
    # Never let the Neuron compiler downcast fp32 matmuls to bf16 behind our back.
    "NEURON_CC_FLAGS": "--auto-cast=none",
}


def apply_determinism_env(env: dict[str, str] | None = None) -> None:
    """Put :data:`DETERMINISM_ENV` into ``env`` (default ``os.environ``).

    Values already set explicitly are kept.
    """
    target: dict[str, str] | os._Environ[str] = os.environ if env is None else env
    for key, value in DETERMINISM_ENV.items():
        target.setdefault(key, value)
    flags = target.get("XLA_FLAGS", "")
    if "--xla_gpu_deterministic_ops" not in flags:
        target["XLA_FLAGS"] = (flags + " --xla_gpu_deterministic_ops=true").strip()


def xla_on_host() -> bool:
    """Whether torch-xla runs on PJRT CPU (tests and CI) rather than TPU/Neuron/GPU."""
    return os.environ.get("PJRT_DEVICE", "").upper() == "CPU"


def ensure_pjrt_device() -> str:
    """Set ``PJRT_DEVICE`` for torch-xla when the environment does not: Neuron or
    TPU device files pick that runtime, otherwise PJRT runs on the CPU."""
    current = os.environ.get("PJRT_DEVICE", "").strip()
    if current:
        return current.upper()
    if Path("/dev/neuron0").exists():
        chosen = "NEURON"
    elif Path("/dev/accel0").exists() or Path("/dev/vfio/0").exists():
        chosen = "TPU"
    else:
        chosen = "CPU"
    os.environ["PJRT_DEVICE"] = chosen
    return chosen


def resolve_backend(requested: str) -> BackendName:
    """Turn ``auto`` into the backend this node has: an explicit ``PJRT_DEVICE``
    other than CPU means XLA; NVIDIA device files mean CUDA; Neuron or TPU device
    files mean XLA; otherwise the CPU."""
    explicit: dict[str, BackendName] = {"cpu": "cpu", "cuda": "cuda", "xla": "xla"}
    if requested in explicit:
        return explicit[requested]
    if requested != "auto":
        raise ValueError(f"unknown device {requested!r}: use auto, cpu, cuda or xla")
    pjrt = os.environ.get("PJRT_DEVICE", "").upper()
    if pjrt and pjrt != "CPU":
        return "xla"
    if Path("/dev/nvidiactl").exists() or Path("/dev/nvidia0").exists():
        return "cuda"
    if (
        Path("/dev/neuron0").exists()
        or Path("/dev/accel0").exists()
        or Path("/dev/vfio/0").exists()
    ):
        return "xla"
    return "cpu"


def local_device_count(name: BackendName, cpu_devices: int) -> int | None:
    """How many device workers to start; None when torch-xla's launcher decides
    (TPU and Neuron: one process per chip, with the environment it sets up)."""
    if name == "cpu":
        return cpu_devices
    if name == "cuda":
        import torch  # NVML-based count: does not initialise CUDA in this process

        return torch.cuda.device_count()
    if xla_on_host():
        return cpu_devices
    return None


def mig_instances(env: dict[str, str] | os._Environ[str] | None = None) -> list[str]:
    """The MIG instances this container was given (``MIG-…`` UUIDs in
    ``NVIDIA_VISIBLE_DEVICES`` or ``CUDA_VISIBLE_DEVICES``, as the NVIDIA device plugin
    and DRA driver set them); empty when it was given whole GPUs."""
    source = os.environ if env is None else env
    for key in ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        entries = [e.strip() for e in source.get(key, "").split(",") if e.strip()]
        migs = [e for e in entries if e.startswith("MIG-")]
        if migs:
            return migs
    return []


def mig_refusal(checks: list[str], instances: list[str], mig_enabled_gpus: list[int]) -> str | None:
    """Why a screening cannot run as asked on MIG, or None when it can.

    Each MIG instance is screened on its own (one worker per instance, which sees only
    that instance). NCCL does not run collectives between MIG instances, so the
    collective check is refused rather than faked; and a GPU in MIG mode whose
    instances were not given to the Pod cannot be screened at all."""
    if mig_enabled_gpus and not instances:
        gpus = ", ".join(str(i) for i in mig_enabled_gpus)
        return (
            f"MIG is enabled on GPU {gpus} but no MIG instance was given to this Pod: "
            "request the node's MIG devices (for example nvidia.com/mig-1g.10gb) or "
            "disable MIG mode to screen whole GPUs"
        )
    if instances and "collective" in checks:
        return (
            f"MIG: this Pod was given {len(instances)} MIG instance(s); NCCL cannot run "
            "collectives between MIG instances, so the collective check cannot screen "
            "them: run compute, memory and golden on MIG nodes "
            "(--checks compute,memory,golden)"
        )
    return None


def mig_enabled_gpus() -> list[int]:
    """Indices of the GPUs NVML reports in MIG mode; empty without NVML (nvidia-ml-py)
    or without MIG."""
    try:
        import pynvml

        pynvml.nvmlInit()
        found = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            try:
                current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
            except Exception:  # a GPU without MIG support
                continue
            if current:
                found.append(i)
        return found
    except Exception:  # no NVML, no driver: nothing to tell
        return []
