"""``python -m sdcguard`` / ``sdcguard-operator``: run the operator.

Cluster-wide, standalone (one replica; the Deployment uses the Recreate
strategy, so no peering objects are needed), with Kopf's liveness endpoint.
Credentials: in-cluster in a Pod, else KUBECONFIG (``--kubeconfig``).
"""

from __future__ import annotations

import argparse
import os
import sys

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
        load_settings()  # fail fast, before connecting anywhere
    except ValidationError as exc:
        print(f"error: invalid SDCGUARD_* setting:\n{exc}", file=sys.stderr)
        return 2

    import kopf

    import sdcguard.handlers  # noqa: F401  (registers the handlers)

    kopf.run(
        clusterwide=True,
        standalone=True,
        liveness_endpoint=args.liveness or None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
