"""Retention's sweeps: read the history, let ``domain.retention`` decide, delete.

One sweep every ``retention_interval_seconds``, on the leader only (its writes are
fenced by the Lease like every other). The SDCTests, RepairTickets and Nodes come
from the operator's copy (no list of its own); SDCReports, WorkloadRecords and
SDCBaselines, which the copy does not hold, are listed page by page.

Deletes are rate-limited by a token bucket (``retention_deletes_per_second``), so a
first sweep over a year of history does not compete with the reconcile for the API
server: 800,000 tests at 20 a second take 11 hours, and the sweep says so in its log
line as it goes. Each delete carries the resourceVersion the decision was made from
as a precondition: an object that changed since (a ticket reopened, a test adopted)
is refused by the server (409) and looked at again by the next sweep.

``dry_run`` reaches every delete (``KubeWriter.allow``): the sweep logs what it
would delete and deletes nothing. Each sweep returns a counter of what it did,
logged as one line and exported as ``sdcguard_retention_deleted_total{kind}``; the
objects held per kind and the unreadable ones are gauges.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from sdcguard.adapters.kube import KubeWriter
from sdcguard.adapters.observe import TicketSnapshot
from sdcguard.adapters.pass_state import TestSnapshot
from sdcguard.api import GROUP, VERSION, SDCBaseline
from sdcguard.api.common import parse_time
from sdcguard.api.report import ReportPhase, SDCReport
from sdcguard.api.sdctest import SDCTestPhase
from sdcguard.api.workloads import WorkloadRecord
from sdcguard.domain import keys
from sdcguard.domain.observed import NodeSnapshot
from sdcguard.domain.retention import (
    BaselineRecord,
    Deletion,
    History,
    HistoryKind,
    ReportRecord,
    RetentionLimits,
    RetentionPlan,
    TestRecord,
    TicketRecord,
    Unreadable,
    WorkloadRecordEntry,
    plan_retention,
)
from sdcguard.metrics import Metrics
from sdcguard.runtime.mirror import Mirror
from sdcguard.settings import Settings

log = structlog.get_logger("sdcguard.retention")

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
NAMED_IN_LOG = 20
"""Unreadable objects named in a sweep's log line (the count is always whole)."""


