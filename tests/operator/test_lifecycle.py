"""The node lifecycle end to end: real API server, scheduler, Job controller, operator process.

Probe Pods are completed by :class:`ProbeKubelet` with result documents built from
the probe's own models; the e2e tests run the real probe through the simulator.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import time
from typing import Any

from kubernetes import client

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
    ticket_in_phase,
    trusted_baseline,
    wait_for,
)
from tests.chart.alerts import alert_expr, scrape_url
from tests.promql import firing


def _events(api: client.ApiClient, node: str) -> list[str]:
    items = (
        client.CoreV1Api(api)
        .list_namespaced_event("default", field_selector=f"involvedObject.name={node}")
        .items
    )
    return [e.reason for e in items]


def _condition(api_client, node: str, kind: str) -> tuple[str, str, dt.datetime | None]:
    """A Node condition's (status, reason, lastTransitionTime); ("", "", None) if absent."""
    for c in read_node(api_client, node).status.conditions or []:
        if c.type == kind:
            return c.status, c.reason or "", c.last_transition_time
    return "", "", None


def test_join_acceptance_qualifies_and_removes_gate(api_client, operator) -> None:
    case = new_case()
    nodes = [f"join-{case}-{i}" for i in range(2)]
    trusted_baseline(api_client)
    with (
        gpu_nodes(api_client, nodes, case=case),
        ProbeKubelet(api_client, dict.fromkeys(nodes, "pass")),
    ):
        create_policy(api_client, case)
        for n in nodes:
            wait_for(lambda n=n: node_state(api_client, n) == "Qualified", 60, f"{n} Qualified")
            assert GATE not in taint_keys(api_client, n)
            assert TESTING not in taint_keys(api_client, n)
            assert not read_node(api_client, n).spec.unschedulable
            tests = list_custom(api_client, "sdctests", n)
            assert [t["spec"]["reason"] for t in tests] == ["Join"]
            assert tests[0]["status"]["phase"] == "Passed"
            assert tests[0]["status"]["verdict"] == "Pass"
            wait_for(
                lambda n=n: _condition(api_client, n, "SDCQualified")[:2] == ("True", "Certified"),
                30,
                f"{n} SDCQualified=True",
            )
            # The screening said when it would end: its budget plus the start allowance,
            # within the Job's deadline (30 s budget, 120 s deadline in this policy).
            status = tests[0]["status"]
            assert status["budgetSeconds"] == 30
            started = dt.datetime.fromisoformat(status["startTime"])
            ends = dt.datetime.fromisoformat(status["expectedEnd"])
            assert ends - started == dt.timedelta(seconds=120)
            # A result that says nothing of a catch target records none, and no condition.
            assert status.get("catchTargetMet") is None
            assert "CatchTargetMet" not in {c["type"] for c in status["conditions"]}
            # A clean screening posts no Event by default (routineEvents off): the
            # SDCTest records it.
            assert not {"TestStarted", "Qualified"} & set(_events(api_client, n))
            annotations = read_node(api_client, n).metadata.annotations or {}
            assert "sdcguard.dev/qualified-at" in annotations
            # Kopf keeps no bookkeeping on Nodes.
            assert not [k for k in annotations if "kopf" in k]


def test_consensus_establishes_baseline_then_qualifies(api_client, operator) -> None:
    """No trusted baseline: the first screenings wait; two agreeing nodes make it trusted."""
    case = new_case()
    custom = client.CustomObjectsApi(api_client)
    for item in list_custom(api_client, "sdcbaselines"):
        custom.delete_cluster_custom_object(
            GROUP, VERSION, "sdcbaselines", item["metadata"]["name"]
        )
    nodes = [f"cons-{case}-{i}" for i in range(3)]
    outcomes = {nodes[0]: "pass", nodes[1]: "pass", nodes[2]: "mismatch"}
    with gpu_nodes(api_client, nodes, case=case), ProbeKubelet(api_client, outcomes):
        create_policy(api_client, case)
        wait_for(
            lambda: all(node_state(api_client, n) == "Qualified" for n in nodes[:2]),
            90,
            "the agreeing nodes to qualify",
        )
        baselines = list_custom(api_client, "sdcbaselines")
        assert len(baselines) == 1 and baselines[0]["spec"]["trusted"] is True
        assert sorted(baselines[0]["spec"]["recordedFrom"]) == sorted(nodes[:2])
        wait_for(
            lambda: node_state(api_client, nodes[2]) in ("Quarantined", "Suspect"),
            90,
            "the disagreeing node to be held",
        )
        assert GATE in taint_keys(api_client, nodes[2]) or QUARANTINE in taint_keys(
            api_client, nodes[2]
        )


