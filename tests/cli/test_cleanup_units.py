"""``kubectl sdc cleanup``'s write, on a fake client: a Node changed between reading and
writing (409) is read and planned again, so a taint added in between survives."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any, cast

from kubernetes.client.exceptions import ApiException

from sdcguard.cli.cleanup import _release
from sdcguard.cli.kube import Connection

OURS = {"key": "sdcguard.dev/testing", "effect": "NoSchedule"}
ADDED = {"key": "example.com/drain", "effect": "NoExecute"}


def _body(version: str, taints: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "gpu-1",
            "resourceVersion": version,
            "labels": {"sdcguard.dev/state": "Testing"},
            "annotations": {"sdcguard.dev/owned-taints": "sdcguard.dev/testing"},
        },
        "spec": {"taints": taints},
    }


class FakeCore:
    """Serves ``bodies`` in turn to reads; refuses the first patch with a conflict."""

    def __init__(self, *bodies: dict[str, Any]) -> None:
        self.bodies = list(bodies)
        self.patches: list[dict[str, Any]] = []
        self.conflicts = 1

    def read_node(self, name: str, **_: Any) -> SimpleNamespace:
        body = self.bodies.pop(0) if len(self.bodies) > 1 else self.bodies[0]
        return SimpleNamespace(data=json.dumps(body).encode())

    def patch_node(self, name: str, patch: dict[str, Any]) -> None:
        if self.conflicts:
            self.conflicts -= 1
            raise ApiException(status=409, reason="Conflict")
        self.patches.append(patch)


def test_a_conflict_reads_the_node_again_and_keeps_a_taint_added_meanwhile() -> None:
    core = FakeCore(_body("1", [OURS]), _body("2", [OURS, ADDED]))
    conn = cast(Connection, SimpleNamespace(core=core, server="https://api"))
    plan = _release(conn, "gpu-1")
    assert plan.removed_taints == ("sdcguard.dev/testing",)
    (patch,) = core.patches
    assert patch["metadata"]["resourceVersion"] == "2"
    assert patch["spec"]["taints"] == [ADDED]
    assert patch["metadata"]["labels"] == {"sdcguard.dev/state": None}


def test_a_clean_node_is_not_written() -> None:
    body = _body("1", [])
    body["metadata"].update(labels={}, annotations={})
    core = FakeCore(body)
    plan = _release(cast(Connection, SimpleNamespace(core=core, server="x")), "gpu-1")
    assert not plan.changes and core.patches == []
