"""Retention: the planner's rules row by row (time injected), and the sweeper with a
fake API (rate limit, preconditions, dry run, counters, unreadable objects)."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

import orjson
import pytest
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from sdcguard.adapters.pass_state import TestSnapshot
from sdcguard.adapters.retention import (
    RetentionSweeper,
    TokenBucket,
    baseline_record,
    read_history,
    report_record,
    sdctest_record,
    workload_record_entry,
)
from sdcguard.domain.observed import NodeSnapshot
from sdcguard.domain.retention import (
    BaselineRecord,
    History,
    HistoryKind,
    ReportRecord,
    RetentionLimits,
    TestRecord,
    TicketRecord,
    Unreadable,
    WorkloadRecordEntry,
    plan_retention,
)
from sdcguard.metrics import Metrics
from sdcguard.settings import Settings

NOW = dt.datetime(2027, 6, 1, tzinfo=dt.UTC)
DAY = dt.timedelta(days=1)
LIMITS = RetentionLimits(
    tests_per_node=3,
    tests_age=30 * DAY,
    closed_tickets_age=365 * DAY,
    reports_age=30 * DAY,
    baselines_age=30 * DAY,
)


def history_of(node: str, ages_days: list[int], **kw: Any) -> tuple[TestRecord, ...]:
    return tuple(
        TestRecord(f"{node}-t{i}", node, NOW - age * DAY, **kw) for i, age in enumerate(ages_days)
    )


def deleted(history: History, limits: RetentionLimits = LIMITS) -> set[str]:
    return {d.name for d in plan_retention(history, limits, NOW).deletions}


# The planner, row by row ------------------------------------------------------


@pytest.mark.parametrize(
    ("ages", "gone"),
    [
        ([1, 2, 3], set()),  # the newest three
        ([40, 50, 60, 70, 80], {"n-t3", "n-t4"}),  # beyond three and older than 30 days
        ([1, 2, 3, 4, 5, 40], {"n-t5"}),  # younger than 30 days stays, however many
        ([400], set()),  # one test, however old
    ],
)
def test_tests_keep_newest_n_and_younger_than_t(ages: list[int], gone: set[str]) -> None:
    assert deleted(History(tests=history_of("n", ages), nodes={"n": ""})) == gone


def test_running_test_last_pass_and_open_ticket_evidence_are_kept() -> None:
    old = history_of("n", [40, 50, 60, 70, 80, 90])
    tests = (
        *old[:3],
        TestRecord("n-running", "n", NOW - 70 * DAY, finished=False),
        TestRecord("n-lastpass", "n", NOW - 80 * DAY, passed=True),
        TestRecord("n-evidence", "n", NOW - 90 * DAY),
        TestRecord("n-closedevidence", "n", NOW - 95 * DAY),
        TestRecord("n-olderpass", "n", NOW - 99 * DAY, passed=True),
    )
    tickets = (
        TicketRecord("tk-open", "n", NOW - 90 * DAY, "InRepair", evidence=("n-evidence",)),
        TicketRecord(
            "tk-closed",
            "n",
            NOW - 95 * DAY,
            "Closed",
            closed_at=NOW - DAY,
            evidence=("n-closedevidence",),
        ),
    )
    assert deleted(History(tests=tests, tickets=tickets, nodes={"n": ""})) == {
        "n-closedevidence",
        "n-olderpass",
    }


@pytest.mark.parametrize(
    ("phase", "closed_days", "node_exists", "gone"),
    [
        ("Closed", 400, True, True),
        ("Closed", 100, True, False),  # closed recently enough
        ("Open", 900, True, False),  # never an open one
        ("Acknowledged", 900, False, False),
        ("InRepair", 900, True, False),
        ("Verifying", 900, True, False),
        ("", 900, True, False),  # status not written yet
        ("Retired", 900, True, False),  # the retired node's state
        ("Retired", 900, False, True),  # its node left the cluster
    ],
)
def test_tickets(phase: str, closed_days: int, node_exists: bool, gone: bool) -> None:
    at = NOW - closed_days * DAY
    ticket = TicketRecord("tk", "n", at - DAY, phase, closed_at=at)
    history = History(tickets=(ticket,), nodes={"n": ""} if node_exists else {})
    assert deleted(history) == ({"tk"} if gone else set())


@pytest.mark.parametrize(
    ("age", "awaits", "node_exists", "gone"),
    [
        (40, False, True, True),
        (10, False, True, False),
        (40, True, True, False),  # still followed
        (40, True, False, True),  # its node is gone: nothing left to follow
    ],
)
def test_reports(age: int, awaits: bool, node_exists: bool, gone: bool) -> None:
    report = ReportRecord("team", "r", "n", NOW - age * DAY, awaits_outcome=awaits)
    plan = plan_retention(
        History(reports=(report,), nodes={"n": ""} if node_exists else {}), LIMITS, NOW
    )
    assert [(d.namespace, d.name) for d in plan.deletions] == ([("team", "r")] if gone else [])


@pytest.mark.parametrize(
    ("node_exists", "active_days", "gone"),
    [(True, 400, False), (False, 10, False), (False, 40, True)],
)
def test_workload_records(node_exists: bool, active_days: int, gone: bool) -> None:
    record = WorkloadRecordEntry("n", "n", NOW - active_days * DAY)
    history = History(workload_records=(record,), nodes={"n": ""} if node_exists else {})
    assert deleted(history) == ({"n"} if gone else set())


@pytest.mark.parametrize(
    ("node_fp", "test_fp_age", "created_days", "gone"),
    [
        ("aaaa1111", None, 90, False),  # a node carries it (short hash)
        ("bbbb", None, 90, True),  # nobody carries it
        ("bbbb", 10, 90, False),  # a test ran under it lately
        ("bbbb", 40, 90, True),  # long ago, by a node that left the cluster
        ("bbbb", None, 10, False),  # made lately (consensus still collecting)
    ],
)
def test_baselines(node_fp: str, test_fp_age: int | None, created_days: int, gone: bool) -> None:
    fp = "aaaa1111" + "0" * 56
    tests = (
        ()
        if test_fp_age is None
        else (TestRecord("t", "other", NOW - test_fp_age * DAY, fingerprint=fp),)
    )
    baseline = BaselineRecord("fp-aaaa", fp, NOW - created_days * DAY)
    history = History(tests=tests, baselines=(baseline,), nodes={"n": node_fp})
    assert ("fp-aaaa" in deleted(history)) == gone


def test_a_baseline_stays_while_a_node_under_repair_last_ran_under_it() -> None:
    """Quarantine revokes the node's fingerprint annotation; its verification still
    needs the baseline, however long the repair takes."""
    fp = "aaaa1111" + "0" * 56
    old_test = TestRecord("t", "n", NOW - 200 * DAY, fingerprint=fp)
    baseline = BaselineRecord("fp-aaaa", fp, NOW - 300 * DAY)
    history = History(tests=(old_test,), baselines=(baseline,), nodes={"n": ""})
    assert deleted(history) == set()


def test_unreadable_objects_are_never_deleted_and_are_counted() -> None:
    bad = Unreadable(HistoryKind.TEST, "broken", "status.phase: not a phase")
    plan = plan_retention(
        History(tests=history_of("n", [40, 50, 60, 70]), unreadable=(bad,)), LIMITS, NOW
    )
    assert plan.unreadable == (bad,)
    assert "broken" not in {d.name for d in plan.deletions}
    assert plan.kept[HistoryKind.TEST] == 4  # three kept plus the unreadable one


def test_limits_refuse_zero() -> None:
    with pytest.raises(ValueError, match="tests_per_node"):
        RetentionLimits(tests_per_node=0)
    with pytest.raises(ValueError, match="reports_age"):
        RetentionLimits(reports_age=dt.timedelta(0))


@pytest.mark.parametrize(
    "env",
    [
        {"SDCGUARD_RETENTION_TESTS_PER_NODE": "0"},
        {"SDCGUARD_RETENTION_TESTS_DAYS": "-1"},
        {"SDCGUARD_RETENTION_CLOSED_TICKETS_DAYS": "0"},
        {"SDCGUARD_RETENTION_DELETES_PER_SECOND": "0"},
    ],
)
def test_settings_refuse_zero_or_negative(env: dict[str, str], monkeypatch: Any) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValidationError, match=next(iter(env)).removeprefix("SDCGUARD_").lower()):
        Settings()


def test_settings_defaults() -> None:
    limits = Settings().retention_limits()
    assert limits == RetentionLimits()
    assert (limits.tests_per_node, limits.tests_age, limits.closed_tickets_age) == (
        10,
        30 * DAY,
        365 * DAY,
    )


# Reading bodies ---------------------------------------------------------------


def sdctest_body(name: str, node: str, phase: Any = "Passed") -> dict[str, Any]:
    return {
        "apiVersion": "sdcguard.dev/v1alpha1",
        "kind": "SDCTest",
        "metadata": {
            "name": name,
            "resourceVersion": "7",
            "creationTimestamp": "2027-01-01T00:00:00Z",
        },
        "spec": {"nodeName": node, "policyRef": "p", "suite": "acceptance", "reason": "Join"},
        "status": {"phase": phase},
    }


def test_an_unparseable_test_is_named_not_read() -> None:
    good = sdctest_record(TestSnapshot.slim(sdctest_body("ok", "n")))
    bad = sdctest_record(TestSnapshot.slim(sdctest_body("broken", "n", phase="Exploded")))
    assert isinstance(good, TestRecord) and good.passed and good.node == "n"
    assert isinstance(bad, Unreadable) and bad.name == "broken" and "phase" in bad.error


def test_listed_kinds_read_or_named() -> None:
    assert isinstance(report_record({"metadata": {"name": "r"}, "spec": {}}), Unreadable)
    assert isinstance(workload_record_entry({"metadata": {"name": "w"}}), Unreadable)
    assert isinstance(baseline_record({"metadata": {"name": "b"}, "spec": {}}), Unreadable)
    record = workload_record_entry(
        {
            "apiVersion": "sdcguard.dev/v1alpha1",
            "kind": "WorkloadRecord",
            "metadata": {"name": "n", "creationTimestamp": "2027-01-01T00:00:00Z"},
            "spec": {"nodeName": "n"},
            "status": {"idleSince": "2027-03-01T00:00:00Z"},
        }
    )
    assert isinstance(record, WorkloadRecordEntry)
    assert record.last_active == dt.datetime(2027, 3, 1, tzinfo=dt.UTC)


# The sweeper ------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds


def test_token_bucket_limits_the_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=10, burst=2, clock=clock, sleep=clock.sleep)
    for _ in range(22):
        bucket.take()
    # Two at once, then one every 0.1 s.
    assert clock.t == pytest.approx(2.0)


class FakeCustom:
    def __init__(self, refuse: Mapping[str, int] | None = None) -> None:
        self.deleted: list[tuple[str, str, str, str | None]] = []
        self.refuse = dict(refuse or {})

    def delete_cluster_custom_object(
        self, group: str, version: str, plural: str, name: str, body: Any
    ) -> None:
        self._delete("", plural, name, body)

    def delete_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str, body: Any
    ) -> None:
        self._delete(namespace, plural, name, body)

    def _delete(self, namespace: str, plural: str, name: str, body: Any) -> None:
        if name in self.refuse:
            raise ApiException(status=self.refuse[name])
        rv = body.preconditions.resource_version if body.preconditions else None
        self.deleted.append((namespace, plural, name, rv))


class FakeWriter:
    def __init__(self, custom: FakeCustom, dry_run: bool = False) -> None:
        self.custom = custom
        self.dry_run = dry_run
        self.allowed: list[str] = []

    def allow(self, kind: str) -> bool:
        self.allowed.append(kind)
        return not self.dry_run


def sweeper(history: History, custom: FakeCustom, dry_run: bool = False) -> RetentionSweeper:
    clock = FakeClock()
    return RetentionSweeper(
        writer=FakeWriter(custom, dry_run),  # type: ignore[arg-type]
        metrics=Metrics(),
        limits=LIMITS,
        bucket=TokenBucket(5, 1, clock=clock, sleep=clock.sleep),
        read=lambda: history,
        clock=lambda: NOW,
    )


HISTORY = History(
    tests=tuple(
        TestRecord(f"t{i}", "n", NOW - (40 + i) * DAY, resource_version=f"rv{i}") for i in range(6)
    ),
    reports=(ReportRecord("team", "r", "n", NOW - 40 * DAY, resource_version="r1"),),
    nodes={"n": ""},
    unreadable=(Unreadable(HistoryKind.TICKET, "mangled", "status.phase: bad"),),
)


def value(metrics: Metrics, name: str, **labels: str) -> float:
    found = metrics.registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


def test_sweep_deletes_with_preconditions_counts_and_rate_limits() -> None:
    custom = FakeCustom(refuse={"t4": 409, "t5": 404})
    sweep = sweeper(HISTORY, custom)
    done = sweep.sweep()
    assert custom.deleted == [
        ("", "sdctests", "t3", "rv3"),
        ("team", "sdcreports", "r", "r1"),
    ]
    assert done == {"sdctests-deleted": 1, "sdctests-changed": 1, "sdctests-gone": 1,
                    "sdcreports-deleted": 1}  # fmt: skip
    m = sweep.metrics
    assert value(m, "sdcguard_retention_deleted_total", kind="sdctests") == 1
    assert value(m, "sdcguard_retention_deleted_total", kind="sdcreports") == 1
    assert value(m, "sdcguard_retention_objects", kind="sdctests") == 3
    assert value(m, "sdcguard_retention_unreadable_objects", kind="repairtickets") == 1
    # Four deletes at five a second, one at once: 0.6 s of waiting.
    assert sweep.bucket.clock() == pytest.approx(0.6)


def test_dry_run_deletes_nothing() -> None:
    custom = FakeCustom()
    sweep = sweeper(HISTORY, custom, dry_run=True)
    assert sweep.sweep() == {"sdctests-dry-run": 3, "sdcreports-dry-run": 1}
    assert custom.deleted == []
    assert value(sweep.metrics, "sdcguard_retention_deleted_total", kind="sdctests") == 0


def test_a_stopped_sweep_stops_deleting() -> None:
    stop = threading.Event()
    stop.set()
    custom = FakeCustom()
    assert sweeper(HISTORY, custom).sweep(stop) == {"stopped": 1}
    assert custom.deleted == []


def test_the_first_sweep_waits_for_the_first_pass_or_its_limit() -> None:
    """A start serves its fleet before it reads a year of history: the first sweep
    comes once the first full pass has ended; with no pass (no policy), after the
    limit all the same; a stop while waiting sweeps nothing."""

    def run(after: threading.Event, limit: float, stop: threading.Event) -> list[float]:
        sweeps: list[float] = []
        sweep = sweeper(HISTORY, FakeCustom())
        sweep.sweep = lambda stop=None: sweeps.append(time.monotonic()) or Counter()  # type: ignore[method-assign]
        threading.Thread(
            target=sweep.run,
            args=(stop, 60.0),
            kwargs={"after": after, "waiting_at_most": limit},
            daemon=True,
        ).start()
        return sweeps

    served, stop = threading.Event(), threading.Event()
    sweeps = run(served, 30.0, stop)
    time.sleep(0.3)
    assert sweeps == []  # no pass yet
    passed = time.monotonic()
    served.set()
    deadline = time.monotonic() + 5
    while not sweeps and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sweeps and sweeps[0] >= passed
    stop.set()

    never, stop = threading.Event(), threading.Event()
    started = time.monotonic()
    sweeps = run(never, 0.4, stop)
    deadline = time.monotonic() + 5
    while not sweeps and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sweeps and sweeps[0] - started >= 0.4
    stop.set()

    stop = threading.Event()
    sweeps = run(threading.Event(), 30.0, stop)
    stop.set()
    time.sleep(0.8)
    assert sweeps == []


def test_read_history_from_copy_and_lists() -> None:
    class Copy:
        def tests(self) -> list[TestSnapshot]:
            return [
                TestSnapshot.slim(sdctest_body("ok", "n")),
                TestSnapshot.slim(sdctest_body("broken", "n", phase="Exploded")),
            ]

        def tickets(self) -> list[Any]:
            return []

        def nodes(self) -> list[NodeSnapshot]:
            return [
                NodeSnapshot.from_body(
                    {"metadata": {"name": "n", "annotations": {"sdcguard.dev/fingerprint": "ab"}}}
                )
            ]

        def unreadable(self) -> list[Unreadable]:
            return [Unreadable(HistoryKind.TICKET, "left-out", "TypeError")]

    history = read_history(Copy(), lambda plural: [])
    assert [t.name for t in history.tests] == ["ok"]
    assert [u.name for u in history.unreadable] == ["left-out", "broken"]
    assert history.nodes == {"n": "ab"}


def test_the_mirror_skips_counts_and_names_an_object_its_slim_cannot_read() -> None:
    """A body the operator cannot read (here one ``trim_test`` raises on: a phase that
    is a list, as an older schema could have stored) is left out of the copy, the list
    completes, and the object is named in the mirror's stats until it is deleted."""
    from sdcguard.runtime.mirror import Mirror, cluster_custom

    mirror: Mirror[TestSnapshot] = Mirror(
        api=None,  # type: ignore[arg-type]
        kind=cluster_custom("sdcguard.dev", "v1alpha1", "sdctests"),
        slim=TestSnapshot.slim,
    )
    good, bad = sdctest_body("ok", "n"), sdctest_body("broken", "n", phase=["x"])
    mirror._get_raw = lambda **_: orjson.dumps(  # type: ignore[method-assign]
        {"metadata": {"resourceVersion": "9"}, "items": [good, bad]}
    )
    mirror.relist(threading.Event())
    assert mirror.synced.is_set() and list(mirror.items()) == ["ok"]
    assert list(mirror.stats.unreadable) == ["broken"]
    assert "unhashable" in mirror.stats.unreadable["broken"]
    mirror._event({"type": "DELETED", "object": bad})
    assert mirror.stats.unreadable == {}


