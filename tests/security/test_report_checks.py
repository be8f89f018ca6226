"""A reporting Pod (trust model row "a reporting Pod"): what the operator checks of a
report the admission policy let through, on the real API server.

Each attack creates the objects a tenant can create in its own namespace (bare Pods,
labels, reports deleted and created again) and lets the operator's report admission
(:class:`sdcguard.adapters.reports.ReportAdmission`, as the operator runs it) read
them from the API server and decide: a report is believed only for a Pod that ran
on the node (a started container), requests accelerators and is its Job's by its
controlling ownerReference, about a GPU the node has; caps count by uid and hold
at most a share of a pool; refusals are throttled; report text reaches the node's
annotation and Events cleaned.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from sdcguard.adapters.kube import KubeWriter
from sdcguard.adapters.reports import ReportAdmission
from sdcguard.domain.reports import ReportDecision, ReportLimits
from sdcguard.metrics import Metrics
from tests.reports.jobs import held_job

pytestmark = pytest.mark.cluster

GROUP, VERSION, PLURAL = "sdcguard.dev", "v1alpha1", "sdcreports"
GPU = {"limits": {"nvidia.com/gpu": "1"}}
STARTED = {
    "phase": "Running",
    "containerStatuses": [
        {
            "name": "train",
            "image": "example.invalid/train:1",
            "imageID": "",
            "ready": True,
            "restartCount": 0,
            "started": True,
            "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
        }
    ],
}


@dataclass
class Tenant:
    api: client.ApiClient
    namespace: str
    nodes: list[str]
    job_uid: str

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    def pod(
        self,
        name: str,
        node: str,
        *,
        owned: bool = True,
        gpu: bool = True,
        started: bool = True,
        labels: dict[str, str] | None = None,
    ) -> None:
        meta: dict[str, Any] = {"name": name, "labels": labels or {}}
        if owned:
            meta["ownerReferences"] = [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": "llm",
                    "uid": self.job_uid,
                    "controller": True,
                }
            ]
        container: dict[str, Any] = {"name": "train", "image": "example.invalid/train:1"}
        if gpu:
            container["resources"] = GPU
        self.core.create_namespaced_pod(
            self.namespace,
            {"metadata": meta, "spec": {"nodeName": node, "containers": [container]}},
        )
        if started:
            self.core.patch_namespaced_pod_status(name, self.namespace, {"status": STARTED})

    def report(self, name: str, pod: str, node: str, **spec: Any) -> dict[str, Any]:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SDCReport",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {
                "nodeName": node,
                "podName": pod,
                "jobName": "llm",
                "step": 10,
                "method": "ShadowAudit",
                **spec,
            },
        }
        custom = client.CustomObjectsApi(self.api)
        made: dict[str, Any] = custom.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, body
        )
        return made

    def delete_report(self, name: str) -> None:
        client.CustomObjectsApi(self.api).delete_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name
        )

    def status(self, name: str) -> dict[str, Any]:
        got = client.CustomObjectsApi(self.api).get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name
        )
        return dict(got.get("status") or {})

    def suspect(self, node: str) -> str | None:
        notes = self.core.read_node(node).metadata.annotations or {}
        return notes.get("sdcguard.dev/suspect")

    def events(self, name: str) -> list[str]:
        listed = self.core.list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={name}"
        )
        return [f"{e.reason}: {e.message}" for e in listed.items]


@pytest.fixture
def tenant(api_client: client.ApiClient, crds: None) -> Iterator[Tenant]:
    core, batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
    suffix = uuid.uuid4().hex[:6]
    ns = f"sec-rep-{suffix}"
    nodes = [f"sec-rep-{suffix}-{i}" for i in range(3)]
    for node in nodes:
        core.create_node({"metadata": {"name": node}})
    core.create_namespace({"metadata": {"name": ns}})
    job = batch.create_namespaced_job(ns, held_job("llm"))
    yield Tenant(api_client, ns, nodes, job.metadata.uid)
    core.delete_namespace(ns)
    for node in nodes:
        try:
            core.delete_node(node)
        except ApiException as exc:
            if exc.status != 404:
                raise


def _admission(t: Tenant, limits: ReportLimits | None = None, **kw: Any) -> ReportAdmission:
    return ReportAdmission(KubeWriter(api=t.api, metrics=Metrics()), limits, **kw)


def _decide(admission: ReportAdmission, body: dict[str, Any]) -> ReportDecision:
    decision = admission.handle(body, dt.datetime.now(dt.UTC))
    assert decision is not None
    return decision


def test_a_bare_pod_that_never_ran_accuses_nobody(tenant: Tenant) -> None:
    """The attack the review found: a Pod created with spec.nodeName (it never ran) and
    a Job's label, then a report naming it."""
    t, node = tenant, tenant.nodes[0]
    t.pod("ghost", node, owned=False, started=False, labels={"batch.kubernetes.io/job-name": "llm"})
    admission = _admission(t)
    decision = _decide(admission, t.report("r-ghost", "ghost", node))
    assert (decision.accepted, decision.reason) == (False, "NotStarted")
    status = t.status("r-ghost")
    assert status["phase"] == "Refused" and status["reason"] == "NotStarted"
    assert any("SDCReportRefused: refused (NotStarted)" in e for e in t.events("r-ghost"))
    assert t.suspect(node) is None

    # Started, but computing nothing on the node's devices.
    t.pod("cpu-only", node, gpu=False)
    decision = _decide(admission, t.report("r-cpu", "cpu-only", node))
    assert (decision.accepted, decision.reason) == (False, "NoAccelerators")

    # Started, on a GPU, labelled as the Job's rank but not owned by the Job.
    t.pod("labelled", node, owned=False, labels={"batch.kubernetes.io/job-name": "llm"})
    decision = _decide(admission, t.report("r-label", "labelled", node))
    assert (decision.accepted, decision.reason) == (False, "JobMismatch")
    assert "ownerReferences" in decision.message
    assert t.suspect(node) is None

    # The Job's own rank, which ran on a GPU there: believed.
    t.pod("rank-0", node)
    decision = _decide(admission, t.report("r-real", "rank-0", node))
    assert (decision.accepted, decision.reason) == (True, "Accepted")
    assert (t.suspect(node) or "").startswith(f"SDCReport {t.namespace}/r-real:")
    assert t.status("r-real")["countedAgainst"] == f"{t.namespace}/Job:{t.job_uid}"


