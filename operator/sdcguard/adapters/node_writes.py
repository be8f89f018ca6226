"""The plan's node-patch stage: the one place a Node is patched.

Every change the operator makes to a Node's labels, annotations, taints or cordon is a
plan step (``domain.plan``, stage ``NODE_PATCH``) and is written here: a decision's one
guarded patch (:meth:`NodePatchStage.apply`), and the plans of annotation steps that
follow from what another stage found (:meth:`NodePatchStage.annotate`): a drain that
left no pod ends its deadline, baseline consensus or a workload's report marks a node
suspect. No adapter builds a Node patch body of its own.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable
from typing import get_args

from sdcguard.adapters.kube import KubeWriter
from sdcguard.adapters.pass_state import Expectations
from sdcguard.domain import keys
from sdcguard.domain.cleanup import NodeRelease
from sdcguard.domain.lifecycle import Action, Annotate
from sdcguard.domain.nodecondition import condition_for, condition_patch
from sdcguard.domain.nodepatch import NodePatch, plan_node_patch
from sdcguard.domain.observed import NodeFacts
from sdcguard.domain.plan import Plan, Step
from sdcguard.domain.states import NodeState

_LIFECYCLE_ACTIONS = get_args(Action)


def node_actions(steps: Iterable[Step]) -> list[Action]:
    """The node-patch stage's steps (all lifecycle actions) for ``plan_node_patch``."""
    return [s for s in steps if isinstance(s, _LIFECYCLE_ACTIONS)]


def annotation_plan(changes: Iterable[tuple[str, str | None]]) -> Plan:
    """A plan of one step: set (None: remove) these sdcguard annotations on a node."""
    return Plan.of([Annotate(tuple(changes))])


class NodePatchStage:
    """Writes the node-patch stage of plans; keeps no state of its own (the writes it
    made are noted in the shared :class:`Expectations`)."""

    def __init__(self, writer: KubeWriter, expectations: Expectations | None = None) -> None:
        self._writer = writer
        self._expectations = expectations
        self._conditions: dict[str, tuple[str, str]] = {}
        """The SDCQualified condition last written per node, until the node's snapshot
        shows it (a decision made from an older snapshot must not write it again, nor
        move its lastTransitionTime)."""

    def apply(
        self,
        node: NodeFacts,
        steps: Iterable[Step],
        resource_version: str,
        counts: Counter[str],
        *,
        enforce: bool = True,
        now: dt.datetime | None = None,
    ) -> NodePatch:
        """A decision's node patch: labels, annotations, taints, cordon and ownership in
        one write that carries the resourceVersion it was computed from (a stale pass
        gets a 409). Returns the patch (empty: nothing was written).

        With ``now``, the ``SDCQualified`` condition follows (``domain.nodecondition``)
        once that write has succeeded, through the Node's status (a Node's conditions
        cannot travel in a write to its spec): only when its status or reason changes,
        which a clean re-qualification of a certified node never does."""
        patch = plan_node_patch(node, node_actions(steps))
        if not patch.empty:
            self._writer.patch_node(node.name, patch.body(resource_version))
            if self._expectations is not None:
                self._expectations.wrote_node(node.name, resource_version)
            counts["node-patches"] += 1
        if now is not None:
            self._condition(node, patch, enforce, now, counts)
        return patch

    def _condition(
        self,
        node: NodeFacts,
        patch: NodePatch,
        enforce: bool,
        now: dt.datetime,
        counts: Counter[str],
    ) -> None:
        label = patch.labels.get(keys.LABEL_STATE, node.state_label)
        state = next((s for s in NodeState if s.value == label), None)
        if state is None:
            return
        qualified_at = patch.annotations.get(
            keys.QUALIFIED_AT, node.annotations.get(keys.QUALIFIED_AT)
        )
        wanted = condition_for(state, certified=bool(qualified_at), enforce=enforce)
        current = node.condition
        written = self._conditions.get(node.name)
        if written is not None:
            if written == current:
                del self._conditions[node.name]  # the snapshot caught up
            else:
                current = written
        body = condition_patch(current, wanted, now)
        if body is not None:
            self._writer.patch_node_status(node.name, body)
            self._conditions[node.name] = (wanted.status, wanted.reason)
            counts["node-conditions"] += 1

    def annotate(self, node_name: str, plan: Plan) -> bool:
        """A plan whose node-patch steps only set annotations: written without the
        node's facts or resourceVersion (a merge patch of annotations replaces no list,
        so it cannot drop anyone's change). Raises ValueError for any other step (taints
        and cordon are planned against the node's facts: :meth:`apply`); returns whether
        a write was made."""
        changes: dict[str, str | None] = {}
        for step in plan.steps:
            if not isinstance(step, Annotate):
                raise ValueError(f"{type(step).__name__} is not an annotation step")
            changes.update(step.changes)
        if not changes:
            return False
        self._writer.patch_node(node_name, NodePatch(annotations=changes).body())
        return True

    def label(self, node_name: str, key: str, value: str | None) -> None:
        """Set (None: remove) one sdcguard label that no decision writes (the overdue
        label): a merge patch of labels replaces no list, so it needs no resourceVersion."""
        self._writer.patch_node(node_name, NodePatch(labels={key: value}).body())

    def release(self, release: NodeRelease, resource_version: str | None) -> None:
        """A node released by sdcguard leaving it (a deleted policy): the cleanup's one
        merge patch, guarded by the resourceVersion the plan was made from (a 409 means
        the node changed: read it and plan again)."""
        self._writer.patch_node(release.node, release.patch(resource_version))
        if self._expectations is not None and resource_version:
            self._expectations.wrote_node(release.node, resource_version)
