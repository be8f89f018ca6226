"""Budgets per pool, and that a whole pass of decisions never exceeds them."""

from __future__ import annotations

import dataclasses
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from sdcguard.api import Budgets, Finding, Resolution, TicketPhase, Verdict
from sdcguard.domain import keys
from sdcguard.domain.budgets import (
    PoolMember,
    PoolUsage,
    allowed_devices,
    allowed_unavailable,
    can_reserve,
    pool_usage,
)
from sdcguard.domain.devicetaints import NodeDevices, SliceDevice
from sdcguard.domain.lifecycle import NodeState
from sdcguard.domain.observed import Observed, Taint, TicketFacts
from sdcguard.domain.scheduling import decide_all, member_after
from tests.unit.factories import HOUR, NOW, node, policy, sdctest


@pytest.mark.parametrize(
    ("value", "nodes", "allowed"),
    [
        (3, 100, 3),
        (0, 100, 0),
        ("10%", 100, 10),
        ("10%", 25, 2),
        ("10%", 5, 1),
        ("0%", 50, 0),
        ("100%", 7, 7),
        ("50%", 0, 0),
    ],
)
def test_allowed_unavailable(value: int | str, nodes: int, allowed: int) -> None:
    assert allowed_unavailable(value, nodes) == allowed


def test_can_reserve_says_why_not() -> None:
    budgets = Budgets(max_concurrent_tests=2, max_unavailable="10%")
    assert can_reserve(PoolUsage("a100", 20, 1, 1), budgets, takes_node=True).allowed
    full = can_reserve(PoolUsage("a100", 20, 2, 1), budgets, takes_node=True)
    assert not full.allowed and "pool a100 already has 2 of 20 nodes held" in full.reason
    assert can_reserve(PoolUsage("a100", 20, 2, 1), budgets, takes_node=False).allowed
    busy = can_reserve(PoolUsage("a100", 20, 0, 2), budgets, takes_node=False)
    assert not busy.allowed and "maxConcurrentTests 2" in busy.reason


def test_pool_usage_counts_per_pool() -> None:
    pools = pool_usage(
        [PoolMember("a", True, True), PoolMember("a", False, False), PoolMember("b", True, False)]
    )
    assert pools == {"a": PoolUsage("a", 2, 1, 1), "b": PoolUsage("b", 1, 1, 0)}


def _qualified(name: str, pool: str) -> Observed:
    n = node(name, state=NodeState.QUALIFIED, qualified_at=NOW - 500 * HOUR, pool=pool)
    return Observed(node=n, idle_since=NOW - HOUR)


def test_a_pass_over_an_expired_fleet_respects_every_budget() -> None:
    p = policy(budgets={"maxConcurrentTests": 3, "maxUnavailable": "10%", "poolLabel": "pool"})
    fleet = [_qualified(f"a{i}", "a") for i in range(20)] + [
        _qualified(f"b{i}", "b") for i in range(4)
    ]
    decisions = decide_all(fleet, p, NOW)
    started = [d.node for d in decisions if d.starts_test]
    assert sum(n.startswith("a") for n in started) == 2, "10% of 20"
    assert sum(n.startswith("b") for n in started) == 1, "a non-zero percent allows one"


