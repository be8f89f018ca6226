"""Karpenter (its kwok cloud provider) as a real process against the local control plane.

``build-karpenter.sh`` builds ``sigs.k8s.io/karpenter/kwok`` once per machine and copies the
module's CRDs next to the binary. :class:`KarpenterProcess` applies those CRDs, writes an
instance-type file made from the simulator's catalogue (so a node Karpenter launches has the
capacity and extended resources the simulator reports for it) and runs the controllers with
leader election off and their HTTP endpoints on free ports.

With the kwok provider, a "launched instance" is a Node object Karpenter creates itself; the
fleet simulator adopts it (:mod:`sdcdev.sim.adopt`) and plays its kubelet.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sdcdev.cluster.localcluster import _die_with_parent
from sdcdev.harness import create_or_replace_crds
from sdcdev.sim.catalogue import CATALOGUE
from sdcdev.sim.ports import free_port

HERE = Path(__file__).resolve().parent
KARPENTER_VERSION = os.environ.get("KARPENTER_VERSION", "1.15.0")
KARPENTER_GROUP, KARPENTER_V1 = "karpenter.sh", "v1"
KWOK_GROUP, KWOK_V1 = "karpenter.kwok.sh", "v1alpha1"
NODEPOOL_LABEL = "karpenter.sh/nodepool"
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
DO_NOT_REPAIR = "karpenter.sh/do-not-repair"


def karpenter_dir() -> Path:
    """The cached version directory (bin/karpenter-kwok, crds/), building it once."""
    proc = subprocess.run(
        ["bash", str(HERE / "build-karpenter.sh")], stdout=subprocess.PIPE, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError("building Karpenter failed (see the error above); run `make karpenter`")
    return Path(proc.stdout.strip().splitlines()[-1])


def instance_types(names: Iterable[str], zones: Iterable[str] = ("test-zone-a",)) -> list[Any]:
    """Karpenter kwok instance types for catalogue entries: cpu, memory, pods and the
    accelerator's extended resources, one on-demand offering per zone."""
    out = []
    for name in names:
        itype = CATALOGUE[name]
        resources = {k: v for k, v in itype.capacity().items() if not k.startswith("hugepages")}
        resources.pop("ephemeral-storage", None)
        out.append(
            {
                "name": itype.name,
                "architecture": "amd64",
                "operatingSystems": ["linux"],
                "resources": resources,
                "offerings": [
                    {
                        "Price": float(itype.cpu) / 10.0,
                        "Available": True,
                        "Requirements": [
                            {
                                "key": "karpenter.sh/capacity-type",
                                "operator": "In",
                                "values": ["on-demand"],
                            },
                            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [z]},
                        ],
                    }
                    for z in zones
                ],
            }
        )
    return out


def apply_crds(api: client.ApiClient, crd_dir: Path) -> None:
    """Create or replace Karpenter's CRDs as its module ships them, and wait until served."""
    create_or_replace_crds(api, crd_dir)
    custom = client.CustomObjectsApi(api)
    for group, version, plural in (
        (KARPENTER_GROUP, KARPENTER_V1, "nodepools"),
        (KARPENTER_GROUP, KARPENTER_V1, "nodeclaims"),
        (KWOK_GROUP, KWOK_V1, "kwoknodeclasses"),
    ):
        deadline = time.monotonic() + 30
        while True:
            try:
                custom.list_cluster_custom_object(group, version, plural, limit=1)
                break
            except ApiException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)


