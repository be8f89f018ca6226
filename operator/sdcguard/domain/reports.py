"""Admitting a training job's SDCReport: believe it, cap it, or refuse it.

Pure: the report, the Pod it names and the Pod that filed it (as read from the API
server), what the operator knows of the accused node (its devices, its pool), the
reports accepted and refused before and the time come in; a decision goes out. An
accepted report becomes the node's ``sdcguard.dev/suspect`` request, which the
lifecycle turns into the Suspect state, screened by the probe when the node is next
idle: a report alone never quarantines a node.

Refused, each with its own reason, in this order:

* ``Throttled``: the reporter (or its namespace, or the cluster) had ``refused_*``
  reports refused in the window already; nothing is read for it;
* ``PodNotFound``: the named Pod does not exist in the report's namespace;
* ``NodeMismatch``: the Pod is not bound to the reported node;
* ``NotStarted``: no container of the Pod ever started (a Pod created with
  ``spec.nodeName`` set, which never ran, accuses nobody);
* ``NoAccelerators``: the Pod requests no accelerator (no extended accelerator
  resource, no DRA claim), so it computed nothing on the node's devices;
* ``JobMismatch``: the Pod's controller (its ``ownerReferences``, never its labels)
  is not the reported Job;
* ``ReporterMismatch``: the report's ``spec.reporter`` names a Pod that does not
  exist, has another uid, or belongs to another controller than the accused Pod (a
  Pod without a controller may only report itself);
* ``UnknownDevice``: ``gpuUUID`` is none of the node's devices, where the operator
  knows them (ResourceSlices, the probe's device IDs of earlier screenings);
* ``JobRateLimited``: the controller already had ``per_job`` reports accepted in the
  window;
* ``TooManyNodes``: the controller already blamed ``max_nodes_per_job`` other nodes
  in the window (a job that blames every node it touches is not believed);
* ``NamespaceRateLimited``: the namespace had ``per_namespace`` accepted in the window;
* ``ClusterRateLimited``: the cluster had ``per_cluster`` accepted in the window;
* ``PoolShareExceeded``: reports already hold ``pool_share`` of the node's pool
  (at least one node) awaiting their screening.

Caps count reports by uid (a report deleted and created again is a new report and
counts again) and jobs by their controller's uid (a Job deleted and created again
under the same name is another job; a bare Pod is keyed by its own uid).

A second report about a node that was reported moments ago is accepted as
evidence (``AlreadySuspected``) without a second suspicion.

After acceptance, :func:`report_outcome` follows the node until the operator can
say what became of the report: ``Confirmed`` (the probe confirmed it and the node
is quarantined), ``Cleared`` (the node passed the re-test and is back in
service) or ``NotScreened`` (the node was in no state to be screened for it).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass

from sdcguard.domain.text import clean_optional, clean_text

ACCEPTED, ALREADY_SUSPECTED, THROTTLED = "Accepted", "AlreadySuspected", "Throttled"
#: Longest value written into the node's suspect annotation.
MAX_ANNOTATION = 512
#: Longest GPU UUID repeated from a report (into annotations, Events, statuses).
MAX_GPU_UUID = 96


@dataclass(frozen=True)
class ReportLimits:
    """Caps on what reports may do."""

    window: dt.timedelta = dt.timedelta(hours=1)
    per_job: int = 3
    max_nodes_per_job: int = 2
    per_namespace: int = 10
    node_window: dt.timedelta = dt.timedelta(minutes=10)
    per_cluster: int = 30
    """Reports accepted in the whole cluster within the window."""
    pool_share: float = 0.1
    """Share of a pool's nodes that accepted reports may hold awaiting their screening
    at once (at least one node)."""
    refused_per_reporter: int = 5
    """Refusals within the window after which a reporter's further reports are
    refused unread (Throttled)."""
    refused_per_namespace: int = 20
    """The same, per namespace."""
    refused_per_cluster: int = 100
    """The same, for the whole cluster."""


@dataclass(frozen=True)
class ReportFacts:
    """The report as the decision needs it."""

    namespace: str
    name: str
    node_name: str
    pod_name: str
    job_name: str | None
    method: str
    confirmation: str
    step: int
    gpu_uuid: str | None = None
    uid: str = ""
    """The report's uid (its name when the API server gave none)."""
    reporter_pod: str | None = None
    """``spec.reporter.podName``: the Pod that filed it (None: an admin's report)."""
    reporter_uid: str | None = None
    """``spec.reporter.podUID``."""

    @property
    def key(self) -> str:
        """What caps count the report by: its uid."""
        return self.uid or f"{self.namespace}/{self.name}"

    @property
    def reporter_key(self) -> str:
        """Who filed it, for the refusal throttle: the reporting Pod's uid (or name), or
        for an admin's report the accused Pod."""
        if self.reporter_uid:
            return f"pod-uid:{self.reporter_uid}"
        if self.reporter_pod:
            return f"pod:{self.namespace}/{self.reporter_pod}"
        return f"pod:{self.namespace}/{self.pod_name}"