class TokenBucket:
    """At most ``rate`` takes a second on average, ``burst`` at once; time and sleep
    are passed in (tests run it without waiting)."""

    def __init__(
        self,
        rate: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("a token bucket needs rate > 0 and burst >= 1")
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self.sleep = sleep
        self.tokens = float(burst)
        self.stamp = clock()

    def take(self) -> None:
        """Take a token, first waiting for it if there is none (a token owed is a debt
        the wait pays off: no loop, so no float that never quite reaches one)."""
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        self.tokens -= 1
        if self.tokens < 0:
            self.sleep(-self.tokens / self.rate)


# Reading ------------------------------------------------------------------------


def sdctest_record(seen: TestSnapshot) -> TestRecord | Unreadable:
    """An SDCTest of the copy as retention reads it."""
    known = seen.known
    if known is None:
        return Unreadable(HistoryKind.TEST, seen.name, seen.error)
    facts = known.facts
    return TestRecord(
        name=seen.name,
        node=seen.node_name,
        created=known.created,
        resource_version=seen.resource_version,
        finished=facts.finished,
        passed=facts.phase == SDCTestPhase.PASSED,
        fingerprint=facts.fingerprint,
    )


def ticket_record(seen: TicketSnapshot) -> TicketRecord | Unreadable:
    """A RepairTicket of the copy as retention reads it."""
    ticket = seen.ticket
    if ticket is None:
        return Unreadable(HistoryKind.TICKET, seen.name, "does not validate")
    status = ticket.status
    created = seen.created or EPOCH
    closed = None
    if status is not None:
        closed = status.closed_at or max((h.time for h in status.history), default=None)
    return TicketRecord(
        name=seen.name,
        node=seen.node_name,
        created=created,
        phase=seen.phase,
        resource_version=seen.resource_version,
        closed_at=closed,
        evidence=tuple(ticket.spec.evidence),
    )


def _meta(body: Mapping[str, Any]) -> tuple[str, str, str, dt.datetime]:
    meta = body.get("metadata") or {}
    when = parse_time(meta.get("creationTimestamp")) or EPOCH
    return (
        str(meta.get("namespace") or ""),
        str(meta.get("name") or ""),
        str(meta.get("resourceVersion") or ""),
        when,
    )


def report_record(body: Mapping[str, Any]) -> ReportRecord | Unreadable:
    namespace, name, version, created = _meta(body)
    try:
        report = SDCReport.model_validate(body)
    except ValidationError as exc:
        return Unreadable(HistoryKind.REPORT, name, str(exc)[:300], namespace)
    status = report.status
    return ReportRecord(
        namespace=namespace,
        name=name,
        node=report.spec.node_name,
        created=created,
        resource_version=version,
        awaits_outcome=status is not None
        and status.phase == ReportPhase.ACCEPTED
        and status.outcome is None,
    )


def workload_record_entry(body: Mapping[str, Any]) -> WorkloadRecordEntry | Unreadable:
    _, name, version, created = _meta(body)
    try:
        record = WorkloadRecord.model_validate(body)
    except ValidationError as exc:
        return Unreadable(HistoryKind.WORKLOAD_RECORD, name, str(exc)[:300])
    status = record.status
    times = [created]
    if status is not None:
        times += [t for t in (status.since, status.idle_since, status.dropped_until) if t]
        for workload in status.workloads:
            times += [t for t in (workload.first_seen, workload.last_seen) if t]
    return WorkloadRecordEntry(name, record.spec.node_name, max(times), version)


def baseline_record(body: Mapping[str, Any]) -> BaselineRecord | Unreadable:
    _, name, version, created = _meta(body)
    try:
        baseline = SDCBaseline.model_validate(body)
    except ValidationError as exc:
        return Unreadable(HistoryKind.BASELINE, name, str(exc)[:300])
    return BaselineRecord(name, baseline.spec.fingerprint.hash, created, version)


def split(found: Iterable[Any]) -> tuple[list[Any], list[Unreadable]]:
    """Readable records apart from the unreadable ones."""
    good: list[Any] = []
    bad: list[Unreadable] = []
    for item in found:
        (bad if isinstance(item, Unreadable) else good).append(item)
    return good, bad


class Copy(Protocol):
    """What retention reads from the operator's copy (``adapters.inventory``)."""

    def tests(self) -> Iterable[TestSnapshot]: ...

    def tickets(self) -> Iterable[TicketSnapshot]: ...

    def nodes(self) -> Iterable[NodeSnapshot]: ...

    def unreadable(self) -> Iterable[Unreadable]:
        """Objects the copy left out because they could not be read at all."""
        ...


@dataclass(frozen=True)
class MirroredCopy:
    """The :class:`Copy` of the operator's mirrors (``Inventory.tests``, ``.tickets``,
    ``.nodes``): read, never listed again."""

    tests_mirror: Mirror[TestSnapshot]
    tickets_mirror: Mirror[TicketSnapshot]
    nodes_mirror: Mirror[NodeSnapshot]

    def tests(self) -> Iterable[TestSnapshot]:
        return self.tests_mirror.items().values()

    def tickets(self) -> Iterable[TicketSnapshot]:
        return self.tickets_mirror.items().values()

    def nodes(self) -> Iterable[NodeSnapshot]:
        return self.nodes_mirror.items().values()

    def unreadable(self) -> Iterable[Unreadable]:
        for kind, mirror in (
            (HistoryKind.TEST, self.tests_mirror),
            (HistoryKind.TICKET, self.tickets_mirror),
        ):
            for key, error in dict(mirror.stats.unreadable).items():
                yield Unreadable(kind, key, error)


def list_custom(
    api: client.ApiClient, plural: str, page_size: int = 500
) -> Iterator[Mapping[str, Any]]:
    """Every object of one of our kinds (cluster-wide, namespaced ones too), by pages."""
    custom = client.CustomObjectsApi(api)
    token: str | None = None
    while True:
        kwargs: dict[str, Any] = {"limit": page_size}
        if token:
            kwargs["_continue"] = token
        page: Any = custom.list_cluster_custom_object(GROUP, VERSION, plural, **kwargs)
        yield from page.get("items") or []
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return


def read_history(copy: Copy, listed: Callable[[str], Iterable[Mapping[str, Any]]]) -> History:
    """The history as retention sees it: the copy's tests, tickets and nodes, and the
    listed reports, workload records and baselines."""
    tests, bad_tests = split(sdctest_record(t) for t in copy.tests())
    tickets, bad_tickets = split(ticket_record(t) for t in copy.tickets())
    reports, bad_reports = split(report_record(b) for b in listed(HistoryKind.REPORT.value))
    records, bad_records = split(
        workload_record_entry(b) for b in listed(HistoryKind.WORKLOAD_RECORD.value)
    )
    baselines, bad_baselines = split(baseline_record(b) for b in listed(HistoryKind.BASELINE.value))
    return History(
        tests=tuple(tests),
        tickets=tuple(tickets),
        reports=tuple(reports),
        workload_records=tuple(records),
        baselines=tuple(baselines),
        nodes={n.name: n.annotations.get(keys.FINGERPRINT, "") for n in copy.nodes()},
        unreadable=(
            *copy.unreadable(),
            *bad_tests,
            *bad_tickets,
            *bad_reports,
            *bad_records,
            *bad_baselines,
        ),
    )


# Acting -------------------------------------------------------------------------


@dataclass
class RetentionSweeper:
    """Deletes what :func:`~sdcguard.domain.retention.plan_retention` says, rate-limited."""

    writer: KubeWriter
    metrics: Metrics
    limits: RetentionLimits
    bucket: TokenBucket
    read: Callable[[], History]
    clock: Callable[[], dt.datetime]
    last: Counter[str] = field(default_factory=Counter)
    """The last sweep's counter (for tests and the log)."""

    def sweep(self, stop: threading.Event | None = None) -> Counter[str]:
        """One sweep: plan at ``clock()``, then delete in the plan's order until done
        or ``stop`` is set. Returns what it did, per kind and outcome."""
        started = time.monotonic()
        plan = plan_retention(self.read(), self.limits, self.clock())
        self._gauges(plan)
        done: Counter[str] = Counter()
        for deletion in plan.deletions:
            if stop is not None and stop.is_set():
                done["stopped"] += 1
                break
            self.bucket.take()
            done[f"{deletion.kind.value}-{self._delete(deletion)}"] += 1
        self.last = done
        unreadable = plan.unreadable
        log.info(
            "retention sweep",
            planned=len(plan.deletions),
            seconds=round(time.monotonic() - started, 3),
            dry_run=self.writer.dry_run,
            kept={k.value: n for k, n in plan.kept.items()},
            unreadable=len(unreadable),
            unreadable_named=[_named(u) for u in unreadable[:NAMED_IN_LOG]],
            **{k.replace("-", "_"): v for k, v in sorted(done.items())},
        )
        return done

    def _gauges(self, plan: RetentionPlan) -> None:
        bad = Counter(u.kind for u in plan.unreadable)
        for kind in HistoryKind:
            self.metrics.retention_held.labels(kind=kind.value).set(plan.kept.get(kind, 0))
            self.metrics.retention_unreadable.labels(kind=kind.value).set(bad.get(kind, 0))

    def _delete(self, deletion: Deletion) -> str:
        """``deleted``, ``gone`` (already), ``changed`` (409: moved since the plan) or
        ``dry-run``; any other failure raises (the sweep ends; the next one retries)."""
        kind = deletion.kind.value
        if not self.writer.allow(f"retention-{kind}-delete"):
            log.info("dry-run: would delete", kind=kind, name=deletion.name, why=deletion.why)
            return "dry-run"
        options = client.V1DeleteOptions(
            preconditions=client.V1Preconditions(resource_version=deletion.resource_version)
            if deletion.resource_version
            else None
        )
        custom = self.writer.custom
        try:
            if deletion.namespace:
                custom.delete_namespaced_custom_object(
                    GROUP, VERSION, deletion.namespace, kind, deletion.name, body=options
                )
            else:
                custom.delete_cluster_custom_object(
                    GROUP, VERSION, kind, deletion.name, body=options
                )
        except ApiException as exc:
            if exc.status == 404:
                return "gone"
            if exc.status == 409:
                return "changed"
            raise
        self.metrics.retention_deleted.labels(kind=kind).inc()
        log.debug("retention deleted", kind=kind, name=deletion.name, why=deletion.why)
        return "deleted"

    def run(
        self,
        stop: threading.Event,
        interval: float,
        after: threading.Event | None = None,
        waiting_at_most: float = 0.0,
    ) -> None:
        """Sweep every ``interval`` seconds until ``stop`` (a thread's body); a failed
        sweep is logged and the next one tries again. Given ``after``, the first sweep
        comes once it is set or ``waiting_at_most`` seconds have gone by (the operator's
        first full pass: none comes without a policy, and history is pruned all the
        same)."""
        if after is not None:
            deadline = time.monotonic() + waiting_at_most
            while not after.wait(min(0.5, max(0.0, deadline - time.monotonic()))):
                if stop.is_set():
                    return
                if time.monotonic() >= deadline:
                    log.info("retention sweeps without a first pass", waited=waiting_at_most)
                    break
        while not stop.is_set():
            try:
                self.sweep(stop)
            except Exception as exc:  # the API server, the Lease: the next sweep retries
                log.warning("retention sweep failed", error=repr(exc)[:300])
            if stop.wait(interval):
                return


def _named(bad: Unreadable) -> str:
    where = f"{bad.namespace}/" if bad.namespace else ""
    return f"{bad.kind.value}/{where}{bad.name}: {bad.error[:120]}"


class _Inventory(Protocol):
    """The parts of ``adapters.inventory.Inventory`` retention reads."""

    tests: Mirror[TestSnapshot]
    tickets: Mirror[TicketSnapshot]
    nodes: Mirror[NodeSnapshot]


def retention_sweeper(
    settings: Settings,
    writer: KubeWriter,
    metrics: Metrics,
    inventory: _Inventory,
    clock: Callable[[], dt.datetime],
) -> RetentionSweeper:
    """The operator's sweeper: its copy's tests, tickets and nodes, the other kinds
    listed with the writer's client, the settings' limits and delete rate."""
    copy = MirroredCopy(inventory.tests, inventory.tickets, inventory.nodes)
    rate = settings.retention_deletes_per_second
    return RetentionSweeper(
        writer=writer,
        metrics=metrics,
        limits=settings.retention_limits(),
        bucket=TokenBucket(rate, burst=max(1, int(rate))),
        read=lambda: read_history(copy, lambda plural: list_custom(writer.api, plural)),
        clock=clock,
    )
