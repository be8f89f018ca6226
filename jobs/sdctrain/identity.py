"""Who a rank is: its node, Pod, GPU and software, read once at start-up.

In Kubernetes the node and Pod come from the downward API::

    env:
      - {name: NODE_NAME, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
      - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
      - {name: POD_NAMESPACE, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}
      - {name: JOB_NAME, valueFrom: {fieldRef:
            {fieldPath: "metadata.labels['batch.kubernetes.io/job-name']"}}}

The GPU UUID is read from the device (CUDA), else from ``SDCGUARD_GPU_UUID``, else
from the device plugin's ``NVIDIA_VISIBLE_DEVICES`` (the ``LOCAL_RANK``-th UUID).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from sdctrain import __version__

NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True)
class RankInfo:
    """One rank's identity and the facts its results depend on."""

    rank: int
    node: str | None = None
    pod: str | None = None
    namespace: str | None = None
    job: str | None = None
    gpu_uuid: str | None = None
    deterministic: bool = False
    fingerprint: Mapping[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        """``rank 3 (node gpu-7, GPU-1234...)`` for messages."""
        where = [w for w in (self.node and f"node {self.node}", self.gpu_uuid) if w]
        return f"rank {self.rank}" + (f" ({', '.join(where)})" if where else "")


def gpu_uuid(device: torch.device, env: Mapping[str, str]) -> str | None:
    """The accelerator's UUID where the runtime tells it, else ``SDCGUARD_GPU_UUID``, else
    the ``LOCAL_RANK``-th UUID in ``NVIDIA_VISIBLE_DEVICES``."""
    if device.type == "cuda":
        try:
            uuid = str(torch.cuda.get_device_properties(device).uuid)
        except (AttributeError, RuntimeError):
            uuid = ""
        if uuid:
            return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
    if env.get("SDCGUARD_GPU_UUID"):
        return env["SDCGUARD_GPU_UUID"]
    # The NVIDIA device plugin names the Pod's GPUs by UUID; this rank's is LOCAL_RANK's.
    visible = [v for v in env.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if v.startswith("GPU-")]
    local = env.get("LOCAL_RANK", "0")
    index = int(local) if local.isdigit() else 0
    return visible[index] if index < len(visible) else None


def deterministic(device: torch.device, env: Mapping[str, str]) -> bool:
    """Whether recomputing a micro-batch on this rank must give the same bits."""
    if not torch.are_deterministic_algorithms_enabled():
        return False
    if device.type == "cuda":
        # use_deterministic_algorithms(True) already makes cuDNN pick deterministic
        # algorithms (the older cudnn.deterministic flag stays False and is not needed);
        # benchmark mode would still let the algorithm differ between ranks and runs.
        if torch.backends.cudnn.benchmark:
            return False
        if env.get("CUBLAS_WORKSPACE_CONFIG") not in (":4096:8", ":16:8"):
            return False
    return True


def fingerprint(device: torch.device) -> dict[str, str]:
    """Software and device facts that must match across ranks before judging."""
    fp = {
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda or ""),
        "cudnn": "",
        "python": platform.python_version(),
        "sdctrain": __version__,
        "threads": "",
        "tf32": "",
        "device": device.type,
    }
    if device.type == "cuda":
        fp["cudnn"] = str(torch.backends.cudnn.version() or "")  # type: ignore[no-untyped-call]
        fp["device"] = torch.cuda.get_device_name(device)
        fp["tf32"] = (
            f"matmul={torch.backends.cuda.matmul.allow_tf32},"
            f"cudnn={torch.backends.cudnn.allow_tf32}"
        )
    else:
        # CPU kernels may split work by thread count, and with it the rounding.
        fp["threads"] = str(torch.get_num_threads())
        fp["device"] = f"cpu-{torch.backends.cpu.get_cpu_capability()}"
    return fp


def local_info(rank: int, device: torch.device, env: Mapping[str, str] | None = None) -> RankInfo:
    """This rank's :class:`RankInfo` from the environment and the device."""
    env = os.environ if env is None else env
    namespace = env.get("POD_NAMESPACE")
    if not namespace and NAMESPACE_FILE.is_file():
        namespace = NAMESPACE_FILE.read_text().strip() or None
    return RankInfo(
        rank=rank,
        node=env.get("NODE_NAME") or None,
        pod=env.get("POD_NAME") or env.get("HOSTNAME") or None,
        namespace=namespace,
        job=env.get("JOB_NAME") or None,
        gpu_uuid=gpu_uuid(device, env),
        deterministic=deterministic(device, env),
        fingerprint=fingerprint(device),
    )
