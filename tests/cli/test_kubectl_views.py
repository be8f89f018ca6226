"""What kubectl itself shows from the generated CRDs (explain, get columns), and label
selectors with matchExpressions as kubectl sdc evaluates them, on the local control plane."""

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
from sdcguard.api import NodeCounts, SDCPolicyStatus, to_body
from sdcguard.cli import main

ROOT = Path(__file__).resolve().parents[2]
GROUP, VERSION = "sdcguard.dev", "v1alpha1"
pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def env(cluster: LocalCluster) -> dict[str, str]:
    env = cluster.env()
    for argv in (
        ["kubectl", "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds")],
        [
            "kubectl",
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "-f",
            str(ROOT / "crds"),
        ],
    ):
        subprocess.run(argv, env=env, check=True, capture_output=True)
    return env


def _kubectl(env: dict[str, str], *args: str) -> str:
    proc = subprocess.run(
        ["kubectl", *args], env=env, capture_output=True, text=True, check=False, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_explain_shows_defaults_duration_formats_and_int_or_string(env: dict[str, str]) -> None:
    budgets = " ".join(_kubectl(env, "explain", "sdcpolicy.spec.budgets").split())
    assert "int-or-string" in budgets and 'Default: "10%"' in budgets
    assert "Default: 2." in budgets  # maxConcurrentTests
    triggers = " ".join(_kubectl(env, "explain", "sdcpolicy.spec.triggers").split())
    assert 'Default: "168h"' in triggers and 'Default: "10m"' in triggers
    assert 'Duration: a number and a unit (h, m, s, ms, us, ns), e.g. "90s", "30m"' in triggers


@pytest.fixture
def policy(api_client: client.ApiClient, env: dict[str, str]) -> Iterator[str]:
    name = f"views-{uuid.uuid4().hex[:6]}"
    custom = client.CustomObjectsApi(api_client)
    custom.create_cluster_custom_object(
        GROUP,
        VERSION,
        "sdcpolicies",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SDCPolicy",
            "metadata": {"name": name},
            "spec": {
                "mode": "Observe",
                "nodeSelector": {
                    "matchLabels": {"views-test.sdcguard.dev/run": name},
                    "matchExpressions": [
                        {
                            "key": "views-test.sdcguard.dev/pool",
                            "operator": "In",
                            "values": ["train", "eval"],
                        },
                        {"key": "views-test.sdcguard.dev/skip", "operator": "DoesNotExist"},
                    ],
                },
            },
        },
    )
    yield name
    custom.delete_cluster_custom_object(GROUP, VERSION, "sdcpolicies", name)


def test_get_sdcp_shows_the_node_count(
    api_client: client.ApiClient, env: dict[str, str], policy: str
) -> None:
    # The status as the operator writes it: counts through the model, which sums them.
    status = SDCPolicyStatus(counts=NodeCounts(qualified=3, testing=1, quarantined=1))
    client.CustomObjectsApi(api_client).patch_cluster_custom_object_status(
        GROUP, VERSION, "sdcpolicies", policy, {"status": to_body(status)}
    )
    header, row = _kubectl(env, "get", "sdcp", policy).splitlines()
    columns = dict(zip(header.split(), row.split(), strict=False))
    assert columns["NODES"] == "5" and columns["QUALIFIED"] == "3"
    assert columns["QUARANTINED"] == "1"


def _node(core: client.CoreV1Api, name: str, labels: dict[str, str]) -> None:
    core.create_node(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}
    )
    core.patch_node_status(
        name,
        {"status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"}}},
        _content_type="application/merge-patch+json",
    )


def test_match_expressions_decide_which_nodes_a_policy_covers(
    api_client: client.ApiClient, cluster: LocalCluster, policy: str
) -> None:
    core = client.CoreV1Api(api_client)
    base = {"views-test.sdcguard.dev/run": policy}
    nodes = {
        f"{policy}-train": {**base, "views-test.sdcguard.dev/pool": "train"},
        f"{policy}-infer": {**base, "views-test.sdcguard.dev/pool": "infer"},
        f"{policy}-skip": {
            **base,
            "views-test.sdcguard.dev/pool": "eval",
            "views-test.sdcguard.dev/skip": "true",
        },
    }
    for name, labels in nodes.items():
        _node(core, name, labels)
    try:
        out, err = io.StringIO(), io.StringIO()
        args = ["--kubeconfig", str(cluster.kubeconfig), "-o", "json"]
        assert main([*args, "test", f"{policy}-train"], stdout=out, stderr=err) == 0, err.getvalue()
        assert json.loads(out.getvalue())["spec"]["policyRef"] == policy
        for name in (f"{policy}-infer", f"{policy}-skip"):
            out, err = io.StringIO(), io.StringIO()
            assert main([*args, "test", name], stdout=out, stderr=err) == 1
            assert f"no SDCPolicy covers node {name}" in err.getvalue()
        out = io.StringIO()
        assert main([*args, "status"], stdout=out, stderr=io.StringIO()) == 0
        (pool,) = [p for p in json.loads(out.getvalue())["pools"] if p["policy"] == policy]
        assert pool["nodes"] == 1
    finally:
        custom = client.CustomObjectsApi(api_client)
        for item in custom.list_cluster_custom_object(GROUP, VERSION, "sdctests")["items"]:
            if item["spec"]["nodeName"] in nodes:
                custom.delete_cluster_custom_object(
                    GROUP, VERSION, "sdctests", item["metadata"]["name"]
                )
        for name in nodes:
            core.delete_node(name)
