"""Per-pool budgets: how many tests run at once, and how many nodes sdcguard may hold.

A pool is the set of a policy's nodes that share the value of ``budgets.poolLabel``
(all of them when no label is set). "Held" (unavailable) means sdcguard keeps the
node from work that could otherwise use it: it carries our testing or quarantine
taint, or we cordoned it. Gated new nodes and retired nodes do not count: the
first never served, the second never will, and counting them would stop all
re-screening in a pool that grows or ages.

Percentages round down, except that a non-zero percent always allows one node:
with "10%" a pool of 5 nodes may still have one node screened at a time. Without
that, small pools would never be re-screened and their qualifications would
expire for good. Use 0 or "0%" to forbid holding nodes at all.

Devices (``maxUnavailableDevices``, optional): a pool's devices are its nodes'
allocatable accelerators; out of service are every device of a held node and each
device a quarantine of scope Device taints (its node serves with the rest, so it holds
no node). A reservation takes the devices of its node that are still serving, and fits
if the pool's devices out of service stay within the limit; like the node budget's
percent, a non-zero limit always lets one node be reserved while no device of the pool
is out but its own (with 8 GPUs a node, "5%" of 64 rounds to 3 and would otherwise never
fit; a node with a tainted GPU could otherwise never be verified).
Quarantines are never refused by a budget: they use it up.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from sdcguard.api import Budgets
from sdcguard.api.policy import allowed_unavailable


@dataclass(frozen=True)
class PoolUsage:
    """What a pool has in use right now."""

    pool: str = ""
    nodes: int = 0
    """Nodes of the policy in the pool (the base of a percent)."""
    unavailable: int = 0
    """Nodes sdcguard holds (testing, suspect-held, quarantined, repairing, verifying)."""
    tests: int = 0
    """Unfinished SDCTests."""
    devices: int = 0
    """Devices of the pool's nodes (allocatable accelerators; the base of a percent)."""
    devices_unavailable: int = 0
    """Devices out of service: all of a held node's, and those device taints take out."""

    def reserve(self, *, takes_node: bool, devices: int = 0) -> PoolUsage:
        """The usage after starting one more test (that also holds the node if
        ``takes_node``, taking ``devices`` more devices out of service)."""
        return replace(
            self,
            tests=self.tests + 1,
            unavailable=self.unavailable + (1 if takes_node else 0),
            devices_unavailable=self.devices_unavailable + (devices if takes_node else 0),
        )


@dataclass(frozen=True)
class BudgetCheck:
    """Whether a reservation fits, and if not, why (for the decision note)."""

    allowed: bool
    reason: str = ""


@dataclass(frozen=True)
class PoolMember:
    """One node's contribution to its pool's usage."""

    pool: str
    held: bool
    testing: bool
    devices: int = 0
    """The node's devices (allocatable accelerators)."""
    devices_held: int = 0
    """Of those, out of service: all of them when the node is held, else the devices
    a quarantine of scope Device taints."""


def can_reserve(
    usage: PoolUsage, budgets: Budgets, *, takes_node: bool, devices: int = 0, own: int = 0
) -> BudgetCheck:
    """Whether one more test fits ``usage``; ``takes_node`` when it also holds an available
    node, whose ``devices`` still serving it takes out of service (``own``: its devices
    out of service already, by device taints)."""
    if usage.tests >= budgets.max_concurrent_tests:
        return BudgetCheck(
            False,
            f"pool {usage.pool or '(all)'} already runs {usage.tests} tests "
            f"(maxConcurrentTests {budgets.max_concurrent_tests})",
        )
    if takes_node:
        limit = allowed_unavailable(budgets.max_unavailable, usage.nodes)
        if usage.unavailable >= limit:
            return BudgetCheck(
                False,
                f"pool {usage.pool or '(all)'} already has {usage.unavailable} of {usage.nodes} "
                f"nodes held (maxUnavailable {budgets.max_unavailable} allows {limit})",
            )
        check = _device_budget(usage, budgets, devices, own)
        if not check.allowed:
            return check
    return BudgetCheck(True)


def allowed_devices(budgets: Budgets, devices: int) -> int | None:
    """Devices of a pool of ``devices`` that may be out of service (None: no limit)."""
    if budgets.max_unavailable_devices is None:
        return None
    return allowed_unavailable(budgets.max_unavailable_devices, devices)


def _device_budget(usage: PoolUsage, budgets: Budgets, taken: int, own: int) -> BudgetCheck:
    limit = allowed_devices(budgets, usage.devices)
    if limit is None or usage.devices_unavailable + taken <= limit:
        return BudgetCheck(True)
    if limit > 0 and usage.devices_unavailable <= own:
        # A non-zero limit always lets one node be screened (or verified) at a time.
        return BudgetCheck(True)
    return BudgetCheck(
        False,
        f"pool {usage.pool or '(all)'} already has {usage.devices_unavailable} of "
        f"{usage.devices} devices out of service and the node would take {taken} more "
        f"(maxUnavailableDevices {budgets.max_unavailable_devices} allows {limit})",
    )


def pool_usage(members: Iterable[PoolMember]) -> dict[str, PoolUsage]:
    """Usage of every pool from its members."""
    pools: dict[str, PoolUsage] = {}
    for member in members:
        add_member(pools, member)
    return pools


def add_member(pools: dict[str, PoolUsage], member: PoolMember, sign: int = 1) -> None:
    """Count ``member`` into ``pools`` in place (``sign`` -1 takes it out again)."""
    usage = pools.get(member.pool, PoolUsage(pool=member.pool))
    pools[member.pool] = PoolUsage(
        pool=member.pool,
        nodes=usage.nodes + sign,
        unavailable=usage.unavailable + (sign if member.held else 0),
        tests=usage.tests + (sign if member.testing else 0),
        devices=usage.devices + sign * member.devices,
        devices_unavailable=usage.devices_unavailable + sign * member.devices_held,
    )
