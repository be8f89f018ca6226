"""``make demo``'s core on the real node's control plane: the operator is the chart's Pod
(``helm install``) on the real node; the simulated fleet's sick node is confirmed,
quarantined with a RepairTicket, repaired, verified and returned; every healthy node
qualifies; and the real node, a row of its own, is accepted in a real probe container,
then, with the fault the demo injects, confirmed, quarantined, repaired and verified.
Events tell the story on the Nodes. The run removes what it made and leaves the real
node as it found it, for the tests after it."""

from __future__ import annotations

import json
import uuid

import pytest

from sdcdev.cluster import operator_pod
from sdcdev.cluster.localcluster import LocalCluster
from sdcdev.sim.demo import DemoConfig, run_demo
from sdcdev.sim.fleet import DEMO_FLEET, load_fleet
from tests.e2e.helpers import explain, in_order, permission_errors, progress

pytestmark = pytest.mark.cluster

STEADY_FAULTY = "h100-aws-03"
REAL = "real-node-0"


# The real node's start and helm install, then the lifecycle's limit.
@pytest.mark.timeout(1400)
def test_demo_fleet_and_the_real_node_go_through_the_whole_lifecycle(
    real_cluster: LocalCluster, tmp_path
) -> None:
    fleet = load_fleet(DEMO_FLEET)
    suffix = uuid.uuid4().hex[:5]
    cfg = DemoConfig(
        policy=f"demo-{suffix}",
        release=f"sdcguard-demo{suffix}",
        namespace=f"sdcguard-demo{suffix}",
        out_dir=tmp_path,
        cleanup=True,
        # The demo's 300 s, with room for busy machines (390 s on one CI machine, more than
        # 600 s on a slower one); a run where nothing moves for 360 s is stuck.
        timeout_seconds=1100,
        stall_seconds=360,
        real_node=True,
    )
    result = run_demo(real_cluster, cfg, display=progress("e2e demo"), chart=operator_pod)
    view = result.view
    assert result.ok, explain(result)
    assert not permission_errors(result), permission_errors(result)[:10]
    # The operator was the chart's Pod on the real node, in a containerd container.
    assert f"on node {REAL} (containerd://" in result.operator_where, result.operator_where

    # The real node: acceptance in a real container, then the injected fault confirmed,
    # quarantined, repaired and verified, each verdict from the kubelet's termination
    # message (the probe says when fault injection was on).
    real = view.nodes[REAL]
    assert real.real
    assert in_order(
        ["Testing", "Qualified", "Testing", "Quarantined", "Verifying", "Qualified"], real.path()
    ), real.path()
    assert real.state == "Qualified"
    real_tests = view.tests_of(REAL)
    verdicts = [(t.reason, t.verdict) for t in real_tests]
    assert in_order(
        [
            ("Join", "Pass"),
            ("Manual", "SDC"),
            ("Confirmation", "SDC"),
            ("RepairVerification", "Pass"),
        ],
        verdicts,
    ), verdicts
    for test in real_tests:
        # The fault is on from the manual screening until the repair (a manual screening
        # starved of CPU may end Inconclusive; the demo then asks again).
        faulty_run = test.reason in ("Manual", "Confirmation")
        assert ("fault injection on" in test.message) == faulty_run, test
        if test.verdict in ("Pass", "SDC"):
            # The probe's own result, from the termination message the kubelet wrote.
            seen = result.kubelet_verdicts[test.name]
            probe_said = {"pass": "Pass", "fail": "SDC"}.get(seen.verdict)
            assert seen.node == REAL and probe_said == test.verdict, (seen, test)
            assert seen.exit_code == (0 if test.verdict == "Pass" else 1), seen
            assert seen.injection == faulty_run, seen
            assert seen.injected > 0 if test.verdict == "SDC" else seen.injected == 0, seen
    (real_ticket,) = view.tickets_of(REAL)
    assert real_ticket.phase == "Closed" and real_ticket.resolution == "Repaired", real_ticket

    # The sick node: confirmed, quarantined, repaired, verified, back in the pool.
    sick = view.nodes[STEADY_FAULTY]
    assert in_order(["Testing", "Suspect", "Quarantined", "Verifying", "Qualified"], sick.path()), (
        sick.path()
    )
    assert sick.state == "Qualified"
    verdicts = [(t.reason, t.verdict) for t in view.tests_of(STEADY_FAULTY)]
    assert in_order(
        [("Join", "SDC"), ("Confirmation", "SDC"), ("RepairVerification", "Pass")], verdicts
    ), verdicts

    # Healthy nodes: qualified, never suspected, never an SDC verdict.
    for cfg_node in fleet.nodes:
        track = view.nodes[cfg_node.name]
        assert not track.real
        assert track.state == "Qualified", (cfg_node.name, track.path())
        if cfg_node.fault_profile is None:
            assert not {"Suspect", "Quarantined"} & set(track.path()), track.path()
            assert all(t.verdict != "SDC" for t in view.tests_of(cfg_node.name))

    # One ticket per quarantined node, closed, with real failed SDCTests as evidence.
    quarantined = {
        n for n, t in view.nodes.items() if t.first("Quarantined") is not None and not t.real
    }
    assert STEADY_FAULTY in quarantined
    assert {k.node for k in view.tickets.values()} == quarantined | {REAL}
    for node in quarantined:
        tickets = view.tickets_of(node)
        assert len(tickets) == 1, tickets
        ticket = tickets[0]
        assert ticket.phase == "Closed" and ticket.resolution == "Repaired", ticket
        assert ticket.external_id and ticket.external_id.startswith("SIM-"), ticket
        assert ticket.evidence, ticket
        for evidence in ticket.evidence:
            test = view.tests[evidence]  # a real SDCTest of this run
            assert test.node == node and test.verdict == "SDC", test
        assert in_order(["Open", "Verifying", "Closed"], [p for _, p in ticket.history])

    # Events on the Nodes, in the order people would read them (clean screenings post
    # none by default: no TestStarted).
    for node in (STEADY_FAULTY, REAL):
        reasons = [e["reason"] for e in result.events if e["node"] == node]
        assert in_order(["SDCSuspected", "Quarantined", "Verifying", "Qualified"], reasons), (
            node,
            reasons,
        )
    assert "TestStarted" not in {e["reason"] for e in result.events}
    warnings = {e["reason"] for e in result.events if e["type"] == "Warning"}
    assert {"SDCSuspected", "Quarantined"} <= warnings
    for cfg_node in fleet.nodes:
        # Every node's qualification is on record in a passed SDCTest; a "Qualified"
        # Event only marks a return from repair (clean screenings post no Event).
        assert any(t.verdict == "Pass" for t in view.tests_of(cfg_node.name)), cfg_node.name
        qualified_events = [
            e for e in result.events if e["node"] == cfg_node.name and e["reason"] == "Qualified"
        ]
        assert bool(qualified_events) == (cfg_node.name in quarantined), cfg_node.name

    # What a person gets: the summary and the picture.
    assert result.timeline_path is not None and result.timeline_path.stat().st_size > 10_000
    assert result.summary_path is not None
    summary = json.loads(result.summary_path.read_text())
    assert summary["ok"] and summary["probes"]["judged"] >= len(fleet.nodes)
    assert [n["name"] for n in summary["nodes"] if n["real"]] == [REAL]
    node = next(n for n in summary["nodes"] if n["name"] == STEADY_FAULTY)
    assert node["timeToQuarantineSeconds"] > 0 and node["tickets"]
    print(f"demo: {summary['timings']}, probes {summary['probes']['medianSeconds']}s median")
    # Nothing of the run is left on the real node for the tests after this one.
    node = json.loads(real_cluster.request(f"/api/v1/nodes/{REAL}")[1])
    assert not [k for k in node["metadata"].get("labels", {}) if k == "sdcguard.dev/state"]
    assert not [t for t in node["spec"].get("taints") or [] if t["key"].startswith("sdcguard.dev/")]
    assert not node["spec"].get("unschedulable")
