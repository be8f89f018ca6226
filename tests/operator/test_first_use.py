"""What a first-time user trips over, against the real control plane: probe Jobs that
outlive their test, a hand-edited state label, echoes of huge user strings."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from sdcdev.harness import (
    GATE,
    GROUP,
    NS,
    VERSION,
    ProbeKubelet,
    create_policy,
    create_sdctest,
    gpu_nodes,
    gpu_pod,
    list_custom,
    new_case,
    node_state,
    policy_body,
    taint_keys,
    trusted_baseline,
    wait_for,
)
from sdcguard.domain import keys


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


def test_a_test_a_policy_change_ended_is_cancelled_and_takes_its_job(api_client, operator) -> None:
    """The node leaves the policy while its probe runs: the test ends Cancelled (no
    verdict, so no back-off), says truly why (the node exists), and its Job (whose Pod
    holds the node's GPUs) is gone."""
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
                if (t.get("status") or {}).get("phase") == "Cancelled"
            ],
            60,
            "the test to end Cancelled",
        )[0]
        assert test["status"]["reason"] == "NodeLeftPolicy"
        assert not test["status"].get("verdict")
        assert "no longer exists" not in test["status"]["message"]
        wait_for(lambda: not _jobs(api_client, node), 30, "the probe Job to be deleted")


def test_a_node_another_policy_takes_mid_screening_is_screened_by_it_at_once(
    api_client, operator
) -> None:
    """A more specific policy takes the node while the first one screens it (a user's
    first policy beside the chart's catch-all): the first test ends Cancelled, and the
    new owner reads that outcome (the node's current test is not its own) and screens
    the node at once: no back-off, though its own back-off is an hour."""
    case = new_case()
    node = f"handover-{case}"
    trusted_baseline(api_client)
    with (
        gpu_nodes(api_client, [node], case=case),
        ProbeKubelet(api_client, {node: "never"}) as kubelet,
    ):
        first = create_policy(api_client, case)
        wait_for(lambda: _jobs(api_client, node), 60, "the first policy's probe Job")
        second = f"p2-{case}"
        body = policy_body(
            second,
            match_labels={"sdcguard.test/case": case, "sdcguard.test/handover": case},
            triggers={"inconclusiveBackoff": "1h"},
        )
        client.CustomObjectsApi(api_client).create_cluster_custom_object(
            GROUP, VERSION, "sdcpolicies", body
        )
        client.CoreV1Api(api_client).patch_node(
            node, {"metadata": {"labels": {"sdcguard.test/handover": case}}}
        )

        def tests_of(policy: str) -> list[dict[str, Any]]:
            return [
                t
                for t in list_custom(api_client, "sdctests", node)
                if t["spec"].get("policyRef") == policy
            ]

        wait_for(
            lambda: any(
                (t.get("status") or {}).get("phase") == "Cancelled" for t in tests_of(first)
            ),
            60,
            "the first policy's test to end Cancelled",
        )
        kubelet.outcomes[node] = "pass"
        wait_for(lambda: tests_of(second), 60, "the new owner's test of the node")
        wait_for(lambda: node_state(api_client, node) == "Qualified", 90, "the node Qualified")
        annotations = client.CoreV1Api(api_client).read_node(node).metadata.annotations or {}
        assert keys.RETRY_AFTER not in annotations
        assert keys.INCONCLUSIVE not in annotations


def test_a_hand_edited_state_label_is_corrected_and_not_counted(api_client, operator) -> None:
    """``kubectl label node N sdcguard.dev/state=Qualified`` on a gated node under test:
    the node stays gated, the label says Testing again, the policy counts it Testing,
    and an Event records the correction; a label naming no state is corrected too."""
    case = new_case()
    node = f"label-{case}"
    trusted_baseline(api_client)
    core = client.CoreV1Api(api_client)
    custom = client.CustomObjectsApi(api_client)
    with gpu_nodes(api_client, [node], case=case), ProbeKubelet(api_client, {node: "never"}):
        policy = create_policy(api_client, case)
        wait_for(lambda: node_state(api_client, node) == "Testing", 60, "the node under test")
        for label in ("Qualified", "Nonsense"):
            core.patch_node(node, {"metadata": {"labels": {"sdcguard.dev/state": label}}})
            wait_for(lambda: node_state(api_client, node) == "Testing", 60, f"{label} corrected")
            assert GATE in taint_keys(api_client, node)
            wait_for(
                lambda label=label: [
                    e
                    for e in _events(api_client, node)
                    if e.reason == "StateLabelCorrected" and f"={label}" in e.message
                ],
                30,
                f"an Event about the {label} label",
            )

        def counts() -> dict[str, int]:
            body = custom.get_cluster_custom_object(GROUP, VERSION, "sdcpolicies", policy)
            return dict((body.get("status") or {}).get("counts") or {})

        wait_for(lambda: counts().get("testing") == 1, 60, "the policy to count it Testing")
        assert not counts().get("qualified")


