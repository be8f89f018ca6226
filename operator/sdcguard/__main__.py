"""``python -m sdcguard`` / ``sdcguard-operator``: run the operator.

Cluster-wide, with Kopf's liveness endpoint; Kopf's peering is not used. The process
first starts listing and watching the fleet (its inventory), then imports and runs Kopf:
one replica by default; with ``SDCGUARD_LEADER_ELECTION=true`` (the chart's
``replicas: 2``) Kopf runs only for each term of the leader Lease it holds
(``runtime/terms.py``, ``runtime/leader.py``).
Credentials: in-cluster in a Pod, else KUBECONFIG (``--kubeconfig``).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from sdcguard.runtime.heap import fewer_malloc_arenas


def main(argv: list[str] | None = None) -> int:
    fewer_malloc_arenas()  # before any thread starts
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

    # The fleet's copy starts listing before Kopf and the handlers are imported: on a
    # long history the API server's part of the lists (encoding every object) overlaps
    # the rest of the start instead of following it.
    inventory = _warm_inventory(settings)

    import kopf

    import sdcguard.handlers  # noqa: F401  (registers the handlers)

    memo = kopf.Memo()
    memo.inventory = inventory
    if not settings.leader_election:
        kopf.run(
            clusterwide=True,
            standalone=True,
            liveness_endpoint=args.liveness or None,
            memo=memo,
        )
        return 0
    return _lead_while_elected(settings, memo, args.liveness)


def _warm_inventory(settings: Any) -> Any:
    """The fleet's copy (``adapters/inventory.py``), listing and watching from now on,
    with nobody to tell yet: the startup handler attaches it (alone), or each term of
    the Lease does (with leader election). Logging is configured first, so the copy's
    own lines come out in the settings' format."""
    import datetime as dt

    from sdcguard.adapters.inventory import Inventory
    from sdcguard.adapters.kube import make_api_client
    from sdcguard.logs import configure_logging

    configure_logging(settings.log_format, settings.log_level)
    inventory = Inventory(
        make_api_client(),
        settings.namespace,
        test_node=lambda _: None,
        clock=lambda: dt.datetime.now(dt.UTC),
    )
    inventory.warm()
    return inventory


def _lead_while_elected(settings: Any, memo: Any, liveness: str) -> int:
    """Warm the inventory once; run Kopf for each term of the Lease; stand by between
    terms (``runtime/terms.py``). Returns when Kopf stops while the Lease is held."""
    import socket
    import threading

    import kopf

    from sdcguard.adapters.kube import make_api_client
    from sdcguard.metrics import Metrics
    from sdcguard.runtime.terms import Election, lead_while_elected

    memo.metrics = Metrics()  # served while standing by too: the standby is a live target
    if settings.metrics_port:
        memo.metrics.serve(settings.metrics_port)
    memo.keep_inventory = True  # the cleanup handler detaches it instead of stopping it

    def run_kopf(stop: threading.Event) -> None:
        kopf.run(
            clusterwide=True,
            standalone=True,
            liveness_endpoint=liveness or None,
            memo=memo,
            stop_flag=stop,
        )

    election = Election(
        namespace=settings.namespace,
        name=settings.leader_lease_name,
        identity=settings.leader_identity or f"{socket.gethostname()}-{os.getpid()}",
        lease_duration=settings.lease_duration_seconds,
        renew_deadline=settings.renew_deadline_seconds,
        retry_period=settings.retry_period_seconds,
    )
    return lead_while_elected(
        election,
        api=make_api_client,
        synced=memo.inventory.synced,
        memo=memo,
        run_kopf=run_kopf,
        liveness=liveness,
        on_stand_by=memo.metrics.stand_by,
    )


if __name__ == "__main__":
    sys.exit(main())
