"""Pods whose own command the simulated kubelet runs as a process (pure parts).

A Pod annotated ``sim.sdcguard.dev/run-command: "true"`` (a training Job's Pod,
say) is not a timer like other simulated workloads: the simulated kubelet runs
its first container's command and args on this machine, with what a kubelet
would give the container:

- the container's environment, downward-API values included (node, Pod name,
  namespace, labels such as ``batch.kubernetes.io/job-name``, and the Job
  controller's ``JOB_COMPLETION_INDEX``);
- the Pod's ServiceAccount token, requested for that Pod (bound to it, as the
  kubelet's projected token is), with the cluster's CA and the namespace. A
  process cannot see ``/var/run/secrets/kubernetes.io/serviceaccount``, so the
  files go into the Pod's directory, and ``SDCGUARD_TOKEN_FILE`` and
  ``SDCGUARD_CA_FILE`` (which sdctrain's reporter reads) name them, next to
  ``KUBERNETES_SERVICE_HOST`` and ``KUBERNETES_SERVICE_PORT``;
- the accelerators it requested, as the NVIDIA device plugin announces them:
  ``NVIDIA_VISIBLE_DEVICES`` lists GPU UUIDs, stable per node and index.

``python``/``python3`` in the command is this simulator's interpreter; the
process runs in its own session and is killed with the Pod.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

RUN_COMMAND_ANNOTATION = "sim.sdcguard.dev/run-command"
#: Variables of the simulator's own environment a Pod's process must not inherit.
SCRUBBED_ENV = ("KUBECONFIG", "SDCPROBE_FAULTS")
_PYTHONS = ("python", "python3")


def local_argv(command: Sequence[str], python: str) -> list[str]:
    """The Pod's command as this machine runs it: ``python`` is ``python`` given here."""
    if not command:
        raise ValueError("the container has no command: the simulator has no image to run")
    first = os.path.basename(command[0])
    if first in _PYTHONS or (first.startswith("python3.") and first[8:].isdigit()):
        return [python, *command[1:]]
    return list(command)


def gpu_uuids(node: str, count: int, start: int = 0) -> list[str]:
    """UUIDs of GPUs ``start .. start+count-1`` of ``node``, like ``nvidia-smi -L`` shows."""
    out = []
    for i in range(start, start + count):
        h = hashlib.sha256(f"gpu:{node}:{i}".encode()).hexdigest()
        out.append(f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}")
    return out


def service_env(server: str) -> dict[str, str]:
    """``KUBERNETES_SERVICE_HOST``/``PORT`` for an API server URL."""
    url = urlsplit(server)
    host = url.hostname or "127.0.0.1"
    port = url.port or (443 if url.scheme == "https" else 80)
    return {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": str(port)}


def command_env(
    base_env: Mapping[str, str], pod_env: Mapping[str, str], identity_env: Mapping[str, str]
) -> dict[str, str]:
    """The process's environment: the simulator's (scrubbed), the kubelet's, the Pod's."""
    env = {k: v for k, v in base_env.items() if k not in SCRUBBED_ENV}
    env.update(identity_env)
    env.update(pod_env)
    return env
