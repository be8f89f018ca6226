"""Scheduling a pass: the order in which nodes get budget, and deciding a policy's nodes
so that budgets hold across them (each decision that takes a node or starts a test
counts before the next node is decided)."""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from sdcguard.api import SDCPolicySpec
from sdcguard.domain.budgets import PoolMember, PoolUsage, add_member
from sdcguard.domain.decide import Decision, decide
from sdcguard.domain.lifecycle import IllegalTransition, TaintDevices
from sdcguard.domain.observed import Observed
from sdcguard.domain.reading import REQUEUE_WAITING
from sdcguard.domain.risk import (
    NodeRisk,
    RankedNode,
    RiskInputs,
    RiskOrder,
    TypeHistory,
    TypeRates,
    rank_due_nodes,
    todays_order,
)
from sdcguard.domain.states import NodeState
from sdcguard.domain.topology import Domain, DomainUsage, count_node, domains_of, topology_wait

S = NodeState


_PRIORITY = {
    S.VERIFYING: 0,
    S.QUARANTINED: 0,
    S.REPAIRING: 0,
    S.UNQUALIFIED: 1,
    S.SUSPECT: 2,
    S.TESTING: 3,
    S.QUALIFIED: 4,
}
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def tier(observed: Observed) -> int:
    """The node's tier: repairs 0, new nodes 1, suspects 2, testing 3, qualified 4."""
    return _PRIORITY.get(observed.node.state or S.UNQUALIFIED, 5)


def priority(observed: Observed) -> tuple[int, dt.datetime, str]:
    """Today's order in which nodes get budget (``risk.todays_order``): repairs and new
    nodes first, then suspects, then the longest-qualified nodes."""
    return todays_order(tier(observed), observed.node.qualified_at, observed.node.name)


@dataclass(frozen=True)
class RiskContext:
    """What the risk order reads beyond each node's observation: per hardware type what
    sdcguard measured, and per node what the operator gathered (:class:`NodeRisk`)."""

    history: Mapping[str, TypeHistory] = field(default_factory=dict)
    nodes: Mapping[str, NodeRisk] = field(default_factory=dict)
    order: RiskOrder = field(default_factory=RiskOrder)

    @functools.cached_property
    def rates(self) -> TypeRates:
        """The history's figures per type, worked out once per context (one pass)."""
        return TypeRates.of(self.history)


def risk_inputs(observed: Observed, known: NodeRisk) -> RiskInputs:
    """One node's inputs to the risk order: its tier and qualification from its
    observation, its repairs from its hardware record (failures it came back from)."""
    node = observed.node
    qualified = node.qualified_at
    return RiskInputs(
        node=node.name,
        due_since=qualified or _EPOCH,
        tier=tier(observed),
        qualified_at=qualified,
        last_pass_at=known.last_pass_at or qualified,
        last_pass_catch=known.last_pass_catch,
        repairs=observed.hardware.failures if observed.hardware is not None else 0,
        reports=known.reports,
        hardware_type=known.hardware_type,
        overtaken=known.overtaken,
    )


def rank(
    observations: Sequence[Observed], risk: RiskContext, now: dt.datetime
) -> list[tuple[Observed, RankedNode]]:
    """The observations in the risk order (``risk.rank_due_nodes``), each with why."""
    by_name = {o.node.name: o for o in observations}
    none = NodeRisk()
    inputs = [risk_inputs(o, risk.nodes.get(o.node.name, none)) for o in observations]
    ranked = rank_due_nodes(inputs, risk.history, now, risk.order, risk.rates)
    return [(by_name[r.inputs.node], r) for r in ranked]


@dataclass(frozen=True)
class BudgetOrder:
    """The order in which nodes get budget, with each node's place in it: today's
    (:func:`priority`) without a risk context, else the risk order, which keeps today's
    tiers and orders the routine re-screenings by the chance each holds an undetected
    fault (``domain.risk``). A pass works it out once and remembers the place of every
    node that waits for budget."""

    nodes: list[Observed]
    places: dict[str, tuple[object, ...]]

    @classmethod
    def of(
        cls, observations: Iterable[Observed], now: dt.datetime, risk: RiskContext | None = None
    ) -> BudgetOrder:
        keyed: list[tuple[Observed, tuple[object, ...]]]
        if risk is None:
            keyed = [(o, priority(o)) for o in observations]
            keyed.sort(key=lambda pair: pair[1])
        else:
            keyed = [(o, r.key) for o, r in rank(list(observations), risk, now)]
        return cls([o for o, _ in keyed], {o.node.name: key for o, key in keyed})


def budget_order(
    observations: Iterable[Observed], now: dt.datetime, risk: RiskContext | None = None
) -> list[Observed]:
    """The nodes in :class:`BudgetOrder`."""
    return BudgetOrder.of(observations, now, risk).nodes


def budget_key(
    observed: Observed, now: dt.datetime, risk: RiskContext | None = None
) -> tuple[object, ...]:
    """The node's place in :class:`BudgetOrder`, comparable with the places of nodes
    ordered in another pass (the operator's memory of who waits for budget)."""
    return BudgetOrder.of([observed], now, risk).places[observed.node.name]


