"""Replace without the RBAC for it: the operator asks up front (SelfSubjectAccessReview)
with its own ServiceAccount's token, names the chart value, and does not pretend."""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator
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
    gpu_nodes,
    list_custom,
    new_case,
    node_state,
    policy_body,
    trusted_baseline,
    wait_for,
    wait_passes,
)
from sdcdev.sim.demo_install import install, start_operator, uninstall
from sdcdev.sim.ports import free_port
from sdcguard.adapters.kube import KubeWriter
from sdcguard.adapters.pass_state import FleetView
from sdcguard.adapters.reconciler import Reconciler
from sdcguard.api import ObjectMeta, SDCPolicy, SDCPolicySpec
from sdcguard.domain.decide import Decision
from sdcguard.domain.lifecycle import DeleteNode, NodeState
from sdcguard.domain.observed import NodeSnapshot
from sdcguard.metrics import Metrics
from sdcguard.settings import Settings

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _reconciler(api: client.ApiClient) -> Reconciler:
    metrics = Metrics()
    writer = KubeWriter(api=api, metrics=metrics)
    return Reconciler(writer=writer, settings=Settings(metrics_port=0), metrics=metrics)


@pytest.fixture
def no_delete_api(
    cluster: LocalCluster, api_client: client.ApiClient
) -> Iterator[client.ApiClient]:
    """A ServiceAccount that may post Events (as the chart grants) but not delete Nodes."""
    ns, name = f"rbac-{new_case()}", "operator"
    core, rbac = client.CoreV1Api(api_client), client.RbacAuthorizationV1Api(api_client)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    core.create_namespaced_service_account(
        ns, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name))
    )
    role = f"{ns}-events"
    rbac.create_cluster_role(
        client.V1ClusterRole(
            metadata=client.V1ObjectMeta(name=role),
            rules=[client.V1PolicyRule(api_groups=[""], resources=["events"], verbs=["create"])],
        )
    )
    rbac.create_cluster_role_binding(
        client.V1ClusterRoleBinding(
            metadata=client.V1ObjectMeta(name=role),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=role
            ),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name=name, namespace=ns)],
        )
    )
    token = core.create_namespaced_service_account_token(
        name,
        ns,
        client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[])),
    ).status.token
    config = client.Configuration()
    config.host = cluster.server
    config.ssl_ca_cert = str(Path(cluster.ca_file))
    config.api_key = {"authorization": "Bearer " + token}
    restricted = client.ApiClient(config)
    try:
        yield restricted
    finally:
        restricted.close()
        rbac.delete_cluster_role_binding(role)
        rbac.delete_cluster_role(role)
        core.delete_namespace(ns)


def test_replace_without_node_delete_is_named_up_front_and_not_pretended(
    api_client: client.ApiClient, no_delete_api: client.ApiClient
) -> None:
    policy = SDCPolicy(
        metadata=ObjectMeta(name=f"p-{new_case()}"),
        spec=SDCPolicySpec.model_validate({"repair": {"strategy": "Replace"}}),
    )
    assert _reconciler(api_client).permission.allowed(NOW) is True
    restricted = _reconciler(no_delete_api)
    assert restricted.permission.allowed(NOW) is False

    (condition,) = restricted.reporter._replace_condition(policy, [], NOW)
    assert (condition.type, condition.status, condition.reason) == (
        "NodeDeletePermitted",
        "False",
        "Forbidden",
    )
    assert "rbac.allowNodeDelete=true" in condition.message

    node = f"replace-{new_case()}"
    decision = Decision(
        node=node,
        previous=NodeState.QUARANTINED,
        state=NodeState.REPAIRING,
        event=None,
        actions=(DeleteNode(),),
    )
    view = FleetView(nodes={node: NodeSnapshot(name=node, uid="u-1")})
    executor = restricted.executor
    assert executor.refused_delete(policy, decision, view, NOW)
    assert executor.refused_delete(policy, decision, view, NOW), "refused again, told once"
    events = (
        client.CoreV1Api(api_client)
        .list_namespaced_event("default", field_selector=f"involvedObject.name={node}")
        .items
    )
    assert [(e.reason, e.type) for e in events] == [("NodeDeleteForbidden", "Warning")]
    assert "was not deleted" in events[0].message
    assert "rbac.allowNodeDelete=true" in events[0].message
    assert "stays Quarantined" in events[0].message
    assert restricted.writer.writes["node-delete"] == 0


def test_the_operator_under_the_charts_default_rbac_does_not_replace_and_says_so(
    cluster: LocalCluster, api_client: client.ApiClient, tmp_path: Path
) -> None:
    """End to end: the operator process runs with a token of the chart's ServiceAccount
    (default values: rbac.allowNodeDelete=false) and a Replace policy. The policy names
    the value to set, a quarantined node whose ticket is taken is not deleted and stays
    Quarantined, and one Event says what happened."""
    case = new_case()
    custom, core = client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)
    inst = install(cluster, api_client, release=f"rp-{case}", namespace=f"rp-{case}")
    operator = None
    node = f"replace-{case}"
    policy = f"p-{case}"
    metrics_port = free_port()
    trusted_baseline(api_client)
    try:
        operator = start_operator(
            cluster,
            api_client,
            inst,
            workdir=tmp_path,
            log_path=tmp_path / "operator.log",
            metrics_port=metrics_port,
        )
        with (
            gpu_nodes(api_client, [node], case=case),
            ProbeKubelet(api_client, {node: "sdc"}, namespace=inst.namespace),
        ):
            custom.create_cluster_custom_object(
                GROUP,
                VERSION,
                "sdcpolicies",
                policy_body(
                    policy,
                    match_labels={"sdcguard.test/case": case},
                    repair={"strategy": "Replace"},
                ),
            )

            def permitted() -> dict[str, Any]:
                body = custom.get_cluster_custom_object(GROUP, VERSION, "sdcpolicies", policy)
                conditions = (body.get("status") or {}).get("conditions") or []
                return next((c for c in conditions if c["type"] == "NodeDeletePermitted"), {})

            wait_for(lambda: permitted().get("status") == "False", 60, "NodeDeletePermitted")
            assert "rbac.allowNodeDelete=true" in permitted()["message"]
            wait_for(lambda: node_state(api_client, node) == "Quarantined", 120, "quarantine")
            ticket = list_custom(api_client, "repairtickets", node)[0]["metadata"]["name"]
            custom.patch_cluster_custom_object(
                GROUP,
                VERSION,
                "repairtickets",
                ticket,
                {"spec": {"external": {"system": "test", "id": f"R-{case}"}}},
            )

            def refused() -> list[Any]:
                events = core.list_namespaced_event(
                    "default", field_selector=f"involvedObject.name={node}"
                ).items
                return [e for e in events if e.reason == "NodeDeleteForbidden"]

            wait_for(refused, 60, "the NodeDeleteForbidden Event")
            # Two more whole full passes: the refusal is not repeated, nothing moves.
            wait_passes(f"http://127.0.0.1:{metrics_port}/metrics", policy, 3)
            (event,) = refused()
            assert "was not deleted" in event.message and "rbac.allowNodeDelete=true" in (
                event.message
            )
            assert core.read_node(node).metadata.deletion_timestamp is None
            assert node_state(api_client, node) == "Quarantined"
            assert "applying a decision failed" not in operator.log_tail(400)
    finally:
        if operator is not None:
            operator.stop()
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(GROUP, VERSION, "sdcpolicies", policy)
        uninstall(api_client, inst)
