"""Admitting a training job's SDCReport: believe it, cap it, or refuse it.

Pure: the report, the Pod it names (as read from the API server), the reports
accepted before and the time come in; a decision goes out. An accepted report
becomes the node's ``sdcguard.dev/suspect`` request, which the lifecycle turns
into the Suspect state, screened by the probe when the node is next idle: a
report alone never quarantines a node.

Refused, each with its own reason:

* ``PodNotFound``: the named Pod does not exist in the report's namespace;
* ``NodeMismatch``: the Pod never ran on the reported node (or is not scheduled);
* ``JobMismatch``: the Pod does not belong to the reported Job;
* ``JobRateLimited``: the job already had ``per_job`` reports accepted in the window;
* ``TooManyNodes``: the job already blamed ``max_nodes_per_job`` other nodes in the
  window (a job that blames every node it touches is not believed);
* ``NamespaceRateLimited``: the namespace had ``per_namespace`` accepted in the window.

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

ACCEPTED, ALREADY_SUSPECTED = "Accepted", "AlreadySuspected"
#: Longest value written into the node's suspect annotation.
MAX_ANNOTATION = 512


@dataclass(frozen=True)
class ReportLimits:
    """Caps on what reports may do."""

    window: dt.timedelta = dt.timedelta(hours=1)
    per_job: int = 3
    max_nodes_per_job: int = 2
    per_namespace: int = 10
    node_window: dt.timedelta = dt.timedelta(minutes=10)


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

    @property
    def job_key(self) -> str:
        """Rate limits count per Job, or per Pod for a Pod without a Job."""
        return f"{self.namespace}/{self.job_name or 'pod:' + self.pod_name}"


@dataclass(frozen=True)
class PodFacts:
    """The Pod the report names, as the API server has it."""

    namespace: str
    name: str
    node_name: str | None
    job_name: str | None


@dataclass(frozen=True)
class AcceptedReport:
    """A report accepted earlier (kept in memory and rebuilt from statuses on restart)."""

    namespace: str
    name: str
    job_key: str
    node_name: str
    accepted_at: dt.datetime


@dataclass(frozen=True)
class ReportDecision:
    """What to do with one report."""

    accepted: bool
    reason: str
    message: str
    suspect_annotation: str | None = None
    """The value of ``sdcguard.dev/suspect`` to set on the node; None: write nothing."""


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


def admit_report(
    report: ReportFacts,
    pod: PodFacts | None,
    accepted: Iterable[AcceptedReport],
    limits: ReportLimits,
    now: dt.datetime,
) -> ReportDecision:
    """Decide one report (see the module docstring for the rules, in their order)."""
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
    if report.job_name is not None and pod.job_name != report.job_name:
        return _refuse(
            "JobMismatch",
            f"pod {where} belongs to job {pod.job_name or '(none)'}, not {report.job_name}",
        )
    recent = [a for a in accepted if now - a.accepted_at < limits.window and a.name != report.name]
    by_job = [a for a in recent if a.job_key == report.job_key]
    span = _span(limits.window)
    if len(by_job) >= limits.per_job:
        return _refuse(
            "JobRateLimited",
            f"job {report.job_key} already had {len(by_job)} reports accepted within {span} "
            f"(limit {limits.per_job})",
        )
    blamed = {a.node_name for a in by_job}
    if report.node_name not in blamed and len(blamed) >= limits.max_nodes_per_job:
        return _refuse(
            "TooManyNodes",
            f"job {report.job_key} already blamed {len(blamed)} other nodes within {span} "
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
    what = f"{report.method} at step {report.step}"
    gpu = f" on GPU {report.gpu_uuid}" if report.gpu_uuid else ""
    earlier = [
        a
        for a in recent
        if a.node_name == report.node_name and now - a.accepted_at < limits.node_window
    ]
    if earlier:
        return ReportDecision(
            True,
            ALREADY_SUSPECTED,
            f"{what}{gpu} recorded as evidence; node {report.node_name} was reported by "
            f"{earlier[-1].namespace}/{earlier[-1].name} within {_span(limits.node_window)}",
        )
    annotation = (
        f"SDCReport {report.namespace}/{report.name}: {what}{gpu} ({report.confirmation.lower()})"
    )[:MAX_ANNOTATION]
    return ReportDecision(
        True,
        ACCEPTED,
        f"node {report.node_name} marked suspect: {what}{gpu} ({report.confirmation}); "
        "it is screened when next idle and quarantined only if the probe confirms",
        suspect_annotation=annotation,
    )


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
