"""A screening that fell short of its catch target shows in its policy's status.

The probe says before it runs when its budget cannot reach the policy's catch target,
and under onShortfall Flag the screening runs anyway: its SDCTest records the shortfall
(status.catchTargetMet false, status.catchShortfall) and the metric counts it. The
policy's condition CatchTargetMet counts those of the last day and names the last one,
from the finished tests the operator keeps (trimmed as it keeps them), so an operator
restart loses nothing.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any

from kubernetes import client

from sdcguard.adapters.kube import KubeWriter
from sdcguard.adapters.pass_state import KnownTests, NodeDeletePermission, TestSnapshot
from sdcguard.adapters.policy_status import CATCH_SHORTFALL_WINDOW, PolicyStatusReporter
from sdcguard.api import BreakerStatus, SDCPolicy, SDCPolicyStatus
from sdcguard.domain import breaker as breaker_mod
from sdcguard.metrics import Metrics

NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
SHORT = "compute 0.9373 < 0.99 (54 rounds of 90); a budget of 92s would reach it"


class _Writer(KubeWriter):
    """Keeps the statuses written."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.statuses: list[dict[str, Any]] = []

    def patch_custom_status(self, plural: str, name: str, status: dict[str, Any]) -> None:
        self.statuses.append(status)


def _policy() -> SDCPolicy:
    return SDCPolicy.model_validate(
        {
            "apiVersion": "sdcguard.dev/v1alpha1",
            "kind": "SDCPolicy",
            "metadata": {"name": "fleet", "generation": 1, "resourceVersion": "1"},
            "spec": {},
        }
    )


def _test(name: str, completed: dt.datetime, met: bool | None, rv: str = "1") -> dict[str, Any]:
    status: dict[str, Any] = {
        "phase": "Passed",
        "verdict": "Pass",
        "completionTime": completed.isoformat(),
        "checks": [{"name": "compute", "verdict": "Pass", "digest": "d" * 64}],
    }
    if met is not None:
        status["catchTargetMet"] = met
        status["catchShortfall"] = "" if met else SHORT
    return {
        "apiVersion": "sdcguard.dev/v1alpha1",
        "kind": "SDCTest",
        "metadata": {
            "name": name,
            "resourceVersion": rv,
            "creationTimestamp": "2026-03-01T00:00:00Z",
        },
        "spec": {"nodeName": "gpu-1", "policyRef": "fleet"},
        "status": status,
    }


def _condition(known: KnownTests) -> tuple[str, str, str]:
    writer = _Writer(api=client.ApiClient(), metrics=Metrics())
    reporter = PolicyStatusReporter(writer, Metrics(), known, NodeDeletePermission(writer))
    view = breaker_mod.BreakerView(
        open=False,
        samples=0,
        failures=0,
        tripped_at=None,
        window="24h",
        min_samples=10,
        max_failure_fraction=0.2,
    )
    reporter.write(_policy(), view, BreakerStatus(), Counter(), NOW, {})
    status = SDCPolicyStatus.model_validate(writer.statuses[-1])
    cond = next(c for c in status.conditions if c.type == "CatchTargetMet")
    return cond.status, cond.reason, cond.message


def _read(known: KnownTests, body: dict[str, Any]) -> None:
    known.read(TestSnapshot.slim(body), "gpu-1")


def test_a_screening_short_of_its_target_turns_the_condition_false_and_is_named() -> None:
    known = KnownTests()
    _read(known, _test("gpu-1-a", NOW - dt.timedelta(hours=3), True))
    _read(known, _test("gpu-1-b", NOW - dt.timedelta(hours=2), False))
    _read(known, _test("gpu-1-c", NOW - dt.timedelta(hours=1), False))
    _read(known, _test("gpu-1-old", NOW - CATCH_SHORTFALL_WINDOW - dt.timedelta(hours=1), False))
    status, reason, message = _condition(known)
    assert (status, reason) == ("False", "CatchShortfall")
    assert message.startswith("2 screenings of the last 24h fell short"), message
    assert "the last, gpu-1-c" in message and SHORT in message, message


def test_met_targets_and_probes_that_say_nothing_leave_the_condition_true() -> None:
    known = KnownTests()
    _read(known, _test("gpu-1-a", NOW - dt.timedelta(hours=1), True))
    _read(known, _test("gpu-1-b", NOW - dt.timedelta(hours=1), None))
    assert _condition(known)[:2] == ("True", "NoShortfall")


def test_a_test_read_again_or_forgotten_no_longer_counts() -> None:
    known = KnownTests()
    _read(known, _test("gpu-1-b", NOW - dt.timedelta(hours=1), False))
    assert _condition(known)[0] == "False"
    # The same test at a newer resourceVersion, no longer short (an edited status).
    _read(known, _test("gpu-1-b", NOW - dt.timedelta(hours=1), True, rv="2"))
    assert _condition(known)[0] == "True"
