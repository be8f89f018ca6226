"""A training job's report, end to end through the real operator and API server.

The library's reporter creates the SDCReport with the job's own ServiceAccount
token (the Role from the chart README: create in its namespace, nothing on
Nodes). The operator checks the Pod's node, marks the node Suspect, and the
probe decides: here the probe finds SDC, so the node is quarantined. A report
naming a node the Pod never ran on is refused and changes nothing.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sdcdev.cluster.localcluster import LocalCluster
from sdcdev.harness import (
    GROUP,
    VERSION,
    ProbeKubelet,
    create_policy,
    gpu_nodes,
    new_case,
    node_state,
    read_node,
    trusted_baseline,
    wait_for,
)
from sdctrain import Confirmation, Detection, Method
from sdctrain.report import KubeReporter
from tests.reports.jobs import held_job

ROLE_RULES = [
    client.V1PolicyRule(api_groups=[GROUP], resources=["sdcreports"], verbs=["create", "get"])
]


def _job_namespace(api: client.ApiClient, ns: str) -> None:
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    core.create_namespaced_service_account(
        ns, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="trainer"))
    )
    rbac.create_namespaced_role(
        ns, client.V1Role(metadata=client.V1ObjectMeta(name="reporter"), rules=ROLE_RULES)
    )
    rbac.create_namespaced_role_binding(
        ns,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="reporter"),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="Role", name="reporter"
            ),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name="trainer", namespace=ns)],
        ),
    )


def _training_pod(api: client.ApiClient, ns: str, name: str, node: str, job: str) -> None:
    """A rank of Job ``job`` that ran on ``node``: the Job exists (suspended, so its
    controller makes no Pods of its own), and the Pod is the Job's by its controlling
    ownerReference, requests a GPU, is bound to ``node`` and has a started container
    (nobody runs it: its status is written here, as a kubelet would)."""
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    try:
        owner = batch.create_namespaced_job(ns, held_job(job))
    except ApiException as exc:
        if exc.status != 409:
            raise
        owner = batch.read_namespaced_job(job, ns)
    ref = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": job,
        "uid": owner.metadata.uid,
        "controller": True,
    }
    core.create_namespaced_pod(
        ns,
        {
            "metadata": {"name": name, "ownerReferences": [ref]},
            "spec": {
                "nodeName": node,
                "serviceAccountName": "trainer",
                "containers": [
                    {
                        "name": "train",
                        "image": "example.invalid/train:1",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    }
                ],
            },
        },
    )
    started = "2026-01-01T00:00:00Z"
    core.patch_namespaced_pod_status(
        name,
        ns,
        {
            "status": {
                "phase": "Running",
                "containerStatuses": [
                    {
                        "name": "train",
                        "image": "example.invalid/train:1",
                        "imageID": "",
                        "ready": True,
                        "restartCount": 0,
                        "started": True,
                        "state": {"running": {"startedAt": started}},
                    }
                ],
            }
        },
    )


def _end_training_pod(api: client.ApiClient, ns: str, name: str) -> None:
    """The rank stops after its persistent finding (as sdctrain's guard stops the job):
    its GPU is free, so the node is idle for the suspicion screening."""
    finished = "2026-01-01T00:01:00Z"
    client.CoreV1Api(api).patch_namespaced_pod_status(
        name,
        ns,
        {
            "status": {
                "phase": "Failed",
                "containerStatuses": [
                    {
                        "name": "train",
                        "image": "example.invalid/train:1",
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "started": False,
                        "state": {
                            "terminated": {
                                "exitCode": 1,
                                "startedAt": "2026-01-01T00:00:00Z",
                                "finishedAt": finished,
                            }
                        },
                    }
                ],
            }
        },
    )


def _token(api: client.ApiClient, ns: str, path: Path) -> Path:
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
    )
    made = client.CoreV1Api(api).create_namespaced_service_account_token("trainer", ns, request)
    path.write_text(made.status.token)
    return path


def _report(api: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    return client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, ns, "sdcreports", name
    )


def _phase(api: client.ApiClient, ns: str, name: str) -> str | None:
    return (_report(api, ns, name).get("status") or {}).get("phase")


def report_events(api: client.ApiClient, ns: str, name: str) -> dict[str, str]:
    """reason -> message of the Events on SDCReport ``name`` in its namespace."""
    events = client.CoreV1Api(api).list_namespaced_event(
        ns, field_selector=f"involvedObject.kind=SDCReport,involvedObject.name={name}"
    )
    return {e.reason: e.message for e in events.items}


def _detection(node: str, ns: str, job: str, step: int) -> Detection:
    return Detection(
        method=Method.SHADOW_AUDIT,
        step=step,
        rank=1,
        confirmation=Confirmation.PERSISTENT,
        detail=f"shadow audit at step {step}: rank 1 computed wrong gradients",
        node=node,
        pod="train-1",
        namespace=ns,
        job=job,
        gpu_uuid="GPU-test-1",
        evidence=(("auditor", "0"), ("tensors", "0.weight")),
    )


def test_report_marks_the_node_suspect_and_the_probe_confirms(
    api_client: client.ApiClient,
    operator: Any,
    cluster: LocalCluster,
    served: None,
    tmp_path: Path,
) -> None:
    case = new_case()
    sick, healthy = f"rep-{case}", f"rep-ok-{case}"
    ns, job = f"team-{case}", f"train-{case}"
    trusted_baseline(api_client)
    outcomes = {sick: "pass", healthy: "pass"}
    with gpu_nodes(api_client, [sick, healthy], case=case), ProbeKubelet(api_client, outcomes):
        create_policy(api_client, case)
        for n in (sick, healthy):
            wait_for(lambda n=n: node_state(api_client, n) == "Qualified", 90, f"{n} qualified")
        _job_namespace(api_client, ns)
        try:
            _training_pod(api_client, ns, "train-1", sick, job)
            reporter = KubeReporter(
                cluster.server, _token(api_client, ns, tmp_path / "token"), cluster.ca_file
            )

            # A report naming a node the Pod never ran on: refused, nothing else happens.
            forged = reporter.report(_detection(healthy, ns, job, step=5))
            assert forged is not None
            wait_for(lambda: _phase(api_client, ns, forged) == "Refused", 30, "the refusal")
            status = _report(api_client, ns, forged)["status"]
            assert status["reason"] == "NodeMismatch"
            assert f"runs on node {sick}, not on {healthy}" in status["message"]
            assert status["conditions"][0]["type"] == "Accepted"
            assert status["conditions"][0]["status"] == "False"
            notes = read_node(api_client, healthy).metadata.annotations or {}
            assert "sdcguard.dev/suspect" not in notes
            # The job's owner is told, in the job's namespace (the Event follows the status).
            wait_for(
                lambda: "SDCReportRefused" in report_events(api_client, ns, forged),
                30,
                "the Refused Event",
            )
            told = report_events(api_client, ns, forged)
            assert f"refused (NodeMismatch): pod {ns}/train-1 runs on node {sick}" in told.get(
                "SDCReportRefused", ""
            ), told

            # The job's own token may report, but not touch the node itself.
            config = client.Configuration()
            config.host = cluster.server
            config.ssl_ca_cert = str(cluster.ca_file)
            config.api_key = {"authorization": "Bearer " + (tmp_path / "token").read_text()}
            with pytest.raises(ApiException) as denied:
                client.CoreV1Api(client.ApiClient(config)).patch_node(
                    sick, {"metadata": {"annotations": {"sdcguard.dev/suspect": "x"}}}
                )
            assert denied.value.status == 403

            # The real report: accepted, the node becomes Suspect, the probe finds SDC.
            outcomes[sick] = "sdc"
            name = reporter.report(_detection(sick, ns, job, step=7))
            assert name is not None
            wait_for(lambda: _phase(api_client, ns, name) == "Accepted", 30, "acceptance")
            assert _report(api_client, ns, name)["status"]["reason"] == "Accepted"
            _end_training_pod(api_client, ns, "train-1")
            wait_for(lambda: node_state(api_client, sick) == "Quarantined", 120, "quarantine")
            events = (
                client.CoreV1Api(api_client)
                .list_namespaced_event("default", field_selector=f"involvedObject.name={sick}")
                .items
            )
            messages = [e.message for e in events]
            assert any(f"SDCReport {ns}/{name}" in m for m in messages), messages
            # The owner learns the outcome: an Event on the report, and its status.
            wait_for(
                lambda: "SDCReportConfirmed" in report_events(api_client, ns, name),
                30,
                "the Confirmed Event",
            )
            told = report_events(api_client, ns, name)
            assert f"node {sick} marked suspect" in told["SDCReportAccepted"]
            assert (
                f"the probe confirmed the report: node {sick} is Quarantined"
                in told["SDCReportConfirmed"]
            )
            assert _report(api_client, ns, name)["status"]["outcome"] == "Confirmed"
            assert node_state(api_client, healthy) == "Qualified"
        finally:
            with contextlib.suppress(ApiException):
                client.CoreV1Api(api_client).delete_namespace(ns)


def test_a_report_the_probe_does_not_confirm_is_cleared_and_the_owner_told(
    api_client: client.ApiClient,
    operator: Any,
    cluster: LocalCluster,
    served: None,
    tmp_path: Path,
) -> None:
    case = new_case()
    node, ns, job = f"clr-{case}", f"clr-{case}", f"train-{case}"
    trusted_baseline(api_client)
    with gpu_nodes(api_client, [node], case=case), ProbeKubelet(api_client, {node: "pass"}):
        create_policy(api_client, case)
        wait_for(lambda: node_state(api_client, node) == "Qualified", 90, "qualified")
        _job_namespace(api_client, ns)
        try:
            _training_pod(api_client, ns, "train-1", node, job)
            reporter = KubeReporter(
                cluster.server, _token(api_client, ns, tmp_path / "token"), cluster.ca_file
            )
            name = reporter.report(_detection(node, ns, job, step=3))
            assert name is not None
            wait_for(lambda: _phase(api_client, ns, name) == "Accepted", 30, "acceptance")
            _end_training_pod(api_client, ns, "train-1")
            wait_for(
                lambda: "SDCReportCleared" in report_events(api_client, ns, name),
                120,
                "the Cleared Event",
            )
            told = report_events(api_client, ns, name)
            assert f"node {node} passed the probe's re-test" in told["SDCReportCleared"]
            assert "SDCReportConfirmed" not in told
            status = _report(api_client, ns, name)["status"]
            assert status["outcome"] == "Cleared" and status["concludedAt"]
            assert node_state(api_client, node) == "Qualified"
        finally:
            with contextlib.suppress(ApiException):
                client.CoreV1Api(api_client).delete_namespace(ns)
