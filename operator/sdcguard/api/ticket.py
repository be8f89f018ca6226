"""RepairTicket: one quarantine incident, from quarantine to return or retirement."""

from __future__ import annotations

import datetime as dt
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, StringConstraints

from sdcguard.api.common import (
    API_VERSION,
    CONDITIONS_LIST,
    SET_LIST,
    ApiModel,
    ApiVersion,
    Condition,
    NodeName,
    ObjectMeta,
    Url,
    cel,
    cel_rules,
)
from sdcguard.api.hardware import HardwareFailure, IdentityKind, UntrustedId
from sdcguard.api.workloads import MAX_WORKLOADS, Workload

Id = Annotated[str, StringConstraints(max_length=253)]

MAX_HISTORY_RECORDS = 8
"""SDCHardware records one ticket event tells the sinks about (the rest are counted)."""
MAX_LAST_FAILURES = 4
"""Failures of each record one ticket event tells (the newest)."""
MAX_LAST_NODES = 4
"""Node names of each record one ticket event tells (the most recently seen)."""


class Resolution(StrEnum):
    """The repair side's answer. Repaired, Replaced and FalseAlarm lead to verification;
    Retire takes the node out for good."""

    REPAIRED = "Repaired"
    REPLACED = "Replaced"
    FALSE_ALARM = "FalseAlarm"
    RETIRE = "Retire"


class TicketPhase(StrEnum):
    """Open -> Acknowledged -> InRepair -> Verifying -> Closed, or Retired."""

    OPEN = "Open"
    ACKNOWLEDGED = "Acknowledged"
    IN_REPAIR = "InRepair"
    VERIFYING = "Verifying"
    CLOSED = "Closed"
    RETIRED = "Retired"


class HardwareIdentity(ApiModel):
    """What identifies the hardware across Node re-creations (repeat offenders)."""

    provider_id: Id | None = Field(default=None, alias="providerID")
    """The Node's spec.providerID (cloud instance)."""
    machine_id: Id | None = Field(default=None, alias="machineID")
    """status.nodeInfo.machineID."""
    system_uuid: Id | None = Field(default=None, alias="systemUUID")
    """status.nodeInfo.systemUUID."""
    device_ids: list[Id] = Field(
        default_factory=list, alias="deviceIDs", max_length=64, json_schema_extra=SET_LIST
    )
    """Accelerator UUIDs or serial numbers, when known."""
    untrusted: list[UntrustedId] = Field(default_factory=list, max_length=8)
    """Identifiers not used to recognise the hardware (empty, a placeholder, or shared
    with another Node), and why: the history is never merged across Nodes on them."""
    records: list[Id] = Field(default_factory=list, max_length=8, json_schema_extra=SET_LIST)
    """The SDCHardware records that count this incident (``kubectl sdc hardware``)."""
    cycles_before: int = Field(default=0, ge=0)
    """Repair cycles the hardware had used within the policy's window before this ticket
    (a confirmed failure begins the next one; a person's quarantine begins none)."""


class ExternalRef(ApiModel):
    """The ticket in an external repair system."""

    system: Annotated[str, StringConstraints(min_length=1, max_length=63)]
    """The system, e.g. jira, servicenow, a vendor RMA portal."""
    id: Id
    """The ticket's id there."""
    url: Url | None = None
    """Link to it: an http or https URL."""


class Finding(ApiModel):
    """One failed check of one SDCTest behind the ticket, located as far as the probe could."""

    model_config = ConfigDict(frozen=True)

    test: Id
    """The SDCTest."""
    check: Annotated[str, StringConstraints(max_length=64)]
    """The check that found wrong answers (compute, collective, golden, memory)."""
    odd_device: int | None = Field(default=None, ge=0)
    """The device index that disagreed with the others, if one could be named."""
    first_divergent_step: int | None = Field(default=None, ge=0)
    """golden: the first training step whose values differ."""
    first_divergent_submodule: Annotated[str, StringConstraints(max_length=256)] | None = None
    """golden: the first submodule whose outputs differ at that step."""


