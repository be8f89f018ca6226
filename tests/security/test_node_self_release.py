"""A node cannot release itself (trust model row "a compromised node's kubelet").

NodeRestriction lets a kubelet set annotations and most labels on its own Node.
With the node's own client certificate (CN=system:node:NAME, O=system:nodes, signed
by the cluster CA like a kubelet's), these tests show it can write
``sdcguard.dev/release`` when nothing else stops it, and that the chart's
ValidatingAdmissionPolicy refuses that and every other sdcguard.dev/ key."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any
from uuid import uuid4 as _uuid4

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from sdcdev.cluster.localcluster import LocalCluster
from tests.security.chart_objects import (
    ADMISSION_KINDS,
    applied,
    chart_objects,
    client_certificate,
    until,
)

pytestmark = pytest.mark.cluster

QUARANTINE_TAINT = {"key": "sdcguard.dev/quarantined", "effect": "NoSchedule", "value": "sdc"}


@pytest.fixture(scope="module")
def admin(cluster: LocalCluster) -> client.CoreV1Api:
    from kubernetes import config

    return client.CoreV1Api(config.new_client_from_config(str(cluster.kubeconfig)))


@pytest.fixture
def quarantined_node(admin: client.CoreV1Api) -> Iterator[str]:
    """A Node as sdcguard leaves a quarantined one: state label, ownership, taint."""
    name = f"sec-node-{uuid.uuid4().hex[:6]}"
    admin.create_node(
        {
            "metadata": {
                "name": name,
                "labels": {"sdcguard.dev/state": "Quarantined"},
                "annotations": {"sdcguard.dev/owned-taints": "sdcguard.dev/quarantined"},
            },
            "spec": {"taints": [QUARANTINE_TAINT], "unschedulable": True},
        }
    )
    yield name
    admin.delete_node(name)


def node_client(cluster: LocalCluster, node: str) -> client.CoreV1Api:
    pki = client_certificate(cluster, f"node-{node}", f"system:node:{node}", ["system:nodes"])
    configuration = client.Configuration()
    configuration.host = cluster.server
    configuration.ssl_ca_cert = str(pki / "ca.crt")
    configuration.cert_file = str(pki / f"node-{node}.crt")
    configuration.key_file = str(pki / f"node-{node}.key")
    return client.CoreV1Api(client.ApiClient(configuration))


def refusal(call: Any) -> ApiException | None:
    """The API error of ``call()``, or None when it went through."""
    try:
        call()
    except ApiException as exc:
        return exc
    return None


def uuid4() -> str:
    return _uuid4().hex


def annotate(api: client.CoreV1Api, node: str, key: str, value: str | None) -> Any:
    return lambda: api.patch_node(node, {"metadata": {"annotations": {key: value}}})


def test_without_the_policy_the_node_releases_itself(
    cluster: LocalCluster, quarantined_node: str, admin: client.CoreV1Api
) -> None:
    """The attack: only NodeRestriction stands in the way, and it lets this through."""
    as_node = node_client(cluster, quarantined_node)
    assert refusal(annotate(as_node, quarantined_node, "sdcguard.dev/release", "me")) is None
    node = admin.read_node(quarantined_node)
    assert node.metadata.annotations["sdcguard.dev/release"] == "me"


@pytest.fixture
def node_policy(cluster: LocalCluster) -> Iterator[None]:
    objects = chart_objects(f"sec-{uuid.uuid4().hex[:6]}", ADMISSION_KINDS)
    names = {o["metadata"]["name"] for o in objects}
    assert any(n.endswith("-node-self-release") for n in names), names
    with applied(cluster, [o for o in objects if "node-self-release" in o["metadata"]["name"]]):
        yield


def test_the_chart_policy_refuses_the_node_its_own_release(
    cluster: LocalCluster, quarantined_node: str, admin: client.CoreV1Api, node_policy: None
) -> None:
    as_node = node_client(cluster, quarantined_node)
    # The API server loads a new policy a moment after it is created: wait for it to
    # refuse (a new value on every try, as a patch that changes nothing is admitted),
    # undo what got through before that, then attack for real.
    until(
        lambda: refusal(annotate(as_node, quarantined_node, "sdcguard.dev/release", uuid4())),
        30,
        "the policy to refuse the node's release annotation",
    )
    annotate(admin, quarantined_node, "sdcguard.dev/release", None)()
    exc = refusal(annotate(as_node, quarantined_node, "sdcguard.dev/release", "me"))
    assert exc is not None
    assert exc.status in (403, 422), exc
    assert "may not change the sdcguard annotations sdcguard.dev/release" in exc.body
    assert f"system:node:{quarantined_node}" in exc.body

    for patch in (
        {"metadata": {"labels": {"sdcguard.dev/exclude": "true"}}},
        {"metadata": {"labels": {"sdcguard.dev/state": "Qualified"}}},
        {"metadata": {"annotations": {"sdcguard.dev/owned-taints": None}}},
        {"metadata": {"annotations": {"sdcguard.dev/suspect": "framing myself"}}},
        {"spec": {"taints": []}},
    ):
        exc = refusal(lambda p=patch: as_node.patch_node(quarantined_node, p))
        assert exc is not None and exc.status in (403, 422), f"{patch} went through"
    # Nor can it certify itself: the SDCQualified condition is sdcguard's alone.
    qualified = {
        "type": "SDCQualified",
        "status": "True",
        "reason": "Qualified",
        "message": "passed (written by the node itself)",
    }
    exc = refusal(
        lambda: as_node.patch_node_status(quarantined_node, {"status": {"conditions": [qualified]}})
    )
    assert exc is not None and exc.status in (403, 422), "the node certified itself"
    assert "may not write the SDCQualified condition" in exc.body
    # Status writes cannot carry the keys either.
    exc = refusal(
        lambda: as_node.patch_node_status(
            quarantined_node, {"metadata": {"annotations": {"sdcguard.dev/release": "me"}}}
        )
    )
    assert exc is not None and exc.status in (403, 422), "a status patch released the node"

    node = admin.read_node(quarantined_node)
    assert "sdcguard.dev/release" not in (node.metadata.annotations or {})
    assert node.metadata.labels["sdcguard.dev/state"] == "Quarantined"
    assert "sdcguard.dev/quarantined" in [t.key for t in node.spec.taints]

    # Deleting its Node to register again without the quarantine: RBAC refuses it.
    exc = refusal(lambda: as_node.delete_node(quarantined_node))
    assert exc is not None and exc.status == 403

    # The kubelet's ordinary writes and a person's release still go through.
    assert refusal(annotate(as_node, quarantined_node, "example.com/kubelet-note", "x")) is None
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok"}
    assert (
        refusal(
            lambda: as_node.patch_node_status(quarantined_node, {"status": {"conditions": [ready]}})
        )
        is None
    )
    conditions = admin.read_node_status(quarantined_node).status.conditions or []
    assert "SDCQualified" not in [c.type for c in conditions]
    assert refusal(annotate(admin, quarantined_node, "sdcguard.dev/release", "repaired")) is None


def test_a_node_still_registers_with_the_gate_taint(
    cluster: LocalCluster, admin: client.CoreV1Api, node_policy: None
) -> None:
    """``kubelet --register-with-taints=sdcguard.dev/unqualified=:NoSchedule`` (the
    documented gate) keeps working: a node may create its Node with sdcguard's taints."""
    name = f"sec-new-{uuid.uuid4().hex[:6]}"
    as_node = node_client(cluster, name)
    gate = {"key": "sdcguard.dev/unqualified", "effect": "NoSchedule"}
    try:
        as_node.create_node({"metadata": {"name": name}, "spec": {"taints": [gate]}})
        # The node controller may add its own (node.kubernetes.io/not-ready) at once.
        taints = [t.key for t in admin.read_node(name).spec.taints or []]
        assert [k for k in taints if k.startswith("sdcguard.dev/")] == ["sdcguard.dev/unqualified"]
    finally:
        admin.delete_node(name)
