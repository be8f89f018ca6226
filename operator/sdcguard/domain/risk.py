"""Risk order: which due node to screen first when budgets allow fewer screenings than
nodes are due.

Today's order (``scheduling.priority``, :func:`todays_order`) puts repairs and new
nodes first, then suspects, then the longest-qualified nodes. The risk order keeps
those tiers and, among the routine re-screenings, looks first where an undetected
fault is likeliest, from what the fleet already knows about each node:

- the hours since its last passing screening, and that screening's catch chance (a
  weak pass earns little credit);
- the failure rate of its hardware type as sdcguard measured it: failures per
  screening (Jeffreys mean, Wilson interval shown), spread over the service hours
  those screenings covered, so a rate per hour;
- the host's repair history (each repair it came back from raises its rate);
- recent reports from training jobs that a re-test did not confirm.

The chance is one line of arithmetic, shown per node (:meth:`RiskScore.explain`)::

    hazard  = type_rate_per_hour * (1 + repair_weight * repairs) * (1 + report_weight * reports)
    onset   = 1 - exp(-hazard * hours_since_pass)          # a fault began since the pass
    missed  = (1 - catch_of_that_pass) * type_rate_per_screening  # ...or was there, missed
    believed = 1 - (1 - report_prior) ** reports    # ...or a report the pass did not confirm
    chance  = 1 - (1 - onset) * (1 - missed) * (1 - believed)

A report weighs on its own because a catch chance is per round of a fault that is
active during the screening: a fault that shows in spikes can be silent for a whole
screening, which no plan can state, and a job that saw it is evidence that it exists.

No history (no screening of any type recorded): the order falls back to today's and
each ranked node says so.

Starvation: each node counts the routine screenings of its pool that started ahead of
it while it was due, since its own last screening (``overtaken``). A node overtaken
``max_overtaken`` times is *overdue* and goes ahead of every risk-ordered node; overdue
nodes go most-overtaken first. So once due, a node is started before more than
``max_overtaken + D`` other routine screenings of its pool start, D being the nodes of
the pool overdue before it (at most the pool's size). The bound counts screenings, not
time: a clock that jumps forward or back changes the scores (hours since a pass are
clamped at zero) but never the bound.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

#: The tier of a routine re-screening of a qualified node in today's order
#: (``scheduling.priority``: repairs 0, new nodes 1, suspects 2, testing 3, qualified 4).
ROUTINE_TIER = 4
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_HOUR = 3600.0


def wilson_interval(failures: int, trials: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95% with the default ``z``).

    One failure in a thousand screenings gives about (0.0002, 0.0056): the rate is
    known only to within a factor of some 30, which the fleet figures show rather
    than a bare 0.001. No trials: (0, 1), nothing is known."""
    if trials <= 0:
        return (0.0, 1.0)
    failures = min(max(failures, 0), trials)
    p = failures / trials
    z2 = z * z
    centre = (p + z2 / (2 * trials)) / (1 + z2 / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials)) / (1 + z2 / trials)
    return (max(0.0, centre - half), min(1.0, centre + half))


def jeffreys_mean(failures: int, trials: int) -> float:
    """The Jeffreys posterior mean of a proportion, ``(k + 1/2) / (n + 1)``: never zero
    for a type that has not failed yet, and close to ``k/n`` once ``n`` is large."""
    return (max(failures, 0) + 0.5) / (max(trials, 0) + 1)


@dataclass(frozen=True)
class TypeHistory:
    """What sdcguard measured of one hardware type (its screenings' verdicts)."""

    screenings: int = 0
    failures: int = 0
    """Screenings with a confirmed SDC failure."""
    service_hours: float = 0.0
    """Node-hours in service between those screenings and the ones before them."""

    @property
    def per_screening(self) -> float:
        return jeffreys_mean(self.failures, self.screenings)

    @property
    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.failures, self.screenings)

    def per_hour(self, fallback: float) -> float:
        """Failures per service hour; ``fallback`` (the fleet's) without service hours."""
        if self.screenings <= 0 or self.service_hours <= 0:
            return fallback
        return self.per_screening * self.screenings / self.service_hours


@dataclass(frozen=True)
class RiskInputs:
    """One due node, as the operator sees it (every field comes from objects sdcguard
    keeps: node annotations, SDCTest results, repair tickets, hardware records)."""

    node: str
    due_since: dt.datetime
    """When the node became due (its trigger's time)."""
    tier: int = ROUTINE_TIER
    """Today's tier (``scheduling.priority``); only routine re-screenings are risk-ordered."""
    qualified_at: dt.datetime | None = None
    last_pass_at: dt.datetime | None = None
    """The last passing screening's end (``qualified_at`` when unknown)."""
    last_pass_catch: float | None = None
    """That screening's catch chance (the probe's plan); None: unknown, no credit."""
    repairs: int = 0
    """Repairs the host came back from (its hardware record's tickets)."""
    reports: int = 0
    """Recent workload reports a re-test did not confirm."""
    hardware_type: str = ""
    overtaken: int = 0
    """Routine screenings of its pool started ahead of it while it was due, since its own
    last screening (the starvation counter)."""


