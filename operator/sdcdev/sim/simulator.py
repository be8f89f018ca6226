"""The :class:`Simulator`: registers the fleet and runs its parts in threads.

Parts: :class:`~sdcdev.sim.nodes.Heartbeats` (registration, leases, Ready),
:class:`~sdcdev.sim.kubelet.SimKubelet` (runs pods, probes for real),
:class:`~sdcdev.sim.workloads.CustomerWorkloads` and
:class:`~sdcdev.sim.repair.RepairShop`, sharing one
:class:`~sdcdev.sim.state.FleetState` and one timer thread.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import structlog
from kubernetes import client

from sdcdev.sim.dra import DraPublisher
from sdcdev.sim.fleet import FLEET_LABEL, FaultProfile, Fleet
from sdcdev.sim.kube import Kube, status_of
from sdcdev.sim.kubelet import SimKubelet
from sdcdev.sim.nodes import Heartbeats
from sdcdev.sim.repair import RepairShop
from sdcdev.sim.state import FleetSnapshot, FleetState
from sdcdev.sim.timers import Timers
from sdcdev.sim.workloads import WORKLOAD_LABEL, CustomerWorkloads

log = structlog.get_logger("sdcdev.sim")


@dataclass(frozen=True)
class SimOptions:
    """Run-time switches; the fleet file holds the simulated world itself."""

    max_parallel_probes: int | None = None
    """Probe processes at a time; default: the fleet's ``probes.maxParallel``, else CPUs."""
    heartbeat_seconds: float = 10.0
    workloads: bool | None = None
    """Override the fleet's ``workloads.enabled``."""
    repair: bool | None = None
    """Override the fleet's ``repair.enabled``."""
    repair_delay_seconds: float | None = None
    """Override the fleet's ``repair.delaySeconds``."""
    workdir: Path | None = None
    """Where probe runs keep their stdout, stderr and result files; default: a temp dir."""
    status_file: Path | None = None
    """Write :meth:`Simulator.snapshot` here as JSON every ``status_seconds``."""
    status_seconds: float = 2.0
    crd_retry_seconds: float = 15.0
    """How often to look again for the RepairTicket CRD while it is not installed."""


