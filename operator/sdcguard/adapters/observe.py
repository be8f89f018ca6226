"""Small immutable snapshots of watched Pods and Jobs, kept in Kopf's in-memory indexes
(Nodes: ``domain.observed.NodeSnapshot``).

A 5,000-node fleet means 5,000 Node bodies and their pods; keeping a few fields of each
instead of the whole body keeps the operator's memory flat, and these snapshots are
what the reconciler turns into domain observations.
"""

from __future__ import annotations

import datetime as dt
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from pydantic import ValidationError

from sdcguard.api import GROUP, RepairTicket
from sdcguard.builders.probe_job import COMPONENT, COMPONENT_LABEL, TEST_ANNOTATION, TEST_LABEL
from sdcguard.domain.demand import NodeSelectorTerm, PodPlacement, Requirement, Toleration
from sdcguard.domain.judging import NEVER_STARTED_REASONS
from sdcguard.domain.keys import parse_time
from sdcguard.domain.observed import NodeSnapshot
from sdcguard.domain.quantity import parse_quantity, whole_quantity


def node_claim(node: NodeSnapshot | None) -> str | None:
    """The name of the Karpenter NodeClaim that owns this Node, or None."""
    return (node.node_claim or None) if node is not None else None


def is_extended_resource(name: str) -> bool:
    """A device resource (``vendor.example/device``), as opposed to cpu, memory,
    ephemeral-storage and hugepages: every accelerator a policy may list is one."""
    return "/" in name and not name.startswith(("kubernetes.io/", "requests."))


def _requests(pod_spec: Mapping[str, Any], resources: Iterable[str] | None) -> dict[str, int]:
    """Requested devices by resource; ``resources`` None: every extended resource (the
    indexes keep them all, and each policy reads its own spec.accelerators)."""
    wanted = None if resources is None else set(resources)
    total: dict[str, int] = {}
    for container in pod_spec.get("containers", []) or []:
        res = container.get("resources") or {}
        merged = {**(res.get("requests") or {}), **(res.get("limits") or {})}
        for name, value in merged.items():
            if name in wanted if wanted is not None else is_extended_resource(name):
                total[name] = total.get(name, 0) + whole_quantity(value)
    return {k: v for k, v in total.items() if v > 0}


def _is_daemonset_pod(meta: Mapping[str, Any]) -> bool:
    return any(o.get("kind") == "DaemonSet" for o in meta.get("ownerReferences") or [])


def is_probe_pod(meta: Mapping[str, Any]) -> bool:
    return (meta.get("labels") or {}).get(COMPONENT_LABEL) == COMPONENT


@dataclass(frozen=True)
class OwnerRef:
    """One ownerReference: enough to read the owner and check it is the same object."""

    api_version: str
    kind: str
    name: str
    uid: str = ""


def owner_ref(meta: Mapping[str, Any]) -> OwnerRef | None:
    """The controller's ownerReference of an object (else its first one), or None."""
    refs = [r for r in meta.get("ownerReferences") or [] if isinstance(r, Mapping)]
    if not refs:
        return None
    ref = next((r for r in refs if r.get("controller")), refs[0])
    return OwnerRef(
        api_version=str(ref.get("apiVersion") or ""),
        kind=str(ref.get("kind") or ""),
        name=str(ref.get("name") or ""),
        uid=str(ref.get("uid") or ""),
    )


CLAIMED_DEVICES = "resource.k8s.io/claims"
"""What a pod that holds devices through DRA ResourceClaims (``spec.resourceClaims``)
uses: its claims' devices are not named in the pod, so it counts as using every
accelerator of its node (its node is busy, and it is in the node's blast radius)."""


@dataclass(frozen=True)
class PodUse:
    """A workload pod that holds accelerators on a node."""

    namespace: str
    name: str
    node_name: str
    resources: frozenset[str] = frozenset()
    """The device resources it requests (a policy counts only its own accelerators)."""
    devices: int = 0
    """How many devices it requests, all resources together (the workload record)."""
    owner: OwnerRef | None = None
    """Its controller's ownerReference (else its first one): where the workload record
    starts looking for the top owner."""

    def uses_any(self, accelerators: Iterable[str]) -> bool:
        return CLAIMED_DEVICES in self.resources or not self.resources.isdisjoint(accelerators)


def pod_use(body: Mapping[str, Any], resources: Iterable[str] | None = None) -> PodUse | None:
    """A running/starting non-DaemonSet, non-probe pod requesting devices (``resources``,
    or None: any extended resource), else None."""
    meta, spec, status = body.get("metadata", {}), body.get("spec", {}), body.get("status", {})
    node = spec.get("nodeName")
    if not node or (status or {}).get("phase") in ("Succeeded", "Failed"):
        return None
    if _is_daemonset_pod(meta) or is_probe_pod(meta):
        return None
    requested = _requests(spec, resources)
    claims = bool(spec.get("resourceClaims"))
    if not requested and not claims:
        return None
    return PodUse(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        node_name=node,
        resources=frozenset(requested) | ({CLAIMED_DEVICES} if claims else frozenset()),
        devices=sum(requested.values()),
        owner=owner_ref(meta),
    )


