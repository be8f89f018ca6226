"""Karpenter, the fleet simulator (adopting Karpenter's nodes) and the sdcguard operator,
together against the session's control plane, for the autoscaling scenarios."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client

from sdcdev.cluster.localcluster import LocalCluster
from sdcdev.harness import OperatorProcess, apply_crds, delete_all, ensure_namespace
from sdcdev.sim import SimOptions, Simulator
from sdcdev.sim.adopt import AdoptRule, NodeAdopter, adoption_fleet
from sdcdev.sim.fleet import FaultProfile
from tests.autoscaling import karpenter as K

#: A node whose device 1 flips exponent bits in matmuls: the probe's cross-device
#: comparison fails on every run.
SICK = FaultProfile(
    faults=[{"site": "matmul", "rate": 1.0e-2, "bits": "exp", "mode": "flip", "device": 1}]
)
GPU_TYPE = "p5.48xlarge"
#: NodePool roles whose nodes the simulator makes sick, and healthy ones.
SICK_POOLS = ("sick", "rsick", "xsick", "hsick")
HEALTHY_POOLS = ("gated", "plain", "spare", "rspare", "xscreen", "unreg", "nogate", "ref")


@dataclass
class World:
    api: client.ApiClient
    case: str
    karpenter: K.KarpenterProcess
    sim: Simulator
    adopter: NodeAdopter
    operator: OperatorProcess
    #: A trusted baseline for the nodes' fingerprint exists (two nodes agreed on one):
    #: without it a healthy node's checks stay Inconclusive (BaselineAbsent).
    baseline_agreed: bool = False

    def pool(self, role: str) -> str:
        """NodePool names of this run, by role (``SICK_POOLS``, ``HEALTHY_POOLS``)."""
        return f"{role}-{self.case}"


@pytest.fixture(scope="module")
def world(
    cluster: LocalCluster, api_client: client.ApiClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    case = uuid.uuid4().hex[:5]
    workdir = Path(tmp_path_factory.mktemp("autoscaling"))
    apply_crds(api_client)
    ensure_namespace(api_client)
    # Node repair on (it is off by default): it acts only on the conditions of its repair
    # policies, which the simulator's nodes show only when a test sets them.
    kp = K.KarpenterProcess(
        cluster.kubeconfig,
        workdir,
        instance_type_names=[GPU_TYPE],
        feature_gates={"NodeRepair": True},
    )
    kp.start(api_client)
    sim = Simulator(
        adoption_fleet(f"karpenter-{case}"),
        api_client,
        SimOptions(heartbeat_seconds=5, workdir=workdir / "sim", repair=False),
    )
    rules = [
        *(
            AdoptRule({K.NODEPOOL_LABEL: f"{r}-{case}"}, fault_profile=SICK, name=r)
            for r in SICK_POOLS
        ),
        *(AdoptRule({K.NODEPOOL_LABEL: f"{r}-{case}"}, name=r) for r in HEALTHY_POOLS),
    ]
    adopter = NodeAdopter(sim, rules)
    operator = OperatorProcess(cluster.kubeconfig, workdir / "operator.log")
    pools = [f"{r}-{case}" for r in (*SICK_POOLS, *HEALTHY_POOLS)]
    try:
        sim.start()
        adopter.start()
        K.create(api_client, K.node_class(f"kwok-{case}"))
        K.create(api_client, K.node_class(f"kwok-slow-{case}", registration_delay="1h"))
        operator.start()
        yield World(api_client, case, kp, sim, adopter, operator)
    finally:
        K.delete_pools(api_client, pools)
        operator.stop()
        adopter.stop()
        sim.stop(cleanup=True)
        kp.stop()
        delete_all(api_client)
        core = client.CoreV1Api(api_client)
        core.delete_collection_namespaced_pod("default", label_selector=f"autoscaling-case={case}")
        for node_class in (f"kwok-{case}", f"kwok-slow-{case}"):
            with contextlib.suppress(Exception):
                client.CustomObjectsApi(api_client).delete_cluster_custom_object(
                    K.KWOK_GROUP, K.KWOK_V1, "kwoknodeclasses", node_class
                )


@pytest.fixture(autouse=True)
def _show_logs(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed and "world" in request.fixturenames:
        w: World = request.getfixturevalue("world")
        print("---- operator log (tail) ----\n" + w.operator.log_tail(60))
        print("---- karpenter log (tail) ----\n" + w.karpenter.log_tail(60))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, f"rep_{report.when}", report)
