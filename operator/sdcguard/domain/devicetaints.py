"""Per-device quarantine with DRA device taints: which scope a confirmed failure gets,
and which DeviceTaintRules sdcguard must create, change or delete.

Pure: the adapters read ResourceSlices and DeviceTaintRules into the values below.

Scope (``choose_scope``), one row per reason, first match wins:

=============================  =======  =============================================
condition                      scope    reason
=============================  =======  =============================================
policy scope is Node           Node     PolicyScopeNode
API serves no DeviceTaintRule  Node     DeviceTaintsNotServed
a failed check names no device Node     FailureNotPinned (a collective over all
                               (or no   devices, a host-side check, a manual
                               finding) quarantine)
node has no ResourceSlice      Node     NoResourceSlices (device-plugin cluster)
a named device matches no      Node     DeviceNotPublished (matched by the UUID
  single published device               the probe reported, else gpu-<index>)
more than maxDeviceFraction    Node     TooManyDevices
  of the node's devices
otherwise                      Device   DeviceTainted: one rule per named device
=============================  =======  =============================================

Tickets: one RepairTicket per device (``device_ticket_tails`` names them after the
incident's name), each repaired and verified on its own. A verification re-tests the
whole node, every device included, and ``judge_devices`` reads it per device ticket:

=========================================  ==========================================
the verification                           the tickets under verification
=========================================  ==========================================
passed                                     all pass: their devices return
failed on devices it names                 those tickets fail again (cycle + 1, their
                                           rules stay); the others pass and return
failed on a device of a ticket not under   not held against the tickets under it
verification (not yet repaired)            (that device is still out of service)
failed, not pinned to a device, or on a    all fail again: the failure cannot be
device that is not quarantined at all      told apart from theirs
=========================================  ==========================================

Tickets not under verification (not yet resolved) are left as they are.

Rules (``plan_rules``): a rule is named from the node and the device's UUID (its
hardware identity), so two failures naming the same device want the same rule and a
renamed device (a driver restart) keeps its rule, whose selector is then corrected.
Only rules carrying sdcguard's ownership label are ever changed or deleted; a rule
someone else wrote for the same device is left as it is, and one that holds the name
sdcguard wants is reported, never overwritten.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from sdcguard.api import Finding, QuarantineScope, Resolution, TicketPhase, Verdict
from sdcguard.api.policy import Quarantine
from sdcguard.domain import keys

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "sdcguard"
NODE_LABEL = keys.LABEL_NODE
TICKET_ANNOTATION = keys.PREFIX + "ticket"
REASON_ANNOTATION = keys.PREFIX + "reason"
UUID_ANNOTATION = keys.PREFIX + "device-uuid"
TAINT_KEY = keys.PREFIX + "sdc"
"""The device taint's key (a qualified name, like the node taints)."""


class ScopeReason(StrEnum):
    """Why a quarantine got its scope (the ticket's ``spec.quarantine.reason``)."""

    DEVICE_TAINTED = "DeviceTainted"
    POLICY_SCOPE_NODE = "PolicyScopeNode"
    NOT_SERVED = "DeviceTaintsNotServed"
    NOT_PINNED = "FailureNotPinned"
    NO_SLICES = "NoResourceSlices"
    NOT_PUBLISHED = "DeviceNotPublished"
    TOO_MANY = "TooManyDevices"


@dataclass(frozen=True)
class SliceDevice:
    """One device of a ResourceSlice on a node."""

    driver: str
    pool: str
    name: str
    uuid: str = ""

    @property
    def key(self) -> str:
        """The device's identity: its UUID, else driver/pool/name."""
        return self.uuid or f"{self.driver}/{self.pool}/{self.name}"


