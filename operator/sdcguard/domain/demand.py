"""Whether a pending Pod could run on a node: the scheduling predicates that decide if
the Pod is demand for that node's idle capacity.

Idle and expiry screening of a node wait while a pending Pod needs the node. A Pod
counts only where the scheduler could place it once sdcguard stepped aside: its
``nodeSelector`` and required node affinity select the node, it tolerates the node's
NoSchedule and NoExecute taints, and its requests fit the node's allocatable. Otherwise
one Pod that can never schedule (16 GPUs asked of 8-GPU nodes, a selector no node has)
would hold back screening of every node offering its resource, for as long as it waits.

Taints sdcguard places itself (the testing taint, and any it records as its own) are
not a reason the Pod cannot run there: sdcguard lifts them, and the screening they
stand for is exactly what waiting for the Pod holds back.

The checks are those of kube-scheduler's NodeAffinity, TaintToleration and Fit
plugins for an empty node: current use is not subtracted (a node busy now is not
screened for idleness anyway). Pure: the adapter decodes the Pod into
:class:`PodPlacement` once, in the index handler.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal

from sdcguard.domain.observed import Taint
from sdcguard.domain.quantity import parse_quantity

#: Taint effects that keep a Pod off a node (PreferNoSchedule only steers).
BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
#: Resources every node has; absent from a node's allocatable they are not judged
#: (an extended resource the node does not list is one it has none of).
STANDARD_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage", "pods"})


@dataclass(frozen=True)
class Requirement:
    """One ``matchExpressions`` or ``matchFields`` entry of a node selector term."""

    key: str
    operator: str
    """In, NotIn, Exists, DoesNotExist, Gt or Lt (an unknown one matches nothing, as
    the API server would have refused it)."""
    values: tuple[str, ...] = ()

    def matches(self, fields: Mapping[str, str]) -> bool:
        present = self.key in fields
        value = fields.get(self.key, "")
        match self.operator:
            case "In":
                return present and value in self.values
            case "NotIn":
                return not present or value not in self.values
            case "Exists":
                return present
            case "DoesNotExist":
                return not present
            case "Gt" | "Lt":
                if not present or len(self.values) != 1:
                    return False
                try:
                    have, bound = int(value), int(self.values[0])
                except ValueError:
                    return False
                return have > bound if self.operator == "Gt" else have < bound
        return False


@dataclass(frozen=True)
class NodeSelectorTerm:
    """A term of required node affinity: all its requirements hold (an empty term
    selects no node, as in Kubernetes)."""

    match_expressions: tuple[Requirement, ...] = ()
    match_fields: tuple[Requirement, ...] = ()
    """Only ``metadata.name`` is a field Kubernetes allows here."""

    def selects(self, name: str, labels: Mapping[str, str]) -> bool:
        if not self.match_expressions and not self.match_fields:
            return False
        fields = {"metadata.name": name}
        return all(r.matches(labels) for r in self.match_expressions) and all(
            r.matches(fields) for r in self.match_fields
        )


@dataclass(frozen=True)
class Toleration:
    """One toleration of a Pod."""

    key: str = ""
    """Empty with operator Exists: tolerates every taint."""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""
    """Empty: every effect."""

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


@dataclass(frozen=True)
class PodPlacement:
    """What the scheduler reads of a pending Pod to place it."""

    node_selector: Mapping[str, str] = field(default_factory=dict)
    required_terms: tuple[NodeSelectorTerm, ...] | None = None
    """requiredDuringSchedulingIgnoredDuringExecution's terms (any one suffices);
    None: the Pod has no required node affinity."""
    tolerations: tuple[Toleration, ...] = ()
    requests: Mapping[str, Decimal] = field(default_factory=dict)
    """The Pod's effective requests: the larger of its containers' sum and any one
    init container, per resource."""


def selects(pod: PodPlacement, name: str, labels: Mapping[str, str]) -> bool:
    """The Pod's nodeSelector and required node affinity both select the node."""
    if any(labels.get(k) != v for k, v in pod.node_selector.items()):
        return False
    if pod.required_terms is None:
        return True
    return any(term.selects(name, labels) for term in pod.required_terms)


def untolerated(
    pod: PodPlacement, taints: tuple[Taint, ...], reserved: frozenset[str]
) -> tuple[Taint, ...]:
    """The node's blocking taints the Pod does not tolerate, apart from the ``reserved``
    keys (sdcguard's own: it lifts them)."""
    return tuple(
        t
        for t in taints
        if t.effect in BLOCKING_EFFECTS
        and t.key not in reserved
        and not any(tol.tolerates(t) for tol in pod.tolerations)
    )


def fits(pod: PodPlacement, allocatable: Mapping[str, str]) -> bool:
    """Every request fits what the node offers in all (a quantity the node states that
    cannot be read is not judged)."""
    for resource, wanted in pod.requests.items():
        if resource not in allocatable:
            if resource in STANDARD_RESOURCES:
                continue
            if wanted > 0:
                return False
            continue
        try:
            offered = parse_quantity(allocatable[resource])
        except ValueError:
            continue
        if wanted > offered:
            return False
    return True


def could_run_on(
    pod: PodPlacement,
    name: str,
    labels: Mapping[str, str],
    taints: tuple[Taint, ...],
    allocatable: Mapping[str, str],
    reserved_taints: frozenset[str] = frozenset(),
) -> bool:
    """The scheduler could place the Pod on this node once sdcguard's own taints are
    gone: it is demand for the node."""
    return (
        selects(pod, name, labels)
        and not untolerated(pod, taints, reserved_taints)
        and fits(pod, allocatable)
    )