class Simulator:
    """A simulated fleet against a real API server.

    ``start()`` registers the nodes (blocking, so they exist when it returns)
    and starts the threads; ``stop()`` ends them and kills running probes;
    ``stop(cleanup=True)`` also deletes the fleet's pods, leases and nodes.
    ``snapshot()`` says what every node is doing. Usable as a context manager.
    """

    def __init__(
        self, fleet: Fleet, api_client: client.ApiClient, options: SimOptions | None = None
    ) -> None:
        self.fleet = fleet
        self.options = options or SimOptions()
        # A client of our own with a pool large enough for every thread.
        cfg = copy.deepcopy(api_client.configuration)
        cfg.connection_pool_maxsize = 32
        self.api_client = client.ApiClient(cfg)
        self.kube = Kube(self.api_client)
        parallel = (
            self.options.max_parallel_probes
            or fleet.probes.max_parallel
            or max(1, os.cpu_count() or 1)
        )
        self.state = FleetState(fleet, parallel)
        self.timers = Timers()
        self._own_workdir: tempfile.TemporaryDirectory[str] | None = None
        workdir = self.options.workdir
        if workdir is None:
            self._own_workdir = tempfile.TemporaryDirectory(prefix=f"sdcguard-sim-{fleet.name}-")
            workdir = Path(self._own_workdir.name)
        self.workdir = workdir
        self.heartbeats = Heartbeats(
            self.kube, fleet.nodes, interval=self.options.heartbeat_seconds
        )
        self.dra = DraPublisher(self.kube, fleet.nodes)
        self.kubelet = SimKubelet(
            self.kube, self.state, self.timers, max_parallel=parallel, workdir=workdir / "pods"
        )
        wl_enabled = (
            fleet.workloads.enabled if self.options.workloads is None else self.options.workloads
        )
        self.workloads = (
            CustomerWorkloads(self.kube, fleet, fleet.workloads) if wl_enabled else None
        )
        repair_settings = fleet.repair
        if self.options.repair_delay_seconds is not None:
            repair_settings = repair_settings.model_copy(
                update={"delay_seconds": self.options.repair_delay_seconds}
            )
        repair_enabled = (
            fleet.repair.enabled if self.options.repair is None else self.options.repair
        )
        self.repair = (
            RepairShop(
                self.kube,
                self.state,
                self.timers,
                repair_settings,
                crd_retry_seconds=self.options.crd_retry_seconds,
            )
            if repair_enabled
            else None
        )
        self._status_stop = threading.Event()
        self._status_thread: threading.Thread | None = None
        self.started = False

    def __enter__(self) -> Simulator:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        outcome = self.heartbeats.register_all()
        self.dra.publish_all(self.heartbeats.uids())
        self.timers.start()
        self.heartbeats.start()
        self.kubelet.start()
        if self.workloads is not None:
            self.workloads.start()
        if self.repair is not None:
            self.repair.start()
        if self.options.status_file is not None:
            self._status_thread = threading.Thread(
                target=self._status_loop, name="sim-status", daemon=True
            )
            self._status_thread.start()
        self.started = True
        log.info(
            "sim.started",
            fleet=self.fleet.name,
            nodes=len(outcome),
            created=sum(1 for v in outcome.values() if v == "created"),
            faulty=[n.name for n in self.fleet.nodes if n.fault_profile is not None],
            max_parallel_probes=self.state.max_parallel_probes,
            workloads=self.workloads is not None,
            repair=self.repair is not None,
            dra_nodes=len(self.dra.nodes),
            workdir=str(self.workdir),
        )

    def wait_synced(self, timeout: float = 30.0) -> bool:
        """Block until the pod watch has listed once (pods already bound are known)."""
        return self.kubelet.watch.synced.wait(timeout)

    def stop(self, *, cleanup: bool = False) -> None:
        """Stop every thread; with ``cleanup`` delete the fleet's pods, leases and nodes."""
        if self.workloads is not None:
            self.workloads.stop()
        if self.repair is not None:
            self.repair.stop()
        self.heartbeats.stop()
        self.kubelet.stop()
        self.timers.stop()
        self._status_stop.set()
        if self._status_thread is not None:
            self._status_thread.join(timeout=5)
        if self.options.status_file is not None:
            self.write_status(self.options.status_file)
        if cleanup:
            self.cleanup()
        self.api_client.close()  # type: ignore[no-untyped-call]
        if self._own_workdir is not None:
            with contextlib.suppress(OSError):
                self._own_workdir.cleanup()
        self.started = False
        log.info("sim.stopped", fleet=self.fleet.name, cleanup=cleanup)

    def cleanup(self) -> None:
        """Delete the fleet's pods (grace 0: no kubelet is left), leases and nodes,
        and the customer pods it created that are still waiting for a node."""
        names = set(self.state.names)
        pods = [
            p
            for p in self.kube.list_pods(field_selector="spec.nodeName!=")
            if (p.get("spec") or {}).get("nodeName") in names
        ]
        # Customer pods the generator made that never got a node go too.
        with contextlib.suppress(Exception):
            pods += self.kube.list_pods(
                self.fleet.workloads.namespace,
                label_selector=f"{WORKLOAD_LABEL}={self.fleet.name}",
                field_selector="spec.nodeName=",
            )
        for pod in pods:
            meta = pod["metadata"]
            with contextlib.suppress(Exception):
                self.kube.force_delete_pod(meta["namespace"], meta["name"], meta["uid"])
        self.dra.unpublish_all()
        for name in names:
            for delete in (self.kube.delete_lease, self.kube.delete_node):
                try:
                    delete(name)
                except Exception as exc:
                    if status_of(exc) != 404:
                        log.warning("sim.cleanup.failed", node=name, error=repr(exc)[:200])
        log.info("sim.cleanup.done", nodes=len(names), pods=len(pods), label=FLEET_LABEL)

    # For demo runners and tests ----------------------------------------------------
    def snapshot(self) -> FleetSnapshot:
        """What every node is doing now (activity, probes run, last probe, faults)."""
        return self.state.snapshot()

    def set_fault_profile(self, node: str, profile: FaultProfile | None) -> None:
        """Make ``node`` sick from its next probe run on (None heals it)."""
        self.state.set_fault_profile(node, profile)
        log.info("sim.node.fault_profile", node=node, faulty=profile is not None)

    def write_status(self, path: Path) -> None:
        doc = self.snapshot().to_json()
        doc["heartbeat_rounds"] = self.heartbeats.rounds
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1, default=str))
        tmp.replace(path)

    def _status_loop(self) -> None:
        assert self.options.status_file is not None
        while not self._status_stop.wait(self.options.status_seconds):
            try:
                self.write_status(self.options.status_file)
            except OSError as exc:
                log.warning("sim.status_file.failed", error=str(exc))
