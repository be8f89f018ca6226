"""The resources: names, scopes, printer columns, and body conversion."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sdcguard.api.baseline import SDCBaseline, SDCBaselineSpec, SDCBaselineStatus
from sdcguard.api.common import GROUP, SERVED_API_VERSIONS, ApiModel
from sdcguard.api.hardware import SDCHardware, SDCHardwareSpec, SDCHardwareStatus
from sdcguard.api.policy import SDCPolicy, SDCPolicySpec, SDCPolicyStatus
from sdcguard.api.report import SDCReport, SDCReportSpec, SDCReportStatus
from sdcguard.api.sdctest import SDCTest, SDCTestSpec, SDCTestStatus
from sdcguard.api.ticket import RepairTicket, RepairTicketSpec, RepairTicketStatus
from sdcguard.api.workloads import WorkloadRecord, WorkloadRecordSpec, WorkloadRecordStatus

CATEGORY = "sdcguard"


@dataclass(frozen=True)
class PrinterColumn:
    """One ``kubectl get`` column."""

    name: str
    json_path: str
    type: str = "string"
    description: str = ""
    priority: int = 0


AGE = PrinterColumn("Age", ".metadata.creationTimestamp", "date")


@dataclass(frozen=True)
class Resource:
    """A custom resource kind and everything its CRD needs."""

    kind: str
    plural: str
    short_names: tuple[str, ...]
    model: type[ApiModel]
    spec: type[ApiModel]
    status: type[ApiModel]
    columns: tuple[PrinterColumn, ...]
    scope: str = "Cluster"
    selectable: tuple[str, ...] = ()
    """JSON paths the API server can select on (the CRD's ``selectableFields``,
    Kubernetes 1.31+): ``kubectl get sdctests --field-selector spec.nodeName=X`` and
    the plugin's lists of one node's history or the screenings in progress are
    filtered by the API server, so they do not grow with the fleet's history."""

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{GROUP}"


