"""What the risk order (``domain.risk``) reads that a node's observation does not hold,
gathered from objects sdcguard already keeps, never a store of its own:

- per hardware type, the screenings and failures sdcguard recorded (finished SDCTests
  with a Pass or SDC verdict) and the service hours between a node's screenings;
- per node, its last passing screening's end and catch chance (its SDCTest), its
  hardware type (a Node label), its recent reports (SDCReports accepted within the
  report limits' window, kept by the report admission), and how often it was overtaken
  while it waited for budget (the pass memory: a restart starts it again at zero,
  which only restarts the starvation bound's count).

The fleet-wide part is worked out on full passes (every test is read there anyway);
targeted passes reuse it.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from sdcguard.adapters.pass_state import FleetView, PolicyMemory
from sdcguard.api import Verdict
from sdcguard.domain import keys
from sdcguard.domain.decide import Decision
from sdcguard.domain.fleetstats import Screening, Share, fleet_figures, hardware_type
from sdcguard.domain.observed import Observed, TestFacts
from sdcguard.domain.risk import ROUTINE_TIER, NodeRisk, TypeHistory
from sdcguard.domain.scheduling import RiskContext, tier
from sdcguard.metrics import Metrics

_HOUR = 3600.0


@dataclass(frozen=True)
class NodeScreenings:
    """One node's finished screenings (Pass or SDC), as its SDCTests record them."""

    screenings: int = 0
    failures: int = 0
    service_hours: float = 0.0
    """Hours between consecutive screenings (the first covers no known span)."""
    last_pass_at: dt.datetime | None = None
    last_pass_catch: float | None = None


def node_screenings(tests: Iterable[TestFacts]) -> NodeScreenings:
    """What a node's finished tests say (inconclusive, crashed or cancelled ones are no
    screening: they neither pass nor fail the hardware)."""
    done = sorted(
        (t for t in tests if t.completed_at is not None and t.verdict in _SCREENED),
        key=lambda t: t.completed_at or dt.datetime.min.replace(tzinfo=dt.UTC),
    )
    hours = 0.0
    last_pass: TestFacts | None = None
    for before, after in itertools.pairwise(done):
        if before.completed_at is not None and after.completed_at is not None:
            hours += max((after.completed_at - before.completed_at).total_seconds(), 0) / _HOUR
    for t in done:
        if t.verdict == Verdict.PASS:
            last_pass = t
    return NodeScreenings(
        screenings=len(done),
        failures=sum(1 for t in done if t.verdict == Verdict.SDC),
        service_hours=hours,
        last_pass_at=last_pass.completed_at if last_pass else None,
        last_pass_catch=last_pass.catch_chance if last_pass else None,
    )


_SCREENED = frozenset({Verdict.PASS, Verdict.SDC})


def _facts(view: FleetView, node: str) -> list[TestFacts]:
    return [s.known.facts for s in view.tests.get(node, []) if s.known is not None]


def screenings(view: FleetView) -> list[Screening]:
    """Every node's finished screenings with its hardware type, for the fleet figures."""
    rows = []
    for node, snapshot in view.nodes.items():
        kind = hardware_type(snapshot.labels)
        for t in _facts(view, node):
            if t.completed_at is not None and t.verdict in _SCREENED:
                failed = t.verdict == Verdict.SDC
                rows.append(Screening(node, kind, t.completed_at, failed, t.catch_chance))
    return rows


def busy_share(view: FleetView) -> float:
    """The share of qualified nodes where a workload holds accelerators now."""
    qualified = [n for n, s in view.nodes.items() if s.labels.get(keys.LABEL_STATE) == "Qualified"]
    if not qualified:
        return 0.0
    return sum(1 for n in qualified if view.busy.get(n)) / len(qualified)


def type_history(view: FleetView) -> dict[str, TypeHistory]:
    """Per hardware type, what sdcguard measured over every node's tests."""
    counts: dict[str, list[float]] = {}
    for node, snapshot in view.nodes.items():
        seen = node_screenings(_facts(view, node))
        if not seen.screenings:
            continue
        tally = counts.setdefault(hardware_type(snapshot.labels), [0, 0, 0.0])
        tally[0] += seen.screenings
        tally[1] += seen.failures
        tally[2] += seen.service_hours
    return {k: TypeHistory(int(n), int(f), h) for k, (n, f, h) in counts.items()}