states = st.sampled_from(list(NodeState))


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(states, st.booleans(), st.booleans(), st.sampled_from(["a", "b"])), max_size=25
    ),
    st.integers(min_value=1, max_value=4),
    st.sampled_from([0, 1, 2, "0%", "10%", "30%", "100%"]),
)
def test_budgets_are_never_exceeded(
    raw: list[tuple[NodeState, bool, bool, str]], max_tests: int, max_unavailable: int | str
) -> None:
    p = policy(budgets={"maxConcurrentTests": max_tests, "maxUnavailable": max_unavailable})
    fleet = []
    for i, (state, held, running, pool) in enumerate(raw):
        annotations = {keys.OWNED_TAINTS: "sdcguard.dev/testing"} if held else {}
        taints = (Taint("sdcguard.dev/testing", "NoSchedule"),) if held else ()
        test = sdctest(f"t{i}") if running else None
        if running:
            annotations[keys.CURRENT_TEST] = f"t{i}"
        n = node(
            f"n{i}",
            state=state,
            annotations=annotations,
            taints=taints,
            qualified_at=NOW - 500 * HOUR,
            pool=pool,
        )
        fleet.append(Observed(node=n, test=test, idle_since=NOW - 10 * HOUR))
    hold = frozenset({"sdcguard.dev/testing", "sdcguard.dev/quarantined"})
    before = pool_usage(o.pool_member(hold) for o in fleet)
    decisions = decide_all(fleet, p, NOW)
    # In decision order: a reservation finds room counting every node held so far,
    # the ones earlier decisions of the pass just quarantined included.
    by_node = {o.node.name: o for o in fleet}
    held = {pool: usage.unavailable for pool, usage in before.items()}
    for d in decisions:
        member = by_node[d.node].pool_member(hold)
        if d.takes_node:
            limit = allowed_unavailable(max_unavailable, before[member.pool].nodes)
            assert held[member.pool] < limit, (d.node, held, limit)
        held[member.pool] += member_after(member, d).held and not member.held
    for pool, usage in before.items():
        members = {o.node.name for o in fleet if o.node.pool == pool}
        started = [d for d in decisions if d.starts_test and d.node in members]
        taken = sum(d.takes_node for d in started)
        if started:
            assert usage.tests + len(started) <= max_tests
        if taken:
            limit = allowed_unavailable(max_unavailable, usage.nodes)
            assert usage.unavailable + taken <= limit


def test_tests_awaiting_a_baseline_do_not_block_the_quorum_they_wait_for() -> None:
    """The chart's defaults: two concurrent tests, quorum 3. Two acceptance tests whose
    probes ended wait for a third node to agree; that third node's test must start now,
    not when the two time out half an hour later."""
    import dataclasses

    from sdcguard.api import ScreeningReason, Suite

    spec = policy(budgets={"maxConcurrentTests": 2}, baseline={"quorum": 3})
    waiting = []
    for i in range(2):
        n = node(
            f"gpu-{i}",
            state=NodeState.TESTING,
            annotations={keys.CURRENT_TEST: f"t{i}"},
            taints=(Taint("sdcguard.dev/testing", "NoSchedule"),),
        )
        test = dataclasses.replace(
            sdctest(f"t{i}", suite=Suite.ACCEPTANCE, reason=ScreeningReason.JOIN),
            awaiting_baseline=True,
        )
        waiting.append(Observed(node=n, test=test, idle_since=NOW - HOUR))
    third = Observed(
        node=node("gpu-2", taints=(Taint("sdcguard.dev/unqualified", "NoSchedule"),)),
        idle_since=NOW - HOUR,
    )
    decisions = {d.node: d for d in decide_all([*waiting, third], spec, NOW)}
    assert decisions["gpu-2"].starts_test
    # A test whose probe still runs does count.
    running = [
        dataclasses.replace(o, test=dataclasses.replace(o.test, awaiting_baseline=False))
        for o in waiting
        if o.test is not None
    ]
    decisions = {d.node: d for d in decide_all([*running, third], spec, NOW)}
    assert not decisions["gpu-2"].starts_test and decisions["gpu-2"].waits_for_budget


