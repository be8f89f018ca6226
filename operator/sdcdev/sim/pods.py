"""Pods as the simulated kubelet sees them, and the statuses it writes (pure).

:class:`PodView` reads the few fields a kubelet needs from a Pod's JSON.
:func:`running_status` and :func:`terminated_status` build the status a real
kubelet would report, as JSON-merge-patch bodies.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sdcdev.sim.commands import RUN_COMMAND_ANNOTATION
from sdcdev.sim.probe_command import mentions_probe

#: Kubernetes keeps at most this many bytes of a termination message.
TERMINATION_MESSAGE_LIMIT = 4096
#: FallbackToLogsOnError keeps at most this much of the log tail.
LOG_FALLBACK_LIMIT = 2048

PodKind = Literal["probe", "workload", "command"]


class _Doc(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)


class FieldRef(_Doc):
    field_path: str = Field(alias="fieldPath")


class EnvSource(_Doc):
    field_ref: FieldRef | None = Field(default=None, alias="fieldRef")


class EnvVar(_Doc):
    name: str
    value: str | None = None
    value_from: EnvSource | None = Field(default=None, alias="valueFrom")


class Resources(_Doc):
    limits: dict[str, str] = Field(default_factory=dict)
    requests: dict[str, str] = Field(default_factory=dict)


class VolumeMount(_Doc):
    name: str
    mount_path: str = Field(alias="mountPath")


class SecretSource(_Doc):
    secret_name: str = Field(alias="secretName")


class Volume(_Doc):
    name: str
    secret: SecretSource | None = None


class Container(_Doc):
    name: str
    image: str = ""
    command: list[str] = Field(default_factory=list)
    args: list[str] = Field(default_factory=list)
    env: list[EnvVar] = Field(default_factory=list)
    resources: Resources = Field(default_factory=Resources)
    termination_message_policy: str = Field(default="File", alias="terminationMessagePolicy")
    volume_mounts: list[VolumeMount] = Field(default_factory=list, alias="volumeMounts")

    @property
    def runs_probe(self) -> bool:
        return mentions_probe(self.command, self.args)


class Metadata(_Doc):
    name: str
    namespace: str = "default"
    uid: str
    resource_version: str = Field(default="", alias="resourceVersion")
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    deletion_timestamp: str | None = Field(default=None, alias="deletionTimestamp")


class Spec(_Doc):
    node_name: str | None = Field(default=None, alias="nodeName")
    containers: list[Container] = Field(default_factory=list)
    volumes: list[Volume] = Field(default_factory=list)
    init_containers: list[Container] = Field(default_factory=list, alias="initContainers")
    resource_claims: list[PodClaim] = Field(default_factory=list, alias="resourceClaims")
    active_deadline_seconds: int | None = Field(default=None, alias="activeDeadlineSeconds")
    termination_grace_period_seconds: int | None = Field(
        default=None, alias="terminationGracePeriodSeconds"
    )
    service_account_name: str | None = Field(default=None, alias="serviceAccountName")
    automount_service_account_token: bool | None = Field(
        default=None, alias="automountServiceAccountToken"
    )


class ClaimStatus(_Doc):
    """A Pod's claim made from a template, by the name the control plane gave it."""

    name: str
    resource_claim_name: str | None = Field(default=None, alias="resourceClaimName")


class PodClaim(_Doc):
    """``spec.resourceClaims[]``: a claim by name, or one made from a template."""

    name: str
    resource_claim_name: str | None = Field(default=None, alias="resourceClaimName")


class Status(_Doc):
    phase: str | None = None
    resource_claim_statuses: list[ClaimStatus] = Field(
        default_factory=list, alias="resourceClaimStatuses"
    )
    start_time: str | None = Field(default=None, alias="startTime")
    pod_ip: str | None = Field(default=None, alias="podIP")
    host_ip: str | None = Field(default=None, alias="hostIP")