class RiskBook:
    """The risk order's inputs for the reconciler's passes."""

    def __init__(
        self,
        metrics: Metrics | None = None,
        reports: Callable[[], list[tuple[str, dt.datetime]]] | None = None,
    ) -> None:
        self.metrics = metrics
        self.reports = reports or list
        """Recent accepted reports, (node, accepted at) (the report admission's, set at
        assembly)."""
        self.history: dict[str, TypeHistory] = {}
        """Per hardware type, as of the last full pass."""

    def refresh(self, view: FleetView) -> None:
        """Re-measure the hardware types and export the fleet figures (a full pass,
        whose view has every test)."""
        if not view.complete:
            return
        self.history = type_history(view)
        if self.metrics is not None:
            self.export(view)

    def export(self, view: FleetView) -> None:
        """The fleet figures (``domain.fleetstats``) as gauges for the dashboard row."""
        opened = (
            (t.node_name, t.opened_at or t.created) for ts in view.tickets.values() for t in ts
        )
        figures = fleet_figures(
            screenings(view),
            [(node, at) for node, at in opened if at is not None],
            self.reports(),
            Share(0, 0),  # the dashboard divides the overdue gauge by the Qualified nodes
            busy_share(view),
        )
        m = self.metrics
        if m is None:
            return
        m.type_screenings.clear()
        m.type_failure_rate.clear()
        for row in figures.types:
            kind = row.hardware_type or "unlabelled"
            m.type_screenings.labels(type=kind, outcome="all").set(row.screenings)
            m.type_screenings.labels(type=kind, outcome="failed").set(row.failures)
            for bound, value in (("low", row.low), ("mean", row.rate), ("high", row.high)):
                m.type_failure_rate.labels(type=kind, bound=bound).set(value)
        m.onset_to_quarantine.clear()
        for bound, hours in (
            ("low", figures.onset.median_low_hours),
            ("high", figures.onset.median_high_hours),
        ):
            if hours is not None:
                m.onset_to_quarantine.labels(bound=bound).set(hours)
        m.exposure_estimate.clear()
        if figures.estimate is not None:
            m.exposure_estimate.labels(basis="screenings").set(figures.estimate.hours)

    def context(self, view: FleetView, memory: PolicyMemory, nodes: Iterable[str]) -> RiskContext:
        """The order's context for ``nodes`` of one policy."""
        reports: Counter[str] = Counter(node for node, _ in self.reports())
        known: dict[str, NodeRisk] = {}
        for name in nodes:
            snapshot = view.nodes.get(name)
            if snapshot is None:
                continue
            seen = node_screenings(_facts(view, name))
            known[name] = NodeRisk(
                hardware_type=hardware_type(snapshot.labels),
                last_pass_at=seen.last_pass_at,
                last_pass_catch=seen.last_pass_catch,
                reports=reports[name],
                overtaken=memory.overtaken.get(name, 0),
            )
        return RiskContext(history=self.history, nodes=known)


def count_overtaken(
    memory: PolicyMemory, decisions: Iterable[Decision], by_node: Mapping[str, Observed]
) -> None:
    """The starvation counter, once a pass's decisions are applied (``memory.waiting``
    up to date): each routine node waiting for budget counts the routine screenings its
    pool started in the pass; a node that starts, or no longer waits, starts again at
    zero."""
    started: Counter[str] = Counter()
    for decision in decisions:
        observed = by_node.get(decision.node)
        if observed is None or not decision.starts_test:
            continue
        memory.overtaken.pop(decision.node, None)
        if tier(observed) == ROUTINE_TIER:
            started[observed.node.pool] += 1
    for node in [n for n in memory.overtaken if n not in memory.waiting]:
        del memory.overtaken[node]
    if not started:
        return
    for node, (key, pool) in memory.waiting.items():
        if key and key[0] == ROUTINE_TIER and started[pool]:
            memory.overtaken[node] = memory.overtaken.get(node, 0) + started[pool]