def test_tests_awaiting_a_baseline_leave_room_for_the_quorum(api_client, operator) -> None:
    """The chart's defaults, two tests at once and a quorum of 3: the first two screenings
    wait for a baseline, and the third node is screened at once (it used to wait for
    their deadline), so all three qualify."""
    case = new_case()
    custom = client.CustomObjectsApi(api_client)
    for item in list_custom(api_client, "sdcbaselines"):
        custom.delete_cluster_custom_object(
            GROUP, VERSION, "sdcbaselines", item["metadata"]["name"]
        )
    nodes = [f"quo-{case}-{i}" for i in range(3)]
    with (
        gpu_nodes(api_client, nodes, case=case),
        ProbeKubelet(api_client, dict.fromkeys(nodes, "pass")),
    ):
        create_policy(
            api_client,
            case,
            baseline={"mode": "Consensus", "quorum": 3},
            budgets={"maxConcurrentTests": 2, "maxUnavailable": "100%"},
            probe={"budgetSeconds": 30, "activeDeadlineSeconds": 600, "cpuDevices": 2},
        )
        wait_for(
            lambda: all(node_state(api_client, n) == "Qualified" for n in nodes),
            60,
            "all three nodes to qualify by consensus (well before the 600 s deadline)",
        )
        (baseline,) = list_custom(api_client, "sdcbaselines")
        assert baseline["spec"]["trusted"] is True
        assert sorted(baseline["spec"]["recordedFrom"]) == sorted(nodes)


