"""The workload record and the blast radius, decided purely (domain.blast)."""

from __future__ import annotations

import datetime as dt

from sdcguard.api import MAX_WORKLOADS, WorkloadRecordStatus
from sdcguard.api.workloads import MAX_POD_NAMES
from sdcguard.domain.blast import LivePod, TopOwner, blast_radius, owner_message, update_record

T0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


def at(minutes: float) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


def job(name: str, ns: str = "team-a") -> TopOwner:
    return TopOwner(ns, "Job", name, "batch/v1", f"uid-{name}")


def pod(name: str, owner: TopOwner, minute: float, gpus: int = 8) -> LivePod:
    return LivePod(owner.namespace, name, owner, gpus, at(minute))


def test_a_pod_is_recorded_under_its_top_owner_while_it_runs_and_when_it_ends() -> None:
    train = job("train")
    running = update_record(WorkloadRecordStatus(), [pod("train-0", train, 1)], {}, None, at(2))
    [w] = running.workloads
    assert (w.namespace, w.kind, w.name, w.api_version) == ("team-a", "Job", "train", "batch/v1")
    assert w.running == ["train-0"] and w.last_seen is None and w.first_seen == at(1)
    assert w.accelerators == 8 and w.pod_count == 1
    assert running.idle_since is None
    ended = update_record(running, [], {("team-a", "train-0"): at(30)}, None, at(31))
    [w] = ended.workloads
    assert w.running == [] and w.last_seen == at(30)
    assert ended.idle_since == at(30)


def test_many_short_pods_of_one_owner_are_one_bounded_entry() -> None:
    sweep = job("sweep")
    record = WorkloadRecordStatus()
    for i in range(3_000):
        name = f"sweep-{i}"
        record = update_record(record, [pod(name, sweep, i * 0.01, 1)], {}, None, at(i * 0.01))
        record = update_record(record, [], {("team-a", name): at(i * 0.01 + 0.005)}, None, at(i))
    [w] = record.workloads
    assert w.pod_count == 3_000
    assert w.pods == [f"sweep-{i}" for i in range(3_000 - MAX_POD_NAMES, 3_000)]
    assert len(record.model_dump_json()) < 4096


def test_past_the_bound_the_oldest_ended_workloads_go_first_and_are_counted() -> None:
    record = WorkloadRecordStatus()
    for i in range(MAX_WORKLOADS + 10):
        owner = job(f"j{i}")
        record = update_record(record, [pod(f"j{i}-0", owner, i)], {}, None, at(i))
        record = update_record(record, [], {("team-a", f"j{i}-0"): at(i + 0.5)}, None, at(i + 0.5))
    keeper = job("still-running")
    record = update_record(record, [pod("keeper", keeper, 200)], {}, None, at(200))
    assert len(record.workloads) == MAX_WORKLOADS
    assert record.dropped == 11
    assert record.dropped_until == at(10.5)
    names = [w.name for w in record.workloads]
    assert "still-running" in names and "j0" not in names and "j11" in names


def test_more_workloads_at_once_than_the_bound_keep_the_oldest_and_count_nothing_twice() -> None:
    live = [pod(f"p{i}", job(f"j{i}"), i) for i in range(MAX_WORKLOADS + 6)]
    record = WorkloadRecordStatus()
    for minute in range(3):
        record = update_record(record, live, {}, None, at(100 + minute))
    assert [w.name for w in record.workloads] == [f"j{i}" for i in range(MAX_WORKLOADS)]
    assert record.dropped == 0 and all(w.pod_count == 1 for w in record.workloads)
    # The oldest ends: a waiting one takes its place.
    record = update_record(record, live[1:], {("team-a", "p0"): at(104)}, None, at(104))
    running = [w.name for w in record.workloads if w.running]
    assert len(running) == MAX_WORKLOADS and f"j{MAX_WORKLOADS}" in running
    assert record.dropped == 1 and record.dropped_until == at(104)


def test_a_running_workload_is_never_dropped_while_an_ended_one_is_left() -> None:
    record = WorkloadRecordStatus()
    first = job("oldest-but-running")
    record = update_record(record, [pod("a", first, 0)], {}, None, at(0))
    live = [pod("a", first, 0)]
    for i in range(MAX_WORKLOADS + 5):
        owner = job(f"short{i}")
        record = update_record(record, [*live, pod(f"s{i}", owner, i + 1)], {}, None, at(i + 1))
        record = update_record(record, live, {("team-a", f"s{i}"): at(i + 1.5)}, None, at(i + 2))
    assert "oldest-but-running" in [w.name for w in record.workloads]


def test_a_passing_screening_forgets_what_ended_before_it() -> None:
    old, new = job("before"), job("after")
    record = update_record(WorkloadRecordStatus(), [pod("b", old, 0)], {}, None, at(0))
    record = update_record(record, [], {("team-a", "b"): at(10)}, None, at(10))
    # The node passed at minute 60; a new workload came at minute 70.
    record = update_record(record, [pod("n", new, 70)], {}, at(60), at(70))
    assert [w.name for w in record.workloads] == ["after"]
    assert record.since == at(60)


def test_a_pod_recorded_running_that_vanished_while_no_one_watched_ended_when_seen_gone() -> None:
    train = job("train")
    record = update_record(WorkloadRecordStatus(), [pod("train-0", train, 0)], {}, None, at(0))
    later = update_record(record, [], {}, None, at(45))  # a restart: no stop was seen
    assert later.workloads[0].last_seen == at(45)
    assert later.idle_since == at(45)


def test_the_blast_radius_is_the_window_from_the_last_pass_to_the_failure() -> None:
    a, b = job("a"), TopOwner("team-b", "Pod", "lonely", "v1", None)
    record = update_record(WorkloadRecordStatus(), [pod("a-0", a, 0)], {}, None, at(0))
    record = update_record(record, [], {("team-a", "a-0"): at(5)}, None, at(5))
    record = update_record(record, [pod("lonely", b, 20, 2)], {}, at(10), at(20))
    radius = blast_radius(record, at(10), at(40))
    assert radius.window_start == at(10) and radius.window_end == at(40)
    assert [(w.namespace, w.kind, w.name) for w in radius.workloads] == [
        ("team-b", "Pod", "lonely")
    ]
    assert "2026-12-01T12:10:00Z" in radius.advice
    message = owner_message("gpu-7", radius, radius.workloads[0], "gpu-7-1")
    assert "gpu-7" in message and "gpu-7-1" in message and "12:10:00Z" in message
    assert "roll back to a checkpoint saved before 2026-12-01T12:10:00Z" in message


def test_a_note_about_the_owner_is_kept_and_cut() -> None:
    owner = TopOwner("team-a", "Job", "gone", "batch/v1", "u", "owner Job/gone was deleted" * 40)
    record = update_record(WorkloadRecordStatus(), [pod("p", owner, 0)], {}, None, at(0))
    note = record.workloads[0].note
    assert note is not None and len(note) <= 256 and "cut" in note