def _ready(api: client.ApiClient, node: str, ready: bool) -> None:
    condition = {
        "type": "Ready",
        "status": "True" if ready else "False",
        "reason": "KubeletReady" if ready else "KubeletNotReady",
        "message": "test",
        "lastHeartbeatTime": None,
    }
    client.CoreV1Api(api).patch_node_status(node, {"status": {"conditions": [condition]}})


def test_a_repaired_node_that_is_not_ready_says_why_it_waits(api_client, operator) -> None:
    """After the repair is resolved, a node that is not Ready waits for verification:
    the node, its ticket's Waiting condition and (after a minute) an Event say why."""
    case = new_case()
    node = f"wait-{case}"
    trusted_baseline(api_client)
    outcomes = {node: "sdc"}
    with gpu_nodes(api_client, [node], case=case) as beats, ProbeKubelet(api_client, outcomes):
        create_policy(api_client, case)
        wait_for(lambda: node_state(api_client, node) == "Quarantined", 90, "quarantine")
        ticket = list_custom(api_client, "repairtickets", node)[0]["metadata"]["name"]
        beats.forget(node)
        _ready(api_client, node, False)
        outcomes[node] = "pass"
        client.CustomObjectsApi(api_client).patch_cluster_custom_object(
            GROUP, VERSION, "repairtickets", ticket, {"spec": {"resolution": "Repaired"}}
        )

        def annotation() -> str:
            meta = client.CoreV1Api(api_client).read_node(node).metadata
            return str((meta.annotations or {}).get("sdcguard.dev/waiting", ""))

        wait_for(lambda: "node not Ready" in annotation(), 60, "the wait on the node")

        def waiting_condition() -> dict[str, Any]:
            body = list_custom(api_client, "repairtickets", node)[0]
            conditions = (body.get("status") or {}).get("conditions") or []
            return next((c for c in conditions if c["type"] == "Waiting"), {})

        wait_for(lambda: waiting_condition().get("status") == "True", 30, "Waiting on the ticket")
        assert "node not Ready" in waiting_condition()["message"]
        assert node_state(api_client, node) == "Quarantined"
        wait_for(
            lambda: [
                e
                for e in _events(api_client, node)
                if e.reason == "Waiting" and "node not Ready" in e.message
            ],
            120,
            "a Waiting Event",
        )
        # The kubelet comes back: heartbeats resume, so the node lifecycle controller
        # does not mark the node Unknown (and taint it unreachable) mid-verification.
        _ready(api_client, node, True)
        cfg = next(n for n in beats.nodes if n.name == node)
        beats.adopt(cfg, str(client.CoreV1Api(api_client).read_node(node).metadata.uid))
        wait_for(lambda: node_state(api_client, node) == "Qualified", 120, "verification")
        assert annotation() == ""
        assert waiting_condition().get("status") != "True"


def test_overlapping_policies_are_told_on_both_and_on_the_node(api_client, operator) -> None:
    """A second, more specific policy takes a node: both policies' PolicyOverlap
    condition names the node and its owner, an Event on the node says which rule chose,
    and the first policy's running test says the node left it (not that it is gone)."""
    case = new_case()
    node = f"overlap-{case}"
    trusted_baseline(api_client)
    custom = client.CustomObjectsApi(api_client)
    with gpu_nodes(api_client, [node], case=case), ProbeKubelet(api_client, {node: "never"}):
        first = create_policy(api_client, case)
        wait_for(lambda: _jobs(api_client, node), 60, "the first policy's probe Job")
        second = f"q-{case}"
        labels = {"sdcguard.test/case": case, "sdcguard.test/overlap": "yes"}
        client.CoreV1Api(api_client).patch_node(
            node, {"metadata": {"labels": {"sdcguard.test/overlap": "yes"}}}
        )
        custom.create_cluster_custom_object(
            GROUP, VERSION, "sdcpolicies", policy_body(second, match_labels=labels)
        )

        def overlap(name: str) -> dict[str, Any]:
            body = custom.get_cluster_custom_object(GROUP, VERSION, "sdcpolicies", name)
            conditions = (body.get("status") or {}).get("conditions") or []
            return next((c for c in conditions if c["type"] == "PolicyOverlap"), {})

        for name in (first, second):
            wait_for(lambda n=name: overlap(n).get("status") == "True", 90, f"{name} overlap")
            assert (
                node in overlap(name)["message"] and f"owner {second}" in overlap(name)["message"]
            )
        wait_for(
            lambda: [e for e in _events(api_client, node) if e.reason == "PolicyOverlap"],
            30,
            "an Event about the overlap",
        )
        ended = [
            t
            for t in list_custom(api_client, "sdctests", node)
            if t["spec"]["policyRef"] == first and (t.get("status") or {}).get("reason")
        ]
        assert ended and all("no longer exists" not in t["status"]["message"] for t in ended)
        custom.delete_cluster_custom_object(GROUP, VERSION, "sdcpolicies", second)


