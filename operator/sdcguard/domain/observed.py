"""What the adapters observed about one node: plain, immutable facts for ``decide``."""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from sdcguard.api import (
    FULL_GPU_RESOURCE,
    CheckVerdict,
    Finding,
    RepairTicket,
    Resolution,
    ScreeningReason,
    SDCTest,
    SDCTestPhase,
    Suite,
    TicketPhase,
    Verdict,
    accelerator_resources,
    is_mig_resource,
    suite_of,
)
from sdcguard.domain import keys
from sdcguard.domain.budgets import PoolMember, PoolUsage
from sdcguard.domain.devicetaints import NodeDevices, SliceDevice, TicketMember
from sdcguard.domain.hardware import HardwareFacts
from sdcguard.domain.lifecycle import NodeState
from sdcguard.domain.quantity import whole_quantity
from sdcguard.domain.testphase import ended_by_policy_change


@dataclass(frozen=True)
class Taint:
    """A Node taint."""

    key: str
    effect: str
    value: str = ""


OUR_PREFIX = "sdcguard.dev/"
_STATES = {state.value: state for state in NodeState}
#: Karpenter's NodeClaim, the owner of each Node it launches (the instance).
NODECLAIM_API_VERSION, NODECLAIM_KIND = "karpenter.sh/v1", "NodeClaim"
KEPT_FOREIGN_ANNOTATIONS = (
    "cluster-autoscaler.kubernetes.io/scale-down-disabled",
    "karpenter.sh/do-not-disrupt",
)
"""Annotations of others that a snapshot keeps (sdcguard reads whether they are set)."""


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """A Node as the operator keeps it in memory: only the fields it reads, made once
    by the index handler (5,000 of these stay in memory, not 5,000 Node bodies)."""

    name: str
    uid: str = ""
    resource_version: str = ""
    created: dt.datetime | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    """sdcguard's own (``sdcguard.dev/...``) and the autoscalers' keep-me annotations."""
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    provider_id: str = ""
    ready: bool = False
    allocatable: Mapping[str, str] = field(default_factory=dict)
    system_uuid: str = ""
    machine_id: str = ""
    node_claim: str = ""
    """The Karpenter NodeClaim that owns the Node (its owner reference), if any."""
    condition: tuple[str, str] | None = None
    """sdcguard's Node condition (``keys.NODE_CONDITION``) as (status, reason), if set."""
    dra_devices: tuple[tuple[str, int], ...] = ()
    """(driver, devices) its ResourceSlices publish (``dra.device_counts``), filled in
    by the inventory from its copy of the slices; a Node body alone has none."""

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> NodeSnapshot:
        """The snapshot of a Node as the API returns it (a dict, e.g. a Kopf body)."""
        meta = body.get("metadata") or {}
        spec = body.get("spec") or {}
        status = body.get("status") or {}
        return cls(
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid") or ""),
            resource_version=str(meta.get("resourceVersion") or ""),
            created=keys.parse_time(meta.get("creationTimestamp")),
            labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
            annotations={
                str(k): str(v)
                for k, v in (meta.get("annotations") or {}).items()
                if str(k).startswith(OUR_PREFIX) or k in KEPT_FOREIGN_ANNOTATIONS
            },
            taints=tuple(
                Taint(str(t.get("key", "")), str(t.get("effect", "")), str(t.get("value") or ""))
                for t in spec.get("taints") or []
            ),
            unschedulable=bool(spec.get("unschedulable")),
            provider_id=str(spec.get("providerID") or ""),
            ready=any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in status.get("conditions") or []
            ),
            allocatable={str(k): str(v) for k, v in (status.get("allocatable") or {}).items()},
            system_uuid=str((status.get("nodeInfo") or {}).get("systemUUID") or ""),
            machine_id=str((status.get("nodeInfo") or {}).get("machineID") or ""),
            node_claim=next(
                (
                    str(ref.get("name") or "")
                    for ref in meta.get("ownerReferences") or []
                    if ref.get("apiVersion") == NODECLAIM_API_VERSION
                    and ref.get("kind") == NODECLAIM_KIND
                ),
                "",
            ),
            condition=next(
                (
                    (str(c.get("status") or ""), str(c.get("reason") or ""))
                    for c in status.get("conditions") or []
                    if c.get("type") == keys.NODE_CONDITION
                ),
                None,
            ),
        )