class BlastRadius(ApiModel):
    """Which workloads used the node between its last passing screening and the failing
    one: their results and checkpoints from that window may be corrupt."""

    window_start: dt.datetime | None = None
    """The node's last passing screening (absent: it never passed one while the record
    was kept, so the window starts with its first recorded workload)."""
    window_end: dt.datetime
    """The failing screening (when the node was quarantined)."""
    workloads: list[Workload] = Field(default_factory=list, max_length=MAX_WORKLOADS)
    """The workloads, oldest first."""
    dropped: int = Field(default=0, ge=0)
    """Workloads of the window left out of the node's bounded record (the oldest)."""
    advice: Annotated[str, StringConstraints(max_length=512)] = ""
    """What the owners of these workloads should do."""


class QuarantinedDevice(ApiModel):
    """One device taken out of service by a DeviceTaintRule (quarantine scope Device)."""

    model_config = ConfigDict(frozen=True)

    index: int | None = Field(default=None, ge=0)
    """The probe's device index that failed."""
    uuid: Id | None = None
    """The device's uuid attribute in its ResourceSlice: its hardware identity."""
    driver: Id
    """The DRA driver that publishes it (e.g. gpu.nvidia.com)."""
    pool: Id
    """Its ResourceSlice pool (NVIDIA's driver: one per node)."""
    device: Id
    """Its device name in the pool (e.g. gpu-3)."""
    rule: Id
    """The DeviceTaintRule sdcguard wrote for it."""


class QuarantineRecord(ApiModel):
    """What the quarantine took out of service, and why that scope."""

    scope: Literal["Node", "Device"] = "Node"
    """Device: only the devices below are tainted and the node keeps serving with the
    others. Node: the node is tainted (and cordoned) as a whole."""
    reason: Annotated[str, StringConstraints(max_length=64)] = ""
    """Why this scope: DeviceTainted, or why not: PolicyScopeNode, FailureNotPinned,
    TooManyDevices, NoResourceSlices, DeviceNotPublished, DeviceTaintsNotServed."""
    message: Annotated[str, StringConstraints(max_length=1024)] = ""
    """The same, for a person."""
    devices: list[QuarantinedDevice] = Field(default_factory=list, max_length=64)
    """Scope Device: the tainted devices."""


class RepairTicketSpec(ApiModel):
    """The incident: which node, why (evidence), and the repair side's answer."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                "!has(oldSelf.resolution) || oldSelf.resolution != 'Retire' "
                "|| (has(self.resolution) && self.resolution == 'Retire')",
                "spec.resolution: Retire is final; open a new ticket if the node comes back",
            ),
        )
    )

    node_name: NodeName = Field(
        json_schema_extra=cel_rules(cel("self == oldSelf", "spec.nodeName is immutable"))
    )
    """The quarantined node."""
    policy_ref: NodeName | None = None
    """The SDCPolicy that quarantined it."""
    hardware: HardwareIdentity = Field(default_factory=HardwareIdentity)
    """Hardware identity, for repeat-offender history."""
    evidence: list[Id] = Field(default_factory=list, max_length=64, json_schema_extra=SET_LIST)
    """SDCTest names that led to (and followed) the quarantine, and the training jobs'
    SDCReports that made the node suspect (as ``SDCReport namespace/name``)."""
    findings: list[Finding] = Field(default_factory=list, max_length=64)
    """What the failed checks of those tests located: the odd device, the first divergent
    step and submodule, per test and check."""
    external: ExternalRef | None = None
    """The ticket in an external system; setting it acknowledges the ticket."""
    resolution: Resolution | None = None
    """Set by the repair side when done: Repaired, Replaced, FalseAlarm or Retire."""
    resolution_note: Annotated[str, StringConstraints(max_length=4096)] | None = None
    """What was done, for the history."""
    blast_radius: BlastRadius | None = None
    """The workloads that used the node since its last passing screening, told to their
    owners by a Warning Event in their namespace."""
    quarantine: QuarantineRecord | None = None
    """What was taken out of service (the node, or some of its devices) and why."""


class HistoryEntry(ApiModel):
    """One step of the ticket's life."""

    time: dt.datetime
    """When."""
    phase: TicketPhase
    """The phase entered."""
    message: Annotated[str, StringConstraints(max_length=1024)] = ""
    """What happened."""


