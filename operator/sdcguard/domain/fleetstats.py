"""Fleet figures people look at, from objects sdcguard already keeps (SDCTest verdicts,
node qualification annotations, repair tickets, workload reports): pure functions for
``kubectl sdc fleet`` and a dashboard row.

- failures per hardware type, with a Wilson interval so a small count says how little
  it means;
- time from onset to quarantine as the fleet can measure it: the onset is not seen,
  only bracketed between the node's last passing screening and its first evidence (a
  report or a failing screening), so each incident gives a lower and an upper bound;
- the share of qualified nodes past their re-certification age;
- the exposure the current policy implies, from the measured screening interval,
  catch chance, busy share and report rate (an estimate under stated assumptions; the
  exposure benchmark checks it against a simulation).
"""

from __future__ import annotations

import datetime as dt
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from sdcguard.domain.risk import TypeHistory, jeffreys_mean, wilson_interval

_HOUR = 3600.0


@dataclass(frozen=True)
class Screening:
    """One finished screening of a node, as its SDCTest records it."""

    node: str
    hardware_type: str
    finished_at: dt.datetime
    failed: bool
    """A confirmed SDC verdict (not inconclusive)."""


@dataclass(frozen=True)
class TypeFailures:
    """Failures of one hardware type per screening, with its 95% interval."""

    hardware_type: str
    screenings: int
    failures: int
    rate: float
    """Jeffreys mean per screening."""
    low: float
    high: float

    def explain(self) -> str:
        return (
            f"{self.hardware_type or '(unknown)'}: {self.failures} of {self.screenings} "
            f"screenings failed; rate {self.rate:.1e} (95% {self.low:.1e}-{self.high:.1e})"
        )


def failures_by_type(screenings: Iterable[Screening]) -> list[TypeFailures]:
    """Per hardware type, sorted by name."""
    counts: dict[str, list[int]] = {}
    for s in screenings:
        tally = counts.setdefault(s.hardware_type, [0, 0])
        tally[0] += 1
        tally[1] += int(s.failed)
    rows = []
    for kind in sorted(counts):
        n, k = counts[kind]
        low, high = wilson_interval(k, n)
        rows.append(TypeFailures(kind, n, k, jeffreys_mean(k, n), low, high))
    return rows


def type_histories(
    screenings: Iterable[Screening], service_hours: dict[str, float]
) -> dict[str, TypeHistory]:
    """The risk order's per-type history from the verdicts and the service hours."""
    return {
        row.hardware_type: TypeHistory(
            row.screenings, row.failures, service_hours.get(row.hardware_type, 0.0)
        )
        for row in failures_by_type(screenings)
    }


@dataclass(frozen=True)
class Incident:
    """One quarantine, with the evidence around it."""

    node: str
    quarantined_at: dt.datetime
    first_evidence_at: dt.datetime
    """The first report from a workload, or the first failing screening."""
    last_pass_at: dt.datetime | None
    """The last passing screening before it (None: never passed; no upper bound)."""


@dataclass(frozen=True)
class OnsetToQuarantine:
    """Hours from onset to quarantine, bracketed (the onset itself is unseen)."""

    incidents: int
    bounded: int
    """Incidents with a last pass, so an upper bound."""
    median_low_hours: float | None
    """Median of (quarantine - first evidence): the onset was at least this long ago."""
    median_high_hours: float | None
    """Median of (quarantine - last pass): the onset was at most this long ago."""

    def explain(self) -> str:
        if not self.incidents:
            return "no quarantine yet"
        high = (
            f"{self.median_high_hours:.1f}h"
            if self.median_high_hours is not None
            else "unknown (no pass)"
        )
        return (
            f"{self.incidents} quarantines: median onset-to-quarantine between "
            f"{self.median_low_hours:.1f}h and {high}"
        )


def onset_to_quarantine(incidents: Iterable[Incident]) -> OnsetToQuarantine:
    """The bracket, as medians over incidents (a clock that ran back counts as zero)."""
    lows, highs = [], []
    count = 0
    for i in incidents:
        count += 1
        lows.append(max((i.quarantined_at - i.first_evidence_at).total_seconds(), 0) / _HOUR)
        if i.last_pass_at is not None:
            highs.append(max((i.quarantined_at - i.last_pass_at).total_seconds(), 0) / _HOUR)
    return OnsetToQuarantine(
        incidents=count,
        bounded=len(highs),
        median_low_hours=statistics.median(lows) if lows else None,
        median_high_hours=statistics.median(highs) if highs else None,
    )


@dataclass(frozen=True)
class Share:
    count: int
    of: int

    @property
    def fraction(self) -> float:
        return self.count / self.of if self.of else 0.0


def past_recertification(
    qualified_at: Iterable[dt.datetime | None], max_age: dt.timedelta, now: dt.datetime
) -> Share:
    """Qualified nodes whose last qualification is older than ``max_age`` (a node with
    no recorded qualification counts as past it)."""
    count = total = 0
    for at in qualified_at:
        total += 1
        if at is None or now - at > max_age:
            count += 1
    return Share(count, total)


@dataclass(frozen=True)
class FaultClass:
    """One kind of fault in the estimate: its share of faults, the chance a screening
    catches it, and its reports per busy hour (0 without the training library)."""

    share: float
    catch_chance: float
    report_rate_per_busy_hour: float = 0.0


@dataclass(frozen=True)
class ExposureEstimate:
    """Mean hours a fault serves work before quarantine, under the current policy."""

    hours: float
    screening_hours: float
    """The same, were screenings the only way to find a fault."""

    def explain(self) -> str:
        return (
            f"about {self.hours:.0f}h of work per fault before quarantine "
            f"(screenings alone {self.screening_hours:.0f}h)"
        )


def _class_hours(
    hours_between: float, busy: float, catch: float, report_rate: float
) -> tuple[float, float]:
    catch = min(max(catch, 1e-9), 1.0)
    to_catch = hours_between * (1.0 / catch - 0.5)
    rate = (1.0 / to_catch if to_catch > 0 else math.inf) + max(report_rate, 0.0) * busy
    return (busy / rate if rate > 0 else math.inf), busy * to_catch


def exposure_estimate(
    hours_between_screenings: float,
    busy_share: float,
    classes: Iterable[FaultClass],
) -> ExposureEstimate:
    """An estimate of exposure per fault, per class then weighted by share: the onset
    falls uniformly between screenings spaced ``hours_between_screenings`` (as
    measured), each catches it with the class's chance, so the first catch comes
    ``T (1/c - 1/2)`` hours later; reports arrive at the class's rate while the node
    works, a competing exponential; the node works ``busy_share`` of the time. It
    ignores the spread within a class and the horizon, so it runs low when a few faults
    are nearly invisible (the exposure benchmark puts it beside the simulation)."""
    busy = min(max(busy_share, 0.0), 1.0)
    hours_between = max(hours_between_screenings, 0.0)
    total = screening = weight = 0.0
    for c in classes:
        with_reports, alone = _class_hours(
            hours_between, busy, c.catch_chance, c.report_rate_per_busy_hour
        )
        total += c.share * with_reports
        screening += c.share * alone
        weight += c.share
    if weight <= 0:
        return ExposureEstimate(0.0, 0.0)
    return ExposureEstimate(hours=total / weight, screening_hours=screening / weight)