def test_a_policy_that_selects_no_node_says_so(api_client, operator) -> None:
    """A selector that matches no node is not plain Ready "0 nodes": NoNodesSelected is
    True and says what to check, and turns False once a node is selected."""
    case = new_case()
    custom = client.CustomObjectsApi(api_client)
    policy = create_policy(api_client, case)

    def condition(kind: str) -> dict[str, Any]:
        body = custom.get_cluster_custom_object(GROUP, VERSION, "sdcpolicies", policy)
        conditions = (body.get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == kind), {})

    wait_for(lambda: condition("NoNodesSelected").get("status") == "True", 60, "NoNodesSelected")
    message = condition("NoNodesSelected")["message"]
    assert f"sdcguard.test/case={case}" in message and "selects no node" in message
    assert condition("Ready")["reason"] == "NoNodesSelected"
    assert condition("Ready")["status"] == "False", "a policy that screens nothing is not Ready"
    node = f"none-{case}"
    with gpu_nodes(api_client, [node], case=case), ProbeKubelet(api_client, {node: "never"}):
        wait_for(
            lambda: condition("NoNodesSelected").get("status") == "False", 60, "a node selected"
        )
        assert condition("Ready")["reason"] == "Reconciled"


def _manual_test(api_client: client.ApiClient, name: str, node: str, policy: str) -> None:
    """A hand-written SDCTest that names no suite (the operator picks it)."""
    create_sdctest(
        client.CustomObjectsApi(api_client),
        name,
        {"nodeName": node, "policyRef": policy, "reason": "Manual"},
    )


def _test_status(api_client: client.ApiClient, name: str) -> dict[str, Any]:
    body = client.CustomObjectsApi(api_client).get_cluster_custom_object(
        GROUP, VERSION, "sdctests", name
    )
    return dict(body.get("status") or {})


def _waiting(api_client: client.ApiClient, name: str) -> dict[str, Any]:
    conditions = _test_status(api_client, name).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Waiting"), {})


def _checks(job: client.V1Job) -> list[str]:
    args = list(job.spec.template.spec.containers[0].args or [])
    return args[args.index("--checks") + 1].split(",")


