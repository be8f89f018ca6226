"""SDCReport: a training job's report that a GPU on a node computed wrongly.

Namespaced: a job's own ServiceAccount creates it in the job's namespace (it needs
no right on Nodes). The operator checks it (did the named Pod run on that node?),
rate-limits it, and turns an accepted report into the node's Suspect state, so
the probe screens the node when it is next idle. A report alone never
quarantines a node: only a probe's confirmation does.
"""

from __future__ import annotations

import datetime as dt
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, StringConstraints

from sdcguard.api.common import (
    API_VERSION,
    CONDITIONS_LIST,
    ApiModel,
    ApiVersion,
    Condition,
    NodeName,
    ObjectMeta,
    cel,
    cel_rules,
)

#: Caps that keep every report a small object (the schema refuses anything larger).
MAX_EVIDENCE_ITEMS = 16
MAX_EVIDENCE_VALUE = 256
MAX_DETAIL = 1024

EvidenceKey = Annotated[
    str, StringConstraints(pattern=r"^[A-Za-z][A-Za-z0-9_.-]*$", min_length=1, max_length=63)
]


class ReportMethod(StrEnum):
    """How the job found it."""

    SHADOW_AUDIT = "ShadowAudit"
    REPLICA_CONSENSUS = "ReplicaConsensus"
    MEGATRON_RERUN = "MegatronRerun"


class ReportConfirmation(StrEnum):
    """What the job's own re-runs said: Transient (not reproduced on the same GPU),
    Persistent (reproduced there, other GPUs disagree) or Unconfirmed."""

    TRANSIENT = "Transient"
    PERSISTENT = "Persistent"
    UNCONFIRMED = "Unconfirmed"


class ReportPhase(StrEnum):
    """Accepted: the node was marked Suspect (or already was). Refused: see the reason."""

    ACCEPTED = "Accepted"
    REFUSED = "Refused"


class ReportOutcome(StrEnum):
    """What became of an accepted report: Confirmed (the probe confirmed it, the node is
    quarantined), Cleared (the node passed the re-test) or NotScreened."""

    CONFIRMED = "Confirmed"
    CLEARED = "Cleared"
    NOT_SCREENED = "NotScreened"


class EvidenceItem(ApiModel):
    """One named piece of evidence (digests, tensor names, ranks)."""

    name: EvidenceKey
    """What it is, e.g. tensors, auditor, digestOriginal."""
    value: Annotated[str, StringConstraints(max_length=MAX_EVIDENCE_VALUE)]
    """Its value, at most 256 characters."""


class ReportReporter(ApiModel):
    """Who files the report: the reporting Pod, as its bound ServiceAccount token names
    it. The chart's admission policy (admission.reports.requireBoundToken) admits a
    report only when these equal the token's claims, so a report cannot claim another
    workload's identity; part of the immutable spec."""

    pod_name: NodeName
    """The reporting Pod (the token's authentication.kubernetes.io/pod-name)."""
    pod_uid: Annotated[str, StringConstraints(max_length=36)] | None = Field(
        default=None, alias="podUID"
    )
    """Its uid (the token's pod-uid); required where the token carries one."""
    node_name: NodeName | None = None
    """The node it runs on (the token's node-name, Kubernetes 1.32+); required where
    the token carries one."""
    service_account: NodeName
    """The ServiceAccount of the token, in the report's namespace."""


class SDCReportSpec(ApiModel):
    """What the job saw, on which node and GPU. Immutable once created."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(cel("self == oldSelf", "spec is immutable"))
    )

    node_name: NodeName
    """The node whose GPU computed wrongly (the accused rank's spec.nodeName)."""
    pod_name: NodeName
    """The Pod of the accused rank, in this namespace; it must run on nodeName."""
    job_name: NodeName | None = None
    """The Job the Pod belongs to (its controlling ownerReference, not a label), if any."""
    gpu_uuid: Annotated[str, StringConstraints(max_length=128)] | None = Field(
        default=None, alias="gpuUUID"
    )
    """The accelerator's UUID, when the runtime tells it."""
    rank: int | None = Field(default=None, ge=0, le=1_000_000)
    """The accused rank in its data-parallel group."""
    step: int = Field(ge=0)
    """The training step of the detection."""
    method: ReportMethod
    """ShadowAudit, ReplicaConsensus or MegatronRerun."""
    confirmation: ReportConfirmation = ReportConfirmation.UNCONFIRMED
    """Transient, Persistent or Unconfirmed."""
    detail: Annotated[str, StringConstraints(max_length=MAX_DETAIL)] = ""
    """What happened, for people (at most 1024 characters)."""
    evidence: list[EvidenceItem] = Field(default_factory=list, max_length=MAX_EVIDENCE_ITEMS)
    """At most 16 named values."""
    observed_at: dt.datetime | None = None
    """When the job saw it."""
    reporter: ReportReporter | None = None
    """Who reports it: the reporting Pod's identity, checked at admission against its
    token (see ReportReporter). Reports by members of the chart's admin groups may omit it."""


class SDCReportStatus(ApiModel):
    """The operator's answer."""

    phase: ReportPhase | None = None
    """Accepted or Refused; empty until the operator has looked."""
    reason: Annotated[str, StringConstraints(max_length=64)] | None = None
    """One CamelCase word, e.g. Accepted, NodeMismatch, NotStarted, JobRateLimited,
    Throttled."""
    message: Annotated[str, StringConstraints(max_length=1024)] | None = None
    """Why, for people."""
    decided_at: dt.datetime | None = None
    """When the operator decided."""
    counted_against: Annotated[str, StringConstraints(max_length=320)] | None = None
    """The controller the report counted against in the caps (namespace, kind and uid
    of the accused Pod's controller, or the Pod's uid for a Pod without one)."""
    outcome: ReportOutcome | None = None
    """Once known: Confirmed, Cleared or NotScreened (an Event in this namespace says so)."""
    outcome_message: Annotated[str, StringConstraints(max_length=1024)] | None = None
    """What the outcome means for the node, for people."""
    concluded_at: dt.datetime | None = None
    """When the outcome became known."""
    conditions: list[Condition] = Field(
        default_factory=list, max_length=4, json_schema_extra=CONDITIONS_LIST
    )
    """Accepted: True with reason Accepted or AlreadySuspected, False with the refusal."""


class SDCReport(ApiModel):
    """SDCReport: a training job says a GPU on a node computed wrongly."""

    api_version: ApiVersion = API_VERSION
    kind: Literal["SDCReport"] = "SDCReport"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: SDCReportSpec
    status: SDCReportStatus | None = None
