"""sdcguard with Karpenter v1.15 (kwok cloud provider) in the loop.

Pending GPU pods make the real Karpenter controllers launch NodeClaims; Karpenter creates
the Nodes, the fleet simulator adopts them (Ready, kubelet, real probe runs) and the
operator screens them. NodePools list sdcguard's gate in ``startupTaints``.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from typing import Any

import pytest
from kubernetes import client

from sdcdev.harness import (
    GATE,
    GROUP,
    NS,
    QUARANTINE,
    TESTING,
    VERSION,
    list_custom,
    policy_body,
    wait_for,
)
from sdcdev.sim.fleet import RUN_SECONDS_ANNOTATION
from sdcdev.sim.repair import external_ref
from sdcguard.builders.probe_job import TEST_LABEL, label_value
from tests.autoscaling import karpenter as K
from tests.autoscaling.conftest import GPU_TYPE, World

CASE_LABEL = "sdcguard.test/case"
STATE_LABEL = "sdcguard.dev/state"
GATE_TAINT = [{"key": GATE, "effect": "NoSchedule"}]
FINISHED = {"Passed", "Failed", "Inconclusive", "Cancelled"}


def _policy(
    w: World, name: str, label: str, probe: dict[str, Any] | None = None, **spec: Any
) -> None:
    suite = [{"name": c} for c in ("compute", "collective", "golden")]
    body = policy_body(
        name,
        match_labels={CASE_LABEL: label},
        probe=probe or {"budgetSeconds": 10, "activeDeadlineSeconds": 120, "cpuDevices": 2},
        suites={"acceptance": suite, "requalification": suite, "repairVerification": suite},
        triggers={"onReturnFromUse": {"enabled": True, "idleFor": "1h"}},
        **spec,
    )
    client.CustomObjectsApi(w.api).create_cluster_custom_object(GROUP, VERSION, "sdcpolicies", body)


def _pool(w: World, role: str, label: str, *, slow: bool = False, **overrides: Any) -> None:
    """Create this case's kwok NodePool ``role``: GPU nodes labelled ``label``, gated by
    sdcguard's startup taint and room for one 8-GPU node, unless ``overrides`` say
    otherwise (``slow``: the node class whose nodes never register in time)."""
    fields: dict[str, Any] = {"startup_taints": GATE_TAINT, "gpu_limit": 8, **overrides}
    K.create(
        w.api,
        K.node_pool(
            w.pool(role),
            node_class_name=f"kwok-slow-{w.case}" if slow else f"kwok-{w.case}",
            instance_types=[GPU_TYPE],
            labels={CASE_LABEL: label},
            **fields,
        ),
    )


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


def _registered(w: World, role: str, timeout: float = 90) -> tuple[dict[str, Any], str]:
    """The first NodeClaim of the role's pool whose Node registered, and the Node's name."""
    claim = wait_for(
        # A NodeClaim just created has no status yet.
        lambda: [
            c for c in K.node_claims(w.api, w.pool(role)) if (c.get("status") or {}).get("nodeName")
        ],
        timeout,
        f"a node of NodePool {w.pool(role)} to register",
    )[0]
    return claim, str(claim["status"]["nodeName"])


def _state(w: World, node: str) -> str | None:
    return (client.CoreV1Api(w.api).read_node(node).metadata.labels or {}).get(STATE_LABEL)


def _wait_state(w: World, node: str, state: str, timeout: float = 240) -> None:
    wait_for(lambda: _state(w, node) == state, timeout, f"{node} to be {state}", every=1)


def _running(w: World, pod_name: str, timeout: float = 240) -> client.V1Pod:
    core = client.CoreV1Api(w.api)
    return wait_for(
        lambda: (
            p
            if (p := core.read_namespaced_pod(pod_name, "default")).status.phase == "Running"
            else None
        ),
        timeout,
        f"pod {pod_name} to run",
        every=1,
    )


def _node_gone(w: World, node: str) -> bool:
    try:
        client.CoreV1Api(w.api).read_node(node)
    except client.exceptions.ApiException as exc:
        return exc.status == 404
    return False


def _claim_gone(w: World, name: str) -> bool:
    return name not in {c["metadata"]["name"] for c in K.node_claims(w.api)}


def _closed_ticket(w: World, name: str, what: str) -> dict[str, Any]:
    """Wait until the RepairTicket ``name`` is Closed; returns it."""

    def closed() -> dict[str, Any] | None:
        ticket = get_custom(w.api, "repairtickets", name)
        return ticket if (ticket.get("status") or {}).get("phase") == "Closed" else None

    found: dict[str, Any] = wait_for(closed, 60, what, every=1)
    return found


def _operator_log(w: World) -> list[dict[str, Any]]:
    out = []
    for line in w.operator.log_path.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def _tickets(w: World, node: str) -> list[dict[str, Any]]:
    return list_custom(w.api, "repairtickets", node)


def _sdc_condition(w: World, node: str) -> tuple[str, str] | None:
    """The node's SDCQualified condition as (status, reason), if it has one."""
    for c in client.CoreV1Api(w.api).read_node(node).status.conditions or []:
        if c.type == "SDCQualified":
            return c.status, c.reason or ""
    return None