class KarpenterProcess:
    """``karpenter-kwok`` against the test cluster (admin kubeconfig, like its chart's
    ClusterRole allows), no leader election, log in ``log_path``."""

    def __init__(
        self,
        kubeconfig: Path,
        workdir: Path,
        *,
        instance_type_names: Iterable[str],
        feature_gates: Mapping[str, bool] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.workdir = workdir
        self.dir = karpenter_dir()
        self.binary = self.dir / "bin" / "karpenter-kwok"
        self.crd_dir = self.dir / "crds"
        self.log_path = workdir / "karpenter.log"
        self.instance_types_file = workdir / "instance-types.json"
        self.instance_types_file.write_text(
            json.dumps(instance_types(instance_type_names), indent=1)
        )
        self.feature_gates = dict(feature_gates or {})
        self.env = dict(env or {})
        self.health_port = free_port()
        self.metrics_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, api: client.ApiClient, timeout: float = 60) -> KarpenterProcess:
        apply_crds(api, self.crd_dir)
        env = dict(os.environ)
        env.update(
            {
                "KUBECONFIG": str(self.kubeconfig),
                "SYSTEM_NAMESPACE": "kube-system",
                "DISABLE_LEADER_ELECTION": "true",
                "METRICS_PORT": str(self.metrics_port),
                "HEALTH_PROBE_PORT": str(self.health_port),
                "INSTANCE_TYPES_FILE_PATH": str(self.instance_types_file),
                "LOG_LEVEL": "debug",
                # Short batching windows: a test's pods arrive together.
                "BATCH_MAX_DURATION": "2s",
                "BATCH_IDLE_DURATION": "500ms",
                "FEATURE_GATES": ",".join(
                    f"{k}={str(v).lower()}" for k, v in self.feature_gates.items()
                )
                or "NodeRepair=false",
                **self.env,
            }
        )
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [str(self.binary)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # no Karpenter left behind by a killed test run
        )
        log.close()
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.health_port}/readyz"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"karpenter exited with code {self.proc.returncode}:\n{self.log_tail(30)}"
                )
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return self
            time.sleep(0.3)
        raise RuntimeError(f"karpenter not ready within {timeout:.0f}s:\n{self.log_tail(30)}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def log_lines(self, message: str) -> list[dict[str, Any]]:
        """Karpenter's JSON log records whose message is ``message``."""
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                if isinstance(rec, dict) and rec.get("message") == message:
                    out.append(rec)
        return out


# Objects ------------------------------------------------------------------------------


def node_class(name: str, *, registration_delay: str | None = None) -> dict[str, Any]:
    """A KWOKNodeClass; ``registration_delay`` holds back the Node of each launched
    NodeClaim that long (an instance that never registers, for an hour)."""
    spec = {"nodeRegistrationDelay": registration_delay} if registration_delay else {}
    return {
        "apiVersion": f"{KWOK_GROUP}/{KWOK_V1}",
        "kind": "KWOKNodeClass",
        "metadata": {"name": name},
        "spec": spec,
    }


def node_pool(
    name: str,
    *,
    node_class_name: str,
    instance_types: list[str],
    labels: Mapping[str, str],
    startup_taints: list[dict[str, str]] | None = None,
    gpu_limit: int = 16,
    weight: int | None = None,
    consolidate_after: str = "Never",
    expire_after: str = "Never",
    termination_grace_period: str | None = None,
) -> dict[str, Any]:
    """A NodePool of ``instance_types`` whose nodes carry ``labels`` (and ``startup_taints``:
    sdcguard's gate, so a new node takes no work before acceptance)."""
    spec: dict[str, Any] = {
        "template": {
            "metadata": {"labels": dict(labels)},
            "spec": {
                "nodeClassRef": {
                    "group": KWOK_GROUP,
                    "kind": "KWOKNodeClass",
                    "name": node_class_name,
                },
                "requirements": [
                    {
                        "key": "node.kubernetes.io/instance-type",
                        "operator": "In",
                        "values": instance_types,
                    },
                    {
                        "key": "karpenter.sh/capacity-type",
                        "operator": "In",
                        "values": ["on-demand"],
                    },
                ],
                "startupTaints": startup_taints or [],
                "expireAfter": expire_after,
            },
        },
        "limits": {"nvidia.com/gpu": str(gpu_limit)},
        "disruption": {
            "consolidationPolicy": "WhenEmptyOrUnderutilized",
            "consolidateAfter": consolidate_after,
            "budgets": [{"nodes": "100%"}],
        },
    }
    if weight is not None:
        spec["weight"] = weight
    if termination_grace_period is not None:
        spec["template"]["spec"]["terminationGracePeriod"] = termination_grace_period
    return {
        "apiVersion": f"{KARPENTER_GROUP}/{KARPENTER_V1}",
        "kind": "NodePool",
        "metadata": {"name": name},
        "spec": spec,
    }


def create(api: client.ApiClient, body: dict[str, Any]) -> None:
    group, version = body["apiVersion"].split("/")
    plural = {"NodePool": "nodepools", "KWOKNodeClass": "kwoknodeclasses"}[body["kind"]]
    client.CustomObjectsApi(api).create_cluster_custom_object(group, version, plural, body)


def node_claims(api: client.ApiClient, pool: str | None = None) -> list[dict[str, Any]]:
    items = client.CustomObjectsApi(api).list_cluster_custom_object(
        KARPENTER_GROUP, KARPENTER_V1, "nodeclaims"
    )["items"]
    return [
        i
        for i in items
        if pool is None or (i["metadata"].get("labels") or {}).get(NODEPOOL_LABEL) == pool
    ]


def launches(kp: KarpenterProcess, pool: str) -> list[tuple[str, list[str]]]:
    """Each NodeClaim Karpenter's provisioner created for ``pool``, with the provisionable
    Pods (namespace/name) its scheduling pass found, from Karpenter's own log."""
    found = {
        r.get("reconcileID"): [p.strip() for p in str(r.get("Pods", "")).split(",") if p.strip()]
        for r in kp.log_lines("found provisionable pod(s)")
    }
    return [
        (str(r["NodeClaim"]["name"]), found.get(r.get("reconcileID"), []))
        for r in kp.log_lines("created nodeclaim")
        if (r.get("NodePool") or {}).get("name") == pool
    ]


def condition(obj: Mapping[str, Any], ctype: str) -> dict[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == ctype:
            return dict(cond)
    return None


def delete_pools(api: client.ApiClient, pools: Iterable[str], timeout: float = 60) -> None:
    """Delete NodePools (Karpenter then deletes their NodeClaims and nodes) and wait."""
    custom = client.CustomObjectsApi(api)
    pools = list(pools)
    for pool in pools:
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(KARPENTER_GROUP, KARPENTER_V1, "nodepools", pool)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not [
            c for c in node_claims(api) if c["metadata"]["labels"].get(NODEPOOL_LABEL) in pools
        ]:
            return
        time.sleep(0.5)
