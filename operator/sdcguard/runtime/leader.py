"""One active replica: leader election with a coordination.k8s.io Lease.

Two replicas of the operator may run (the chart's ``replicas: 2``). Both list and watch
Nodes and Pods from the start (the inventory's mirrors), so the standby's copy of the
fleet is warm; only the replica that holds the Lease starts Kopf, its handlers and
every write. Kopf's own peering was not used: it freezes a second operator while the
first runs and elects nobody, and it would not keep the standby's copy warm.

The election is the Kubernetes client's ``leaderelection`` with its ``LeaseLock``
(client-go's semantics), run on the operator's own API client:

- **Acquire.** A candidate creates the Lease, or takes it over once the record it
  observed (holder, renew time) has not changed for ``lease_duration`` by its *own*
  clock: time since it first saw that record, never the holder's timestamps, so
  clocks need not agree. The write carries the resourceVersion it read, so of two
  candidates racing for an expired Lease only one wins.
- **Renew.** The holder rewrites the Lease every ``retry_period``. A renewal that does
  not succeed within ``renew_deadline`` ends the leadership. Each Lease call is
  retried up to three times (at once, then 0.2 and 0.4 s later) on a 429, a 5xx or a dropped
  connection (:func:`lease_client`): the election itself tries again only a
  ``retry_period`` later, so when a fifth of requests are answered 429 or 500 (the
  scale benchmark's start-up faults) and a loaded API server leaves room for three
  tries in the deadline, a renewal fails about once in twenty (a try, a read and a
  replace, fails 36% of the time; three in a row 5%). A leader starting behind such
  faults could lose its Lease; with the retries a leader holds it
  through 40% of requests failing (``tests/cluster/test_leader_faults.py``).
- **Fence.** :meth:`LeaderElector.leading` is true only while the last successful
  renewal is younger than ``renew_deadline`` (monotonic clock); the operator's writer
  refuses every write otherwise, and a watchdog ends the process once it is false
  (``on_lost``), so a paused or partitioned leader stops writing before the standby
  may take over (``renew_deadline < lease_duration``). The process then stops Kopf
  and stands by again with its copy of the fleet still warm; a Kopf that has not
  stopped within ``lease_duration - renew_deadline`` ends the process (``terms.py``).
- **Release.** A leader that stops cleanly clears the holder, so the standby takes
  over at its next try instead of waiting out the lease.

Takeover after a crash costs at most ``lease_duration + retry_period`` plus Kopf's
start (its custom-resource indexes are listed then; Nodes and Pods already are).
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

from sdcguard.runtime.mirror import retrying_client

log = structlog.get_logger(__name__)

RELEASE_TRIES = 3
"""Reads and replaces a release makes when the Lease moved under it (409)."""


def lease_client(api: client.ApiClient, *, retries: int = 3) -> client.ApiClient:
    """A copy of ``api``'s configuration whose requests (Lease reads, creates and
    replaces) are retried without waiting for Retry-After on a 429, a 5xx or a
    dropped connection.

    Safe for writes: a replace carries the resourceVersion it read and a create fails
    on an existing Lease, so a retried write that had already landed is answered 409,
    and the election reads the Lease again at its next try. A 429's Retry-After is not
    waited for: one small request a second is not load, and waiting past the renew
    deadline would end the leadership it is meant to keep.
    """
    return retrying_client(
        api,
        total=retries,
        backoff=0.1,
        backoff_max=0.4,
        methods=frozenset({"GET", "POST", "PUT"}),
        retry_after=False,
    )


class _GuardedLeaseLock(LeaseLock):
    """The client's LeaseLock on our API client; any failure reads as "not this time"
    (the library treats only ApiException so, and a connection error would end its
    thread), and each successful create or update is timed for the fence."""

    def __init__(
        self, api: client.ApiClient, name: str, namespace: str, identity: str, timeout: float
    ) -> None:
        super().__init__(name, namespace, identity)  # type: ignore[no-untyped-call]
        self.api_instance = _TimedCoordination(lease_client(api), timeout)
        self.renewed_at: float | None = None
        self.released = False
        """Set on release: no more writes (the library's renewals would take it back)."""

    def get(self, name: str, namespace: str) -> tuple[bool, Any]:
        try:
            return super().get(name, namespace)  # type: ignore[no-untyped-call,no-any-return]
        except Exception as exc:  # not an ApiException: a 5xx-free network failure
            log.warning("lease read failed", error=repr(exc)[:200])
            return False, exc

    def create(self, name: str, namespace: str, election_record: Any) -> bool:
        return self._timed(super().create, name, namespace, election_record)

    def update(self, name: str, namespace: str, updated_record: Any) -> bool:
        return self._timed(super().update, name, namespace, updated_record)

    def _timed(self, call: Callable[..., bool], *args: Any) -> bool:
        if self.released:
            return False
        started = time.monotonic()
        try:
            ok = bool(call(*args))
        except Exception as exc:
            log.warning("lease write failed", error=repr(exc)[:200])
            return False
        if ok:
            # The lease counts from when the write was sent, not when it came back.
            self.renewed_at = started
        return ok


class _TimedCoordination(client.CoordinationV1Api):
    """CoordinationV1Api whose Lease calls time out (a hung renewal must fail in time)."""

    def __init__(self, api: client.ApiClient, timeout: float) -> None:
        super().__init__(api)
        self._timeout = timeout

    def read_namespaced_lease(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("_request_timeout", self._timeout)
        return super().read_namespaced_lease(*args, **kwargs)

    def create_namespaced_lease(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("_request_timeout", self._timeout)
        return super().create_namespaced_lease(*args, **kwargs)

    def replace_namespaced_lease(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("_request_timeout", self._timeout)
        return super().replace_namespaced_lease(*args, **kwargs)


class LeaderElector:
    """Campaign for the Lease ``namespace/name`` as ``identity`` (module docstring)."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: int,
        renew_deadline: float,
        retry_period: float,
        on_lost: Callable[[], None],
    ) -> None:
        # The client's election would sys.exit() on anything else (its jitter is 1.2).
        if not (retry_period >= 1 and 1.2 * retry_period < renew_deadline < lease_duration):
            raise ValueError(
                "leader election needs 1 s <= retry_period, 1.2 x retry_period < "
                "renew_deadline < lease_duration, got "
                f"{retry_period} / {renew_deadline} / {lease_duration} s"
            )
        self.identity = identity
        self.renew_deadline = renew_deadline
        self.on_lost = on_lost
        self.elected = threading.Event()
        self._released = threading.Event()
        self._lock = _GuardedLeaseLock(
            api, name, namespace, identity, timeout=max(1.0, renew_deadline / 2)
        )
        self._election = leaderelection.LeaderElection(  # type: ignore[no-untyped-call]
            electionconfig.Config(  # type: ignore[no-untyped-call]
                self._lock,
                lease_duration,  # the Lease's field is whole seconds
                renew_deadline,
                retry_period,
                self._lead,
                self._stopped,
            )
        )

    def start(self) -> None:
        """Campaign in the background; :attr:`elected` is set once this replica leads."""
        threading.Thread(target=self._election.run, name="leader-election", daemon=True).start()
        threading.Thread(target=self._watchdog, name="leader-watchdog", daemon=True).start()

    def leading(self) -> bool:
        """This replica holds the Lease now, by its last renewal (the write fence)."""
        renewed = self._lock.renewed_at
        return (
            self.elected.is_set()
            and not self._released.is_set()
            and renewed is not None
            and time.monotonic() - renewed < self.renew_deadline
        )

    def wait(self, stopped: Callable[[], bool], every: float = 0.2) -> bool:
        """Block until elected (True) or ``stopped()`` (False)."""
        while not self.elected.wait(every):
            if stopped():
                return False
        return True

    def abandon(self) -> None:
        """After a lost Lease: never write the Lease again, and let the leading thread
        end (a process that stands by again campaigns with a new elector)."""
        self._lock.released = True
        self._released.set()

    def release(self) -> None:
        """Stop renewing and hand the Lease over at once (a clean shutdown)."""
        if not self.elected.is_set() or self._released.is_set():
            return
        self._released.set()
        lock = self._lock
        lock.released = True
        # A renewal already sent when ``released`` was set can land between the read and
        # the replace (a 409), as can a replace whose first try was applied before its
        # connection dropped: read again and look, a few times.
        for attempt in range(RELEASE_TRIES):
            try:
                lease = lock.api_instance.read_namespaced_lease(lock.name, lock.namespace)
                if lease.spec is None or lease.spec.holder_identity != self.identity:
                    return
                lease.spec.holder_identity = None
                lease.spec.renew_time = dt.datetime.now(dt.UTC)
                lock.api_instance.replace_namespaced_lease(lock.name, lock.namespace, lease)
                log.info("lease released", identity=self.identity)
                return
            except ApiException as exc:
                if exc.status == 409 and attempt < RELEASE_TRIES - 1:
                    continue
                log.warning("lease release failed", error=repr(exc)[:200])
            except Exception as exc:
                log.warning("lease release failed", error=repr(exc)[:200])
            return  # the standby waits the lease out instead

    # The library's callbacks and the fence's watchdog --------------------------------

    def _lead(self) -> None:
        log.info("leading", identity=self.identity, lease=self._lock.name)
        self.elected.set()
        self._released.wait()  # returning would end the renewals' reason to exist

    def _stopped(self) -> None:
        if not self._released.is_set():
            log.error("lost the lease", identity=self.identity)
            self.on_lost()

    def _watchdog(self) -> None:
        self.elected.wait()
        while not self._released.is_set():
            if not self.leading():
                log.error("lease not renewed in time; stopping", identity=self.identity)
                self.on_lost()
                return
            time.sleep(min(0.5, self.renew_deadline / 4))
