"""Budgets per topology domain (spec.budgets.topology): NVL72-like cliques of 18 nodes
never have more than their allowance held by screening, whatever the pass order, and
a quarantine never waits on a domain."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from sdcguard.api import SDCPolicySpec, TopologyBudget
from sdcguard.api.policy import allowed_unavailable
from sdcguard.domain import keys
from sdcguard.domain.lifecycle import NodeState
from sdcguard.domain.observed import Observed, Taint
from sdcguard.domain.scheduling import decide_all, member_after
from sdcguard.domain.topology import (
    DomainUsage,
    domains_of,
    missing_keys,
    topology_status,
    topology_usage,
    topology_wait,
)
from tests.unit.factories import HOUR, NOW, node, policy

CLIQUE = "nvidia.com/gpu.clique"
HOLD = frozenset({"sdcguard.dev/testing", "sdcguard.dev/quarantined"})


def _node(i: int, *, held: bool = False, state: NodeState = NodeState.QUALIFIED) -> Observed:
    """Node i of an NVL72-like fleet: cliques of 18 nodes (``clique-<i // 18>``)."""
    taints = (Taint("sdcguard.dev/testing", "NoSchedule"),) if held else ()
    annotations = {keys.OWNED_TAINTS: "sdcguard.dev/testing"} if held else {}
    n = node(
        f"gb200-{i:03d}",
        state=NodeState.TESTING if held else state,
        labels={CLIQUE: f"cluster-a.{i // 18}", "rack": f"r{i // 9}"},
        annotations=annotations,
        taints=taints,
        qualified_at=NOW - 500 * HOUR,
    )
    return Observed(node=n, idle_since=NOW - 10 * HOUR)


def _policy(clique: int | str) -> SDCPolicySpec:
    """Pool budgets out of the way; at most ``clique`` nodes of a clique held."""
    return policy(
        budgets={
            "maxConcurrentTests": 1000,
            "maxUnavailable": "100%",
            "topology": [{"labelKey": CLIQUE, "maxUnavailable": clique}],
        }
    )


def test_an_expired_clique_fleet_screens_two_per_clique() -> None:
    fleet = [_node(i) for i in range(72)]  # four cliques of 18
    decisions = decide_all(fleet, _policy(clique=2), NOW)
    taken: dict[str, int] = {}
    for d in decisions:
        if d.takes_node:
            clique = f"cluster-a.{int(d.node.split('-')[1]) // 18}"
            taken[clique] = taken.get(clique, 0) + 1
    assert taken == {f"cluster-a.{c}": 2 for c in range(4)}
    waiting = [d for d in decisions if not d.takes_node]
    assert len(waiting) == 72 - 8
    assert all(d.waits_for_budget for d in waiting)
    assert "topology domain nvidia.com/gpu.clique=cluster-a.0 already has 2 of 18 nodes held" in (
        next(d for d in waiting if d.node == "gb200-005").note
    )


def test_a_percent_rounds_down_but_allows_one() -> None:
    fleet = [_node(i) for i in range(36)]
    decisions = decide_all(fleet, _policy(clique="10%"), NOW)
    assert sum(d.takes_node for d in decisions) == 2, "10% of 18 allows one per clique"


def test_a_quarantine_never_waits_on_a_domain() -> None:
    """A clique at its limit still quarantines a node whose failure is confirmed."""
    fleet = [_node(i, held=i < 2) for i in range(18)]
    p = _policy(clique=2)
    sick = node(
        "gb200-sick",
        state=NodeState.QUALIFIED,
        labels={CLIQUE: "cluster-a.0"},
        annotations={keys.REQUEST_QUARANTINE: "bad HBM row"},
    )
    fleet.append(Observed(node=sick, idle_since=NOW - HOUR))
    decisions = {d.node: d for d in decide_all(fleet, p, NOW)}
    assert decisions["gb200-sick"].state == NodeState.QUARANTINED
    assert not any(decisions[f"gb200-{i:03d}"].takes_node for i in range(2, 18))


def test_a_node_without_the_label_is_not_limited_by_it() -> None:
    bare = node("cpu-less", state=NodeState.QUALIFIED, qualified_at=NOW - 500 * HOUR)
    fleet = [_node(i, held=i < 2) for i in range(18)] + [
        Observed(node=bare, idle_since=NOW - 10 * HOUR)
    ]
    decisions = {d.node: d for d in decide_all(fleet, _policy(clique=2), NOW)}
    assert decisions["cpu-less"].takes_node


def test_status_counts_domains_and_names_missing_keys() -> None:
    budgets = [
        TopologyBudget(label_key=CLIQUE, max_unavailable=2),
        TopologyBudget(label_key="topology.kubernetes.io/zone", max_unavailable=1),
    ]
    usage = topology_usage(
        [(((CLIQUE, "a"),), True), (((CLIQUE, "a"),), True), (((CLIQUE, "b"),), False)]
    )
    status = topology_status(usage, budgets)
    assert [(s.label_key, s.domains, s.at_limit, s.most_held) for s in status] == [
        (CLIQUE, 2, 1, 2),
        ("topology.kubernetes.io/zone", 0, 0, 0),
    ]
    assert missing_keys(status) == ["topology.kubernetes.io/zone"]
    assert topology_wait([(CLIQUE, "b")], usage, budgets) == ""
    assert "maxUnavailable 2 allows 2" in topology_wait([(CLIQUE, "a")], usage, budgets)
    assert usage[(CLIQUE, "a")] == DomainUsage(nodes=2, held=2)


def test_a_key_listed_twice_is_refused() -> None:
    with pytest.raises(ValidationError, match="label key rack is listed twice"):
        policy(
            budgets={
                "topology": [
                    {"labelKey": "rack", "maxUnavailable": 1},
                    {"labelKey": "rack", "maxUnavailable": 2},
                ]
            }
        )


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.booleans(), min_size=1, max_size=54),
    st.sampled_from([0, 1, 2, 3, "10%", "20%"]),
    st.sampled_from([1, 2, 4]),
)
def test_no_clique_or_rack_ever_exceeds_its_allowance(
    held: list[bool], clique_limit: int | str, rack_limit: int
) -> None:
    """Any mix of held and free nodes, two nested topology keys: in decision order, a
    reservation never takes a domain past its allowance."""
    p = policy(
        budgets={
            "maxConcurrentTests": 1000,
            "maxUnavailable": "100%",
            "topology": [
                {"labelKey": CLIQUE, "maxUnavailable": clique_limit},
                {"labelKey": "rack", "maxUnavailable": rack_limit},
            ],
        }
    )
    fleet = [_node(i, held=h) for i, h in enumerate(held)]
    by_node = {o.node.name: o for o in fleet}
    decisions = decide_all(fleet, p, NOW)
    budgets = p.budgets.topology
    limits = {b.label_key: b.max_unavailable for b in budgets}
    nodes_in: dict[tuple[str, str], int] = {}
    held_in: dict[tuple[str, str], int] = {}
    for o in fleet:
        for d in domains_of(o.node.labels, budgets):
            nodes_in[d] = nodes_in.get(d, 0) + 1
            held_in[d] = held_in.get(d, 0) + o.pool_member(HOLD).held
    for d in decisions:
        o = by_node[d.node]
        member = o.pool_member(HOLD)
        newly = member_after(member, d).held and not member.held
        for dom in domains_of(o.node.labels, budgets):
            if newly:
                limit = allowed_unavailable(limits[dom[0]], nodes_in[dom])
                assert held_in[dom] < limit, (d.node, dom, held_in[dom], limit)
                held_in[dom] += 1
