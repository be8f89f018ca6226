"""The pydantic models reject what the API server rejects, with the same messages."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from pydantic import ValidationError

from sdcguard.api import (
    Finding,
    RepairTicketSpec,
    Resolution,
    ScreeningReason,
    SDCBaselineSpec,
    SDCPolicy,
    SDCPolicySpec,
    SDCTest,
    SDCTestSpec,
    Suite,
    check_test_update,
    check_ticket_update,
    find_condition,
    from_body,
    parse_duration,
    set_condition,
    to_body,
    to_patch,
)

T0 = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
H = "ab" * 32


def _policy(**spec: Any) -> SDCPolicySpec:
    return SDCPolicySpec.model_validate(spec)


def _error(spec: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as info:
        SDCPolicySpec.model_validate(spec)
    return str(info.value)


def test_empty_policy_gets_safe_defaults() -> None:
    spec = _policy()
    assert spec.mode == "Enforce"
    assert spec.accelerators[0] == "nvidia.com/gpu"
    assert [c.name for c in spec.suites.acceptance] == ["compute", "collective", "golden", "memory"]
    assert spec.taints.quarantine == "sdcguard.dev/quarantined"
    assert spec.confirmation.reruns == 1
    assert spec.budgets.max_unavailable == "10%"


@pytest.mark.parametrize("value", [0, 3, "0%", "10%", "100%"])
def test_max_unavailable_accepts_counts_and_percents(value: int | str) -> None:
    assert _policy(budgets={"maxUnavailable": value}).budgets.max_unavailable == value


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("150%", "spec.budgets.maxUnavailable: percent must be between 0% and 100%"),
        ("101%", "percent must be between 0% and 100%"),
        ("ten", 'a node count like 3 or a percent like "10%"'),
        ("3", 'a node count like 3 or a percent like "10%"'),
        (-1, "a node count must not be negative"),
    ],
)
def test_max_unavailable_rejects(value: int | str, message: str) -> None:
    assert message in _error({"budgets": {"maxUnavailable": value}})


@pytest.mark.parametrize("text", ["-5m", "5", "5 m", "1d", "", "m"])
def test_durations_must_be_go_style_and_non_negative(text: str) -> None:
    _error({"triggers": {"onReturnFromUse": {"idleFor": text}}})
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "seconds"), [("0", 0), ("90s", 90), ("30m", 1800), ("1h30m", 5400), ("1.5h", 5400)]
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_cross_field_rules() -> None:
    assert "check names must be unique" in _error(
        {"suites": {"acceptance": [{"name": "compute"}, {"name": "compute"}]}}
    )
    assert "list at least one check" in _error({"suites": {"requalification": []}})
    assert "draining needs cordon: true" in _error({"quarantine": {"drain": True, "cordon": False}})
    assert "three different keys" in _error({"taints": {"gate": "sdcguard.dev/testing"}})
    assert "Consensus needs at least 2" in _error({"baseline": {"quorum": 1}})
    assert "secretRef: required for type jira" in _error(
        {"repair": {"ticketSinks": [{"type": "jira", "url": "https://jira.example"}]}}
    )
    assert "at least budgetSeconds" in _error(
        {"probe": {"budgetSeconds": 900, "activeDeadlineSeconds": 600}}
    )
    assert "must be longer than 0s" in _error({"circuitBreaker": {"window": "0s"}})
    assert "at least 1m" in _error({"triggers": {"maxQualificationAge": "30s"}})
    assert "less than or equal to 1" in _error({"circuitBreaker": {"maxFailureFraction": 1.5}})
    assert _policy(triggers={"maxQualificationAge": "0"}).triggers.max_qualification_age == "0"


def test_repair_verification_test_needs_ticket() -> None:
    with pytest.raises(ValidationError, match="needs ticketRef"):
        SDCTestSpec.model_validate(
            {
                "nodeName": "n1",
                "policyRef": "p",
                "reason": "RepairVerification",
                "suite": "acceptance",
            }
        )
    spec = SDCTestSpec(
        node_name="n1",
        policy_ref="p",
        reason=ScreeningReason.REPAIR_VERIFICATION,
        suite=Suite.REPAIR_VERIFICATION,
        ticket_ref="n1-1",
    )
    with pytest.raises(ValueError, match="immutable"):
        check_test_update(spec, spec.model_copy(update={"attempt": 2}))
    check_test_update(spec, spec.model_copy())


def test_ticket_retire_is_final() -> None:
    old = RepairTicketSpec(node_name="n1", resolution=Resolution.RETIRE)
    with pytest.raises(ValueError, match="Retire is final"):
        check_ticket_update(old, old.model_copy(update={"resolution": Resolution.REPAIRED}))
    with pytest.raises(ValueError, match="nodeName is immutable"):
        check_ticket_update(old, old.model_copy(update={"node_name": "n2"}))
    repaired = RepairTicketSpec(node_name="n1", resolution=Resolution.REPAIRED)
    check_ticket_update(repaired, repaired.model_copy(update={"resolution": None}))


def test_baseline_rules() -> None:
    spec = SDCBaselineSpec.model_validate({"fingerprint": {"hash": H}})
    assert spec.fingerprint.short_hash == H[:12]
    with pytest.raises(ValidationError, match="trusted baseline needs at least one digest"):
        SDCBaselineSpec.model_validate({"fingerprint": {"hash": H}, "trusted": True})
    with pytest.raises(ValidationError, match="first characters of hash"):
        SDCBaselineSpec.model_validate({"fingerprint": {"hash": H, "shortHash": "cccccccccccc"}})


def test_bodies_are_camel_case_and_round_trip() -> None:
    body = {
        "apiVersion": "sdcguard.dev/v1alpha1",
        "kind": "SDCTest",
        "metadata": {"name": "n1-abc-1", "uid": "u", "managedFields": [{"manager": "x"}]},
        "spec": {"nodeName": "n1", "policyRef": "default", "suite": "acceptance", "reason": "Join"},
        "status": {
            "phase": "Failed",
            "verdict": "SDC",
            "checks": [{"name": "golden", "verdict": "SDC", "oddDevice": 3}],
        },
    }
    test = from_body(body)
    assert isinstance(test, SDCTest)
    assert test.status is not None and test.status.checks[0].odd_device == 3
    out = to_body(test)
    assert out["spec"]["nodeName"] == "n1"
    assert out["status"]["checks"][0]["oddDevice"] == 3
    assert "ticketRef" not in out["spec"]
    assert out["metadata"]["managedFields"] == [{"manager": "x"}]
    assert from_body(out) == test
    policy = to_body(SDCPolicy())
    assert policy["spec"]["circuitBreaker"]["maxFailureFraction"] == 0.5
    assert policy["spec"]["triggers"]["onReturnFromUse"]["idleFor"] == "30m"


def test_patches_set_only_the_named_fields_and_null_removes() -> None:
    spec = RepairTicketSpec(
        node_name="n1",
        evidence=["t-1"],
        findings=[Finding(test="t-1", check="golden", odd_device=2)],
        resolution_note="swapped",
    )
    patch = to_patch(spec, "findings", "resolution", "resolution_note")
    # Nested unset fields are left out; a named top-level None is sent as null.
    assert patch == {
        "findings": [{"test": "t-1", "check": "golden", "oddDevice": 2}],
        "resolution": None,
        "resolutionNote": "swapped",
    }
    with pytest.raises(ValueError, match="no fields"):
        to_patch(spec, "resolutionNote")


def test_from_body_names_the_problem() -> None:
    with pytest.raises(ValueError, match="unknown kind 'Pod'"):
        from_body({"apiVersion": "sdcguard.dev/v1alpha1", "kind": "Pod"})
    with pytest.raises(ValueError, match="expected apiVersion"):
        from_body({"apiVersion": "v1", "kind": "SDCTest"})
    with pytest.raises(ValidationError, match="nodeName"):
        from_body({"apiVersion": "sdcguard.dev/v1alpha1", "kind": "SDCTest", "spec": {}})


def test_condition_transition_time_moves_only_on_flip() -> None:
    later = T0 + dt.timedelta(hours=1)
    conditions = set_condition([], "Ready", "True", "Reconciled", "ok", T0)
    conditions = set_condition(conditions, "Ready", "True", "Reconciled", "still ok", later)
    ready = find_condition(conditions, "Ready")
    assert ready is not None and ready.last_transition_time == T0 and ready.message == "still ok"
    conditions = set_condition(conditions, "Ready", "False", "BreakerOpen", "held", later)
    ready = find_condition(conditions, "Ready")
    assert ready is not None and ready.last_transition_time == later
    assert len(conditions) == 1


@pytest.mark.parametrize(
    "image",
    [
        "ghcr.io/sdcguard/sdcprobe:0.1.0",
        "ghcr.io/sdcguard/sdcprobe:0.1.0-tpu",
        "localhost:5000/sdcprobe",
        "sdcprobe",
        "registry.example.com/a/b_c/d--e:v1.2_3",
        "ghcr.io/sdcguard/sdcprobe@sha256:" + "ab" * 32,
        "ghcr.io/sdcguard/sdcprobe:0.1.0@sha256:" + "ab" * 32,
    ],
)
def test_image_references_are_accepted(image: str) -> None:
    assert _policy(probe={"image": image}).probe.image == image


@pytest.mark.parametrize(
    "image",
    ["UPPER/Case:", "ghcr.io/sdcguard/SDCProbe:1", "sdcprobe:", "sdcprobe:1 --x", "a//b", ""],
)
def test_image_references_are_refused(image: str) -> None:
    assert "probe.image" in _error({"probe": {"image": image}})


def test_max_unavailable_errors_name_the_value() -> None:
    assert "got '150%'" in _error({"budgets": {"maxUnavailable": "150%"}})
    assert "got -2" in _error({"budgets": {"maxUnavailable": -2}})


def test_node_counts_carry_their_total() -> None:
    from sdcguard.api import NodeCounts

    counts = NodeCounts.model_validate({"qualified": 3, "testing": 1, "total": 99})
    assert counts.total == 4
    assert NodeCounts().total == 0


def test_the_budget_deadline_messages_name_the_values_and_the_default() -> None:
    """A person refused for a budget past the Job's deadline reads both numbers, and
    whether the deadline is the default they never set."""
    from sdcguard.api import SDCPolicySpec

    with pytest.raises(ValueError) as refused:
        SDCPolicySpec.model_validate({"suites": {"budgetSeconds": {"acceptance": 2400}}})
    text = str(refused.value)
    assert "at most spec.probe.activeDeadlineSeconds, here 1800 s (the default)" in text
    assert "acceptance 2400 s" in text
    with pytest.raises(ValueError) as refused:
        SDCPolicySpec.model_validate(
            {
                "probe": {"budgetSeconds": 300, "activeDeadlineSeconds": 600},
                "suites": {"budgetSeconds": {"repairVerification": 900}},
            }
        )
    assert "here 600 s;" in str(refused.value) and "repairVerification 900 s" in str(refused.value)
    with pytest.raises(ValueError, match=r"120 s must be at least budgetSeconds \(300 s\)"):
        SDCPolicySpec.model_validate(
            {"probe": {"budgetSeconds": 300, "activeDeadlineSeconds": 120}}
        )
