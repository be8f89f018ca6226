"""SDCHardware: the failure history of one piece of hardware, across tickets and Node names."""

from __future__ import annotations

import datetime as dt
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from sdcguard.api.common import (
    API_VERSION,
    CONDITIONS_LIST,
    ApiModel,
    ApiVersion,
    Condition,
    NodeName,
    ObjectMeta,
)

Id = Annotated[str, StringConstraints(max_length=253)]
Text = Annotated[str, StringConstraints(max_length=256)]

MAX_FAILURES = 32
"""Failures a record keeps (the oldest go first)."""
MAX_NODES = 16
"""Node names a record keeps (the least recently seen go first)."""
MAX_UNTRUSTED = 8
"""Untrusted-ID notes a record keeps (those of the Node it was last seen under)."""


class IdentityKind(StrEnum):
    """Which identifier names the hardware."""

    PROVIDER_ID = "ProviderID"
    """The Node's spec.providerID: the cloud instance (or the bare-metal host the
    provisioner names)."""
    SYSTEM_UUID = "SystemUUID"
    """status.nodeInfo.systemUUID: the machine's SMBIOS UUID."""
    MACHINE_ID = "MachineID"
    """status.nodeInfo.machineID: the OS installation (/etc/machine-id)."""
    DEVICE = "Device"
    """An accelerator's UUID or serial number."""


class FailureKind(StrEnum):
    """What a failure was."""

    QUARANTINED = "Quarantined"
    """A confirmed failure quarantined the node (a repair cycle began)."""
    VERIFICATION_FAILED = "VerificationFailed"
    """A repair failed its verification (another repair cycle began)."""
    RETIRED = "Retired"
    """A confirmed failure found the hardware out of repair cycles: retired."""


class HardwareFailure(ApiModel):
    """One confirmed failure of the hardware."""

    time: dt.datetime
    """When."""
    kind: FailureKind
    """Quarantined, VerificationFailed or Retired."""
    node: NodeName
    """The Node the hardware was under."""
    ticket: Id = ""
    """The RepairTicket of the incident."""
    test: Id = ""
    """The SDCTest that failed."""


class SeenAs(ApiModel):
    """A Node name the hardware was seen under."""

    node: NodeName
    """The Node's name."""
    uid: Annotated[str, StringConstraints(max_length=64)] = ""
    """The Node's uid (a Node re-created under the same name gets a new one)."""
    first_seen: dt.datetime
    """When sdcguard first recorded it under this Node."""
    last_seen: dt.datetime
    """When sdcguard last recorded it under this Node."""


class UntrustedId(ApiModel):
    """An identifier of the Node that sdcguard did not use to recognise hardware, and why."""

    kind: IdentityKind
    """ProviderID, SystemUUID, MachineID or Device."""
    value: Id = ""
    """The value as the Node (or the probe) gave it ("" when empty)."""
    reason: Text
    """Why it is not trusted: empty, a well-known placeholder, or shared by other Nodes."""


class Retirement(ApiModel):
    """The hardware was retired."""

    time: dt.datetime
    """When."""
    node: NodeName
    """The Node it was retired under."""
    message: Annotated[str, StringConstraints(max_length=1024)] = ""
    """Why."""


class SDCHardwareSpec(ApiModel):
    """Which hardware this record is about."""

    kind: IdentityKind
    """The identifier's kind: ProviderID, SystemUUID, MachineID or Device."""
    id: Id = Field(min_length=1)
    """The identifier (the record's name is a hash of kind and id)."""


class SDCHardwareStatus(ApiModel):
    """The hardware's history, written by the operator."""

    failures: list[HardwareFailure] = Field(default_factory=list, max_length=MAX_FAILURES)
    """Confirmed failures, oldest first (at most 32; the oldest are dropped first)."""
    total_failures: int = Field(default=0, ge=0)
    """Every failure ever recorded, including those dropped from the list."""
    nodes: list[SeenAs] = Field(default_factory=list, max_length=MAX_NODES)
    """Node names the hardware was seen under (at most 16; the least recently seen are
    dropped first)."""
    last_node: NodeName | None = None
    """The Node it was last seen under."""
    retired: Retirement | None = None
    """Set once the hardware ran out of repair cycles (or a ticket retired it); a Node that
    comes back with it is retired at once. Delete the SDCHardware to forgive it."""
    untrusted: list[UntrustedId] = Field(default_factory=list, max_length=MAX_UNTRUSTED)
    """The Node's other identifiers that were not trusted, and why (as last seen)."""
    conditions: list[Condition] = Field(
        default_factory=list, max_length=4, json_schema_extra=CONDITIONS_LIST
    )
    """Retired: True once the hardware is retired (the reason says how)."""


class SDCHardware(ApiModel):
    """SDCHardware: the failure history of one host or accelerator, keyed by a hardware
    identifier, so repeat offenders are counted across tickets and Node names."""

    api_version: ApiVersion = API_VERSION
    kind: Literal["SDCHardware"] = "SDCHardware"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: SDCHardwareSpec
    status: SDCHardwareStatus | None = None
