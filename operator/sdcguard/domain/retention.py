"""Which history to delete, and why (pure): the bound on what the operator keeps.

SDCTests, RepairTickets, SDCReports, WorkloadRecords and SDCBaselines accumulate
with every screening, failure, report, node and fingerprint. The operator mirrors
the tests and tickets in memory and lists them at every start and takeover, so a
fleet that never deletes any pays for a year of history at every restart. This
module decides what may go; ``adapters/retention.py`` deletes it, rate-limited.

The rules (:class:`RetentionLimits` holds the numbers, the settings set them):

- **SDCTests**: per node, the newest ``tests_per_node`` and every test younger than
  ``tests_age`` stay (both: a node screened daily keeps a month, a node screened
  once keeps its one test however old). Never deleted, whatever their age: a test
  still running (an in-flight screening is the lifecycle's), the newest passing
  test of a node (its last pass: what a confirmation's data seed and the blast
  radius count from) and any test an unclosed RepairTicket names as evidence.
- **RepairTickets**: a Closed ticket is deleted ``closed_tickets_age`` after it
  closed. An open one (Open, Acknowledged, InRepair, Verifying) never is. A Retired
  ticket is the state of a retired node (``decide.py`` reads the node's state from
  it), so it stays while its node exists, and goes ``closed_tickets_age`` after the
  node has left the cluster.
- **SDCReports**: deleted ``reports_age`` after they were made, unless an accepted
  report still awaits its outcome on a node that still exists (the operator follows
  it until the node is confirmed or cleared).
- **WorkloadRecords**: one per node, bounded by the API; the record of a node that
  exists holds its blast radius since the last pass and is never deleted. The record
  of a node that left the cluster goes once it saw no activity for ``reports_age``.
- **SDCBaselines**: deleted once no node carries their fingerprint (the node's
  ``sdcguard.dev/fingerprint`` annotation, or a kept SDCTest of a node that still
  exists: a node quarantined for repair has lost its annotation and its verification
  needs the baseline), no SDCTest of the last ``baselines_age`` ran under it, and the
  baseline itself is older than that.

What must outlive all of this lives elsewhere and is never pruned: repair cycles and
hardware history in the SDCHardware records (one per failing identifier, bounded by
the API), the last qualification and fingerprint in node annotations, the seeds its
passed screenings ran on in the node's ``sdcguard.dev/seeds-passed`` record
(``seeds.SeedsPassed``), the blast radius of an open ticket in the ticket's spec and
the node's WorkloadRecord.

An object the operator could not parse is never deleted (it may be a newer or older
release's, and deleting what one cannot read would lose it silently): it is
returned in :attr:`RetentionPlan.unreadable`, to be counted and named.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class HistoryKind(StrEnum):
    """The kinds retention prunes, by their plural (the API's resource name)."""

    TEST = "sdctests"
    TICKET = "repairtickets"
    REPORT = "sdcreports"
    WORKLOAD_RECORD = "workloadrecords"
    BASELINE = "sdcbaselines"


OPEN_TICKET_PHASES = frozenset({"", "Open", "Acknowledged", "InRepair", "Verifying"})
"""Phases of a ticket whose incident is not over ("": its status not written yet)."""


@dataclass(frozen=True)
class RetentionLimits:
    """How much history is kept (every duration and count at least one: a zero would
    mean deleting the newest test of every node, which the settings refuse)."""

    tests_per_node: int = 10
    tests_age: dt.timedelta = dt.timedelta(days=30)
    closed_tickets_age: dt.timedelta = dt.timedelta(days=365)
    reports_age: dt.timedelta = dt.timedelta(days=30)
    baselines_age: dt.timedelta = dt.timedelta(days=30)

    def __post_init__(self) -> None:
        if self.tests_per_node < 1:
            raise ValueError("tests_per_node must be at least 1")
        for name in ("tests_age", "closed_tickets_age", "reports_age", "baselines_age"):
            if getattr(self, name) <= dt.timedelta(0):
                raise ValueError(f"{name} must be positive")


@dataclass(frozen=True, slots=True)
class TestRecord:
    """An SDCTest as retention reads it."""

    __test__ = False  # not a pytest test class

    name: str
    node: str
    created: dt.datetime
    resource_version: str = ""
    finished: bool = True
    passed: bool = False
    fingerprint: str = ""
    """The fingerprint hash it ran under ("" when it did not say)."""


@dataclass(frozen=True, slots=True)
class TicketRecord:
    """A RepairTicket as retention reads it."""

    name: str
    node: str
    created: dt.datetime
    phase: str
    resource_version: str = ""
    closed_at: dt.datetime | None = None
    """status.closedAt, else the time of its last history entry, else its creation."""
    evidence: tuple[str, ...] = ()
    """The SDCTests it names as evidence."""


@dataclass(frozen=True, slots=True)
class ReportRecord:
    """An SDCReport as retention reads it (namespaced)."""

    namespace: str
    name: str
    node: str
    created: dt.datetime
    resource_version: str = ""
    awaits_outcome: bool = False
    """Accepted, and its outcome is not known yet."""


@dataclass(frozen=True, slots=True)
class WorkloadRecordEntry:
    """A WorkloadRecord as retention reads it (named after its node)."""

    name: str
    node: str
    last_active: dt.datetime
    """The latest of its creation, ``since``, ``idleSince`` and its workloads' times."""
    resource_version: str = ""


@dataclass(frozen=True, slots=True)
class BaselineRecord:
    """An SDCBaseline as retention reads it."""

    name: str
    fingerprint: str
    created: dt.datetime
    resource_version: str = ""


@dataclass(frozen=True, slots=True)
class Unreadable:
    """An object that did not parse: never deleted, counted and named."""

    kind: HistoryKind
    name: str
    error: str = ""
    namespace: str = ""


@dataclass(frozen=True)
class History:
    """Everything retention looks at, as snapshots taken once."""

    tests: tuple[TestRecord, ...] = ()
    tickets: tuple[TicketRecord, ...] = ()
    reports: tuple[ReportRecord, ...] = ()
    workload_records: tuple[WorkloadRecordEntry, ...] = ()
    baselines: tuple[BaselineRecord, ...] = ()
    nodes: Mapping[str, str] = field(default_factory=dict)
    """Every Node in the cluster by name, with the fingerprint it carries ("" none)."""
    unreadable: tuple[Unreadable, ...] = ()


@dataclass(frozen=True, slots=True)
class Deletion:
    """One object to delete, with the reason a person reads in the log."""

    kind: HistoryKind
    name: str
    why: str
    namespace: str = ""
    resource_version: str = ""
    """The version the decision was made from: the delete is refused if it moved."""


@dataclass(frozen=True)
class RetentionPlan:
    """What one sweep deletes, what it left alone and could not read, and how many
    objects of each kind stay."""

    deletions: tuple[Deletion, ...]
    kept: Mapping[HistoryKind, int]
    unreadable: tuple[Unreadable, ...]

    def counts(self) -> Counter[str]:
        """Deletions per kind (the sweep's summary line)."""
        return Counter(d.kind.value for d in self.deletions)


def _iso(at: dt.datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def _span(length: dt.timedelta) -> str:
    """``30d`` or ``36h`` (the settings are in days; tests use hours)."""
    if length % dt.timedelta(days=1) == dt.timedelta(0):
        return f"{length.days}d"
    return f"{length / dt.timedelta(hours=1):g}h"


def plan_retention(history: History, limits: RetentionLimits, now: dt.datetime) -> RetentionPlan:
    """The objects to delete now (see the module docstring for the rules)."""
    deletions: list[Deletion] = []
    kept: Counter[HistoryKind] = Counter()
    for kind, found in (
        (HistoryKind.TEST, _tests(history, limits, now)),
        (HistoryKind.TICKET, _tickets(history, limits, now)),
        (HistoryKind.REPORT, _reports(history, limits, now)),
        (HistoryKind.WORKLOAD_RECORD, _workload_records(history, limits, now)),
        (HistoryKind.BASELINE, _baselines(history, limits, now)),
    ):
        gone, total = found
        deletions.extend(gone)
        kept[kind] = total - len(gone)
    for bad in history.unreadable:
        kept[bad.kind] += 1
    return RetentionPlan(tuple(deletions), dict(kept), history.unreadable)


def _tests(
    history: History, limits: RetentionLimits, now: dt.datetime
) -> tuple[list[Deletion], int]:
    evidence = {
        name
        for ticket in history.tickets
        if ticket.phase in OPEN_TICKET_PHASES
        for name in ticket.evidence
    }
    by_node: dict[str, list[TestRecord]] = {}
    for test in history.tests:
        by_node.setdefault(test.node, []).append(test)
    cutoff = now - limits.tests_age
    gone: list[Deletion] = []
    for node, tests in by_node.items():
        newest_first = sorted(tests, key=lambda t: (t.created, t.name), reverse=True)
        last_pass = next((t.name for t in newest_first if t.passed), None)
        for rank, test in enumerate(newest_first):
            if (
                rank < limits.tests_per_node
                or test.created >= cutoff
                or not test.finished
                or test.name == last_pass
                or test.name in evidence
            ):
                continue
            gone.append(
                Deletion(
                    HistoryKind.TEST,
                    test.name,
                    f"finished test of node {node or '(none)'} created {_iso(test.created)}, "
                    f"older than {_span(limits.tests_age)} and not among its newest "
                    f"{limits.tests_per_node}",
                    resource_version=test.resource_version,
                )
            )
    return gone, len(history.tests)


def _tickets(
    history: History, limits: RetentionLimits, now: dt.datetime
) -> tuple[list[Deletion], int]:
    cutoff = now - limits.closed_tickets_age
    gone: list[Deletion] = []
    for ticket in history.tickets:
        closed = ticket.closed_at or ticket.created
        if closed >= cutoff:
            continue
        if ticket.phase == "Closed":
            why = f"closed {_iso(closed)}, more than {_span(limits.closed_tickets_age)} ago"
        elif ticket.phase == "Retired" and ticket.node not in history.nodes:
            why = (
                f"retired {_iso(closed)}, more than {_span(limits.closed_tickets_age)} ago, and "
                f"node {ticket.node} has left the cluster"
            )
        else:
            continue
        gone.append(
            Deletion(HistoryKind.TICKET, ticket.name, why, resource_version=ticket.resource_version)
        )
    return gone, len(history.tickets)


def _reports(
    history: History, limits: RetentionLimits, now: dt.datetime
) -> tuple[list[Deletion], int]:
    cutoff = now - limits.reports_age
    gone = [
        Deletion(
            HistoryKind.REPORT,
            report.name,
            f"made {_iso(report.created)}, more than {_span(limits.reports_age)} ago",
            namespace=report.namespace,
            resource_version=report.resource_version,
        )
        for report in history.reports
        if report.created < cutoff and not (report.awaits_outcome and report.node in history.nodes)
    ]
    return gone, len(history.reports)


def _workload_records(
    history: History, limits: RetentionLimits, now: dt.datetime
) -> tuple[list[Deletion], int]:
    cutoff = now - limits.reports_age
    gone = [
        Deletion(
            HistoryKind.WORKLOAD_RECORD,
            record.name,
            f"node {record.node} has left the cluster; last activity "
            f"{_iso(record.last_active)}, more than {_span(limits.reports_age)} ago",
            resource_version=record.resource_version,
        )
        for record in history.workload_records
        if record.node not in history.nodes and record.last_active < cutoff
    ]
    return gone, len(history.workload_records)


def _baselines(
    history: History, limits: RetentionLimits, now: dt.datetime
) -> tuple[list[Deletion], int]:
    cutoff = now - limits.baselines_age
    # A node carries a fingerprint while it is qualified under it (its annotation), and
    # while any test of it that is kept ran under it: a node quarantined for repair has
    # lost its annotation, and its verification needs the baseline all the same.
    carried = {fp for fp in history.nodes.values() if fp} | {
        t.fingerprint for t in history.tests if t.fingerprint and t.node in history.nodes
    }
    recently_used = {t.fingerprint for t in history.tests if t.fingerprint and t.created >= cutoff}
    gone = [
        Deletion(
            HistoryKind.BASELINE,
            baseline.name,
            f"no node carries fingerprint {baseline.fingerprint[:12]} and no test ran under "
            f"it in the last {_span(limits.baselines_age)}",
            resource_version=baseline.resource_version,
        )
        for baseline in history.baselines
        if baseline.created < cutoff
        and not _carried(baseline.fingerprint, carried)
        and not _carried(baseline.fingerprint, recently_used)
    ]
    return gone, len(history.baselines)


def _carried(fingerprint: str, hashes: Iterable[str]) -> bool:
    """A node's annotation or a test may hold the hash or its short form."""
    return any(fingerprint.startswith(h) or h.startswith(fingerprint) for h in hashes)
