"""Cluster shapes on the real API server and scheduler: a GKE-like GPU pool tainted
nvidia.com/gpu=present:NoSchedule is screened end to end, a policy that does not
tolerate the pool's taint says which field to set, and a MIG node (mixed strategy)
is screened with every instance requested (docs/guides/cluster-shapes.md)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from kubernetes import client

from sdcdev.harness import (
    GATE,
    NS,
    ProbeKubelet,
    create_policy,
    list_custom,
    new_case,
    node_state,
    read_node,
    registered_nodes,
    taint_keys,
    trusted_baseline,
    wait_for,
)
from sdcdev.sim.fleet import parse_fleet
from sdcguard.domain import keys

GKE_TAINT = "nvidia.com/gpu=present:NoSchedule"


@contextlib.contextmanager
def _nodes(
    api: client.ApiClient,
    names: list[str],
    case: str,
    instance_type: str,
    *taints: str,
) -> Iterator[None]:
    """Simulated nodes of ``instance_type``, gated and tainted with ``taints``."""
    gate = ["sdcguard.dev/unqualified:NoSchedule"]
    fleet = parse_fleet(
        {
            "name": "shapes",
            "defaults": {"taints": [*gate, *taints]},
            "nodes": [
                {"name": n, "instanceType": instance_type, "labels": {"sdcguard.test/case": case}}
                for n in names
            ],
            "workloads": {"enabled": False},
            "repair": {"enabled": False},
        }
    )
    with registered_nodes(api, list(fleet.nodes)):
        yield


def _probe_pods(api: client.ApiClient, node: str) -> list[client.V1Pod]:
    pods = client.CoreV1Api(api).list_namespaced_pod(NS, label_selector="sdcguard.dev/node")
    return [p for p in pods.items if (p.metadata.labels or {}).get("sdcguard.dev/node") == node]


def test_a_gke_like_tainted_pool_is_screened_end_to_end(api_client, operator) -> None:
    """The default tolerations let the real scheduler place the probe on the pool's
    nodes; they qualify, and the pool's own taint stays (sdcguard removes only its own)."""
    case = new_case()
    nodes = [f"gke-{case}-{i}" for i in range(2)]
    trusted_baseline(api_client)
    with (
        _nodes(api_client, nodes, case, "a3-highgpu-8g", GKE_TAINT),
        ProbeKubelet(api_client, dict.fromkeys(nodes, "pass")),
    ):
        create_policy(api_client, case)
        for n in nodes:
            wait_for(lambda n=n: node_state(api_client, n) == "Qualified", 90, f"{n} Qualified")
            assert taint_keys(api_client, n) == {"nvidia.com/gpu"}
            (pod,) = _probe_pods(api_client, n)
            assert pod.spec.node_name == n
            tolerations = [(t.key, t.operator) for t in pod.spec.tolerations or []]
            assert ("nvidia.com/gpu", "Exists") in tolerations
            tests = list_custom(api_client, "sdctests", n)
            assert [t["status"]["verdict"] for t in tests] == ["Pass"]


def test_a_pool_taint_the_policy_does_not_tolerate_names_the_field(api_client, operator) -> None:
    """A policy that replaced the default tolerations: the pool's node is not screened,
    and the node, gated and never labelled before, says which taint keeps probes off
    and which field to set."""
    case = new_case()
    node = f"gke-strict-{case}"
    with _nodes(api_client, [node], case, "a3-highgpu-8g", GKE_TAINT):
        other = {"key": "example.com/other", "operator": "Exists"}
        create_policy(api_client, case, probe={"tolerations": [other]})

        def waiting() -> str:
            return (read_node(api_client, node).metadata.annotations or {}).get(keys.WAITING, "")

        wait_for(lambda: "spec.probe.tolerations" in waiting(), 60, "the ForeignTaint wait")
        assert "taint nvidia.com/gpu=present:NoSchedule keeps probes off the node" in waiting()
        assert node_state(api_client, node) == "Unqualified"
        assert GATE in taint_keys(api_client, node)
        assert not list_custom(api_client, "sdctests", node)
        assert not _probe_pods(api_client, node)


def test_a_mig_node_is_screened_with_every_instance_requested(api_client, operator) -> None:
    case = new_case()
    node = f"mig-{case}"
    trusted_baseline(api_client)
    with (
        _nodes(api_client, [node], case, "p4de.24xlarge"),
        ProbeKubelet(api_client, {node: "pass"}),
    ):
        create_policy(api_client, case)
        wait_for(lambda: node_state(api_client, node) == "Qualified", 90, f"{node} Qualified")
        (pod,) = _probe_pods(api_client, node)
        requests: dict[str, Any] = pod.spec.containers[0].resources.requests
        assert {k: v for k, v in requests.items() if k.startswith("nvidia.com/")} == {
            "nvidia.com/mig-1g.10gb": "16",
            "nvidia.com/mig-2g.20gb": "8",
            "nvidia.com/mig-3g.40gb": "8",
        }
