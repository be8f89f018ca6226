"""``kubectl sdc cleanup`` against the local control plane: a testing node is released
(our taints, cordon, label and annotations go; a person's taint stays), a quarantined
node is kept whole, the test in flight ends Cancelled and its Job is deleted, and a second
run finds nothing to do."""

from __future__ import annotations

import io
import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from sdcdev.cluster.localcluster import LocalCluster
from sdcdev.harness import GROUP, VERSION, create_sdctest, wait_for
from sdcguard.builders.probe_job import TEST_LABEL
from sdcguard.cli import main

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.cluster
OTHERS = {"key": "example.com/maintenance", "value": "x", "effect": "NoSchedule"}


def _sdc(kubeconfig: str, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main([*args, "--kubeconfig", kubeconfig], stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def _node(core: client.CoreV1Api, name: str, case: str, state: str, taint: str) -> None:
    core.create_node(
        client.V1Node(
            metadata=client.V1ObjectMeta(
                name=name,
                labels={"sdcguard.test/case": case, "sdcguard.dev/state": state},
                annotations={
                    "sdcguard.dev/owned-taints": taint,
                    "sdcguard.dev/cordoned-by-us": "true",
                    "sdcguard.dev/test": f"{name}-acceptance-1",
                },
            ),
            spec=client.V1NodeSpec(
                unschedulable=True,
                taints=[
                    client.V1Taint(key=taint, effect="NoSchedule"),
                    client.V1Taint(**OTHERS),
                ],
            ),
        )
    )


@pytest.fixture(scope="module")
def held(cluster: LocalCluster, api_client: client.ApiClient) -> Iterator[tuple[str, str, str]]:
    env = cluster.env()
    for args in (
        ["apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds")],
        ["wait", "--for=condition=Established", "--timeout=60s", "-f", str(ROOT / "crds")],
    ):
        subprocess.run(["kubectl", *args], env=env, check=True, capture_output=True)
    case = uuid.uuid4().hex[:6]
    core, custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
    testing, quarantined = f"clean-{case}-gpu-0", f"clean-{case}-gpu-1"
    _node(core, testing, case, "Testing", "sdcguard.dev/testing")
    _node(core, quarantined, case, "Quarantined", "sdcguard.dev/quarantined")
    test = f"{testing}-acceptance-1"
    create_sdctest(
        custom,
        test,
        {"nodeName": testing, "policyRef": "default", "suite": "acceptance"},
        {"phase": "Running"},
    )
    client.BatchV1Api(api_client).create_namespaced_job(
        "default",
        client.V1Job(
            metadata=client.V1ObjectMeta(name=f"sdcprobe-{test}", labels={TEST_LABEL: test}),
            spec=client.V1JobSpec(
                template=client.V1PodTemplateSpec(
                    spec=client.V1PodSpec(
                        restart_policy="Never",
                        containers=[client.V1Container(name="probe", image="probe:none")],
                    )
                )
            ),
        ),
    )
    yield case, testing, quarantined
    for name in (testing, quarantined):
        core.delete_node(name)
    custom.delete_cluster_custom_object(GROUP, VERSION, "sdctests", test)


def test_cleanup_releases_what_it_may_and_keeps_quarantines(
    cluster: LocalCluster, api_client: client.ApiClient, held: tuple[str, str, str]
) -> None:
    case, testing, quarantined = held
    kubeconfig, selector = str(cluster.kubeconfig), f"sdcguard.test/case={case}"
    core = client.CoreV1Api(api_client)

    code, _, err = _sdc(kubeconfig, "cleanup", "-l", selector)  # no terminal, no --yes
    assert code == 1 and "add --yes" in err
    assert core.read_node(testing).metadata.labels.get("sdcguard.dev/state") == "Testing"

    code, out, err = _sdc(kubeconfig, "cleanup", "-l", selector, "--yes", "-o", "json")
    assert code == 0, err
    result = json.loads(out)
    assert result["nodes"] == [testing] and result["kept"] == [quarantined]
    assert result["cancelledTests"] == [f"{testing}-acceptance-1"] and result["jobsDeleted"] == 1

    released = core.read_node(testing)
    assert "sdcguard.dev/state" not in (released.metadata.labels or {})
    assert not [a for a in released.metadata.annotations or {} if a.startswith("sdcguard.dev/")]
    # Another's taint stays; the node controller may have added node.kubernetes.io/ ones.
    left = [
        t.key for t in released.spec.taints or [] if not t.key.startswith("node.kubernetes.io/")
    ]
    assert left == [OTHERS["key"]]
    assert not released.spec.unschedulable

    kept = core.read_node(quarantined)
    assert kept.metadata.labels["sdcguard.dev/state"] == "Quarantined" and kept.spec.unschedulable
    assert "sdcguard.dev/quarantined" in [t.key for t in kept.spec.taints]

    test = client.CustomObjectsApi(api_client).get_cluster_custom_object(
        GROUP, VERSION, "sdctests", f"{testing}-acceptance-1"
    )
    assert test["status"]["phase"] == "Cancelled" and test["status"]["reason"] == "Uninstalled"

    code, out, err = _sdc(kubeconfig, "cleanup", "-l", selector, "--yes", "-o", "json")
    assert code == 0, err
    again = json.loads(out)  # idempotent: only the kept quarantine is left to report
    assert again["nodes"] == [] and again["cancelledTests"] == [] and again["kept"] == [quarantined]


def test_stop_operator_scales_it_down_and_unholds_the_policies(
    cluster: LocalCluster, api_client: client.ApiClient, held: tuple[str, str, str]
) -> None:
    """The chart's pre-delete hook: the operator's Deployment is scaled to zero and its
    Pods are gone before anything is released, and every SDCPolicy loses Kopf's
    finalizer, so deleting one no longer waits for an operator that is gone."""
    case = uuid.uuid4().hex[:6]
    apps = client.AppsV1Api(api_client)
    core, custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
    labels = {"app": f"op-{case}"}
    apps.create_namespaced_deployment(
        "default",
        client.V1Deployment(
            metadata=client.V1ObjectMeta(name=f"op-{case}"),
            spec=client.V1DeploymentSpec(
                replicas=1,
                selector=client.V1LabelSelector(match_labels=labels),
                template=client.V1PodTemplateSpec(
                    metadata=client.V1ObjectMeta(labels=labels),
                    spec=client.V1PodSpec(
                        containers=[client.V1Container(name="operator", image="op:none")],
                        node_selector={"sdcguard.test/nowhere": case},
                    ),
                ),
            ),
        ),
    )
    policy = f"held-{case}"
    custom.create_cluster_custom_object(
        GROUP,
        VERSION,
        "sdcpolicies",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SDCPolicy",
            "metadata": {"name": policy, "finalizers": ["kopf.zalando.org/KopfFinalizerMarker"]},
            "spec": {"nodeSelector": {"matchLabels": {"sdcguard.test/case": case}}},
        },
    )
    try:

        def pods() -> list[client.V1Pod]:
            return list(core.list_namespaced_pod("default", label_selector=f"app=op-{case}").items)

        wait_for(pods, 60, "the Deployment's Pod")
        code, out, err = _sdc(
            str(cluster.kubeconfig),
            "cleanup",
            "-l",
            f"sdcguard.test/case={held[0]}",
            "--yes",
            "--stop-operator",
            f"default/op-{case}",
            "--jobs-namespace",
            "default",
            "-o",
            "json",
        )
        assert code == 0, err
        assert apps.read_namespaced_deployment(f"op-{case}", "default").spec.replicas == 0
        assert not pods()
        assert policy in json.loads(out)["unheldPolicies"]
        body = custom.get_cluster_custom_object(GROUP, VERSION, "sdcpolicies", policy)
        assert not body["metadata"].get("finalizers")
    finally:
        apps.delete_namespaced_deployment(f"op-{case}", "default")
        custom.delete_cluster_custom_object(GROUP, VERSION, "sdcpolicies", policy)