def test_failure_confirmed_quarantines_then_repair_returns_node(api_client, operator) -> None:
    case = new_case()
    node = f"sick-{case}"
    trusted_baseline(api_client)
    outcomes = {node: "sdc@5@11"}  # device 5 disagrees from step 11
    with gpu_nodes(api_client, [node], case=case), ProbeKubelet(api_client, outcomes):
        policy = create_policy(api_client, case)
        wait_for(lambda: node_state(api_client, node) == "Quarantined", 90, "quarantine")
        # The SDCQualified condition follows the node patch (remediators read it), and
        # the kubelet's Ready condition stays beside it.
        wait_for(
            lambda: _condition(api_client, node, "SDCQualified")[:2] == ("False", "Quarantined"),
            30,
            "SDCQualified=False",
        )
        assert _condition(api_client, node, "Ready")[0] == "True"
        quarantined_at = _condition(api_client, node, "SDCQualified")[2]
        n = read_node(api_client, node)
        assert QUARANTINE in taint_keys(api_client, node)
        assert n.spec.unschedulable is True
        assert n.metadata.annotations.get("sdcguard.dev/cordoned-by-us") == "true"
        assert n.metadata.annotations.get("karpenter.sh/do-not-disrupt") == "true"
        tests = sorted(
            list_custom(api_client, "sdctests", node), key=lambda t: t["metadata"]["name"]
        )
        assert [t["spec"]["reason"] for t in tests] == ["Join", "Confirmation"]
        assert all(t["status"]["verdict"] == "SDC" for t in tests)
        # The confirmation repeats the failed screening's own data (its data seed).
        data_seeds = [t["status"].get("dataSeed") for t in tests]
        assert data_seeds[0] is not None and data_seeds[1] == data_seeds[0], data_seeds
        golden = next(c for c in tests[0]["status"]["checks"] if c["name"] == "golden")
        assert golden["oddDevice"] == 5 and golden["firstDivergentStep"] == 11
        # A new ticket is created before the node's patch and its Open status written
        # after it (plan stage STATUSES), so a reader may see the quarantine first.
        wait_for(lambda: ticket_in_phase(api_client, node, "Open"), 30, "the ticket's Open status")
        tickets = list_custom(api_client, "repairtickets", node)
        assert len(tickets) == 1
        ticket = tickets[0]
        assert ticket["status"]["phase"] == "Open"
        assert set(ticket["spec"]["evidence"]) == {t["metadata"]["name"] for t in tests}
        # The ticket carries where the fault was located, for each failing test.
        assert sorted(
            (f["test"], f["check"], f["oddDevice"], f["firstDivergentStep"])
            for f in ticket["spec"]["findings"]
        ) == sorted((t["metadata"]["name"], "golden", 5, 11) for t in tests)
        assert all(
            f["firstDivergentSubmodule"] == "layers.0.attention.output"
            for f in ticket["spec"]["findings"]
        )
        assert ticket["spec"]["policyRef"] == policy
        # The node's Events are the quarantine's last writes, after the ticket's status.
        wait_for(
            lambda: {"Quarantined", "SDCSuspected"} <= set(_events(api_client, node)),
            30,
            "the Quarantined and SDCSuspected Events",
        )

        # The repair side fixes the node and says so on the ticket.
        outcomes[node] = "pass"
        client.CustomObjectsApi(api_client).patch_cluster_custom_object(
            GROUP,
            VERSION,
            "repairtickets",
            ticket["metadata"]["name"],
            {"spec": {"resolution": "Repaired", "resolutionNote": "GPU 1 reseated"}},
        )
        wait_for(lambda: node_state(api_client, node) == "Qualified", 90, "return to the pool")
        wait_for(
            lambda: _condition(api_client, node, "SDCQualified")[:2] == ("True", "Certified"),
            30,
            "SDCQualified=True",
        )
        assert _condition(api_client, node, "SDCQualified")[2] >= quarantined_at
        assert _condition(api_client, node, "Ready")[0] == "True"
        n = read_node(api_client, node)
        assert not n.spec.unschedulable
        assert taint_keys(api_client, node) & {GATE, TESTING, QUARANTINE} == set()
        assert "karpenter.sh/do-not-disrupt" not in (n.metadata.annotations or {})
        ticket = list_custom(api_client, "repairtickets", node)[0]
        assert ticket["status"]["phase"] == "Closed"
        phases = [h["phase"] for h in ticket["status"]["history"]]
        assert phases[0] == "Open" and "Verifying" in phases and phases[-1] == "Closed"
        reasons = [t["spec"]["reason"] for t in list_custom(api_client, "sdctests", node)]
        assert "RepairVerification" in reasons


def test_repeated_failures_retire_the_node(api_client, operator) -> None:
    case = new_case()
    node = f"bad-{case}"
    trusted_baseline(api_client)
    with gpu_nodes(api_client, [node], case=case), ProbeKubelet(api_client, {node: "sdc"}):
        create_policy(api_client, case, repair={"maxRepairCycles": 2})
        custom = client.CustomObjectsApi(api_client)
        for cycle in (1, 2):

            def repaired_ticket(cycle: int = cycle) -> dict[str, Any] | None:
                tickets = list_custom(api_client, "repairtickets", node)
                if not tickets or node_state(api_client, node) != "Quarantined":
                    return None
                t = tickets[0]
                ok = (t.get("status") or {}).get("cycle") == cycle and not t["spec"].get(
                    "resolution"
                )
                return t if ok else None

            ticket = wait_for(repaired_ticket, 90, f"quarantine, cycle {cycle}")
            custom.patch_cluster_custom_object(
                GROUP,
                VERSION,
                "repairtickets",
                ticket["metadata"]["name"],
                {"spec": {"resolution": "Repaired"}},
            )
        wait_for(lambda: node_state(api_client, node) == "Retired", 90, "retirement")
        assert read_node(api_client, node).spec.unschedulable is True
        # The ticket's phase, the hardware records and then the Event follow the node's
        # write (plan stages STATUSES, HISTORY, EVENTS): a reader may see the node first.
        wait_for(
            lambda: all(
                (t.get("status") or {}).get("phase") == "Retired"
                for t in list_custom(api_client, "repairtickets", node)
            ),
            30,
            "ticket retired",
        )
        tickets = list_custom(api_client, "repairtickets", node)
        assert len(tickets) == 1 and tickets[0]["status"]["phase"] == "Retired"
        wait_for(lambda: "Retired" in _events(api_client, node), 30, "Retired Event")


