"""Deleting a policy, on fakes: its tests end by the policy-change row, a node another
policy selects is handed over untouched, a node held out for its hardware is kept, every
other node it owned is released in one guarded patch (a conflict reads it again)."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from types import SimpleNamespace
from typing import Any, cast

from kubernetes.client.exceptions import ApiException

from sdcguard.adapters.kube import KubeWriter
from sdcguard.adapters.node_writes import NodePatchStage
from sdcguard.adapters.policy_release import PolicyRelease
from sdcguard.adapters.test_runner import TestRunner
from sdcguard.api.policy import NodeSelector
from sdcguard.domain.observed import NodeSnapshot
from sdcguard.domain.testphase import PolicyChange

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
GONE = NodeSelector.model_validate({"matchLabels": {"pool": "a"}})
STAYS = NodeSelector.model_validate({"matchLabels": {"pool": "a", "team": "x"}})
HEIR = NodeSelector.model_validate({"matchLabels": {"team": "y"}})
TESTING = {"key": "sdcguard.dev/testing", "effect": "NoSchedule"}
OTHERS = {"key": "example.com/maintenance", "effect": "NoSchedule"}


def _body(name: str, state: str, version: str = "1") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "resourceVersion": version,
            "labels": {"pool": "a", "sdcguard.dev/state": state},
            "annotations": {
                "sdcguard.dev/owned-taints": "sdcguard.dev/testing",
                "sdcguard.dev/qualified-at": "2026-01-01T00:00:00Z",
            },
        },
        "spec": {"taints": [TESTING, OTHERS]},
    }


class FakeWriter:
    def __init__(self, bodies: dict[str, dict[str, Any]], conflicts: int = 0) -> None:
        self.bodies = bodies
        self.conflicts = conflicts
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.events: list[tuple[str, str]] = []
        self.api = SimpleNamespace(sanitize_for_serialization=lambda body: body)
        self.core = SimpleNamespace(read_node=lambda name: self.bodies[name])

    def patch_node(self, name: str, patch: dict[str, Any]) -> None:
        if self.conflicts:
            self.conflicts -= 1
            raise ApiException(status=409, reason="Conflict")
        self.patches.append((name, patch))

    def event(self, *, name: str, reason: str, **_: Any) -> None:
        self.events.append((name, reason))


class FakeRunner:
    def __init__(self) -> None:
        self.ended: list[tuple[str, str, PolicyChange]] = []

    def end_by_policy_change(
        self, policy: str, test: Any, change: PolicyChange, now: dt.datetime, counts: Counter[str]
    ) -> Any:
        self.ended.append((policy, test, change))
        return test


def _snapshot(name: str, **labels: str) -> NodeSnapshot:
    return NodeSnapshot(name=name, labels={"pool": "a", **labels})


def test_a_deleted_policy_releases_keeps_and_hands_over() -> None:
    bodies = {
        "free": _body("free", "Qualified"),
        "bad": _body("bad", "Quarantined"),
        "shared": _body("shared", "Testing"),
    }
    writer, runner = FakeWriter(bodies, conflicts=1), FakeRunner()
    kube = cast(KubeWriter, writer)
    release = PolicyRelease(kube, cast(TestRunner, runner), NodePatchStage(kube))
    nodes = [
        _snapshot("free"),
        _snapshot("bad"),
        _snapshot("shared", team="x"),  # a more specific policy owns it: not the policy's
        _snapshot("moved", team="y"),  # equally specific, "gone" sorts first: handed over
        NodeSnapshot(name="elsewhere", labels={"pool": "b"}),  # never the policy's
    ]
    counts = release.release(
        "gone", GONE, {"stays": STAYS, "heir": HEIR}, nodes, cast(Any, ["t1"]), NOW
    )

    assert runner.ended == [("gone", "t1", PolicyChange.POLICY_DELETED)]
    assert counts == Counter({"nodes-released": 1, "nodes-kept": 1, "nodes-handed-over": 1})
    ((name, patch),) = writer.patches  # one write, after the conflict's re-read
    assert name == "free"
    assert patch["spec"]["taints"] == [OTHERS]
    assert patch["metadata"]["labels"] == {"sdcguard.dev/state": None}
    assert set(patch["metadata"]["annotations"]) == {
        "sdcguard.dev/owned-taints",
        "sdcguard.dev/qualified-at",
    }
    assert sorted(writer.events) == [
        ("bad", "PolicyDeletedNodeKept"),
        ("free", "PolicyDeletedNodeReleased"),
    ]
