"""Adopting nodes the simulator did not register (an autoscaler's, e.g. Karpenter's kwok).

An autoscaler with a fake cloud creates Node objects itself and expects a kubelet to make
them Ready. :class:`NodeAdopter` watches Nodes; one that matches an :class:`AdoptRule`'s
labels and whose ``node.kubernetes.io/instance-type`` is in the catalogue is taken on as if
the simulator had registered it: the instance type's labels (GPU feature discovery,
fleet label) are added, its status is written as the kubelet of that type would (capacity,
allocatable, Ready, addresses, ``nodeInfo``), and from then on the heartbeats keep it Ready
and the kubelet runs its Pods (probes for real, with the rule's fault profile). Taints and
the rest of the spec stay the autoscaler's and the operator's. A deleted Node stops getting
heartbeats.

    sim = Simulator(adoption_fleet("karpenter"), api_client, options)
    adopter = NodeAdopter(sim, [AdoptRule({"karpenter.sh/nodepool": "gpu"})])
    sim.start(); adopter.start()
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import structlog

from sdcdev.sim.catalogue import CATALOGUE, INSTANCE_TYPE_LABEL, ZONE_LABEL
from sdcdev.sim.fleet import (
    FLEET_LABEL,
    FaultProfile,
    Fleet,
    NodeConfig,
    ProbeSettings,
    RepairSettings,
    WorkloadSettings,
    _fake_ip,
)
from sdcdev.sim.kube import JsonDict, ListWatch, status_of
from sdcdev.sim.nodes import node_status
from sdcdev.sim.simulator import Simulator

log = structlog.get_logger("sdcdev.sim")


@dataclass(frozen=True)
class AdoptRule:
    """Nodes carrying all of ``match_labels`` are adopted with these settings."""

    match_labels: Mapping[str, str]
    fault_profile: FaultProfile | None = None
    """How sick the adopted nodes are (None: healthy)."""
    cpu_devices: int = 2
    """``--cpu-devices`` for probes on these nodes when the pod does not set it."""
    name: str = field(default="")
    """For logs; default: the labels."""

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels.items())

    def describe(self) -> str:
        return self.name or ",".join(f"{k}={v}" for k, v in sorted(self.match_labels.items()))


def adoption_fleet(
    name: str,
    *,
    seed: int = 0,
    repair: RepairSettings | None = None,
    max_parallel_probes: int | None = None,
) -> Fleet:
    """A fleet with no nodes of its own (every node is adopted) and no customer workloads."""
    return Fleet(
        name=name,
        seed=seed,
        nodes=(),
        workloads=WorkloadSettings(enabled=False),
        repair=repair or RepairSettings(enabled=False),
        probes=ProbeSettings(max_parallel=max_parallel_probes),
        source=f"adoption fleet {name!r}",
    )


def adopted_config(node: JsonDict, rule: AdoptRule, fleet: str) -> NodeConfig | str:
    """The simulated node for an existing Node object, or why it cannot be simulated."""
    meta = node.get("metadata") or {}
    name = str(meta.get("name", ""))
    labels: Mapping[str, str] = meta.get("labels") or {}
    type_name = labels.get(INSTANCE_TYPE_LABEL)
    itype = CATALOGUE.get(type_name or "")
    if itype is None:
        return (
            f"instance type {type_name!r} (label {INSTANCE_TYPE_LABEL}) is not in the catalogue;"
            f" known: {', '.join(sorted(CATALOGUE))}"
        )
    zone = labels.get(ZONE_LABEL) or itype.zones[0]
    pool = labels.get(itype.pool_label) or labels.get("karpenter.sh/nodepool") or itype.name
    merged = {**labels, **itype.labels, FLEET_LABEL: fleet}
    return NodeConfig(
        name=name,
        entry=f"adopted ({rule.describe()})",
        instance_type=itype,
        zone=zone,
        pool=pool,
        labels=merged,
        taints=(),
        cpu_devices=rule.cpu_devices,
        fault_profile=rule.fault_profile,
        provider_id=str((node.get("spec") or {}).get("providerID") or ""),
        internal_ip=_fake_ip(name),
    )


class NodeAdopter:
    """Watches Nodes and adopts those matching a rule into a running :class:`Simulator`."""

    def __init__(
        self,
        sim: Simulator,
        rules: Sequence[AdoptRule],
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if not rules:
            raise ValueError("NodeAdopter needs at least one AdoptRule")
        self.sim = sim
        self.rules = list(rules)
        self.clock = clock
        self.adopted: dict[str, str] = {}
        """node name -> rule it was adopted by."""
        self.refused: dict[str, str] = {}
        """node name -> why it matched a rule but could not be simulated."""
        self.gone: set[str] = set()
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._work: queue.Queue[JsonDict | None] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self.watch = ListWatch(
            sim.kube,
            "/api/v1/nodes",
            on_sync=self._on_sync,
            on_event=self._on_event,
            stop_event=self._stop,
        )

    def start(self) -> NodeAdopter:
        for target, name in ((self.watch.run, "sim-adopt-watch"), (self._worker, "sim-adopt")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self.watch.stop()
        self._work.put(None)
        for t in self._threads:
            t.join(timeout=10)

    def _rule_for(self, node: JsonDict) -> AdoptRule | None:
        labels = (node.get("metadata") or {}).get("labels") or {}
        return next((r for r in self.rules if r.matches(labels)), None)

    # Watch thread: cheap, no API calls ---------------------------------------------------
    def _on_sync(self, items: list[JsonDict]) -> None:
        for obj in items:
            self._on_event("ADDED", obj)

    def _on_event(self, kind: str, obj: JsonDict) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        if kind == "DELETED":
            with self._lock:
                if name in self.adopted:
                    self.gone.add(name)
            if name in self.adopted:
                self.sim.heartbeats.forget(name)
                log.info("sim.node.adopted_gone", node=name)
            return
        with self._lock:
            if name in self._seen:
                return
            if self._rule_for(obj) is None or (obj.get("metadata") or {}).get("deletionTimestamp"):
                return
            self._seen.add(name)
        self._work.put(obj)

    # Worker thread ------------------------------------------------------------------------
    def _worker(self) -> None:
        while True:
            obj = self._work.get()
            if obj is None:
                return
            try:
                self._adopt(obj)
            except Exception as exc:
                name = (obj.get("metadata") or {}).get("name")
                log.warning("sim.node.adopt_failed", node=name, error=repr(exc)[:300])
                with self._lock:
                    self._seen.discard(str(name))

    def _adopt(self, obj: JsonDict) -> None:
        rule = self._rule_for(obj)
        assert rule is not None
        name = str(obj["metadata"]["name"])
        cfg = adopted_config(obj, rule, self.sim.fleet.name)
        if isinstance(cfg, str):
            self.refused[name] = cfg
            log.warning("sim.node.not_adopted", node=name, rule=rule.describe(), reason=cfg)
            return
        kube = self.sim.kube
        now = self.clock()
        extra = {k: v for k, v in cfg.labels.items() if obj["metadata"]["labels"].get(k) != v}
        try:
            patched = kube.patch_node(name, {"metadata": {"labels": extra}}) if extra else obj
            kube.patch_node_status(name, {"status": node_status(cfg, now, now)})
        except Exception as exc:
            if status_of(exc) == 404:
                return  # deleted before we got to it
            raise
        self.sim.state.add(cfg)
        self.sim.heartbeats.adopt(cfg, str(patched["metadata"]["uid"]))
        with self._lock:
            self.adopted[name] = rule.describe()
        # Pods bound before the node was ours were skipped by the kubelet's watch.
        for pod in kube.list_pods(field_selector=f"spec.nodeName={name}"):
            self.sim.kubelet._on_event("MODIFIED", pod)
        log.info(
            "sim.node.adopted",
            node=name,
            rule=rule.describe(),
            instance_type=cfg.instance_type.name,
            faulty=cfg.fault_profile is not None,
        )
