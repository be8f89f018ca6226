"""What the Node index keeps: a frozen snapshot of the fields the operator reads."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

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