@dataclass(frozen=True)
class NodeDevices:
    """What the DRA API says about one node's devices.

    ``served``: the API server serves DeviceTaintRules at all (some version of
    resource.k8s.io has them). ``devices``: the devices of the ResourceSlices whose
    ``spec.nodeName`` is the node."""

    served: bool
    devices: tuple[SliceDevice, ...] = ()

    def by_index(self, index: int, index_uuids: tuple[str, ...] = ()) -> SliceDevice | None:
        """The device a probe index names: by the GPU UUID the probe reported for that
        index when it reported any (``index_uuids``), else by NVIDIA's DRA naming
        ``gpu-<index>`` (which assumes the probe sees the GPUs in minor order)."""
        if index_uuids:
            uuid = index_uuids[index] if index < len(index_uuids) else ""
            return self.by_uuid(uuid) if uuid else None
        wanted = f"gpu-{index}"
        found = [d for d in self.devices if d.name == wanted]
        return found[0] if len(found) == 1 else None

    def by_uuid(self, uuid: str) -> SliceDevice | None:
        """The one device with this uuid attribute (compared without case), else None."""
        found = [d for d in self.devices if uuid and d.uuid.lower() == uuid.lower()]
        return found[0] if len(found) == 1 else None


@dataclass(frozen=True)
class PickedDevice:
    """A failed device, resolved to its ResourceSlice entry."""

    index: int
    device: SliceDevice


@dataclass(frozen=True)
class ScopeChoice:
    """The scope a confirmed failure gets, the reason, and the devices to taint."""

    scope: QuarantineScope
    reason: ScopeReason
    message: str
    devices: tuple[PickedDevice, ...] = ()


def failed_indices(findings: Iterable[Finding]) -> tuple[tuple[int, ...], bool]:
    """The device indices the failed checks name, sorted, and whether every finding
    named one (False: some failure is not pinned to a device)."""
    found = list(findings)
    indices = sorted({f.odd_device for f in found if f.odd_device is not None})
    pinned = bool(found) and all(f.odd_device is not None for f in found)
    return tuple(indices), pinned


def choose_scope(
    quarantine: Quarantine,
    findings: Iterable[Finding],
    devices: NodeDevices | None,
    index_uuids: tuple[str, ...] = (),
) -> ScopeChoice:
    """The quarantine's scope (the table in the module docstring). ``devices`` None:
    the node's ResourceSlices were not read (or could not be)."""
    node = QuarantineScope.NODE
    if quarantine.scope == QuarantineScope.NODE:
        return ScopeChoice(node, ScopeReason.POLICY_SCOPE_NODE, "the policy's scope is Node")
    if devices is None:
        return ScopeChoice(
            node,
            ScopeReason.NO_SLICES,
            "the node's ResourceSlices could not be read; the whole node is quarantined",
        )
    if not devices.served:
        return ScopeChoice(
            node,
            ScopeReason.NOT_SERVED,
            "the API server serves no DeviceTaintRule (resource.k8s.io); the whole node is "
            "quarantined",
        )
    indices, pinned = failed_indices(findings)
    if not pinned:
        return ScopeChoice(
            node,
            ScopeReason.NOT_PINNED,
            "the failure is not pinned to a device (a check failed on all devices, on the "
            "host, or the quarantine was asked by hand); the whole node is quarantined",
        )
    if not devices.devices:
        return ScopeChoice(
            node,
            ScopeReason.NO_SLICES,
            "the node's accelerators are not published in any ResourceSlice (no DRA "
            "driver on it); the whole node is quarantined",
        )
    picked: list[PickedDevice] = []
    for index in indices:
        device = devices.by_index(index, index_uuids)
        if device is None:
            names = ", ".join(sorted(d.name for d in devices.devices)[:16])
            uuid = index_uuids[index] if index < len(index_uuids) else ""
            which = (
                f"UUID {uuid}" if uuid else "no UUID reported" if index_uuids else f"gpu-{index}"
            )
            return ScopeChoice(
                node,
                ScopeReason.NOT_PUBLISHED,
                f"device {index} ({which}) matches no single device of the node's "
                f"ResourceSlices (they publish: {names}); the whole node is quarantined",
            )
        picked.append(PickedDevice(index, device))
    share = len(picked) / len(devices.devices)
    if share > quarantine.max_device_fraction:
        return ScopeChoice(
            node,
            ScopeReason.TOO_MANY,
            f"{len(picked)} of the node's {len(devices.devices)} devices failed, more than "
            f"maxDeviceFraction {quarantine.max_device_fraction:g}; the whole node is "
            "quarantined",
        )
    names = ", ".join(p.device.name for p in picked)
    return ScopeChoice(
        QuarantineScope.DEVICE,
        ScopeReason.DEVICE_TAINTED,
        f"device taints on {names}; the node serves with its other devices",
        tuple(picked),
    )


