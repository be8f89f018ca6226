"""The risk order wired into a pass: budget goes to the due node likeliest to hold an
undetected fault, today's order without history, and the operator's starvation
counter bounds every due node's wait whatever the clock does."""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
from typing import Any

from prometheus_client import CollectorRegistry

from sdcguard.adapters.observe import TicketSnapshot
from sdcguard.adapters.pass_state import FleetView, PolicyMemory, TestSnapshot
from sdcguard.adapters.risk_book import RiskBook, count_overtaken, node_screenings
from sdcguard.api import SDCTestPhase, Verdict
from sdcguard.domain import keys
from sdcguard.domain.lifecycle import NodeState
from sdcguard.domain.observed import NodeSnapshot, Observed, TestFacts
from sdcguard.domain.risk import NodeRisk, RiskOrder, TypeHistory, todays_order
from sdcguard.domain.scheduling import (
    BudgetOrder,
    RiskContext,
    budget_key,
    budget_order,
    iter_decisions,
    priority,
    rank,
    tier,
)
from sdcguard.metrics import Metrics
from tests.unit.factories import HOUR, NOW, node, policy, sdctest

HISTORY = {
    "a": TypeHistory(screenings=5_000, failures=5, service_hours=1_000_000),
    "b": TypeHistory(screenings=5_000, failures=1, service_hours=1_000_000),
}
ONE_AT_A_TIME = policy(budgets={"maxConcurrentTests": 1, "maxUnavailable": 1, "poolLabel": "p"})


def _qualified(name: str, hours: float, now: dt.datetime = NOW) -> Observed:
    n = node(name, state=NodeState.QUALIFIED, qualified_at=now - hours * HOUR, pool="x")
    return Observed(node=n, idle_since=now - HOUR)


def _started(fleet: list[Observed], risk: RiskContext | None, now: dt.datetime = NOW) -> list[str]:
    decisions = iter_decisions(fleet, ONE_AT_A_TIME, now, risk=risk)
    return [d.node for d in decisions if d.starts_test]


def test_priority_is_todays_order_of_the_risk_module() -> None:
    observed = _qualified("n1", 900)
    assert priority(observed) == todays_order(4, observed.node.qualified_at, "n1")
    assert tier(observed) == 4
    assert budget_key(observed, NOW) == priority(observed)


def test_the_pass_gives_budget_to_the_likeliest_fault() -> None:
    fleet = [_qualified("old", 2000), _qualified("reported", 800), _qualified("plain", 900)]
    known = {
        "old": NodeRisk(hardware_type="b"),
        "reported": NodeRisk(hardware_type="a", reports=2),
        "plain": NodeRisk(hardware_type="a"),
    }
    assert _started(fleet, None) == ["old"], "today's order: oldest qualification"
    risk = RiskContext(history=HISTORY, nodes=known)
    assert _started(fleet, risk) == ["reported"]
    order = [o.node.name for o in budget_order(fleet, NOW, risk)]
    assert order[0] == "reported"
    ranked = dict((o.node.name, r) for o, r in rank(fleet, risk, NOW))
    assert "reports believed" in ranked["reported"].reason
    assert "type 5/5000 failed" in ranked["plain"].reason


def test_no_history_keeps_todays_order_and_says_so() -> None:
    fleet = [_qualified("young", 600), _qualified("old", 2000)]
    risk = RiskContext(history={}, nodes={"young": NodeRisk(hardware_type="a", reports=1)})
    assert _started(fleet, risk) == _started(fleet, None) == ["old"]
    assert all("no screening history" in r.reason for _, r in rank(fleet, risk, NOW))


def test_a_pass_reads_a_nodes_last_pass_and_its_catch_chance() -> None:
    tests = [
        TestFacts(
            name=f"t{i}",
            suite=sdctest("x").suite,
            reason=sdctest("x").reason,
            phase=SDCTestPhase.PASSED if verdict == Verdict.PASS else SDCTestPhase.FAILED,
            verdict=verdict,
            completed_at=NOW - hours * HOUR,
            catch_chance=catch,
        )
        for i, (verdict, hours, catch) in enumerate(
            [(Verdict.PASS, 300, 0.9), (Verdict.SDC, 200, 0.5), (Verdict.PASS, 100, 0.6)]
        )
    ]
    seen = node_screenings(tests)
    assert (seen.screenings, seen.failures) == (3, 1)
    assert seen.service_hours == 200
    assert (seen.last_pass_at, seen.last_pass_catch) == (NOW - 100 * HOUR, 0.6)