POLICY = Resource(
    kind="SDCPolicy",
    plural="sdcpolicies",
    short_names=("sdcp",),
    model=SDCPolicy,
    spec=SDCPolicySpec,
    status=SDCPolicyStatus,
    columns=(
        PrinterColumn("Mode", ".spec.mode", description="Observe or Enforce"),
        PrinterColumn("Paused", ".spec.paused", "boolean", priority=1),
        PrinterColumn("Breaker", ".status.breaker.state", description="Circuit breaker"),
        PrinterColumn("Nodes", ".status.counts.total", "integer", "Nodes the policy covers"),
        PrinterColumn("Qualified", ".status.counts.qualified", "integer"),
        PrinterColumn("Quarantined", ".status.counts.quarantined", "integer"),
        PrinterColumn("Testing", ".status.counts.testing", "integer", priority=1),
        PrinterColumn("Retired", ".status.counts.retired", "integer", priority=1),
        AGE,
    ),
)
TEST = Resource(
    kind="SDCTest",
    plural="sdctests",
    short_names=("sdct",),
    model=SDCTest,
    spec=SDCTestSpec,
    status=SDCTestStatus,
    columns=(
        PrinterColumn("Node", ".spec.nodeName"),
        PrinterColumn("Suite", ".status.suite"),
        PrinterColumn("Reason", ".spec.reason"),
        PrinterColumn("Attempt", ".spec.attempt", "integer", priority=1),
        PrinterColumn("Phase", ".status.phase"),
        PrinterColumn("Verdict", ".status.verdict"),
        PrinterColumn("Why", ".status.reason", priority=1),
        PrinterColumn("Budget", ".status.budgetSeconds", "integer", "Seconds planned"),
        # A string, not a date: kubectl shows a future date as "<invalid>".
        PrinterColumn("Ends", ".status.expectedEnd", description="Expected end (UTC)"),
        PrinterColumn("Catch", ".status.catchTargetMet", "boolean", "Catch target met", priority=1),
        AGE,
    ),
    selectable=(".spec.nodeName", ".status.phase"),
)
TICKET = Resource(
    kind="RepairTicket",
    plural="repairtickets",
    short_names=("rt",),
    model=RepairTicket,
    spec=RepairTicketSpec,
    status=RepairTicketStatus,
    columns=(
        PrinterColumn("Node", ".spec.nodeName"),
        PrinterColumn("Phase", ".status.phase"),
        PrinterColumn("Cycle", ".status.cycle", "integer"),
        PrinterColumn("Resolution", ".spec.resolution"),
        PrinterColumn("External", ".spec.external.id"),
        AGE,
    ),
    selectable=(".spec.nodeName", ".status.phase"),
)
BASELINE = Resource(
    kind="SDCBaseline",
    plural="sdcbaselines",
    short_names=("sdcb",),
    model=SDCBaseline,
    spec=SDCBaselineSpec,
    status=SDCBaselineStatus,
    columns=(
        PrinterColumn("Fingerprint", ".spec.fingerprint.shortHash"),
        PrinterColumn("Device", ".spec.fingerprint.deviceModel", priority=1),
        PrinterColumn("Source", ".spec.source"),
        PrinterColumn("Trusted", ".spec.trusted", "boolean"),
        PrinterColumn("Nodes", ".status.agreeingNodes", description="Agreeing nodes"),
        AGE,
    ),
)
REPORT = Resource(
    kind="SDCReport",
    plural="sdcreports",
    short_names=("sdcr",),
    model=SDCReport,
    spec=SDCReportSpec,
    status=SDCReportStatus,
    columns=(
        PrinterColumn("Node", ".spec.nodeName"),
        PrinterColumn("Method", ".spec.method"),
        PrinterColumn("Confirmation", ".spec.confirmation"),
        PrinterColumn("Step", ".spec.step", "integer", priority=1),
        PrinterColumn("Job", ".spec.jobName", priority=1),
        PrinterColumn("Phase", ".status.phase"),
        PrinterColumn("Reason", ".status.reason"),
        PrinterColumn("Outcome", ".status.outcome"),
        AGE,
    ),
    scope="Namespaced",
    selectable=(".spec.nodeName",),
)
HARDWARE = Resource(
    kind="SDCHardware",
    plural="sdchardwares",
    short_names=("sdchw",),
    model=SDCHardware,
    spec=SDCHardwareSpec,
    status=SDCHardwareStatus,
    columns=(
        PrinterColumn("Kind", ".spec.kind"),
        PrinterColumn("ID", ".spec.id"),
        PrinterColumn("Failures", ".status.totalFailures", "integer"),
        PrinterColumn("Node", ".status.lastNode", description="Last seen under"),
        PrinterColumn("Retired", ".status.retired.time", priority=1),
        AGE,
    ),
)
WORKLOADS = Resource(
    kind="WorkloadRecord",
    plural="workloadrecords",
    short_names=("sdcw",),
    model=WorkloadRecord,
    spec=WorkloadRecordSpec,
    status=WorkloadRecordStatus,
    columns=(
        PrinterColumn("Node", ".spec.nodeName"),
        PrinterColumn("Since", ".status.since", description="The last passing screening"),
        PrinterColumn("Idle", ".status.idleSince", description="When the last workload left"),
        PrinterColumn("Dropped", ".status.dropped", "integer", priority=1),
        AGE,
    ),
)
RESOURCES: tuple[Resource, ...] = (
    POLICY,
    TEST,
    TICKET,
    BASELINE,
    REPORT,
    HARDWARE,
    WORKLOADS,
)
_BY_KIND = {r.kind: r for r in RESOURCES}

Body = SDCPolicy | SDCTest | RepairTicket | SDCBaseline | SDCReport | SDCHardware | WorkloadRecord


def to_body(model: ApiModel) -> dict[str, Any]:
    """The camelCase dict the API server expects; unset optional fields are left out."""
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


def to_patch(model: ApiModel, *fields: str) -> dict[str, Any]:
    """A merge patch that sets these fields (Python names) of ``model`` and no others,
    camelCase as :func:`to_body` writes them; a field that is None is sent as null, which
    removes it from the object."""
    unknown = [f for f in fields if f not in type(model).model_fields]
    if unknown:
        raise ValueError(f"{type(model).__name__} has no fields {unknown}")
    patch = model.model_dump(mode="json", by_alias=True, exclude_none=True, include=set(fields))
    for name in fields:
        if getattr(model, name) is None:
            info = type(model).model_fields[name]
            patch[info.alias or name] = None
    return patch


def from_body(body: Mapping[str, Any]) -> Body:
    """Parse an object read from the API server into its model, by ``kind``.

    Raises ValueError for another apiVersion or kind, and pydantic's ValidationError
    (naming the field) for a malformed object.
    """
    if body.get("apiVersion") not in SERVED_API_VERSIONS:
        raise ValueError(
            f"expected apiVersion {' or '.join(SERVED_API_VERSIONS)}, "
            f"got {body.get('apiVersion')!r}"
        )
    resource = _BY_KIND.get(str(body.get("kind")))
    if resource is None:
        raise ValueError(
            f"unknown kind {body.get('kind')!r}; expected one of {', '.join(sorted(_BY_KIND))}"
        )
    parsed = resource.model.model_validate(body)
    assert isinstance(
        parsed,
        SDCPolicy | SDCTest | RepairTicket | SDCBaseline | SDCReport | SDCHardware | WorkloadRecord,
    )
    return parsed
