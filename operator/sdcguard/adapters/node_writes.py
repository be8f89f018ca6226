"""The plan's node-patch stage: the one place a Node is patched.

A decision's node-side steps (``domain.plan``, stage ``NODE_PATCH``) are written here,
in one guarded patch (:meth:`NodePatchStage.apply`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import get_args

from sdcguard.adapters.kube import KubeWriter
from sdcguard.adapters.pass_state import Expectations
from sdcguard.domain.lifecycle import Action
from sdcguard.domain.nodepatch import NodePatch, plan_node_patch
from sdcguard.domain.observed import NodeFacts
from sdcguard.domain.plan import Step

_LIFECYCLE_ACTIONS = get_args(Action)


def node_actions(steps: Iterable[Step]) -> list[Action]:
    """The node-patch stage's steps (all lifecycle actions) for ``plan_node_patch``."""
    return [s for s in steps if isinstance(s, _LIFECYCLE_ACTIONS)]


class NodePatchStage:
    """Writes the node-patch stage of plans; keeps no state of its own (the writes it
    made are noted in the shared :class:`Expectations`)."""

    def __init__(self, writer: KubeWriter, expectations: Expectations | None = None) -> None:
        self._writer = writer
        self._expectations = expectations

    def apply(
        self, node: NodeFacts, steps: Iterable[Step], resource_version: str, counts: Counter[str]
    ) -> NodePatch:
        """A decision's node patch: labels, annotations, taints, cordon and ownership in
        one write that carries the resourceVersion it was computed from (a stale pass
        gets a 409). Returns the patch (empty: nothing was written)."""
        patch = plan_node_patch(node, node_actions(steps))
        if not patch.empty:
            self._writer.patch_node(node.name, patch.body(resource_version))
            if self._expectations is not None:
                self._expectations.wrote_node(node.name, resource_version)
            counts["node-patches"] += 1
        return patch
