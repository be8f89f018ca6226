"""A tenant who may create SDCReports (trust model row "a workload or tenant in a
reporting namespace"): without the chart's policy anyone with ``create sdcreports``
accuses any node under any name; with it, a report is admitted only from a Pod's
bound ServiceAccount token, in its own namespace, naming itself in the immutable
``spec.reporter``. All on the real API server with real TokenRequest tokens.

Not covered here (the operator's side, not this policy's): that the accused Pod ran
on the accused node and belongs with the reporting Pod."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from sdcdev.cluster.localcluster import LocalCluster
from sdctrain.report import reporter_from_token
from tests.security.chart_objects import (
    ADMISSION_KINDS,
    applied,
    chart_objects,
    client_certificate,
    until,
)

pytestmark = pytest.mark.cluster

GROUP, VERSION, PLURAL = "sdcguard.dev", "v1alpha1", "sdcreports"


@dataclass
class Tenancy:
    namespace: str
    other_namespace: str
    node: str
    pod: str
    pod_uid: str
    admin: client.ApiClient


def _api_with(cluster: LocalCluster, **auth: str) -> client.ApiClient:
    configuration = client.Configuration()
    configuration.host = cluster.server
    configuration.ssl_ca_cert = str(cluster.ca_file)
    if "token" in auth:
        configuration.api_key = {"authorization": "Bearer " + auth["token"]}
    else:
        configuration.cert_file, configuration.key_file = auth["cert"], auth["key"]
    return client.ApiClient(configuration)


@pytest.fixture(scope="module")
def tenancy(cluster: LocalCluster, crds: None) -> Iterator[Tenancy]:
    admin = config.new_client_from_config(str(cluster.kubeconfig))
    core, rbac = client.CoreV1Api(admin), client.RbacAuthorizationV1Api(admin)
    suffix = uuid.uuid4().hex[:6]
    ns, other = f"sec-train-{suffix}", f"sec-other-{suffix}"
    node = f"sec-gpu-{suffix}"
    core.create_node({"metadata": {"name": node}})
    for name in (ns, other):
        core.create_namespace({"metadata": {"name": name}})
        core.create_namespaced_service_account(name, {"metadata": {"name": "trainer"}})
        rbac.create_namespaced_role(
            name,
            {
                "metadata": {"name": "reporter"},
                "rules": [
                    {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["create", "get"]}
                ],
            },
        )
        subjects = [
            {"kind": "ServiceAccount", "name": "trainer", "namespace": ns},
            {"kind": "User", "name": "tenant", "apiGroup": "rbac.authorization.k8s.io"},
        ]
        rbac.create_namespaced_role_binding(
            name,
            {
                "metadata": {"name": "reporter"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "reporter",
                },
                "subjects": subjects,
            },
        )
    pod = core.create_namespaced_pod(
        ns,
        {
            "metadata": {"name": "rank-0"},
            "spec": {
                "serviceAccountName": "trainer",
                "nodeName": node,
                "containers": [{"name": "train", "image": "example.invalid/train:1"}],
            },
        },
    )
    yield Tenancy(ns, other, node, "rank-0", pod.metadata.uid, admin)
    for name in (ns, other):
        core.delete_namespace(name)
    core.delete_node(node)


def _report(namespace: str, node: str, reporter: dict[str, Any] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeName": node,
        "podName": "rank-0",
        "step": 10,
        "method": "ShadowAudit",
    }
    if reporter is not None:
        spec["reporter"] = reporter
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SDCReport",
        "metadata": {"generateName": "sec-", "namespace": namespace},
        "spec": spec,
    }


def _create(api: client.ApiClient, namespace: str, body: dict[str, Any]) -> ApiException | None:
    try:
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, body
        )
    except ApiException as exc:
        return exc
    return None


def _token(t: Tenancy, *, bound: bool) -> str:
    spec: dict[str, Any] = {"expirationSeconds": 600}
    if bound:
        spec["boundObjectRef"] = {
            "kind": "Pod",
            "apiVersion": "v1",
            "name": t.pod,
            "uid": t.pod_uid,
        }
    answer = client.CoreV1Api(t.admin).create_namespaced_service_account_token(
        "trainer", t.namespace, {"spec": spec}
    )
    return str(answer.status.token)


def _tenant(cluster: LocalCluster) -> client.ApiClient:
    pki = client_certificate(cluster, "tenant", "tenant", [])
    return _api_with(cluster, cert=str(pki / "tenant.crt"), key=str(pki / "tenant.key"))


def test_without_the_policy_anyone_who_may_create_reports_accuses_any_node(
    cluster: LocalCluster, tenancy: Tenancy
) -> None:
    """The attack: a tenant user, with no Pod at all, files a report naming a Pod."""
    assert (
        _create(_tenant(cluster), tenancy.namespace, _report(tenancy.namespace, tenancy.node, None))
        is None
    )


@pytest.fixture
def report_policy(cluster: LocalCluster) -> Iterator[None]:
    objects = chart_objects(f"sec-{uuid.uuid4().hex[:6]}", ADMISSION_KINDS)
    mine = [o for o in objects if o["metadata"]["name"].endswith("-report-identity")]
    assert len(mine) == 2, [o["metadata"]["name"] for o in objects]
    with applied(cluster, mine):
        yield


def test_the_chart_policy_admits_reports_only_from_the_reporting_pod(
    cluster: LocalCluster, tenancy: Tenancy, report_policy: None
) -> None:
    t = tenancy
    tenant = _tenant(cluster)
    refused = until(
        lambda: _create(tenant, t.namespace, _report(t.namespace, t.node, None)),
        30,
        "the policy to refuse a tenant's report",
    )
    assert refused.status in (403, 422)
    assert (
        "may not create SDCReports" in refused.body and "own ServiceAccount token" in refused.body
    )

    token = _token(t, bound=True)
    pod_token = _api_with(cluster, token=token)
    itself = {
        "podName": t.pod,
        "podUID": t.pod_uid,
        "nodeName": t.node,
        "serviceAccount": "trainer",
    }

    # A ServiceAccount token not bound to a Pod (a CI secret, `kubectl create token`).
    loose = _api_with(cluster, token=_token(t, bound=False))
    exc = _create(loose, t.namespace, _report(t.namespace, t.node, itself))
    assert exc is not None and "may not create SDCReports" in exc.body

    # The Pod's token, claiming another Pod, another node, or no identity at all.
    for claim in (
        {**itself, "podName": "rank-7"},
        {**itself, "nodeName": "some-other-node"},
        {**itself, "podUID": str(uuid.uuid4())},
        {**itself, "serviceAccount": "default"},
        None,
    ):
        exc = _create(pod_token, t.namespace, _report(t.namespace, t.node, claim))
        assert exc is not None and exc.status in (403, 422), f"{claim} was admitted"
        assert "spec.reporter must name the Pod that files the report" in exc.body
        assert f"podName {t.pod}" in exc.body and f"nodeName {t.node}" in exc.body

    # The same token in another namespace where its ServiceAccount may create reports.
    exc = _create(pod_token, t.other_namespace, _report(t.other_namespace, t.node, itself))
    assert exc is not None and "may report only in its own namespace" in exc.body

    # The Pod, naming itself as sdctrain's reporter reads its own token: admitted; and
    # its identity cannot be rewritten later.
    assert reporter_from_token(token) == itself
    assert _create(pod_token, t.namespace, _report(t.namespace, t.node, itself)) is None
    custom = client.CustomObjectsApi(t.admin)
    (filed,) = [
        r
        for r in custom.list_namespaced_custom_object(GROUP, VERSION, t.namespace, PLURAL)["items"]
        if r["spec"].get("reporter") == itself
    ]
    with pytest.raises(ApiException) as rewrite:
        custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            t.namespace,
            PLURAL,
            filed["metadata"]["name"],
            {"spec": {"reporter": {**itself, "podName": "rank-7"}}},
        )
    assert "spec is immutable" in str(rewrite.value.body)

    # A member of an admin group (system:masters by default) may always report.
    assert _create(t.admin, t.namespace, _report(t.namespace, t.node, None)) is None
