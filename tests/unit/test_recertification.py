"""Re-certification that cannot stall silently: an overdue qualification is labelled
and counted (only on the transition), and a policy whose test budget cannot re-screen
its nodes within maxQualificationAge says so in its status and an Event."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from kubernetes import client

from sdcguard.adapters import observe
from sdcguard.adapters.reconciler import FleetView, Reconciler
from sdcguard.api import SDCPolicy
from sdcguard.domain import keys
from sdcguard.domain.budgets import PoolUsage
from sdcguard.domain.decide import decide
from sdcguard.domain.lifecycle import Drain, Event, NodeState
from sdcguard.domain.observed import NodeSnapshot, Observed
from sdcguard.domain.recertification import (
    LABEL_OVERDUE,
    is_overdue,
    mean_screening_seconds,
    overdue_label_change,
    recertification_capacity,
)
from sdcguard.metrics import Metrics
from sdcguard.settings import Settings
from tests.unit.factories import NOW, applied, node, policy
from tests.unit.test_apply_order import _Recorder

WEEK = dt.timedelta(hours=168)


@pytest.mark.parametrize(
    ("state", "age", "max_age", "overdue"),
    [
        ("Qualified", dt.timedelta(hours=169), WEEK, True),
        ("Qualified", dt.timedelta(hours=167), WEEK, False),
        ("Qualified", dt.timedelta(days=400), None, False),
        ("Testing", dt.timedelta(hours=200), WEEK, False),
        ("Quarantined", dt.timedelta(hours=200), WEEK, False),
    ],
)
def test_only_an_old_qualification_of_a_qualified_node_is_overdue(
    state: str, age: dt.timedelta, max_age: dt.timedelta | None, overdue: bool
) -> None:
    assert is_overdue(state, NOW - age, max_age, NOW) is overdue


def test_a_node_never_qualified_is_not_overdue() -> None:
    assert not is_overdue("Qualified", None, WEEK, NOW)


@pytest.mark.parametrize(
    ("labels", "overdue", "change"),
    [
        ({}, True, "true"),
        ({LABEL_OVERDUE: "true"}, True, False),
        ({LABEL_OVERDUE: "true"}, False, None),
        ({}, False, False),
        ({LABEL_OVERDUE: "yes"}, False, None),
    ],
)
def test_the_label_is_written_only_on_the_transition(
    labels: dict[str, str], overdue: bool, change: str | bool | None
) -> None:
    assert overdue_label_change(labels, overdue) == change


def test_mean_screening_is_measured_else_the_budget() -> None:
    assert mean_screening_seconds([], 900) == (900.0, 0)
    spans = [(NOW, NOW + dt.timedelta(minutes=m)) for m in (10, 20)]
    assert mean_screening_seconds(spans, 900) == (900.0, 2)


def test_the_charts_defaults_fall_short_above_about_a_thousand_nodes() -> None:
    """The issue's arithmetic: 2 tests at a time, 17.5 min a screening, 168 h."""
    mean = 17.5 * 60
    fine = recertification_capacity({"": 1000}, 2, WEEK, mean, 20)
    assert fine.sufficient and "= 1152 nodes per pool" in fine.message
    short = recertification_capacity({"a": 300, "b": 2000}, 2, WEEK, mean, 20)
    assert not short.sufficient
    assert "pool 'b' has 2000" in short.message
    assert "maxConcurrentTests to at least 4" in short.message
    assert recertification_capacity({"": 10**6}, 2, None, mean, 0).sufficient


