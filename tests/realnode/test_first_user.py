"""A new user's first hour on the real node: the ``helm install`` that ``make cluster-up``
prints, README's first policy, the node Qualified through ``kubectl sdc baselines
approve`` (one node cannot make a quorum of three), then ``helm uninstall`` leaves the
node with nothing of sdcguard's, and a reinstall comes up Ready.

README's policy is read from README.md and changed only where this cluster differs
from the H100 fleet it describes: its nodeSelector and probe image name this node and
the locally built probe, and its budget is cut to seconds (the README's 900 s screening
would hold the test for a quarter of an hour; the time spent is not what is tested).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from sdcdev import REPO
from sdcdev.cluster.helm import run_helm
from sdcdev.cluster.localcluster import LocalCluster
from sdcdev.cluster.operator_pod import install_command
from tests.realnode.conftest import kubectl, kubectl_items
from tests.realnode.test_operator_pod import sdc

pytestmark = pytest.mark.cluster

NODE = "real-node-0"
RELEASE, NAMESPACE = "sdcguard", "sdcguard-system"
HARNESS_LABEL = "sdcguard.dev/real-node"
"""The local cluster's own label on its real node (not sdcguard's state)."""


def readme_policy() -> dict[str, Any]:
    """README's first policy, exactly as the README shows it."""
    text = (REPO / "README.md").read_text()
    block = re.search(r"## A first policy.*?```yaml\n(.*?)```", text, re.S)
    assert block, "README.md has no first policy"
    policy: dict[str, Any] = yaml.safe_load(block.group(1))
    assert policy["kind"] == "SDCPolicy"
    return policy


def _run(cluster: LocalCluster, command: str) -> str:
    proc = subprocess.run(
        shlex.split(command), env=cluster.env(), capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, f"{command}: {proc.stdout}{proc.stderr}"
    return proc.stdout


def _operator_ready(cluster: LocalCluster, timeout: float = 240) -> str:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        pods = kubectl_items(
            cluster,
            "pods",
            "-n",
            NAMESPACE,
            "-l",
            f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=operator",
        )
        for pod in pods:
            conditions = (pod.get("status") or {}).get("conditions") or []
            last = f"{pod['metadata']['name']}: {pod.get('status', {}).get('phase')}"
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                return str(pod["metadata"]["name"])
        time.sleep(1)
    raise AssertionError(f"the operator Pod was not Ready within {timeout:.0f}s ({last})")


def _node(cluster: LocalCluster) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(kubectl(cluster, "get", "node", NODE, "-o", "json"))
    return body


def _ours(cluster: LocalCluster) -> list[str]:
    """Every sdcguard.dev/ taint, label and annotation on the node (but the harness's)."""
    body = _node(cluster)
    meta, spec = body["metadata"], body.get("spec") or {}
    found = [f"taint {t['key']}" for t in spec.get("taints") or [] if "sdcguard.dev/" in t["key"]]
    found += [
        f"label {k}"
        for k in meta.get("labels") or {}
        if k.startswith("sdcguard.dev/") and k != HARNESS_LABEL
    ]
    found += [f"annotation {k}" for k in meta.get("annotations") or {} if "sdcguard.dev/" in k]
    return found


def _wait(what: str, timeout: float, predicate: Any) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def _remove_policies(cluster: LocalCluster) -> None:
    """Delete every SDCPolicy, and take the finalizer off one no operator will release:
    a policy an earlier module kept (keepOnUninstall) would share the node with ours."""
    env = cluster.env()
    subprocess.run(
        ["kubectl", "delete", "sdcpolicies", "--all", "--wait=false"],
        env=env,
        capture_output=True,
        check=False,
    )
    listed = subprocess.run(
        ["kubectl", "get", "sdcpolicies", "-o", "name"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    for policy in listed.stdout.split():
        subprocess.run(
            ["kubectl", "patch", policy, "--type=merge", "-p", '{"metadata":{"finalizers":null}}'],
            env=env,
            capture_output=True,
            check=False,
        )


@pytest.fixture
def first_install(real_cluster: LocalCluster) -> Iterator[str]:
    """The printed install, on a cluster with no policy yet; afterwards, whatever
    happened, the release and its policies are gone."""
    _remove_policies(real_cluster)
    command = install_command(real_cluster)
    yield command
    run_helm(
        "uninstall",
        RELEASE,
        "--namespace",
        NAMESPACE,
        "--wait",
        env=real_cluster.env(),
        check=False,
    )
    _remove_policies(real_cluster)


def test_first_policy_qualifies_and_uninstall_leaves_the_node_clean(
    real_cluster: LocalCluster, first_install: str
) -> None:
    t0 = time.monotonic()
    _run(real_cluster, first_install)
    _operator_ready(real_cluster)
    installed = time.monotonic() - t0

    policy = readme_policy()
    name = policy["metadata"]["name"]
    assert real_cluster.state_dir is not None
    values = yaml.safe_load((real_cluster.state_dir / "sdcguard-values.yaml").read_text())
    image = values["probe"]["image"]
    policy["spec"]["nodeSelector"] = {"matchLabels": {HARNESS_LABEL: "true"}}
    policy["spec"]["probe"] = {
        "image": f"{image['repository']}:{image['tag']}",
        "budgetSeconds": 10,
    }
    proc = subprocess.run(
        ["kubectl", "apply", "-f", "-"],
        input=json.dumps(policy),
        env=real_cluster.env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr

    # One node of its fingerprint: the quorum of three cannot be met; the wait says so,
    # and the approve command takes the node's digests.
    def candidate() -> bool:
        items = kubectl_items(real_cluster, "sdcbaselines")
        return any(
            c.get("nodeName") == NODE and c.get("digests")
            for b in items
            for c in (b.get("status") or {}).get("candidates") or []
        )

    _wait("the node's baseline candidate", 300, candidate)
    sdc(real_cluster, "baselines", "approve", "--node", NODE, "--yes")
    _wait(
        "the node Qualified",
        180,
        lambda: (
            _node(real_cluster)["metadata"].get("labels", {}).get("sdcguard.dev/state")
            == "Qualified"
        ),
    )
    owner = [
        t
        for t in kubectl_items(real_cluster, "sdctests")
        if t["spec"].get("nodeName") == NODE and t["spec"].get("policyRef") == name
    ]
    assert any((t.get("status") or {}).get("verdict") == "Pass" for t in owner), owner
    assert _ours(real_cluster), "a qualified node carries sdcguard's records"

    # helm uninstall: the pre-delete hook leaves the node clean.
    t1 = time.monotonic()
    run_helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", env=real_cluster.env())
    uninstalled = time.monotonic() - t1
    assert _ours(real_cluster) == [], _ours(real_cluster)
    for kept in kubectl_items(real_cluster, "sdcpolicies"):
        assert not kept["metadata"].get("finalizers"), kept["metadata"]

    # A reinstall (the same printed command) comes up Ready.
    t2 = time.monotonic()
    _run(real_cluster, first_install)
    _operator_ready(real_cluster)
    print(
        f"install {installed:.1f}s; qualified and uninstalled ({uninstalled:.1f}s, node "
        f"clean); reinstall Ready in {time.monotonic() - t2:.1f}s"
    )