@dataclass(frozen=True)
class NodeRisk:
    """What the order reads of a node beyond its lifecycle facts, gathered by the
    operator from the objects it keeps (SDCTests, SDCReports, its own pass memory)."""

    hardware_type: str = ""
    last_pass_at: dt.datetime | None = None
    last_pass_catch: float | None = None
    reports: int = 0
    overtaken: int = 0


@dataclass(frozen=True)
class RiskOrder:
    """The order's few knobs, with the values the docs state."""

    max_overtaken: int = 500
    repair_weight: float = 1.0
    report_weight: float = 4.0
    report_prior: float = 0.5
    """The chance that a report a re-test did not confirm was right (a fleet can measure
    it: reports later confirmed over all reports)."""


class Basis(StrEnum):
    """Why a node has its place."""

    TIER = "tier"
    """Not a routine re-screening: today's tiers (repairs, new nodes, suspects) first."""
    OVERDUE = "overdue"
    """Waited past the starvation bound: ahead of every risk-ordered node."""
    RISK = "risk"
    TODAYS_ORDER = "todays-order"
    """No screening history in the fleet: today's order (oldest qualification first)."""


@dataclass(frozen=True)
class RiskScore:
    """The chance that a node holds an undetected fault, and each number behind it."""

    chance: float
    hours_since_pass: float
    onset: float
    missed: float
    believed: float
    """The chance that the node's unconfirmed reports were right."""
    hazard_per_hour: float
    type_per_screening: float
    type_interval: tuple[float, float]
    type_screenings: int
    type_failures: int
    repair_factor: float
    report_factor: float

    def explain(self) -> str:
        low, high = self.type_interval
        return (
            f"chance {self.chance:.2e}: fault began since the last pass "
            f"{self.hours_since_pass:.0f}h ago {self.onset:.2e}, missed by that pass "
            f"{self.missed:.2e}, reports believed {self.believed:.2f}; "
            f"type {self.type_failures}/{self.type_screenings} failed "
            f"(95% {low:.1e}-{high:.1e}); hazard {self.hazard_per_hour:.2e}/h "
            f"x{self.repair_factor:g} repairs x{self.report_factor:g} reports"
        )


@dataclass(frozen=True)
class RankedNode:
    """One due node in order, with its inputs and why it has its place."""

    inputs: RiskInputs
    basis: Basis
    score: RiskScore | None
    note: str = ""
    key: tuple[object, ...] = ()
    """Its place: sorting by it gives the order (nodes ranked apart, in another pass,
    compare by it too)."""

    @property
    def reason(self) -> str:
        """Why the node has its place (written on demand: a pass ranks many nodes and
        shows few)."""
        return self.score.explain() if self.score is not None else self.note


def todays_order(
    tier: int, qualified_at: dt.datetime | None, name: str
) -> tuple[int, dt.datetime, str]:
    """Today's order: tier, then the oldest qualification (a node never qualified
    first), then the name. ``scheduling.priority`` is this, read from a node's
    observation; the risk order keeps it for tiers and ties."""
    return (tier, qualified_at or _EPOCH, name)


def todays_key(node: RiskInputs) -> tuple[int, dt.datetime, str]:
    """Today's order (:func:`todays_order`) of a ranked node's inputs."""
    return todays_order(node.tier, node.qualified_at, node.node)


def fleet_rate_per_hour(types: Iterable[TypeHistory]) -> float:
    """The whole fleet's failures per service hour (a type without hours uses it)."""
    types = list(types)
    failures = sum(t.failures for t in types)
    screenings = sum(t.screenings for t in types)
    hours = sum(t.service_hours for t in types)
    if screenings <= 0 or hours <= 0:
        return 0.0
    return jeffreys_mean(failures, screenings) * screenings / hours


@dataclass(frozen=True)
class _TypeRate:
    """A type's figures, worked out once per ranking."""

    history: TypeHistory
    per_hour: float
    per_screening: float
    interval: tuple[float, float]

    @classmethod
    def of(cls, history: TypeHistory, fleet_rate: float) -> _TypeRate:
        return cls(history, history.per_hour(fleet_rate), history.per_screening, history.interval)


