"""How people and workloads steer the lifecycle: suspicion, manual tests, pause, opt-out,
foreign taints and cordons, manual quarantine and release, the replace strategy, drain."""

from __future__ import annotations

import time
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sdcdev.harness import (
    GATE,
    GROUP,
    NS,
    QUARANTINE,
    TESTING,
    VERSION,
    ProbeKubelet,
    create_policy,
    gpu_nodes,
    gpu_pod,
    list_custom,
    new_case,
    node_state,
    read_node,
    taint_keys,
    trusted_baseline,
    wait_for,
)
from sdcguard.builders.probe_job import job_name


def _annotate(api: client.ApiClient, name: str, annotations: dict[str, str | None]) -> None:
    client.CoreV1Api(api).patch_node(name, {"metadata": {"annotations": annotations}})


def _reasons(api: client.ApiClient, node: str) -> list[str]:
    tests = sorted(list_custom(api, "sdctests", node), key=lambda t: t["metadata"]["name"])
    return [t["spec"]["reason"] for t in tests]


def test_workload_suspicion_and_manual_test_rescreen_a_qualified_node(api_client, operator) -> None:
    case = new_case()
    node = f"sus-{case}"
    trusted_baseline(api_client)
    with gpu_nodes(api_client, [node], case=case), ProbeKubelet(api_client, {node: "pass"}):
        policy = create_policy(api_client, case)
        wait_for(lambda: node_state(api_client, node) == "Qualified", 60, "qualification")
        _annotate(api_client, node, {"sdcguard.dev/suspect": "loss spike in job llm-7b"})
        wait_for(lambda: "Suspect" in _reasons(api_client, node), 60, "a Suspect screening")
        wait_for(
            lambda: (
                node_state(api_client, node) == "Qualified"
                and "sdcguard.dev/suspect"
                not in (read_node(api_client, node).metadata.annotations or {})
            ),
            60,
            "the suspicion to be cleared by a pass",
        )
        # A person asks for a test (what `kubectl sdc test NODE` creates).
        client.CustomObjectsApi(api_client).create_cluster_custom_object(
            GROUP,
            VERSION,
            "sdctests",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "SDCTest",
                "metadata": {"name": f"manual-{case}"},
                "spec": {"nodeName": node, "policyRef": policy, "reason": "Manual"},
            },
        )
        done = wait_for(
            lambda: [
                t
                for t in list_custom(api_client, "sdctests", node)
                if t["metadata"]["name"] == f"manual-{case}"
                and (t.get("status") or {}).get("phase") == "Passed"
            ],
            60,
            "the manual test to pass",
        )
        assert done[0]["status"]["jobName"]
        wait_for(lambda: TESTING not in taint_keys(api_client, node), 30, "the reservation to end")
        assert node_state(api_client, node) == "Qualified"


def test_a_suspect_node_takes_no_more_work_until_it_is_rescreened(api_client, operator) -> None:
    """A workload reports the node it runs on: the node is held at once (no new work can
    land), the re-test waits for that workload to finish, and then runs even though a
    pending pod asks for this kind of node."""
    case = new_case()
    node = f"hold-{case}"
    trusted_baseline(api_client)
    core = client.CoreV1Api(api_client)
    with gpu_nodes(api_client, [node], case=case), ProbeKubelet(api_client, {node: "pass"}):
        policy = create_policy(api_client, case)
        wait_for(lambda: node_state(api_client, node) == "Qualified", 60, "qualification")
        core.create_namespaced_pod("default", gpu_pod(f"train-{case}", node))
        core.patch_namespaced_pod_status(
            f"train-{case}", "default", {"status": {"phase": "Running"}}
        )
        core.create_namespaced_pod("default", gpu_pod(f"queued-{case}", None))
        try:
            _annotate(api_client, node, {"sdcguard.dev/suspect": "loss spike in job llm-7b"})
            wait_for(lambda: node_state(api_client, node) == "Suspect", 30, "suspicion")
            assert TESTING in taint_keys(api_client, node), "a suspect node takes no new work"
            operator.wait_passes(policy)  # a whole full pass with the workload running
            assert "Suspect" not in _reasons(api_client, node), "re-tested under a workload"
            core.delete_namespaced_pod(f"train-{case}", "default", grace_period_seconds=0)
            wait_for(lambda: "Suspect" in _reasons(api_client, node), 60, "the re-test")
            wait_for(lambda: node_state(api_client, node) == "Qualified", 60, "cleared")
            wait_for(lambda: TESTING not in taint_keys(api_client, node), 30, "released")
        finally:
            core.delete_namespaced_pod(f"queued-{case}", "default", grace_period_seconds=0)


