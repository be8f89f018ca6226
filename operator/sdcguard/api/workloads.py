"""WorkloadRecord: which workloads used a node's accelerators since its last passing
screening (the blast radius, should the next screening fail).

One object per node, named like the node, written by the operator only when what it
records changed (see ``adapters/workload_record.py``). Every list is bounded, so the
largest record stays far below the API server's object size limit (about 1.5 MB):
``MAX_WORKLOADS`` entries of at most ``MAX_ENTRY_BYTES`` each.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from sdcguard.api.common import API_VERSION, ApiModel, ApiVersion, NodeName, ObjectMeta

MAX_WORKLOADS = 64
"""Workloads kept per node (merged by top owner first; then the oldest ended are dropped)."""
MAX_POD_NAMES = 8
"""Pod names kept per workload (the newest); ``podCount`` counts them all."""
MAX_RUNNING = 16
"""Running Pod names kept per workload (a node has few accelerator Pods at once)."""

Name = Annotated[str, StringConstraints(max_length=253)]
Short = Annotated[str, StringConstraints(max_length=63)]
Note = Annotated[str, StringConstraints(max_length=256)]


class Workload(ApiModel):
    """One workload (its top owner) that used the node's accelerators."""

    namespace: Short
    """The namespace of its Pods."""
    kind: Short
    """The kind at the top of the Pods' ownerReferences (Job, JobSet, PyTorchJob, RayJob,
    LeaderWorkerSet, StatefulSet, ...), or Pod for a Pod without an owner."""
    name: Name
    """That object's name."""
    api_version: Annotated[str, StringConstraints(max_length=128)] = Field(
        default="v1", alias="apiVersion"
    )
    """Its apiVersion, e.g. batch/v1."""
    uid: Short | None = None
    """Its uid, when known."""
    note: Note | None = None
    """Why the top owner may not be the real top: an owner that was deleted, an
    ownerReference cycle, an owner the operator may not read, a chain too deep."""
    pods: list[Name] = Field(default_factory=list, max_length=MAX_POD_NAMES)
    """The newest of its Pods seen on the node."""
    pod_count: int = Field(default=0, ge=0)
    """Its Pods seen on the node, all of them."""
    running: list[Name] = Field(default_factory=list, max_length=MAX_RUNNING)
    """Its Pods that use the node's accelerators now (empty: it has left the node)."""
    accelerators: int = Field(default=0, ge=0)
    """The most accelerators one of its Pods requested on the node."""
    first_seen: dt.datetime
    """When its first Pod was seen using the node."""
    last_seen: dt.datetime | None = None
    """When its last Pod stopped using the node; absent while it still uses it."""


class WorkloadRecordSpec(ApiModel):
    """The node the record is about."""

    node_name: NodeName
    """The Node (the record has the same name)."""


class WorkloadRecordStatus(ApiModel):
    """What used the node since its last passing screening."""

    since: dt.datetime | None = None
    """The node's last passing screening: workloads that ended before it are forgotten.
    Absent: the node has not passed one since the record began."""
    idle_since: dt.datetime | None = None
    """When the last workload stopped using the node (absent while one uses it, or if
    none has): a restarted operator counts the node's idle time from here."""
    workloads: list[Workload] = Field(default_factory=list, max_length=MAX_WORKLOADS)
    """The workloads, oldest first."""
    dropped: int = Field(default=0, ge=0)
    """Workloads left out to keep the record bounded (the oldest that had ended)."""
    dropped_until: dt.datetime | None = None
    """The latest time a dropped workload used the node."""


class WorkloadRecord(ApiModel):
    """WorkloadRecord: which workloads used a node's accelerators since its last pass."""

    api_version: ApiVersion = API_VERSION
    kind: Literal["WorkloadRecord"] = "WorkloadRecord"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: WorkloadRecordSpec
    status: WorkloadRecordStatus | None = None