def _node(name: str, qualified: str, labels: dict[str, str] | None = None) -> NodeSnapshot:
    return NodeSnapshot.from_body(
        {
            "metadata": {
                "name": name,
                "uid": f"{name}-uid-0000",
                "resourceVersion": "3",
                "creationTimestamp": "2025-01-01T10:00:00Z",
                "labels": {keys.LABEL_STATE: "Qualified", **(labels or {})},
                "annotations": {keys.QUALIFIED_AT: qualified},
            },
            "spec": {"taints": []},
            "status": {
                "allocatable": {"nvidia.com/gpu": "8"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    )


def _busy(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": f"train-{name}", "namespace": "ml"},
        "spec": {
            "nodeName": name,
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
        },
        "status": {"phase": "Running"},
    }


def _pass(nodes: list[NodeSnapshot], **spec: Any) -> tuple[_Recorder, Metrics]:
    fleet = SDCPolicy.model_validate(
        {
            "apiVersion": "sdcguard.dev/v1alpha1",
            "kind": "SDCPolicy",
            "metadata": {"name": "fleet", "generation": 1, "resourceVersion": "1"},
            "spec": {"triggers": {"maxQualificationAge": "1h"}, **spec},
        }
    )
    metrics = Metrics()
    writer = _Recorder(api=client.ApiClient(), metrics=metrics)
    rec = Reconciler(writer=writer, settings=Settings(metrics_port=0), metrics=metrics)
    view = FleetView(nodes={n.name: n for n in nodes}, policies={"fleet": {}})
    for snapshot in nodes:  # kept busy: expiry never finds an idle window
        use = observe.pod_use(_busy(snapshot.name))
        assert use is not None
        view.busy.setdefault(snapshot.name, []).append(use)
    rec.run_pass(fleet, view, NOW)
    return writer, metrics


def _overdue_patches(writer: _Recorder) -> list[str | None]:
    return [
        body["metadata"]["labels"][LABEL_OVERDUE]
        for kind, body in writer.calls
        if kind == "node-patch" and LABEL_OVERDUE in body.get("metadata", {}).get("labels", {})
    ]


def _gauge(metrics: Metrics) -> float | None:
    return metrics.registry.get_sample_value(
        "sdcguard_qualification_overdue_nodes", {"policy": "fleet"}
    )


def test_a_busy_node_past_its_age_becomes_overdue_once() -> None:
    old = keys.format_time(NOW - dt.timedelta(hours=2))
    writer, metrics = _pass([_node("gpu-1", old)])
    assert _overdue_patches(writer) == ["true"]
    assert _gauge(metrics) == 1
    writer, metrics = _pass([_node("gpu-1", old, {LABEL_OVERDUE: "true"})])
    assert _overdue_patches(writer) == [], "no write while it stays overdue"
    assert _gauge(metrics) == 1
    fresh = keys.format_time(NOW - dt.timedelta(minutes=5))
    writer, metrics = _pass([_node("gpu-1", fresh, {LABEL_OVERDUE: "true"})])
    assert _overdue_patches(writer) == [None], "re-qualified: the label goes"
    assert _gauge(metrics) == 0


def test_a_budget_too_small_for_the_age_warns_in_status_and_an_event() -> None:
    """1 test at a time, 15 min a screening (the budget, none measured), 1 h: 4 nodes;
    the pool has 5. Warned, not refused."""
    fresh = keys.format_time(NOW - dt.timedelta(minutes=5))
    nodes = [_node(f"gpu-{i}", fresh) for i in range(5)]
    writer, _ = _pass(nodes, budgets={"maxConcurrentTests": 1})
    statuses = [body for kind, body in writer.calls if kind == "sdcpolicies-status"]
    (condition,) = [c for c in statuses[-1]["conditions"] if c["type"] == "RecertificationCapacity"]
    assert condition["status"] == "False" and condition["reason"] == "BudgetTooSmall"
    assert "= 4 nodes per pool" in condition["message"]
    assert "has 5" in condition["message"]
    assert ("event", "RecertificationCapacityShort") in writer.calls
    writer, _ = _pass(nodes[:4], budgets={"maxConcurrentTests": 1})
    statuses = [body for kind, body in writer.calls if kind == "sdcpolicies-status"]
    (condition,) = [c for c in statuses[-1]["conditions"] if c["type"] == "RecertificationCapacity"]
    assert condition["status"] == "True"


# Forced re-screening (triggers.overdue.action Drain) -----------------------------------

FORCE = {"maxQualificationAge": "168h", "overdue": {"action": "Drain", "gracePeriod": "24h"}}


def test_an_overdue_busy_node_is_held_then_drained_and_screened_when_idle() -> None:

    spec = policy(triggers=FORCE)
    busy = {"idle_since": None, "usage": PoolUsage(nodes=100)}
    n = node(state=NodeState.QUALIFIED, qualified_at=NOW - dt.timedelta(hours=170))
    d = decide(Observed(node=n, **busy), spec, NOW)
    assert d.event == Event.OVERDUE_HELD and d.state == NodeState.QUALIFIED
    held = applied(n, d)
    assert "sdcguard.dev/testing" in {t.key for t in held.taints}, "no new work lands"
    waits = decide(Observed(node=held, **busy), spec, NOW)
    assert waits.event is None and "held, waiting for running work" in waits.note
    # Its work ends: screened at once, a pending pod no longer comes first.
    idle = decide(
        Observed(
            node=held,
            idle_since=NOW - dt.timedelta(minutes=1),
            pending_pod_needs_node=True,
            usage=PoolUsage(nodes=100),
        ),
        spec,
        NOW,
    )
    assert idle.event == Event.EXPIRY_DUE and idle.starts_test
    # Its work outlasts the grace period: drained, PDBs honoured, until it is idle.
    later = NOW + dt.timedelta(hours=23)
    drain = decide(Observed(node=held, **busy), spec, later)
    assert drain.event == Event.OVERDUE_DRAIN_DUE
    assert [a for a in drain.actions if isinstance(a, Drain)]


@pytest.mark.parametrize(
    "triggers",
    [
        {"maxQualificationAge": "168h"},  # action Warn, the default
        {**FORCE, "maxQualificationAge": "0"},
    ],
)
def test_warn_or_no_expiry_never_holds(triggers: dict[str, Any]) -> None:

    n = node(state=NodeState.QUALIFIED, qualified_at=NOW - dt.timedelta(hours=400))
    d = decide(
        Observed(node=n, idle_since=None, usage=PoolUsage(nodes=100)),
        policy(triggers=triggers),
        NOW,
    )
    assert d.event is None


def test_observe_mode_never_holds() -> None:

    n = node(state=NodeState.QUALIFIED, qualified_at=NOW - dt.timedelta(hours=400))
    spec = policy(triggers=FORCE, mode="Observe")
    d = decide(Observed(node=n, idle_since=None, usage=PoolUsage(nodes=100)), spec, NOW)
    assert d.event is None and "waiting for an idle window" in d.note


def test_a_hold_outliving_its_reason_still_ends_in_a_screening() -> None:
    """Held while overdue, then the policy stops forcing (action Warn, a longer age):
    the node is screened once idle, so the hold is not left behind."""
    spec = policy(triggers=FORCE)
    busy = {"idle_since": None, "usage": PoolUsage(nodes=100)}
    n = node(state=NodeState.QUALIFIED, qualified_at=NOW - dt.timedelta(hours=170))
    held = applied(n, decide(Observed(node=n, **busy), spec, NOW))
    relaxed = policy(triggers={"maxQualificationAge": "720h"})
    idle = Observed(node=held, idle_since=NOW - dt.timedelta(minutes=1), usage=PoolUsage(nodes=100))
    d = decide(idle, relaxed, NOW)
    assert d.event == Event.EXPIRY_DUE and d.starts_test
