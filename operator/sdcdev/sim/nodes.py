"""Node registration and heartbeats: what a kubelet does to keep its Node Ready.

:func:`node_manifest` (pure) builds the Node a kubelet of that instance type
would register: labels, registration taints, capacity and allocatable
(including the accelerator's extended resource), addresses and ``nodeInfo``.
:class:`Heartbeats` then keeps every node Ready from one thread: each round it
renews each node's Lease in ``kube-node-lease`` and patches its Ready
condition's heartbeat. When the simulator dies both stop, and the
node-lifecycle controller marks the nodes NotReady (Ready=Unknown) about 40 s
later, as with a dead kubelet.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog

from sdcdev.sim.fleet import NodeConfig
from sdcdev.sim.kube import Kube, status_of

log = structlog.get_logger("sdcdev.sim")

KUBELET_VERSION = "v1.37.2"
LEASE_DURATION_SECONDS = 40
#: A heartbeat round later than this means the node-lifecycle controller may
#: have marked the node Unknown; the next Ready=True is a fresh transition.
STALE_AFTER_SECONDS = 35.0


def ts(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_ts(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def node_conditions(now: datetime, ready_since: datetime) -> list[dict[str, Any]]:
    """The kubelet's node conditions: Ready, and no memory, disk or PID pressure."""
    rows = [
        ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
    ]
    return [
        {
            "type": ctype,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": ts(now),
            "lastTransitionTime": ts(ready_since),
        }
        for ctype, status, reason, message in rows
    ]


def _uuid_like(name: str, salt: str) -> str:
    h = hashlib.sha256(f"{salt}:{name}".encode()).hexdigest()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def node_status(cfg: NodeConfig, now: datetime, ready_since: datetime) -> dict[str, Any]:
    itype = cfg.instance_type
    host = cfg.hardware_name or cfg.name
    capacity, allocatable = itype.capacity(), itype.allocatable()
    if cfg.dra_only and itype.accelerator_resource:
        # No device plugin: the GPUs are only in the node's ResourceSlice.
        capacity.pop(itype.accelerator_resource, None)
        allocatable.pop(itype.accelerator_resource, None)
    return {
        "capacity": capacity,
        "allocatable": allocatable,
        "conditions": node_conditions(now, ready_since),
        "addresses": [
            {"type": "InternalIP", "address": cfg.internal_ip},
            {"type": "Hostname", "address": cfg.name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {
            "architecture": "amd64",
            "bootID": _uuid_like(cfg.name, "boot"),
            "containerRuntimeVersion": itype.os.container_runtime,
            "kernelVersion": itype.os.kernel_version,
            "kubeProxyVersion": "",
            "kubeletVersion": KUBELET_VERSION,
            "machineID": _uuid_like(host, "machine").replace("-", ""),
            "operatingSystem": "linux",
            "osImage": itype.os.image,
            "systemUUID": _uuid_like(host, "system"),
        },
    }


def node_manifest(cfg: NodeConfig, now: datetime) -> dict[str, Any]:
    """The Node object a kubelet of this type registers (status included)."""
    spec: dict[str, Any] = {"providerID": cfg.provider_id}
    if cfg.taints:
        spec["taints"] = [t.to_k8s() for t in cfg.taints]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": cfg.name,
            "labels": dict(cfg.labels),
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
        },
        "spec": spec,
        "status": node_status(cfg, now, now),
    }


@dataclass
class _Beat:
    uid: str
    ready_since: datetime
    last_ok: float


class Heartbeats:
    """Registers the nodes and keeps them Ready, one thread for the whole fleet."""

    def __init__(
        self,
        kube: Kube,
        nodes: Sequence[NodeConfig],
        *,
        interval: float = 10.0,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.kube = kube
        self.nodes = list(nodes)
        self.interval = interval
        self.clock = clock
        self._beats: dict[str, _Beat] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.rounds = 0
        self.last_round_seconds = 0.0

    def uids(self) -> dict[str, str]:
        """The registered nodes' uids (for objects the nodes own)."""
        return {name: beat.uid for name, beat in self._beats.items()}

    def register_all(self) -> dict[str, str]:
        """Create each Node (or adopt an existing one); returns what happened per node."""
        outcome: dict[str, str] = {}
        for cfg in self.nodes:
            outcome[cfg.name] = self._register(cfg)
        return outcome

    def _register(self, cfg: NodeConfig) -> str:
        now = self.clock()
        try:
            created = self.kube.create_node(node_manifest(cfg, now))
            uid = str(created["metadata"]["uid"])
            # Status sent on create is kept for Nodes, but write it once more
            # so a server that drops it on create still sees a Ready node.
            self.kube.patch_node_status(cfg.name, {"status": node_status(cfg, now, now)})
            what = "created"
        except Exception as exc:
            if status_of(exc) != 409:
                raise
            # The node exists (simulator restarted): keep its spec (taints,
            # cordon belong to the operator now), refresh labels and status.
            existing = self.kube.patch_node(cfg.name, {"metadata": {"labels": dict(cfg.labels)}})
            uid = str(existing["metadata"]["uid"])
            self.kube.patch_node_status(cfg.name, {"status": node_status(cfg, now, now)})
            what = "adopted"
        self._beats[cfg.name] = _Beat(uid=uid, ready_since=now, last_ok=time.monotonic())
        self.kube.renew_lease(cfg.name, uid, micro_ts(now), LEASE_DURATION_SECONDS)
        log.info(
            "sim.node.registered",
            node=cfg.name,
            how=what,
            instance_type=cfg.instance_type.name,
            taints=[f"{t.key}:{t.effect}" for t in cfg.taints],
            faulty=cfg.fault_profile is not None,
        )
        return what

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="sim-heartbeats", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            t0 = time.monotonic()
            self.beat_once()
            self.last_round_seconds = time.monotonic() - t0

    def beat_once(self) -> int:
        """One round over all nodes; returns how many nodes were refreshed."""
        ok = 0
        for cfg in self.nodes:
            if self._stop.is_set():
                break
            beat = self._beats.get(cfg.name)
            if beat is None:
                continue
            now = self.clock()
            mono = time.monotonic()
            if mono - beat.last_ok > STALE_AFTER_SECONDS:
                beat.ready_since = now
            try:
                self.kube.renew_lease(cfg.name, beat.uid, micro_ts(now), LEASE_DURATION_SECONDS)
                self.kube.patch_node_status(
                    cfg.name, {"status": {"conditions": node_conditions(now, beat.ready_since)}}
                )
            except Exception as exc:
                if status_of(exc) == 404:
                    log.warning(
                        "sim.node.gone", node=cfg.name, hint="deleted by someone; not re-registered"
                    )
                    self._beats.pop(cfg.name, None)
                else:
                    log.warning("sim.node.heartbeat_failed", node=cfg.name, error=repr(exc)[:200])
                continue
            beat.last_ok = mono
            ok += 1
        self.rounds += 1
        return ok

    def last_heartbeat_age(self, name: str) -> float | None:
        beat = self._beats.get(name)
        return None if beat is None else time.monotonic() - beat.last_ok

    def adopt(self, cfg: NodeConfig, uid: str) -> None:
        """Keep an existing Node (created by someone else) Ready from the next round on."""
        now = self.clock()
        self._beats[cfg.name] = _Beat(uid=uid, ready_since=now, last_ok=time.monotonic())
        if all(n.name != cfg.name for n in self.nodes):
            self.nodes.append(cfg)
        self.kube.renew_lease(cfg.name, uid, micro_ts(now), LEASE_DURATION_SECONDS)

    def forget(self, name: str) -> None:
        self._beats.pop(name, None)