@dataclass(frozen=True)
class OwnerFacts:
    """A Pod's controller, from its ``ownerReferences`` (``controller: true``)."""

    kind: str
    name: str
    uid: str


#: Extended resources that are accelerators (and NVIDIA's MIG profiles, by prefix).
ACCELERATOR_RESOURCES = ("nvidia.com/gpu", "aws.amazon.com/neuron", "google.com/tpu", "amd.com/gpu")
ACCELERATOR_PREFIXES = ("nvidia.com/mig-", "aws.amazon.com/neuroncore")


def is_accelerator(resource: str) -> bool:
    """Whether an extended resource name is an accelerator."""
    return resource in ACCELERATOR_RESOURCES or resource.startswith(ACCELERATOR_PREFIXES)


@dataclass(frozen=True)
class PodFacts:
    """A Pod (the accused or the reporting one), as the API server has it."""

    namespace: str
    name: str
    node_name: str | None
    job_name: str | None = None
    """The name of its controller when that is a Job (from ownerReferences)."""
    uid: str = ""
    controller: OwnerFacts | None = None
    started: bool = False
    """Some container of it started (``containerStatuses[].started``, or a running or
    terminated state with a start time)."""
    accelerators: bool = False
    """It requests an accelerator (an extended accelerator resource or a DRA claim)."""

    @property
    def job_key(self) -> str:
        """Caps count per controller uid, or per Pod uid for a Pod without one."""
        if self.controller is not None:
            return f"{self.namespace}/{self.controller.kind}:{self.controller.uid}"
        return f"{self.namespace}/pod:{self.uid or self.name}"

    @property
    def job_label(self) -> str:
        """The controller for people: ``Job llm`` or ``pod llm-0``."""
        if self.controller is not None:
            return f"{self.controller.kind} {self.namespace}/{self.controller.name}"
        return f"pod {self.namespace}/{self.name}"


@dataclass(frozen=True)
class NodeContext:
    """What the operator knows of the accused node."""

    devices: frozenset[str] = frozenset()
    """The node's accelerator UUIDs, lower-case (empty: none known)."""
    pool: str = ""
    """The node's pool, for the pool share."""
    pool_size: int = 0
    """Nodes in that pool (0: unknown, no pool share is checked)."""
    pool_held: int = 0
    """Nodes of that pool that accepted reports hold awaiting their screening."""


@dataclass(frozen=True)
class AcceptedReport:
    """A report accepted earlier (kept in memory and rebuilt from statuses on restart)."""

    namespace: str
    name: str
    job_key: str
    node_name: str
    accepted_at: dt.datetime
    uid: str = ""

    @property
    def key(self) -> str:
        return self.uid or f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class RefusedReport:
    """A report refused earlier (kept in memory for the refusal throttle)."""

    key: str
    namespace: str
    reporter: str
    refused_at: dt.datetime


@dataclass(frozen=True)
class ReportDecision:
    """What to do with one report."""

    accepted: bool
    reason: str
    message: str
    suspect_annotation: str | None = None
    """The value of ``sdcguard.dev/suspect`` to set on the node; None: write nothing."""
    job_key: str = ""
    """The controller the caps counted it against (accepted reports)."""


def report_reference(suspect_annotation: str | None) -> str | None:
    """``SDCReport namespace/name`` from a suspect request an accepted report set
    (None for requests made otherwise, e.g. by a person)."""
    if not suspect_annotation or not suspect_annotation.startswith("SDCReport "):
        return None
    ref = suspect_annotation.removeprefix("SDCReport ").split(":", 1)[0].strip()
    namespace, _, name = ref.partition("/")
    if not namespace or not name or "," in ref or " " in ref:
        return None
    return f"SDCReport {namespace}/{name}"


def _refuse(reason: str, message: str) -> ReportDecision:
    return ReportDecision(False, reason, message)


def throttle(
    report: ReportFacts, refused: Iterable[RefusedReport], limits: ReportLimits, now: dt.datetime
) -> ReportDecision | None:
    """``Throttled`` when the reporter, its namespace or the cluster had too many
    reports refused within the window (the report itself not counted); else None."""
    recent = [r for r in refused if now - r.refused_at < limits.window and r.key != report.key]
    span = _span(limits.window)
    for scope, count, limit in (
        (
            f"reporter {report.reporter_key}",
            sum(r.reporter == report.reporter_key for r in recent),
            limits.refused_per_reporter,
        ),
        (
            f"namespace {report.namespace}",
            sum(r.namespace == report.namespace for r in recent),
            limits.refused_per_namespace,
        ),
        ("the cluster", len(recent), limits.refused_per_cluster),
    ):
        if count >= limit:
            return _refuse(
                THROTTLED,
                f"{scope} had {count} reports refused within {span} (limit {limit}): "
                "further reports are refused unread until the window has passed",
            )
    return None


