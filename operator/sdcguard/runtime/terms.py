"""Terms of the Lease: with leader election on (``SDCGUARD_LEADER_ELECTION=true``, the
chart's ``replicas: 2``), the process around Kopf.

The process first lists and watches the fleet (its copy, handed in warm) and
campaigns for the leader Lease, answering the liveness probe meanwhile; only while it
holds the Lease does it run Kopf (:mod:`sdcguard.runtime.leader`). A leader that loses
the Lease refuses every write at once, stops Kopf and stands by again in the same
process, its copy of the fleet still warm, so a lost renewal costs no relist; if Kopf
has not stopped before another replica may take the Lease over
(``lease_duration - renew_deadline``), the process exits instead and restarts as a
standby. While it stands by, its heap keeper freezes the warm copy out of the
collector's scans (:func:`settle_while_standing_by`).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import structlog
from kubernetes import client

from sdcguard.runtime.heap import Heap
from sdcguard.runtime.leader import LeaderElector

log = structlog.get_logger("sdcguard")

STANDBY_SETTLE_SECONDS = 60.0
"""How often a standby freezes its warm copy (the leader does after each full pass)."""


@dataclass(frozen=True)
class Election:
    """Which Lease, held by whom, and how it is kept (the ``leader*`` and ``*_seconds``
    settings; :class:`~sdcguard.runtime.leader.LeaderElector` checks the timings)."""

    namespace: str
    name: str
    identity: str
    lease_duration: int
    renew_deadline: float
    retry_period: float


def lead_while_elected(
    election: Election,
    *,
    api: Callable[[], client.ApiClient],
    synced: Callable[[], bool],
    memo: Any,
    run_kopf: Callable[[threading.Event], object],
    liveness: str,
    on_stand_by: Callable[[], None] = lambda: None,
) -> int:
    """Run Kopf (``run_kopf(stop_flag)``) for each term of the Lease and stand by between
    terms. ``synced``: the warm copy has listed completely (its heap is settled from
    then on while standing by). Kopf's ``memo`` gets each term's ``elector`` (the write
    fence) and the process's ``heap``. Returns when Kopf stops while the Lease is held
    (SIGTERM, SIGINT). ``on_stand_by`` runs each time the replica stands by (its gauges
    say so)."""
    standing_by = settle_while_standing_by(memo, synced)
    terms = 0
    while True:
        lost = LostLease(grace=election.lease_duration - election.renew_deadline)
        standing_by.set()
        on_stand_by()
        try:
            memo.elector = elector = campaign(election, api(), liveness, lost)
        finally:
            standing_by.clear()
        terms += 1
        try:
            run_kopf(lost.stop)
        finally:
            lost.kopf_stopped()
            if not lost.happened:
                elector.release()
        if not lost.happened:
            return 0
        elector.abandon()
        log.warning("lost the lease: standing by again, copy of the fleet kept", terms=terms)


class LostLease:
    """What to do when the Lease is lost: stop Kopf (``stop`` is its stop flag) and,
    should Kopf still run ``grace`` seconds later, end the process. Called from the
    election's threads, possibly twice."""

    def __init__(self, grace: float, exit_process: Callable[[], None] | None = None) -> None:
        self.stop = threading.Event()
        self.grace = grace
        self._exit = exit_process or exit_lost
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._kopf_done = False

    @property
    def happened(self) -> bool:
        return self.stop.is_set()

    def __call__(self) -> None:
        with self._lock:
            if self.stop.is_set() or self._kopf_done:
                return
            self.stop.set()
            self._timer = threading.Timer(self.grace, self._exit)
            self._timer.daemon = True
            self._timer.start()

    def kopf_stopped(self) -> None:
        with self._lock:
            self._kopf_done = True
            if self._timer is not None:
                self._timer.cancel()


def settle_while_standing_by(memo: Any, synced: Callable[[], bool]) -> threading.Event:
    """The process's heap keeper (``memo.heap``, :mod:`sdcguard.runtime.heap`), settling
    the warm copy once it has listed and every :data:`STANDBY_SETTLE_SECONDS` after,
    while the returned event is set: a standby's copy is as large as the leader's, and
    full collections over it would stop the first pass of a takeover again and again."""
    heap = memo.heap = Heap()
    heap.install()
    standing_by = threading.Event()

    def settle() -> None:
        # At once when the copy has listed (a standby started moments before a takeover
        # would otherwise still scan it all), then every STANDBY_SETTLE_SECONDS.
        while not synced():
            time.sleep(0.5)
        while True:
            if standing_by.is_set():
                heap.settle()
            time.sleep(STANDBY_SETTLE_SECONDS)

    threading.Thread(target=settle, name="sdcguard-standby-heap", daemon=True).start()
    return standing_by


def campaign(
    election: Election, api: client.ApiClient, liveness: str, on_lost: Callable[[], None]
) -> LeaderElector:
    """Wait for the leader Lease, answering the liveness probe; returns the elector."""
    elector = LeaderElector(
        api,
        namespace=election.namespace,
        name=election.name,
        identity=election.identity,
        lease_duration=election.lease_duration,
        renew_deadline=election.renew_deadline,
        retry_period=election.retry_period,
        on_lost=on_lost,
    )
    health = standby_liveness(liveness)
    elector.start()
    elector.wait(lambda: False)
    if health is not None:  # Kopf serves the endpoint from here on
        health.shutdown()
        health.server_close()
    return elector


def exit_lost() -> None:
    """Kopf did not stop in time after the Lease was lost: stop at once, mid-write or
    not (a standby may act soon); the container restarts as a standby."""
    sys.stderr.flush()
    os._exit(3)


def standby_liveness(url: str) -> ThreadingHTTPServer | None:
    """Answer the liveness endpoint while standing by (Kopf's starts with Kopf)."""
    if not url:
        return None
    parsed = urllib.parse.urlsplit(url)

    class Alive(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = self.path.split("?")[0] == (parsed.path or "/")
            self.send_response(200 if ok else 404)
            self.end_headers()
            self.wfile.write(b"standby\n" if ok else b"")

        def log_message(self, format: str, *args: Any) -> None:
            """Each probe at debug, as Kopf's (``logs.HealthChecksAtDebug``)."""
            log.debug("health check", request=format % args)

    address = (parsed.hostname or "0.0.0.0", parsed.port or 80)
    for _ in range(50):  # after a term, Kopf's endpoint may hold the port a moment longer
        try:
            server = ThreadingHTTPServer(address, Alive)
            break
        except OSError:
            time.sleep(0.1)
    else:
        server = ThreadingHTTPServer(address, Alive)
    threading.Thread(target=server.serve_forever, name="standby-liveness", daemon=True).start()
    return server