@dataclass(frozen=True)
class PendingDemand:
    """An unscheduled pod asking for accelerators: idle capacity it may need, where the
    scheduler could place it (``placement``, judged by ``domain.demand``)."""

    namespace: str
    name: str
    resources: Mapping[str, int]
    placement: PodPlacement = field(default_factory=PodPlacement)


def _requirements(raw: Any) -> tuple[Requirement, ...]:
    return tuple(
        Requirement(
            key=str(item.get("key", "")),
            operator=str(item.get("operator", "")),
            values=tuple(str(v) for v in item.get("values") or ()),
        )
        for item in raw or ()
        if isinstance(item, Mapping)
    )


def _required_terms(spec: Mapping[str, Any]) -> tuple[NodeSelectorTerm, ...] | None:
    node_affinity = ((spec.get("affinity") or {}).get("nodeAffinity")) or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if not required:
        return None
    return tuple(
        NodeSelectorTerm(
            match_expressions=_requirements(term.get("matchExpressions")),
            match_fields=_requirements(term.get("matchFields")),
        )
        for term in required.get("nodeSelectorTerms") or ()
        if isinstance(term, Mapping)
    )


def _tolerations(spec: Mapping[str, Any]) -> tuple[Toleration, ...]:
    return tuple(
        Toleration(
            key=str(t.get("key") or ""),
            operator=str(t.get("operator") or "Equal"),
            value=str(t.get("value") or ""),
            effect=str(t.get("effect") or ""),
        )
        for t in spec.get("tolerations") or ()
        if isinstance(t, Mapping)
    )


def _effective_requests(spec: Mapping[str, Any]) -> dict[str, Decimal]:
    """Per resource, the larger of the containers' sum and any one init container (a
    limit stands for a missing request, as the API server defaults it)."""

    def requests(container: Mapping[str, Any]) -> dict[str, Decimal]:
        res = container.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        out: dict[str, Decimal] = {}
        for name, value in merged.items():
            try:
                out[str(name)] = parse_quantity(value)
            except ValueError:
                continue
        return out

    total: dict[str, Decimal] = {}
    for container in spec.get("containers") or ():
        for name, amount in requests(container).items():
            total[name] = total.get(name, Decimal(0)) + amount
    for container in spec.get("initContainers") or ():
        for name, amount in requests(container).items():
            total[name] = max(total.get(name, Decimal(0)), amount)
    return total


def pending_demand(
    body: Mapping[str, Any], resources: Iterable[str] | None = None
) -> PendingDemand | None:
    meta, spec, status = body.get("metadata", {}), body.get("spec", {}), body.get("status", {})
    if spec.get("nodeName") or (status or {}).get("phase") != "Pending" or is_probe_pod(meta):
        return None
    wanted = _requests(spec, resources)
    if spec.get("resourceClaims"):
        # Its claims' devices are not named in the pod: demand for a DRA node's devices.
        wanted[CLAIMED_DEVICES] = len(spec["resourceClaims"])
    if not wanted:
        return None
    return PendingDemand(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        resources=wanted,
        placement=PodPlacement(
            node_selector=dict(spec.get("nodeSelector") or {}),
            required_terms=_required_terms(spec),
            tolerations=_tolerations(spec),
            requests=_effective_requests(spec),
        ),
    )


@dataclass(frozen=True)
class ProbePod:
    """The probe Pod of one SDCTest, as far as its outcome goes.

    The termination message (the probe's result, up to 4 KiB) is kept compressed:
    finished probe Pods stay in the index until their Job's TTL, thousands at a time.
    """

    test_name: str
    name: str
    node_name: str
    phase: str
    exit_code: int | None
    message_z: bytes | None
    terminated_reason: str
    pod_reason: str
    started: dt.datetime | None
    finished: dt.datetime | None
    deleted: bool
    waiting_reason: str = ""
    """The kubelet's reason the container is not running yet (ErrImageNeverPull, ...)."""
    waiting_message: str = ""
    """The kubelet's message with it (names the image)."""
    unschedulable: str = ""
    """The scheduler's message while it cannot place the Pod (PodScheduled False)."""

    @property
    def start_failure(self) -> str | None:
        """``Reason: message`` when the kubelet cannot start the probe container (see
        ``judging.NEVER_STARTED_REASONS``), else None."""
        if self.phase != "Pending" or self.waiting_reason not in NEVER_STARTED_REASONS:
            return None
        said = f": {self.waiting_message}" if self.waiting_message else ""
        return f"{self.waiting_reason}{said}"

    @property
    def termination_message(self) -> str | None:
        if self.message_z is None:
            return None
        return zlib.decompress(self.message_z).decode("utf-8", errors="replace")


