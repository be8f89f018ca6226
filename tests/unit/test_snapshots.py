"""What the Node index keeps: a frozen snapshot of the fields the operator reads."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from sdcguard.adapters.observe import TicketSnapshot
from sdcguard.adapters.pass_state import SharedValues, TestSnapshot, trim_test
from sdcguard.domain.observed import NodeFacts, NodeSnapshot, Taint

BODY = {
    "metadata": {
        "name": "gpu-1",
        "uid": "0a1b2c3d-0000",
        "resourceVersion": "42",
        "creationTimestamp": "2025-06-01T10:00:00Z",
        "labels": {"pool": "a", "sdcguard.dev/state": "Qualified"},
        "annotations": {
            "sdcguard.dev/seq": "3",
            "karpenter.sh/do-not-disrupt": "true",
            "kubectl.kubernetes.io/last-applied-configuration": "{" + "x" * 4000 + "}",
        },
        "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}],
    },
    "spec": {
        "providerID": "aws:///i-1",
        "unschedulable": True,
        "taints": [{"key": "sdcguard.dev/testing", "effect": "NoSchedule"}],
    },
    "status": {
        "allocatable": {"nvidia.com/gpu": "8", "cpu": "96"},
        "conditions": [
            {"type": "MemoryPressure", "status": "False", "message": "m" * 500},
            {"type": "Ready", "status": "True"},
        ],
        "nodeInfo": {"systemUUID": "ec2-1", "kernelVersion": "6.1"},
        "images": [{"names": ["big"], "sizeBytes": 1}] * 50,
    },
}


def test_a_snapshot_keeps_only_what_the_operator_reads() -> None:
    snap = NodeSnapshot.from_body(BODY)
    assert snap == NodeSnapshot(
        name="gpu-1",
        uid="0a1b2c3d-0000",
        resource_version="42",
        created=dt.datetime(2025, 6, 1, 10, tzinfo=dt.UTC),
        labels={"pool": "a", "sdcguard.dev/state": "Qualified"},
        annotations={"sdcguard.dev/seq": "3", "karpenter.sh/do-not-disrupt": "true"},
        taints=(Taint("sdcguard.dev/testing", "NoSchedule"),),
        unschedulable=True,
        provider_id="aws:///i-1",
        ready=True,
        allocatable={"nvidia.com/gpu": "8", "cpu": "96"},
        system_uuid="ec2-1",
    )
    assert not hasattr(snap, "__dict__"), "slots: no per-instance dict"
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.name = "other"  # type: ignore[misc]


def test_facts_from_the_snapshot_are_the_facts_of_the_node() -> None:
    snap = NodeSnapshot.from_body(BODY)
    facts = NodeFacts.from_snapshot(snap, ["nvidia.com/gpu"], "pool")
    full = NodeFacts.from_body(BODY, ["nvidia.com/gpu"], "pool")
    assert facts == dataclasses.replace(full, annotations=snap.annotations)
    assert (facts.accelerators, facts.pool, facts.ready) == (8, "a", True)


def test_a_node_without_status_is_not_ready_and_offers_nothing() -> None:
    snap = NodeSnapshot.from_body({"metadata": {"name": "bare"}})
    assert (snap.ready, dict(snap.allocatable), snap.created) == (False, {}, None)


def test_a_ticket_snapshot_is_parsed_once_without_what_is_never_read() -> None:
    body = {
        "apiVersion": "sdcguard.dev/v1alpha1",
        "kind": "RepairTicket",
        "metadata": {
            "name": "gpu-1-0a1b2-4",
            "resourceVersion": "9",
            "creationTimestamp": "2025-06-01T10:00:00Z",
            "managedFields": [{"manager": "sdcguard"}],
            "annotations": {"sdcguard.dev/last-handled-configuration": "{}"},
        },
        "spec": {"nodeName": "gpu-1", "policyRef": "fleet", "evidence": ["t-1"]},
        "status": {"phase": "Open", "openedAt": "2025-06-01T10:00:05Z"},
    }
    snap = TicketSnapshot.from_body(body)
    assert (snap.name, snap.resource_version, snap.phase, snap.has_status) == (
        "gpu-1-0a1b2-4",
        "9",
        "Open",
        True,
    )
    assert snap.opened_at == dt.datetime(2025, 6, 1, 10, 0, 5, tzinfo=dt.UTC)
    assert snap.ticket is not None and snap.ticket.spec.evidence == ["t-1"]
    assert "managedFields" not in (snap.ticket.metadata.model_extra or {})
    assert not snap.ticket.metadata.annotations
    assert not hasattr(snap, "__dict__")


def test_an_unreadable_ticket_still_counts_by_its_name_and_phase() -> None:
    body = {
        "metadata": {"name": "gpu-1-0a1b2-2"},
        "spec": {"nodeName": "gpu-1", "evidence": "not a list"},
        "status": {"phase": "Closed"},
    }
    snap = TicketSnapshot.from_body(body)
    assert (snap.ticket, snap.phase, snap.name) == (None, "Closed", "gpu-1-0a1b2-2")


def _test_body(phase: str, **status: object) -> dict[str, object]:
    return {
        "apiVersion": "sdcguard.dev/v1alpha1",
        "kind": "SDCTest",
        "metadata": {"name": "gpu-1-0a1b2-5", "resourceVersion": "11"},
        "spec": {"nodeName": "gpu-1", "policyRef": "fleet", "suite": "requalification"},
        "status": {"phase": phase, **status},
    }


def test_a_finished_test_is_kept_as_its_facts_a_running_one_whole() -> None:
    done = TestSnapshot.from_body(
        _test_body("Failed", verdict="SDC", checks=[{"name": "golden", "verdict": "SDC"}])
    )
    assert done.known is not None and done.known.running is None
    assert (done.name, done.resource_version) == ("gpu-1-0a1b2-5", "11")
    assert done.known.facts.failed_checks == {"golden"} and done.known.policy == "fleet"
    running = TestSnapshot.from_body(_test_body("Running"))
    assert running.known is not None and running.known.running is not None
    assert running.known.running.spec.node_name == "gpu-1"
    assert not hasattr(done, "__dict__")


def test_an_unreadable_test_says_why() -> None:
    seen = TestSnapshot.from_body(_test_body("Exploded"))
    assert seen.known is None and "phase" in seen.error and seen.name == "gpu-1-0a1b2-5"
    assert seen.node_name == "gpu-1", "still filed under its node"


def test_the_copy_keeps_a_finished_test_slim() -> None:
    """As listed or watched: a finished test keeps its outcome and each check's verdict
    and fault location, not digests, metrics, conditions or bookkeeping metadata; a
    running one keeps its status whole (the pass moves it along)."""
    body = _test_body(
        "Failed",
        verdict="SDC",
        reason="GoldenMismatch",
        completionTime="2025-06-01T10:09:00Z",
        conditions=[{"type": "Done", "status": "True", "message": "m" * 500}],
        checks=[
            {
                "name": "golden",
                "verdict": "SDC",
                "oddDevice": 3,
                "digests": {"step-1": "ab" * 32},
                "metrics": {"seconds": 1.5},
            }
        ],
    )
    meta = body["metadata"]
    assert isinstance(meta, dict)
    meta["managedFields"] = [{"manager": "sdcguard", "fieldsV1": {"f:status": {}}}]
    meta["annotations"] = {"sdcguard.dev/last-handled-configuration": "{" + "x" * 2000 + "}"}
    trimmed = trim_test(body)
    assert trimmed["status"] == {
        "phase": "Failed",
        "verdict": "SDC",
        "reason": "GoldenMismatch",
        "completionTime": "2025-06-01T10:09:00Z",
        "checks": [{"name": "golden", "verdict": "SDC", "oddDevice": 3}],
    }
    assert "managedFields" not in trimmed["metadata"]
    assert "annotations" not in trimmed["metadata"]
    slim = TestSnapshot.slim(body)
    assert slim == TestSnapshot.from_body(trimmed)
    assert (slim.node_name, slim.resource_version) == ("gpu-1", "11")
    assert slim.known is not None and slim.known.running is None
    assert slim.known.facts.failed_checks == {"golden"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        slim.node_name = "other"  # type: ignore[misc]
    running = _test_body("Running", checks=[{"name": "golden", "verdict": "Pass", "x": 1}])
    assert trim_test(running)["status"] == running["status"], "a running test is whole"


def test_finished_tests_keep_the_values_they_repeat_once() -> None:
    """Thousands of finished tests name the same checks, devices, fingerprint and
    policy: the copy keeps each value once, and each test's facts in slots."""
    checks = [{"name": n, "verdict": "Pass"} for n in ("compute", "memory", "golden")]
    same = {"fingerprintHash": "ab" * 32, "deviceIDs": ["GPU-0", "GPU-1"], "checks": checks}
    first, second = (
        TestSnapshot.slim(
            {**_test_body("Passed", verdict="Pass", **same), "metadata": {"name": name}}
        )
        for name in ("gpu-1-a-1", "gpu-1-a-2")
    )
    assert first.known is not None and second.known is not None
    one, two = first.known.facts, second.known.facts
    assert one.passed_checks == {"compute", "memory", "golden"}
    assert one.passed_checks is two.passed_checks
    assert one.device_ids == ("GPU-0", "GPU-1") and one.device_ids is two.device_ids
    assert one.fingerprint is two.fingerprint and first.known.policy is second.known.policy
    assert not hasattr(one, "__dict__") and not hasattr(first.known, "__dict__")


