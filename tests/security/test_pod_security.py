"""Whoever holds the operator's token (trust model row "the operator's credentials"):
it may create Jobs in the release namespace, so without Pod Security there it runs
privileged Pods. The chart cannot label a namespace it does not own (helm creates it
unlabelled with --create-namespace), so its install notes check the namespace and
print the command; these tests run that command as printed, then show a privileged
Job's Pod refused while the probe Job built by sdcguard is admitted, on the real API
server with the chart's own RBAC and a real token of its ServiceAccount."""

from __future__ import annotations

import shlex
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config

from sdcdev.cluster.localcluster import LocalCluster
from sdcguard.builders.probe_job import ProbeJobRequest, build_probe_job
from tests.chart.helm import CHART, run_helm
from tests.security.chart_objects import applied, chart_objects, kubectl, until

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def namespace(cluster: LocalCluster, crds: None) -> Iterator[str]:
    name = f"sec-psa-{uuid.uuid4().hex[:6]}"
    kubectl(cluster, "create", "namespace", name)
    yield name
    kubectl(cluster, "delete", "namespace", name, "--wait=false")


def _install_notes(cluster: LocalCluster, release: str, namespace: str) -> str:
    proc = run_helm(
        "install",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--dry-run=server",
        env=cluster.env(),
    )
    return proc.stdout


def test_the_install_notes_label_the_namespace_restricted(
    cluster: LocalCluster, namespace: str
) -> None:
    notes = _install_notes(cluster, "sdcguard", namespace)
    assert f'namespace {namespace} does not enforce Pod Security "restricted"' in notes
    (command,) = [
        line.strip() for line in notes.splitlines() if line.strip().startswith("kubectl label")
    ]
    kubectl(cluster, *shlex.split(command)[1:])
    labels = (
        client.CoreV1Api(config.new_client_from_config(str(cluster.kubeconfig)))
        .read_namespace(namespace)
        .metadata.labels
    )
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    assert "does not enforce Pod Security" not in _install_notes(cluster, "sdcguard", namespace)


def _operator_api(
    cluster: LocalCluster, namespace: str, admin: client.ApiClient
) -> client.ApiClient:
    token = client.CoreV1Api(admin).create_namespaced_service_account_token(
        "sdcguard", namespace, {"spec": {"expirationSeconds": 600}}
    )
    configuration = client.Configuration()
    configuration.host = cluster.server
    configuration.ssl_ca_cert = str(cluster.ca_file)
    configuration.api_key = {"authorization": "Bearer " + token.status.token}
    return client.ApiClient(configuration)


def _privileged_job(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "hostPID": True,
                    "containers": [
                        {
                            "name": "root",
                            "image": "example.invalid/shell:1",
                            "securityContext": {"privileged": True},
                            "volumeMounts": [{"name": "host", "mountPath": "/host"}],
                        }
                    ],
                    "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
                }
            },
        },
    }


def _probe_job(namespace: str) -> dict[str, Any]:
    job = build_probe_job(
        ProbeJobRequest(
            test_name=f"psa-{uuid.uuid4().hex[:6]}",
            test_uid=str(uuid.uuid4()),
            node_name="gpu-node-1",
            namespace=namespace,
            image="example.invalid/sdcprobe:test",
            checks=("compute",),
            budget_seconds=10,
            active_deadline_seconds=600,
            ttl_seconds_after_finished=600,
            accelerators=(("nvidia.com/gpu", 8),),
            tolerated_taint_keys=("sdcguard.dev/testing",),
        )
    )
    # Its owner, an SDCTest, does not exist here: the garbage collector would delete it.
    job["metadata"].pop("ownerReferences", None)
    return job


def _pods_of(core: client.CoreV1Api, namespace: str, job: str) -> list[str]:
    pods = core.list_namespaced_pod(namespace, label_selector=f"job-name={job}").items
    return [p.metadata.name for p in pods]


def _pod_security_refusal(core: client.CoreV1Api, namespace: str, job: str) -> str | None:
    for event in core.list_namespaced_event(namespace).items:
        if (
            event.involved_object.name == job
            and event.reason == "FailedCreate"
            and "violates PodSecurity" in (event.message or "")
        ):
            return str(event.message)
    return None