def dra_claims(
    published: Sequence[tuple[str, int]], classes: Sequence[tuple[str, str]]
) -> tuple[tuple[str, int], ...]:
    """For each (DeviceClass, driver) of ``classes`` whose driver publishes devices on
    the node (``published``: (driver, devices)), the class and that count. A driver
    named by two classes is counted once, under the first."""
    counts = dict(published)
    claims: list[tuple[str, int]] = []
    seen: set[str] = set()
    for device_class, driver in classes:
        if driver in seen or not counts.get(driver):
            continue
        seen.add(driver)
        claims.append((device_class, counts[driver]))
    return tuple(claims)


@dataclass(frozen=True)
class NodeFacts:
    """The parts of a Node that matter to the lifecycle."""

    name: str
    uid: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    ready: bool = True
    accelerators: int = 0
    """Allocatable devices of the policy's accelerator resources (each MIG instance
    counts as one, see spec.accelerators)."""
    mixed_mig: str = ""
    """What a node offers when it has whole GPUs and MIG instances at once (NVIDIA's
    mixed strategy with some GPUs unpartitioned), e.g. "nvidia.com/gpu: 4,
    nvidia.com/mig-1g.10gb: 14"; empty otherwise. Such a node is not screened."""
    pool: str = ""
    """Value of the policy's pool label ("" without one)."""
    created: dt.datetime | None = None
    """The Node's creationTimestamp."""
    condition: tuple[str, str] | None = None
    """sdcguard's Node condition as (status, reason), if the node carries it."""
    dra_claims: tuple[tuple[str, int], ...] = ()
    """A DRA-only node (spec.dra): (DeviceClass, devices its driver publishes here) for
    each class the probe claims in full; empty when the node advertises an accelerator
    resource, which the probe requests instead."""

    @classmethod
    def from_body(
        cls,
        body: Mapping[str, Any],
        accelerators: Sequence[str],
        pool_label: str | None = None,
        dra: Sequence[tuple[str, str]] = (),
        dra_devices: tuple[tuple[str, int], ...] = (),
    ) -> NodeFacts:
        """Facts from a Node as the API returns it (a dict, e.g. a Kopf body), with every
        annotation it has (the snapshot keeps only those the operator reads), and the
        devices its ResourceSlices publish (``dra_devices``, read apart from the body)."""
        annotations = dict((body.get("metadata") or {}).get("annotations") or {})
        snapshot = dataclasses.replace(NodeSnapshot.from_body(body), dra_devices=dra_devices)
        facts = cls.from_snapshot(snapshot, accelerators, pool_label, dra)
        return dataclasses.replace(facts, annotations=annotations)

    @classmethod
    def from_snapshot(
        cls,
        node: NodeSnapshot,
        accelerators: Sequence[str],
        pool_label: str | None = None,
        dra: Sequence[tuple[str, str]] = (),
    ) -> NodeFacts:
        """Facts from the snapshot the index keeps, for a policy's accelerators, pools
        and DRA device classes (``dra``: (DeviceClass, driver) pairs, spec.dra)."""
        allocatable = node.allocatable
        names = accelerator_resources(accelerators, allocatable)
        offered = {n: c for n in names if (c := whole_quantity(allocatable.get(n, 0))) > 0}
        migs = [n for n in offered if is_mig_resource(n)]
        mixed = bool(migs) and offered.get(FULL_GPU_RESOURCE, 0) > 0
        claims = () if offered else dra_claims(node.dra_devices, dra)
        return cls(
            name=node.name,
            uid=node.uid,
            labels=node.labels,
            annotations=node.annotations,
            taints=node.taints,
            unschedulable=node.unschedulable,
            ready=node.ready,
            accelerators=sum(offered.values()) or sum(n for _, n in claims),
            dra_claims=claims,
            mixed_mig=(
                ", ".join(f"{n}: {offered[n]}" for n in (FULL_GPU_RESOURCE, *migs)) if mixed else ""
            ),
            pool=node.labels.get(pool_label, "") if pool_label else "",
            created=node.created,
            condition=node.condition,
        )

    @property
    def state(self) -> NodeState | None:
        """The state label, or None for a node never seen (or a label someone mangled)."""
        # A dict, not NodeState(label): a full pass asks this about ten times per node.
        return _STATES.get(self.labels.get(keys.LABEL_STATE, ""))

    @property
    def state_label(self) -> str | None:
        """The state label as written (None: absent), even when it names no state."""
        return self.labels.get(keys.LABEL_STATE)

    @property
    def excluded(self) -> bool:
        return self.labels.get(keys.LABEL_EXCLUDE) == "true"

    @functools.cached_property
    def owned_taints(self) -> frozenset[str]:
        # Cached (the facts are frozen): a full pass asks it several times per node.
        return frozenset(keys.split_list(self.annotations.get(keys.OWNED_TAINTS)))

    @property
    def owned_annotations(self) -> frozenset[str]:
        return frozenset(keys.split_list(self.annotations.get(keys.OWNED_ANNOTATIONS)))

    @property
    def cordoned_by_us(self) -> bool:
        return self.annotations.get(keys.CORDONED_BY_US) == "true"

    @functools.cached_property
    def qualified_at(self) -> dt.datetime | None:
        return keys.parse_time(self.annotations.get(keys.QUALIFIED_AT))

    @property
    def current_test(self) -> str | None:
        return self.annotations.get(keys.CURRENT_TEST) or None

    @property
    def suspect_checks(self) -> frozenset[str]:
        return frozenset(keys.split_list(self.annotations.get(keys.SUSPECT_CHECKS)))

    @property
    def evidence(self) -> tuple[str, ...]:
        return keys.split_list(self.annotations.get(keys.EVIDENCE))

    @property
    def inconclusive_count(self) -> int:
        value = self.annotations.get(keys.INCONCLUSIVE, "0")
        return int(value) if value.isdigit() else 0

    @property
    def retry_after(self) -> dt.datetime | None:
        return keys.parse_time(self.annotations.get(keys.RETRY_AFTER))

    @property
    def seq(self) -> int:
        value = self.annotations.get(keys.SEQ, "0")
        return int(value) if value.isdigit() else 0

    def has_taint(self, key: str) -> bool:
        return any(t.key == key for t in self.taints)