@dataclass(frozen=True)
class TicketMember:
    """One RepairTicket of a quarantine of scope Device: one per failed device (older
    tickets may list several devices), each repaired, verified and closed on its own."""

    name: str
    devices: tuple[SliceDevice, ...] = ()
    phase: TicketPhase = TicketPhase.OPEN
    resolution: Resolution | None = None
    cycle: int = 1
    acknowledged: bool = False

    @property
    def resolved(self) -> bool:
        """The repair side answered Repaired, Replaced or FalseAlarm: verification is due."""
        return self.resolution is not None and self.resolution != Resolution.RETIRE


@dataclass(frozen=True)
class DeviceVerdicts:
    """A verification read per device ticket: names of the tickets that passed, failed
    again, and were not under verification (they wait for their repair)."""

    passed: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()
    message: str = ""


def under_verification(members: Iterable[TicketMember]) -> tuple[TicketMember, ...]:
    """The tickets a verification answers for: those in phase Verifying (moved there when
    it started), else (a status not back yet) those resolved."""
    found = tuple(members)
    verifying = tuple(m for m in found if m.phase == TicketPhase.VERIFYING)
    return verifying or tuple(m for m in found if m.resolved)


def judge_devices(
    members: Iterable[TicketMember],
    findings: Iterable[Finding],
    device_ids: tuple[str, ...],
    verdict: Verdict,
) -> DeviceVerdicts:
    """The outcome of a verification per device ticket (the table in the module
    docstring). ``device_ids``: the verification probe's UUID per device index (a probe
    that reports none has index i taken as device ``gpu-<i>``)."""
    found = tuple(members)
    under = under_verification(found)
    waiting = tuple(m.name for m in found if m not in under)
    names = tuple(m.name for m in under)

    def say(passed: tuple[str, ...], failed: tuple[str, ...], why: str = "") -> DeviceVerdicts:
        by_name = {m.name: m for m in found}

        def shown(tickets: tuple[str, ...]) -> str:
            return ", ".join(
                "+".join(d.name for d in by_name[t].devices) + f" ({t})" for t in tickets
            )

        parts = [
            f"{label}: {shown(t)}"
            for label, t in (
                ("returned", passed),
                ("failed again", failed),
                ("awaiting repair", waiting),
            )
            if t
        ]
        text = "; ".join(([why] if why else []) + parts)
        return DeviceVerdicts(passed, failed, waiting, text)

    if verdict == Verdict.PASS:
        return say(names, ())
    indices, pinned = failed_indices(findings)
    if not pinned:
        return say((), names, "the failure is not pinned to a device")

    def matches(member: TicketMember, index: int) -> bool:
        if device_ids:
            uuid = device_ids[index].lower() if index < len(device_ids) else ""
            return bool(uuid) and any(d.uuid.lower() == uuid for d in member.devices)
        return any(d.name == f"gpu-{index}" for d in member.devices)

    failed: list[str] = []
    for index in indices:
        owners = [m for m in found if matches(m, index)]
        if not owners:
            return say((), names, f"device {index} failed and is not quarantined")
        failed += [m.name for m in owners if m in under]
    again = tuple(n for n in names if n in failed)
    return say(tuple(n for n in names if n not in failed), again)


def device_ticket_tails(devices: Iterable[SliceDevice]) -> tuple[str, ...]:
    """The end of each device ticket's name (after the incident's ``<node>-<uid>-<seq>``):
    the device's name as a DNS label (``gpu-3``), made unique by its position when two
    devices share a name (two drivers)."""
    tails: list[str] = []
    for i, device in enumerate(devices):
        tail = _NOT_NAME.sub("-", device.name.lower()).strip("-")[:40].strip("-") or "device"
        tails.append(f"{tail}-{i}" if tail in tails else tail)
    return tuple(tails)


_NOT_NAME = re.compile(r"[^a-z0-9-]+")


def rule_name(node: str, device_key: str) -> str:
    """The DeviceTaintRule's name: deterministic from the node and the device's identity
    (a valid DNS subdomain of at most 253 characters)."""
    ident = _NOT_NAME.sub("-", device_key.lower()).strip("-")[:40].strip("-")
    digest = hashlib.sha256(f"{node}\x00{device_key}".encode()).hexdigest()[:8]
    suffix = f"-{ident}-{digest}" if ident else f"-{digest}"
    head = f"sdcguard-{node}"[: 253 - len(suffix)].rstrip("-.")
    return head + suffix


