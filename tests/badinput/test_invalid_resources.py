"""Invalid SDCPolicy, SDCTest, RepairTicket and SDCBaseline objects are refused by the
real API server (the generated CRDs' schemas and CEL rules), with a message that names
the field, so ``kubectl apply`` tells a person what to fix.

Each row is one mistake: created as is (``create``), or made by changing a valid
object (``update``, a merge patch). The valid objects are checked to be accepted too,
so a row fails for its mistake and nothing else.
"""

from __future__ import annotations

import contextlib
import copy
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from sdcdev.harness import GROUP, VERSION, policy_body
from sdcguard.api import RepairTicket, SDCBaseline, SDCPolicy, SDCTest, Suite

HASH = "ab" * 32
DIGEST = "cd" * 32


def valid(plural: str, name: str) -> dict[str, Any]:
    """A valid object of each kind (the base every row changes)."""
    kind, spec = {
        "sdcpolicies": ("SDCPolicy", policy_body(name)["spec"]),
        "sdctests": (
            "SDCTest",
            {
                "nodeName": "gpu-1",
                "policyRef": "default",
                "suite": "acceptance",
                "reason": "Join",
                "attempt": 1,
            },
        ),
        "repairtickets": ("RepairTicket", {"nodeName": "gpu-1", "policyRef": "default"}),
        "sdcbaselines": (
            "SDCBaseline",
            {
                "fingerprint": {"hash": HASH, "backend": "cuda"},
                "digests": {"golden": DIGEST},
                "source": "Approved",
                "trusted": True,
            },
        ),
    }[plural]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": kind,
        "metadata": {"name": name},
        "spec": copy.deepcopy(spec),
    }


