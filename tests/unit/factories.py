"""Factories for unit tests: nodes, policies, tests, tickets, probe result documents.

Result documents are built as plain dicts and JSON text, the way a Pod's
termination message arrives; the fingerprint hash follows the probe's rule
(sha256 of the canonical JSON of the other fields).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from sdcguard.api import (
    Resolution,
    ScreeningReason,
    SDCPolicySpec,
    SDCTestPhase,
    Suite,
    TicketPhase,
    Verdict,
)
from sdcguard.domain import keys
from sdcguard.domain.decide import Decision
from sdcguard.domain.lifecycle import NodeState
from sdcguard.domain.nodepatch import plan_node_patch
from sdcguard.domain.observed import NodeFacts, Taint, TestFacts, TicketFacts

NOW = dt.datetime(2025, 6, 1, 12, 0, tzinfo=dt.UTC)
HOUR = dt.timedelta(hours=1)


def policy(**spec: Any) -> SDCPolicySpec:
    """A policy from camelCase spec fields (defaults otherwise)."""
    return SDCPolicySpec.model_validate(spec)


def node(
    name: str = "gpu-1",
    *,
    state: NodeState | None = None,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    taints: tuple[Taint, ...] = (),
    unschedulable: bool = False,
    accelerators: int = 8,
    ready: bool = True,
    qualified_at: dt.datetime | None = None,
    pool: str = "",
) -> NodeFacts:
    """A node; ``state`` sets the state label, ``qualified_at`` the qualification annotation."""
    all_labels = dict(labels or {})
    if state is not None:
        all_labels[keys.LABEL_STATE] = state.value
    all_annotations = dict(annotations or {})
    if qualified_at is not None:
        all_annotations[keys.QUALIFIED_AT] = keys.format_time(qualified_at)
    return NodeFacts(
        name=name,
        uid="0a1b2c3d-0000",
        labels=all_labels,
        annotations=all_annotations,
        taints=taints,
        unschedulable=unschedulable,
        ready=ready,
        accelerators=accelerators,
        pool=pool,
    )


def sdctest(
    name: str,
    *,
    suite: Suite = Suite.REQUALIFICATION,
    reason: ScreeningReason = ScreeningReason.RETURN_FROM_USE,
    verdict: Verdict | None = None,
    failed: tuple[str, ...] = (),
    passed: tuple[str, ...] = (),
    attempt: int = 1,
    phase: SDCTestPhase | None = None,
) -> TestFacts:
    """Facts of an SDCTest; with a verdict it is finished, without one it is running."""
    if phase is None:
        phase = {
            None: SDCTestPhase.RUNNING,
            Verdict.PASS: SDCTestPhase.PASSED,
            Verdict.INCONCLUSIVE: SDCTestPhase.INCONCLUSIVE,
        }.get(verdict, SDCTestPhase.FAILED)
    if verdict == Verdict.PASS and not passed:
        passed = ("compute", "collective", "golden")
    return TestFacts(
        name=name,
        suite=suite,
        reason=reason,
        attempt=attempt,
        phase=phase,
        verdict=verdict,
        failed_checks=frozenset(failed),
        passed_checks=frozenset(passed),
        fingerprint="f" * 64 if verdict else "",
        completed_at=NOW if verdict else None,
    )


def ticket(
    name: str = "gpu-1-0a1b2-3",
    *,
    resolution: Resolution | None = None,
    cycle: int = 1,
    acknowledged: bool = False,
    phase: TicketPhase = TicketPhase.OPEN,
) -> TicketFacts:
    return TicketFacts(name, phase, resolution, cycle, acknowledged)


def applied(before: NodeFacts, decision: Decision) -> NodeFacts:
    """The node after an adapter applied ``decision``'s node patch."""
    patch = plan_node_patch(before, decision.actions)
    labels = {**before.labels, **patch.labels}
    annotations = {**before.annotations, **patch.annotations}
    return dataclasses.replace(
        before,
        labels={k: v for k, v in labels.items() if v is not None},
        annotations={k: v for k, v in annotations.items() if v is not None},
        taints=patch.taints if patch.taints is not None else before.taints,
        unschedulable=patch.unschedulable
        if patch.unschedulable is not None
        else before.unschedulable,
    )


# Probe result documents ----------------------------------------------------------

FINGERPRINT_FIELDS: dict[str, Any] = {
    "backend": "cuda",
    "device_model": "NVIDIA H100 80GB HBM3",
    "device_count": 8,
    "driver": "550.54.15",
    "runtime": "12.4",
    "torch": "2.9.0",
    "torch_xla": None,
    "cpu_isa": "x86_64-avx512",
    "threads": 4,
    "config_hash": "c0ffee",
}
CHECKS = ("compute", "collective", "golden")


def digest(label: str) -> str:
    return hashlib.sha256(label.encode()).hexdigest()


def fingerprint(**overrides: Any) -> dict[str, Any]:
    """A fingerprint dict with the hash the probe would compute."""
    fields = {**FINGERPRINT_FIELDS, **overrides}
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return {"hash": hashlib.sha256(canonical.encode()).hexdigest(), **fields}


def check(
    verdict: str = "pass",
    *,
    value: str = "good",
    baseline: str = "absent",
    digest_value: str | bool | None = True,
    **extra: Any,
) -> dict[str, Any]:
    """One check entry; ``value`` names what the device computed (its digest)."""
    computed = digest(value) if digest_value is True else (digest_value or None)
    return {
        "verdict": verdict,
        "reason": extra.pop("reason", ""),
        "digest": computed,
        "metrics": extra.pop("metrics", {}),
        "baseline": baseline,
        **extra,
    }


def result(
    verdict: str = "inconclusive",
    checks: Mapping[str, dict[str, Any]] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A probe result document (dict)."""
    return {
        "schema_version": 1,
        "kind": "sdcprobe.result",
        "verdict": verdict,
        "reason": extra.pop("reason", ""),
        "fingerprint": extra.pop("fingerprint", fingerprint()),
        "checks": dict(checks if checks is not None else {c: check() for c in CHECKS}),
        "injection": extra.pop("injection", {"enabled": False, "count": 0, "by_site": {}}),
        "duration_s": 12.5,
        "truncated": extra.pop("truncated", False),
        **({"plan": extra.pop("plan")} if "plan" in extra else {}),
    }


def text(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, separators=(",", ":"))
