"""Deleting an SDCPolicy releases what it holds, before its finalizer goes.

Kopf keeps its finalizer on every policy (the policy's loop is a daemon), so a deleted
policy stays until the operator has run its deletion handler (``handlers.py``), which
calls :meth:`PolicyRelease.release`:

- every unfinished SDCTest of the policy ends Cancelled with reason ``PolicyDeleted``
  (its row of the phase table: no verdict, so no back-off; its probe Job is deleted);
- every node the policy owned that another policy (not itself being deleted) now
  selects is handed over as it is: that policy owns it from its next pass, keeps its
  qualification, and screens it if it must (as when a node's labels move it);
- every other node it owned is released the way ``kubectl sdc cleanup`` releases it
  (:mod:`sdcguard.domain.cleanup`): our taints, cordon, state label and annotations go,
  except on a node held out for its hardware (Quarantined, Repairing, Verifying,
  Retired), which stays exactly as it is, records included, and says so in an Event.

Each node's release is one merge patch guarded by the resourceVersion just read; a
conflict reads the node again and plans again. A failed request raises: Kopf retries the
handler, and a second run finds nothing left to do.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import structlog
from kubernetes.client.exceptions import ApiException

from sdcguard.adapters.kube import KubeWriter
from sdcguard.adapters.node_writes import NodePatchStage
from sdcguard.adapters.test_runner import TestRunner
from sdcguard.api import SDCTest
from sdcguard.domain.cleanup import NodeRelease, plan_release
from sdcguard.domain.echo import bounded
from sdcguard.domain.observed import NodeSnapshot
from sdcguard.domain.selection import Selector, owning_policy
from sdcguard.domain.testphase import PolicyChange

log = structlog.get_logger("sdcguard.reconcile")

CONFLICT_RETRIES = 5


class PolicyRelease:
    """Releases a deleted policy's nodes and ends its tests (see the module docstring)."""

    def __init__(self, writer: KubeWriter, runner: TestRunner, node_patch: NodePatchStage) -> None:
        self.writer = writer
        self.runner = runner
        self.node_patch = node_patch

    def release(
        self,
        policy: str,
        selector: Selector | None,
        others: Mapping[str, Selector],
        nodes: Iterable[NodeSnapshot],
        tests: Iterable[SDCTest],
        now: dt.datetime,
    ) -> Counter[str]:
        """Release what ``policy`` (with ``selector``) holds; ``others``: the selectors of
        the policies that stay; ``nodes``: every node; ``tests``: the policy's unfinished
        tests. ``selector`` None (an unreadable spec): its tests end, and no node is
        touched. Returns what it did, by kind."""
        counts: Counter[str] = Counter()
        for test in tests:
            self.runner.end_by_policy_change(policy, test, PolicyChange.POLICY_DELETED, now, counts)
        if selector is None:
            log.warning(
                "deleted policy unreadable: its nodes are left to the others", policy=policy
            )
            nodes = ()
        everyone = {**others, policy: selector or {}}
        for node in nodes:
            if owning_policy(node.labels, everyone) != policy:
                continue
            heir = owning_policy(node.labels, others)
            if heir is not None:
                counts["nodes-handed-over"] += 1
                log.info("node handed to another policy", node=node.name, policy=policy, to=heir)
                continue
            done = self._release_node(node, policy, now)
            counts[
                "nodes-kept" if done.kept else "nodes-released" if done.changes else "nodes-clean"
            ] += 1
        log.info(
            "policy deleted; its nodes released", policy=policy, **dict(sorted(counts.items()))
        )
        return counts

    def _release_node(self, node: NodeSnapshot, policy: str, now: dt.datetime) -> NodeRelease:
        """Plan and write one node's release, reading it fresh (the copy may be a moment
        old, and a taint someone added in between must never be dropped)."""
        for _ in range(CONFLICT_RETRIES):
            body: Any = self.writer.api.sanitize_for_serialization(  # type: ignore[no-untyped-call]
                self.writer.core.read_node(node.name)
            )
            meta, spec = body.get("metadata") or {}, body.get("spec") or {}
            plan = plan_release(
                node.name,
                meta.get("labels") or {},
                meta.get("annotations") or {},
                spec.get("taints") or [],
                bool(spec.get("unschedulable")),
            )
            if plan.kept:
                self._tell(
                    node,
                    "PolicyDeletedNodeKept",
                    f"policy {policy} was deleted; {plan.describe()}",
                    now,
                    warning=True,
                )
                return plan
            if not plan.changes:
                return plan
            try:
                self.node_patch.release(plan, meta.get("resourceVersion"))
            except ApiException as exc:
                if exc.status == 409:
                    continue
                raise
            self._tell(
                node,
                "PolicyDeletedNodeReleased",
                f"policy {policy} was deleted; {plan.describe()}",
                now,
            )
            return plan
        raise RuntimeError(f"node {node.name} kept changing while it was released; retrying")

    def _tell(
        self, node: NodeSnapshot, reason: str, message: str, now: dt.datetime, warning: bool = False
    ) -> None:
        self.writer.event(
            kind="Node",
            name=node.name,
            uid=node.uid or None,
            reason=reason,
            message=bounded(message),
            now=now,
            warning=warning,
        )
