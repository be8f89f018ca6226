"""The scripted demo (``make demo``'s core) on the session's control plane: the sick node is
confirmed, quarantined with a RepairTicket, repaired, verified and returned; every healthy
node qualifies; Events tell the story on the Nodes."""

from __future__ import annotations

import json

from sdcguard.sim.demo import DemoConfig, run_demo
from sdcguard.sim.fleet import DEMO_FLEET, load_fleet
from tests.cluster.localcluster import LocalCluster
from tests.e2e.helpers import RunNames, explain, in_order, permission_errors, progress

STEADY_FAULTY = "h100-aws-03"


def test_demo_fleet_goes_through_the_whole_lifecycle(
    cluster: LocalCluster, names: RunNames, tmp_path
) -> None:
    fleet = load_fleet(DEMO_FLEET)
    cfg = DemoConfig(
        policy=names.policy,
        release=names.release,
        namespace=names.namespace,
        out_dir=tmp_path,
        cleanup=True,
        timeout_seconds=420,  # the demo's 300 s, with room for busy machines
    )
    result = run_demo(cluster, cfg, display=progress("e2e demo"))
    view = result.view
    assert result.ok, explain(result)
    assert not permission_errors(result), permission_errors(result)[:10]

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
        assert track.state == "Qualified", (cfg_node.name, track.path())
        if cfg_node.fault_profile is None:
            assert not {"Suspect", "Quarantined"} & set(track.path()), track.path()
            assert all(t.verdict != "SDC" for t in view.tests_of(cfg_node.name))

    # One ticket per quarantined node, closed, with real failed SDCTests as evidence.
    quarantined = {n for n, t in view.nodes.items() if t.first("Quarantined") is not None}
    assert STEADY_FAULTY in quarantined
    assert {k.node for k in view.tickets.values()} == quarantined
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
    reasons = [e["reason"] for e in result.events if e["node"] == STEADY_FAULTY]
    assert in_order(["SDCSuspected", "Quarantined", "Verifying", "Qualified"], reasons), reasons
    assert "TestStarted" not in reasons
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
    node = next(n for n in summary["nodes"] if n["name"] == STEADY_FAULTY)
    assert node["timeToQuarantineSeconds"] > 0 and node["tickets"]
    print(f"demo: {summary['timings']}, probes {summary['probes']['medianSeconds']}s median")
