"""plan_node_patch(): one write per decision, and only what is ours is undone."""

from __future__ import annotations

from sdcguard.domain import keys
from sdcguard.domain.lifecycle import (
    AddTaint,
    Annotate,
    Cordon,
    MarkQualified,
    NodeState,
    RemoveTaint,
    RevokeQualification,
    SetAutoscalerAnnotations,
    SetLabel,
    TaintRole,
    Uncordon,
)
from sdcguard.domain.nodepatch import plan_node_patch
from sdcguard.domain.observed import Taint
from sdcguard.domain.seeds import SeedsPassed
from tests.unit.factories import NOW, node

TESTING = "sdcguard.dev/testing"
GATE = "sdcguard.dev/unqualified"
FOREIGN = Taint("example.com/maintenance", "NoExecute", "true")


def test_one_patch_with_label_taint_cordon_and_bookkeeping() -> None:
    n = node(taints=(FOREIGN,))
    patch = plan_node_patch(
        n,
        [
            SetLabel(NodeState.QUARANTINED),
            AddTaint(TaintRole.QUARANTINE, "sdcguard.dev/quarantined", "NoExecute"),
            Cordon(),
            SetAutoscalerAnnotations(on=True),
            Annotate(((keys.CURRENT_TEST, None), (keys.SEQ, "3"))),
        ],
    )
    body = patch.body("42")
    assert body["metadata"]["resourceVersion"] == "42"
    assert body["metadata"]["labels"] == {keys.LABEL_STATE: "Quarantined"}
    annotations = body["metadata"]["annotations"]
    assert annotations[keys.OWNED_TAINTS] == "sdcguard.dev/quarantined"
    assert annotations[keys.CORDONED_BY_US] == "true"
    assert annotations[keys.SEQ] == "3" and keys.CURRENT_TEST not in annotations
    assert annotations[keys.CA_SCALE_DOWN_DISABLED] == "true"
    assert body["spec"]["unschedulable"] is True
    assert body["spec"]["taints"] == [
        {"key": "example.com/maintenance", "effect": "NoExecute", "value": "true"},
        {"key": "sdcguard.dev/quarantined", "effect": "NoExecute"},
    ]


def test_taints_and_cordons_of_others_are_never_undone() -> None:
    n = node(taints=(FOREIGN, Taint(TESTING, "NoSchedule")), unschedulable=True)
    patch = plan_node_patch(
        n,
        [
            RemoveTaint(TaintRole.TESTING, TESTING),
            RemoveTaint(TaintRole.GATE, FOREIGN.key),
            Uncordon(),
        ],
    )
    assert patch.empty, "neither the taints nor the cordon are recorded as ours"


def test_our_taints_are_removed_and_ownership_forgotten() -> None:
    n = node(
        taints=(FOREIGN, Taint(TESTING, "NoSchedule")),
        annotations={keys.OWNED_TAINTS: TESTING, keys.CORDONED_BY_US: "true"},
        unschedulable=True,
    )
    patch = plan_node_patch(n, [RemoveTaint(TaintRole.TESTING, TESTING), Uncordon()])
    assert patch.taints == (FOREIGN,) and patch.unschedulable is False
    assert patch.annotations == {keys.OWNED_TAINTS: None, keys.CORDONED_BY_US: None}
    assert "resourceVersion" in patch.body("7")["metadata"]


def test_the_registration_gate_is_adopted_other_keys_are_not() -> None:
    n = node(taints=(Taint(GATE, "NoSchedule"), Taint(TESTING, "NoSchedule")))
    patch = plan_node_patch(
        n, [AddTaint(TaintRole.GATE, GATE), AddTaint(TaintRole.TESTING, TESTING)]
    )
    assert patch.taints is None
    assert patch.annotations == {keys.OWNED_TAINTS: GATE}


def test_autoscaler_annotations_of_others_survive() -> None:
    n = node(annotations={keys.KARPENTER_DO_NOT_DISRUPT: "true"})
    on = plan_node_patch(n, [SetAutoscalerAnnotations(on=True)])
    assert on.annotations == {
        keys.CA_SCALE_DOWN_DISABLED: "true",
        keys.OWNED_ANNOTATIONS: keys.CA_SCALE_DOWN_DISABLED,
    }
    n = node(annotations={**n.annotations, **{k: v for k, v in on.annotations.items() if v}})
    off = plan_node_patch(n, [SetAutoscalerAnnotations(on=False)])
    assert off.annotations == {keys.CA_SCALE_DOWN_DISABLED: None, keys.OWNED_ANNOTATIONS: None}


def test_qualification_is_recorded_and_revoked() -> None:
    marked = plan_node_patch(node(), [MarkQualified(NOW, "ab" * 32)])
    assert marked.annotations == {
        keys.QUALIFIED_AT: "2025-06-01T12:00:00Z",
        keys.FINGERPRINT: "ab" * 32,
    }
    n = node(qualified_at=NOW, annotations={keys.FINGERPRINT: "ab" * 32})
    revoked = plan_node_patch(n, [RevokeQualification()])
    assert revoked.annotations == {keys.QUALIFIED_AT: None, keys.FINGERPRINT: None}


def test_a_pass_adds_its_seeds_to_the_nodes_compact_record() -> None:
    """The seeds passed live on the Node, so they outlive the SDCTests retention prunes;
    the record is bounded and counts each passing test once."""
    n = node()
    for k in range(40):
        patch = plan_node_patch(n, [MarkQualified(NOW, "ab" * 32, f"n1-{k}", 7, 1000 + k)])
        n = node(annotations={**n.annotations, **{a: v for a, v in patch.annotations.items() if v}})
    again = plan_node_patch(n, [MarkQualified(NOW, "ab" * 32, "n1-39", 7, 1039)])
    assert keys.SEEDS_PASSED not in again.annotations  # the same pass twice: no change
    record = SeedsPassed.parse(n.annotations[keys.SEEDS_PASSED])
    assert record.passed == 40 and record.seeds == (7,) and record.last == "n1-39"
    assert record.data_seeds == tuple(range(1008, 1040))  # the newest 32
    assert len(n.annotations[keys.SEEDS_PASSED]) < 512
    # A record a person broke starts again instead of failing the pass.
    broken = node(annotations={keys.SEEDS_PASSED: "{not json"})
    fresh = plan_node_patch(broken, [MarkQualified(NOW, "ab" * 32, "n1-1", 7, 5)])
    assert SeedsPassed.parse(fresh.annotations[keys.SEEDS_PASSED]).passed == 1


def test_nothing_to_do_is_an_empty_patch() -> None:
    n = node(state=NodeState.QUALIFIED)
    assert plan_node_patch(n, [SetLabel(NodeState.QUALIFIED)]).empty
    assert plan_node_patch(n, []).body() == {}
