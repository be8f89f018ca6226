"""Cluster shapes on the real API server and scheduler: a GKE-like GPU pool tainted
nvidia.com/gpu=present:NoSchedule is screened end to end, a policy that does not
tolerate the pool's taint says which field to set, and a MIG node (mixed strategy)
is screened with every instance requested (docs/guides/cluster-shapes.md)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from kubernetes import client, watch

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


def test_a_runtime_class_that_does_not_exist_reserves_no_node(api_client, operator) -> None:
    """The API server would refuse every probe Pod naming a RuntimeClass it does not
    have: the node waits unreserved with a reason that names the field, and is screened
    once the class exists."""
    case = new_case()
    node = f"rc-{case}"
    runtime_class = f"missing-{case}"
    node_api = client.NodeV1Api(api_client)
    trusted_baseline(api_client)
    with (
        _nodes(api_client, [node], case, "p5.48xlarge"),
        ProbeKubelet(api_client, {node: "pass"}),
    ):
        create_policy(api_client, case, probe={"runtimeClassName": runtime_class})

        def waiting() -> str:
            return (read_node(api_client, node).metadata.annotations or {}).get(keys.WAITING, "")

        wait_for(
            lambda: "spec.probe.runtimeClassName" in waiting(), 60, "the RuntimeClassMissing wait"
        )
        assert f"RuntimeClass {runtime_class} (spec.probe.runtimeClassName)" in waiting()
        assert taint_keys(api_client, node) == {"sdcguard.dev/unqualified"}, "not reserved"
        assert not list_custom(api_client, "sdctests", node)
        node_api.create_runtime_class(
            client.V1RuntimeClass(metadata=client.V1ObjectMeta(name=runtime_class), handler="runc")
        )
        try:
            # The operator reads the class again within a minute.
            wait_for(lambda: node_state(api_client, node) == "Qualified", 150, f"{node} Qualified")
            (pod,) = _probe_pods(api_client, node)
            assert pod.spec.runtime_class_name == runtime_class
        finally:
            node_api.delete_runtime_class(runtime_class)


def test_no_nvlink_clique_has_more_than_its_allowance_held(api_client, operator) -> None:
    """36 nodes in NVL72-like cliques of 18, pool budgets out of the way, at most 2 held
    per clique. They join (acceptance takes no serving node, so no budget limits it),
    then their qualifications expire together: every change to the nodes while they are
    re-screened, read from a watch in the API server's order, never shows a clique with
    more than 2 nodes reserved, each clique uses its 2, and every node is re-screened."""
    case = new_case()
    fleet = parse_fleet(
        {
            "name": "cliques",
            "defaults": {"taints": ["sdcguard.dev/unqualified:NoSchedule"]},
            "nodes": [
                {
                    "namePrefix": f"nvl-{case}-",
                    "count": 36,
                    "instanceType": "p5.48xlarge",
                    "cliqueSize": 18,
                    "labels": {"sdcguard.test/case": case},
                }
            ],
            "workloads": {"enabled": False},
            "repair": {"enabled": False},
        }
    )
    names = [n.name for n in fleet.nodes]
    clique_of = {n.name: n.labels["nvidia.com/gpu.clique"] for n in fleet.nodes}
    held: dict[str, set[str]] = {c: set() for c in set(clique_of.values())}
    most: dict[str, int] = dict.fromkeys(held, 0)
    counting = threading.Event()
    stop = threading.Event()
    core = client.CoreV1Api(api_client)

    def watch_nodes() -> None:
        w = watch.Watch()
        for ev in w.stream(
            core.list_node, label_selector=f"sdcguard.test/case={case}", timeout_seconds=400
        ):
            n = ev["object"]
            name = n.metadata.name
            if name in clique_of:
                taints = {t.key for t in (n.spec.taints or [])}
                mine = held[clique_of[name]]
                if "sdcguard.dev/testing" in taints and ev["type"] != "DELETED":
                    mine.add(name)
                else:
                    mine.discard(name)
                if counting.is_set():
                    most[clique_of[name]] = max(most[clique_of[name]], len(mine))
            if stop.is_set():
                w.stop()

    def qualified_at(n: str) -> str:
        return (read_node(api_client, n).metadata.annotations or {}).get(keys.QUALIFIED_AT, "")

    trusted_baseline(api_client)
    watcher = threading.Thread(target=watch_nodes, daemon=True)
    with (
        registered_nodes(api_client, list(fleet.nodes)),
        ProbeKubelet(api_client, dict.fromkeys(names, "pass")),
    ):
        watcher.start()
        create_policy(
            api_client,
            case,
            triggers={"maxQualificationAge": "1m"},
            budgets={
                "maxConcurrentTests": 36,
                "maxUnavailable": "100%",
                "topology": [{"labelKey": "nvidia.com/gpu.clique", "maxUnavailable": 2}],
            },
        )
        for n in names:
            wait_for(lambda n=n: bool(qualified_at(n)), 240, f"{n} accepted")
        first = {n: qualified_at(n) for n in names}
        counting.set()
        for n in names:
            wait_for(lambda n=n: qualified_at(n) not in ("", first[n]), 300, f"{n} re-screened")
        stop.set()
        assert most == dict.fromkeys(held, 2), most

        def topology() -> list[dict[str, Any]]:
            (policy,) = [
                p
                for p in list_custom(api_client, "sdcpolicies")
                if p["metadata"]["name"] == f"p-{case}"
            ]
            return (policy.get("status") or {}).get("topology") or []

        wait_for(
            lambda: (
                [(t["labelKey"], t["domains"]) for t in topology()]
                == [("nvidia.com/gpu.clique", 2)]
            ),
            60,
            "the policy's topology status after a full pass",
        )
