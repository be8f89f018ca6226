"""Budgets per topology domain (``spec.budgets.topology``): no NVLink clique, rack or
zone loses more than its share of nodes to screening at once.

A domain is the set of a policy's nodes that share one value of a budget's label key
(``nvidia.com/gpu.clique=<cluster>.<clique>`` on GB200 NVL72 racks). A node is held
as the pool budgets count it (testing, suspect-held, quarantined, repairing,
verifying); a screening that would take a node of a domain already at its
``maxUnavailable`` waits with reason Budget, naming the domain. Quarantine never
waits on a domain: it uses the domain's share up, like the pool's.

These checks are a filter beside the pool budgets (``budgets``), applied in
``scheduling.iter_decisions`` whatever order the nodes are decided in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from sdcguard.api import TopologyBudget, TopologyStatus
from sdcguard.api.policy import allowed_unavailable

Domain = tuple[str, str]
"""(label key, value)."""


@dataclass(frozen=True)
class DomainUsage:
    """Nodes of one domain, and how many of them sdcguard holds."""

    nodes: int = 0
    held: int = 0


def domains_of(labels: Mapping[str, str], budgets: Sequence[TopologyBudget]) -> tuple[Domain, ...]:
    """The domains a node with ``labels`` belongs to: one per budget whose key it carries."""
    return tuple((b.label_key, labels[b.label_key]) for b in budgets if b.label_key in labels)


def count_node(
    usage: dict[Domain, DomainUsage], domains: Iterable[Domain], held: bool, sign: int = 1
) -> None:
    """Count one node into ``usage`` in place (``sign`` -1 takes it out again)."""
    for domain in domains:
        now = usage.get(domain, DomainUsage())
        usage[domain] = DomainUsage(now.nodes + sign, now.held + (sign if held else 0))


def topology_usage(members: Iterable[tuple[tuple[Domain, ...], bool]]) -> dict[Domain, DomainUsage]:
    """Usage of every domain from (domains, held) of each node."""
    usage: dict[Domain, DomainUsage] = {}
    for domains, held in members:
        count_node(usage, domains, held)
    return usage


def topology_wait(
    domains: Iterable[Domain],
    usage: Mapping[Domain, DomainUsage],
    budgets: Sequence[TopologyBudget],
) -> str:
    """Why taking one more node of ``domains`` would exceed a domain's budget ("" if it
    fits); the node is not held yet and is counted in ``usage``'s nodes."""
    limits = {b.label_key: b.max_unavailable for b in budgets}
    for key, value in domains:
        seen = usage.get((key, value), DomainUsage())
        limit = allowed_unavailable(limits[key], seen.nodes)
        if seen.held >= limit:
            return (
                f"topology domain {key}={value} already has {seen.held} of {seen.nodes} nodes "
                f"held (budgets.topology maxUnavailable {limits[key]} allows {limit})"
            )
    return ""


def topology_status(
    usage: Mapping[Domain, DomainUsage], budgets: Sequence[TopologyBudget]
) -> list[TopologyStatus]:
    """Per budget: its domains, those at their limit, and the most held in one."""
    out = []
    for budget in budgets:
        mine = [u for (key, _), u in usage.items() if key == budget.label_key and u.nodes > 0]
        out.append(
            TopologyStatus(
                label_key=budget.label_key,
                domains=len(mine),
                at_limit=sum(
                    1
                    for u in mine
                    if u.held >= allowed_unavailable(budget.max_unavailable, u.nodes)
                ),
                most_held=max((u.held for u in mine), default=0),
            )
        )
    return out


def missing_keys(status: Sequence[TopologyStatus]) -> list[str]:
    """Budget keys that no node of the policy carries (they limit nothing)."""
    return [s.label_key for s in status if s.domains == 0]
