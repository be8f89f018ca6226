"""What each simulated node is, and what it is doing (thread-safe, in memory).

The kubelet, the repair shop and the workload generator update one
:class:`FleetState`; :meth:`FleetState.snapshot` gives a consistent copy for
demos, tests and the ``--status-file``.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from sdcdev.sim.fleet import FaultProfile, Fleet, NodeConfig
from sdcdev.sim.pods import PodKind

Activity = Literal["idle", "probing", "busy", "probe-queued"]


@dataclass(frozen=True)
class ProbeRecord:
    """One finished probe run on a node."""

    pod: str
    exit_code: int
    outcome: str
    """pass, sdc, inconclusive, deadline, deleted, error."""
    seconds: float
    finished_at: str
    faults_injected: bool
    verdict: str | None = None
    """The result document's verdict, when the termination message is one."""


@dataclass(frozen=True)
class NodeActivity:
    """A node's state in one snapshot."""

    name: str
    instance_type: str
    accelerator: str
    pool: str
    zone: str
    activity: Activity
    running: tuple[str, ...]
    """``namespace/name (kind)`` of pods running now."""
    queued_probes: tuple[str, ...]
    faulty: bool
    """The node has a fault profile right now (repairs clear it)."""
    fault_sites: tuple[str, ...]
    intermittent: float | None
    repairs: int
    probes_run: int
    probes_passed: int
    probes_failed: int
    """Exit code 1: the probe found corruption."""
    probes_other: int
    workloads_run: int
    last_probe: ProbeRecord | None


@dataclass(frozen=True)
class FleetSnapshot:
    taken_at: str
    nodes: tuple[NodeActivity, ...]
    probes_running: int
    probes_queued: int
    max_parallel_probes: int

    def node(self, name: str) -> NodeActivity:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _NodeRuntime:
    config: NodeConfig
    fault_profile: FaultProfile | None
    rng: random.Random
    repairs: int = 0
    running: dict[str, PodKind] = field(default_factory=dict)
    queued: list[str] = field(default_factory=list)
    probes_run: int = 0
    probes_passed: int = 0
    probes_failed: int = 0
    probes_other: int = 0
    workloads_run: int = 0
    last_probe: ProbeRecord | None = None


def outcome_of(exit_code: int) -> str:
    return {0: "pass", 1: "sdc", 2: "inconclusive"}.get(exit_code, "error")


class FleetState:
    """Per-node fault profiles, RNGs and activity counters, behind one lock."""

    def __init__(self, fleet: Fleet, max_parallel_probes: int) -> None:
        self.fleet = fleet
        self.max_parallel_probes = max_parallel_probes
        self._lock = threading.Lock()
        self._nodes = {
            n.name: _NodeRuntime(
                config=n,
                fault_profile=n.fault_profile,
                # One stream per node, so adding a node leaves the others' draws alone.
                rng=random.Random(f"{fleet.seed}:{n.name}"),
            )
            for n in fleet.nodes
        }

    @property
    def names(self) -> Sequence[str]:
        return list(self._nodes)

    def has(self, name: str | None) -> bool:
        return name is not None and name in self._nodes

    def config(self, name: str) -> NodeConfig:
        return self._nodes[name].config

    def add(self, config: NodeConfig) -> bool:
        """Take on a node that joined after start (see :mod:`~sdcdev.sim.adopt`);
        False if it is already known."""
        with self._lock:
            if config.name in self._nodes:
                return False
            self._nodes[config.name] = _NodeRuntime(
                config=config,
                fault_profile=config.fault_profile,
                rng=random.Random(f"{self.fleet.seed}:{config.name}"),
            )
            return True

    # Faults -----------------------------------------------------------------
    def draw_faults(self, name: str) -> str | None:
        """The ``SDCPROBE_FAULTS`` value for the next probe run on ``name``, or None.

        An intermittent profile is present on a run with its probability,
        drawn from the node's seeded stream.
        """
        with self._lock:
            node = self._nodes[name]
            profile = node.fault_profile
            if profile is None:
                return None
            if profile.intermittent is not None and node.rng.random() >= profile.intermittent:
                return None
            return profile.env_value()

    def set_fault_profile(self, name: str, profile: FaultProfile | None) -> None:
        """Make a node sick (or healthy) from now on, e.g. to show degradation in use."""
        with self._lock:
            self._nodes[name].fault_profile = profile

    def repair(self, name: str) -> bool:
        """One repair of ``name``; True if it cleared the faults (or there were none)."""
        with self._lock:
            node = self._nodes[name]
            node.repairs += 1
            profile = node.fault_profile
            if profile is None:
                return True
            if node.repairs >= profile.repairs_needed:
                node.fault_profile = None
                return True
            return False

    # Activity -----------------------------------------------------------------
    def pod_queued(self, name: str, pod: str) -> None:
        with self._lock:
            self._nodes[name].queued.append(pod)

    def pod_started(self, name: str, pod: str, kind: PodKind) -> None:
        with self._lock:
            node = self._nodes[name]
            if pod in node.queued:
                node.queued.remove(pod)
            node.running[pod] = kind

    def pod_dropped(self, name: str, pod: str) -> None:
        with self._lock:
            node = self._nodes[name]
            if pod in node.queued:
                node.queued.remove(pod)
            node.running.pop(pod, None)

    def workload_finished(self, name: str, pod: str) -> None:
        with self._lock:
            node = self._nodes[name]
            node.running.pop(pod, None)
            node.workloads_run += 1

    def probe_finished(self, name: str, record: ProbeRecord) -> None:
        with self._lock:
            node = self._nodes[name]
            node.running.pop(record.pod, None)
            if record.pod in node.queued:
                node.queued.remove(record.pod)
            node.probes_run += 1
            if record.outcome == "pass":
                node.probes_passed += 1
            elif record.outcome == "sdc":
                node.probes_failed += 1
            else:
                node.probes_other += 1
            node.last_probe = record

    def snapshot(self) -> FleetSnapshot:
        with self._lock:
            rows = []
            running_probes = queued = 0
            for node in self._nodes.values():
                probing = any(k == "probe" for k in node.running.values())
                running_probes += sum(1 for k in node.running.values() if k == "probe")
                queued += len(node.queued)
                activity: Activity
                if probing:
                    activity = "probing"
                elif node.running:
                    activity = "busy"
                elif node.queued:
                    activity = "probe-queued"
                else:
                    activity = "idle"
                cfg = node.config
                profile = node.fault_profile
                rows.append(
                    NodeActivity(
                        name=cfg.name,
                        instance_type=cfg.instance_type.name,
                        accelerator=cfg.instance_type.accelerator_model,
                        pool=cfg.pool,
                        zone=cfg.zone,
                        activity=activity,
                        running=tuple(f"{p} ({k})" for p, k in sorted(node.running.items())),
                        queued_probes=tuple(node.queued),
                        faulty=profile is not None,
                        fault_sites=tuple(
                            str(f.get("site", "?")) for f in (profile.faults if profile else [])
                        ),
                        intermittent=profile.intermittent if profile else None,
                        repairs=node.repairs,
                        probes_run=node.probes_run,
                        probes_passed=node.probes_passed,
                        probes_failed=node.probes_failed,
                        probes_other=node.probes_other,
                        workloads_run=node.workloads_run,
                        last_probe=node.last_probe,
                    )
                )
            return FleetSnapshot(
                taken_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                nodes=tuple(rows),
                probes_running=running_probes,
                probes_queued=queued,
                max_parallel_probes=self.max_parallel_probes,
            )