def test_the_shared_table_is_bounded_and_only_memory() -> None:
    shared = SharedValues(limit=2)
    a, b = frozenset({"x"}), frozenset({"x"})
    assert shared(a) is a and shared(b) is a
    shared(("y",))
    shared(("z",))  # full: starts again empty, then keeps this one
    assert len(shared) == 1
    assert shared(b) is b and shared(b) == a, "a value kept twice is still equal"


def test_a_ticket_snapshot_names_its_node_even_when_unreadable() -> None:
    body = {"metadata": {"name": "t"}, "spec": {"nodeName": "gpu-7", "evidence": "x"}}
    assert TicketSnapshot.from_body(body).node_name == "gpu-7"
    assert TicketSnapshot.from_body({"metadata": {"name": "t"}, "spec": "x"}).node_name == ""


def test_a_policy_body_is_parsed_once_per_change() -> None:
    """The pass and every urgent pass share one typed SDCPolicy per resourceVersion;
    an unreadable body gives None (the loop waits for the next change)."""
    from sdcguard.adapters.pass_view import ParsedPolicy

    body: dict[str, object] = {
        "apiVersion": "sdcguard.dev/v1alpha1",
        "kind": "SDCPolicy",
        "metadata": {"name": "fleet", "resourceVersion": "7"},
        "spec": {"budgets": {"maxConcurrentTests": 3}},
    }
    parsed = ParsedPolicy()
    first = parsed.of(body)  # type: ignore[arg-type]
    assert first is not None and first.spec.budgets.max_concurrent_tests == 3
    assert parsed.of(body) is first, "same resourceVersion: not parsed again"
    changed = {**body, "metadata": {"name": "fleet", "resourceVersion": "8"}}
    changed["spec"] = {"budgets": {"maxConcurrentTests": 4}}
    second = parsed.of(changed)  # type: ignore[arg-type]
    assert second is not None and second is not first
    assert second.spec.budgets.max_concurrent_tests == 4
    broken = {**changed, "metadata": {"name": "fleet", "resourceVersion": "9"}}
    broken["spec"] = {"budgets": {"maxConcurrentTests": "many"}}
    assert parsed.of(broken) is None  # type: ignore[arg-type]


def test_baselines_are_frozen() -> None:
    """The index keeps SDCBaselines the reconcile only reads: a change is a copy."""
    from pydantic import ValidationError

    from sdcguard.api import SDCBaseline

    baseline = SDCBaseline.model_validate(
        {
            "metadata": {"name": "fp-1"},
            "spec": {"fingerprint": {"hash": "ab" * 32}, "digests": {"gemm": "cd" * 32}},
        }
    )
    assert baseline.spec.fingerprint.short_hash == ("ab" * 32)[:12], "filled in when empty"
    with pytest.raises(ValidationError):
        baseline.spec.trusted = True  # type: ignore[misc]
    with pytest.raises(ValidationError):
        baseline.spec.fingerprint.backend = "cuda"  # type: ignore[misc]
    trusted = baseline.model_copy(
        update={"spec": baseline.spec.model_copy(update={"trusted": True})}
    )
    assert trusted.spec.trusted and not baseline.spec.trusted
