"""Overdue qualifications and re-certification capacity, as the pass writes them: the
Node's ``sdcguard.dev/overdue`` label (only on the transition), the overdue gauge, and
the policy's ``RecertificationCapacity`` verdict (``domain.recertification`` decides)."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable, Mapping

import structlog

from sdcguard.adapters.node_writes import NodePatchStage
from sdcguard.adapters.pass_state import FleetView, KnownTest, PolicyMemory
from sdcguard.api import SDCPolicy, Suite
from sdcguard.api.common import parse_duration
from sdcguard.domain import keys
from sdcguard.domain.recertification import (
    LABEL_OVERDUE,
    Capacity,
    is_overdue,
    mean_screening_seconds,
    overdue_label_change,
    recertification_capacity,
)
from sdcguard.metrics import Metrics

log = structlog.get_logger("sdcguard.reconcile")


def max_age(policy: SDCPolicy) -> dt.timedelta | None:
    """The policy's maxQualificationAge (None: "0", never expires)."""
    raw = policy.spec.triggers.max_qualification_age
    return None if raw == "0" else dt.timedelta(seconds=parse_duration(raw))


class Recertification:
    """Marks overdue nodes and measures whether the budgets keep up. Keeps no state of
    its own: the overdue set lives in the policy's :class:`PolicyMemory`."""

    def __init__(self, node_patch: NodePatchStage, metrics: Metrics) -> None:
        self._node_patch = node_patch
        self._metrics = metrics

    def mark(
        self,
        policy: SDCPolicy,
        memory: PolicyMemory,
        view: FleetView,
        names: Iterable[str],
        now: dt.datetime,
        counts: Counter[str],
    ) -> None:
        """Judge ``names`` (the pass's nodes) from the view's state label and
        qualified-at annotation: both as the Node shows them, so a re-screening written
        in this pass clears the label in the next, never flapping it. The label is
        written only where it differs; the gauge counts the policy's overdue nodes."""
        age = max_age(policy)
        for name in names:
            node = view.nodes.get(name)
            if node is None or name not in memory.states:
                memory.overdue.discard(name)
                continue
            overdue = is_overdue(
                node.labels.get(keys.LABEL_STATE, ""),
                keys.parse_time(node.annotations.get(keys.QUALIFIED_AT)),
                age,
                now,
            )
            if overdue:
                memory.overdue.add(name)
            else:
                memory.overdue.discard(name)
            change = overdue_label_change(node.labels, overdue)
            if change is False:
                continue
            value = change if isinstance(change, str) else None
            self._node_patch.label(name, LABEL_OVERDUE, value)
            counts["overdue-marked" if overdue else "overdue-cleared"] += 1
            if overdue:
                log.warning("qualification overdue", node=name, policy=policy.metadata.name)
        self._metrics.qualification_overdue.labels(policy=policy.metadata.name).set(
            len(memory.overdue)
        )

    @staticmethod
    def capacity(
        policy: SDCPolicy, memory: PolicyMemory, tests: Mapping[str, list[KnownTest]]
    ) -> Capacity:
        """Whether the tests budget re-certifies every pool within maxQualificationAge,
        from the policy's recent finished screenings (the requalification budget before
        any finished)."""
        finished = [
            (t.created, t.facts.completed_at)
            for node_tests in tests.values()
            for t in node_tests
            if t.finished and t.facts.completed_at is not None and t.facts.verdict is not None
        ]
        mean, measured = mean_screening_seconds(
            finished, policy.spec.suite_budget(Suite.REQUALIFICATION)
        )
        pools = Counter(member.pool for member in memory.pools.members.values())
        return recertification_capacity(
            pools, policy.spec.budgets.max_concurrent_tests, max_age(policy), mean, measured
        )
