"""A policy change costs nothing: a test it ended is no result (no back-off), the new
owner screens an unqualified node at once where its budgets allow, and Events say
"gated" only where something is gated (Enforce)."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from sdcguard.adapters.observations import current_test, inherit_current
from sdcguard.adapters.pass_state import FleetView, TestSnapshot
from sdcguard.api import SDCTestPhase, Suite, Verdict
from sdcguard.domain import keys
from sdcguard.domain.actions import EmitEvent
from sdcguard.domain.budgets import PoolUsage
from sdcguard.domain.decide import Decision, decide
from sdcguard.domain.lifecycle import NodeState
from sdcguard.domain.observed import Observed, TestFacts
from sdcguard.domain.states import Event
from sdcguard.domain.waits import WaitReason
from tests.unit.factories import HOUR, NOW, node, policy, sdctest

S, E = NodeState, Event
ROOMY = PoolUsage(nodes=100)


def _ended(phase: SDCTestPhase, reason: str, verdict: Verdict | None = None) -> TestFacts:
    test = sdctest("t1", suite=Suite.ACCEPTANCE, verdict=verdict, phase=phase)
    return dataclasses.replace(test, end_reason=reason)


def _testing(test: TestFacts, *, qualified: bool, **annotations: str) -> Observed:
    n = node(
        state=S.TESTING,
        annotations={keys.CURRENT_TEST: "t1", **annotations},
        qualified_at=NOW - HOUR if qualified else None,
    )
    return Observed(node=n, test=test, idle_since=NOW - HOUR, usage=ROOMY)


def _events(decision: Decision) -> list[EmitEvent]:
    return [a for a in decision.actions if isinstance(a, EmitEvent)]


@pytest.mark.parametrize(
    ("test", "qualified", "event", "target"),
    [
        (
            _ended(SDCTestPhase.CANCELLED, "NodeLeftPolicy"),
            False,
            E.ACCEPTANCE_CANCELLED,
            S.UNQUALIFIED,
        ),
        (
            _ended(SDCTestPhase.CANCELLED, "PolicyDeleted"),
            False,
            E.ACCEPTANCE_CANCELLED,
            S.UNQUALIFIED,
        ),
        (_ended(SDCTestPhase.CANCELLED, "NodeLeftPolicy"), True, E.TEST_CANCELLED, S.QUALIFIED),
        # Written Inconclusive by an operator before the rule: still no result.
        (
            _ended(SDCTestPhase.INCONCLUSIVE, "NodeLeftPolicy", Verdict.INCONCLUSIVE),
            False,
            E.ACCEPTANCE_CANCELLED,
            S.UNQUALIFIED,
        ),
        # A probe that said nothing is a result: it backs off.
        (
            _ended(SDCTestPhase.INCONCLUSIVE, "CheckMissing", Verdict.INCONCLUSIVE),
            False,
            E.ACCEPTANCE_INCONCLUSIVE,
            S.UNQUALIFIED,
        ),
    ],
    ids=["left", "deleted", "left-qualified", "left-legacy", "probe-inconclusive"],
)
def test_a_test_a_policy_change_ended_starts_no_back_off(
    test: TestFacts, qualified: bool, event: Event, target: NodeState
) -> None:
    decision = decide(_testing(test, qualified=qualified), policy(), NOW)
    assert (decision.event, decision.state) == (event, target)
    backs_off = event == E.ACCEPTANCE_INCONCLUSIVE
    annotations = {k: v for a in decision.actions for k, v in getattr(a, "changes", ())}
    assert (annotations.get(keys.RETRY_AFTER) is not None) is backs_off
    assert (annotations.get(keys.INCONCLUSIVE) is not None) is backs_off


def _their_test(phase: str, reason: str = "") -> TestSnapshot:
    """The node's test as the policy that owned it before wrote it (policy "old")."""
    status = {"phase": phase}
    if reason:
        status["reason"] = reason
    return TestSnapshot.from_body(
        {
            "metadata": {"name": "t1", "uid": "uid-t1", "resourceVersion": "7"},
            "spec": {"nodeName": "gpu-1", "policyRef": "old", "reason": "Join"},
            "status": status,
        }
    )


@pytest.mark.parametrize(
    ("phase", "reason", "event"),
    [
        ("Running", "", None),  # the old owner has not ended it yet: the node waits
        ("Cancelled", "NodeLeftPolicy", E.ACCEPTANCE_CANCELLED),
    ],
    ids=["still-running", "cancelled"],
)
def test_the_new_owner_reads_the_test_the_old_owner_left_on_the_node(
    phase: str, reason: str, event: Event | None
) -> None:
    """The node's labels made another policy its owner while the old one screened it: the
    new owner has none of its own tests of the node, and reads the old owner's (the
    node's current test) instead of taking it for lost, which would back the node off."""
    n = node(state=S.TESTING, annotations={keys.CURRENT_TEST: "t1"})
    view = FleetView(nodes={}, tests={"gpu-1": [_their_test(phase, reason)]})
    tests = inherit_current(n, [], view)
    assert [t.name for t in tests] == ["t1"]
    test = current_test(n, tests)
    observed = Observed(node=n, test=test, idle_since=NOW - HOUR, usage=ROOMY)
    decision = decide(observed, policy(), NOW)
    assert decision.event == event
    annotations = {k: v for a in decision.actions for k, v in getattr(a, "changes", ())}
    assert annotations.get(keys.RETRY_AFTER) is None
    assert annotations.get(keys.INCONCLUSIVE) is None
    # Without the old owner's test the node's test would count as lost: a back-off.
    lost = decide(Observed(node=n, test=None, idle_since=NOW - HOUR, usage=ROOMY), policy(), NOW)
    assert lost.event == E.ACCEPTANCE_INCONCLUSIVE


