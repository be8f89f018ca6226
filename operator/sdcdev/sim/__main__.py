"""``python -m sdcdev.sim --kubeconfig K --fleet FILE``: run a simulated fleet.

Exit codes: 0 after a clean stop (SIGINT/SIGTERM), 1 when the API server
cannot be used, 2 when the fleet file is invalid (the one-line error names the
entry and what to fix).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

import structlog

from sdcdev.sim.fleet import DEMO_FLEET, FleetError, load_fleet
from sdcguard.logs import configure_logging


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m sdcdev.sim",
        description="Simulated accelerator fleet: plays the kubelet of fake nodes against a "
        "real API server and runs probe pods for real on this machine's CPU.",
    )
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    p.add_argument(
        "--fleet", type=Path, default=DEMO_FLEET, help="fleet file (default: the demo fleet)"
    )
    p.add_argument(
        "--max-parallel-probes", type=int, help="probe processes at a time (default: CPUs)"
    )
    p.add_argument("--heartbeat-seconds", type=float, default=10.0)
    p.add_argument("--status-file", type=Path, help="write what each node is doing here (JSON)")
    p.add_argument("--workdir", type=Path, help="keep probe logs and results here")
    p.add_argument("--no-workloads", action="store_true", help="no customer pods")
    p.add_argument("--no-repair", action="store_true", help="leave RepairTickets alone")
    p.add_argument("--repair-delay", type=float, help="seconds before a ticket is resolved")
    p.add_argument("--cleanup", action="store_true", help="delete the fleet's nodes on exit")
    p.add_argument(
        "--check", action="store_true", help="validate the fleet file, print its nodes, exit"
    )
    p.add_argument("--log-format", choices=["json", "console"], default="console")
    p.add_argument("--log-level", default="info")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure_logging(args.log_format, args.log_level)
    log = structlog.get_logger("sdcdev.sim")
    try:
        fleet = load_fleet(args.fleet)
    except FleetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        for n in fleet.nodes:
            print(
                json.dumps(
                    {
                        "name": n.name,
                        "instanceType": n.instance_type.name,
                        "zone": n.zone,
                        "pool": n.pool,
                        "taints": [f"{t.key}:{t.effect}" for t in n.taints],
                        "faulty": n.fault_profile is not None,
                    }
                )
            )
        return 0

    from kubernetes import config

    from sdcdev.sim.simulator import SimOptions, Simulator

    try:
        api_client = config.new_client_from_config(args.kubeconfig)  # type: ignore[no-untyped-call]
    except Exception as exc:
        print(
            f"error: cannot load kubeconfig {args.kubeconfig or '(default)'}: {exc}",
            file=sys.stderr,
        )
        return 1
    options = SimOptions(
        max_parallel_probes=args.max_parallel_probes,
        heartbeat_seconds=args.heartbeat_seconds,
        workloads=False if args.no_workloads else None,
        repair=False if args.no_repair else None,
        repair_delay_seconds=args.repair_delay,
        workdir=args.workdir,
        status_file=args.status_file,
    )
    sim = Simulator(fleet, api_client, options)
    done = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("sim.signal", signal=signal.Signals(signum).name)
        done.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        sim.start()
    except Exception as exc:
        print(f"error: registering the fleet failed: {exc!r}"[:500], file=sys.stderr)
        sim.stop()
        return 1
    done.wait()
    sim.stop(cleanup=args.cleanup)
    return 0


if __name__ == "__main__":
    sys.exit(main())