def test_paused_policy_starts_nothing_and_opt_out_touches_nothing(api_client, operator) -> None:
    case = new_case()
    nodes = [f"pause-{case}", f"optout-{case}"]
    trusted_baseline(api_client)
    core = client.CoreV1Api(api_client)
    with (
        gpu_nodes(api_client, nodes, case=case),
        ProbeKubelet(api_client, dict.fromkeys(nodes, "pass")),
    ):
        core.patch_node(nodes[1], {"metadata": {"labels": {"sdcguard.dev/exclude": "true"}}})
        policy = create_policy(api_client, case, paused=True)
        # A gated node that only waits costs no write: the opt-out shows the pass ran.
        wait_for(lambda: node_state(api_client, nodes[1]) == "Excluded", 30, "the nodes seen")
        operator.wait_passes(policy)
        assert list_custom(api_client, "sdctests", nodes[0]) == []
        assert GATE in taint_keys(api_client, nodes[0]), "a paused policy still gates new nodes"
        assert node_state(api_client, nodes[1]) in (None, "Excluded")
        assert list_custom(api_client, "sdctests", nodes[1]) == []
        client.CustomObjectsApi(api_client).patch_cluster_custom_object(
            GROUP, VERSION, "sdcpolicies", policy, {"spec": {"paused": False}}
        )
        wait_for(lambda: node_state(api_client, nodes[0]) == "Qualified", 60, "resume")
        operator.wait_passes(policy)
        assert list_custom(api_client, "sdctests", nodes[1]) == [], "an excluded node was tested"


def test_foreign_taints_and_cordons_survive_qualification(api_client, operator) -> None:
    case = new_case()
    nodes = [f"foreign-{case}", f"maint-{case}"]
    trusted_baseline(api_client)
    core = client.CoreV1Api(api_client)

    def add_taint(node: str, effect: str) -> None:
        taints = [t.to_dict() for t in read_node(api_client, node).spec.taints or []]
        taints.append({"key": "example.com/maintenance", "effect": effect, "value": "x"})
        taints = [
            {k: v for k, v in t.items() if v is not None and k != "time_added"} for t in taints
        ]
        core.patch_node(node, {"spec": {"taints": taints, "unschedulable": True}})

    with (
        gpu_nodes(api_client, nodes, case=case),
        ProbeKubelet(api_client, dict.fromkeys(nodes, "pass")),
    ):
        add_taint(nodes[0], "PreferNoSchedule")
        add_taint(nodes[1], "NoSchedule")
        create_policy(api_client, case)
        wait_for(lambda: node_state(api_client, nodes[0]) == "Qualified", 60, "qualification")
        n = read_node(api_client, nodes[0])
        assert "example.com/maintenance" in taint_keys(api_client, nodes[0])
        assert GATE not in taint_keys(api_client, nodes[0])
        assert n.spec.unschedulable is True, "a cordon someone else set was undone"
        assert "sdcguard.dev/cordoned-by-us" not in (n.metadata.annotations or {})
        # A taint that repels probes: no test is started that could never run.
        assert list_custom(api_client, "sdctests", nodes[1]) == []
        assert GATE in taint_keys(api_client, nodes[1])
        taints = [
            {"key": t.key, "effect": t.effect}
            for t in read_node(api_client, nodes[1]).spec.taints or []
            if t.key != "example.com/maintenance"
        ]
        core.patch_node(nodes[1], {"spec": {"taints": taints}})
        wait_for(lambda: node_state(api_client, nodes[1]) == "Qualified", 60, "maintenance over")


