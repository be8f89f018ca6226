"""One Node patch for a decision: labels, annotations, taints and cordon in one write.

The ownership bookkeeping travels in the same patch as the change it records, so
"we added this taint" and the taint itself can never disagree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sdcguard.domain import keys
from sdcguard.domain.lifecycle import (
    Action,
    AddTaint,
    Annotate,
    Cordon,
    MarkQualified,
    RemoveTaint,
    RevokeQualification,
    SetAutoscalerAnnotations,
    SetLabel,
    TaintRole,
    Uncordon,
)
from sdcguard.domain.observed import NodeFacts, Taint
from sdcguard.domain.seeds import SeedsPassed
from sdcguard.domain.states import NodeState


@dataclass(frozen=True)
class NodePatch:
    """Changes to one Node. ``None`` values remove a label or annotation."""

    labels: Mapping[str, str | None] = field(default_factory=dict)
    annotations: Mapping[str, str | None] = field(default_factory=dict)
    taints: tuple[Taint, ...] | None = None
    """The complete new taint list, when it changes."""
    unschedulable: bool | None = None

    @property
    def empty(self) -> bool:
        return (
            not (self.labels or self.annotations)
            and self.taints is None
            and self.unschedulable is None
        )

    def body(self, resource_version: str | None = None) -> dict[str, Any]:
        """A JSON merge patch. Pass the Node's resourceVersion: the taint list is replaced
        whole, and the server must refuse the write if someone changed it meanwhile."""
        metadata: dict[str, Any] = {}
        if self.labels:
            metadata["labels"] = dict(self.labels)
        if self.annotations:
            metadata["annotations"] = dict(self.annotations)
        if resource_version is not None and self.taints is not None:
            metadata["resourceVersion"] = resource_version
        spec: dict[str, Any] = {}
        if self.taints is not None:
            spec["taints"] = [
                {"key": t.key, "effect": t.effect, **({"value": t.value} if t.value else {})}
                for t in self.taints
            ]
        if self.unschedulable is not None:
            spec["unschedulable"] = self.unschedulable
        body: dict[str, Any] = {}
        if metadata:
            body["metadata"] = metadata
        if spec:
            body["spec"] = spec
        return body


def plan_node_patch(node: NodeFacts, actions: Iterable[Action]) -> NodePatch:
    """The single patch that applies the node-side ``actions`` to ``node``.

    Other actions (tests, tickets, events, deletion, drain) are not part of it. Taint
    removal and uncordon re-check ownership here as well, so a hand-made action list
    cannot remove what sdcguard does not own.
    """
    labels: dict[str, str | None] = {}
    annotations: dict[str, str | None] = {}
    taints = list(node.taints)
    owned = set(node.owned_taints)
    owned_annotations = set(node.owned_annotations)
    unschedulable = node.unschedulable
    cordoned_by_us = node.cordoned_by_us

    for action in actions:
        match action:
            case SetLabel(state=state):
                labels[keys.LABEL_STATE] = state.value
                if state != NodeState.QUARANTINED and keys.OBSERVED_FAILURE in node.annotations:
                    annotations[keys.OBSERVED_FAILURE] = None  # left the quarantine Observe saw
            case Annotate(changes=changes):
                annotations.update(changes)
            case AddTaint(role=role, key=key, effect=effect) if key:
                present = [t for t in taints if t.key == key]
                if not present:
                    taints.append(Taint(key, effect))
                    owned.add(key)
                elif key in owned or role == TaintRole.GATE:
                    taints = [Taint(key, effect, t.value) if t.key == key else t for t in taints]
                    owned.add(key)
            case RemoveTaint(key=key, role=TaintRole.GATE, registered=True) if key:
                taints = [t for t in taints if t.key != key]
                owned.discard(key)
            case RemoveTaint(key=key) if key in owned:
                taints = [t for t in taints if t.key != key]
                owned.discard(key)
            case Cordon() if not unschedulable:
                unschedulable, cordoned_by_us = True, True
            case Uncordon() if cordoned_by_us:
                unschedulable, cordoned_by_us = False, False
            case SetAutoscalerAnnotations(on=True):
                for key in keys.AUTOSCALER_ANNOTATIONS:
                    if key not in node.annotations and key not in annotations:
                        annotations[key] = "true"
                        owned_annotations.add(key)
            case SetAutoscalerAnnotations(on=False):
                for key in owned_annotations:
                    annotations[key] = None
                owned_annotations.clear()
            case MarkQualified(at=at, fingerprint=fingerprint) if at is not None:
                annotations[keys.QUALIFIED_AT] = keys.format_time(at)
                annotations[keys.FINGERPRINT] = fingerprint or None
                if action.test:
                    known = annotations.get(
                        keys.SEEDS_PASSED, node.annotations.get(keys.SEEDS_PASSED)
                    )
                    record = SeedsPassed.parse(known).add(
                        action.test, action.seed, action.data_seed
                    )
                    annotations[keys.SEEDS_PASSED] = record.text()
            case RevokeQualification():
                annotations[keys.QUALIFIED_AT] = None
                annotations[keys.FINGERPRINT] = None
            case _:
                pass

    annotations[keys.OWNED_TAINTS] = keys.join_list(frozenset(owned))
    annotations[keys.OWNED_ANNOTATIONS] = keys.join_list(frozenset(owned_annotations))
    annotations[keys.CORDONED_BY_US] = "true" if cordoned_by_us else None
    return NodePatch(
        labels={k: v for k, v in labels.items() if node.labels.get(k) != v},
        annotations={k: v for k, v in annotations.items() if node.annotations.get(k) != v},
        taints=tuple(taints) if tuple(taints) != node.taints else None,
        unschedulable=unschedulable if unschedulable != node.unschedulable else None,
    )