def test_only_the_nodes_current_test_is_inherited() -> None:
    n = node(state=S.UNQUALIFIED)
    view = FleetView(nodes={}, tests={"gpu-1": [_their_test("Cancelled", "NodeLeftPolicy")]})
    assert inherit_current(n, [], view) == []


@pytest.mark.parametrize("mode", ["Observe", "Enforce"])
def test_after_a_cancelled_acceptance_the_owner_screens_at_once(mode: str) -> None:
    """The next decision after the cancellation: an unqualified, idle node in a pool
    with room starts its acceptance test (no back-off stands in the way)."""
    n = node(state=S.UNQUALIFIED)
    decision = decide(Observed(node=n, idle_since=NOW - HOUR, usage=ROOMY), policy(mode=mode), NOW)
    assert decision.event == E.JOINED and decision.starts_test


@pytest.mark.parametrize(
    "observed",
    [
        pytest.param(
            Observed(node=node(state=S.UNQUALIFIED), idle_since=NOW - HOUR, usage=ROOMY),
            id="join",
        ),
        pytest.param(
            _testing(
                sdctest("t1", suite=Suite.ACCEPTANCE, verdict=Verdict.INCONCLUSIVE), qualified=False
            ),
            id="acceptance-inconclusive",
        ),
        pytest.param(
            _testing(_ended(SDCTestPhase.CANCELLED, "NodeLeftPolicy"), qualified=False),
            id="acceptance-cancelled",
        ),
    ],
)
def test_events_never_say_gated_in_observe(observed: Observed) -> None:
    decision = decide(observed, policy(mode="Observe"), NOW)
    texts = [e.message for e in _events(decision)]
    assert texts, decision
    assert not any("gated" in t.replace("not gated", "") for t in texts), texts


def test_enforce_says_the_node_is_gated() -> None:
    observed = Observed(node=node(state=S.UNQUALIFIED), idle_since=NOW - HOUR, usage=ROOMY)
    decision = decide(observed, policy(mode="Enforce"), NOW)
    assert any("gated until it passes" in e.message for e in _events(decision))


def test_a_back_off_wait_names_the_command_that_skips_it() -> None:
    retry = keys.format_time(NOW + HOUR)
    n = node(state=S.UNQUALIFIED, annotations={keys.RETRY_AFTER: retry, keys.INCONCLUSIVE: "1"})
    decision = decide(
        Observed(node=n, idle_since=NOW - HOUR, usage=ROOMY), policy(mode="Enforce"), NOW
    )
    assert decision.wait is not None and decision.wait.reason == WaitReason.BACK_OFF
    assert "kubectl sdc test gpu-1" in decision.wait.message


def _backing_off(enforced_since: dt.datetime | None) -> Observed:
    """An unqualified node half-way through a one-hour back-off (it began at NOW - 30m,
    after an inconclusive acceptance; that test is no longer the node's); the policy
    switched to Enforce at ``enforced_since`` (or never)."""
    retry = keys.format_time(NOW + HOUR / 2)
    n = node(state=S.UNQUALIFIED, annotations={keys.RETRY_AFTER: retry, keys.INCONCLUSIVE: "1"})
    return Observed(node=n, idle_since=NOW - HOUR, usage=ROOMY, enforced_since=enforced_since)


@pytest.mark.parametrize(
    ("enforced_since", "starts"),
    [
        (NOW - HOUR / 6, True),  # the back-off began in Observe: waived
        (NOW - HOUR * 5 / 6, False),  # a result under Enforce backs off
        (None, False),  # no switch seen
    ],
    ids=["switched-after", "switched-before", "no-switch"],
)
def test_switching_to_enforce_screens_a_node_backing_off_from_observe(
    enforced_since: dt.datetime | None, starts: bool
) -> None:
    """Observe -> Enforce gates every node not yet qualified; one backing off after an
    inconclusive result from Observe is screened at once, not left gated and idle."""
    spec = policy(mode="Enforce", triggers={"inconclusiveBackoff": "1h"})
    decision = decide(_backing_off(enforced_since), spec, NOW)
    assert decision.starts_test is starts
    if not starts:
        assert decision.wait is not None and decision.wait.reason == WaitReason.BACK_OFF
