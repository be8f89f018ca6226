"""Leaving leaves nodes clean (domain.cleanup): what each node loses, what a node held
out for its hardware keeps, and that a second run finds nothing."""

from __future__ import annotations

from typing import Any

import pytest

from sdcguard.domain import keys
from sdcguard.domain.cleanup import plan_release

TESTING = {"key": "sdcguard.dev/testing", "effect": "NoSchedule"}
GATE = {"key": "sdcguard.dev/unqualified", "effect": "NoSchedule"}
OTHERS = {"key": "example.com/maintenance", "value": "x", "effect": "NoExecute"}


def _ours(**extra: str) -> dict[str, str]:
    return {
        keys.OWNED_TAINTS: "sdcguard.dev/testing,sdcguard.dev/unqualified",
        keys.CURRENT_TEST: "gpu-1-acceptance-1",
        keys.STATE_SINCE: "2026-01-01T00:00:00Z",
        "example.com/owner": "team-a",
        **extra,
    }


def test_a_testing_node_loses_our_taints_label_and_annotations_but_keeps_others() -> None:
    annotations = _ours(**{keys.CORDONED_BY_US: "true"})
    plan = plan_release(
        "gpu-1",
        {keys.LABEL_STATE: "Testing", keys.LABEL_EXCLUDE: "false", "zone": "a"},
        annotations,
        [TESTING, OTHERS, GATE],
        True,
    )
    assert not plan.kept and plan.changes
    assert plan.removed_taints == ("sdcguard.dev/testing", "sdcguard.dev/unqualified")
    assert plan.taints == (OTHERS,)
    patch = plan.patch("42")
    assert patch["metadata"]["resourceVersion"] == "42"
    assert patch["metadata"]["labels"] == {keys.LABEL_STATE: None}  # exclude is a person's
    assert set(patch["metadata"]["annotations"]) == {
        keys.OWNED_TAINTS,
        keys.CURRENT_TEST,
        keys.STATE_SINCE,
        keys.CORDONED_BY_US,
    }
    assert patch["spec"] == {"taints": [OTHERS], "unschedulable": None}


def test_a_taint_not_recorded_as_ours_stays_even_with_our_key() -> None:
    """The gate a node registered with is not recorded as ours: it is left alone."""
    annotations = _ours(**{keys.OWNED_TAINTS: "sdcguard.dev/testing"})
    plan = plan_release("gpu-1", {keys.LABEL_STATE: "Testing"}, annotations, [TESTING, GATE], False)
    assert plan.removed_taints == ("sdcguard.dev/testing",) and plan.taints == (GATE,)
    assert not plan.uncordon  # a cordon we did not make stays


def test_our_autoscaler_annotations_go_and_others_stay() -> None:
    annotations = _ours(
        **{
            keys.OWNED_ANNOTATIONS: keys.KARPENTER_DO_NOT_DISRUPT,
            keys.KARPENTER_DO_NOT_DISRUPT: "true",
            keys.CA_SCALE_DOWN_DISABLED: "true",
        }
    )
    plan = plan_release("gpu-1", {keys.LABEL_STATE: "Testing"}, annotations, [], False)
    assert keys.KARPENTER_DO_NOT_DISRUPT in plan.annotations
    assert keys.CA_SCALE_DOWN_DISABLED not in plan.annotations
    assert "spec" not in plan.patch(None)


@pytest.mark.parametrize("state", ["Quarantined", "Repairing", "Verifying", "Retired"])
def test_a_node_held_out_for_its_hardware_is_kept_whole(state: str) -> None:
    quarantine = {"key": "sdcguard.dev/quarantined", "effect": "NoSchedule"}
    annotations = _ours(**{keys.OWNED_TAINTS: "sdcguard.dev/quarantined"})
    plan = plan_release("gpu-2", {keys.LABEL_STATE: state}, annotations, [quarantine], True)
    assert plan.kept and state in plan.kept and not plan.changes
    assert "kept" in plan.describe()


@pytest.mark.parametrize(
    ("labels", "annotations", "taints"),
    [
        ({}, {}, []),
        ({"zone": "a"}, {"example.com/owner": "x"}, [OTHERS]),
        ({keys.LABEL_EXCLUDE: "true"}, {}, []),
    ],
)
def test_a_clean_node_needs_nothing(
    labels: dict[str, str], annotations: dict[str, str], taints: list[dict[str, Any]]
) -> None:
    plan = plan_release("cpu-1", labels, annotations, taints, False)
    assert not plan.changes and not plan.kept
    assert plan.describe() == "cpu-1: nothing of sdcguard's"


def test_releasing_twice_finds_nothing_the_second_time() -> None:
    labels = {keys.LABEL_STATE: "Unqualified"}
    annotations = _ours()
    first = plan_release("gpu-1", labels, annotations, [GATE, OTHERS], False)
    patch = first.patch("1")
    after_labels = {k: v for k, v in labels.items() if k not in patch["metadata"]["labels"]}
    after_annotations = {
        k: v for k, v in annotations.items() if k not in patch["metadata"]["annotations"]
    }
    second = plan_release("gpu-1", after_labels, after_annotations, patch["spec"]["taints"], False)
    assert not second.changes
    assert after_annotations == {"example.com/owner": "team-a"}