class HardwareRecordSummary(ApiModel):
    """One SDCHardware record as a ticket event told it: the identifier, its counts and
    its newest failures, as of the event."""

    name: Id
    """The SDCHardware record."""
    kind: IdentityKind
    """ProviderID, SystemUUID, MachineID or Device."""
    id: Id
    """The identifier (a providerID, system UUID, machine ID or device UUID)."""
    total_failures: int = Field(default=0, ge=0)
    """Confirmed failures recorded for the hardware up to the event, ever."""
    failures_in_window: int = Field(default=0, ge=0)
    """Those within the policy's repairCycleWindow (what repair cycles are counted from)."""
    last_failures: list[HardwareFailure] = Field(default_factory=list, max_length=MAX_LAST_FAILURES)
    """The newest failures up to the event (at most 4), oldest first."""
    nodes: list[NodeName] = Field(default_factory=list, max_length=MAX_LAST_NODES)
    """Node names the hardware was seen under by the event (the 4 newest), in the order
    it came under them."""
    retired: dt.datetime | None = None
    """When the hardware was retired, if it was by the event."""


class HardwareHistory(ApiModel):
    """The hardware history a ticket event carried to the sinks."""

    cycles_before: int = Field(default=0, ge=0)
    """Repair cycles the hardware had used within the window before this ticket."""
    repair_cycle_window: Annotated[str, StringConstraints(max_length=32)] = ""
    """The policy's repairCycleWindow at the event ("0": forever)."""
    max_repair_cycles: int = Field(default=0, ge=0)
    """The policy's maxRepairCycles at the event."""
    records: list[HardwareRecordSummary] = Field(
        default_factory=list, max_length=MAX_HISTORY_RECORDS
    )
    """The ticket's SDCHardware records (host identifiers first, then its devices'), at
    most 8."""
    records_dropped: int = Field(default=0, ge=0)
    """Records of the ticket's hardware left out of ``records``."""


class Notification(ApiModel):
    """Delivery of the ticket to the configured sinks."""

    delivered: bool = False
    """All sinks accepted it."""
    attempts: int = Field(default=0, ge=0)
    """Delivery attempts so far."""
    last_error: Annotated[str, StringConstraints(max_length=1024)] | None = None
    """The last failure, if any."""
    idempotency_key: Annotated[str, StringConstraints(max_length=128)] | None = None
    """Sent with every attempt so a sink creates the external ticket once."""
    last_attempt: dt.datetime | None = None
    """When delivery was last tried."""
    next_attempt: dt.datetime | None = None
    """Not retried before then (the back-off, or a sink's Retry-After)."""
    permanent: bool = False
    """A sink refused the request itself (a 4xx, a misconfigured sink or Secret): retried
    only hourly, in case its configuration was fixed; see the NotificationFailed condition."""
    hardware_history: HardwareHistory | None = None
    """The hardware history the current event carries (``idempotencyKey``), kept from its
    first attempt so every attempt of one event sends the same bytes."""
    external: ExternalRef | None = None
    """The external ticket the current event names, as known at its first attempt (a
    reference a sink writes back later is told with the next event), so every attempt
    of one event sends the same bytes to every sink."""


class RepairTicketStatus(ApiModel):
    """Where the incident is."""

    phase: TicketPhase = TicketPhase.OPEN
    """Open, Acknowledged, InRepair, Verifying, Closed or Retired."""
    cycle: int = Field(default=1, ge=1)
    """Repair attempt; raised each time a repair fails verification."""
    history: list[HistoryEntry] = Field(default_factory=list, max_length=256)
    """Every phase change."""
    opened_at: dt.datetime | None = None
    """When the node was quarantined."""
    closed_at: dt.datetime | None = None
    """When the ticket closed or the node retired."""
    conditions: list[Condition] = Field(
        default_factory=list, max_length=16, json_schema_extra=CONDITIONS_LIST
    )
    """Notified, Verified."""
    notification: Notification = Field(default_factory=Notification)
    """Delivery to ticket sinks."""


class RepairTicket(ApiModel):
    """RepairTicket: one quarantine of one node, handed to a repair workflow."""

    api_version: ApiVersion = API_VERSION
    kind: Literal["RepairTicket"] = "RepairTicket"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: RepairTicketSpec
    status: RepairTicketStatus | None = None


def check_ticket_update(old: RepairTicketSpec, new: RepairTicketSpec) -> None:
    """Python twin of the RepairTicket transition rules; raises ValueError."""
    if old.node_name != new.node_name:
        raise ValueError("spec.nodeName is immutable")
    if old.resolution == Resolution.RETIRE and new.resolution != Resolution.RETIRE:
        raise ValueError(
            "spec.resolution: Retire is final; open a new ticket if the node comes back"
        )