def test_idle_return_from_use_retests(api_client, operator) -> None:
    case = new_case()
    node = f"idle-{case}"
    trusted_baseline(api_client)
    core = client.CoreV1Api(api_client)
    with gpu_nodes(api_client, [node], case=case), ProbeKubelet(api_client, {node: "pass"}):
        policy = create_policy(api_client, case)
        wait_for(lambda: node_state(api_client, node) == "Qualified", 60, "qualification")
        # A customer workload uses the GPUs, then leaves.
        core.create_namespaced_pod("default", gpu_pod(f"train-{case}", node))
        core.patch_namespaced_pod_status(
            f"train-{case}", "default", {"status": {"phase": "Running"}}
        )
        operator.wait_passes(policy)  # a whole full pass saw the pod running
        assert len(list_custom(api_client, "sdctests", node)) == 1, "tested while in use"
        core.delete_namespaced_pod(f"train-{case}", "default", grace_period_seconds=0)
        retest = wait_for(
            lambda: [
                t
                for t in list_custom(api_client, "sdctests", node)
                if t["spec"]["reason"] == "ReturnFromUse"
            ],
            60,
            "a return-from-use screening",
        )
        assert retest[0]["spec"]["suite"] == "requalification"
        wait_for(
            lambda: (
                node_state(api_client, node) == "Qualified"
                and (list_custom(api_client, "sdctests", node)[-1].get("status") or {}).get("phase")
                == "Passed"
            ),
            60,
            "requalification",
        )


def test_budget_is_never_exceeded(api_client, operator) -> None:
    """maxConcurrentTests while ten new nodes take their acceptance test, then
    maxUnavailable (20% of ten: two) while the qualified nodes are re-screened on expiry:
    never more than two serving nodes are held at once, and the limit is reached."""
    case = new_case()
    nodes = [f"budget-{case}-{i}" for i in range(10)]
    trusted_baseline(api_client)

    def running() -> list[dict[str, Any]]:
        return [
            t
            for t in list_custom(api_client, "sdctests")
            if t["spec"]["nodeName"] in nodes
            and (t.get("status") or {}).get("phase")
            not in ("Passed", "Failed", "Inconclusive", "Cancelled")
        ]

    with (
        gpu_nodes(api_client, nodes, case=case),
        ProbeKubelet(api_client, dict.fromkeys(nodes, "pass")),
    ):
        create_policy(
            api_client,
            case,
            budgets={"maxConcurrentTests": 2, "maxUnavailable": "20%"},
            triggers={"maxQualificationAge": "1m"},
        )
        peak = 0
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            now_running = running()
            peak = max(peak, len(now_running))
            assert len(now_running) <= 2, [t["metadata"]["name"] for t in now_running]
            if all(node_state(api_client, n) == "Qualified" for n in nodes):
                break
            time.sleep(0.2)
        assert all(node_state(api_client, n) == "Qualified" for n in nodes)
        assert peak == 2

        # Re-screening on expiry takes serving nodes: maxUnavailable bounds them.
        core = client.CoreV1Api(api_client)
        held_peak = 0
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            held = [
                n.metadata.name
                for n in core.list_node(label_selector=f"sdcguard.test/case={case}").items
                if TESTING in {t.key for t in n.spec.taints or []}
            ]
            held_peak = max(held_peak, len(held))
            assert len(held) <= 2, f"{len(held)} serving nodes held at once: {held}"
            screened = {
                t["spec"]["nodeName"]
                for t in list_custom(api_client, "sdctests")
                if t["spec"]["nodeName"] in nodes
                and t["spec"]["reason"] == "Expiry"
                and (t.get("status") or {}).get("phase") == "Passed"
            }
            if screened == set(nodes):
                break
            time.sleep(0.2)
        assert screened == set(nodes), f"not re-screened: {sorted(set(nodes) - screened)}"
        assert held_peak == 2


