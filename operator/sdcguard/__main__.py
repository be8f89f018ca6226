"""``python -m sdcguard`` / ``sdcguard-operator``: run the operator.

Cluster-wide, with Kopf's liveness endpoint; Kopf's peering is not used. One replica by
default. With ``SDCGUARD_LEADER_ELECTION=true`` (the chart's ``replicas: 2``) the
process first lists and watches the fleet (its inventory) and campaigns for the leader
Lease, answering the liveness probe meanwhile; only while it holds the Lease does it
run Kopf (``adapters/leader.py``). A leader that loses the Lease refuses every write at
once, stops Kopf and stands by again in the same process, its copy of the fleet still
warm, so a lost renewal costs no relist; if Kopf has not stopped before another
replica may take the Lease over (``lease_duration - renew_deadline``), the process
exits instead and restarts as a standby.
Credentials: in-cluster in a Pod, else KUBECONFIG (``--kubeconfig``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

M_ARENA_MAX = -8  # glibc's mallopt parameter number


def _fewer_malloc_arenas(arenas: int = 2) -> None:
    """Cap glibc's malloc arenas before any thread starts.

    Kopf runs sync handlers in a thread pool and the reconcile passes run in a worker
    thread; by default glibc gives threads arenas of their own (up to 8 per core), and
    freed memory stays scattered over them, so RSS grows with the fleet well past what
    is live. Two arenas is the usual setting for threaded Python services (the same as
    MALLOC_ARENA_MAX=2). No-op on other C libraries.
    """
    if os.environ.get("MALLOC_ARENA_MAX"):
        return  # the environment already decided
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(M_ARENA_MAX, arenas)
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    _fewer_malloc_arenas()
    parser = argparse.ArgumentParser(prog="sdcguard-operator", description=__doc__)
    parser.add_argument("--kubeconfig", help="kubeconfig path (default: in-cluster/KUBECONFIG)")
    parser.add_argument(
        "--liveness",
        default=os.environ.get("SDCGUARD_LIVENESS", "http://0.0.0.0:8081/healthz"),
        help="liveness endpoint URL ('' disables)",
    )
    args = parser.parse_args(argv)
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig

    from pydantic import ValidationError

    from sdcguard.settings import load_settings

    try:
        settings = load_settings()  # fail fast, before connecting anywhere
    except ValidationError as exc:
        print(f"error: invalid SDCGUARD_* setting:\n{exc}", file=sys.stderr)
        return 2

    import kopf

    import sdcguard.handlers  # noqa: F401  (registers the handlers)

    memo = kopf.Memo()
    if not settings.leader_election:
        kopf.run(
            clusterwide=True,
            standalone=True,
            liveness_endpoint=args.liveness or None,
            memo=memo,
        )
        return 0
    return _lead_while_elected(settings, memo, args.liveness)


def _lead_while_elected(settings: Any, memo: Any, liveness: str) -> int:
    """Warm the inventory once; run Kopf for each term of the Lease; stand by between
    terms. Returns when Kopf stops while the Lease is held (SIGTERM, SIGINT)."""
    import kopf
    import structlog

    from sdcguard.logs import configure_logging
    from sdcguard.metrics import Metrics

    configure_logging(settings.log_format, settings.log_level)
    log = structlog.get_logger("sdcguard")
    memo.metrics = Metrics()  # served while standing by too: the standby is a live target
    if settings.metrics_port:
        memo.metrics.serve(settings.metrics_port)
    memo.inventory = _warm_inventory(settings)
    memo.keep_inventory = True  # the cleanup handler detaches it instead of stopping it
    standing_by = _settle_while_standing_by(memo)
    terms = 0
    while True:
        lost = LostLease(grace=settings.lease_duration_seconds - settings.renew_deadline_seconds)
        standing_by.set()
        memo.metrics.stand_by()
        try:
            memo.elector = elector = _campaign(settings, liveness, lost)
        finally:
            standing_by.clear()
        terms += 1
        try:
            kopf.run(
                clusterwide=True,
                standalone=True,
                liveness_endpoint=liveness or None,
                memo=memo,
                stop_flag=lost.stop,
            )
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

    def __init__(self, grace: float, exit_process: Any = None) -> None:
        import threading

        self.stop = threading.Event()
        self.grace = grace
        self._exit = exit_process or _exit_lost
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._kopf_done = False

    @property
    def happened(self) -> bool:
        return self.stop.is_set()

    def __call__(self) -> None:
        import threading

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


STANDBY_SETTLE_SECONDS = 60.0
"""How often a standby freezes its warm copy (the leader does after each full pass)."""


def _settle_while_standing_by(memo: Any) -> Any:
    """The process's heap keeper (adapters/heap.py), settling the warm copy once it has
    listed and every :data:`STANDBY_SETTLE_SECONDS` after, while the returned event is
    set: a standby's copy is as large as the leader's, and full collections over it
    stopped the first pass of a takeover (four of up to 0.55 s in a 16.3 s takeover at
    20,000 nodes)."""
    import threading

    from sdcguard.adapters.heap import Heap

    heap = memo.heap = Heap()
    heap.install()
    standing_by = threading.Event()

    def settle() -> None:
        # At once when the copy has listed (a standby started moments before a takeover
        # would otherwise still scan it all), then every STANDBY_SETTLE_SECONDS.
        while not memo.inventory.synced():
            time.sleep(0.5)
        while True:
            if standing_by.is_set():
                heap.settle()
            time.sleep(STANDBY_SETTLE_SECONDS)

    threading.Thread(target=settle, name="sdcguard-standby-heap", daemon=True).start()
    return standing_by


def _warm_inventory(settings: Any) -> Any:
    """The fleet's copy, listing and watching from now on (a standby's warm copy)."""
    import datetime as dt

    from sdcguard.adapters.inventory import Inventory
    from sdcguard.adapters.kube import make_api_client

    inventory = Inventory(
        make_api_client(),
        settings.namespace,
        test_node=lambda _: None,
        clock=lambda: dt.datetime.now(dt.UTC),
    )
    inventory.warm()
    return inventory


def _campaign(settings: Any, liveness: str, on_lost: Any) -> Any:
    """Wait for the leader Lease, answering the liveness probe; returns the elector."""
    import socket

    from sdcguard.adapters.kube import make_api_client
    from sdcguard.adapters.leader import LeaderElector

    elector = LeaderElector(
        make_api_client(),
        namespace=settings.namespace,
        name=settings.leader_lease_name,
        identity=settings.leader_identity or f"{socket.gethostname()}-{os.getpid()}",
        lease_duration=settings.lease_duration_seconds,
        renew_deadline=settings.renew_deadline_seconds,
        retry_period=settings.retry_period_seconds,
        on_lost=on_lost,
    )
    health = _standby_liveness(liveness)
    elector.start()
    elector.wait(lambda: False)
    if health is not None:  # Kopf serves the endpoint from here on
        health.shutdown()
        health.server_close()
    return elector


def _exit_lost() -> None:
    """Kopf did not stop in time after the Lease was lost: stop at once, mid-write or
    not (a standby may act soon); the container restarts as a standby."""
    sys.stderr.flush()
    os._exit(3)


def _standby_liveness(url: str) -> Any:
    """Answer the liveness endpoint while standing by (Kopf's starts with Kopf)."""
    if not url:
        return None
    import threading
    import time
    import urllib.parse
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    parsed = urllib.parse.urlsplit(url)

    class Alive(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = self.path.split("?")[0] == (parsed.path or "/")
            self.send_response(200 if ok else 404)
            self.end_headers()
            self.wfile.write(b"standby\n" if ok else b"")

        def log_message(self, *_: Any) -> None:
            pass

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


if __name__ == "__main__":
    sys.exit(main())
