"""``kubectl sdc baselines approve`` against the local control plane: a one-node
fingerprint's candidate digests become a trusted baseline that names its approver, and
nothing is written without a yes."""

from __future__ import annotations

import io
import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sdcdev.cluster.localcluster import LocalCluster
from sdcguard.cli import main

ROOT = Path(__file__).resolve().parents[2]
GROUP, VERSION = "sdcguard.dev", "v1alpha1"
pytestmark = pytest.mark.cluster


def _sdc(kubeconfig: str, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(
        [*args, "--kubeconfig", kubeconfig],
        stdout=out,
        stderr=err,
        stdin=io.StringIO(stdin) if stdin is not None else None,
    )
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def pending(cluster: LocalCluster, api_client: client.ApiClient) -> Iterator[tuple[str, str]]:
    """An untrusted SDCBaseline with one node's candidate digests (a pool of one)."""
    env = cluster.env()
    for args in (
        ["apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds")],
        ["wait", "--for=condition=Established", "--timeout=60s", "-f", str(ROOT / "crds")],
    ):
        subprocess.run(["kubectl", *args], env=env, check=True, capture_output=True)
    suffix = uuid.uuid4().hex[:6]
    fp_hash = (suffix + "0" * 64)[:64]
    name, node = f"fp-{fp_hash[:32]}", f"approve-{suffix}-gpu-0"
    custom = client.CustomObjectsApi(api_client)
    custom.create_cluster_custom_object(
        GROUP,
        VERSION,
        "sdcbaselines",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SDCBaseline",
            "metadata": {"name": name},
            "spec": {
                "fingerprint": {"hash": fp_hash, "deviceModel": "NVIDIA L4", "deviceCount": 2},
                "source": "Consensus",
            },
        },
    )
    custom.patch_cluster_custom_object_status(
        GROUP,
        VERSION,
        "sdcbaselines",
        name,
        {
            "status": {
                "candidates": [
                    {
                        "nodeName": node,
                        "digests": {"compute": "ab" * 32, "golden": "cd" * 32},
                        "testName": f"{node}-acceptance-1",
                        "recordedAt": "2026-01-02T03:04:05Z",
                    }
                ]
            }
        },
    )
    yield name, node
    custom.delete_cluster_custom_object(GROUP, VERSION, "sdcbaselines", name)


def _spec(api_client: client.ApiClient, name: str) -> dict[str, Any]:
    body = client.CustomObjectsApi(api_client).get_cluster_custom_object(
        GROUP, VERSION, "sdcbaselines", name
    )
    spec: dict[str, Any] = body["spec"]
    return spec


def test_approve_asks_shows_the_producers_and_records_the_approver(
    cluster: LocalCluster, api_client: client.ApiClient, pending: tuple[str, str]
) -> None:
    name, node = pending
    kubeconfig = str(cluster.kubeconfig)

    code, _, err = _sdc(kubeconfig, "baselines", "approve", "--node", node)  # no terminal
    assert code == 1 and "add --yes" in err

    code, _, err = _sdc(kubeconfig, "baselines", "approve", "--node", node, stdin="n\n")
    assert code == 1 and "not approved" in err
    assert f"node {node}, test {node}-acceptance-1" in err and "compute: " + "ab" * 32 in err
    assert _spec(api_client, name).get("trusted") is not True

    code, out, err = _sdc(
        kubeconfig, "baselines", "approve", name[3:15], "--as", "alice", "-o", "json", stdin="y\n"
    )
    assert code == 0, err
    row = json.loads(out)
    assert row["approvedBy"] == "alice" and row["nodes"] == [node]
    spec = _spec(api_client, name)
    assert spec["trusted"] is True and spec["source"] == "Approved"
    assert spec["digests"] == {"compute": "ab" * 32, "golden": "cd" * 32}
    assert spec["approvedBy"] == "alice" and spec["approvedAt"]
    assert spec["recordedFrom"] == [node]

    code, _, err = _sdc(kubeconfig, "baselines", "approve", "--node", node, "--yes")
    assert code == 1 and "already trusted" in err  # approving twice changes nothing


def test_approve_of_a_node_without_candidates_says_to_screen_it(cluster: LocalCluster) -> None:
    code, _, err = _sdc(str(cluster.kubeconfig), "baselines", "approve", "--node", "no-such-node")
    assert code == 1 and "no candidate digests" in err