def test_breaker_counts_nodes_and_holds_without_retesting(api_client, operator) -> None:
    """Six nodes screened one at a time, the first four with SDC, each confirmed by a
    re-run. The breaker counts nodes (confirmation re-runs are not extra samples): three
    are quarantined, the fourth's confirmed failure trips it and is held, without a
    re-test loop, until a person resets the breaker; healthy nodes still qualify."""
    case = new_case()
    nodes = [f"brk-{case}-{i}" for i in range(6)]
    trusted_baseline(api_client)
    outcomes = {n: ("sdc" if i < 4 else "pass") for i, n in enumerate(nodes)}
    custom = client.CustomObjectsApi(api_client)
    with gpu_nodes(api_client, nodes, case=case), ProbeKubelet(api_client, outcomes):
        policy = create_policy(
            api_client,
            case,
            confirmation={"reruns": 1},
            circuitBreaker={"window": "1h", "minSamples": 4, "maxFailureFraction": 0.5},
            budgets={"maxConcurrentTests": 1, "maxUnavailable": "100%"},
        )

        def status() -> dict[str, Any]:
            body = custom.get_cluster_custom_object(GROUP, VERSION, "sdcpolicies", policy)
            return body.get("status") or {}

        def held() -> dict[str, Any] | None:
            s = status()
            cond = next((c for c in s.get("conditions", []) if c["type"] == "BreakerOpen"), None)
            ok = cond and cond["status"] == "True" and (s.get("breaker") or {}).get("heldNodes")
            return s if ok else None

        s = wait_for(held, 150, "the breaker to trip and hold a node")
        # Which sick node is the fourth to be confirmed depends on when each joined and
        # when its confirmation got the one test slot: new nodes go before suspects.
        (last,) = s["breaker"]["heldNodes"]
        assert last in nodes[:4], s["breaker"]
        # The chart's alert fires for this policy on the operator's own /metrics.
        breaker_alert = alert_expr("SdcguardCircuitBreakerOpen")
        scraped = [scrape_url(operator.metrics_url)]
        assert {"policy": policy} in firing(breaker_alert, scraped)
        cond = next(c for c in s["conditions"] if c["type"] == "BreakerOpen")
        # Three confirmed failures and one or two passes when it tripped.
        assert re.search(r"\b3 of [45] nodes screened had confirmed failures", cond["message"])
        states = {n: node_state(api_client, n) for n in nodes[:4]}
        assert states == {n: "Suspect" if n == last else "Quarantined" for n in nodes[:4]}
        annotations = read_node(api_client, last).metadata.annotations or {}
        assert "circuit breaker open" in annotations.get("sdcguard.dev/held", "")
        wait_for(
            lambda: all(node_state(api_client, n) == "Qualified" for n in nodes[4:]),
            90,
            "healthy new nodes to qualify while the breaker is open",
        )
        tests_held = len(list_custom(api_client, "sdctests", last))
        # Whole full passes for longer than the policy's inconclusive back-off (5 s): no
        # re-test.
        operator.wait_passes(policy, 2 + math.ceil(5 / operator.resync_seconds))
        assert len(list_custom(api_client, "sdctests", last)) == tests_held, "re-tested"
        assert node_state(api_client, last) == "Suspect"

        # A person investigates and resets the breaker: the held node is re-tested and,
        # failing again, quarantined.
        custom.patch_cluster_custom_object(
            GROUP,
            VERSION,
            "sdcpolicies",
            policy,
            {"metadata": {"annotations": {"sdcguard.dev/reset-breaker": "oncall-1"}}},
        )
        wait_for(lambda: node_state(api_client, last) == "Quarantined", 90, "quarantine")
        assert "sdcguard.dev/held" not in (read_node(api_client, last).metadata.annotations)
        wait_for(
            lambda: (
                {"policy": policy} not in firing(breaker_alert, [scrape_url(operator.metrics_url)])
            ),
            30,
            "the breaker alert to clear after the reset",
        )


