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
import itertools
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sdcguard.domain.risk import TypeHistory, jeffreys_mean, wilson_interval

_HOUR = 3600.0
#: Node labels that name a node's hardware type, first found wins: GPU feature
#: discovery's product, then the cloud's instance type.
HARDWARE_TYPE_LABELS = ("nvidia.com/gpu.product", "node.kubernetes.io/instance-type")


def hardware_type(labels: Mapping[str, str]) -> str:
    """The node's hardware type ("" when no label names one)."""
    return next((labels[k] for k in HARDWARE_TYPE_LABELS if labels.get(k)), "")


@dataclass(frozen=True)
class Screening:
    """One finished screening of a node, as its SDCTest records it."""

    node: str
    hardware_type: str
    finished_at: dt.datetime
    failed: bool
    """A confirmed SDC verdict (not inconclusive)."""
    catch_chance: float | None = None
    """Its weakest check's catch chance (status.checks[].catchChance), if the probe said."""


def _h(hours: float) -> str:
    """Hours with the precision they deserve: 0.4h, 12h, 730h."""
    return f"{hours:.1f}h" if hours < 10 else f"{hours:.0f}h"


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
            f"{self.incidents} quarantine(s): median onset-to-quarantine between "
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

    def __add__(self, other: Share) -> Share:
        return Share(self.count + other.count, self.of + other.of)

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


def incidents(
    quarantines: Iterable[tuple[str, dt.datetime]],
    screenings: Iterable[Screening],
    reports: Iterable[tuple[str, dt.datetime]] = (),
) -> list[Incident]:
    """Each quarantine (a node and when its ticket opened) with the evidence around it:
    the node's last passing screening before it, and its first report or failing
    screening after that pass (none: the quarantine itself, e.g. a person's)."""
    by_node: dict[str, list[Screening]] = {}
    for s in screenings:
        by_node.setdefault(s.node, []).append(s)
    reported: dict[str, list[dt.datetime]] = {}
    for node, at in reports:
        reported.setdefault(node, []).append(at)
    out = []
    for node, at in quarantines:
        seen = [s for s in by_node.get(node, []) if s.finished_at <= at]
        passes = [s.finished_at for s in seen if not s.failed]
        last_pass = max(passes) if passes else None
        after = [s.finished_at for s in seen if s.failed]
        after += [r for r in reported.get(node, []) if r <= at]
        after = [t for t in after if last_pass is None or t > last_pass]
        out.append(Incident(node, at, min(after) if after else at, last_pass))
    return out


def hours_between_screenings(screenings: Iterable[Screening]) -> float | None:
    """The mean hours between one node's consecutive screenings, over the fleet (None:
    no node was screened twice yet)."""
    by_node: dict[str, list[dt.datetime]] = {}
    for s in screenings:
        by_node.setdefault(s.node, []).append(s.finished_at)
    total, gaps = 0.0, 0
    for times in by_node.values():
        times.sort()
        for before, after in itertools.pairwise(times):
            total += max((after - before).total_seconds(), 0.0) / _HOUR
            gaps += 1
    return total / gaps if gaps else None


@dataclass(frozen=True)
class FleetFigures:
    """What ``kubectl sdc fleet`` and the dashboard row show."""

    types: list[TypeFailures]
    onset: OnsetToQuarantine
    past_recertification: Share
    hours_between: float | None
    catch_chance: float | None
    """The mean catch chance of the passing screenings that recorded one."""
    busy_share: float
    estimate: ExposureEstimate | None
    """None: too little history (no node screened twice, or no catch chance recorded)."""

    def explain_estimate(self) -> str:
        if self.estimate is None:
            return (
                "no estimate yet: it needs a node screened twice and a screening that "
                "recorded its catch chance"
            )
        return (
            f"{_h(self.estimate.hours)} of work per fault before a screening catches it: "
            f"screenings {_h(self.hours_between or 0.0)} apart, each catching "
            f"{self.catch_chance:.2f} of a fault as faint as the catch target's, nodes busy "
            f"{self.busy_share:.0%} of the time; reports from training jobs only shorten it"
        )


def fleet_figures(
    screenings: Iterable[Screening],
    quarantines: Iterable[tuple[str, dt.datetime]],
    reports: Iterable[tuple[str, dt.datetime]],
    past: Share,
    busy_share: float,
) -> FleetFigures:
    """The fleet figures from what sdcguard keeps (SDCTests, RepairTickets, SDCReports,
    and ``past``: :func:`past_recertification` per policy, summed) and the share of
    nodes at work now. The exposure estimate is the
    screenings-alone one (:func:`exposure_estimate`, one class at the measured catch
    chance): reports are counted in the onset bracket, not guessed into a rate."""
    screenings = list(screenings)
    catches = [s.catch_chance for s in screenings if not s.failed and s.catch_chance is not None]
    catch = sum(catches) / len(catches) if catches else None
    between = hours_between_screenings(screenings)
    estimate = (
        exposure_estimate(between, busy_share, [FaultClass(1.0, catch)])
        if between is not None and catch is not None
        else None
    )
    return FleetFigures(
        types=failures_by_type(screenings),
        onset=onset_to_quarantine(incidents(quarantines, screenings, reports)),
        past_recertification=past,
        hours_between=between,
        catch_chance=catch,
        busy_share=min(max(busy_share, 0.0), 1.0),
        estimate=estimate,
    )