def probe_pod(body: Mapping[str, Any]) -> ProbePod | None:
    meta, spec, status = body.get("metadata", {}), body.get("spec", {}), body.get("status", {})
    if not is_probe_pod(meta):
        return None
    test = (meta.get("annotations") or {}).get(TEST_ANNOTATION) or (meta.get("labels") or {}).get(
        TEST_LABEL
    )
    if not test:
        return None
    status = status or {}
    exit_code = message = None
    term_reason = ""
    finished = None
    started = parse_time(status.get("startTime"))
    waiting_reason = waiting_message = ""
    for cs in status.get("containerStatuses", []) or []:
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting:
            waiting_reason = str(waiting.get("reason", "") or "")[:64]
            waiting_message = str(waiting.get("message", "") or "")[:512]
        term = (cs.get("state") or {}).get("terminated")
        if term:
            exit_code = term.get("exitCode")
            message = term.get("message")
            term_reason = term.get("reason", "") or ""
            finished = parse_time(term.get("finishedAt"))
    unschedulable = ""
    for cond in status.get("conditions", []) or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            unschedulable = str(cond.get("message") or cond.get("reason") or "Unschedulable")
    return ProbePod(
        test_name=test,
        name=meta.get("name", ""),
        node_name=spec.get("nodeName", "") or "",
        phase=status.get("phase", "Pending") or "Pending",
        exit_code=exit_code,
        message_z=None if message is None else zlib.compress(str(message).encode(), 6),
        terminated_reason=term_reason,
        pod_reason=status.get("reason", "") or "",
        started=started,
        finished=finished,
        deleted=bool(meta.get("deletionTimestamp")),
        waiting_reason=waiting_reason,
        waiting_message=waiting_message,
        unschedulable=unschedulable[:512],
    )


@dataclass(frozen=True)
class ProbeJob:
    """The probe Job of one SDCTest: whether the Job controller gave up on it."""

    test_name: str
    name: str
    failed_reason: str | None
    complete: bool
    created: dt.datetime | None


def probe_job(body: Mapping[str, Any]) -> ProbeJob | None:
    meta, status = body.get("metadata", {}), body.get("status", {}) or {}
    test = (meta.get("annotations") or {}).get(TEST_ANNOTATION) or (meta.get("labels") or {}).get(
        TEST_LABEL
    )
    if not test or not is_probe_pod(meta):
        return None
    failed_reason = None
    complete = False
    for cond in status.get("conditions", []) or []:
        if cond.get("status") != "True":
            continue
        # FailureTarget comes first (Kubernetes >= 1.31) and Failed only once the Pod has
        # terminated, which a dead kubelet never reports: either means the Job gave up.
        if cond.get("type") in ("Failed", "FailureTarget"):
            failed_reason = failed_reason or cond.get("reason") or "Failed"
        elif cond.get("type") == "Complete":
            complete = True
    return ProbeJob(
        test_name=test,
        name=meta.get("name", ""),
        failed_reason=failed_reason,
        complete=complete,
        created=parse_time(meta.get("creationTimestamp")),
    )


def trim_own(body: Mapping[str, Any]) -> dict[str, Any]:
    """One of our own resources without what the operator never reads (managedFields,
    Kopf's copy of the last spec): thousands of them stay in memory."""
    meta = body.get("metadata", {}) or {}
    kept = {
        k: meta[k]
        for k in ("name", "uid", "resourceVersion", "generation", "creationTimestamp", "labels")
        if k in meta
    }
    annotations = {
        k: v
        for k, v in (meta.get("annotations") or {}).items()
        if k != f"{GROUP}/last-handled-configuration"
    }
    if annotations:
        kept["annotations"] = annotations
    trimmed: dict[str, Any] = {k: v for k, v in body.items() if k != "metadata"}
    trimmed["metadata"] = kept
    return trimmed


@dataclass(frozen=True, slots=True)
class TicketSnapshot:
    """A RepairTicket as the operator's copy keeps it: parsed once per change
    (``ticket`` None when it does not validate), with what every pass reads of it, the
    unreadable ones included (``node_name`` is read from the raw spec)."""

    name: str
    node_name: str = ""
    resource_version: str = ""
    created: dt.datetime | None = None
    phase: str = ""
    """status.phase as written ("" without a status)."""
    opened_at: dt.datetime | None = None
    has_status: bool = False
    ticket: RepairTicket | None = None
    finalizers: tuple[str, ...] = ()
    """metadata.finalizers (an older release's Kopf timer left its own on each ticket)."""

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> TicketSnapshot:
        meta = body.get("metadata", {}) or {}
        status = body.get("status") or {}
        try:
            ticket: RepairTicket | None = RepairTicket.model_validate(trim_own(body))
        except ValidationError:
            ticket = None
        spec = body.get("spec")
        return cls(
            name=str(meta.get("name", "")),
            node_name=str(spec.get("nodeName") or "") if isinstance(spec, Mapping) else "",
            resource_version=str(meta.get("resourceVersion") or ""),
            created=parse_time(meta.get("creationTimestamp")),
            phase=str(status.get("phase") or "") if isinstance(status, Mapping) else "",
            opened_at=parse_time(status.get("openedAt")) if isinstance(status, Mapping) else None,
            has_status=bool(status),
            ticket=ticket,
            finalizers=tuple(str(f) for f in meta.get("finalizers") or ()),
        )