_V = TypeVar("_V")


class Share(Protocol):
    """Gives back a value equal to the one given, kept once for all who ask (the check
    names, device IDs and fingerprint that thousands of finished tests repeat)."""

    def __call__(self, value: _V, /) -> _V: ...


def _own(value: _V, /) -> _V:
    return value


@dataclass(frozen=True, slots=True)
class TestFacts:
    """The node's current SDCTest: the one named by ``sdcguard.dev/test``, else the newest
    unfinished one (a test someone else started)."""

    __test__ = False  # not a pytest test class

    name: str
    suite: Suite
    reason: ScreeningReason
    attempt: int = 1
    phase: SDCTestPhase = SDCTestPhase.PENDING
    verdict: Verdict | None = None
    message: str = ""
    failed_checks: frozenset[str] = frozenset()
    passed_checks: frozenset[str] = frozenset()
    fingerprint: str = ""
    completed_at: dt.datetime | None = None
    findings: tuple[Finding, ...] = ()
    """Where each failed check located the fault (copied onto the RepairTicket)."""
    device_ids: tuple[str, ...] = ()
    """Each device's UUID or serial by index, as the probe named them ("" unknown)."""
    awaiting_baseline: bool = False
    """The probe has ended and its digests wait for enough nodes to agree on a baseline:
    the test holds its node but runs nothing (it does not use the test budget)."""
    data_seed: int | None = None
    """The data seed its probe was given (a confirmation re-run repeats it)."""
    seed: int | None = None
    """The seed of its baseline rounds."""
    end_reason: str = ""
    """Why it ended (status.reason: a verdict's reason, NodeGone, NodeLeftPolicy, ...)."""
    catch_chance: float | None = None
    """The screening's chance of catching a fault active in status.catchFraction of the
    rounds: its weakest check's (status.checks[].catchChance); None where no check says."""
    catch_shortfall: str | None = None
    """What fell short of the catch target (status.catchShortfall) when the probe said the
    target was missed (status.catchTargetMet false); None when met or not said."""

    @property
    def ended_by_policy_change(self) -> bool:
        """It ended because of a policy change, not of its node: no result at all."""
        return self.finished and ended_by_policy_change(self.phase, self.end_reason)

    @property
    def finished(self) -> bool:
        return self.phase.finished

    @property
    def named_devices(self) -> tuple[str, ...]:
        """The devices its failed checks named as the odd one out: each by its UUID where
        the probe reported one, else by its index (``index-3``)."""
        ids = self.device_ids
        named = [
            (ids[f.odd_device] if f.odd_device < len(ids) else "") or f"index-{f.odd_device}"
            for f in self.findings
            if f.odd_device is not None
        ]
        return tuple(dict.fromkeys(named))

    @classmethod
    def from_api(cls, test: SDCTest, share: Share = _own) -> TestFacts:
        """Facts from an SDCTest object (one walk of its checks: thousands of finished
        tests are read at every start); the values many tests repeat go through
        ``share``, so that the copy keeps each of them once."""
        name, spec, status = test.metadata.name, test.spec, test.status
        if status is None:
            return cls(name=name, suite=suite_of(test), reason=spec.reason, attempt=spec.attempt)
        failed: list[str] = []
        passed: list[str] = []
        findings: list[Finding] = []
        chances: list[float] = []
        for c in status.checks:
            if c.verdict == CheckVerdict.SDC:
                failed.append(c.name)
                findings.append(
                    Finding(
                        test=name,
                        check=c.name,
                        odd_device=c.odd_device,
                        first_divergent_step=c.first_divergent_step,
                        first_divergent_submodule=c.first_divergent_submodule,
                    )
                )
            elif c.verdict == CheckVerdict.PASS:
                passed.append(c.name)
            if c.catch_chance is not None:
                chances.append(c.catch_chance)
        return cls(
            name=name,
            suite=suite_of(test),
            reason=spec.reason,
            attempt=spec.attempt,
            phase=status.phase,
            verdict=status.verdict,
            message=share(status.message),
            failed_checks=share(frozenset(failed)),
            passed_checks=share(frozenset(passed)),
            fingerprint=share(status.fingerprint_hash or ""),
            completed_at=status.completion_time,
            findings=tuple(findings),
            device_ids=share(tuple(status.device_ids)),
            end_reason=share(status.reason or ""),
            awaiting_baseline=any(
                c.type == "AwaitingBaseline" and c.status == "True" for c in status.conditions
            ),
            data_seed=status.data_seed,
            catch_chance=min(chances) if chances else None,
            seed=status.seed,
            catch_shortfall=(status.catch_shortfall or "no detail")
            if status.catch_target_met is False
            else None,
        )


