"""The policy's screening knobs (#38, #41, #45): catch target, memory dwell, suite
budgets, per-check params, and the time a screening is expected to end."""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any

import pytest
from pydantic import ValidationError

from sdcguard.api import SDCPolicySpec, SDCTestStatus, Suite, to_body
from sdcguard.api.policy import CHECK_PARAMS, CheckName
from sdcguard.builders.probe_job import ProbeTuning
from sdcguard.domain.screening_time import START_ALLOWANCE, expected_end, running_fields
from sdcprobe.cli import build_parser

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


def _error(spec: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as info:
        SDCPolicySpec.model_validate(spec)
    return str(info.value)


def _run_options() -> dict[str, argparse.Action]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {opt: action for action in sub.choices["run"]._actions for opt in action.option_strings}


def test_check_params_are_flags_the_probe_takes() -> None:
    """CHECK_PARAMS is what the API server lets through: every name must be a flag of
    ``sdcprobe run``, or an accepted policy would make every screening Inconclusive."""
    options = _run_options()
    for check, names in CHECK_PARAMS.items():
        for name in names:
            assert f"--{name}" in options, (check, name)
    assert set(CHECK_PARAMS) == set(CheckName)


def test_unknown_params_are_refused_naming_the_param_and_the_check() -> None:
    message = _error({"suites": {"acceptance": [{"name": "compute", "params": {"sizee": 5}}]}})
    assert "check compute takes no parameter sizee" in message
    assert "golden: steps" in message and "spec.probe.args" in message
    # A param of another check is refused too: it would change the whole run.
    assert "check golden takes no parameter memory-mib" in _error(
        {"suites": {"requalification": [{"name": "golden", "params": {"memory-mib": 64}}]}}
    )
    spec = SDCPolicySpec.model_validate(
        {"suites": {"acceptance": [{"name": "golden", "params": {"steps": 40}}]}}
    )
    assert spec.suites.acceptance[0].params == {"steps": 40}


def test_timeout_seconds_is_gone_from_the_api() -> None:
    """The probe has no per-check limit, so a per-check timeout would be a field accepted
    and ignored: it is no longer part of the schema (a stored policy that still has it
    parses, the field dropped; the API server refuses it on apply)."""
    spec = SDCPolicySpec.model_validate(
        {"suites": {"acceptance": [{"name": "compute", "timeoutSeconds": 300}]}}
    )
    assert "timeoutSeconds" not in to_body(spec)["suites"]["acceptance"][0]


def test_each_suite_has_its_own_budget_and_verification_the_largest_by_default() -> None:
    spec = SDCPolicySpec()
    assert [spec.suite_budget(s) for s in Suite] == [900, 900, 1350]
    spec = SDCPolicySpec.model_validate(
        {
            "probe": {"budgetSeconds": 1500, "activeDeadlineSeconds": 1800},
            "suites": {"budgetSeconds": {"acceptance": 600}},
        }
    )
    # 1.5 x 1500 does not fit the deadline: verification gets the deadline, never less
    # than the probe's budget.
    assert [spec.suite_budget(s) for s in Suite] == [600, 1500, 1800]
    assert "at most spec.probe.activeDeadlineSeconds" in _error(
        {"suites": {"budgetSeconds": {"repairVerification": 3600}}}
    )
    assert "less than or equal to 86400" in _error(
        {"suites": {"budgetSeconds": {"acceptance": 90000}}}
    )


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ({"chance": 1.0}, "must be above 0 and below 1"),
        ({"chance": 0}, "must be above 0 and below 1"),
        ({"chance": 1.5}, "less than or equal to 1"),
        ({"activeFraction": 0}, "must be above 0 and at most 1"),
        ({"activeFraction": 1.2}, "less than or equal to 1"),
        ({"onShortfall": "Ignore"}, "'Flag' or 'Refuse'"),
    ],
)
def test_catch_target_rejects(target: dict[str, Any], message: str) -> None:
    assert message in _error({"probe": {"catchTarget": target}})


def test_catch_target_and_dwell_become_probe_flags() -> None:
    spec = SDCPolicySpec.model_validate(
        {
            "probe": {
                "catchTarget": {"chance": 0.995, "activeFraction": 0.02, "onShortfall": "Refuse"},
                "memoryDwellSeconds": 1.5,
            }
        }
    )
    args = ProbeTuning.of(spec.probe).args()
    assert args == [
        "--catch-target",
        "0.995",
        "--catch-fraction",
        "0.02",
        "--catch-shortfall",
        "refuse",
        "--memory-dwell",
        "1.5",
    ]
    assert "greater than or equal to 0" in _error({"probe": {"memoryDwellSeconds": -1}})
    options = _run_options()
    if "--catch-target" not in options:
        pytest.skip("this probe predates the catch target flags")
    parsed = build_parser().parse_args(["run", *args])
    assert (parsed.catch_target, parsed.catch_fraction, parsed.catch_shortfall) == (
        0.995,
        0.02,
        "refuse",
    )
    assert parsed.memory_dwell == 1.5


def test_a_running_screening_says_its_budget_and_when_it_should_end() -> None:
    spec = SDCPolicySpec()
    fields = running_fields(spec, Suite.REPAIR_VERIFICATION, T0)
    assert fields == {
        "budget_seconds": 1350,
        "expected_end": T0 + dt.timedelta(seconds=1350) + START_ALLOWANCE,
    }
    body = to_body(SDCTestStatus.model_validate(fields))
    assert body["budgetSeconds"] == 1350 and body["expectedEnd"] == "2026-03-01T12:24:30Z"
    # Never past the Job's deadline, which ends the screening in any case.
    assert expected_end(T0, 1800, 1800) == T0 + dt.timedelta(seconds=1800)