def test_observe_mode_changes_no_scheduling(api_client, operator) -> None:
    """Nodes that register gated, one of them with SDC: in Observe mode the gate comes off
    at once, verdicts are recorded, and no taint, cordon or ticket follows."""
    case = new_case()
    nodes = [f"obs-{case}-{i}" for i in range(2)]
    trusted_baseline(api_client)
    outcomes = {nodes[0]: "pass", nodes[1]: "sdc"}
    with gpu_nodes(api_client, nodes, case=case, gated=True), ProbeKubelet(api_client, outcomes):
        create_policy(api_client, case, mode="Observe", confirmation={"reruns": 0})
        wait_for(
            lambda: (
                len(
                    [
                        t
                        for t in list_custom(api_client, "sdctests", nodes[1])
                        if (t.get("status") or {}).get("verdict") == "SDC"
                    ]
                )
                >= 1
            ),
            90,
            "the SDC verdict to be recorded",
        )
        wait_for(lambda: node_state(api_client, nodes[0]) == "Qualified", 60, "verdict recorded")
        for n in nodes:
            node = read_node(api_client, n)
            assert not node.spec.taints, f"{n} got taints in Observe mode"
            assert not node.spec.unschedulable
        assert list_custom(api_client, "repairtickets", nodes[1]) == []


def test_switching_to_enforce_confirms_what_observe_recorded(api_client, operator) -> None:
    """A node Observe recorded as failing is not quarantined on sight when the policy
    switches to Enforce: it is held as Suspect and re-tested; the failing re-test
    quarantines it with a ticket that names Observe's test and the new ones, and a
    hardware history record. A node that passes its re-test returns to Qualified."""
    case = new_case()
    failing, fixed = f"o2e-{case}-0", f"o2e-{case}-1"
    trusted_baseline(api_client)
    outcomes = {failing: "sdc", fixed: "sdc"}
    custom = client.CustomObjectsApi(api_client)
    with gpu_nodes(api_client, [failing, fixed], case=case), ProbeKubelet(api_client, outcomes):
        name = create_policy(api_client, case, mode="Observe", confirmation={"reruns": 0})
        for n in (failing, fixed):
            wait_for(lambda n=n: node_state(api_client, n) == "Quarantined", 90, f"{n} recorded")
        observed = {}
        for n in (failing, fixed):
            node = read_node(api_client, n)
            assert not node.spec.taints and not node.spec.unschedulable
            marker = (node.metadata.annotations or {}).get("sdcguard.dev/observed-failure")
            assert marker, f"{n}: Observe left no record of the failure"
            observed[n] = [t["metadata"]["name"] for t in list_custom(api_client, "sdctests", n)]
        assert list_custom(api_client, "repairtickets", failing) == []

        outcomes[fixed] = "pass"  # the fixed node passes its re-test from now on
        custom.patch_cluster_custom_object(
            GROUP, VERSION, "sdcpolicies", name, {"spec": {"mode": "Enforce"}}
        )
        ticket = wait_for(
            lambda: ticket_in_phase(api_client, failing, "Open"), 90, "the confirmed quarantine"
        )
        evidence = ticket["spec"]["evidence"]
        assert set(observed[failing]) <= set(evidence) and len(evidence) > len(observed[failing])
        assert QUARANTINE in taint_keys(api_client, failing)
        assert "ObservedFailure" in _events(api_client, failing)
        assert wait_for(lambda: _hardware(api_client, failing), 30, "the hardware history")
        wait_for(lambda: node_state(api_client, fixed) == "Qualified", 90, "the cleared node")
        assert list_custom(api_client, "repairtickets", fixed) == []
        assert not taint_keys(api_client, fixed)
        node = read_node(api_client, fixed)
        assert "sdcguard.dev/observed-failure" not in (node.metadata.annotations or {})