def test_manual_quarantine_and_release(api_client, operator) -> None:
    case = new_case()
    node = f"manual-{case}"
    trusted_baseline(api_client)
    with gpu_nodes(api_client, [node], case=case), ProbeKubelet(api_client, {node: "pass"}):
        create_policy(api_client, case)
        wait_for(lambda: node_state(api_client, node) == "Qualified", 60, "qualification")
        _annotate(api_client, node, {"sdcguard.dev/quarantine": "XID 79 storm on GPU 3"})
        wait_for(lambda: node_state(api_client, node) == "Quarantined", 30, "quarantine")
        assert QUARANTINE in taint_keys(api_client, node)
        assert read_node(api_client, node).spec.unschedulable is True
        tickets = wait_for(lambda: list_custom(api_client, "repairtickets", node), 30, "a ticket")
        assert "sdcguard.dev/quarantine" not in (
            read_node(api_client, node).metadata.annotations or {}
        )
        _annotate(api_client, node, {"sdcguard.dev/release": "false alarm, driver bug"})
        wait_for(lambda: node_state(api_client, node) == "Qualified", 30, "release")
        n = read_node(api_client, node)
        assert QUARANTINE not in taint_keys(api_client, node) and not n.spec.unschedulable
        name = tickets[0]["metadata"]["name"]
        wait_for(
            lambda: [
                t
                for t in list_custom(api_client, "repairtickets", node)
                if t["metadata"]["name"] == name and t["status"]["phase"] == "Closed"
            ],
            30,
            "the ticket to close",
        )


def test_replace_strategy_deletes_the_node_once_the_ticket_is_taken(api_client, operator) -> None:
    case = new_case()
    node = f"replace-{case}"
    trusted_baseline(api_client)
    with gpu_nodes(api_client, [node], case=case), ProbeKubelet(api_client, {node: "sdc"}):
        create_policy(api_client, case, repair={"strategy": "Replace", "maxRepairCycles": 2})
        wait_for(lambda: node_state(api_client, node) == "Quarantined", 90, "quarantine")
        assert "karpenter.sh/do-not-disrupt" not in (
            read_node(api_client, node).metadata.annotations or {}
        )
        ticket = list_custom(api_client, "repairtickets", node)[0]
        client.CustomObjectsApi(api_client).patch_cluster_custom_object(
            GROUP,
            VERSION,
            "repairtickets",
            ticket["metadata"]["name"],
            {"spec": {"external": {"system": "cloud", "id": "case-123"}}},
        )

        def gone() -> bool:
            try:
                read_node(api_client, node)
            except ApiException as exc:
                return exc.status == 404
            return False

        wait_for(gone, 60, "the node to be deleted for replacement")

        def closed() -> dict[str, Any] | None:
            t = list_custom(api_client, "repairtickets", node)[0]
            return t if (t.get("status") or {}).get("phase") == "Closed" else None

        ticket = wait_for(closed, 30, "the ticket to close once the node is gone")
        assert ticket["spec"]["resolution"] == "Replaced"
        phases = [h["phase"] for h in ticket["status"]["history"]]
        assert phases[-2:] == ["InRepair", "Closed"] and phases.count("Closed") == 1
        assert ticket["status"]["closedAt"]


def test_a_release_during_a_test_cancels_the_test_and_its_job(api_client, operator) -> None:
    case = new_case()
    node = f"rel-{case}"
    trusted_baseline(api_client)
    batch = client.BatchV1Api(api_client)
    with gpu_nodes(api_client, [node], case=case), ProbeKubelet(api_client, {node: "never"}):
        policy = create_policy(api_client, case)

        def jobs() -> list[Any]:
            return batch.list_namespaced_job(NS, label_selector=f"sdcguard.dev/node={node}").items

        # The running test's own Job: a released node is screened again once idle, and
        # that new test's Job carries the same node label.
        mine = {j.metadata.name for j in wait_for(jobs, 60, "the probe Job")}
        _annotate(api_client, node, {"sdcguard.dev/release": "needed now"})

        def cancelled() -> list[dict[str, Any]]:
            return [
                t
                for t in list_custom(api_client, "sdctests", node)
                if (t.get("status") or {}).get("phase") == "Cancelled"
            ]

        (test,) = wait_for(cancelled, 30, "the running test to be cancelled")
        assert test["status"]["completionTime"] and "needed now" in test["status"]["message"]
        assert mine == {job_name(test["metadata"]["name"])}
        wait_for(
            lambda: (
                not [
                    j
                    for j in jobs()
                    if j.metadata.name in mine and j.metadata.deletion_timestamp is None
                ]
            ),
            30,
            "the cancelled test's probe Job to be deleted",
        )
        # A whole full pass: the release is not undone by re-adopting the test.
        operator.wait_passes(policy)
        again = list_custom(api_client, "sdctests", node)
        assert [t for t in again if t["metadata"]["name"] == test["metadata"]["name"]] == [test]
        # Released, never qualified: screened again in its next idle window, by a new test.
        assert node_state(api_client, node) in ("Qualified", "Testing")
        current = read_node(api_client, node).metadata.annotations.get("sdcguard.dev/test")
        assert current != test["metadata"]["name"]