_PHASE_ORDER = (
    TicketPhase.RETIRED,
    TicketPhase.VERIFYING,
    TicketPhase.IN_REPAIR,
    TicketPhase.ACKNOWLEDGED,
    TicketPhase.OPEN,
)


@dataclass(frozen=True)
class TicketFacts:
    """The node's open RepairTicket; for a quarantine of scope Device, its tickets (one
    per device) seen as one incident: ``parts`` holds each of them."""

    name: str
    phase: TicketPhase = TicketPhase.OPEN
    resolution: Resolution | None = None
    cycle: int = 1
    acknowledged: bool = False
    """The repair side took it (set spec.external or acknowledged a notification)."""
    devices: tuple[SliceDevice, ...] = ()
    """Quarantine scope Device: the devices its DeviceTaintRules take out of service
    (empty: the whole node is quarantined)."""
    parts: tuple[TicketMember, ...] = ()
    """Scope Device: the incident's tickets (empty: ``members`` is this ticket alone)."""
    opened: bool = True
    """Its status is written. A ticket without one was created by a decision that did
    not finish: the plan writes the ticket first and its status after the node patch,
    so the node's quarantine may not have been written at all (a 409, a crash)."""

    @property
    def members(self) -> tuple[TicketMember, ...]:
        """The device tickets of a scope Device quarantine (empty for scope Node)."""
        if self.parts:
            return self.parts
        if not self.devices:
            return ()
        return (
            TicketMember(
                self.name, self.devices, self.phase, self.resolution, self.cycle, self.acknowledged
            ),
        )

    @classmethod
    def from_api(cls, ticket: RepairTicket) -> TicketFacts:
        """Facts from a RepairTicket object."""
        status = ticket.status
        phase = status.phase if status else TicketPhase.OPEN
        return cls(
            name=ticket.metadata.name,
            phase=phase,
            resolution=ticket.spec.resolution,
            cycle=status.cycle if status else 1,
            acknowledged=ticket.spec.external is not None
            or phase in (TicketPhase.ACKNOWLEDGED, TicketPhase.IN_REPAIR),
            devices=_quarantined_devices(ticket),
            opened=status is not None,
        )

    @classmethod
    def incident(cls, tickets: Sequence[TicketFacts]) -> TicketFacts:
        """The device tickets of one quarantine of scope Device as one incident.

        Its name is the first ticket's (by name); its phase the furthest any ticket
        reached (Verifying before InRepair before Acknowledged before Open; Retired only
        when every ticket is); its resolution Retire if any ticket says so, else the
        first resolution awaiting verification; acknowledged if any ticket is; its
        cycle the largest; its devices all of theirs."""
        ordered = sorted(tickets, key=lambda t: t.name)
        if len(ordered) == 1:
            return ordered[0]
        members = tuple(m for t in ordered for m in t.members)
        phases = {m.phase for m in members}
        retired = phases == {TicketPhase.RETIRED}
        phase = next(
            (p for p in _PHASE_ORDER[1:] if p in phases),
            TicketPhase.RETIRED if retired else TicketPhase.OPEN,
        )
        resolutions = [m.resolution for m in members if m.resolution is not None]
        resolution = (
            Resolution.RETIRE
            if Resolution.RETIRE in resolutions
            else (resolutions[0] if resolutions else None)
        )
        return cls(
            name=ordered[0].name,
            phase=phase,
            resolution=resolution,
            cycle=max(m.cycle for m in members),
            acknowledged=any(m.acknowledged for m in members),
            devices=tuple(d for m in members for d in m.devices),
            parts=members,
            opened=all(t.opened for t in ordered),
        )