def merged(base: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``change`` merged in (JSON merge patch: None deletes)."""
    out = copy.deepcopy(base)
    for key, value in change.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


@dataclass(frozen=True)
class Case:
    """One mistake and the words the API server's refusal must contain."""

    id: str
    plural: str
    change: dict[str, Any]
    expect: tuple[str, ...]
    update: bool = False
    """Apply ``change`` as a patch to a valid object instead of creating it so."""
    before: dict[str, Any] = field(default_factory=dict)
    """A valid change made first (e.g. resolution Retire before changing it)."""
    strict: bool = False
    """Ask for strict field validation (unknown fields are errors, not pruned)."""


CASES = [
    # SDCPolicy --------------------------------------------------------------------------
    # The refusal names the value given, not the type ('Invalid value: ""').
    Case(
        "policy-maxUnavailable-150%",
        "sdcpolicies",
        {"budgets": {"maxUnavailable": "150%"}},
        ("spec.budgets.maxUnavailable", 'Invalid value: "150%"', "(100|[1-9]?[0-9])%"),
    ),
    Case(
        "policy-maxUnavailable-negative",
        "sdcpolicies",
        {"budgets": {"maxUnavailable": -1}},
        ("spec.budgets.maxUnavailable", "Invalid value: -1", "greater than or equal to 0"),
    ),
    Case(
        "policy-maxUnavailable-words",
        "sdcpolicies",
        {"budgets": {"maxUnavailable": "a few"}},
        ("spec.budgets.maxUnavailable", 'Invalid value: "a few"'),
    ),
    Case(
        "policy-maxUnavailableDevices-150%",
        "sdcpolicies",
        {"budgets": {"maxUnavailableDevices": "150%"}},
        ("spec.budgets.maxUnavailableDevices", 'Invalid value: "150%"', "(100|[1-9]?[0-9])%"),
    ),
    Case(
        "policy-maxUnavailableDevices-negative",
        "sdcpolicies",
        {"budgets": {"maxUnavailableDevices": -2}},
        ("spec.budgets.maxUnavailableDevices", "Invalid value: -2", "greater than or equal to 0"),
    ),
    Case(
        "policy-selector-In-without-values",
        "sdcpolicies",
        {"nodeSelector": {"matchExpressions": [{"key": "pool", "operator": "In"}]}},
        ("spec.nodeSelector.matchExpressions[0]", "In and NotIn need at least one value"),
    ),
    Case(
        "policy-selector-Exists-with-values",
        "sdcpolicies",
        {
            "nodeSelector": {
                "matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]
            }
        },
        ("spec.nodeSelector.matchExpressions[0]", "Exists and DoesNotExist take none"),
    ),
    Case(
        "policy-selector-unknown-operator",
        "sdcpolicies",
        {"nodeSelector": {"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}},
        ("spec.nodeSelector.matchExpressions[0].operator", "Unsupported value", "Gt"),
    ),
    Case(
        "policy-image-not-a-reference",
        "sdcpolicies",
        {"probe": {"image": "UPPER/Case:"}},
        ("spec.probe.image", 'Invalid value: "UPPER/Case:"'),
    ),
    Case(
        "policy-image-with-spaces",
        "sdcpolicies",
        {"probe": {"image": "ghcr.io/sdcguard/sdcprobe:0.1.0 --privileged"}},
        ("spec.probe.image",),
    ),
    Case(
        "policy-sink-url-without-host",
        "sdcpolicies",
        {"repair": {"ticketSinks": [{"type": "webhook", "url": "https://"}]}},
        ("spec.repair.ticketSinks[0].url",),
    ),
    Case(
        "policy-maxConcurrentTests-zero",
        "sdcpolicies",
        {"budgets": {"maxConcurrentTests": 0}},
        ("spec.budgets.maxConcurrentTests",),
    ),
    Case(
        "policy-unknown-check",
        "sdcpolicies",
        {"suites": {"acceptance": [{"name": "voodoo"}]}},
        ("spec.suites.acceptance[0].name", "Unsupported value", "voodoo"),
    ),
    Case(
        "policy-check-twice",
        "sdcpolicies",
        {"suites": {"requalification": [{"name": "golden"}, {"name": "golden"}]}},
        ("spec.suites.requalification", "unique"),
    ),
    # timeoutSeconds was removed (the probe has no per-check limit): kubectl's strict
    # validation names it; a client that does not ask for it gets it pruned.
    Case(
        "policy-check-timeout-removed",
        "sdcpolicies",
        {"suites": {"acceptance": [{"name": "golden", "timeoutSeconds": 600}]}},
        ('unknown field "spec.suites.acceptance[0].timeoutSeconds"',),
        strict=True,
    ),
    Case(
        "policy-unknown-param",
        "sdcpolicies",
        {"suites": {"acceptance": [{"name": "compute", "params": {"sizee": 5}}]}},
        ("spec.suites.acceptance[0]", "check compute takes no parameter sizee", "golden: steps"),
    ),
    Case(
        "policy-param-of-another-check",
        "sdcpolicies",
        {"suites": {"requalification": [{"name": "golden", "params": {"memory-mib": 64}}]}},
        ("spec.suites.requalification[0]", "check golden takes no parameter memory-mib"),
    ),
    Case(
        "policy-suite-budget-past-deadline",
        "sdcpolicies",
        {"suites": {"budgetSeconds": {"repairVerification": 600}}},
        ("spec.suites.budgetSeconds", "at most spec.probe.activeDeadlineSeconds"),
    ),
    Case(
        "policy-suite-budget-too-short",
        "sdcpolicies",
        {"suites": {"budgetSeconds": {"acceptance": 1}}},
        ("spec.suites.budgetSeconds.acceptance",),
    ),
    Case(
        "policy-catch-chance-of-one",
        "sdcpolicies",
        {"probe": {"catchTarget": {"chance": 1}}},
        ("spec.probe.catchTarget.chance", "above 0 and below 1"),
    ),
    Case(
        "policy-catch-fraction-zero",
        "sdcpolicies",
        {"probe": {"catchTarget": {"activeFraction": 0}}},
        ("spec.probe.catchTarget.activeFraction", "above 0 and at most 1"),
    ),
    Case(
        "policy-catch-fraction-above-1",
        "sdcpolicies",
        {"probe": {"catchTarget": {"activeFraction": 1.5}}},
        ("spec.probe.catchTarget.activeFraction",),
    ),
    Case(
        "policy-catch-shortfall-unknown",
        "sdcpolicies",
        {"probe": {"catchTarget": {"onShortfall": "Ignore"}}},
        ("spec.probe.catchTarget.onShortfall", "Unsupported value"),
    ),
    Case(
        "policy-negative-memory-dwell",
        "sdcpolicies",
        {"probe": {"memoryDwellSeconds": -1}},
        ("spec.probe.memoryDwellSeconds",),
    ),
    # A probe must never land on a quarantined node it was not sent to: a toleration of
    # the quarantine taint (by its key, the renamed key, or an empty key that tolerates
    # every taint) is refused.
    Case(
        "policy-toleration-of-the-quarantine-taint",
        "sdcpolicies",
        {"probe": {"tolerations": [{"key": "sdcguard.dev/quarantined", "operator": "Exists"}]}},
        ("spec.probe.tolerations", "quarantine taint", "never land on a quarantined node"),
    ),
    Case(
        "policy-toleration-of-every-taint",
        "sdcpolicies",
        {"probe": {"tolerations": [{"operator": "Exists"}]}},
        ("spec.probe.tolerations", "an empty key, which tolerates every taint"),
    ),
    Case(
        "policy-toleration-of-a-renamed-quarantine-taint",
        "sdcpolicies",
        {
            "taints": {"quarantine": "example.com/broken"},
            "probe": {
                "tolerations": [{"key": "example.com/broken", "operator": "Equal", "value": "true"}]
            },
        },
        ("spec.probe.tolerations", "spec.taints.quarantine"),
    ),
    Case(
        "policy-toleration-exists-with-a-value",
        "sdcpolicies",
        {"probe": {"tolerations": [{"key": "a/b", "operator": "Exists", "value": "x"}]}},
        ("spec.probe.tolerations[0]", "operator Exists takes no value"),
    ),
    Case(
        "policy-toleration-seconds-without-NoExecute",
        "sdcpolicies",
        {
            "probe": {
                "tolerations": [
                    {
                        "key": "a/b",
                        "operator": "Exists",
                        "effect": "NoSchedule",
                        "tolerationSeconds": 30,
                    }
                ]
            }
        },
        ("spec.probe.tolerations[0]", "effect NoExecute only"),
    ),
    Case(
        "policy-toleration-unknown-operator",
        "sdcpolicies",
        {"probe": {"tolerations": [{"key": "a/b", "operator": "Gt"}]}},
        ("spec.probe.tolerations[0].operator", "Unsupported value", "Gt"),
    ),
    Case(
        "policy-probe-label-sdcguard-sets",
        "sdcpolicies",
        {"probe": {"labels": {"sdcguard.dev/test": "mine"}}},
        ("spec.probe.labels", "set by sdcguard on the probe Pod"),
    ),
    Case(
        "policy-probe-annotation-sdcguard-sets",
        "sdcpolicies",
        {"probe": {"annotations": {"karpenter.sh/do-not-disrupt": "false"}}},
        ("spec.probe.annotations", "set by sdcguard on the probe Pod"),
    ),
    Case(
        "policy-runtime-class-not-a-name",
        "sdcpolicies",
        {"probe": {"runtimeClassName": "NVIDIA runtime"}},
        ("spec.probe.runtimeClassName", 'Invalid value: "NVIDIA runtime"'),
    ),
    Case(
        "policy-negative-idleFor",
        "sdcpolicies",
        {"triggers": {"onReturnFromUse": {"enabled": True, "idleFor": "-5m"}}},
        ("spec.triggers.onReturnFromUse.idleFor",),
    ),
    Case(
        "policy-idleFor-in-words",
        "sdcpolicies",
        {"triggers": {"onReturnFromUse": {"enabled": True, "idleFor": "5 minutes"}}},
        ("spec.triggers.onReturnFromUse.idleFor",),
    ),
    Case(
        "policy-backoff-not-a-duration",
        "sdcpolicies",
        {"triggers": {"inconclusiveBackoff": "soon"}},
        ("spec.triggers.inconclusiveBackoff",),
    ),
    Case(
        "policy-qualification-age-too-short",
        "sdcpolicies",
        {"triggers": {"maxQualificationAge": "30s"}},
        ("spec.triggers.maxQualificationAge",),
    ),
    Case(
        "policy-breaker-window-zero",
        "sdcpolicies",
        {"circuitBreaker": {"window": "0s"}},
        ("spec.circuitBreaker.window", "longer than 0s"),
    ),
    Case(
        "policy-breaker-fraction-above-1",
        "sdcpolicies",
        {"circuitBreaker": {"maxFailureFraction": 1.5}},
        ("spec.circuitBreaker.maxFailureFraction",),
    ),
    Case(
        "policy-activeDeadline-below-budget",
        "sdcpolicies",
        {"probe": {"budgetSeconds": 300, "activeDeadlineSeconds": 120}},
        ("spec.probe.activeDeadlineSeconds", "at least budgetSeconds"),
    ),
    Case(
        "policy-budget-too-short",
        "sdcpolicies",
        {"probe": {"budgetSeconds": 1}},
        ("spec.probe.budgetSeconds",),
    ),
    Case(
        "policy-drain-without-cordon",
        "sdcpolicies",
        {"quarantine": {"drain": True, "cordon": False}},
        ("spec.quarantine.drain", "cordon"),
    ),
    Case(
        "policy-consensus-of-one",
        "sdcpolicies",
        {"baseline": {"mode": "Consensus", "quorum": 1}},
        ("spec.baseline.quorum",),
    ),
    Case(
        "policy-unknown-mode",
        "sdcpolicies",
        {"mode": "Sometimes"},
        ("spec.mode", "Unsupported value"),
    ),
    Case(
        "policy-zero-repair-cycles",
        "sdcpolicies",
        {"repair": {"maxRepairCycles": 0}},
        ("spec.repair.maxRepairCycles",),
    ),
    Case(
        "policy-jira-without-secret",
        "sdcpolicies",
        {"repair": {"ticketSinks": [{"type": "jira", "url": "https://jira.example"}]}},
        ("spec.repair.ticketSinks[0]", "secretRef"),
    ),
    Case(
        "policy-sink-not-http",
        "sdcpolicies",
        {"repair": {"ticketSinks": [{"type": "webhook", "url": "ftp://repair.example"}]}},
        ("spec.repair.ticketSinks[0].url",),
    ),
    Case(
        "policy-bad-selector-key",
        "sdcpolicies",
        {"nodeSelector": {"matchLabels": {"bad key!": "x"}}},
        ("spec.nodeSelector.matchLabels",),
    ),
    Case(
        "policy-typo-field",
        "sdcpolicies",
        {"budgets": {"maxUnavaliable": 3}},
        ("spec.budgets.maxUnavaliable", "unknown field"),
        strict=True,
    ),
    Case(
        "policy-update-to-150%",
        "sdcpolicies",
        {"spec": {"budgets": {"maxUnavailable": "150%"}}},
        ("spec.budgets.maxUnavailable",),
        update=True,
    ),
    # SDCTest ------------------------------------------------------------------------------
    Case(
        "test-spec-mutated",
        "sdctests",
        {"spec": {"nodeName": "gpu-2"}},
        ("spec", "immutable"),
        update=True,
    ),
    Case(
        "test-suite-mutated",
        "sdctests",
        {"spec": {"suite": "requalification"}},
        ("spec", "immutable"),
        update=True,
    ),
    Case(
        "test-verification-without-ticket",
        "sdctests",
        {"reason": "RepairVerification", "suite": "repairVerification"},
        ("spec.ticketRef",),
    ),
    Case("test-attempt-zero", "sdctests", {"attempt": 0}, ("spec.attempt",)),
    Case("test-unknown-suite", "sdctests", {"suite": "quick"}, ("spec.suite", "Unsupported")),
    Case("test-unknown-reason", "sdctests", {"reason": "Boredom"}, ("spec.reason",)),
    Case("test-bad-node-name", "sdctests", {"nodeName": "Node_1"}, ("spec.nodeName",)),
    Case("test-without-node", "sdctests", {"nodeName": None}, ("spec.nodeName", "Required")),
    # RepairTicket -------------------------------------------------------------------------
    Case(
        "ticket-resolution-after-retire",
        "repairtickets",
        {"spec": {"resolution": "Repaired"}},
        ("spec.resolution", "Retire is final"),
        update=True,
        before={"spec": {"resolution": "Retire"}},
    ),
    Case(
        "ticket-node-changed",
        "repairtickets",
        {"spec": {"nodeName": "gpu-2"}},
        ("spec.nodeName", "immutable"),
        update=True,
    ),
    Case(
        "ticket-unknown-resolution",
        "repairtickets",
        {"resolution": "Fixed"},
        ("spec.resolution", "Unsupported value"),
    ),
    Case("ticket-without-node", "repairtickets", {"nodeName": None}, ("spec.nodeName",)),
    Case(
        "ticket-external-url-not-a-url",
        "repairtickets",
        {"external": {"system": "jira", "id": "OPS-1", "url": "notaurl"}},
        ("spec.external.url", 'Invalid value: "notaurl"'),
    ),
    # SDCBaseline --------------------------------------------------------------------------
    Case(
        "baseline-trusted-without-digests",
        "sdcbaselines",
        {"digests": None},
        ("spec.digests", "at least one digest"),
    ),
    Case(
        "baseline-short-digest",
        "sdcbaselines",
        {"digests": {"golden": "abc123"}},
        ("spec.digests", "^[0-9a-f]{64}$"),
    ),
    Case(
        "baseline-uppercase-hash",
        "sdcbaselines",
        {"fingerprint": {"hash": HASH.upper()}},
        ("spec.fingerprint.hash",),
    ),
    Case(
        "baseline-shortHash-of-another",
        "sdcbaselines",
        {"fingerprint": {"shortHash": "ffffffff"}},
        ("spec.fingerprint.shortHash", "first characters of hash"),
    ),
    Case(
        "baseline-hash-changed",
        "sdcbaselines",
        {"spec": {"fingerprint": {"hash": "ef" * 32}}},
        ("spec.fingerprint.hash", "immutable"),
        update=True,
    ),
]


def _refusal(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body).get("message", exc.body))
    except (TypeError, ValueError):
        return str(exc.body)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_invalid_resource_is_refused_naming_the_field(
    case: Case, api_client: client.ApiClient, crds: None
) -> None:
    custom = client.CustomObjectsApi(api_client)
    name = f"bad-{uuid.uuid4().hex[:8]}"
    base = valid(case.plural, name)
    try:
        if case.update:
            custom.create_cluster_custom_object(GROUP, VERSION, case.plural, base)
            if case.before:
                custom.patch_cluster_custom_object(GROUP, VERSION, case.plural, name, case.before)
            call = lambda: custom.patch_cluster_custom_object(  # noqa: E731
                GROUP, VERSION, case.plural, name, case.change
            )
        else:
            # The unchanged object is fine: the row's change is what gets refused.
            custom.create_cluster_custom_object(GROUP, VERSION, case.plural, base, dry_run="All")
            body = base | {"spec": merged(base["spec"], case.change)}
            extra = {"field_validation": "Strict"} if case.strict else {}
            call = lambda: custom.create_cluster_custom_object(  # noqa: E731
                GROUP, VERSION, case.plural, body, **extra
            )
        with pytest.raises(ApiException) as refused:
            call()
        message = _refusal(refused.value)
        assert refused.value.status in (400, 422), message
        for words in case.expect:
            assert words in message, f"{words!r} not in the refusal: {message}"
    finally:
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(GROUP, VERSION, case.plural, name)


MODELS = {
    "sdcpolicies": SDCPolicy,
    "sdctests": SDCTest,
    "repairtickets": RepairTicket,
    "sdcbaselines": SDCBaseline,
}
# Rules on oldSelf (updates) have their twin in check_update; strict field validation has
# none (the models ignore unknown fields on purpose).
PYTHON_TWINS = [c for c in CASES if not c.update and not c.strict]


@pytest.mark.parametrize("case", PYTHON_TWINS, ids=[c.id for c in PYTHON_TWINS])
def test_the_models_refuse_what_the_api_server_refuses(case: Case) -> None:
    """The operator and kubectl sdc parse objects with the same rules as the API server."""
    base = valid(case.plural, "twin")
    MODELS[case.plural].model_validate(base)
    with pytest.raises(ValidationError):
        MODELS[case.plural].model_validate(base | {"spec": merged(base["spec"], case.change)})


def test_selectors_with_match_expressions_are_accepted(
    api_client: client.ApiClient, crds: None
) -> None:
    base = valid("sdcpolicies", f"sel-{uuid.uuid4().hex[:8]}")
    base["spec"]["nodeSelector"] = {
        "matchLabels": {"team": "ml"},
        "matchExpressions": [
            {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["p5"]},
            {"key": "sdcguard.dev/skip", "operator": "DoesNotExist"},
        ],
    }
    created = client.CustomObjectsApi(api_client).create_cluster_custom_object(
        GROUP, VERSION, "sdcpolicies", base, dry_run="All"
    )
    assert SDCPolicy.model_validate(created).spec.node_selector.match_expressions[1].values == ()


def test_screening_knobs_are_accepted_and_defaulted(
    api_client: client.ApiClient, crds: None
) -> None:
    """The params each check takes, suite budgets within the deadline and the memory
    dwell pass the API server; an omitted catch target is the model's default."""
    base = valid("sdcpolicies", f"knobs-{uuid.uuid4().hex[:8]}")
    base["spec"]["suites"] = {
        "acceptance": [
            {"name": "golden", "params": {"steps": 40}},
            {"name": "memory", "params": {"memory-mib": 256, "memory-fraction": "0.5"}},
        ],
        "budgetSeconds": {"acceptance": 60, "repairVerification": 120},
    }
    base["spec"]["probe"]["memoryDwellSeconds"] = 0.5
    custom = client.CustomObjectsApi(api_client)
    created = custom.create_cluster_custom_object(
        GROUP, VERSION, "sdcpolicies", base, dry_run="All"
    )
    spec = SDCPolicy.model_validate(created).spec
    assert spec.suites.acceptance[1].params == {"memory-mib": 256, "memory-fraction": "0.5"}
    assert [spec.suite_budget(s) for s in Suite] == [60, 30, 120]
    assert spec.probe.memory_dwell_seconds == 0.5
    assert (spec.probe.catch_target.chance, spec.probe.catch_target.active_fraction) == (
        0.99,
        0.05,
    )


def test_the_screening_status_the_operator_writes_is_accepted(
    api_client: client.ApiClient, crds: None
) -> None:
    """What judging and the start of a screening write (catch outcome and condition,
    budget, expected end) fits the SDCTest's status schema on the real API server."""
    import datetime as dt

    from sdcguard.api import CheckStatus, CheckVerdict, SDCTestStatus, Verdict, to_body
    from sdcguard.domain.judging import CatchOutcome, Judgement, record_catch
    from sdcguard.domain.screening_time import running_fields

    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    shortfall = "catch target 0.99 at 5% not reached by compute (0.951, 59 rounds)"
    judgement = Judgement(
        Verdict.PASS,
        "Passed",
        "compute matched its baseline",
        catch=CatchOutcome(0.99, 0.05, False, shortfall),
    )
    status = SDCTestStatus.model_validate(
        running_fields(SDCPolicy().spec, Suite.REPAIR_VERIFICATION, now)
    )
    status = record_catch(status, judgement, now).model_copy(
        update={
            "checks": [CheckStatus(name="compute", verdict=CheckVerdict.PASS, catch_chance=0.951)]
        }
    )
    custom = client.CustomObjectsApi(api_client)
    name = f"status-{uuid.uuid4().hex[:8]}"
    custom.create_cluster_custom_object(GROUP, VERSION, "sdctests", valid("sdctests", name))
    try:
        written = custom.patch_cluster_custom_object_status(
            GROUP, VERSION, "sdctests", name, {"status": to_body(status)}
        )
        back = SDCTest.model_validate(written).status
        assert back is not None and back.catch_target_met is False
        assert back.catch_shortfall == shortfall and back.checks[0].catch_chance == 0.951
        assert back.budget_seconds == 1350 and back.expected_end == now + dt.timedelta(seconds=1470)
        assert [(c.type, c.status, c.reason) for c in back.conditions] == [
            ("CatchTargetMet", "False", "CatchShortfall")
        ]
    finally:
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(GROUP, VERSION, "sdctests", name)


pytestmark = pytest.mark.cluster
