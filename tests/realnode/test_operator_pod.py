"""The operator as the chart's Pod on the real node: Ready through its own probes,
in-cluster with its ServiceAccount, /metrics through the chart's Service, and a
screening end to end: acceptance on the real node -> Qualified.

The probe Job the operator creates runs the probe image in a real container; its
verdict comes from the termination message the kubelet wrote. The node's
fingerprint is new, so its first result waits for a baseline (AwaitingBaseline);
the test then does what a person certifying reference hardware does: copies the
node's candidate digests into the SDCBaseline and sets ``trusted: true``
(``source: Approved``), after which the held test is judged and passes.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.localcluster import LocalCluster
from tests.cluster.operator_pod import (
    OperatorPod,
    install_operator,
    scrape_metrics,
    uninstall_operator,
)
from tests.realnode.conftest import kubectl

pytestmark = pytest.mark.cluster

NODE = "real-node-0"
STATE_LABEL = "sdcguard.dev/state"


def policy_values(name: str) -> dict[str, Any]:
    checks = {
        "compute": {"timeoutSeconds": 120},
        "collective": {"timeoutSeconds": 120},
        "golden": {"timeoutSeconds": 120},
        "memory": {"enabled": False},
    }
    return {
        "policy": {
            "name": name,
            "nodeSelector": {"matchLabels": {"sdcguard.dev/real-node": "true"}},
            "suites": {
                "acceptance": {"checks": checks},
                "requalification": {"checks": checks},
                "repairVerification": {"checks": checks},
            },
            "probe": {"cpuDevices": 2, "budgetSeconds": 10, "activeDeadlineSeconds": 300},
            "triggers": {"onReturnFromUse": {"enabled": False}},
        },
        "operator": {"resyncSeconds": 5, "logFormat": "console"},
    }


@pytest.fixture(scope="module")
def operator_pod(real_cluster: LocalCluster) -> Iterator[OperatorPod]:
    suffix = uuid.uuid4().hex[:5]
    release, namespace = f"sdcguard-rn{suffix}", f"sdcguard-rn{suffix}"
    op = install_operator(real_cluster, release, namespace, policy_values(f"rn-{suffix}"))
    print(
        f"helm install -> operator Pod {op.pod} Ready on {op.node} ({op.runtime}) "
        f"in {op.ready_seconds:.1f}s"
    )
    yield op
    uninstall_operator(real_cluster, release, namespace)


def test_operator_pod_is_ready_on_the_real_node_in_cluster(
    real_cluster: LocalCluster, operator_pod: OperatorPod
) -> None:
    assert operator_pod.node == NODE
    assert operator_pod.runtime.startswith("containerd://")
    pod = json.loads(
        kubectl(
            real_cluster, "get", "pod", "-n", operator_pod.namespace, operator_pod.pod, "-o", "json"
        )
    )
    spec = pod["spec"]
    assert spec["serviceAccountName"] == operator_pod.release
    assert spec["containers"][0]["image"].startswith("localhost/sdcguard-operator:")
    assert spec["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    # In-cluster: the Kopf liveness endpoint answers only once the operator has
    # logged in with the projected ServiceAccount token and started its handlers.
    status = pod["status"]["containerStatuses"][0]
    assert status["ready"] is True and status["restartCount"] == 0


def test_metrics_through_the_charts_service(
    real_cluster: LocalCluster, operator_pod: OperatorPod
) -> None:
    text = scrape_metrics(real_cluster, operator_pod)
    assert "# TYPE sdcguard_" in text, text[:500]


def test_acceptance_on_the_real_node_ends_qualified(
    real_cluster: LocalCluster, operator_pod: OperatorPod
) -> None:
    t0 = time.monotonic()
    baseline = _wait_candidate(real_cluster, timeout=300)
    candidate = next(c for c in baseline["status"]["candidates"] if c["nodeName"] == NODE)
    patch = {"spec": {"digests": candidate["digests"], "trusted": True, "source": "Approved"}}
    kubectl(
        real_cluster,
        "patch",
        "sdcbaseline",
        baseline["metadata"]["name"],
        "--type=merge",
        "-p",
        json.dumps(patch),
    )
    state = _wait_state(real_cluster, "Qualified", timeout=180)
    tests = json.loads(kubectl(real_cluster, "get", "sdctests", "-A", "-o", "json"))["items"]
    mine = [t for t in tests if t["spec"].get("nodeName") == NODE]
    assert mine, "no SDCTest for the real node"
    verdicts = [t.get("status", {}).get("verdict") for t in mine]
    assert "Pass" in verdicts, verdicts
    print(f"real node {state} {time.monotonic() - t0:.1f}s after this test began waiting")


def _wait_candidate(cluster: LocalCluster, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        items = json.loads(kubectl(cluster, "get", "sdcbaselines", "-o", "json"))["items"]
        for b in items:
            for c in (b.get("status") or {}).get("candidates", []):
                if c.get("nodeName") == NODE and c.get("digests"):
                    return dict(b)
        time.sleep(2)
    tests = kubectl(cluster, "get", "sdctests", "-A", "-o", "yaml")
    raise AssertionError(
        f"no baseline candidate from {NODE} within {timeout:.0f}s:\n{tests[-3000:]}"
    )


def _wait_state(cluster: LocalCluster, want: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        node = json.loads(kubectl(cluster, "get", "node", NODE, "-o", "json"))
        state = node["metadata"].get("labels", {}).get(STATE_LABEL, "")
        if state == want:
            return state
        time.sleep(2)
    tests = kubectl(cluster, "get", "sdctests", "-A", "-o", "yaml")
    raise AssertionError(f"{NODE} is {state!r}, not {want}, after {timeout:.0f}s:\n{tests[-3000:]}")