def test_hand_written_tests_say_why_they_wait_and_get_the_operators_suite(
    api_client, operator
) -> None:
    """A person's SDCTests without a suite: on a node that is not Ready the test waits
    with a Waiting condition (NodeNotReady) and the node says so; once Ready it runs the
    acceptance suite (the node never qualified). A second test while the first runs
    waits (AnotherTest) without a Job of its own, then runs requalification."""
    case = new_case()
    node = f"hand-{case}"
    trusted_baseline(api_client)
    outcomes = {node: "never"}
    core = client.CoreV1Api(api_client)
    with gpu_nodes(api_client, [node], case=case) as beats, ProbeKubelet(api_client, outcomes):
        # Paused: the operator starts no test of its own; a person's tests still run.
        policy = create_policy(api_client, case, paused=True)
        beats.forget(node)
        _ready(api_client, node, False)
        first, second = f"{node}-manual-1", f"{node}-manual-2"
        _manual_test(api_client, first, node, policy)
        wait_for(
            lambda: _waiting(api_client, first).get("reason") == "NodeNotReady",
            60,
            "the first test's Waiting condition",
        )
        assert _waiting(api_client, first)["status"] == "True"
        assert "node not Ready" in _waiting(api_client, first)["message"]
        annotations = core.read_node(node).metadata.annotations or {}
        assert first in annotations.get("sdcguard.dev/waiting", "")
        assert not _jobs(api_client, node)

        _ready(api_client, node, True)
        cfg = next(n for n in beats.nodes if n.name == node)
        beats.adopt(cfg, str(core.read_node(node).metadata.uid))
        wait_for(lambda: _jobs(api_client, node), 90, "the first test's probe Job")
        wait_for(lambda: _test_status(api_client, first).get("phase") == "Running", 30, "Running")
        assert _test_status(api_client, first)["suite"] == "acceptance"
        assert "memory" in _checks(_jobs(api_client, node)[0]), "the acceptance suite's checks"
        assert _waiting(api_client, first)["status"] == "False"

        _manual_test(api_client, second, node, policy)
        wait_for(
            lambda: _waiting(api_client, second).get("reason") == "AnotherTest",
            60,
            "the second test's Waiting condition",
        )
        assert first in _waiting(api_client, second)["message"]
        assert [j.metadata.name for j in _jobs(api_client, node)] == [
            _test_status(api_client, first)["jobName"]
        ], "no Job for the test that waits"

        outcomes[node] = "pass"
        wait_for(lambda: _test_status(api_client, first).get("phase") == "Passed", 60, "pass")
        wait_for(
            lambda: _test_status(api_client, second).get("phase") == "Passed", 90, "the second"
        )
        assert _test_status(api_client, second)["suite"] == "requalification"
        assert _waiting(api_client, second)["status"] == "False"


def test_a_huge_suspect_annotation_is_echoed_cut_in_logs_and_events(api_client, operator) -> None:
    """A 240,000-character ``sdcguard.dev/suspect`` reaches the log and the Event cut,
    saying so, and the node is re-screened as asked."""
    case = new_case()
    node = f"huge-{case}"
    trusted_baseline(api_client)
    with gpu_nodes(api_client, [node], case=case), ProbeKubelet(api_client, {node: "pass"}):
        create_policy(api_client, case)
        wait_for(lambda: node_state(api_client, node) == "Qualified", 60, "qualification")
        client.CoreV1Api(api_client).patch_node(
            node, {"metadata": {"annotations": {"sdcguard.dev/suspect": "w" * 240_000}}}
        )
        wait_for(
            lambda: [
                t
                for t in list_custom(api_client, "sdctests", node)
                if t["spec"]["reason"] == "Suspect"
            ],
            60,
            "the suspect's re-test",
        )
        cut = "(cut, 240000 characters)"
        told = wait_for(
            lambda: [e for e in _events(api_client, node) if cut in (e.message or "")],
            30,
            "an Event that says the reason was cut",
        )
        assert all(len(e.message or "") <= 1024 for e in _events(api_client, node))
        assert told
        lines = operator.log_path.read_text(errors="replace").splitlines()
        assert any(cut in line for line in lines), "the log says it was cut"
        assert max(len(line) for line in lines) < 8192


def test_a_test_whose_probe_pod_cannot_be_scheduled_says_why(api_client, operator) -> None:
    """A workload holds every GPU of a qualified node when a person asks for a test: the
    probe Pod cannot be scheduled, and the test says so (Waiting, ProbeUnschedulable,
    quoting the scheduler), as does the node; once the workload is gone it runs."""
    case = new_case()
    node = f"busy-{case}"
    trusted_baseline(api_client)
    core = client.CoreV1Api(api_client)
    with gpu_nodes(api_client, [node], case=case), ProbeKubelet(api_client, {node: "pass"}):
        policy = create_policy(api_client, case)
        wait_for(lambda: node_state(api_client, node) == "Qualified", 60, "qualification")
        workload = f"train-{case}"
        core.create_namespaced_pod("default", gpu_pod(workload, node))
        name = f"{node}-manual-1"
        try:
            _manual_test(api_client, name, node, policy)
            wait_for(
                lambda: _waiting(api_client, name).get("reason") == "ProbeUnschedulable",
                90,
                "the test's Waiting condition",
            )
            assert "nvidia.com/gpu" in _waiting(api_client, name)["message"]
            annotations = core.read_node(node).metadata.annotations or {}
            assert "cannot be scheduled" in annotations.get("sdcguard.dev/waiting", "")
        finally:
            core.delete_namespaced_pod(workload, "default", grace_period_seconds=0)
        wait_for(lambda: _test_status(api_client, name).get("phase") == "Passed", 120, "a pass")
        assert _waiting(api_client, name)["status"] == "False"
