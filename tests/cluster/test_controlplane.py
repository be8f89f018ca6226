"""The local control plane is real: scheduler, authorizers, CRD validation, teardown."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from sdcdev.cluster.localcluster import ClusterError, LocalCluster, check_port_free
from tests.conftest import _running_pids

HERE = Path(__file__).resolve().parent


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def _gpu_node(core: client.CoreV1Api, name: str, taint: bool) -> None:
    taints = [client.V1Taint(key="example.com/reserved", value="x", effect="NoSchedule")]
    core.create_node(
        client.V1Node(
            metadata=client.V1ObjectMeta(name=name, labels={"sdcguard.test/pool": name}),
            spec=client.V1NodeSpec(taints=taints if taint else None),
        )
    )
    capacity = {"cpu": "16", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "8"}
    core.patch_node_status(
        name,
        {
            "status": {
                "capacity": capacity,
                "allocatable": capacity,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "test",
                        "lastHeartbeatTime": None,
                    }
                ],
            }
        },
    )


def _job(name: str, node_pool: str, tolerate: bool) -> client.V1Job:
    tolerations = [
        client.V1Toleration(key="example.com/reserved", operator="Exists", effect="NoSchedule")
    ]
    return client.V1Job(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1JobSpec(
            backoff_limit=0,
            template=client.V1PodTemplateSpec(
                spec=client.V1PodSpec(
                    restart_policy="Never",
                    automount_service_account_token=False,
                    node_selector={"sdcguard.test/pool": node_pool},
                    tolerations=tolerations if tolerate else None,
                    containers=[
                        client.V1Container(
                            name="probe",
                            image="example.invalid/probe:1",
                            resources=client.V1ResourceRequirements(limits={"nvidia.com/gpu": "8"}),
                        )
                    ],
                )
            ),
        ),
    )


def _job_pod(core: client.CoreV1Api, ns: str, job: str, timeout: float = 30) -> client.V1Pod:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pods = core.list_namespaced_pod(ns, label_selector=f"job-name={job}").items
        if pods:
            return pods[0]
        time.sleep(0.2)
    raise AssertionError(f"the Job controller created no pod for {job} in {timeout}s")


def test_scheduler_binds_tolerating_gpu_job_and_leaves_the_other_pending(api_client) -> None:
    core, batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
    node = _name("gpu-node")
    _gpu_node(core, node, taint=True)
    try:
        batch.create_namespaced_job("default", _job(f"{node}-ok", node, tolerate=True))
        batch.create_namespaced_job("default", _job(f"{node}-no", node, tolerate=False))
        deadline = time.monotonic() + 30
        bound = pending = None
        while time.monotonic() < deadline and not (bound and pending):
            ok = _job_pod(core, "default", f"{node}-ok")
            bound = ok if ok.spec.node_name == node else None
            no = _job_pod(core, "default", f"{node}-no")
            conds = {c.type: c for c in (no.status.conditions or [])}
            sched = conds.get("PodScheduled")
            pending = no if sched is not None and sched.status == "False" else None
            time.sleep(0.3)
        assert bound is not None, "tolerating pod was not bound to the GPU node"
        assert pending is not None, "pod without toleration got no PodScheduled condition"
        cond = next(c for c in pending.status.conditions if c.type == "PodScheduled")
        assert cond.reason == "Unschedulable"
        assert "untolerated taint" in cond.message
        assert pending.spec.node_name is None
    finally:
        for suffix in ("ok", "no"):
            batch.delete_namespaced_job(
                f"{node}-{suffix}", "default", propagation_policy="Background"
            )
        core.delete_node(node)


def test_rbac_is_enforced_for_a_service_account(api_client) -> None:
    core, rbac = client.CoreV1Api(api_client), client.RbacAuthorizationV1Api(api_client)
    sa = _name("reader")
    core.create_namespaced_service_account(
        "default", client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=sa))
    )
    token = core.create_namespaced_service_account_token(
        sa,
        "default",
        client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600)
        ),
    ).status.token
    cfg = client.Configuration()
    cfg.host = api_client.configuration.host
    cfg.ssl_ca_cert = api_client.configuration.ssl_ca_cert
    cfg.api_key = {"authorization": f"Bearer {token}"}
    as_sa = client.CoreV1Api(client.ApiClient(cfg))

    with pytest.raises(ApiException) as denied:
        as_sa.list_node()
    assert denied.value.status == 403
    assert f"system:serviceaccount:default:{sa}" in denied.value.body

    role = _name("node-reader")
    rbac.create_cluster_role(
        client.V1ClusterRole(
            metadata=client.V1ObjectMeta(name=role),
            rules=[client.V1PolicyRule(api_groups=[""], resources=["nodes"], verbs=["list"])],
        )
    )
    rbac.create_cluster_role_binding(
        client.V1ClusterRoleBinding(
            metadata=client.V1ObjectMeta(name=role),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=role
            ),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name=sa, namespace="default")],
        )
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                as_sa.list_node()
                break
            except ApiException as exc:  # RBAC caches settle within a second or so
                if exc.status != 403 or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        rbac.delete_cluster_role_binding(role)
        rbac.delete_cluster_role(role)
        core.delete_namespaced_service_account(sa, "default")


def test_crd_cel_rule_rejects_invalid_object_with_its_message(api_client) -> None:
    ext = client.ApiextensionsV1Api(api_client)
    group = "celtest.sdcguard.dev"
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Cluster",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "properties": {
                                        "min": {"type": "integer"},
                                        "max": {"type": "integer"},
                                    },
                                    "x-kubernetes-validations": [
                                        {
                                            "rule": "self.min <= self.max",
                                            "message": "spec.min must not exceed spec.max",
                                        }
                                    ],
                                }
                            },
                        }
                    },
                }
            ],
        },
    }
    ext.create_custom_resource_definition(crd)
    custom = client.CustomObjectsApi(api_client)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                custom.create_cluster_custom_object(
                    group,
                    "v1",
                    "widgets",
                    {
                        "apiVersion": f"{group}/v1",
                        "kind": "Widget",
                        "metadata": {"name": "ok"},
                        "spec": {"min": 1, "max": 2},
                    },
                )
                break
            except ApiException as exc:  # the new resource takes a moment to be served
                if exc.status != 404 or time.monotonic() > deadline:
                    raise
                time.sleep(0.3)
        with pytest.raises(ApiException) as rejected:
            custom.create_cluster_custom_object(
                group,
                "v1",
                "widgets",
                {
                    "apiVersion": f"{group}/v1",
                    "kind": "Widget",
                    "metadata": {"name": "bad"},
                    "spec": {"min": 3, "max": 2},
                },
            )
        assert rejected.value.status == 422
        assert "spec.min must not exceed spec.max" in rejected.value.body
    finally:
        ext.delete_custom_resource_definition(f"widgets.{group}")


def test_server_reports_its_real_version(api_client) -> None:
    info = client.VersionApi(api_client).get_code()
    assert info.git_version.startswith("v1.") and "master" not in info.git_version
    assert info.major == "1"


def test_teardown_leaves_no_process_behind() -> None:
    c = LocalCluster()
    with c:
        state = str(c.state_dir)
        pids = _running_pids(state)
        assert len(pids) == 4, f"expected etcd, apiserver, kcm, scheduler; got {pids}"
    assert _running_pids(state) == []
    assert not Path(state).exists()


def test_port_in_use_is_a_one_line_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ClusterError) as err:
            check_port_free(port, "kube-apiserver")
    message = str(err.value)
    assert f"port {port}" in message and "already in use" in message
    assert "\n" not in message


def test_missing_go_is_a_one_line_error(tmp_path: Path) -> None:
    env = dict(os.environ, PATH="/usr/bin:/bin", SDCGUARD_CACHE=str(tmp_path))
    proc = subprocess.run(
        ["/bin/bash", str(HERE / "build-binaries.sh")],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: Go is not installed; install Go >= 1.24 (https://go.dev/doc/install) and rerun"
    ]


def test_kubectl_and_helm_are_built_for_the_control_planes_version(cluster: LocalCluster) -> None:
    """kubectl comes from the control plane's own module and version (kubectl supports
    one minor of skew); helm is built against the client-go of the same minor, which
    is also the kubeVersion ``helm template`` assumes without a cluster."""
    server = subprocess.run(
        ["kubectl", "version", "-o", "json"],
        env=cluster.env(),
        capture_output=True,
        text=True,
        check=True,
    )
    versions = json.loads(server.stdout)
    assert versions["clientVersion"]["gitVersion"] == versions["serverVersion"]["gitVersion"]
    major_minor = "v{major}.{minor}".format(**versions["serverVersion"])
    helm = subprocess.run(
        ["helm", "version", "--template", "{{.KubeClientVersion}}"],
        env=cluster.env(),
        capture_output=True,
        text=True,
        check=True,
    )
    assert helm.stdout.strip() == major_minor
