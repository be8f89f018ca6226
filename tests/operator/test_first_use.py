"""What a first-time user trips over, against the real control plane: probe Jobs that
outlive their test, a hand-edited state label, echoes of huge user strings."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from tests.operator.harness import (
    NS,
    ProbeKubelet,
    create_policy,
    gpu_nodes,
    list_custom,
    new_case,
    trusted_baseline,
    wait_for,
)


def _jobs(api: client.ApiClient, node: str) -> list[client.V1Job]:
    return list(
        client.BatchV1Api(api)
        .list_namespaced_job(NS, label_selector=f"sdcguard.dev/node={node}")
        .items
    )


def _events(api: client.ApiClient, node: str) -> list[Any]:
    return list(
        client.CoreV1Api(api)
        .list_namespaced_event("default", field_selector=f"involvedObject.name={node}")
        .items
    )


def test_a_test_that_ends_inconclusive_takes_its_probe_job_with_it(api_client, operator) -> None:
    """The node leaves the policy while its probe runs: the test ends Inconclusive, says
    truly why (the node exists), and its Job (whose Pod holds the node's GPUs) is gone."""
    case = new_case()
    node = f"orphan-{case}"
    trusted_baseline(api_client)
    with gpu_nodes(api_client, [node], case=case), ProbeKubelet(api_client, {node: "never"}):
        create_policy(api_client, case)
        wait_for(lambda: _jobs(api_client, node), 60, "the probe Job")
        client.CoreV1Api(api_client).patch_node(
            node, {"metadata": {"labels": {"sdcguard.test/case": None}}}
        )
        test = wait_for(
            lambda: [
                t
                for t in list_custom(api_client, "sdctests", node)
                if (t.get("status") or {}).get("phase") == "Inconclusive"
            ],
            60,
            "the test to end Inconclusive",
        )[0]
        assert test["status"]["reason"] == "NodeLeftPolicy"
        assert "no longer exists" not in test["status"]["message"]
        wait_for(lambda: not _jobs(api_client, node), 30, "the probe Job to be deleted")