def test_the_operators_token_cannot_run_privileged_pods_but_the_probe_runs(
    cluster: LocalCluster, namespace: str
) -> None:
    admin = config.new_client_from_config(str(cluster.kubeconfig))
    labels = client.CoreV1Api(admin).read_namespace(namespace).metadata.labels or {}
    assert labels.get("pod-security.kubernetes.io/enforce") == "restricted", (
        "run test_the_install_notes_label_the_namespace_restricted first"
    )
    kinds = ("ServiceAccount", "Role", "RoleBinding")
    objects = [
        o
        for o in chart_objects("sdcguard", kinds, namespace=namespace)
        if o["metadata"].get("namespace", namespace) == namespace
    ]
    with applied(cluster, objects):
        as_operator = client.BatchV1Api(_operator_api(cluster, namespace, admin))
        core = client.CoreV1Api(admin)
        as_operator.create_namespaced_job(namespace, _privileged_job("escape"))
        probe = _probe_job(namespace)
        as_operator.create_namespaced_job(namespace, probe)
        probe_name = probe["metadata"]["name"]

        until(lambda: _pods_of(core, namespace, probe_name), 60, "the probe Job's Pod")
        refusal = until(
            lambda: _pod_security_refusal(core, namespace, "escape"),
            60,
            "the Job controller to be refused the privileged Pod",
        )
        assert 'violates PodSecurity "restricted:latest"' in refusal
        assert "privileged" in refusal and "hostPath" in refusal
        assert _pods_of(core, namespace, "escape") == []


def test_the_charts_own_pods_meet_restricted(cluster: LocalCluster, namespace: str) -> None:
    """The operator and the helm test Pod run in the labelled namespace too."""
    admin = client.CoreV1Api(config.new_client_from_config(str(cluster.kubeconfig)))
    assert (admin.read_namespace(namespace).metadata.labels or {}).get(
        "pod-security.kubernetes.io/enforce"
    ) == "restricted"
    workloads = chart_objects("sdcguard", ("Deployment", "Job", "Pod"), namespace=namespace)
    assert {w["kind"] for w in workloads} >= {"Deployment"}
    accounts = chart_objects("sdcguard", ("ServiceAccount",), namespace=namespace)
    with applied(cluster, accounts):
        for workload in workloads:
            template = workload if workload["kind"] == "Pod" else workload["spec"]["template"]
            name = f"psa-{workload['kind'].lower()}-{workload['metadata']['name']}"
            pod = {"metadata": {"name": name}, "spec": template["spec"]}
            # Server-side dry run: admission (Pod Security included) runs, nothing is kept.
            admin.create_namespaced_pod(namespace, pod, dry_run="All")


def test_the_operators_token_reads_only_the_sink_secrets(
    cluster: LocalCluster, namespace: str
) -> None:
    """``get secrets`` is narrowed to the Secrets the chart's ticket sinks name."""
    values = {
        "policy": {
            "repair": {
                "ticketSinks": {
                    "ops": {
                        "type": "webhook",
                        "url": "https://repair.example.com/hook",
                        "secretRef": {"name": "ops-webhook", "key": "hmac"},
                    }
                }
            }
        }
    }
    kinds = ("ServiceAccount", "Role", "RoleBinding")
    objects = [
        o
        for o in chart_objects("sdcguard", kinds, values, namespace=namespace)
        if o["metadata"].get("namespace", namespace) == namespace
    ]
    operator = f"system:serviceaccount:{namespace}:sdcguard"

    def can_get(secret: str) -> str:
        proc = subprocess.run(
            [
                "kubectl",
                "auth",
                "can-i",
                "get",
                f"secret/{secret}",
                "-n",
                namespace,
                "--as",
                operator,
            ],
            capture_output=True,
            text=True,
            env=cluster.env(),
            check=False,
        )
        return proc.stdout.strip()

    with applied(cluster, objects):
        until(lambda: can_get("ops-webhook") == "yes", 30, "the chart's Role to apply")
        assert can_get("some-other-secret") == "no"