def _time(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def _scheduled_at(pod: client.V1Pod) -> dt.datetime | None:
    for cond in pod.status.conditions or []:
        if cond.type == "PodScheduled" and cond.status == "True":
            return cond.last_transition_time  # type: ignore[no-any-return]
    return None


@pytest.fixture
def agreed_baseline(world: World) -> None:
    """A trusted baseline for the nodes' fingerprint, which a healthy node needs to
    qualify (the policies ask a consensus of two). The module's first test makes one (its
    two gated nodes agree); a test run without it makes it here the same way: two nodes
    of a reference pool agree, then the pool goes."""
    w = world
    if w.baseline_agreed:
        return
    label = f"{w.case}-ref"
    _pool(w, "ref", label, gpu_limit=16, consolidate_after="0s")
    _policy(w, f"p-{label}", label)
    pods = [f"ref-{i}-{w.case}" for i in range(2)]
    for pod in pods:
        _gpu_pod(w, pod, label, run_seconds=5)
    core = client.CoreV1Api(w.api)

    def ran(pod: str) -> bool:
        phase = core.read_namespaced_pod(pod, "default").status.phase
        return phase in ("Running", "Succeeded")

    wait_for(lambda: all(ran(p) for p in pods), 300, "two reference nodes to agree", every=1)
    nodes = {core.read_namespaced_pod(p, "default").spec.node_name for p in pods}
    passed = {
        t["spec"]["nodeName"]
        for t in list_custom(w.api, "sdctests")
        if t["spec"]["nodeName"] in nodes and (t.get("status") or {}).get("phase") == "Passed"
    }
    # Each pod ran on a node whose acceptance test passed against the agreed digests.
    assert len(nodes) == 2 and passed == nodes, (nodes, passed)
    for pod in pods:
        core.delete_namespaced_pod(pod, "default", grace_period_seconds=0)
    client.CustomObjectsApi(w.api).delete_cluster_custom_object(
        GROUP, VERSION, "sdcpolicies", f"p-{label}"
    )
    K.delete_pools(w.api, [w.pool("ref")])
    w.baseline_agreed = True


def test_scale_up_waits_for_acceptance_without_extra_capacity(world: World) -> None:
    w, core = world, client.CoreV1Api(world.api)
    gated, plain = f"{w.case}-gated", f"{w.case}-plain"
    for role, label, taints in (("gated", gated, GATE_TAINT), ("plain", plain, None)):
        _pool(w, role, label, startup_taints=taints, gpu_limit=16, consolidate_after="10s")
    _policy(w, f"p-{gated}", gated, baseline={"mode": "Consensus", "quorum": 2})

    pods = {"gated-0": gated, "gated-1": gated, "plain-0": plain}
    t0 = time.monotonic()
    for name, label in pods.items():
        # Gated pods run long enough that no gated node is consolidated before the checks.
        _gpu_pod(w, f"{name}-{w.case}", label, run_seconds=15 if label == plain else 45)

    running_after: dict[str, float] = {}
    state_at_bind: dict[str, str | None] = {}
    gated_claims: set[str] = set()
    claim_created: dict[str, str] = {}
    claim_nodes: dict[str, str] = {}
    bound: dict[str, str] = {}
    gated_reasons: set[str] = set()
    deadline = t0 + 300
    while len(running_after) < len(pods) and time.monotonic() < deadline:
        claims = K.node_claims(w.api, w.pool("gated"))
        gated_claims |= {c["metadata"]["name"] for c in claims}
        claim_created.update(
            {c["metadata"]["name"]: c["metadata"]["creationTimestamp"] for c in claims}
        )
        claim_nodes.update(
            {
                c["metadata"]["name"]: c["status"]["nodeName"]
                for c in claims
                if (c.get("status") or {}).get("nodeName")
            }
        )
        for c in claims:
            init = K.condition(c, "Initialized")
            if init is not None:
                gated_reasons.add(str(init.get("reason")))
            assert not c["metadata"].get("deletionTimestamp"), "Karpenter gave up a gated node"
        for name in pods:
            if name in running_after:
                continue  # a finished pod's node may be consolidated, the pod gone
            pod = core.read_namespaced_pod(f"{name}-{w.case}", "default")
            node = pod.spec.node_name
            if node:
                bound[name] = node
            if node and name not in state_at_bind:
                state_at_bind[name] = (core.read_node(node).metadata.labels or {}).get(STATE_LABEL)
            if pod.status.phase == "Running" and name not in running_after:
                running_after[name] = time.monotonic() - t0
        time.sleep(0.5)
    assert len(running_after) == len(pods), f"pods not running in time: {running_after}"

    # Without sdcguard (same run): one NodeClaim for its one pod (counted in Karpenter's
    # log: the idle plain node may be consolidated already).
    assert len(K.launches(w.karpenter, w.pool("plain"))) == 1
    # With the gate: one NodeClaim per pod, each launched (Karpenter's log says) by a
    # scheduling pass for our pending pods. A claim beyond that is allowed only once a
    # probe Pod held a gated node's GPUs (probe Pods request every device, so the pending
    # pod no longer fits there in Karpenter's simulation): the probe took the capacity,
    # not the gate. Before any probe ran, the gate alone never cost a launch.
    launches = K.launches(w.karpenter, w.pool("gated"))
    assert {c for c, _ in launches} == gated_claims, (launches, gated_claims)
    ours = {f"default/{n}-{w.case}" for n in pods}
    for claim_name, found in launches:
        assert found and set(found) <= ours, (claim_name, found)
    assert len(launches) >= 2
    first_nodes = {claim_nodes[c] for c, _ in launches[:2]}
    probe_started = min(
        _time(t["metadata"]["creationTimestamp"])
        for t in list_custom(w.api, "sdctests")
        if t["spec"]["nodeName"] in first_nodes
    )
    extra = [c for c, _ in launches[2:]]
    for claim_name in extra:
        assert _time(claim_created[claim_name]) >= probe_started, (
            f"{claim_name} was launched before any probe ran: the gate cost capacity"
        )
    # While gated, Karpenter saw an uninitialized node (its startup taint), not a failure.
    assert "StartupTaintsExist" in gated_reasons, gated_reasons
    for claim in K.node_claims(w.api, w.pool("gated")):
        assert (K.condition(claim, "Initialized") or {}).get("status") == "True"

    for name, label in pods.items():
        node = bound[name]
        tests = list_custom(w.api, "sdctests", node)
        if label == plain:
            assert tests == [] and state_at_bind[name] is None
            continue
        pod = core.read_namespaced_pod(f"{name}-{w.case}", "default")
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

    w.baseline_agreed = True  # its gated nodes passed: they agreed on a baseline
    gated_s = sorted(v for k, v in running_after.items() if k.startswith("gated"))
    print(
        f"pending->running: with sdcguard {gated_s[0]:.1f}-{gated_s[-1]:.1f}s, "
        f"without {running_after['plain-0']:.1f}s (same run); gated NodeClaims "
        f"{len(launches)} for 2 pods ({len(extra)} launched while probes held GPUs)"
    )
    assert running_after["plain-0"] < gated_s[0]


def test_screened_nodes_consolidate_when_idle(world: World) -> None:
    """After the pods finish, Karpenter removes the screened nodes like any idle node:
    sdcguard left no taint or annotation that blocks consolidation."""
    w, core = world, client.CoreV1Api(world.api)
    gated = K.node_claims(w.api, w.pool("gated"))
    assert len(gated) >= 2, "runs after the scale-up test"
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


def test_quarantine_keeps_node_and_gets_replacement_capacity(
    world: World, agreed_baseline: None
) -> None:
    w, core = world, client.CoreV1Api(world.api)
    label = f"{w.case}-q"
    # The sick pool is preferred (weight) but holds one node; the spare pool is the fallback.
    for role, weight in (("sick", 100), ("spare", 10)):
        _pool(w, role, label, weight=weight, consolidate_after="0s")
    _policy(w, f"p-{label}", label, repair={"strategy": "InPlace", "maxRepairCycles": 2})
    _gpu_pod(w, f"q-0-{w.case}", label, run_seconds=600)

    sick, sick_node = _registered(w, "sick")
    _wait_state(w, sick_node, "Quarantined")
    node = core.read_node(sick_node)
    assert (node.metadata.annotations or {}).get(K.DO_NOT_DISRUPT) == "true"
    assert QUARANTINE in {t.key for t in node.spec.taints or []}
    assert _tickets(w, sick_node)

    # Replacement capacity: the pending pod lands on a node of the spare pool.
    pod = _running(w, f"q-0-{w.case}")
    spare = K.node_claims(w.api, w.pool("spare"))
    assert [(c.get("status") or {}).get("nodeName") for c in spare] == [pod.spec.node_name]
    assert (core.read_node(pod.spec.node_name).metadata.labels or {}).get(STATE_LABEL) == (
        "Qualified"
    ), "the replacement went through acceptance first"
    # The quarantined node is empty and its pool consolidates at once, yet it stays.
    time.sleep(20)
    claims = K.node_claims(w.api, w.pool("sick"))
    assert [c["metadata"]["name"] for c in claims] == [sick["metadata"]["name"]]
    assert not claims[0]["metadata"].get("deletionTimestamp")
    assert _state(w, sick_node) == "Quarantined"


def test_replace_deletes_the_node_claim(world: World, agreed_baseline: None) -> None:
    """``repair.strategy: Replace``: once the repair side takes the ticket, sdcguard deletes
    the node's NodeClaim (the instance; Karpenter then drains and deletes the Node) under
    its own repair budget, and closes the ticket as Replaced."""
    w = world
    custom = client.CustomObjectsApi(w.api)
    label = f"{w.case}-r"
    for role, weight in (("rsick", 100), ("rspare", 10)):
        _pool(w, role, label, weight=weight)
    _policy(w, f"p-{label}", label, repair={"strategy": "Replace", "maxRepairCycles": 2})
    _gpu_pod(w, f"r-0-{w.case}", label, run_seconds=600)

    claim, sick_node = _registered(w, "rsick")
    _wait_state(w, sick_node, "Quarantined")
    ticket = wait_for(lambda: _tickets(w, sick_node), 30, "its RepairTicket")[0]
    name = ticket["metadata"]["name"]
    # The repair side takes the ticket.
    custom.patch_cluster_custom_object(
        GROUP, VERSION, "repairtickets", name, {"spec": {"external": external_ref("test", name)}}
    )
    wait_for(lambda: _node_gone(w, sick_node), 90, "the sick Node to be deleted", every=1)
    wait_for(
        lambda: _claim_gone(w, claim["metadata"]["name"]),
        90,
        "the sick node's NodeClaim to be gone",
        every=1,
    )
    deleted = [
        r
        for r in _operator_log(w)
        if r.get("event") == "nodeclaim deleted" and r.get("node") == sick_node
    ]
    # (Asked again while Karpenter drains the node: a delete is idempotent.)
    assert deleted and {r.get("nodeclaim") for r in deleted} == {claim["metadata"]["name"]}
    pod = _running(w, f"r-0-{w.case}")
    assert _state(w, pod.spec.node_name) == "Qualified"
    closed = _closed_ticket(w, name, "the replaced node's ticket to close")
    assert closed["spec"]["resolution"] == "Replaced"
    assert "deleted for replacement" in closed["status"]["history"][-1]["message"]


def _probe_jobs(w: World, test_name: str) -> list[client.V1Job]:
    selector = f"{TEST_LABEL}={label_value(test_name)}"
    return list(client.BatchV1Api(w.api).list_namespaced_job(NS, label_selector=selector).items)


def get_custom(w_api: client.ApiClient, plural: str, name: str) -> dict[str, Any]:
    return client.CustomObjectsApi(w_api).get_cluster_custom_object(  # type: ignore[no-any-return]
        GROUP, VERSION, plural, name
    )


def _policy_counts_nothing(w: World, policy: str) -> bool:
    """The policy's status counts no node at all (its nodes are gone): none testing,
    none held in quarantine, no budget taken."""
    counts = ((get_custom(w.api, "sdcpolicies", policy).get("status") or {}).get("counts")) or {}
    return not any(v for v in counts.values() if isinstance(v, int))


def _launched(w: World, role: str, pod: str) -> dict[str, Any]:
    """Create a pending GPU pod for the role's pool, wait for Karpenter's first NodeClaim
    for it, then delete the pod (no second launch when that node goes)."""
    _gpu_pod(w, pod, w.case + "-" + role, run_seconds=600)
    claim = wait_for(lambda: K.node_claims(w.api, w.pool(role)), 60, f"Karpenter to launch {role}")[
        0
    ]
    client.CoreV1Api(w.api).delete_namespaced_pod(pod, "default", grace_period_seconds=0)
    return claim


def test_expiry_ends_a_screening_and_a_quarantine_with_true_records(world: World) -> None:
    """``expireAfter`` is forceful: Karpenter deletes an expired NodeClaim although
    sdcguard is screening the node (the probe Pod's do-not-disrupt) or holds it in
    quarantine (the Node's do-not-disrupt). sdcguard's records follow the node out: the
    running test ends Inconclusive (NodeGone) with its Job deleted, the quarantine
    ticket closes saying who deleted the node, and nothing stays reserved."""
    w, core = world, client.CoreV1Api(world.api)
    slow_probe = {"budgetSeconds": 60, "activeDeadlineSeconds": 150, "cpuDevices": 2}
    # The screening node expires mid-probe (60 s budget); the sick one after its
    # quarantine (two failed probe runs, slow on shared cores).
    for role, expire in (("xscreen", "40s"), ("xsick", "150s")):
        label = f"{w.case}-{role}"
        _pool(w, role, label, expire_after=expire, termination_grace_period="5s")
        repair = {"strategy": "InPlace", "maxRepairCycles": 2}
        if role == "xscreen":
            _policy(w, f"p-{label}", label, repair=repair, probe=slow_probe)
        else:
            _policy(w, f"p-{label}", label, repair=repair)
    screen_claim = _launched(w, "xscreen", f"x-0-{w.case}")
    sick_claim = _launched(w, "xsick", f"x-1-{w.case}")

    # Expiry in the middle of a screening.
    _, screen_node = _registered(w, "xscreen")
    started = wait_for(
        lambda: list_custom(w.api, "sdctests", screen_node), 40, "the acceptance test", every=1
    )[0]
    test_name = started["metadata"]["name"]
    wait_for(lambda: _node_gone(w, screen_node), 90, "Karpenter to expire the node", every=1)
    ended = wait_for(
        lambda: (
            t
            if ((t := get_custom(w.api, "sdctests", test_name)).get("status") or {}).get("phase")
            == "Inconclusive"
            else None
        ),
        60,
        "the test to end Inconclusive",
        every=1,
    )
    # Karpenter's drain deletes the probe Pod first (its terminationGracePeriod passed
    # the probe's do-not-disrupt), then the Node: whichever sdcguard sees first is the
    # reason, and neither is a crash of the probe or a fault of the hardware.
    reason, message = ended["status"]["reason"], ended["status"]["message"]
    assert (reason, message) in {
        ("ProbePodDeleted", message if message.startswith("the probe Pod was deleted") else ""),
        ("NodeGone", f"node {screen_node} no longer exists"),
    }, ended["status"]
    print(f"expiry mid-screening: {reason}: {message}")
    wait_for(lambda: not _probe_jobs(w, test_name), 30, "the probe Job to be deleted", every=1)
    # Any later test on the draining node ends too, its Job gone: nothing left behind.
    wait_for(
        lambda: all(
            (t.get("status") or {}).get("phase") in FINISHED
            and not _probe_jobs(w, t["metadata"]["name"])
            for t in list_custom(w.api, "sdctests", screen_node)
        ),
        60,
        "every test of the expired node to end without a Job",
        every=1,
    )
    assert not _tickets(w, screen_node)

    # Expiry of a quarantined node: the Node's do-not-disrupt does not stop it.
    _, sick_node = _registered(w, "xsick")
    _wait_state(w, sick_node, "Quarantined", timeout=140)
    node = core.read_node(sick_node)
    assert (node.metadata.annotations or {}).get(K.DO_NOT_DISRUPT) == "true"
    ticket = wait_for(lambda: _tickets(w, sick_node), 30, "its RepairTicket")[0]
    wait_for(lambda: _node_gone(w, sick_node), 180, "Karpenter to expire the node", every=1)
    closed = _closed_ticket(w, ticket["metadata"]["name"], "the expired node's ticket to close")
    assert "not by sdcguard" in closed["status"]["history"][-1]["message"]
    assert closed["spec"].get("resolution") is None, "no repair side answered"
    assert not [
        t
        for t in list_custom(w.api, "sdctests", sick_node)
        if (t.get("status") or {}).get("phase") not in FINISHED
    ]

    expired = {
        (r.get("NodeClaim") or {}).get("name")
        for r in w.karpenter.log_lines("deleting expired nodeclaim")
    }
    assert {screen_claim["metadata"]["name"], sick_claim["metadata"]["name"]} <= expired
    # Nothing stays reserved: the policies count no node tested or held.
    for role in ("xscreen", "xsick"):
        wait_for(
            lambda role=role: _policy_counts_nothing(w, f"p-{w.case}-{role}"),
            60,
            f"policy p-{w.case}-{role} to count no node",
            every=1,
        )


def test_node_claim_that_never_registers_leaves_no_records(world: World) -> None:
    """An instance that never registers (its KWOKNodeClass holds the Node back an hour):
    no Node, so sdcguard makes no record about it; Karpenter's own lifecycle ends the
    NodeClaim (here its expiry; the registration timeout, 15 minutes and fixed in
    Karpenter v1.15, would do the same)."""
    w = world
    label = f"{w.case}-unreg"
    _pool(w, "unreg", label, slow=True, expire_after="20s")
    _policy(w, f"p-{label}", label)
    claim = _launched(w, "unreg", f"u-0-{w.case}")
    name = claim["metadata"]["name"]
    launched = wait_for(
        lambda: [
            c
            for c in K.node_claims(w.api, w.pool("unreg"))
            if (K.condition(c, "Launched") or {}).get("status") == "True"
        ],
        30,
        "Karpenter to launch the instance",
        every=1,
    )[0]
    assert (K.condition(launched, "Registered") or {}).get("status") != "True"
    wait_for(
        lambda: _claim_gone(w, name),
        60,
        "Karpenter to end the unregistered NodeClaim",
        every=1,
    )
    expired = {
        (r.get("NodeClaim") or {}).get("name")
        for r in w.karpenter.log_lines("deleting expired nodeclaim")
    }
    assert name in expired
    nodes = client.CoreV1Api(w.api).list_node(
        label_selector=f"{K.NODEPOOL_LABEL}={w.pool('unreg')}"
    )
    assert nodes.items == []
    ours = {
        plural: [
            i["metadata"]["name"]
            for i in list_custom(w.api, plural)
            if i["spec"].get("policyRef") == f"p-{label}" or name in i["metadata"]["name"]
        ]
        for plural in ("sdctests", "repairtickets")
    }
    assert ours == {"sdctests": [], "repairtickets": []}, ours
    assert _policy_counts_nothing(w, f"p-{label}")


def test_node_pool_without_the_gate_is_screened_or_named(
    world: World, agreed_baseline: None
) -> None:
    """A NodePool without the gate in startupTaints: the scheduler may bind pods to the
    new node before sdcguard sees it. Either sdcguard gated it first (the pod then ran
    only after acceptance passed), or the node is admitted untested with an Event that
    names the missing gate; never silently. The second includes a pod bound in the
    moment before the gate landed: the acceptance test, whose probe cannot be
    scheduled beside the pod, is cancelled and the node admitted."""
    w, core = world, client.CoreV1Api(world.api)
    label = f"{w.case}-nogate"
    _pool(w, "nogate", label, startup_taints=None, gpu_limit=24)
    _policy(w, f"p-{label}", label)
    _gpu_pod(w, f"n-0-{w.case}", label, run_seconds=600)
    pod = _running(w, f"n-0-{w.case}")
    node = pod.spec.node_name

    def seen() -> tuple[list[dict[str, Any]], list[client.CoreV1Event]] | None:
        passed = [
            t
            for t in list_custom(w.api, "sdctests", node)
            if (t.get("status") or {}).get("phase") == "Passed"
        ]
        events = [
            e
            for e in core.list_event_for_all_namespaces(
                field_selector=f"involvedObject.name={node},reason=Admitted"
            ).items
            if "joined without the gate taint" in (e.message or "")
        ]
        return (passed, events) if passed or events else None

    # The Admitted Event follows the node's write, which a conflict can send round again
    # (a 409 with Karpenter's own writes to the new node): wait for one outcome or the other.
    passed, events = wait_for(
        seen,
        30,
        f"a passed test or an Admitted Event naming the gate on {node}",
    )
    scheduled = _scheduled_at(pod)
    assert scheduled is not None
    if passed:
        outcome = "gated first, screened"
        assert _time(passed[0]["status"]["completionTime"]).replace(microsecond=0) <= scheduled
    else:
        outcome = "admitted untested, Event names the gate"
        assert events, "a node that took work before screening must say so"
        assert "startupTaints" in (events[0].message or "")
    claims = K.node_claims(w.api, w.pool("nogate"))
    print(f"NodePool without the gate: {outcome}; {len(claims)} NodeClaim(s) for 1 pod")


def test_karpenter_node_repair_wins_over_quarantine(world: World) -> None:
    """Karpenter's node repair (feature gate NodeRepair) acts on node conditions; the
    quarantine's do-not-disrupt does not stop it (only karpenter.sh/do-not-repair would,
    and sdcguard never sets it). A quarantined node that also turns unhealthy is replaced
    by Karpenter, and its ticket closes saying sdcguard did not delete it."""
    w, core = world, client.CoreV1Api(world.api)
    label = f"{w.case}-hsick"
    _pool(w, "hsick", label)
    _policy(w, f"p-{label}", label, repair={"strategy": "InPlace", "maxRepairCycles": 2})
    claim = _launched(w, "hsick", f"h-0-{w.case}")
    _, sick_node = _registered(w, "hsick")
    _wait_state(w, sick_node, "Quarantined")
    ticket = wait_for(lambda: _tickets(w, sick_node), 30, "its RepairTicket")[0]
    assert (core.read_node(sick_node).metadata.annotations or {}).get(K.DO_NOT_DISRUPT) == "true"
    assert K.DO_NOT_REPAIR not in (core.read_node(sick_node).metadata.annotations or {})
    # sdcguard's own condition says the node failed; Karpenter's repair reads only its
    # cloud provider's conditions (a NodePool cannot add one), so past the provider's
    # toleration (30 s) the node is still there, as docs/guides/cluster-shapes.md says.
    wait_for(
        lambda: _sdc_condition(w, sick_node) == ("False", "Quarantined"),
        30,
        "SDCQualified=False on the quarantined node",
    )
    time.sleep(40)
    assert not _node_gone(w, sick_node), "Karpenter acted on SDCQualified"
    assert not [
        r for r in w.karpenter.log_lines("disrupting node(s)") if sick_node in json.dumps(r)
    ]
    # The kwok provider's simulated fault: a KWOKUnhealthy condition, tolerated 30 s.
    since = (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    core.patch_node_status(
        sick_node,
        {
            "status": {
                "conditions": [
                    {
                        "type": "KWOKUnhealthy",
                        "status": "True",
                        "reason": "SimulatedFault",
                        "message": "set by the test",
                        "lastHeartbeatTime": since,
                        "lastTransitionTime": since,
                    }
                ]
            }
        },
        # Strategic merge keys conditions by type: the kubelet's (the simulator's) stay.
        _content_type="application/strategic-merge-patch+json",
    )
    conditions = {c.type for c in core.read_node(sick_node).status.conditions or []}
    assert {"KWOKUnhealthy", "Ready"} <= conditions, "the patch merged by condition type"
    wait_for(lambda: _node_gone(w, sick_node), 150, "Karpenter to repair the node", every=1)
    # Karpenter deletes the Node first and drops the NodeClaim's finalizer after it.
    wait_for(
        lambda: _claim_gone(w, claim["metadata"]["name"]),
        60,
        "the repaired node's NodeClaim to go",
        every=1,
    )
    repaired = [
        r
        for r in w.karpenter.log_lines("disrupting node(s)")
        if str(r.get("command", "")).startswith("Unhealthy/") and sick_node in json.dumps(r)
    ]
    assert repaired, "Karpenter's repair (reason Unhealthy) took the node"
    closed = _closed_ticket(w, ticket["metadata"]["name"], "the repaired node's ticket to close")
    assert "not by sdcguard" in closed["status"]["history"][-1]["message"]