def risk_score(
    node: RiskInputs,
    history: TypeHistory,
    now: dt.datetime,
    order: RiskOrder = RiskOrder(),
    fleet_rate: float = 0.0,
) -> RiskScore:
    """The chance that ``node`` holds an undetected fault at ``now`` (module docstring);
    ``fleet_rate`` (failures per service hour) stands in for a type without hours."""
    return _score(node, _TypeRate.of(history, fleet_rate), now, order)


def _score(node: RiskInputs, rate: _TypeRate, now: dt.datetime, order: RiskOrder) -> RiskScore:
    since = node.last_pass_at or node.qualified_at or now
    hours = max((now - since).total_seconds() / _HOUR, 0.0)  # a clock behind: no onset
    repair_factor = 1.0 + order.repair_weight * max(node.repairs, 0)
    report_factor = 1.0 + order.report_weight * max(node.reports, 0)
    hazard = rate.per_hour * repair_factor * report_factor
    onset = -math.expm1(-hazard * hours)
    catch = min(max(node.last_pass_catch or 0.0, 0.0), 1.0)
    missed = (1.0 - catch) * min(rate.per_screening * repair_factor, 1.0)
    believed = 1.0 - (1.0 - order.report_prior) ** max(node.reports, 0)
    return RiskScore(
        chance=1.0 - (1.0 - onset) * (1.0 - missed) * (1.0 - believed),
        hours_since_pass=hours,
        onset=onset,
        missed=missed,
        believed=believed,
        hazard_per_hour=hazard,
        type_per_screening=rate.per_screening,
        type_interval=rate.interval,
        type_screenings=rate.history.screenings,
        type_failures=rate.history.failures,
        repair_factor=repair_factor,
        report_factor=report_factor,
    )


def is_overdue(node: RiskInputs, order: RiskOrder) -> bool:
    """Past the starvation bound: overtaken ``max_overtaken`` times (no clock read)."""
    return node.overtaken >= order.max_overtaken


@dataclass(frozen=True)
class TypeRates:
    """Every hardware type's figures for one history, worked out once: a pass ranks all
    its due nodes, then asks each waiting node's place again one at a time."""

    has_history: bool
    by_type: Mapping[str, _TypeRate]
    unknown: _TypeRate
    """A type missing from the history: the fleet's rate stands in."""

    @classmethod
    def of(cls, history: Mapping[str, TypeHistory]) -> TypeRates:
        fleet = fleet_rate_per_hour(history.values())
        return cls(
            has_history=any(h.screenings > 0 for h in history.values()),
            by_type={kind: _TypeRate.of(h, fleet) for kind, h in history.items()},
            unknown=_TypeRate.of(TypeHistory(), fleet),
        )


def rank_due_nodes(
    candidates: Sequence[RiskInputs],
    history: Mapping[str, TypeHistory],
    now: dt.datetime,
    order: RiskOrder = RiskOrder(),
    rates: TypeRates | None = None,
) -> list[RankedNode]:
    """Due nodes in the order they should get budget, each with why (module docstring).

    ``history`` maps a hardware type to what sdcguard measured of it; a type missing
    from it has no history. With no screening recorded for any type the order is
    today's, and every routine node's reason says so. ``rates``: the history's
    :class:`TypeRates` where the caller keeps them (worked out here otherwise).
    """
    if rates is None:
        rates = TypeRates.of(history)
    has_history, by_type, unknown = rates.has_history, rates.by_type, rates.unknown
    ranked: list[RankedNode] = []
    key: tuple[object, ...]
    for node in candidates:
        today = todays_key(node)
        if node.tier != ROUTINE_TIER:
            note = f"tier {node.tier} goes before routine"
            ranked.append(RankedNode(node, Basis.TIER, None, note, (node.tier, 0, 0.0, today)))
        elif is_overdue(node, order):
            note = (
                f"overdue: {node.overtaken} routine screenings started ahead of it while "
                f"it was due (bound {order.max_overtaken})"
            )
            key = (node.tier, 0, -node.overtaken, node.due_since, today)
            ranked.append(RankedNode(node, Basis.OVERDUE, None, note, key))
        elif not has_history:
            note = "no screening history in the fleet yet: today's order (oldest qualification)"
            key = (node.tier, 1, 0.0, today)
            ranked.append(RankedNode(node, Basis.TODAYS_ORDER, None, note, key))
        else:
            score = _score(node, by_type.get(node.hardware_type, unknown), now, order)
            key = (node.tier, 1, -score.chance, today)
            ranked.append(RankedNode(node, Basis.RISK, score, "", key))
    ranked.sort(key=lambda r: r.key)
    return ranked
