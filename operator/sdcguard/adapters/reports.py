"""SDCReports from training jobs: read the Pod, decide, mark the node, answer.

For each new report: unless the refusal throttle refuses it unread, read the Pod it
names and the Pod that filed it (``spec.reporter``), what the operator knows of the
node (its device UUIDs, its pool), let :func:`sdcguard.domain.reports.admit_report`
decide, then (in this order) set ``sdcguard.dev/suspect`` on the Node (accepted
only; the lifecycle does the rest: a plan of one annotation step, written by the
plan's node-patch stage like every Node write), write the report's status (phase,
reason, an ``Accepted`` condition) and post Events: on the report, in the job owner's
namespace (accepted, or refused and why), and on the Node (accepted only).
Accepted reports are remembered for the rate limits by uid, refused ones for the
refusal throttle; after a restart accepted ones are rebuilt from the statuses the
watch lists again (``status.countedAgainst`` names the controller they counted
against), and a report still without an
outcome learns it from its node's record as soon as the fleet copy is complete
(:meth:`ReportAdmission.resume`): a screening that ended while no operator ran
still reaches the job's owner.

An accepted report is then followed through its node's events
(:meth:`ReportAdmission.follow`) until :func:`sdcguard.domain.reports.report_outcome`
says what became of it: the outcome goes into the report's status and into an
Event on the report, where the job's owner sees it (``kubectl describe sdcreport``,
``kubectl get events``). Posting Events in a job's namespace needs ``create events``
there (see the chart README); without it the status still says it.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog
import urllib3
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from sdcguard.adapters.inventory import Inventory
from sdcguard.adapters.kube import KubeWriter
from sdcguard.adapters.node_writes import NodePatchStage, annotation_plan
from sdcguard.api import GROUP, VERSION
from sdcguard.api.common import set_condition
from sdcguard.api.report import ReportOutcome, ReportPhase, SDCReport, SDCReportStatus
from sdcguard.api.resources import to_body
from sdcguard.domain import keys
from sdcguard.domain.devicetaints import NodeDevices
from sdcguard.domain.quantity import whole_quantity
from sdcguard.domain.reports import (
    ACCEPTED,
    AcceptedReport,
    NodeContext,
    OwnerFacts,
    PodFacts,
    RefusedReport,
    ReportDecision,
    ReportFacts,
    ReportLimits,
    admit_report,
    is_accelerator,
    report_outcome,
    screened_since_acceptance,
    throttle,
)
from sdcguard.domain.reports import (
    ReportOutcome as ReportOutcomeFacts,
)

PLURAL = "sdcreports"
log = structlog.get_logger("sdcguard.reports")


def report_facts(report: SDCReport) -> ReportFacts:
    """The decision's view of a parsed report."""
    spec = report.spec
    reporter = spec.reporter
    return ReportFacts(
        namespace=str(getattr(report.metadata, "namespace", "") or ""),
        name=report.metadata.name,
        node_name=spec.node_name,
        pod_name=spec.pod_name,
        job_name=spec.job_name,
        method=str(spec.method),
        confirmation=str(spec.confirmation),
        step=spec.step,
        gpu_uuid=spec.gpu_uuid,
        uid=str(report.metadata.uid or ""),
        reporter_pod=reporter.pod_name if reporter else None,
        reporter_uid=reporter.pod_uid if reporter else None,
    )