def _hardware(api: client.ApiClient, node: str) -> list[dict[str, Any]]:
    items = client.CustomObjectsApi(api).list_cluster_custom_object(GROUP, VERSION, "sdchardwares")
    return [
        i
        for i in items["items"]
        if any(n.get("node") == node for n in (i.get("status") or {}).get("nodes") or [])
    ]


def test_operator_killed_mid_test_duplicates_nothing(api_client, operator) -> None:
    case = new_case()
    node = f"kill-{case}"
    trusted_baseline(api_client)
    outcomes = {node: "never"}
    with gpu_nodes(api_client, [node], case=case), ProbeKubelet(api_client, outcomes):
        policy = create_policy(api_client, case)
        wait_for(
            lambda: (
                client.BatchV1Api(api_client)
                .list_namespaced_job(NS, label_selector=f"sdcguard.dev/node={node}")
                .items
            ),
            60,
            "the probe Job",
        )
        operator.kill()
        operator.start()
        # The new process decides the node from its own copy (a whole full pass) while the
        # probe still runs: it adopts the running test instead of starting another. Its
        # first passes come after its start-up (imports, the copy), so they get longer
        # than a running operator's on a slow machine.
        operator.wait_passes(policy, timeout=120)
        outcomes[node] = "pass"
        wait_for(lambda: node_state(api_client, node) == "Qualified", 90, "the test to complete")
        jobs = (
            client.BatchV1Api(api_client)
            .list_namespaced_job(NS, label_selector=f"sdcguard.dev/node={node}")
            .items
        )
        assert len(jobs) == 1
        assert len(list_custom(api_client, "sdctests", node)) == 1
        assert list_custom(api_client, "repairtickets", node) == []


def test_malformed_probe_result_is_inconclusive_and_releases_reservation(
    api_client, operator
) -> None:
    case = new_case()
    nodes = {f"junk-{case}-{kind}": kind for kind in ("garbage", "truncated", "empty")}
    trusted_baseline(api_client)
    with gpu_nodes(api_client, list(nodes), case=case), ProbeKubelet(api_client, dict(nodes)):
        before = scrape_url(operator.metrics_url)
        create_policy(api_client, case)
        for node, kind in nodes.items():
            test = wait_for(
                lambda n=node: [
                    t
                    for t in list_custom(api_client, "sdctests", n)
                    if (t.get("status") or {}).get("phase") == "Inconclusive"
                ],
                60,
                f"{node} ({kind}) to be judged inconclusive",
            )[0]
            assert test["status"]["verdict"] == "Inconclusive"
            assert test["status"]["reason"] in ("InvalidResult", "ResultTruncated", "ResultMissing")
            assert test["status"]["message"]
            # Not passed (still gated), not quarantined, and no longer reserved.
            wait_for(lambda n=node: TESTING not in taint_keys(api_client, n), 30, "release")
            assert node_state(api_client, node) in ("Unqualified", "Testing")
            assert GATE in taint_keys(api_client, node)
            assert QUARANTINE not in taint_keys(api_client, node)
            assert list_custom(api_client, "repairtickets", node) == []
        # Every test in this window ended inconclusive: the chart's alert fires.
        history = [before, scrape_url(operator.metrics_url)]
        assert firing(alert_expr("SdcguardTestsInconclusive"), history) == [{}]