def test_a_reporting_pod_of_another_controller_cannot_accuse(tenant: Tenant) -> None:
    t, node = tenant, tenant.nodes[0]
    t.pod("rank-0", node)
    t.pod("outsider", tenant.nodes[1], owned=False)
    outsider_uid = t.core.read_namespaced_pod("outsider", t.namespace).metadata.uid
    reporter = {"podName": "outsider", "podUID": outsider_uid, "serviceAccount": "default"}
    decision = _decide(_admission(t), t.report("r-out", "rank-0", node, reporter=reporter))
    assert (decision.accepted, decision.reason) == (False, "ReporterMismatch")
    assert t.suspect(node) is None


def test_deleting_and_recreating_a_report_does_not_reset_the_caps(tenant: Tenant) -> None:
    """The review accepted 30 of 30 nodes by re-creating one report under its name."""
    t = tenant
    limits = replace(ReportLimits(), per_job=1, node_window=dt.timedelta(seconds=1))
    admission = _admission(t, limits)
    t.pod("rank-0", t.nodes[0])
    t.pod("rank-1", t.nodes[1])
    assert _decide(admission, t.report("again", "rank-0", t.nodes[0])).accepted
    t.delete_report("again")
    decision = _decide(admission, t.report("again", "rank-1", t.nodes[1]))
    assert (decision.accepted, decision.reason) == (False, "JobRateLimited")
    assert t.suspect(t.nodes[1]) is None


def test_reports_hold_at_most_a_share_of_the_pool(tenant: Tenant) -> None:
    t = tenant
    limits = replace(ReportLimits(), pool_share=0.1)
    pool = {n: ("sec-pool", 5) for n in t.nodes}  # a pool of 5: one node may be held
    t.pod("rank-0", t.nodes[0])
    t.pod("rank-1", t.nodes[1])
    admission = _admission(t, limits, pool_of=pool.get)
    assert _decide(admission, t.report("p0", "rank-0", t.nodes[0])).accepted
    decision = _decide(admission, t.report("p1", "rank-1", t.nodes[1]))
    assert (decision.accepted, decision.reason) == (False, "PoolShareExceeded")
    assert t.suspect(t.nodes[1]) is None


def test_a_gpu_the_node_does_not_have_is_refused(tenant: Tenant) -> None:
    t, node = tenant, tenant.nodes[0]
    t.pod("rank-0", node)
    known = {node: frozenset({"gpu-1111"})}
    admission = _admission(t, devices=lambda n: known.get(n, frozenset()))
    decision = _decide(admission, t.report("g1", "rank-0", node, gpuUUID="GPU-9999"))
    assert (decision.accepted, decision.reason) == (False, "UnknownDevice")
    assert _decide(admission, t.report("g2", "rank-0", node, gpuUUID="GPU-1111")).accepted


def test_report_text_reaches_the_node_and_events_cleaned(tenant: Tenant) -> None:
    t, node = tenant, tenant.nodes[0]
    t.pod("rank-0", node)
    evil = "GPU-1\x1b[2J\x1b]0;pwned\x07\u202eevil\r\nforged line"
    decision = _decide(_admission(t), t.report("txt", "rank-0", node, gpuUUID=evil))
    assert decision.accepted
    shown = [t.suspect(node) or "", *t.events("txt")]
    shown += [e.message for e in t.core.list_namespaced_event("default").items if e.message]
    for text in shown:
        assert not any(ch in text for ch in "\x1b\x07\u202e\r\n"), repr(text)
    assert "GPU-1 [2J ]0;pwned evil forged line" in (t.suspect(node) or "")


def test_refused_reports_are_throttled(tenant: Tenant) -> None:
    t, node = tenant, tenant.nodes[0]
    limits = replace(ReportLimits(), refused_per_reporter=2)
    admission = _admission(t, limits)
    for i in range(2):
        assert _decide(admission, t.report(f"n{i}", "nobody", node)).reason == "PodNotFound"
    decision = _decide(admission, t.report("n2", "nobody", node))
    assert (decision.accepted, decision.reason) == (False, "Throttled")
    assert t.status("n2")["reason"] == "Throttled"
    assert t.events("n2") == []  # refused unread, and no Event for it