def iter_decisions(
    observations: Iterable[Observed],
    policy: SDCPolicySpec,
    now: dt.datetime,
    others: Mapping[str, PoolUsage] | None = None,
    between: Callable[[], None] | None = None,
    other_domains: Mapping[Domain, DomainUsage] | None = None,
    risk: RiskContext | None = None,
    order: BudgetOrder | None = None,
) -> Iterator[Decision]:
    """Decide nodes of a policy in one pass, so budgets hold across nodes; lazily, so
    a caller may attend to something urgent between two nodes of a long pass.

    Pool usage is computed from all observations plus ``others`` (the usage by pool of
    the policy's nodes not decided in this pass, as last seen), then each decision
    that starts a test reserves its share before the next node is decided, in
    :func:`budget_order` (the risk order with ``risk``, else today's).

    A node whose event has no row in the lifecycle table (a bug) costs only that node:
    its decision does nothing and carries ``illegal``.

    ``between`` is called every 256 nodes while the pools are counted, before the first
    decision (the caller's chance to serve urgent work there too: on a large fleet the
    count is long enough to matter).

    With topology budgets, the domains are counted like the pools (``other_domains``:
    the usage by domain of the policy's nodes not decided in this pass) and each
    decision that takes a node counts in its domains before the next node is decided
    (:class:`DomainCaps`).

    ``order``: the observations' :class:`BudgetOrder` where the caller has worked it out
    (to keep the places), with the same ``now`` and ``risk``.
    """
    ordered = order.nodes if order is not None else budget_order(observations, now, risk)
    holding = frozenset({policy.taints.testing, policy.taints.quarantine})
    pools = dict(others or {})
    members = []
    for count, observed in enumerate(ordered):
        if between is not None and count % 256 == 255:
            between()
        member = observed.pool_member(holding)
        add_member(pools, member)
        members.append(member)
    caps = DomainCaps(policy, other_domains)
    for observed, before in zip(ordered, members, strict=True):
        caps.add(observed, before.held)
    for observed, before in zip(ordered, members, strict=True):
        usage = pools.get(observed.node.pool, PoolUsage(pool=observed.node.pool))
        try:
            decision = decide(observed.placed(usage, caps.wait(observed)), policy, now)
        except IllegalTransition as exc:
            yield Decision(
                node=observed.node.name,
                previous=observed.node.state,
                state=exc.state,
                event=None,
                actions=(),
                requeue_after=REQUEUE_WAITING,
                note=str(exc),
                illegal=exc,
            )
            continue
        after = member_after(before, decision)
        # Only what a decision adds is counted before its write succeeds: a node it
        # holds (a test started, or a quarantine of a node that was not held) counts
        # for the next node at once; a release counts once it is written and seen.
        grown = PoolMember(
            before.pool,
            before.held or after.held,
            before.testing or after.testing,
            before.devices,
            max(before.devices_held, after.devices_held),
        )
        if grown != before:
            add_member(pools, before, -1)
            add_member(pools, grown)
        caps.taken(observed, before.held, grown.held)
        yield decision


class DomainCaps:
    """The per-domain cap of ``budgets.topology`` over one pass: usage by domain, and
    whether one more node of a node's domains fits (a filter, whatever the order in
    which nodes are decided)."""

    def __init__(
        self, policy: SDCPolicySpec, others: Mapping[Domain, DomainUsage] | None = None
    ) -> None:
        self._budgets = policy.budgets.topology
        self.usage: dict[Domain, DomainUsage] = dict(others or {})

    def _domains(self, observed: Observed) -> tuple[Domain, ...]:
        return domains_of(observed.node.labels, self._budgets) if self._budgets else ()

    def add(self, observed: Observed, held: bool) -> None:
        """Count a node of this pass into its domains."""
        count_node(self.usage, self._domains(observed), held)

    def wait(self, observed: Observed) -> str:
        """Why the node may not be taken now ("" when its domains have room)."""
        domains = self._domains(observed)
        return topology_wait(domains, self.usage, self._budgets) if domains else ""

    def taken(self, observed: Observed, before: bool, after: bool) -> None:
        """A decision that holds a node not held before counts at once (like the pools)."""
        if after and not before:
            domains = self._domains(observed)
            count_node(self.usage, domains, False, -1)
            count_node(self.usage, domains, True)


_ALWAYS_HELD = frozenset({NodeState.QUARANTINED, NodeState.REPAIRING, NodeState.VERIFYING})


def member_after(before: PoolMember, decision: Decision) -> PoolMember:
    """The node's share of its pool once ``decision`` is applied (see budgets).

    Quarantine and repair states hold the node, unless only some of its devices are
    out of service (quarantine scope Device: the node serves with the others, as
    ``Observed.pool_member`` counts it); Testing and Suspect hold it as before, or once
    the decision takes a serving node for a test; any other state holds nothing. A
    test the decision starts counts as running.
    """
    tainted = [a for a in decision.actions if isinstance(a, TaintDevices)]
    device_scope = bool(tainted) or (
        decision.previous in (NodeState.QUARANTINED, NodeState.REPAIRING) and not before.held
    )
    out = len(tainted[0].devices) if tainted else before.devices_held
    if decision.state in (NodeState.QUARANTINED, NodeState.REPAIRING) and device_scope:
        held = False
    elif decision.state in _ALWAYS_HELD:
        held = True
    elif decision.state in (NodeState.TESTING, NodeState.SUSPECT):
        held = before.held or decision.takes_node
    else:
        held, out = False, 0
    devices_held = before.devices if held else min(before.devices, out) if device_scope else 0
    return PoolMember(
        before.pool, held, before.testing or decision.starts_test, before.devices, devices_held
    )


def decide_all(
    observations: Iterable[Observed],
    policy: SDCPolicySpec,
    now: dt.datetime,
    others: Mapping[str, PoolUsage] | None = None,
) -> list[Decision]:
    """Every decision of :func:`iter_decisions`, in priority order."""
    return list(iter_decisions(observations, policy, now, others))