class PodView(_Doc):
    """The parts of a Pod the simulated kubelet reads."""

    metadata: Metadata
    spec: Spec = Field(default_factory=Spec)
    status: Status = Field(default_factory=Status)

    @property
    def key(self) -> str:
        return f"{self.metadata.namespace}/{self.metadata.name}"

    @property
    def terminal(self) -> bool:
        return self.status.phase in ("Succeeded", "Failed")

    @property
    def deleting(self) -> bool:
        return self.metadata.deletion_timestamp is not None

    def claim_names(self) -> list[str]:
        """The ResourceClaims the Pod uses, by object name (a template's claim once the
        control plane has made it and named it in the status)."""
        made = {c.name: c.resource_claim_name for c in self.status.resource_claim_statuses}
        names = [c.resource_claim_name or made.get(c.name) for c in self.spec.resource_claims]
        return [n for n in names if n]

    def probe_container(self) -> Container | None:
        for c in self.spec.containers:
            if c.runs_probe:
                return c
        return None

    @property
    def kind(self) -> PodKind:
        if self.probe_container() is not None:
            return "probe"
        if self.metadata.annotations.get(RUN_COMMAND_ANNOTATION) == "true":
            return "command"
        return "workload"


def secret_mounts(pod: PodView, container: Container) -> list[tuple[str, str]]:
    """(Secret name, mount path) of each Secret volume the container mounts."""
    secrets = {v.name: v.secret.secret_name for v in pod.spec.volumes if v.secret is not None}
    return [(secrets[m.name], m.mount_path) for m in container.volume_mounts if m.name in secrets]


def parse_pod(obj: Mapping[str, Any]) -> PodView:
    return PodView.model_validate(obj)


_FIELD_LABEL = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")
_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def field_value(pod: PodView, path: str, host_ip: str) -> str | None:
    """A downward-API ``fieldRef`` value, None for fields the simulator does not know."""
    simple = {
        "metadata.name": pod.metadata.name,
        "metadata.namespace": pod.metadata.namespace,
        "metadata.uid": pod.metadata.uid,
        "spec.nodeName": pod.spec.node_name or "",
        "spec.serviceAccountName": pod.spec.service_account_name or "default",
        "status.hostIP": host_ip,
        "status.hostIPs": host_ip,
        "status.podIP": pod_ip_for(pod, host_ip),
    }
    if path in simple:
        return simple[path]
    m = _FIELD_LABEL.match(path)
    if m:
        source = pod.metadata.labels if m[1] == "labels" else pod.metadata.annotations
        return source.get(m[2], "")
    return None


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: known names replaced, ``$$`` escapes a ``$``."""

    def sub(m: re.Match[str]) -> str:
        if m[0] == "$$":
            return "$"
        return env.get(m[1], m[0])

    return _REF.sub(sub, text)


def container_env(pod: PodView, container: Container, host_ip: str) -> dict[str, str]:
    """The container's environment: plain values and downward-API field refs, expanded."""
    env: dict[str, str] = {}
    for var in container.env:
        if var.value is not None:
            env[var.name] = expand(var.value, env)
        elif var.value_from is not None and var.value_from.field_ref is not None:
            value = field_value(pod, var.value_from.field_ref.field_path, host_ip)
            if value is not None:
                env[var.name] = value
        else:
            env.setdefault(var.name, "")
    return env


def pod_ip_for(pod: PodView, host_ip: str) -> str:
    """A stable fake pod IP on the node's subnet."""
    h = sum(pod.metadata.uid.encode()) % 250 + 2
    prefix = host_ip.rsplit(".", 1)[0]
    return f"{prefix}.{h}" if prefix else f"10.244.0.{h}"


