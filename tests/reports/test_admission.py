"""The pure admission rules for SDCReports (sdcguard.domain.reports)."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest
from pydantic import ValidationError

from sdcguard.api.report import SDCReport
from sdcguard.domain.reports import (
    AcceptedReport,
    NodeContext,
    OwnerFacts,
    PodFacts,
    RefusedReport,
    ReportFacts,
    ReportLimits,
    admit_report,
    throttle,
)

NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
LIMITS = ReportLimits()


def report(name: str = "r1", node: str = "gpu-1", job: str | None = "llm", **kw: object):
    base: dict[str, object] = {
        "namespace": "team-a",
        "name": name,
        "node_name": node,
        "pod_name": "llm-0",
        "job_name": job,
        "method": "ShadowAudit",
        "confirmation": "Persistent",
        "step": 120,
        "gpu_uuid": "GPU-9",
        "uid": f"uid-{name}",
    }
    base.update(kw)
    return ReportFacts(**base)  # type: ignore[arg-type]


JOB = OwnerFacts("Job", "llm", "job-uid-1")
POD = PodFacts(
    namespace="team-a",
    name="llm-0",
    node_name="gpu-1",
    job_name="llm",
    uid="pod-uid-0",
    controller=JOB,
    started=True,
    accelerators=True,
)
JOB_KEY = POD.job_key


def pod(**kw: object) -> PodFacts:
    return dataclasses.replace(POD, **kw)  # type: ignore[arg-type]


def accepted(name: str, node: str, ago_min: float, job: str = JOB_KEY, ns: str = "team-a"):
    return AcceptedReport(ns, name, job, node, NOW - dt.timedelta(minutes=ago_min), f"uid-{name}")


def test_a_report_from_the_pod_on_that_node_marks_it_suspect() -> None:
    known = NodeContext(devices=frozenset({"gpu-9"}))
    d = admit_report(report(), POD, [], LIMITS, NOW, node=known)
    assert d.accepted and d.reason == "Accepted"
    assert d.suspect_annotation == (
        "SDCReport team-a/r1: ShadowAudit at step 120 on GPU GPU-9 (persistent)"
    )
    assert "quarantined only if the probe confirms" in d.message


@pytest.mark.parametrize(
    ("pod", "reason", "words"),
    [
        (None, "PodNotFound", "does not exist"),
        (pod(node_name="gpu-2"), "NodeMismatch", "runs on node gpu-2"),
        (pod(node_name=None), "NodeMismatch", "is not scheduled"),
        (pod(started=False), "NotStarted", "no container of pod team-a/llm-0 has started"),
        (pod(accelerators=False), "NoAccelerators", "requests no accelerator"),
        (
            pod(job_name="other", controller=OwnerFacts("Job", "other", "job-uid-2")),
            "JobMismatch",
            "belongs to Job team-a/other, not to job llm",
        ),
        # A label is not a Job: without a controlling ownerReference the Pod has no Job.
        (pod(job_name=None, controller=None), "JobMismatch", "belongs to no controller"),
    ],
)
def test_reports_the_pod_does_not_back_are_refused(pod, reason, words) -> None:
    d = admit_report(report(), pod, [], LIMITS, NOW)
    assert not d.accepted and d.reason == reason and words in d.message
    assert d.suspect_annotation is None


def test_a_flood_from_one_job_is_capped() -> None:
    prior = [accepted(f"p{i}", "gpu-1", 20 + i) for i in range(3)]
    d = admit_report(report(), POD, prior, LIMITS, NOW)
    assert (d.accepted, d.reason) == (False, "JobRateLimited")
    # Outside the window they no longer count.
    old = [accepted(f"p{i}", "gpu-1", 61 + i) for i in range(3)]
    assert admit_report(report(), POD, old, LIMITS, NOW).reason == "Accepted"


def test_a_job_that_blames_every_node_is_not_believed() -> None:
    prior = [accepted("a", "gpu-7", 30), accepted("b", "gpu-8", 20)]
    d = admit_report(report(), POD, prior, LIMITS, NOW)
    assert (d.accepted, d.reason) == (False, "TooManyNodes")
    assert "gpu-7, gpu-8" in d.message


def test_namespace_flood_is_capped_across_jobs() -> None:
    prior = [accepted(f"p{i}", f"gpu-{i + 10}", 30, job=f"team-a/Job:j{i}") for i in range(10)]
    d = admit_report(report(), POD, prior, LIMITS, NOW)
    assert (d.accepted, d.reason) == (False, "NamespaceRateLimited")


def test_a_second_report_about_a_fresh_suspect_is_evidence_only() -> None:
    prior = [accepted("x", "gpu-1", 3, job="team-b/other", ns="team-b")]
    d = admit_report(report(), POD, prior, LIMITS, NOW)
    assert d.accepted and d.reason == "AlreadySuspected" and d.suspect_annotation is None
    later = [accepted("x", "gpu-1", 11, job="team-b/other", ns="team-b")]
    assert admit_report(report(), POD, later, LIMITS, NOW).suspect_annotation is not None


def test_the_same_report_seen_again_does_not_count_against_itself() -> None:
    """The same report (the same uid) does not count against itself; a report deleted
    and created again under the same name is another report and counts."""
    prior = [accepted("r1", "gpu-1", 1)] * 3
    assert admit_report(report(), POD, prior, LIMITS, NOW).reason == "Accepted"
    recreated = report(uid="uid-r1-again")
    assert admit_report(recreated, POD, prior, LIMITS, NOW).reason == "JobRateLimited"


def test_a_job_created_again_under_its_name_is_another_job_and_a_label_is_no_job() -> None:
    """Caps key jobs by their controller's uid, never by a name: another Job under the
    same name counts apart, and the Job itself stays capped."""
    prior = [accepted(f"p{i}", "gpu-1", 15) for i in range(3)]
    again = pod(controller=OwnerFacts("Job", "llm", "job-uid-new"))
    assert admit_report(report(), again, prior, LIMITS, NOW).reason == "Accepted"
    assert admit_report(report(), POD, prior, LIMITS, NOW).reason == "JobRateLimited"


def test_the_cluster_cap_counts_every_namespace() -> None:
    prior = [
        accepted(f"p{i}", f"gpu-{i + 10}", 30, job=f"ns{i}/Job:j{i}", ns=f"ns{i}")
        for i in range(30)
    ]
    d = admit_report(report(), POD, prior, LIMITS, NOW)
    assert (d.accepted, d.reason) == (False, "ClusterRateLimited")


def test_reports_hold_at_most_their_share_of_a_pool() -> None:
    pool = NodeContext(pool="node.kubernetes.io/instance-type=h100", pool_size=30, pool_held=2)
    assert admit_report(report(), POD, [], LIMITS, NOW, node=pool).reason == "Accepted"
    full = dataclasses.replace(pool, pool_held=3)
    d = admit_report(report(), POD, [], LIMITS, NOW, node=full)
    assert (d.accepted, d.reason) == (False, "PoolShareExceeded")
    assert "3 of the 30 nodes" in d.message and "10%, 3 nodes" in d.message
    # A small pool still lets one node be held.
    small = NodeContext(pool="p", pool_size=4, pool_held=0)
    assert admit_report(report(), POD, [], LIMITS, NOW, node=small).accepted
    assert not admit_report(
        report(), POD, [], LIMITS, NOW, node=dataclasses.replace(small, pool_held=1)
    ).accepted


def test_the_reporting_pod_must_share_the_accused_pods_controller() -> None:
    mine = report(reporter_pod="llm-1", reporter_uid="pod-uid-1")
    rank1 = pod(name="llm-1", uid="pod-uid-1", node_name="gpu-2")
    assert admit_report(mine, POD, [], LIMITS, NOW, reporter=rank1).accepted
    stranger = pod(name="llm-1", uid="pod-uid-1", controller=OwnerFacts("Job", "x", "job-x"))
    d = admit_report(mine, POD, [], LIMITS, NOW, reporter=stranger)
    assert (d.reason, d.accepted) == ("ReporterMismatch", False)
    assert "a workload reports only its own ranks" in d.message
    assert admit_report(mine, POD, [], LIMITS, NOW, reporter=None).reason == "ReporterMismatch"
    other_uid = dataclasses.replace(rank1, uid="pod-uid-9")
    assert admit_report(mine, POD, [], LIMITS, NOW, reporter=other_uid).reason == (
        "ReporterMismatch"
    )
    # A Pod without a controller may report only itself.
    bare = pod(controller=None, job_name=None)
    itself = report(job=None, reporter_pod="llm-0", reporter_uid="pod-uid-0")
    assert admit_report(itself, bare, [], LIMITS, NOW, reporter=bare).accepted
    assert (
        admit_report(report(job=None, reporter_pod="llm-1"), bare, [], LIMITS, NOW, reporter=rank1)
    ).reason == "ReporterMismatch"


def test_a_gpu_uuid_the_node_does_not_have_is_refused() -> None:
    known = NodeContext(devices=frozenset({"gpu-9", "gpu-10"}))
    assert admit_report(report(), POD, [], LIMITS, NOW, node=known).accepted
    d = admit_report(report(gpu_uuid="GPU-77"), POD, [], LIMITS, NOW, node=known)
    assert (d.accepted, d.reason) == (False, "UnknownDevice")
    # Unknown devices: kept, and said to be unverified.
    d = admit_report(report(), POD, [], LIMITS, NOW)
    assert "on GPU GPU-9 (unverified)" in (d.suspect_annotation or "")


def test_report_text_is_cleaned_before_annotations_and_events() -> None:
    evil = "GPU-9\x1b[2J\x1b]0;owned\x07\u202e\n" + "x" * 500
    d = admit_report(report(gpu_uuid=evil), POD, [], LIMITS, NOW)
    for text in (d.suspect_annotation or "", d.message):
        assert not any(ch in text for ch in "\x1b\x07\u202e\n"), text
    assert len(d.suspect_annotation or "") < 200


def test_refused_reports_are_throttled_per_reporter_namespace_and_cluster() -> None:
    mine = report(name="r9", reporter_pod="llm-1", reporter_uid="pod-uid-1")
    refused = [
        RefusedReport(f"k{i}", "team-a", mine.reporter_key, NOW - dt.timedelta(minutes=5))
        for i in range(5)
    ]
    d = throttle(mine, refused, LIMITS, NOW)
    assert d is not None and d.reason == "Throttled" and "reporter pod-uid:pod-uid-1" in d.message
    assert throttle(mine, refused[:4], LIMITS, NOW) is None
    old = [dataclasses.replace(r, refused_at=NOW - dt.timedelta(hours=2)) for r in refused]
    assert throttle(mine, old, LIMITS, NOW) is None
    others = [RefusedReport(f"n{i}", "team-a", f"pod:{i}", NOW) for i in range(20)]
    d = throttle(mine, others, LIMITS, NOW)
    assert d is not None and "namespace team-a" in d.message
    elsewhere = [RefusedReport(f"c{i}", f"ns{i}", f"pod:{i}", NOW) for i in range(100)]
    d = throttle(mine, elsewhere, LIMITS, NOW)
    assert d is not None and "the cluster" in d.message


def _body(**spec: object) -> dict[str, object]:
    base: dict[str, object] = {
        "nodeName": "gpu-1",
        "podName": "llm-0",
        "step": 3,
        "method": "ShadowAudit",
    }
    base.update(spec)
    return {"metadata": {"name": "r", "namespace": "team-a"}, "spec": base}


@pytest.mark.parametrize(
    "spec",
    [
        {"detail": "x" * 1025},
        {"evidence": [{"name": f"k{i}", "value": "v"} for i in range(17)]},
        {"evidence": [{"name": "k", "value": "v" * 257}]},
        {"evidence": [{"name": "bad key!", "value": "v"}]},
        {"method": "Astrology"},
        {"nodeName": "Not_A_Node"},
        {"step": -1},
    ],
)
def test_oversized_or_malformed_reports_do_not_validate(spec) -> None:
    with pytest.raises(ValidationError):
        SDCReport.model_validate(_body(**spec))


def test_history_lists_reports_about_the_node_with_gpu_and_verdict() -> None:
    from sdcguard.cli.commands import history_entries

    report_obj = {
        "metadata": {"name": "llm-s7-r1", "namespace": "team-a"},
        "spec": {
            "nodeName": "gpu-1",
            "podName": "llm-1",
            "jobName": "llm",
            "gpuUUID": "GPU-9",
            "method": "ShadowAudit",
            "confirmation": "Persistent",
            "step": 7,
            "observedAt": "2026-03-01T12:00:00Z",
        },
        "status": {"phase": "Accepted", "reason": "Accepted"},
    }
    (entry,) = history_entries([], [], [], [SDCReport.model_validate(report_obj)])
    assert entry["kind"] == "SDCReport" and entry["name"] == "team-a/llm-s7-r1"
    assert entry["detail"] == (
        "ShadowAudit at step 7 (Persistent) on GPU GPU-9, job llm: Accepted [Accepted]"
    )
    report_obj["status"] = {"phase": "Accepted", "reason": "Accepted", "outcome": "Confirmed"}
    (entry,) = history_entries([], [], [], [SDCReport.model_validate(report_obj)])
    assert entry["detail"].endswith("job llm: Accepted [Accepted], Confirmed")
    assert entry["outcome"] == "Confirmed"


# ---------------------------------------------------------------- outcomes


@pytest.mark.parametrize(
    ("steps", "outcome"),
    [
        # (state label, suspect request pending) as the node's events show them
        ([("Qualified", True), ("Suspect", False), ("Quarantined", False)], "Confirmed"),
        ([("Qualified", True), ("Suspect", False), ("Qualified", False)], "Cleared"),
        ([("Suspect", False), ("Repairing", False)], "Confirmed"),
        ([("Qualified", True), ("Quarantined", False)], "NotScreened"),
        ([("Qualified", True), ("Qualified", False)], "NotScreened"),
        ([("Qualified", True), ("Qualified", True)], None),
        ([("Qualified", True), ("Suspect", False), ("Testing", False)], None),
    ],
)
def test_an_accepted_report_learns_what_became_of_its_node(steps, outcome) -> None:
    from sdcguard.domain.reports import report_outcome

    screened, found = False, None
    for state, pending in steps:
        assert found is None, "concluded before the last event"
        screened, found = report_outcome("gpu-1", state, pending, screened)
    assert (found.outcome if found else None) == outcome
    if found is not None:
        assert "gpu-1" in found.message
        assert found.warning == (outcome == "Confirmed")


AT = dt.datetime(2026, 3, 1, 12, 0, 0, 400_000, tzinfo=dt.UTC)
"""When a report was accepted (the API server keeps seconds: state-since has none)."""


@pytest.mark.parametrize(
    ("state", "since_s", "pending", "screened", "outcome"),
    [
        # Confirmed, or cleared, while no operator watched: the node moved after the report.
        ("Quarantined", 40, False, True, "Confirmed"),
        ("Repairing", 90, False, True, "Confirmed"),
        ("Qualified", 60, False, True, "Cleared"),
        # The same second as the acceptance counts as after it.
        ("Qualified", 0, False, True, "Cleared"),
        # Still screening: taken for the report, the outcome comes later.
        ("Testing", -600, False, True, None),
        ("Suspect", 5, False, True, None),
        # The suspicion still waits on the node: not screened yet, whatever the state says.
        ("Qualified", -600, True, False, None),
        ("Qualified", 60, True, False, None),
        # Nothing moved since the report: it was not screened for it.
        ("Quarantined", -600, False, False, "NotScreened"),
        ("Qualified", -1, False, False, "NotScreened"),
        ("Qualified", None, False, False, "NotScreened"),
    ],
)
def test_a_report_found_after_a_restart_learns_its_outcome_from_the_node_record(
    state, since_s, pending, screened, outcome
) -> None:
    from sdcguard.domain.reports import report_outcome, screened_since_acceptance

    since = None if since_s is None else AT.replace(microsecond=0) + dt.timedelta(seconds=since_s)
    found = screened_since_acceptance(state, since, pending, AT)
    assert found == screened
    _, concluded = report_outcome("gpu-1", state, pending, found)
    assert (concluded.outcome if concluded else None) == outcome


def test_a_pods_job_is_its_controlling_owner_and_its_start_its_container_status() -> None:
    from sdcguard.adapters.reports import pod_facts

    body = {
        "metadata": {
            "namespace": "team-a",
            "name": "llm-0",
            "uid": "pod-uid-0",
            "labels": {"batch.kubernetes.io/job-name": "llm"},
            "ownerReferences": [
                {"kind": "Job", "name": "other", "uid": "u-2"},  # not the controller
                {"kind": "Job", "name": "llm", "uid": "job-uid-1", "controller": True},
            ],
        },
        "spec": {
            "nodeName": "gpu-1",
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
        "status": {"containerStatuses": [{"name": "c", "started": True}]},
    }
    assert pod_facts(body) == POD
    labelled = {**body, "metadata": {**body["metadata"], "ownerReferences": []}}
    facts = pod_facts(labelled)
    assert (facts.job_name, facts.controller) == (None, None)  # a label is not a Job
    waiting = {**body, "status": {"containerStatuses": [{"state": {"waiting": {}}}]}}
    assert not pod_facts(waiting).started
    ran = {
        "containerStatuses": [{"started": False, "lastState": {"terminated": {"startedAt": "t"}}}]
    }
    assert pod_facts({**body, "status": ran}).started
    cpu = {**body, "spec": {"nodeName": "gpu-1", "containers": [{"name": "c"}]}}
    assert not pod_facts(cpu).accelerators
    claimed = {**cpu, "spec": {**cpu["spec"], "resourceClaims": [{"name": "gpu"}]}}
    assert pod_facts(claimed).accelerators
    mig = {"limits": {"nvidia.com/mig-1g.10gb": "1"}}
    sliced = {**cpu, "spec": {**cpu["spec"], "containers": [{"name": "c", "resources": mig}]}}
    assert pod_facts(sliced).accelerators
