"""Typed waits (domain.waits): every reason of the closed set is reached by a decision,
and the reason travels as a value, so a message can be reworded without changing it."""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib
from collections.abc import Callable
from pathlib import Path

import pytest

from sdcguard.api import RepairStrategy, Resolution, ScreeningReason, SDCTestPhase, TicketPhase
from sdcguard.domain import keys
from sdcguard.domain.budgets import PoolUsage
from sdcguard.domain.decide import Decision, decide
from sdcguard.domain.lifecycle import Annotate, NodeState
from sdcguard.domain.observed import Observed, Taint
from sdcguard.domain.waits import WAIT_EVENT_AFTER, Wait, WaitReason, publish
from tests.unit.factories import HOUR, NOW, node, policy, sdctest, ticket

S, W = NodeState, WaitReason
decide_mod = importlib.import_module("sdcguard.domain.decide")
ROOMY = PoolUsage(nodes=100)


def _verifying(**node_kw: object) -> Observed:
    """A node whose repair verification is due (the schedule's re-test of a repair)."""
    n = node(state=S.VERIFYING, **node_kw)  # type: ignore[arg-type]
    t = ticket(phase=TicketPhase.VERIFYING, resolution=Resolution.REPAIRED)
    return Observed(node=n, ticket=t, idle_since=NOW - HOUR, usage=ROOMY)


def _testing(**kw: object) -> Observed:
    n = node(state=S.TESTING, annotations={keys.CURRENT_TEST: "t1"}, qualified_at=NOW - HOUR)
    return Observed(node=n, test=sdctest("t1"), idle_since=NOW - HOUR, usage=ROOMY, **kw)  # type: ignore[arg-type]


def _suspect_with_pending_pod() -> Observed:
    n = node(state=S.SUSPECT, annotations={keys.SUSPECT_CHECKS: "compute"})
    return Observed(node=n, idle_since=NOW - HOUR, usage=ROOMY, pending_pod_needs_node=True)


def _replacement_under_open_breaker() -> Observed:
    n = node(state=S.QUARANTINED)
    return Observed(node=n, ticket=ticket(acknowledged=True), usage=ROOMY, breaker_open=True)


def _manual_test_on_unready_node() -> Observed:
    manual = sdctest("gpu-1-manual-1", reason=ScreeningReason.MANUAL, phase=SDCTestPhase.PENDING)
    n = dataclasses.replace(node(state=S.QUALIFIED, qualified_at=NOW - HOUR), ready=False)
    return Observed(node=n, test=manual, idle_since=NOW - HOUR, usage=ROOMY)


def _awaiting_baseline() -> Observed:
    observed = _testing()
    assert observed.test is not None
    return dataclasses.replace(
        observed, test=dataclasses.replace(observed.test, awaiting_baseline=True)
    )


def _mixed_mig() -> Observed:
    observed = _verifying()
    offered = "nvidia.com/gpu: 4, nvidia.com/mig-1g.10gb: 14"
    return dataclasses.replace(observed, node=dataclasses.replace(observed.node, mixed_mig=offered))


SCENARIOS: dict[WaitReason, tuple[Callable[[], Observed], dict[str, object]]] = {
    W.PROBE_UNSCHEDULABLE: (
        lambda: _testing(probe_unschedulable="0/1 nodes are available: 1 Insufficient gpu."),
        {},
    ),
    W.NODE_NOT_READY: (_manual_test_on_unready_node, {}),
    W.POLICY_PAUSED: (_verifying, {"paused": True}),
    W.FOREIGN_TAINT: (
        lambda: _verifying(taints=(Taint("example.com/maintenance", "NoSchedule"),)),
        {},
    ),
    W.NO_ACCELERATORS: (lambda: _verifying(accelerators=0), {}),
    W.MIXED_MIG: (_mixed_mig, {}),
    W.RUNTIME_CLASS_MISSING: (
        lambda: dataclasses.replace(_verifying(), runtime_class_missing=True),
        {"probe": {"runtimeClassName": "nvidia"}},
    ),
    W.BREAKER_OPEN: (_replacement_under_open_breaker, {"repair": {"strategy": "Replace"}}),
    W.BACK_OFF: (
        lambda: _verifying(annotations={keys.RETRY_AFTER: keys.format_time(NOW + HOUR)}),
        {},
    ),
    W.ANOTHER_TEST: (lambda: _testing(queued=("gpu-1-manual-1",)), {}),
    W.PENDING_POD: (_suspect_with_pending_pod, {}),
    W.AWAITING_BASELINE: (_awaiting_baseline, {}),
    W.BUDGET: (
        lambda: dataclasses.replace(_verifying(), usage=PoolUsage(nodes=100, tests=10)),
        {"budgets": {"maxConcurrentTests": 1}},
    ),
}