def _quarantined_devices(ticket: RepairTicket) -> tuple[SliceDevice, ...]:
    record = ticket.spec.quarantine
    if record is None or record.scope != "Device":
        return ()
    return tuple(SliceDevice(d.driver, d.pool, d.device, d.uuid or "") for d in record.devices)


@dataclass(frozen=True)
class Observed:
    """Everything ``decide`` needs about one node, read by the adapters in one pass."""

    node: NodeFacts
    test: TestFacts | None = None
    ticket: TicketFacts | None = None
    idle_since: dt.datetime | None = None
    """Since when no pod (other than DaemonSets and our probes) uses accelerators;
    None while one does."""
    pending_pod_needs_node: bool = False
    """A pending pod could run only on this node (or nodes like it): screening yields."""
    usage: PoolUsage = field(default_factory=PoolUsage)
    """The node's pool, before this node's decision."""
    runtime_class_missing: bool = False
    """The policy's spec.probe.runtimeClassName names a RuntimeClass that does not exist."""
    topology_wait: str = ""
    """Why taking this node would exceed a topology domain's budget (budgets.topology),
    before this node's decision; "" when every domain of the node has room."""
    breaker_open: bool = False
    """The policy's circuit breaker is open: no new quarantines."""
    probe_unschedulable: str | None = None
    """The scheduler's message while it cannot place the current test's probe Pod."""
    queued: tuple[str, ...] = ()
    """Unfinished SDCTests of the node other than ``test`` (a person's tests that wait
    for the current one to end), oldest first."""
    joined_after_start: bool = False
    """The Node was created after the operator started (an autoscaler's or a person's
    new node, not one of the fleet sdcguard was installed on)."""
    hardware: HardwareFacts | None = None
    """What the SDCHardware records of the node's trusted identifiers say (None: its
    hardware has no history, or no identifier of it can be trusted)."""
    devices: NodeDevices | None = None
    """The node's devices in ResourceSlices; read only when a quarantine of scope Device
    may follow (None: not read)."""
    enforced_since: dt.datetime | None = None
    """When the policy switched from Observe to Enforce (None: no switch seen). A back-off
    from an inconclusive result before it no longer holds a node the switch gated."""
    drain_asked: bool = False
    """The node's drain asked every pod it had left to leave (the executor's note, in
    this process): the drain's deadline can go. After a restart the drain asks again."""

    def placed(self, usage: PoolUsage, topology_wait: str) -> Observed:
        """These observations with the pool's usage and the topology wait as they stand
        before this node's decision (``dataclasses.replace`` without its cost: a full
        pass places every node)."""
        placed = object.__new__(Observed)
        placed.__dict__.update(self.__dict__, usage=usage, topology_wait=topology_wait)
        return placed

    def pool_member(self, holding_taints: frozenset[str] = frozenset()) -> PoolMember:
        """This node's contribution to its pool's usage (see budgets for what "held" means).

        ``holding_taints``: the policy's testing and quarantine taint keys. Only those
        hold a node; a key someone wrote into owned-taints by hand holds nothing.
        """
        state = self.node.state
        in_service = self.ticket is not None and bool(self.ticket.devices)
        if state in (NodeState.QUARANTINED, NodeState.REPAIRING) and in_service:
            held = False  # quarantine scope Device: only some devices are out of service
        elif state in (NodeState.QUARANTINED, NodeState.REPAIRING, NodeState.VERIFYING):
            held = True
        elif state in (NodeState.TESTING, NodeState.SUSPECT):
            # Held only if it had been serving and carries our testing/quarantine taint now.
            held = self.node.qualified_at is not None and any(
                self.node.has_taint(k) and k in self.node.owned_taints for k in holding_taints
            )
        else:
            held = False
        # A test whose probe ended and that only waits for a baseline's quorum runs
        # nothing: counting it would keep out the very candidates the quorum waits for.
        testing = (
            self.test is not None and not self.test.finished and not self.test.awaiting_baseline
        )
        devices = self.node.accelerators
        quarantined = len(self.ticket.devices) if self.ticket is not None else 0
        out = devices if held else min(devices, quarantined)
        return PoolMember(
            pool=self.node.pool, held=held, testing=testing, devices=devices, devices_held=out
        )

    @property
    def devices_serving(self) -> int:
        """The node's devices still in service (all, less those its device taints take)."""
        out = len(self.ticket.devices) if self.ticket is not None else 0
        return max(0, self.node.accelerators - out)
