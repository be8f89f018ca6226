"""``python -m sdcguard`` / ``sdcguard-operator``: run the operator.

Cluster-wide, with Kopf's liveness endpoint; Kopf's peering is not used. One replica by
default. With ``SDCGUARD_LEADER_ELECTION=true`` (the chart's ``replicas: 2``) the
process first lists and watches Nodes and Pods and campaigns for the leader Lease,
answering the liveness probe meanwhile; only once it holds the Lease does it start
Kopf, and it exits if it stops holding it (``adapters/leader.py``).
Credentials: in-cluster in a Pod, else KUBECONFIG (``--kubeconfig``).
"""

from __future__ import annotations

import argparse
import os
import sys
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
    elector = None
    if settings.leader_election:
        elector = _stand_by(settings, memo, args.liveness)
    try:
        kopf.run(
            clusterwide=True,
            standalone=True,
            liveness_endpoint=args.liveness or None,
            memo=memo,
        )
    finally:
        if elector is not None:
            elector.release()
    return 0


def _stand_by(settings: Any, memo: Any, liveness: str) -> Any:
    """Warm the inventory and wait for the leader Lease; returns the elector."""
    import datetime as dt
    import socket

    from sdcguard.adapters.inventory import Inventory
    from sdcguard.adapters.kube import make_api_client
    from sdcguard.adapters.leader import LeaderElector
    from sdcguard.logs import configure_logging

    configure_logging(settings.log_format, settings.log_level)
    api = make_api_client()
    inventory = Inventory(
        api, settings.namespace, test_node=lambda _: None, clock=lambda: dt.datetime.now(dt.UTC)
    )
    inventory.warm()
    elector = LeaderElector(
        api,
        namespace=settings.namespace,
        name=settings.leader_lease_name,
        identity=settings.leader_identity or f"{socket.gethostname()}-{os.getpid()}",
        lease_duration=settings.lease_duration_seconds,
        renew_deadline=settings.renew_deadline_seconds,
        retry_period=settings.retry_period_seconds,
        on_lost=_exit_lost,
    )
    health = _standby_liveness(liveness)
    elector.start()
    elector.wait(lambda: False)
    if health is not None:  # Kopf serves the endpoint from here on
        health.shutdown()
        health.server_close()
    memo.inventory, memo.elector = inventory, elector
    return elector


def _exit_lost() -> None:
    """The Lease is lost: stop at once, mid-write or not (a standby may act soon);
    the container restarts as a standby."""
    sys.stderr.flush()
    os._exit(3)


def _standby_liveness(url: str) -> Any:
    """Answer the liveness endpoint while standing by (Kopf's starts with Kopf)."""
    if not url:
        return None
    import threading
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

    server = ThreadingHTTPServer((parsed.hostname or "0.0.0.0", parsed.port or 80), Alive)
    threading.Thread(target=server.serve_forever, name="standby-liveness", daemon=True).start()
    return server


if __name__ == "__main__":
    sys.exit(main())