def test_after_a_prune_test_names_still_never_repeat() -> None:
    """Names come from the node's counter with a floor taken from its finished tests
    (``seq_floor``): a mangled counter is raised past every finished test's number.
    Retention keeps the newest tests, so the floor after a prune is the floor before."""
    from sdcguard.adapters.observations import seq_floor
    from sdcguard.adapters.pass_state import FleetView
    from sdcguard.domain import keys
    from sdcguard.domain.observed import NodeFacts

    uid = "abcde-0000"
    snaps = []
    for seq in range(1, 31):
        body = sdctest_body(f"n-{uid[:5]}-{seq}", "n")
        body["metadata"]["creationTimestamp"] = f"2027-01-01T00:{seq:02d}:00Z"
        snaps.append(TestSnapshot.slim(body))
    records = [r for r in map(sdctest_record, snaps) if isinstance(r, TestRecord)]
    plan = plan_retention(History(tests=tuple(records), nodes={"n": ""}), LIMITS, NOW)
    gone = {d.name for d in plan.deletions}
    assert len(gone) == 30 - LIMITS.tests_per_node
    node = NodeFacts(name="n", uid=uid, annotations={keys.SEQ: "junk"})
    view = FleetView(nodes={})

    def floor(kept: list[TestSnapshot]) -> str:
        known = [s.known for s in kept if s.known is not None]
        return seq_floor(node, known, view).annotations[keys.SEQ]

    assert floor([s for s in snaps if s.name not in gone]) == floor(snaps) == "30"