def _ts(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _conditions(ready: bool, now: datetime, reason: str | None) -> list[dict[str, Any]]:
    ready_s = "True" if ready else "False"
    cond = [
        ("PodReadyToStartContainers", "True", None),
        ("Initialized", "True", None),
        ("Ready", ready_s, reason),
        ("ContainersReady", ready_s, reason),
        ("PodScheduled", "True", None),
    ]
    out = []
    for ctype, status, why in cond:
        c: dict[str, Any] = {"type": ctype, "status": status, "lastTransitionTime": _ts(now)}
        if why:
            c["reason"] = why
        out.append(c)
    return out


def _container_id(pod: PodView, container: str) -> str:
    return f"sim://{pod.metadata.uid[:8]}-{container}"


def running_status(pod: PodView, *, host_ip: str, started: datetime) -> dict[str, Any]:
    """Status of a pod whose containers all started at ``started``."""
    pod_ip = pod_ip_for(pod, host_ip)
    statuses = [
        {
            "name": c.name,
            "image": c.image,
            "imageID": "",
            "containerID": _container_id(pod, c.name),
            "ready": True,
            "started": True,
            "restartCount": 0,
            "state": {"running": {"startedAt": _ts(started)}},
        }
        for c in pod.spec.containers
    ]
    return {
        "status": {
            "phase": "Running",
            "conditions": _conditions(True, started, None),
            "hostIP": host_ip,
            "hostIPs": [{"ip": host_ip}],
            "podIP": pod_ip,
            "podIPs": [{"ip": pod_ip}],
            "startTime": _ts(started),
            "initContainerStatuses": _init_statuses(pod, started),
            "containerStatuses": statuses,
        }
    }


def _init_statuses(pod: PodView, started: datetime) -> list[dict[str, Any]]:
    return [
        {
            "name": c.name,
            "image": c.image,
            "imageID": "",
            "containerID": _container_id(pod, c.name),
            "ready": True,
            "restartCount": 0,
            "state": {
                "terminated": {
                    "exitCode": 0,
                    "reason": "Completed",
                    "startedAt": _ts(started),
                    "finishedAt": _ts(started),
                }
            },
        }
        for c in pod.spec.init_containers
    ]


def terminated_status(
    pod: PodView,
    *,
    host_ip: str,
    started: datetime,
    finished: datetime,
    exit_code: int,
    message: str = "",
    reason: str | None = None,
    pod_reason: str | None = None,
    pod_message: str | None = None,
    main_container: str | None = None,
) -> dict[str, Any]:
    """Status of a finished pod: Succeeded on exit 0, else Failed.

    ``main_container`` gets ``exit_code`` and the termination ``message``;
    other containers (sidecars) are reported as having exited 0 with it.
    """
    main = main_container or (pod.spec.containers[0].name if pod.spec.containers else "")
    phase = "Succeeded" if exit_code == 0 and pod_reason is None else "Failed"
    statuses = []
    for c in pod.spec.containers:
        code = exit_code if c.name == main else 0
        term: dict[str, Any] = {
            "exitCode": code,
            "reason": reason
            if (reason and c.name == main)
            else ("Completed" if code == 0 else "Error"),
            "startedAt": _ts(started),
            "finishedAt": _ts(finished),
            "containerID": _container_id(pod, c.name),
        }
        if c.name == main and message:
            term["message"] = message
        statuses.append(
            {
                "name": c.name,
                "image": c.image,
                "imageID": "",
                "containerID": _container_id(pod, c.name),
                "ready": False,
                "started": False,
                "restartCount": 0,
                "state": {"terminated": term},
            }
        )
    pod_ip = pod_ip_for(pod, host_ip)
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": _conditions(False, finished, "PodCompleted"),
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": _ts(started),
        "initContainerStatuses": _init_statuses(pod, started),
        "containerStatuses": statuses,
    }
    status["reason"] = pod_reason
    status["message"] = pod_message
    return {"status": status}


def termination_message(
    result_file_text: bytes, log_tail: bytes, exit_code: int, policy: str
) -> str:
    """What Kubernetes would keep as the termination message.

    The result file's content (at most 4096 bytes); with
    ``FallbackToLogsOnError`` and a failed, empty file, the log's tail.
    """
    data = result_file_text[:TERMINATION_MESSAGE_LIMIT]
    if not data.strip() and exit_code != 0 and policy == "FallbackToLogsOnError":
        data = log_tail[-LOG_FALLBACK_LIMIT:]
    return data.decode("utf-8", errors="replace")
