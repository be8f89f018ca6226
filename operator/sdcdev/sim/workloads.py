"""Customer workloads: accelerator Pods that come and go, so nodes are busy or idle.

Pods arrive as a Poisson process (``arrivalsPerMinute``), each asking for
either all accelerators of one instance type or one of them, and "run" for an
exponentially distributed time (``meanDurationSeconds``, written into the
``sim.sdcguard.dev/run-seconds`` annotation the simulated kubelet reads). They
go through the real scheduler, so taints and cordons keep them off reserved,
unqualified and quarantined nodes. A Pod that finds no room waits Pending,
which is what a pending workload looks like to the operator; no new Pod is
created while ``maxPending`` of them wait. Finished Pods are deleted after
``keepFinishedSeconds``.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog

from sdcdev.sim.catalogue import INSTANCE_TYPE_LABEL, InstanceType
from sdcdev.sim.fleet import RUN_SECONDS_ANNOTATION, Fleet, WorkloadSettings
from sdcdev.sim.kube import Kube
from sdcguard.api.common import parse_time

log = structlog.get_logger("sdcdev.sim")

WORKLOAD_LABEL = "sim.sdcguard.dev/workload"


@dataclass(frozen=True)
class WorkloadRequest:
    """One customer pod to create (decided by :func:`next_workload`)."""

    instance_type: str
    resource: str
    count: int
    run_seconds: float


def accelerator_types(fleet: Fleet) -> list[tuple[InstanceType, int]]:
    """Instance types with accelerators in the fleet, with their node counts."""
    counts = Counter(n.instance_type.name for n in fleet.nodes if n.instance_type.has_accelerators)
    types = {n.instance_type.name: n.instance_type for n in fleet.nodes}
    return [(types[name], counts[name]) for name in sorted(counts)]


def next_workload(
    rng: random.Random, types: list[tuple[InstanceType, int]], settings: WorkloadSettings
) -> WorkloadRequest | None:
    """Draw the next customer pod (pure given the RNG); None without accelerator nodes."""
    if not types:
        return None
    itype = rng.choices([t for t, _ in types], weights=[c for _, c in types])[0]
    assert itype.accelerator_resource is not None
    full = rng.random() < settings.full_node_fraction
    seconds = max(
        settings.min_duration_seconds, rng.expovariate(1.0 / settings.mean_duration_seconds)
    )
    return WorkloadRequest(
        instance_type=itype.name,
        resource=itype.accelerator_resource,
        count=itype.accelerator_count if full else 1,
        run_seconds=round(seconds, 1),
    )


def workload_pod(fleet: Fleet, req: WorkloadRequest, settings: WorkloadSettings) -> dict[str, Any]:
    """The Pod manifest of a customer workload."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "train-",
            "namespace": settings.namespace,
            "labels": {
                "app.kubernetes.io/name": "customer-training",
                "app.kubernetes.io/managed-by": "sdcguard-sim",
                WORKLOAD_LABEL: fleet.name,
            },
            "annotations": {RUN_SECONDS_ANNOTATION: str(req.run_seconds)},
        },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "nodeSelector": {INSTANCE_TYPE_LABEL: req.instance_type},
            "containers": [
                {
                    "name": "train",
                    "image": settings.image,
                    "command": ["python", "train.py"],
                    "resources": {
                        "requests": {"cpu": "1", "memory": "1Gi"},
                        "limits": {req.resource: str(req.count)},
                    },
                }
            ],
        },
    }


def _age_seconds(pod: dict[str, Any], now: datetime) -> float:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    finished = [s.get("state", {}).get("terminated", {}).get("finishedAt") for s in statuses]
    stamps = [f for f in finished if f]
    if not stamps:
        return 0.0
    t = parse_time(max(stamps))
    return (now - t).total_seconds() if t is not None else 0.0


class CustomerWorkloads:
    """Creates and cleans up customer pods from one thread."""

    def __init__(self, kube: Kube, fleet: Fleet, settings: WorkloadSettings) -> None:
        self.kube = kube
        self.fleet = fleet
        self.settings = settings
        self.rng = random.Random(f"{fleet.seed}:{settings.seed}:workloads")
        self.types = accelerator_types(fleet)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.created = 0
        self.deleted = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="sim-workloads", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        try:
            self.kube.ensure_namespace(self.settings.namespace)
        except Exception as exc:
            log.warning("sim.workloads.namespace_failed", error=repr(exc)[:200])
        rate_per_second = self.settings.arrivals_per_minute / 60.0
        while not self._stop.wait(self.rng.expovariate(rate_per_second)):
            try:
                self.tick()
            except Exception as exc:  # the API server may be busy or restarting
                log.warning("sim.workloads.error", error=repr(exc)[:200])

    def tick(self) -> str:
        """One arrival: clean up, then create a pod unless too many wait. Returns what it did."""
        pods = self.kube.list_pods(
            self.settings.namespace, label_selector=f"{WORKLOAD_LABEL}={self.fleet.name}"
        )
        now = datetime.now(UTC)
        pending = 0
        for pod in pods:
            phase = (pod.get("status") or {}).get("phase")
            meta = pod["metadata"]
            if phase in ("Succeeded", "Failed"):
                if _age_seconds(pod, now) >= self.settings.keep_finished_seconds:
                    self.kube.delete_pod(meta["namespace"], meta["name"])
                    self.deleted += 1
            elif phase == "Pending" and not (pod.get("spec") or {}).get("nodeName"):
                pending += 1
        if pending >= self.settings.max_pending:
            return "waiting"
        req = next_workload(self.rng, self.types, self.settings)
        if req is None:
            return "no-accelerators"
        created = self.kube.create_pod(
            self.settings.namespace, workload_pod(self.fleet, req, self.settings)
        )
        self.created += 1
        log.info(
            "sim.workload.created",
            pod=f"{self.settings.namespace}/{created['metadata']['name']}",
            resource=f"{req.resource}={req.count}",
            instance_type=req.instance_type,
            run_seconds=req.run_seconds,
        )
        return "created"