def test_clocks_that_jump_never_starve_a_due_node_in_the_operators_memory() -> None:
    """One screening a pass; every pass a riskier node becomes due (a report), and the
    clock jumps days forward or back. The quiet node still starts within the bound the
    docs state: max_overtaken routine screenings of its pool, plus the nodes overdue
    before it."""
    rng = random.Random(7)
    order = RiskOrder(max_overtaken=6)
    memory = PolicyMemory()
    fleet = {"quiet": 700.0}
    known = {"quiet": NodeRisk(hardware_type="b")}
    started_at: int | None = None
    for step in range(40):
        now = NOW + rng.uniform(-30, 30) * 24 * HOUR
        fleet[f"hot{step}"] = 650.0
        known[f"hot{step}"] = NodeRisk(hardware_type="a", reports=3)
        observed = [_qualified(n, h, now) for n, h in fleet.items()]
        nodes = {
            n: dataclasses.replace(k, overtaken=memory.overtaken.get(n, 0))
            for n, k in known.items()
        }
        risk = RiskContext(history=HISTORY, nodes=nodes, order=order)
        decisions = list(iter_decisions(observed, ONE_AT_A_TIME, now, risk=risk))
        by_node = {o.node.name: o for o in observed}
        for d in decisions:  # what the reconciler's _act remembers
            if d.waits_for_budget:
                memory.waiting[d.node] = (budget_key(by_node[d.node], now, risk), "x")
            else:
                memory.waiting.pop(d.node, None)
        count_overtaken(memory, decisions, by_node)
        started = [d.node for d in decisions if d.starts_test]
        assert len(started) == 1
        fleet.pop(started[0])
        if started[0] == "quiet":
            started_at = step
            break
    assert started_at is not None, "the quiet node starved"
    assert started_at <= order.max_overtaken + 1


def _sdctest_body(name: str, node: str, hours: float, verdict: str, catch: float) -> dict[str, Any]:
    phase = "Passed" if verdict == "Pass" else "Failed"
    return {
        "apiVersion": "sdcguard.dev/v1alpha1",
        "kind": "SDCTest",
        "metadata": {"name": name, "resourceVersion": "1"},
        "spec": {"nodeName": node, "policyRef": "p"},
        "status": {
            "phase": phase,
            "verdict": verdict,
            "completionTime": keys.format_time(NOW - hours * HOUR),
            "checks": [{"name": "gemm", "verdict": verdict, "catchChance": catch}],
        },
    }


def test_a_full_pass_exports_the_fleet_figures_and_measures_the_types() -> None:
    registry = CollectorRegistry()
    book = RiskBook(Metrics(registry=registry), reports=lambda: [("h1", NOW - 150 * HOUR)])
    labels = {"nvidia.com/gpu.product": "H100", keys.LABEL_STATE: "Qualified"}
    nodes = {n: NodeSnapshot(name=n, labels=labels) for n in ("h1", "h2")}
    tests = {
        "h1": [
            TestSnapshot.slim(_sdctest_body("a", "h1", 300, "Pass", 0.9)),
            TestSnapshot.slim(_sdctest_body("b", "h1", 100, "SDC", 0.9)),
        ],
        "h2": [
            TestSnapshot.slim(_sdctest_body("c", "h2", 200, "Pass", 0.8)),
            TestSnapshot.slim(_sdctest_body("d", "h2", 20, "Pass", 0.6)),
        ],
    }
    tickets = {"h1": [TicketSnapshot(name="h1-1", node_name="h1", opened_at=NOW - 99 * HOUR)]}
    view = FleetView(nodes=nodes, tests=tests, tickets=tickets)
    book.refresh(view)
    assert book.history == {"H100": TypeHistory(4, 1, 200 + 180)}
    value = registry.get_sample_value
    assert value("sdcguard_hardware_type_screenings", {"type": "H100", "outcome": "all"}) == 4
    assert value("sdcguard_hardware_type_screenings", {"type": "H100", "outcome": "failed"}) == 1
    assert value("sdcguard_onset_to_quarantine_hours", {"bound": "low"}) == 51
    assert value("sdcguard_onset_to_quarantine_hours", {"bound": "high"}) == 201
    assert value("sdcguard_exposure_estimate_hours", {"basis": "screenings"}) is not None
    context = book.context(view, PolicyMemory(), ["h1", "h2"])
    assert context.nodes["h1"].reports == 1
    assert (context.nodes["h2"].last_pass_at, context.nodes["h2"].last_pass_catch) == (
        NOW - 20 * HOUR,
        0.6,
    )


