"""Policy changes against the real control plane: deleting a policy releases the nodes it
held (a confirmed failure stays quarantined) and ends its tests Cancelled before its
finalizer lets it go; switching Observe to Enforce screens a gated node at once."""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sdcdev.harness import (
    GATE,
    GROUP,
    NS,
    QUARANTINE,
    VERSION,
    ProbeKubelet,
    create_policy,
    gpu_nodes,
    list_custom,
    new_case,
    node_state,
    read_node,
    trusted_baseline,
    wait_for,
)

PREFIX = "sdcguard.dev/"


def _ours(api: client.ApiClient, node: str) -> list[str]:
    """Every sdcguard.dev/ taint, label and annotation on the node."""
    body = read_node(api, node)
    meta, spec = body.metadata, body.spec
    found = [f"taint {t.key}" for t in (spec.taints or []) if t.key.startswith(PREFIX)]
    found += [f"label {k}" for k in (meta.labels or {}) if k.startswith(PREFIX)]
    found += [f"annotation {k}" for k in (meta.annotations or {}) if k.startswith(PREFIX)]
    return found


def _policy_gone(api: client.ApiClient, name: str) -> bool:
    try:
        client.CustomObjectsApi(api).get_cluster_custom_object(GROUP, VERSION, "sdcpolicies", name)
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def _jobs(api: client.ApiClient, node: str) -> list[Any]:
    batch = client.BatchV1Api(api)
    return list(batch.list_namespaced_job(NS, label_selector=f"sdcguard.dev/node={node}").items)


def test_deleting_a_policy_releases_its_nodes_and_cancels_its_tests(api_client, operator) -> None:
    """A qualified node and one under test are left with nothing of sdcguard's, the test
    in flight ends Cancelled (no verdict) with its Job deleted, and a node quarantined for
    a confirmed failure stays quarantined."""
    case = new_case()
    good, busy, bad = f"rel-good-{case}", f"rel-busy-{case}", f"rel-bad-{case}"
    trusted_baseline(api_client)
    outcomes = {good: "pass", busy: "never", bad: "sdc"}
    with (
        gpu_nodes(api_client, [good, busy, bad], case=case),
        ProbeKubelet(api_client, outcomes),
    ):
        policy = create_policy(api_client, case)
        wait_for(lambda: node_state(api_client, good) == "Qualified", 90, "the good node Qualified")
        wait_for(lambda: node_state(api_client, bad) == "Quarantined", 90, "the bad quarantined")
        wait_for(lambda: _jobs(api_client, busy), 60, "the busy node's probe Job")
        assert _ours(api_client, good), "a qualified node carries sdcguard's records"

        client.CustomObjectsApi(api_client).delete_cluster_custom_object(
            GROUP, VERSION, "sdcpolicies", policy
        )
        wait_for(lambda: _policy_gone(api_client, policy), 60, "the policy to be deleted")

        for node in (good, busy):
            assert _ours(api_client, node) == [], f"{node} keeps {_ours(api_client, node)}"
        [test] = [
            t
            for t in list_custom(api_client, "sdctests", busy)
            if t["spec"].get("policyRef") == policy
        ]
        assert test["status"]["phase"] == "Cancelled"
        assert test["status"]["reason"] == "PolicyDeleted"
        assert not test["status"].get("verdict")
        wait_for(lambda: not _jobs(api_client, busy), 30, "the busy node's Job to be deleted")

        kept = read_node(api_client, bad)
        assert QUARANTINE in {t.key for t in kept.spec.taints or []}
        assert (kept.metadata.labels or {}).get("sdcguard.dev/state") == "Quarantined"
        events = client.CoreV1Api(api_client).list_namespaced_event(
            "default", field_selector=f"involvedObject.name={bad}"
        )
        assert any(e.reason == "PolicyDeletedNodeKept" for e in events.items)


def test_switching_to_enforce_screens_a_node_backing_off_from_observe(api_client, operator) -> None:
    """An inconclusive acceptance in Observe starts a long back-off; the switch to Enforce
    gates the node, waives that back-off so a new acceptance test starts at once, and an
    Event on the policy names kubectl sdc test."""
    case = new_case()
    node = f"enforce-{case}"
    trusted_baseline(api_client)
    with gpu_nodes(api_client, [node], case=case), ProbeKubelet(api_client, {node: "garbage"}):
        policy = create_policy(
            api_client, case, mode="Observe", triggers={"inconclusiveBackoff": "1h"}
        )

        def tests() -> list[dict[str, Any]]:
            return list_custom(api_client, "sdctests", node)

        wait_for(
            lambda: any((t.get("status") or {}).get("phase") == "Inconclusive" for t in tests()),
            90,
            "the Observe acceptance test to end Inconclusive",
        )
        wait_for(
            lambda: (
                "sdcguard.dev/retry-after"
                in (read_node(api_client, node).metadata.annotations or {})
            ),
            30,
            "the back-off",
        )
        before = {t["metadata"]["name"] for t in tests()}
        client.CustomObjectsApi(api_client).patch_cluster_custom_object(
            GROUP, VERSION, "sdcpolicies", policy, {"spec": {"mode": "Enforce"}}
        )
        wait_for(
            lambda: [t for t in tests() if t["metadata"]["name"] not in before],
            60,
            "a new acceptance test despite the back-off from Observe",
        )
        wait_for(
            lambda: GATE in {t.key for t in read_node(api_client, node).spec.taints or []},
            30,
            "the gate taint under Enforce",
        )
        events = wait_for(
            lambda: [
                e
                for e in client.CoreV1Api(api_client)
                .list_namespaced_event("default", field_selector=f"involvedObject.name={policy}")
                .items
                if e.reason == "EnforceStarted"
            ],
            30,
            "the EnforceStarted Event",
        )
        assert "kubectl sdc test" in events[0].message