def _decided(reason: WaitReason) -> Decision:
    make, spec = SCENARIOS[reason]
    return decide(make(), policy(**spec), NOW)


def test_every_reason_of_the_closed_set_has_a_scenario() -> None:
    assert set(SCENARIOS) == set(WaitReason)
    assert RepairStrategy.REPLACE.value == "Replace"  # the spelling the scenario uses


@pytest.mark.parametrize("reason", list(WaitReason))
def test_every_reason_is_reached_by_a_decision(reason: WaitReason) -> None:
    """The decision carries the wait as a value; the node records its message."""
    d = _decided(reason)
    assert d.event is None
    assert d.wait is not None and d.wait.reason == reason, d.note
    assert d.waiting == d.wait.message
    annotate = [a for a in d.actions if isinstance(a, Annotate)]
    assert annotate and dict(annotate[0].changes)[keys.WAITING] == d.wait.message


def test_every_reason_is_documented_where_users_read_conditions() -> None:
    """Each reason is part of the API: the docs' section on waits names it."""
    page = Path(__file__).parents[2] / "docs" / "concepts" / "lifecycle.md"
    text = page.read_text(encoding="utf-8")
    missing = [r.value for r in WaitReason if f"`{r.value}`" not in text]
    assert not missing


def test_a_reworded_message_keeps_its_reason() -> None:
    """Rewording is free: the reason is a field, never read back from the text (the
    phrase table that used to map messages to reasons is gone)."""
    wait = Wait(W.NODE_NOT_READY, "the kubelet stopped posting status")
    assert wait.about("verification waits").reason == W.NODE_NOT_READY
    assert wait.about("x").message == "x: the kubelet stopped posting status"
    long = Wait(W.BUDGET, "y" * 1000).bounded()
    assert long.reason == W.BUDGET and len(long.message) <= 256
    assert not hasattr(decide_mod, "WAIT_REASONS") and not hasattr(decide_mod, "wait_reason")


def test_a_budget_wait_naming_another_reasons_phrase_stays_a_budget_wait() -> None:
    """A pool whose name reads like another wait (the old phrase search would have said
    BackOff) keeps the reason the decision found."""
    observed = dataclasses.replace(
        _verifying(pool="backing off"),
        usage=PoolUsage(pool="backing off", nodes=100, tests=10),
    )
    d = decide(observed, policy(budgets={"maxConcurrentTests": 1}), NOW)
    assert d.wait is not None and "backing off" in d.wait.message
    assert d.wait.reason == W.BUDGET


def test_publish_records_then_tells_once() -> None:
    wait = Wait(W.BUDGET, "pool a full")
    first = publish(wait, "gpu-1", {}, None, NOW)
    assert first.event_message is None and first.requeue == WAIT_EVENT_AFTER
    recorded = {k: v for k, v in first.changes.items() if v is not None}
    later = publish(wait, "gpu-1", recorded, 120.0, NOW + dt.timedelta(seconds=61))
    assert later.event_message == "gpu-1: pool a full (waiting 61s)"
    assert later.changes[keys.WAITING_TOLD] == "pool a full"
    told = {**recorded, keys.WAITING_TOLD: "pool a full"}
    assert publish(wait, "gpu-1", told, 120.0, NOW + HOUR).event_message is None
    cleared = publish(None, "gpu-1", told, None, NOW)
    assert cleared.changes == dict.fromkeys(told)