def admit_report(
    report: ReportFacts,
    pod: PodFacts | None,
    accepted: Iterable[AcceptedReport],
    limits: ReportLimits,
    now: dt.datetime,
    *,
    reporter: PodFacts | None = None,
    node: NodeContext | None = None,
) -> ReportDecision:
    """Decide one report (see the module docstring for the rules, in their order).

    ``reporter``: the Pod ``spec.reporter`` names, as read (ignored for a report
    without ``spec.reporter``, an admin's)."""
    node = node or NodeContext()
    where = f"{report.namespace}/{report.pod_name}"
    if pod is None:
        return _refuse(
            "PodNotFound",
            f"pod {where} does not exist: a report is checked against the running Pod of "
            "the accused rank; send it while that Pod still exists",
        )
    if pod.node_name != report.node_name:
        ran = f"runs on node {pod.node_name}" if pod.node_name else "is not scheduled"
        return _refuse(
            "NodeMismatch", f"pod {where} {ran}, not on {report.node_name}: not believed"
        )
    if not pod.started:
        return _refuse(
            "NotStarted",
            f"no container of pod {where} has started on {report.node_name}: a Pod that "
            "never ran computed nothing there; not believed",
        )
    if not pod.accelerators:
        return _refuse(
            "NoAccelerators",
            f"pod {where} requests no accelerator, so it computed nothing on "
            f"{report.node_name}'s devices: not believed",
        )
    if report.job_name is not None and pod.job_name != report.job_name:
        return _refuse(
            "JobMismatch",
            f"pod {where} belongs to {pod.job_label if pod.controller else 'no controller'}"
            f", not to job {report.job_name} (its ownerReferences say so, not its labels)",
        )
    mismatch = _reporter_mismatch(report, pod, reporter)
    if mismatch is not None:
        return _refuse("ReporterMismatch", mismatch)
    gpu = clean_optional(report.gpu_uuid, MAX_GPU_UUID)
    if gpu is not None and node.devices and gpu.lower() not in node.devices:
        return _refuse(
            "UnknownDevice",
            f"gpuUUID {gpu} is none of node {report.node_name}'s {len(node.devices)} known "
            "devices (its ResourceSlices and earlier screenings): not believed",
        )
    recent = [a for a in accepted if now - a.accepted_at < limits.window and a.key != report.key]
    job_key = pod.job_key
    by_job = [a for a in recent if a.job_key == job_key]
    span = _span(limits.window)
    if len(by_job) >= limits.per_job:
        return _refuse(
            "JobRateLimited",
            f"{pod.job_label} already had {len(by_job)} reports accepted within {span} "
            f"(limit {limits.per_job})",
        )
    blamed = {a.node_name for a in by_job}
    if report.node_name not in blamed and len(blamed) >= limits.max_nodes_per_job:
        return _refuse(
            "TooManyNodes",
            f"{pod.job_label} already blamed {len(blamed)} other nodes within {span} "
            f"({', '.join(sorted(blamed))}; limit {limits.max_nodes_per_job}): a job that "
            "blames every node it touches is not believed",
        )
    in_namespace = [a for a in recent if a.namespace == report.namespace]
    if len(in_namespace) >= limits.per_namespace:
        return _refuse(
            "NamespaceRateLimited",
            f"namespace {report.namespace} already had {len(in_namespace)} reports accepted "
            f"within {span} (limit {limits.per_namespace})",
        )
    if len(recent) >= limits.per_cluster:
        return _refuse(
            "ClusterRateLimited",
            f"the cluster already had {len(recent)} reports accepted within {span} "
            f"(limit {limits.per_cluster})",
        )
    what = f"{clean_text(report.method, 32)} at step {report.step}"
    unverified = gpu is not None and not node.devices
    on_gpu = f" on GPU {gpu}" + (" (unverified)" if unverified else "") if gpu else ""
    earlier = [
        a
        for a in recent
        if a.node_name == report.node_name and now - a.accepted_at < limits.node_window
    ]
    if earlier:
        return ReportDecision(
            True,
            ALREADY_SUSPECTED,
            f"{what}{on_gpu} recorded as evidence; node {report.node_name} was reported by "
            f"{earlier[-1].namespace}/{earlier[-1].name} within {_span(limits.node_window)}",
            job_key=job_key,
        )
    if node.pool_size > 0:
        share = max(1, int(node.pool_size * limits.pool_share))
        if node.pool_held >= share:
            return _refuse(
                "PoolShareExceeded",
                f"reports already hold {node.pool_held} of the {node.pool_size} nodes of pool "
                f"{node.pool or '(all)'} awaiting their screening (at most "
                f"{limits.pool_share:.0%}, {share} nodes): report again once one is screened",
            )
    confirmation = clean_text(report.confirmation, 32)
    annotation = (
        f"SDCReport {report.namespace}/{report.name}: {what}{on_gpu} ({confirmation.lower()})"
    )[:MAX_ANNOTATION]
    return ReportDecision(
        True,
        ACCEPTED,
        f"node {report.node_name} marked suspect: {what}{on_gpu} ({confirmation}); "
        "it is screened when next idle and quarantined only if the probe confirms",
        suspect_annotation=annotation,
        job_key=job_key,
    )