def test_the_status_order_from_stored_places_is_the_full_ranking() -> None:
    """The policy status lists the first waiting nodes from the places their decisions
    stored (``memory.waiting``) and ranks only those again; the list is the one a full
    ranking of every waiting node gives, with places worked out anew for nodes the pass
    did not decide. One context ranks many nodes one at a time from the same figures
    per type."""
    from sdcguard.adapters.reconciler import NEXT_NODES_SHOWN, _budget_order

    rng = random.Random(7)
    fleet = [_qualified(f"n{i:02d}", rng.uniform(200, 3000)) for i in range(40)]
    known = {
        o.node.name: NodeRisk(
            hardware_type=rng.choice("ab"),
            reports=rng.choice((0, 0, 1)),
            overtaken=rng.choice((0, 1, 9)),
        )
        for o in fleet
    }
    risk = RiskContext(history=HISTORY, nodes=known)
    assert risk.rates is risk.rates  # worked out once per context
    by_node = {o.node.name: o for o in fleet}
    memory = PolicyMemory()
    decided = set(list(by_node)[:30])  # the last ten: places worked out by _budget_order
    for name, observed in by_node.items():
        place = budget_key(observed, NOW, risk) if name in decided else ("stale",)
        memory.waiting[name] = (place, "x")
    shown = _budget_order(memory, by_node, risk, NOW, decided)
    full = [(o.node.name, r) for o, r in rank(fleet, risk, NOW)][:NEXT_NODES_SHOWN]
    assert [n.node for n in shown] == [name for name, _ in full]
    assert [n.reason for n in shown] == [r.reason for _, r in full]


def test_a_pass_order_keeps_each_nodes_place_as_budget_key_works_it_out() -> None:
    """The pass ranks its nodes once and remembers the place of each node that waits
    for budget from that ranking: the places are :func:`budget_key`'s, with or without a
    risk context, and the order is :func:`budget_order`'s."""
    rng = random.Random(11)
    fleet = [_qualified(f"n{i:02d}", rng.uniform(200, 3000)) for i in range(40)]
    known = {
        o.node.name: NodeRisk(hardware_type=rng.choice("ab"), overtaken=rng.choice((0, 1, 9)))
        for o in fleet
    }
    for risk in (None, RiskContext(history=HISTORY, nodes=known)):
        order = BudgetOrder.of(fleet, NOW, risk)
        assert [o.node.name for o in order.nodes] == [
            o.node.name for o in budget_order(fleet, NOW, risk)
        ]
        assert order.places == {o.node.name: budget_key(o, NOW, risk) for o in fleet}


def test_placing_a_node_is_replace_without_touching_the_original() -> None:
    from sdcguard.domain.budgets import PoolUsage

    observed = _qualified("n1", 300)
    usage = PoolUsage(pool="x", nodes=4, unavailable=1, tests=1)
    placed = observed.placed(usage, "rack r1 holds 1 of 1")
    assert placed == dataclasses.replace(
        observed, usage=usage, topology_wait="rack r1 holds 1 of 1"
    )
    assert observed.usage == PoolUsage() and observed.topology_wait == ""
    assert placed.node.owned_taints == observed.node.owned_taints  # cached per frozen facts