def test_quarantine_drain_taints_first_and_waits_out_a_disruption_budget(
    api_client, operator
) -> None:
    """The taint and cordon go on before any eviction; a PodDisruptionBudget that refuses
    the eviction (429) neither stops the quarantine nor ends the drain: once the budget
    allows it, the pod is evicted."""
    case = new_case()
    node = f"drain-{case}"
    pod_name = f"web-{case}"
    trusted_baseline(api_client)
    core = client.CoreV1Api(api_client)
    policy_api = client.PolicyV1Api(api_client)
    with gpu_nodes(api_client, [node], case=case), ProbeKubelet(api_client, {node: "pass"}):
        policy = create_policy(
            api_client,
            case,
            quarantine={"cordon": True, "drain": True, "drainTimeoutSeconds": 300},
        )
        wait_for(lambda: node_state(api_client, node) == "Qualified", 60, "qualification")
        core.create_namespaced_pod(
            "default",
            client.V1Pod(
                metadata=client.V1ObjectMeta(name=pod_name, labels={"app": pod_name}),
                spec=client.V1PodSpec(
                    node_name=node,
                    containers=[client.V1Container(name="web", image="example.invalid/web")],
                ),
            ),
        )
        # Running and Ready, as a kubelet would report it (a Pending pod ignores PDBs).
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        core.patch_namespaced_pod_status(
            pod_name,
            "default",
            {
                "status": {
                    "phase": "Running",
                    "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
                }
            },
        )
        policy_api.create_namespaced_pod_disruption_budget(
            "default",
            client.V1PodDisruptionBudget(
                metadata=client.V1ObjectMeta(name=pod_name),
                spec=client.V1PodDisruptionBudgetSpec(
                    min_available=1,
                    selector=client.V1LabelSelector(match_labels={"app": pod_name}),
                ),
            ),
        )
        wait_for(
            lambda: policy_api.read_namespaced_pod_disruption_budget(pod_name, "default").status,
            30,
            "the disruption controller to process the budget",
        )

        def leaving() -> bool:
            try:
                pod = core.read_namespaced_pod(pod_name, "default")
            except ApiException as exc:
                return exc.status == 404
            return pod.metadata.deletion_timestamp is not None

        try:
            _annotate(api_client, node, {"sdcguard.dev/quarantine": "bad HBM row"})
            wait_for(lambda: node_state(api_client, node) == "Quarantined", 30, "quarantine")
            n = read_node(api_client, node)
            assert QUARANTINE in taint_keys(api_client, node) and n.spec.unschedulable
            assert list_custom(api_client, "repairtickets", node), "the ticket is opened"
            # A whole full pass, and the eviction retries between: each refused by the budget.
            operator.wait_passes(policy)
            assert not leaving(), "the budget allows no disruption"
            assert "sdcguard.dev/drain-until" in (read_node(api_client, node).metadata.annotations)
        finally:
            policy_api.delete_namespaced_pod_disruption_budget(pod_name, "default")
        wait_for(leaving, 60, "the workload to be evicted once the budget is gone")
        wait_for(
            lambda: (
                "sdcguard.dev/drain-until"
                not in (read_node(api_client, node).metadata.annotations or {})
            ),
            30,
            "the drain to end",
        )


def test_match_expressions_choose_the_nodes_a_policy_screens(api_client, operator) -> None:
    case = new_case()
    inside, outside = f"expr-in-{case}", f"expr-out-{case}"
    trusted_baseline(api_client)
    with (
        gpu_nodes(api_client, [inside], case=case, pool="expr-a"),
        gpu_nodes(api_client, [outside], case=case, pool="expr-b"),
        ProbeKubelet(api_client, {inside: "pass", outside: "pass"}),
    ):
        labels = read_node(api_client, inside).metadata.labels
        pool_key = next(k for k, v in labels.items() if v == "expr-a")
        policy = create_policy(
            api_client,
            case,
            nodeSelector={
                "matchLabels": {"sdcguard.test/case": case},
                "matchExpressions": [{"key": pool_key, "operator": "NotIn", "values": ["expr-b"]}],
            },
        )
        wait_for(lambda: node_state(api_client, inside) == "Qualified", 60, "qualification")
        operator.wait_passes(policy)  # a whole full pass: the other node is not the policy's
        assert node_state(api_client, outside) is None
        assert not list_custom(api_client, "sdctests", outside)
        assert GATE in taint_keys(api_client, outside)
