"""sdcguard with Karpenter v1.15 (kwok cloud provider) in the loop.

Pending GPU pods make the real Karpenter controllers launch NodeClaims; Karpenter creates
the Nodes, the fleet simulator adopts them (Ready, kubelet, real probe runs) and the
operator screens them. NodePools list sdcguard's gate in ``startupTaints``.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from kubernetes import client

from sdcguard.sim.fleet import RUN_SECONDS_ANNOTATION
from sdcguard.sim.repair import external_ref
from tests.autoscaling import karpenter as K
from tests.autoscaling.conftest import GPU_TYPE, World
from tests.operator.harness import (
    GATE,
    GROUP,
    QUARANTINE,
    TESTING,
    VERSION,
    list_custom,
    policy_body,
    wait_for,
)

CASE_LABEL = "sdcguard.test/case"
STATE_LABEL = "sdcguard.dev/state"
GATE_TAINT = [{"key": GATE, "effect": "NoSchedule"}]


def _policy(w: World, name: str, label: str, **spec: Any) -> None:
    suite = [{"name": c, "timeoutSeconds": 60} for c in ("compute", "collective", "golden")]
    body = policy_body(
        name,
        match_labels={CASE_LABEL: label},
        probe={"budgetSeconds": 5, "activeDeadlineSeconds": 120, "cpuDevices": 2},
        suites={"acceptance": suite, "requalification": suite, "repairVerification": suite},
        triggers={"onReturnFromUse": {"enabled": True, "idleFor": "1h"}},
        **spec,
    )
    client.CustomObjectsApi(w.api).create_cluster_custom_object(GROUP, VERSION, "sdcpolicies", body)


def _gpu_pod(w: World, name: str, label: str, run_seconds: int) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"autoscaling-case": w.case},
            "annotations": {RUN_SECONDS_ANNOTATION: str(run_seconds)},
        },
        "spec": {
            "nodeSelector": {CASE_LABEL: label},
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "train",
                    "image": "registry.example/customer/train:1",
                    "resources": {
                        "requests": {"nvidia.com/gpu": "8", "cpu": "1"},
                        "limits": {"nvidia.com/gpu": "8"},
                    },
                }
            ],
        },
    }
    client.CoreV1Api(w.api).create_namespaced_pod("default", body)


def _time(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def _scheduled_at(pod: client.V1Pod) -> dt.datetime | None:
    for cond in pod.status.conditions or []:
        if cond.type == "PodScheduled" and cond.status == "True":
            return cond.last_transition_time  # type: ignore[no-any-return]
    return None


def test_scale_up_waits_for_acceptance_without_extra_capacity(world: World) -> None:
    w, core = world, client.CoreV1Api(world.api)
    gated, plain = f"{w.case}-gated", f"{w.case}-plain"
    for role, label, taints in (("gated", gated, GATE_TAINT), ("plain", plain, None)):
        pool = K.node_pool(
            w.pool(role),
            node_class_name=f"kwok-{w.case}",
            instance_types=[GPU_TYPE],
            labels={CASE_LABEL: label},
            startup_taints=taints,
            consolidate_after="10s",
        )
        K.create(w.api, pool)
    _policy(w, f"p-{gated}", gated, baseline={"mode": "Consensus", "quorum": 2})

    pods = {"gated-0": gated, "gated-1": gated, "plain-0": plain}
    t0 = time.monotonic()
    for name, label in pods.items():
        _gpu_pod(w, f"{name}-{w.case}", label, run_seconds=15)

    running_after: dict[str, float] = {}
    state_at_bind: dict[str, str | None] = {}
    gated_claims: set[str] = set()
    most_gated_claims = 0
    gated_reasons: set[str] = set()
    deadline = t0 + 300
    while len(running_after) < len(pods) and time.monotonic() < deadline:
        claims = K.node_claims(w.api, w.pool("gated"))
        most_gated_claims = max(most_gated_claims, len(claims))
        gated_claims |= {c["metadata"]["name"] for c in claims}
        for c in claims:
            init = K.condition(c, "Initialized")
            if init is not None:
                gated_reasons.add(str(init.get("reason")))
            assert not c["metadata"].get("deletionTimestamp"), "Karpenter gave up a gated node"
        for name in pods:
            pod = core.read_namespaced_pod(f"{name}-{w.case}", "default")
            node = pod.spec.node_name
            if node and name not in state_at_bind:
                state_at_bind[name] = (core.read_node(node).metadata.labels or {}).get(STATE_LABEL)
            if pod.status.phase == "Running" and name not in running_after:
                running_after[name] = time.monotonic() - t0
        time.sleep(0.5)
    assert len(running_after) == len(pods), f"pods not running in time: {running_after}"

    # One NodeClaim per pod in each pool: the gate made Karpenter wait, not launch more.
    assert most_gated_claims == 2 and len(gated_claims) == 2, gated_claims
    assert len(K.node_claims(w.api, w.pool("plain"))) == 1
    # While gated, Karpenter saw an uninitialized node (its startup taint), not a failure.
    assert "StartupTaintsExist" in gated_reasons, gated_reasons
    for claim in K.node_claims(w.api, w.pool("gated")):
        assert (K.condition(claim, "Initialized") or {}).get("status") == "True"

    for name, label in pods.items():
        pod = core.read_namespaced_pod(f"{name}-{w.case}", "default")
        node = pod.spec.node_name
        tests = list_custom(w.api, "sdctests", node)
        if label == plain:
            assert tests == [] and state_at_bind[name] is None
            continue
        # The pod was bound only after the node's acceptance test passed on a real probe.
        assert state_at_bind[name] == "Qualified", state_at_bind
        passed = [t for t in tests if (t.get("status") or {}).get("phase") == "Passed"]
        assert passed, tests
        scheduled = _scheduled_at(pod)
        assert scheduled is not None
        # (PodScheduled has whole seconds.)
        assert _time(passed[0]["status"]["completionTime"]).replace(microsecond=0) <= scheduled
        assert w.sim.snapshot().node(node).probes_passed >= 1
        taints = {t.key for t in core.read_node(node).spec.taints or []}
        assert not taints & {GATE, TESTING, QUARANTINE}, taints

    gated_s = sorted(v for k, v in running_after.items() if k.startswith("gated"))
    print(
        f"pending->running: with sdcguard {gated_s[0]:.1f}-{gated_s[-1]:.1f}s, "
        f"without {running_after['plain-0']:.1f}s (same run)"
    )
    assert running_after["plain-0"] < gated_s[0]


def test_screened_nodes_consolidate_when_idle(world: World) -> None:
    """After the pods finish, Karpenter removes the screened nodes like any idle node:
    sdcguard left no taint or annotation that blocks consolidation."""
    w, core = world, client.CoreV1Api(world.api)
    gated = K.node_claims(w.api, w.pool("gated"))
    assert len(gated) == 2, "runs after the scale-up test"
    for claim in gated:
        node = core.read_node(claim["status"]["nodeName"])
        assert K.DO_NOT_DISRUPT not in (node.metadata.annotations or {})
    wait_for(
        lambda: (
            not K.node_claims(w.api, w.pool("gated")) and not K.node_claims(w.api, w.pool("plain"))
        ),
        150,
        "Karpenter to consolidate the idle screened nodes",
        every=1,
    )


def test_quarantine_keeps_node_and_gets_replacement_capacity(world: World) -> None:
    w, core = world, client.CoreV1Api(world.api)
    label = f"{w.case}-q"
    # The sick pool is preferred (weight) but holds one node; the spare pool is the fallback.
    for role, weight in (("sick", 100), ("spare", 10)):
        pool = K.node_pool(
            w.pool(role),
            node_class_name=f"kwok-{w.case}",
            instance_types=[GPU_TYPE],
            labels={CASE_LABEL: label},
            startup_taints=GATE_TAINT,
            gpu_limit=8,
            weight=weight,
            consolidate_after="0s",
        )
        K.create(w.api, pool)
    _policy(w, f"p-{label}", label, repair={"strategy": "InPlace", "maxRepairCycles": 2})
    _gpu_pod(w, f"q-0-{w.case}", label, run_seconds=600)

    sick = wait_for(
        lambda: K.node_claims(w.api, w.pool("sick")), 60, "Karpenter to launch the sick node"
    )[0]
    sick_node = wait_for(
        lambda: (K.node_claims(w.api, w.pool("sick")) or [{}])[0].get("status", {}).get("nodeName"),
        60,
        "the sick node to register",
    )
    wait_for(
        lambda: (core.read_node(sick_node).metadata.labels or {}).get(STATE_LABEL) == "Quarantined",
        240,
        "the sick node to be quarantined",
        every=1,
    )
    node = core.read_node(sick_node)
    assert (node.metadata.annotations or {}).get(K.DO_NOT_DISRUPT) == "true"
    assert QUARANTINE in {t.key for t in node.spec.taints or []}
    assert list_custom(w.api, "repairtickets", sick_node)

    # Replacement capacity: the pending pod lands on a node of the spare pool.
    pod = wait_for(
        lambda: (
            p
            if (p := core.read_namespaced_pod(f"q-0-{w.case}", "default")).status.phase == "Running"
            else None
        ),
        240,
        "the pending pod to run on replacement capacity",
        every=1,
    )
    spare = K.node_claims(w.api, w.pool("spare"))
    assert [c["status"].get("nodeName") for c in spare] == [pod.spec.node_name]
    assert (core.read_node(pod.spec.node_name).metadata.labels or {}).get(STATE_LABEL) == (
        "Qualified"
    ), "the replacement went through acceptance first"
    # The quarantined node is empty and its pool consolidates at once, yet it stays.
    time.sleep(20)
    claims = K.node_claims(w.api, w.pool("sick"))
    assert [c["metadata"]["name"] for c in claims] == [sick["metadata"]["name"]]
    assert not claims[0]["metadata"].get("deletionTimestamp")
    assert (core.read_node(sick_node).metadata.labels or {}).get(STATE_LABEL) == "Quarantined"


def test_replace_deletes_the_node_and_karpenter_its_node_claim(world: World) -> None:
    """``repair.strategy: Replace``: once the repair side takes the ticket, sdcguard deletes
    the Node; Karpenter's termination then deletes its NodeClaim (the instance)."""
    w, core = world, client.CoreV1Api(world.api)
    custom = client.CustomObjectsApi(w.api)
    label = f"{w.case}-r"
    for role, weight in (("rsick", 100), ("rspare", 10)):
        pool = K.node_pool(
            w.pool(role),
            node_class_name=f"kwok-{w.case}",
            instance_types=[GPU_TYPE],
            labels={CASE_LABEL: label},
            startup_taints=GATE_TAINT,
            gpu_limit=8,
            weight=weight,
        )
        K.create(w.api, pool)
    _policy(w, f"p-{label}", label, repair={"strategy": "Replace", "maxRepairCycles": 2})
    _gpu_pod(w, f"r-0-{w.case}", label, run_seconds=600)

    claim = wait_for(
        lambda: [c for c in K.node_claims(w.api, w.pool("rsick")) if c["status"].get("nodeName")],
        90,
        "the sick node to register",
    )[0]
    sick_node = claim["status"]["nodeName"]
    wait_for(
        lambda: (core.read_node(sick_node).metadata.labels or {}).get(STATE_LABEL) == "Quarantined",
        240,
        "the sick node to be quarantined",
        every=1,
    )
    ticket = wait_for(
        lambda: list_custom(w.api, "repairtickets", sick_node), 30, "its RepairTicket"
    )[0]
    name = ticket["metadata"]["name"]
    # The repair side takes the ticket.
    custom.patch_cluster_custom_object(
        GROUP, VERSION, "repairtickets", name, {"spec": {"external": external_ref("test", name)}}
    )

    def node_gone() -> bool:
        try:
            core.read_node(sick_node)
        except client.exceptions.ApiException as exc:
            return exc.status == 404
        return False

    wait_for(node_gone, 90, "the sick Node to be deleted", every=1)
    wait_for(
        lambda: (
            claim["metadata"]["name"] not in {c["metadata"]["name"] for c in K.node_claims(w.api)}
        ),
        90,
        "Karpenter to delete the sick node's NodeClaim",
        every=1,
    )
    pod = wait_for(
        lambda: (
            p
            if (p := core.read_namespaced_pod(f"r-0-{w.case}", "default")).status.phase == "Running"
            else None
        ),
        240,
        "the pending pod to run",
        every=1,
    )
    assert (core.read_node(pod.spec.node_name).metadata.labels or {}).get(STATE_LABEL) == (
        "Qualified"
    )
    status = custom.get_cluster_custom_object(GROUP, VERSION, "repairtickets", name).get("status")
    print(f"ticket {name} after the replacement: phase {(status or {}).get('phase')}")