def test_a_quarantine_earlier_in_the_pass_counts_against_the_next_reservation() -> None:
    """A node quarantined after its acceptance failed was not held (it never served)
    and is held now: the serving node decided after it in the same pass must wait,
    not take the last unavailable slot twice."""
    from sdcguard.api import ScreeningReason, Suite, Verdict

    p = policy(budgets={"maxConcurrentTests": 5, "maxUnavailable": 2})
    testing = (Taint("sdcguard.dev/testing", "NoSchedule"),)
    sick = node(
        "n0",
        state=NodeState.SUSPECT,
        annotations={keys.CURRENT_TEST: "c0", keys.SUSPECT_CHECKS: "golden", keys.EVIDENCE: "t0"},
        taints=testing,
    )
    confirmation = sdctest(
        "c0",
        suite=Suite.ACCEPTANCE,
        reason=ScreeningReason.CONFIRMATION,
        verdict=Verdict.SDC,
        failed=("golden",),
    )
    rescreening = node(
        "n1",
        state=NodeState.TESTING,
        annotations={keys.OWNED_TAINTS: "sdcguard.dev/testing", keys.CURRENT_TEST: "t1"},
        taints=testing,
        qualified_at=NOW - 500 * HOUR,
    )
    fleet = [
        Observed(node=sick, test=confirmation, idle_since=NOW - HOUR),
        Observed(node=rescreening, test=sdctest("t1"), idle_since=NOW - HOUR),
        _qualified("n2", ""),
        _qualified("n3", ""),
    ]
    hold = frozenset({"sdcguard.dev/testing", "sdcguard.dev/quarantined"})
    assert [o.pool_member(hold).held for o in fleet] == [False, True, False, False]
    decisions = {d.node: d for d in decide_all(fleet, p, NOW)}
    assert decisions["n0"].state == NodeState.QUARANTINED
    assert not decisions["n2"].starts_test and not decisions["n3"].starts_test
    assert decisions["n2"].waits_for_budget and "maxUnavailable 2" in decisions["n2"].note


# Devices -------------------------------------------------------------------------------


