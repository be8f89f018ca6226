"""Leader election's guards that need no API server: the timing rules, refused at start
with a message naming the settings, and the writer's fence."""

from __future__ import annotations

import time

import pytest
from kubernetes import client
from pydantic import ValidationError

from sdcguard.adapters.kube import KubeWriter, NotLeading
from sdcguard.metrics import Metrics
from sdcguard.runtime.leader import LeaderElector
from sdcguard.settings import Settings


@pytest.mark.parametrize(
    ("duration", "deadline", "retry"),
    [(5, 5, 1), (4, 6, 1), (8, 1.1, 1), (8, 5, 0.5)],
)
def test_lease_timings_that_cannot_fence_are_refused(
    duration: int, deadline: float, retry: float
) -> None:
    """A leader must stop before a standby may start (deadline < duration), and the
    client's election needs 1 s <= retry and 1.2 x retry < deadline."""
    with pytest.raises(ValidationError):
        Settings(
            lease_duration_seconds=duration,
            renew_deadline_seconds=deadline,
            retry_period_seconds=retry,
        )
    with pytest.raises(ValueError, match="renew_deadline"):
        LeaderElector(
            client.ApiClient(),
            namespace="ns",
            name="lease",
            identity="me",
            lease_duration=duration,
            renew_deadline=deadline,
            retry_period=retry,
            on_lost=lambda: None,
        )


def test_the_defaults_fence() -> None:
    s = Settings()
    assert not s.leader_election
    assert 1.2 * s.retry_period_seconds < s.renew_deadline_seconds < s.lease_duration_seconds


def test_a_replica_that_does_not_lead_sends_no_write() -> None:
    """The fence is asked before every write; a refused one is neither counted as sent
    nor sent (any request would fail this unit test)."""
    leading = [False]
    writer = KubeWriter(api=client.ApiClient(), metrics=Metrics(), leading=lambda: leading[0])
    with pytest.raises(NotLeading, match="node-patch refused"):
        writer.patch_node("n1", {"metadata": {"labels": {"a": "b"}}})
    with pytest.raises(NotLeading):
        writer.create_custom("sdctests", {"metadata": {"name": "t"}})
    assert not writer.writes


def _elector() -> LeaderElector:
    """An elector of the Lease ``ns/lease`` as ``me``, with valid timings."""
    return LeaderElector(
        client.ApiClient(),
        namespace="ns",
        name="lease",
        identity="me",
        lease_duration=8,
        renew_deadline=5,
        retry_period=1,
        on_lost=lambda: None,
    )


def test_an_elector_that_never_won_does_not_lead() -> None:
    elector = _elector()
    assert not elector.leading()
    elector.release()  # not elected: nothing to hand over, and no request


def test_a_lost_lease_stops_kopf_and_ends_the_process_only_if_kopf_does_not_stop() -> None:
    """The first call sets Kopf's stop flag and arms the backstop; a second call (the
    watchdog and the election both notice) arms nothing more; a Kopf that stopped in
    time disarms it, and one that did not ends the process."""
    import threading

    from sdcguard.runtime.terms import LostLease

    exits: list[float] = []
    ended = threading.Event()

    def exit_process() -> None:
        exits.append(1.0)
        ended.set()

    lost = LostLease(grace=0.2, exit_process=exit_process)
    assert not lost.happened
    lost()
    lost()
    assert lost.happened and lost.stop.is_set()
    assert ended.wait(5), "the backstop never fired"
    assert exits == [1.0]

    in_time = LostLease(grace=0.2, exit_process=exit_process)
    in_time()
    in_time.kopf_stopped()
    time.sleep(0.5)
    assert exits == [1.0]  # not a second time

    after = LostLease(grace=0.05, exit_process=exit_process)
    after.kopf_stopped()  # Kopf ended for another reason first (a SIGTERM)
    after()
    assert not after.happened


def test_a_standby_settles_its_heap_only_while_standing_by(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The warm copy of a standby is frozen out of the collector's scans every minute
    (here every 10 ms) while it stands by and has listed; never while it leads."""
    import threading
    import time
    import types

    from sdcguard.runtime import terms

    settled = threading.Semaphore(0)

    class FakeHeap:
        def __init__(self) -> None:
            self.settles = 0

        def install(self) -> None:
            pass

        def settle(self) -> dict[str, int]:
            self.settles += 1
            settled.release()
            return {}

    monkeypatch.setattr(terms, "Heap", FakeHeap)
    monkeypatch.setattr(terms, "STANDBY_SETTLE_SECONDS", 0.01)
    synced = threading.Event()
    memo = types.SimpleNamespace()
    standing_by = terms.settle_while_standing_by(memo, synced.is_set)
    assert isinstance(memo.heap, FakeHeap)
    standing_by.set()
    time.sleep(0.1)
    assert memo.heap.settles == 0, "not before the copy has listed"
    synced.set()
    assert settled.acquire(timeout=5), "at once when it has listed"
    assert settled.acquire(timeout=5), "and again after the interval"
    standing_by.clear()  # leading: the policy loop settles after its full passes
    time.sleep(0.05)
    before = memo.heap.settles
    time.sleep(0.1)
    assert memo.heap.settles == before


class _Leases:
    """The Lease calls a release makes: each replace answers from ``answers`` (an
    exception to raise, or None to apply it)."""

    def __init__(self, holder: str, answers: list[Exception | None]) -> None:
        self.holder: str | None = holder
        self.answers = answers
        self.replaced: list[str | None] = []

    def read_namespaced_lease(self, name: str, namespace: str) -> client.V1Lease:
        return client.V1Lease(spec=client.V1LeaseSpec(holder_identity=self.holder))

    def replace_namespaced_lease(self, name: str, namespace: str, lease: client.V1Lease) -> None:
        answer = self.answers.pop(0)
        if answer is not None:
            raise answer
        self.holder = lease.spec.holder_identity
        self.replaced.append(self.holder)


def _elected(leases: _Leases) -> LeaderElector:
    elector = _elector()
    elector._lock.api_instance = leases  # type: ignore[assignment]
    elector.elected.set()
    return elector


def test_a_release_that_meets_a_renewal_reads_the_lease_again() -> None:
    """A renewal sent before the release landed between its read and its replace (409):
    the release reads the Lease again and hands it over."""
    leases = _Leases("me", [client.ApiException(status=409), None])
    _elected(leases).release()
    assert leases.replaced == [None] and leases.holder is None and not leases.answers

    # A replace applied before its connection dropped comes back 409 on its retry; the
    # next read finds the Lease already handed over and writes nothing more.
    class Applied(_Leases):
        def replace_namespaced_lease(
            self, name: str, namespace: str, lease: client.V1Lease
        ) -> None:
            self.holder = None
            raise client.ApiException(status=409)

    applied = Applied("me", [])
    _elected(applied).release()
    assert applied.holder is None

    # Conflicts that do not end are given up after RELEASE_TRIES: the standby waits the
    # Lease out.
    stuck = _Leases("me", [client.ApiException(status=409)] * 3)
    _elected(stuck).release()
    assert stuck.holder == "me" and not stuck.answers