def _reporter_mismatch(report: ReportFacts, pod: PodFacts, reporter: PodFacts | None) -> str | None:
    """Why the reporting Pod may not accuse ``pod`` (None: it may)."""
    if report.reporter_pod is None:
        return None  # an admin's report (the admission policy let it through)
    who = f"{report.namespace}/{report.reporter_pod}"
    if reporter is None:
        return f"the reporting pod {who} does not exist"
    if report.reporter_uid and reporter.uid != report.reporter_uid:
        return f"the reporting pod {who} has uid {reporter.uid}, not {report.reporter_uid}"
    if pod.controller is None:
        if reporter.uid != pod.uid:
            return (
                f"pod {report.namespace}/{pod.name} has no controller, so only it may "
                f"report itself, not {who}"
            )
        return None
    if reporter.controller is None or reporter.controller.uid != pod.controller.uid:
        theirs = reporter.job_label if reporter.controller else "no controller"
        return (
            f"the reporting pod {who} belongs to {theirs}, not to {pod.job_label} of the "
            "accused pod: a workload reports only its own ranks"
        )
    return None


def _span(delta: dt.timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds % 3600 == 0:
        return f"{seconds // 3600}h"
    if seconds % 60 == 0:
        return f"{seconds // 60}m"
    return f"{seconds}s"


#: Node states in which the suspicion is being screened.
SCREENING_STATES = frozenset({"Suspect", "Testing"})
#: Node states that mean the probe confirmed a fault.
CONFIRMED_STATES = frozenset({"Quarantined", "Repairing", "Retired"})


@dataclass(frozen=True)
class ReportOutcome:
    """What became of an accepted report, for its status and the owner's Event."""

    outcome: str
    """Confirmed, Cleared or NotScreened."""
    message: str
    warning: bool = False


def report_outcome(
    node: str, state: str | None, suspect_pending: bool, screened: bool
) -> tuple[bool, ReportOutcome | None]:
    """Follow an accepted report's node: (screened since, the outcome if there is one).

    ``state`` is the node's ``sdcguard.dev/state`` label, ``suspect_pending`` whether
    its ``sdcguard.dev/suspect`` request still waits, ``screened`` whether the node
    was seen screening since the report was accepted.
    """
    if state in SCREENING_STATES:
        return True, None
    if screened and state in CONFIRMED_STATES:
        return True, ReportOutcome(
            "Confirmed",
            f"the probe confirmed the report: node {node} is {state} and off the schedulable "
            "pool; the report is part of its record (kubectl sdc history)",
            warning=True,
        )
    if screened and state == "Qualified":
        return True, ReportOutcome(
            "Cleared",
            f"node {node} passed the probe's re-test of the suspicion and is back in "
            "service; the report stays in its record, and another report about it is "
            "audited more often by sdctrain",
        )
    if screened or suspect_pending:
        return screened, None
    return False, ReportOutcome(
        "NotScreened",
        f"node {node} was {state or 'not managed by sdcguard'} and was not screened for "
        "this report (a policy with triggers.onSuspect screens Qualified nodes); the "
        "report stays in its record",
    )


def screened_since_acceptance(
    state: str | None,
    state_since: dt.datetime | None,
    suspect_pending: bool,
    accepted_at: dt.datetime | None,
) -> bool:
    """Whether an accepted report's node was screened for it, read from the node's record
    alone: for a report found again after a restart, whose node may have been screened,
    confirmed or cleared while no operator watched.

    The suspicion still waiting on the node (``suspect_pending``) means not yet; a node
    screening now has been taken for it; otherwise the node must have entered its
    present state (``state_since``) at or after the report's acceptance, since taking
    the suspicion moves a node to Suspect. A node that has not moved since was not
    screened for it (its outcome is then NotScreened, as :func:`report_outcome` says).
    """
    if suspect_pending:
        return False
    if state in SCREENING_STATES:
        return True
    if state_since is None or accepted_at is None:
        return False
    return state_since >= accepted_at.replace(microsecond=0)