def test_a_reservation_must_fit_the_device_budget() -> None:
    budgets = Budgets(max_unavailable="100%", max_unavailable_devices=8)
    pool = PoolUsage("h100", nodes=8, devices=64, devices_unavailable=3)
    refused = can_reserve(pool, budgets, takes_node=True, devices=8)
    assert not refused.allowed
    assert refused.reason == (
        "pool h100 already has 3 of 64 devices out of service and the node would take 8 "
        "more (maxUnavailableDevices 8 allows 8)"
    )
    assert can_reserve(pool, budgets, takes_node=True, devices=5).allowed
    assert can_reserve(pool, budgets, takes_node=False, devices=8).allowed, "held already"
    none_out = PoolUsage("h100", nodes=8, devices=64)
    small = Budgets(max_unavailable="100%", max_unavailable_devices="5%")  # 3 of 64
    assert can_reserve(none_out, small, takes_node=True, devices=8).allowed, "one node at a time"
    zero = Budgets(max_unavailable="100%", max_unavailable_devices=0)
    assert not can_reserve(none_out, zero, takes_node=True, devices=8).allowed
    unlimited = Budgets(max_unavailable="100%")
    assert can_reserve(pool, unlimited, takes_node=True, devices=64).allowed
    assert allowed_devices(unlimited, 64) is None and allowed_devices(small, 64) == 3


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("150%", "spec.budgets.maxUnavailableDevices: percent must be between 0% and 100%"),
        (-1, "spec.budgets.maxUnavailableDevices: a device count must not be negative"),
        ("two", "spec.budgets.maxUnavailableDevices: must be a device count like 3 or a percent"),
    ],
)
def test_the_device_budget_is_validated(value: int | str, message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        Budgets.model_validate({"maxUnavailableDevices": value})
    assert Budgets.model_validate({"maxUnavailableDevices": "10%"}).max_unavailable_devices == "10%"


GPU = SliceDevice("gpu.nvidia.com", "pool", "gpu-3", "GPU-3")


def test_a_device_quarantine_uses_device_budget_not_node_budget() -> None:
    ticket = TicketFacts("t", devices=(GPU,))
    member = Observed(node=node(state=NodeState.QUARANTINED), ticket=ticket).pool_member()
    assert (member.held, member.devices, member.devices_held) == (False, 8, 1)
    whole = Observed(node=node(state=NodeState.QUARANTINED), ticket=TicketFacts("t"))
    assert whole.pool_member().devices_held == 8, "a held node has all its devices out"
    assert Observed(node=node(state=NodeState.QUALIFIED)).pool_member().devices_held == 0


def test_devices_out_of_service_hold_back_reservations_in_a_pass() -> None:
    p = policy(budgets={"maxUnavailable": "100%", "maxUnavailableDevices": 8})
    fleet = [_qualified(f"q{i}", "") for i in range(3)]
    started = [d.node for d in decide_all(fleet, p, NOW) if d.starts_test]
    assert len(started) == 1, "8 devices allow one 8-GPU node at a time"
    quarantined = Observed(
        node=node("dq", state=NodeState.QUARANTINED), ticket=TicketFacts("t", devices=(GPU,))
    )
    blocked = decide_all([quarantined, *fleet], p, NOW)
    assert not [d for d in blocked if d.starts_test], "1 device out + 8 would pass the limit"
    assert all("maxUnavailableDevices 8 allows 8" in d.note for d in blocked if d.node != "dq")


def test_a_device_quarantine_in_the_pass_counts_for_the_next_reservation() -> None:
    p = policy(
        budgets={"maxUnavailable": "100%", "maxUnavailableDevices": 8},
        quarantine={"scope": "Device"},
        confirmation={"reruns": 0},
    )
    failing = node(
        "bad", state=NodeState.TESTING, annotations={keys.CURRENT_TEST: "t1"}, qualified_at=NOW
    )
    failed = sdctest("t1", verdict=Verdict.SDC, failed=("golden",))
    failed = dataclasses.replace(
        failed, findings=(Finding(test="t1", check="golden", odd_device=3),)
    )
    devices = NodeDevices(
        served=True,
        devices=tuple(
            SliceDevice("gpu.nvidia.com", "bad", f"gpu-{i}", f"GPU-{i}") for i in range(8)
        ),
    )
    bad = Observed(node=failing, test=failed, devices=devices, idle_since=NOW - HOUR)
    decisions = decide_all([bad, _qualified("q0", "")], p, NOW)
    by_node = {d.node: d for d in decisions}
    assert by_node["bad"].state == NodeState.QUARANTINED
    assert member_after(bad.pool_member(), by_node["bad"]).devices_held == 1
    assert not by_node["q0"].starts_test, "the quarantined GPU counts before its watch event"


def test_verifying_a_device_quarantine_takes_a_serving_node() -> None:
    p = policy(budgets={"maxUnavailable": 0}, quarantine={"scope": "Device"})
    ticket = TicketFacts(
        "t", TicketPhase.IN_REPAIR, Resolution.REPAIRED, acknowledged=True, devices=(GPU,)
    )
    observed = Observed(
        node=node(state=NodeState.REPAIRING),
        ticket=ticket,
        idle_since=NOW - HOUR,
        usage=PoolUsage(nodes=10),
    )
    d = decide_all([observed], p, NOW)[0]
    assert d.event is None and d.waiting is not None
    assert "maxUnavailable 0 allows 0" in d.waiting, "its node serves until the reservation"
    whole = dataclasses.replace(observed, ticket=dataclasses.replace(ticket, devices=()))
    assert decide_all([whole], p, NOW)[0].starts_test, "a held node takes nothing more"
    tight = policy(
        budgets={"maxUnavailable": "100%", "maxUnavailableDevices": 4},
        quarantine={"scope": "Device"},
    )
    alone = decide_all([observed], tight, NOW)[0]
    assert alone.starts_test, "only its own GPU is out: a non-zero limit lets it be verified"
    other = Observed(
        node=node("other", state=NodeState.QUARANTINED), ticket=TicketFacts("o", devices=(GPU,))
    )
    both = {d.node: d for d in decide_all([observed, other], tight, NOW)}
    assert not both["gpu-1"].starts_test, "another node's GPU is out too: 2 + 7 > 4"