def test_nodes_with_nothing_to_do_cost_zero_writes(api_client, operator) -> None:
    """Kopf keeps no bookkeeping on Nodes, and a settled node is never written again."""
    case = new_case()
    nodes = [f"quiet-{case}-{i}" for i in range(3)]
    trusted_baseline(api_client)
    core = client.CoreV1Api(api_client)
    cpu_node = f"cpu-{case}"
    core.create_node(
        client.V1Node(
            metadata=client.V1ObjectMeta(name=cpu_node, labels={"sdcguard.test/case": case})
        )
    )
    try:
        with (
            gpu_nodes(api_client, nodes, case=case),
            ProbeKubelet(api_client, dict.fromkeys(nodes, "pass")),
        ):
            policy = create_policy(api_client, case)
            for n in nodes:
                wait_for(lambda n=n: node_state(api_client, n) == "Qualified", 60, n)

            def our_writes() -> dict[str, list[str]]:
                out = {}
                for n in [*nodes, cpu_node]:
                    fields = core.read_node(n).metadata.managed_fields or []
                    out[n] = sorted(
                        f"{f.manager}@{f.time}" for f in fields if f.manager in ("sdcguard", "kopf")
                    )
                return out

            operator.wait_passes(policy)  # the qualifications' follow-up writes are done
            before = our_writes()
            operator.wait_passes(policy, 4)  # three whole full passes over settled nodes
            after = our_writes()
            assert after == before, "a settled node was written to"
            assert before[cpu_node] == [], "a node without accelerators was touched"
            assert not any("kopf@" in w for ws in after.values() for w in ws)
    finally:
        core.delete_node(cpu_node)


def test_metrics_tell_the_fleet_story(api_client, operator) -> None:
    """After a quarantine, /metrics shows states, verdicts, quarantines and open tickets."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    case = new_case()
    nodes = [f"met-{case}-ok", f"met-{case}-bad"]
    trusted_baseline(api_client)
    with (
        gpu_nodes(api_client, nodes, case=case),
        ProbeKubelet(api_client, {nodes[0]: "pass", nodes[1]: "sdc"}),
    ):
        before = scrape_url(operator.metrics_url)
        policy = create_policy(api_client, case)
        wait_for(lambda: node_state(api_client, nodes[1]) == "Quarantined", 90, "quarantine")
        wait_for(lambda: node_state(api_client, nodes[0]) == "Qualified", 60, "qualification")

        def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
            with urllib.request.urlopen(operator.metrics_url, timeout=5) as resp:
                text = resp.read().decode()
            return {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text)
                for s in family.samples
            }

        def settled() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
            m = scrape()
            key = ("sdcguard_nodes", (("policy", policy), ("state", "Quarantined")))
            # Open tickets by age are brought up to date by full passes (every resync).
            tickets = sum(v for (n, _), v in m.items() if n == "sdcguard_repair_tickets_open")
            return m if m.get(key) == 1 and tickets >= 1 else None

        # Full passes of every policy on the module's shared operator come round every
        # few seconds; under the whole suite's load a round took over 30 s once.
        m = wait_for(settled, 90, "the quarantine to show in /metrics")
        assert m[("sdcguard_nodes", (("policy", policy), ("state", "Qualified")))] == 1
        assert m[("sdcguard_quarantines_total", (("policy", policy),))] >= 1
        assert m[("sdcguard_screenings_total", (("check", "golden"), ("verdict", "SDC")))] >= 2
        assert m[("sdcguard_circuit_breaker_open", (("policy", policy),))] == 0
        assert sum(v for (n, _), v in m.items() if n == "sdcguard_repair_tickets_open") >= 1
        assert m[("sdcguard_reconcile_passes_total", (("kind", "full"), ("policy", policy)))] > 0
        assert any(n == "sdcguard_probe_finish_to_quarantine_seconds_count" for n, _ in m)

        # The chart's alerts on these scrapes: the quarantine fires its alert for this
        # policy (default threshold 0); the breaker and illegal-transition alerts do not.
        history = [before, scrape_url(operator.metrics_url)]
        fired = firing(alert_expr("SdcguardNodesQuarantined"), history)
        assert {"policy": policy} in fired
        assert {"policy": policy} not in firing(alert_expr("SdcguardCircuitBreakerOpen"), history)
        assert firing(alert_expr("SdcguardIllegalTransition"), history) == []
        assert firing(alert_expr("SdcguardTestsInconclusive"), history) == []
