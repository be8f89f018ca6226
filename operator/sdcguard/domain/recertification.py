"""Re-certification that cannot stall silently: when a qualification is overdue, and
whether a policy's test budget can re-certify its nodes within ``maxQualificationAge``.

Expiry is soft: a Qualified node whose qualification is older than
``maxQualificationAge`` is re-screened in its next idle window, and a node kept busy
never has one. Such a node is **Overdue**: it carries the ``sdcguard.dev/overdue=true``
label (written once, when it becomes overdue, and removed once, when it is re-screened
or leaves Qualified), is counted by the ``sdcguard_qualification_overdue_nodes`` gauge,
and the chart's ``SdcguardQualificationOverdue`` alert fires on it.

Capacity. A pool re-screens at most ``maxConcurrentTests`` nodes at a time, each
taking the mean screening duration ``d`` (measured from the policy's recent finished
screenings, the suite's budget before there are any). Within ``maxQualificationAge``
``A`` a pool of ``N`` nodes can re-certify::

    capacity = maxConcurrentTests * A / d

nodes, and keeps up only while ``N <= capacity``. The number is an upper bound: it
assumes every node is idle when its turn comes. Pure: no clock, no I/O.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sdcguard.domain import keys

LABEL_OVERDUE = keys.PREFIX + "overdue"
"""On a Node: ``true`` while its qualification is older than ``maxQualificationAge``."""

RECENT_SCREENINGS = 50
"""How many of the newest finished screenings the mean duration is taken over."""


def is_overdue(
    state: str, qualified_at: dt.datetime | None, max_age: dt.timedelta | None, now: dt.datetime
) -> bool:
    """A Qualified node whose qualification is older than ``max_age`` (None: never
    expires). A node being re-screened (Testing) or out of service is not overdue: its
    re-certification is under way or not owed."""
    if state != "Qualified" or max_age is None or qualified_at is None:
        return False
    return now - qualified_at > max_age


def overdue_label_change(labels: Mapping[str, str], overdue: bool) -> str | bool | None:
    """The value to write to the Node's overdue label (None: remove it), or False when
    the label already says so: the label is written only on the transition."""
    present = labels.get(LABEL_OVERDUE) == "true"
    if overdue == present and (overdue or LABEL_OVERDUE not in labels):
        return False
    return "true" if overdue else None


def mean_screening_seconds(
    finished: Iterable[tuple[dt.datetime, dt.datetime]], budget_seconds: float
) -> tuple[float, int]:
    """The mean node-hold time of the newest ``RECENT_SCREENINGS`` finished screenings
    (each a (created, completed) pair), and how many it was taken over; the suite's
    ``budget_seconds`` when none finished yet."""
    spans = sorted(
        ((done, (done - made).total_seconds()) for made, done in finished if done >= made),
        reverse=True,
    )[:RECENT_SCREENINGS]
    if not spans:
        return float(budget_seconds), 0
    return sum(s for _, s in spans) / len(spans), len(spans)


@dataclass(frozen=True)
class Capacity:
    """Whether every pool can be re-certified within ``maxQualificationAge``."""

    sufficient: bool
    message: str


def recertification_capacity(
    pool_nodes: Mapping[str, int],
    max_concurrent_tests: int,
    max_age: dt.timedelta | None,
    mean_seconds: float,
    measured: int,
) -> Capacity:
    """Compare each pool's nodes with ``maxConcurrentTests * maxQualificationAge / mean
    screening duration`` and say the arithmetic, naming the tightest pool. Never a
    refusal: the policy works, only slower than its expiry asks."""
    if max_age is None:
        return Capacity(True, 'maxQualificationAge is "0": qualifications never expire')
    if not pool_nodes or mean_seconds <= 0:
        return Capacity(True, "no nodes to re-certify")
    capacity = math.floor(max_concurrent_tests * max_age.total_seconds() / mean_seconds)
    pool, nodes = max(sorted(pool_nodes.items()), key=lambda item: item[1])
    source = (
        f"the mean of the last {measured} screenings"
        if measured
        else "the suite's budget (no screening finished yet)"
    )
    hours = max_age.total_seconds() / 3600
    arithmetic = (
        f"maxConcurrentTests {max_concurrent_tests} x maxQualificationAge {hours:g}h / "
        f"{mean_seconds / 60:.1f} min per screening ({source}) = {capacity} nodes per pool "
        f"within the age"
    )
    named = f"pool {pool!r}" if pool else "the pool"
    if nodes <= capacity:
        return Capacity(True, f"{arithmetic}; the largest, {named}, has {nodes}")
    needed = math.ceil(nodes * mean_seconds / max_age.total_seconds())
    return Capacity(
        False,
        f"{arithmetic}, but {named} has {nodes}: its nodes become Overdue; raise "
        f"budgets.maxConcurrentTests to at least {needed}, or maxQualificationAge",
    )