@dataclass(frozen=True)
class WantedRule:
    """A DeviceTaintRule sdcguard wants: its name, the device it selects, the taint."""

    name: str
    node: str
    device: SliceDevice
    ticket: str
    reason: str
    effect: str


@dataclass(frozen=True)
class SeenRule:
    """A DeviceTaintRule the API server has (any author)."""

    name: str
    driver: str
    pool: str
    device: str
    effect: str
    owned: bool
    """It carries sdcguard's managed-by label."""
    node: str = ""
    ticket: str = ""
    uuid: str = ""


@dataclass(frozen=True)
class RulePlan:
    """What to write to make the cluster's rules match what sdcguard wants."""

    create: tuple[WantedRule, ...] = ()
    update: tuple[WantedRule, ...] = ()
    """Rules of ours whose device moved (renamed, new pool) or whose effect changed."""
    delete: tuple[str, ...] = ()
    """Rules of ours that nothing wants any more."""
    conflicts: tuple[str, ...] = ()
    """Rules that hold a name we want but are not ours: left alone, reported."""
    foreign: tuple[str, ...] = ()
    """Rules someone else wrote that select a device we taint: left alone."""

    @property
    def empty(self) -> bool:
        return not (self.create or self.update or self.delete)


def wanted_rules(
    node: str,
    ticket: str,
    reason: str,
    effect: str,
    devices: Iterable[SliceDevice],
    published: NodeDevices | None = None,
) -> tuple[WantedRule, ...]:
    """One rule per device (repeats collapse). With ``published``, a device is looked up
    again by UUID, so a renamed device (a driver restart) is selected by its new name;
    a device that is no longer published keeps the selector it had."""
    out: dict[str, WantedRule] = {}
    for device in devices:
        now = published.by_uuid(device.uuid) if published is not None else None
        current = now or device
        name = rule_name(node, device.key)
        out.setdefault(name, WantedRule(name, node, current, ticket, reason, effect))
    return tuple(out.values())


def plan_rules(
    wanted: Iterable[WantedRule], seen: Iterable[SeenRule], node: str, *, prune: bool
) -> RulePlan:
    """The writes that make the node's rules what is wanted.

    ``prune``: delete this node's rules of ours that are not wanted (the quarantine
    ended). Rules without our label are never in the plan's writes."""
    wanted_by_name = {w.name: w for w in wanted}
    seen_list = list(seen)
    by_name = {s.name: s for s in seen_list}
    create: list[WantedRule] = []
    update: list[WantedRule] = []
    conflicts: list[str] = []
    for name, want in wanted_by_name.items():
        have = by_name.get(name)
        if have is None:
            create.append(want)
        elif not have.owned:
            conflicts.append(name)
        elif (have.driver, have.pool, have.device, have.effect) != (
            want.device.driver,
            want.device.pool,
            want.device.name,
            want.effect,
        ):
            update.append(want)
    delete = (
        [s.name for s in seen_list if s.owned and s.node == node and s.name not in wanted_by_name]
        if prune
        else []
    )
    selected = {(w.device.driver, w.device.pool, w.device.name) for w in wanted_by_name.values()}
    foreign = [
        s.name
        for s in seen_list
        if not s.owned and s.name not in wanted_by_name and (s.driver, s.pool, s.device) in selected
    ]
    return RulePlan(
        tuple(create), tuple(update), tuple(sorted(delete)), tuple(conflicts), tuple(foreign)
    )


@dataclass(frozen=True)
class RuleLabels:
    """The ownership marks of a rule (like the node taints' owned-taints record)."""

    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


def ownership(rule: WantedRule) -> RuleLabels:
    """Labels and annotations that mark ``rule`` as sdcguard's, with its ticket and why."""
    return RuleLabels(
        labels={MANAGED_BY_LABEL: MANAGED_BY, NODE_LABEL: rule.node[:63]},
        annotations={
            TICKET_ANNOTATION: rule.ticket,
            REASON_ANNOTATION: rule.reason[:1024],
            UUID_ANNOTATION: rule.device.uuid,
        },
    )
