"""Leaving leaves nodes clean: what removing sdcguard takes off each node.

Run when sdcguard goes away (``kubectl sdc cleanup``, before ``helm uninstall``). Without
it, a node keeps whatever sdcguard last wrote: a testing or gate taint keeps every
workload (and, on a one-node cluster, a reinstalled operator) off it.

- A node sdcguard holds out for its hardware (Quarantined, Repairing, Verifying,
  Retired: a confirmed failure, or a person's quarantine) is **kept as it is**, taints,
  cordon and records included. Releasing it would put hardware that computed wrong
  answers back into service with no one watching; a reinstall reads the records and
  resumes. The command says which nodes it kept and why.
- Every other node loses what sdcguard wrote: the taints recorded as its own
  (``owned-taints``; a taint someone else added stays), a cordon it made
  (``cordoned-by-us``), the autoscaler annotations it set (``owned-annotations``), the
  state label and every ``sdcguard.dev/`` annotation. The person's opt-out label
  ``sdcguard.dev/exclude`` stays.

Pure: the adapter (the CLI) reads the Node, writes :meth:`NodeRelease.patch` guarded by
the resourceVersion it read, and re-reads on a conflict. A second run finds nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sdcguard.domain import keys
from sdcguard.domain.states import NodeState

KEPT_STATES = frozenset(
    {NodeState.QUARANTINED, NodeState.REPAIRING, NodeState.VERIFYING, NodeState.RETIRED}
)
"""States whose node stays out of service when sdcguard leaves."""


def _owned(annotations: Mapping[str, str], key: str) -> frozenset[str]:
    return frozenset(keys.split_list(annotations.get(key)))


@dataclass(frozen=True)
class NodeRelease:
    """What leaving does to one node: kept (``kept`` says why) or released."""

    node: str
    kept: str = ""
    taints: tuple[Mapping[str, Any], ...] = ()
    """The node's taints after the release (those of others, exactly as they were)."""
    removed_taints: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    annotations: tuple[str, ...] = ()
    uncordon: bool = False

    @property
    def changes(self) -> bool:
        return bool(self.removed_taints or self.labels or self.annotations or self.uncordon)

    def patch(self, resource_version: str | None) -> dict[str, Any]:
        """One merge patch for the whole release, guarded by ``resource_version`` (a
        change in between is a 409: read again and plan again). The taints are written
        as the whole list: a list cannot be merged key by key."""
        metadata: dict[str, Any] = {
            "labels": {k: None for k in self.labels},
            "annotations": {k: None for k in self.annotations},
        }
        if resource_version:
            metadata["resourceVersion"] = resource_version
        spec: dict[str, Any] = {}
        if self.removed_taints:
            spec["taints"] = [dict(t) for t in self.taints] or None
        if self.uncordon:
            spec["unschedulable"] = None
        return {"metadata": metadata, **({"spec": spec} if spec else {})}

    def describe(self) -> str:
        if self.kept:
            return f"{self.node}: kept ({self.kept})"
        if not self.changes:
            return f"{self.node}: nothing of sdcguard's"
        parts = []
        if self.removed_taints:
            parts.append(f"taints {', '.join(self.removed_taints)}")
        if self.uncordon:
            parts.append("uncordoned")
        if self.labels:
            parts.append(f"label {', '.join(self.labels)}")
        if self.annotations:
            parts.append(f"{len(self.annotations)} annotations")
        return f"{self.node}: released ({'; '.join(parts)})"


def plan_release(
    name: str,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    taints: Sequence[Mapping[str, Any]],
    unschedulable: bool,
) -> NodeRelease:
    """What leaving does to the node with these labels, annotations and taints."""
    state = labels.get(keys.LABEL_STATE)
    if state in KEPT_STATES:
        return NodeRelease(
            name,
            kept=f"{state}: held out for its hardware; its taints and records stay, "
            "and a reinstall resumes from them",
        )
    owned_taints = _owned(annotations, keys.OWNED_TAINTS)
    kept_taints = tuple(t for t in taints if t.get("key") not in owned_taints)
    removed = tuple(sorted({str(t.get("key")) for t in taints if t.get("key") in owned_taints}))
    ours = sorted(k for k in annotations if k.startswith(keys.PREFIX))
    autoscaler = sorted(_owned(annotations, keys.OWNED_ANNOTATIONS) & set(annotations))
    return NodeRelease(
        name,
        taints=kept_taints,
        removed_taints=removed,
        labels=(keys.LABEL_STATE,) if keys.LABEL_STATE in labels else (),
        annotations=tuple(ours + autoscaler),
        uncordon=unschedulable and annotations.get(keys.CORDONED_BY_US) == "true",
    )