def pod_facts(body: Mapping[str, Any]) -> PodFacts:
    """The decision's view of a Pod read from the API server (a plain dict, camelCase).

    Its Job comes from its controlling ``ownerReferences`` entry, never from its
    labels (anyone who creates a Pod chooses its labels)."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    controller = next(
        (
            OwnerFacts(str(ref.get("kind", "")), str(ref.get("name", "")), str(ref.get("uid", "")))
            for ref in meta.get("ownerReferences") or []
            if isinstance(ref, Mapping) and ref.get("controller") is True and ref.get("uid")
        ),
        None,
    )
    statuses = (body.get("status") or {}).get("containerStatuses") or []
    started = any(_started(status) for status in statuses if isinstance(status, Mapping))
    containers = [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]
    accelerators = bool(spec.get("resourceClaims")) or any(
        is_accelerator(str(name))
        for container in containers
        if isinstance(container, Mapping)
        for part in ("requests", "limits")
        for name in ((container.get("resources") or {}).get(part) or {})
    )
    return PodFacts(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        node_name=spec.get("nodeName") or None,
        job_name=controller.name if controller and controller.kind == "Job" else None,
        uid=str(meta.get("uid", "")),
        controller=controller,
        started=started,
        accelerators=accelerators,
    )


def _started(status: Mapping[str, Any]) -> bool:
    """A container status says the container started at some time."""
    if status.get("started") is True:
        return True
    state = status.get("state") or {}
    last = status.get("lastState") or {}
    return any(
        bool((s.get(phase) or {}).get("startedAt"))
        for s in (state, last)
        for phase in ("running", "terminated")
    )


class KnownNodes:
    """What the operator's copy knows of a node, for a report about it: its device UUIDs
    (its ResourceSlices' ``uuid`` attributes and the device IDs its earlier screenings'
    probes read) and its pool (the nodes sharing its value of ``pool_label``)."""

    def __init__(
        self,
        inventory: Inventory,
        slices: Callable[[str], NodeDevices],
        pool_label: str,
    ) -> None:
        self.inventory = inventory
        self.slices = slices
        self.pool_label = pool_label

    def devices(self, node: str) -> frozenset[str]:
        # A screening's device IDs say the node's devices only when it named them all (a
        # probe may screen fewer: MIG instances, a simulated node's CPU devices).
        snapshot = self.inventory.node_bodies([node]).get(node)
        total = sum(
            whole_quantity(count)
            for resource, count in (snapshot.allocatable if snapshot else {}).items()
            if is_accelerator(resource)
        )
        found: set[str] = set()
        for test in self.inventory.tests_by_node([node]).get(node, []):
            ids = {i for i in test.known.facts.device_ids if i} if test.known else set()
            if total and len(ids) >= total:
                found |= ids
        try:
            found |= {d.uuid for d in self.slices(node).devices if d.uuid}
        except (ApiException, urllib3.exceptions.HTTPError) as exc:
            log.warning("resource slices not read for a report", node=node, error=str(exc)[:300])
        return frozenset(found)

    def pool(self, node: str) -> tuple[str, int] | None:
        nodes = self.inventory.node_bodies()
        me = nodes.get(node)
        if me is None:
            return None
        label = self.pool_label
        if not label:
            return "", len(nodes)
        value = me.labels.get(label, "")
        size = sum(1 for other in nodes.values() if other.labels.get(label, "") == value)
        return f"{label}={value}", size


@dataclass
class _Awaited:
    """An accepted report waiting for its outcome."""

    namespace: str
    name: str
    uid: str | None
    screened: bool
    """Its node was seen screening (Suspect, Testing) since it was accepted."""
    accepted_at: dt.datetime | None = None
    holds: bool = False
    """It raised the node's suspicion (reason Accepted): it counts against the pool's
    share until its outcome is known."""
    recovered: bool = False
    """Found again after a restart: what became of it is read from its node's record
    first (the screening may have run, even ended, while no operator watched)."""


class ReportAdmission:
    """Admits SDCReports one at a time (the rate limits need a serial view)."""

    def __init__(
        self,
        writer: KubeWriter,
        limits: ReportLimits | None = None,
        *,
        devices: Callable[[str], frozenset[str]] | None = None,
        pool_of: Callable[[str], tuple[str, int] | None] | None = None,
    ) -> None:
        self.writer = writer
        self.devices = devices or (lambda _node: frozenset())
        """The accused node's accelerator UUIDs, lower-case (empty: none known)."""
        self.pool_of = pool_of or (lambda _node: None)
        """The node's pool and its size in nodes (None: unknown, no pool share)."""
        self._node_patch = NodePatchStage(writer)
        """The plan's node-patch stage (stateless), which marks an accused node suspect."""
        self.limits = limits or ReportLimits()
        self.accepted: dict[str, AcceptedReport] = {}
        """Accepted reports by uid, for the caps."""
        self.refused: dict[str, RefusedReport] = {}
        """Refused reports by uid, for the refusal throttle."""
        self.awaiting: dict[str, dict[str, _Awaited]] = {}
        """node -> report key -> an accepted report whose outcome is not known yet."""
        self.concluded: set[str] = set()
        """Reports concluded by this process (a late event with the older status must not
        make one wait again)."""
        self._lock = threading.Lock()

    def handle(self, body: Mapping[str, Any], now: dt.datetime) -> ReportDecision | None:
        """Decide a report without a status; remember one already accepted."""
        meta = body.get("metadata") or {}
        where = f"{meta.get('namespace')}/{meta.get('name')}"
        try:
            report = SDCReport.model_validate(body)
        except ValidationError as exc:
            # The API server enforces the schema; this is an older or hand-made object.
            log.warning("report not readable", report=where, error=str(exc)[:300])
            return None
        facts = report_facts(report)
        status = report.status
        if status is not None and status.phase is not None:
            if status.phase == ReportPhase.ACCEPTED:
                with self._lock:
                    if status.reason == ACCEPTED:
                        self._remember(
                            facts, status.counted_against or facts.key, status.decided_at or now
                        )
                    if status.outcome is None:
                        # Seen again after a restart: the screening may have run, or
                        # ended, meanwhile; the node's record tells (see resume()).
                        self._await(
                            facts,
                            report.metadata.uid,
                            screened=False,
                            recovered_at=status.decided_at or now,
                            holds=status.reason == ACCEPTED,
                        )
            return None
        with self._lock:
            self._forget_before(now)
            throttled = throttle(facts, self.refused.values(), self.limits, now)
        if throttled is not None:
            # Refused unread: no Pod is read and no Event is posted (the status says it).
            self._act(report, facts, throttled, now, events=False)
            return throttled
        pod = self._read_pod(facts.namespace, facts.pod_name)
        reporter = pod
        if facts.reporter_pod is not None and facts.reporter_pod != facts.pod_name:
            reporter = self._read_pod(facts.namespace, facts.reporter_pod)
        context = self._node_context(facts.node_name) if pod is not None else NodeContext()
        with self._lock:
            decision = admit_report(
                facts,
                pod,
                self.accepted.values(),
                self.limits,
                now,
                reporter=reporter,
                node=context,
            )
            if decision.accepted and decision.suspect_annotation is not None:
                self._remember(facts, decision.job_key, now)
            if decision.accepted:
                self._await(
                    facts,
                    report.metadata.uid,
                    screened=False,
                    holds=decision.suspect_annotation is not None,
                )
            else:
                self.refused[facts.key] = RefusedReport(
                    facts.key, facts.namespace, facts.reporter_key, now
                )
        self._act(report, facts, decision, now)
        return decision

    def _node_context(self, node: str) -> NodeContext:
        """What the operator knows of ``node``: its devices, its pool and how many of the
        pool's nodes accepted reports hold now."""
        devices = frozenset(d.lower() for d in self.devices(node) if d)
        pool = self.pool_of(node)
        if pool is None:
            return NodeContext(devices=devices)
        name, size = pool
        with self._lock:
            holding = [
                other
                for other, waiting in self.awaiting.items()
                if other != node and any(entry.holds for entry in waiting.values())
            ]
        held = sum(1 for other in holding if (self.pool_of(other) or ("", 0))[0] == name)
        return NodeContext(devices=devices, pool=name, pool_size=size, pool_held=held)

    def _await(
        self,
        facts: ReportFacts,
        uid: str | None,
        *,
        screened: bool,
        recovered_at: dt.datetime | None = None,
        holds: bool = False,
    ) -> None:
        key = f"{facts.namespace}/{facts.name}"
        if key in self.concluded:
            return
        self.awaiting.setdefault(facts.node_name, {}).setdefault(
            key,
            _Awaited(
                facts.namespace,
                facts.name,
                uid,
                screened,
                accepted_at=recovered_at,
                holds=holds,
                recovered=recovered_at is not None,
            ),
        )

    def resume(
        self, node_body: Callable[[str], Mapping[str, Any] | None], now: dt.datetime
    ) -> None:
        """Conclude the reports found again after a restart whose node's record already
        says what became of them (confirmed or cleared while no operator watched).

        Call once the fleet copy is complete: ``node_body(name)`` is the node as it is
        now, None when it does not exist. The rest wait for their node's next change.
        """
        with self._lock:
            nodes = [
                node
                for node, waiting in self.awaiting.items()
                if any(entry.recovered for entry in waiting.values())
            ]
        for node in nodes:
            self.follow(node, node_body(node), now)

    def recent(self) -> list[tuple[str, dt.datetime]]:
        """Reports accepted within the limits' window, (node, accepted at): the risk
        order's recent reports (a routine node's were not confirmed by its re-test) and
        the fleet figures' first evidence."""
        with self._lock:
            return [(r.node_name, r.accepted_at) for r in self.accepted.values()]

    def awaits(self, node: str) -> bool:
        """Whether an accepted report about ``node`` waits for its outcome (cheap)."""
        return bool(self.awaiting.get(node))

    def follow(self, node: str, body: Mapping[str, Any] | None, now: dt.datetime) -> None:
        """A node event: conclude the reports about it whose outcome is now known.

        ``body`` None: the node was deleted.
        """
        meta = (body or {}).get("metadata") or {}
        state = (meta.get("labels") or {}).get(keys.LABEL_STATE)
        annotations = meta.get("annotations") or {}
        pending = keys.REQUEST_SUSPECT in annotations
        since = keys.parse_time(annotations.get(keys.STATE_SINCE))
        concluded: list[tuple[_Awaited, ReportOutcomeFacts]] = []
        with self._lock:
            waiting = self.awaiting.get(node, {})
            for key, entry in list(waiting.items()):
                if body is None:
                    outcome: ReportOutcomeFacts | None = ReportOutcomeFacts(
                        "NotScreened", f"node {node} was deleted before it was screened"
                    )
                else:
                    if entry.recovered:
                        entry.screened = screened_since_acceptance(
                            state, since, pending, entry.accepted_at
                        )
                        entry.recovered = False
                    entry.screened, outcome = report_outcome(node, state, pending, entry.screened)
                if outcome is not None:
                    del waiting[key]
                    self.concluded.add(key)
                    concluded.append((entry, outcome))
            if not waiting:
                self.awaiting.pop(node, None)
        for entry, outcome in concluded:
            self._conclude(entry, outcome, now)

    def _conclude(self, entry: _Awaited, outcome: ReportOutcomeFacts, now: dt.datetime) -> None:
        status = {
            "outcome": str(ReportOutcome(outcome.outcome)),
            "outcomeMessage": outcome.message,
            "concludedAt": now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        self._write_status(entry.namespace, entry.name, status)
        log.info(
            "report concluded", report=f"{entry.namespace}/{entry.name}", outcome=outcome.outcome
        )
        self._report_event(
            entry.namespace,
            entry.name,
            entry.uid,
            f"SDCReport{outcome.outcome}",
            outcome.message,
            now,
            warning=outcome.warning,
        )

    def _report_event(
        self,
        namespace: str,
        name: str,
        uid: str | None,
        reason: str,
        message: str,
        now: dt.datetime,
        *,
        warning: bool,
    ) -> None:
        """An Event on the report, in the job owner's namespace."""
        self.writer.event(
            kind="SDCReport",
            name=name,
            uid=uid,
            reason=reason,
            message=message,
            now=now,
            warning=warning,
            api_version=f"{GROUP}/{VERSION}",
            namespace=namespace,
            namespaced=True,
        )

    def _remember(self, facts: ReportFacts, job_key: str, when: dt.datetime) -> None:
        self.accepted[facts.key] = AcceptedReport(
            namespace=facts.namespace,
            name=facts.name,
            job_key=job_key,
            node_name=facts.node_name,
            accepted_at=when,
            uid=facts.uid,
        )

    def _forget_before(self, now: dt.datetime) -> None:
        horizon = max(self.limits.window, self.limits.node_window)
        for key in [k for k, a in self.accepted.items() if now - a.accepted_at >= horizon]:
            del self.accepted[key]
        for key in [k for k, r in self.refused.items() if now - r.refused_at >= horizon]:
            del self.refused[key]

    def _read_pod(self, namespace: str, name: str) -> PodFacts | None:
        # A LIST by name: the operator may list Pods cluster-wide but not get them.
        pods = self.writer.core.list_namespaced_pod(
            namespace, field_selector=f"metadata.name={name}"
        )
        items = pods.items or []
        if not items:
            return None
        body = self.writer.api.sanitize_for_serialization(items[0])  # type: ignore[no-untyped-call]
        return pod_facts(body)

    def _act(
        self,
        report: SDCReport,
        facts: ReportFacts,
        decision: ReportDecision,
        now: dt.datetime,
        *,
        events: bool = True,
    ) -> None:
        if decision.suspect_annotation is not None:
            suspect = annotation_plan([(keys.REQUEST_SUSPECT, decision.suspect_annotation)])
            self._node_patch.annotate(facts.node_name, suspect)
        previous = report.status.conditions if report.status else []
        status = SDCReportStatus(
            phase=ReportPhase.ACCEPTED if decision.accepted else ReportPhase.REFUSED,
            reason=decision.reason,
            message=decision.message,
            decided_at=now,
            counted_against=decision.job_key or None,
            conditions=set_condition(
                list(previous),
                "Accepted",
                "True" if decision.accepted else "False",
                decision.reason,
                decision.message,
                now,
            ),
        )
        self._write_status(facts.namespace, facts.name, to_body(status))
        log.info(
            "report decided",
            report=f"{facts.namespace}/{facts.name}",
            node=facts.node_name,
            accepted=decision.accepted,
            reason=decision.reason,
        )
        if not events:
            return
        if decision.accepted:
            reason = "SDCReportAccepted" if decision.reason == "Accepted" else "SDCReportRecorded"
        else:
            reason = "SDCReportRefused"
        told = decision.message if decision.accepted else f"refused ({decision.reason}): "
        self._report_event(
            facts.namespace,
            facts.name,
            report.metadata.uid,
            reason,
            told if decision.accepted else told + decision.message,
            now,
            warning=not decision.accepted,
        )
        if decision.accepted:
            self.writer.event(
                kind="Node",
                name=facts.node_name,
                uid=None,
                reason="SDCReported",
                message=f"SDCReport {facts.namespace}/{facts.name}: {decision.message}",
                now=now,
                warning=True,
            )

    def _write_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.writer.metrics.api_writes.labels(kind=f"{PLURAL}-status").inc()
        if self.writer.dry_run:
            log.info("dry-run: skipped write", kind=f"{PLURAL}-status")
            return
        try:
            self.writer.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURAL, name, {"status": status}
            )
        except ApiException as exc:
            if exc.status != 404:  # deleted meanwhile: nobody left to tell
                raise
