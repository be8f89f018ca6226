"""The operator as the chart's Pod on the real node: Ready through its own probes,
in-cluster with its ServiceAccount, /metrics through the chart's Service, and a
screening end to end: acceptance on the real node -> Qualified.

The probe Job the operator creates runs the probe image in a real container; its
verdict comes from the termination message the kubelet wrote. The node's
fingerprint is new, so its first result waits for a baseline (AwaitingBaseline);
the test then does what a person certifying reference hardware does: copies the
node's candidate digests into the SDCBaseline and sets ``trusted: true``
(``source: Approved``), after which the held test is judged and passes.

Then, on the same node and operator: probes the kubelet cannot run (OOM, the Job's
deadline, an absent image), each Inconclusive with the kubelet's reason; and the
kubelet, then containerd, SIGKILLed mid-screening (each test Inconclusive, no taint
without its record, the daemon restarted after). The tests run in file order and share
the node's state. A fault on the real node (through the policy's probe command and
args), confirmed, quarantined, ticketed, repaired and verified with the chart's
operator Pod, is ``make demo``'s real-node row, tested in ``test_demo.py``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from sdcdev.cluster.localcluster import LocalCluster
from sdcdev.cluster.operator_pod import (
    OperatorPod,
    install_operator,
    pod_metrics,
    scrape_metrics,
    uninstall_operator,
)
from sdcdev.harness import wait_passes
from tests.chart.helm import run_helm
from tests.realnode.conftest import kubectl, kubectl_items

pytestmark = pytest.mark.cluster

NODE = "real-node-0"
STATE_LABEL = "sdcguard.dev/state"


def policy_values(name: str) -> dict[str, Any]:
    checks = {
        "compute": {},
        "collective": {},
        "golden": {},
        "memory": {"enabled": False},
    }
    return {
        "policy": {
            "name": name,
            "nodeSelector": {"matchLabels": {"sdcguard.dev/real-node": "true"}},
            "suites": {
                "acceptance": {"checks": checks},
                "requalification": {"checks": checks},
                "repairVerification": {"checks": checks},
            },
            "probe": {"cpuDevices": 2, "budgetSeconds": 10, "activeDeadlineSeconds": 300},
            "triggers": {"onReturnFromUse": {"enabled": False}},
        },
        "operator": {"resyncSeconds": 5, "logFormat": "console"},
    }


@pytest.fixture(scope="module")
def operator_pod(real_cluster: LocalCluster) -> Iterator[OperatorPod]:
    suffix = uuid.uuid4().hex[:5]
    release, namespace = f"sdcguard-rn{suffix}", f"sdcguard-rn{suffix}"
    op = install_operator(real_cluster, release, namespace, policy_values(f"rn-{suffix}"))
    print(
        f"helm install -> operator Pod {op.pod} Ready on {op.node} ({op.runtime}) "
        f"in {op.ready_seconds:.1f}s"
    )
    yield op
    uninstall_operator(real_cluster, release, namespace)


@pytest.fixture
def probe_reset(real_cluster: LocalCluster, operator_pod: OperatorPod) -> Iterator[str]:
    """The policy's name; afterwards, pass or fail, the probe as shipped again and no
    probe Job with a Pod that has not ended, so a failed test never leaves one holding
    the node's GPUs for the tests after it."""
    policy = f"rn-{operator_pod.release.removeprefix('sdcguard-rn')}"
    yield policy
    _patch_policy(
        real_cluster,
        policy,
        {
            "command": None,
            "args": None,
            "image": None,
            "resources": None,
            "activeDeadlineSeconds": 300,
        },
    )
    jobs = json.loads(
        kubectl(
            real_cluster,
            "get",
            "jobs",
            "-n",
            operator_pod.namespace,
            "-l",
            "app.kubernetes.io/component=sdcprobe",
            "-o",
            "json",
        )
    )["items"]
    for job in jobs:
        status = job.get("status") or {}
        if not status.get("active") and (status.get("succeeded") or status.get("failed")):
            continue  # its Pod ended: it holds nothing
        kubectl(
            real_cluster,
            "delete",
            "job",
            "-n",
            operator_pod.namespace,
            job["metadata"]["name"],
            "--cascade=foreground",
            "--ignore-not-found",
            "--timeout=60s",
        )


def test_operator_pod_is_ready_on_the_real_node_in_cluster(
    real_cluster: LocalCluster, operator_pod: OperatorPod
) -> None:
    assert operator_pod.node == NODE
    assert operator_pod.runtime.startswith("containerd://")
    pod = json.loads(
        kubectl(
            real_cluster, "get", "pod", "-n", operator_pod.namespace, operator_pod.pod, "-o", "json"
        )
    )
    spec = pod["spec"]
    assert spec["serviceAccountName"] == operator_pod.release
    assert spec["containers"][0]["image"].startswith("localhost/sdcguard-operator:")
    assert spec["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    # In-cluster: the Kopf liveness endpoint answers only once the operator has
    # logged in with the projected ServiceAccount token and started its handlers.
    status = pod["status"]["containerStatuses"][0]
    assert status["ready"] is True and status["restartCount"] == 0


def test_metrics_through_the_charts_service(
    real_cluster: LocalCluster, operator_pod: OperatorPod
) -> None:
    text = scrape_metrics(real_cluster, operator_pod)
    assert "# TYPE sdcguard_" in text, text[:500]
    # One replica acts alone; its process and build are on the same endpoint.
    assert "\nsdcguard_leader 1.0\n" in text
    assert "process_resident_memory_bytes" in text and "sdcguard_build_info{" in text


def test_helm_test_finds_the_operator_answering(
    real_cluster: LocalCluster, operator_pod: OperatorPod
) -> None:
    """`helm test`: the chart's test Job (the operator image) reads /metrics on the
    operator's node and succeeds."""
    proc = run_helm(
        "test",
        operator_pod.release,
        "--namespace",
        operator_pod.namespace,
        "--timeout",
        "180s",
        env=real_cluster.env(),
    )
    assert "Succeeded" in proc.stdout, proc.stdout


def test_acceptance_on_the_real_node_ends_qualified(
    real_cluster: LocalCluster, operator_pod: OperatorPod
) -> None:
    t0 = time.monotonic()
    _approve_baseline(real_cluster)
    state = _wait_state(real_cluster, "Qualified", timeout=180)
    tests = kubectl_items(real_cluster, "sdctests", "-A")
    mine = [t for t in tests if t["spec"].get("nodeName") == NODE]
    assert mine, "no SDCTest for the real node"
    verdicts = [t.get("status", {}).get("verdict") for t in mine]
    assert "Pass" in verdicts, verdicts
    print(f"real node {state} {time.monotonic() - t0:.1f}s after this test began waiting")


def _wait_candidate(cluster: LocalCluster, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        items = kubectl_items(cluster, "sdcbaselines")
        for b in items:
            for c in (b.get("status") or {}).get("candidates", []):
                if c.get("nodeName") == NODE and c.get("digests"):
                    return dict(b)
        time.sleep(2)
    tests = kubectl(cluster, "get", "sdctests", "-A", "-o", "yaml")
    raise AssertionError(
        f"no baseline candidate from {NODE} within {timeout:.0f}s:\n{tests[-3000:]}"
    )


def _wait_state(cluster: LocalCluster, want: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        node = json.loads(kubectl(cluster, "get", "node", NODE, "-o", "json"))
        state = node["metadata"].get("labels", {}).get(STATE_LABEL, "")
        if state == want:
            return state
        time.sleep(2)
    tests = kubectl(cluster, "get", "sdctests", "-A", "-o", "yaml")
    raise AssertionError(f"{NODE} is {state!r}, not {want}, after {timeout:.0f}s:\n{tests[-3000:]}")


def sdc(cluster: LocalCluster, *args: str) -> str:
    """``kubectl sdc ARGS`` (the plugin's entry point, as a module)."""
    import os
    import subprocess
    import sys

    env = dict(cluster.env(), PYTHONPATH=os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, "-m", "sdcguard.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, f"kubectl sdc {' '.join(args)}: {proc.stdout}{proc.stderr}"
    return proc.stdout


def _patch_policy(cluster: LocalCluster, name: str, probe: dict[str, Any]) -> None:
    patch = json.dumps({"spec": {"probe": probe}})
    kubectl(cluster, "patch", "sdcpolicy", name, "--type=merge", "-p", patch)


def _state(cluster: LocalCluster) -> str:
    node = json.loads(kubectl(cluster, "get", "node", NODE, "-o", "json"))
    return str(node["metadata"].get("labels", {}).get(STATE_LABEL, ""))


def _approve_baseline(cluster: LocalCluster) -> None:
    """Trust the real node's candidate digests (``source: Approved``), as a person
    certifying reference hardware does."""
    baseline = _wait_candidate(cluster, timeout=300)
    candidate = next(c for c in baseline["status"]["candidates"] if c["nodeName"] == NODE)
    patch = {"spec": {"digests": candidate["digests"], "trusted": True, "source": "Approved"}}
    kubectl(
        cluster,
        "patch",
        "sdcbaseline",
        baseline["metadata"]["name"],
        "--type=merge",
        "-p",
        json.dumps(patch),
    )


def _tests_of(cluster: LocalCluster) -> list[dict[str, Any]]:
    tests = kubectl_items(cluster, "sdctests", "-A")
    mine = [t for t in tests if t["spec"].get("nodeName") == NODE]
    return sorted(mine, key=lambda t: t["metadata"]["creationTimestamp"])


def _termination_message(cluster: LocalCluster, namespace: str, test: dict[str, Any]) -> str:
    pods = json.loads(
        kubectl(
            cluster,
            "get",
            "pods",
            "-n",
            namespace,
            "-l",
            f"sdcguard.dev/test={test['metadata']['name']}",
            "-o",
            "json",
        )
    )["items"]
    assert pods, f"no probe Pod left for {test['metadata']['name']}"
    term = pods[0]["status"]["containerStatuses"][0]["state"]["terminated"]
    return str(term["message"])


def _wait_ticket(cluster: LocalCluster, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        items = kubectl_items(cluster, "repairtickets")
        open_ = [
            t
            for t in items
            if t["spec"]["nodeName"] == NODE and (t.get("status") or {}).get("phase") != "Closed"
        ]
        if open_:
            return dict(open_[0])
        time.sleep(2)
    raise AssertionError(f"no open RepairTicket for {NODE} within {timeout:.0f}s")


@pytest.mark.parametrize(
    ("case", "probe", "reasons"),
    [
        # A memory limit far below what the probe's torch needs: the kernel kills it.
        (
            "oom",
            {"resources": {"requests": {"memory": "48Mi"}, "limits": {"memory": "48Mi"}}},
            ("OOMKilled",),
        ),
        # A probe that outlives the Job's activeDeadlineSeconds (60 s, the least a
        # policy allows): the Job controller kills it.
        (
            "deadline",
            {"command": ["sh", "-c", "sleep 600", "sh"], "activeDeadlineSeconds": 60},
            ("DeadlineExceeded",),
        ),
        # An image that is not on the node: the kubelet's pull from "localhost" (no
        # registry there) fails, or, with pull policy Never, it refuses.
        (
            "image",
            {"image": "localhost/sdcprobe:absent"},
            ("ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull"),
        ),
    ],
)
def test_a_probe_the_kubelet_cannot_run_ends_inconclusive_with_the_kubelets_reason(
    real_cluster: LocalCluster,
    operator_pod: OperatorPod,
    probe_reset: str,
    case: str,
    probe: dict[str, Any],
    reasons: tuple[str, ...],
) -> None:
    """OOM, deadline, absent image: the SDCTest ends Inconclusive (never Pass, never a
    quarantine) and its Complete condition carries the kubelet's (or the Job
    controller's) reason; for the image, its message names the image. Its probe Job
    goes with it, at once."""
    policy = probe_reset
    if _state(real_cluster) != "Qualified":
        _approve_baseline(real_cluster)
        _wait_state(real_cluster, "Qualified", timeout=300)
    before = {t["metadata"]["name"] for t in _tests_of(real_cluster)}
    _patch_policy(real_cluster, policy, probe)
    t0 = time.monotonic()
    sdc(real_cluster, "test", NODE)
    test = _wait_test_done(real_cluster, before, timeout=240)
    seconds = time.monotonic() - t0
    status = test["status"]
    assert status["phase"] == "Inconclusive", status
    assert status["verdict"] not in ("Pass", "SDC"), status
    complete = next(c for c in status["conditions"] if c["type"] == "Complete")
    said = f"{complete['reason']} {complete['message']}"
    assert any(r in said for r in reasons), complete
    if case == "image":
        assert "localhost/sdcprobe:absent" in complete["message"], complete
        # And the Node's Event says so, naming the image.
        _wait_node_event(real_cluster, "Inconclusive", "localhost/sdcprobe:absent", timeout=60)
    # The test took its Job with it when it ended: a Pod the kubelet cannot start would
    # otherwise hold the node's GPUs until the Job's deadline.
    gone = _wait_probe_gone(real_cluster, operator_pod.namespace, test, timeout=60)
    assert _state(real_cluster) not in ("Quarantined", "Suspect"), _state(real_cluster)
    print(
        f"real node, {case}: {status['verdict']} ({complete['reason']}: "
        f"{complete['message'][:120]}) {seconds:.1f}s after kubectl sdc test; "
        f"its Job and Pod gone {gone:.1f}s after that"
    )


def _probe_objects(cluster: LocalCluster, namespace: str, test: str) -> list[str]:
    out = kubectl(
        cluster,
        "get",
        "jobs,pods",
        "-n",
        namespace,
        "-l",
        f"sdcguard.dev/test={test}",
        "-o",
        "name",
    )
    return out.split()


def _wait_probe_gone(
    cluster: LocalCluster, namespace: str, test: dict[str, Any], timeout: float
) -> float:
    """Seconds until the test's probe Job and Pod are gone."""
    t0 = time.monotonic()
    left: list[str] = []
    while time.monotonic() < t0 + timeout:
        left = _probe_objects(cluster, namespace, test["metadata"]["name"])
        if not left:
            return time.monotonic() - t0
        time.sleep(1)
    raise AssertionError(f"{left} still there {timeout:.0f}s after the test ended")


def _wait_test_done(cluster: LocalCluster, before: set[str], timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    new: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        new = [
            t
            for t in _tests_of(cluster)
            if t["metadata"]["name"] not in before and t["spec"]["reason"] == "Manual"
        ]
        done = [t for t in new if (t.get("status") or {}).get("completionTime")]
        if done:
            return done[0]
        time.sleep(2)
    raise AssertionError(f"no new SDCTest of {NODE} ended within {timeout:.0f}s: {new}")


def _wait_node_event(cluster: LocalCluster, reason: str, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    while time.monotonic() < deadline:
        events = json.loads(
            kubectl(
                cluster,
                "get",
                "events",
                "-A",
                "--field-selector",
                f"involvedObject.kind=Node,involvedObject.name={NODE}",
                "-o",
                "json",
            )
        )["items"]
        seen = [f"{e.get('reason')}: {e.get('message')}" for e in events]
        if any(e.get("reason") == reason and text in (e.get("message") or "") for e in events):
            return
        time.sleep(2)
    raise AssertionError(f"no {reason} Event on {NODE} naming {text!r}: {seen[-5:]}")


@pytest.mark.parametrize("daemon", ["kubelet", "containerd"])
def test_killing_the_kubelet_or_containerd_mid_screening_ends_it_inconclusive(
    real_cluster: LocalCluster, operator_pod: OperatorPod, probe_reset: str, daemon: str
) -> None:
    """SIGKILL the node's kubelet (or containerd) while its probe runs and keep it dead:
    nothing reports the Pod's end, so the Job's deadline (60 s) ends the test
    Inconclusive, never Pass and never a quarantine, and every sdcguard taint left on
    the node has its record. Then the daemon comes back, the Pod goes, and the node is
    Qualified again for the tests after this one."""
    assert real_cluster.node is not None
    if _state(real_cluster) != "Qualified":
        _approve_baseline(real_cluster)
        _wait_state(real_cluster, "Qualified", timeout=300)
    _patch_policy(real_cluster, probe_reset, {"activeDeadlineSeconds": 60})
    before = {t["metadata"]["name"] for t in _tests_of(real_cluster)}
    sdc(real_cluster, "test", NODE)
    pod = _wait_probe_running(real_cluster, operator_pod.namespace, before, timeout=120)
    real_cluster.node.kill(daemon)
    killed = time.monotonic()
    try:
        test = _wait_test_done(real_cluster, before, timeout=180)
        ended = time.monotonic() - killed
        ready = _ready(real_cluster)
        status = test["status"]
        assert status["phase"] == "Inconclusive", status
        assert status["verdict"] not in ("Pass", "SDC"), status
        assert status["reason"] == "TimedOut", status
        # Two more full passes of the operator with the node still lost (counted, not
        # slept: a stalled operator would pass a sleep as well).
        wait_passes(lambda: pod_metrics(real_cluster, operator_pod), probe_reset, resync=5)
        assert _state(real_cluster) not in ("Quarantined", "Suspect"), _state(real_cluster)
        assert not _taints_without_record(real_cluster), _taints_without_record(real_cluster)
    finally:
        t1 = time.monotonic()
        real_cluster.node.restart(daemon)
        back = time.monotonic() - t1
    # The Pod the Job's deadline deleted goes once the node can act on it.
    gone = _wait_probe_gone(real_cluster, operator_pod.namespace, test, timeout=120)
    _wait_state(real_cluster, "Qualified", timeout=300)
    assert not _taints_without_record(real_cluster), _taints_without_record(real_cluster)
    op = json.loads(
        kubectl(
            real_cluster, "get", "pod", "-n", operator_pod.namespace, operator_pod.pod, "-o", "json"
        )
    )
    # The operator's own container lived on under its shim through the kill.
    assert op["status"]["containerStatuses"][0]["restartCount"] == 0, op["status"]
    print(
        f"real node, {daemon} killed while {pod} ran: {status['verdict']} "
        f"({status['reason']}) {ended:.1f}s later, node Ready={ready} then; {daemon} back "
        f"and the node Ready in {back:.1f}s, the Pod gone {gone:.1f}s after that"
    )


def _ready(cluster: LocalCluster) -> str:
    node = json.loads(kubectl(cluster, "get", "node", NODE, "-o", "json"))
    conds = node["status"].get("conditions", [])
    return next((str(c["status"]) for c in conds if c["type"] == "Ready"), "?")


def _wait_probe_running(
    cluster: LocalCluster, namespace: str, before: set[str], timeout: float
) -> str:
    """The name of the new Manual test's probe Pod once its container runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        new = [
            t["metadata"]["name"]
            for t in _tests_of(cluster)
            if t["metadata"]["name"] not in before and t["spec"]["reason"] == "Manual"
        ]
        for name in new:
            pods = json.loads(
                kubectl(
                    cluster,
                    "get",
                    "pods",
                    "-n",
                    namespace,
                    "-l",
                    f"sdcguard.dev/test={name}",
                    "-o",
                    "json",
                )
            )["items"]
            for pod in pods:
                statuses = pod["status"].get("containerStatuses") or []
                if statuses and "running" in statuses[0].get("state", {}):
                    return str(pod["metadata"]["name"])
        time.sleep(0.5)
    raise AssertionError(f"no running probe Pod for a new test of {NODE} in {timeout:.0f}s")


def _taints_without_record(cluster: LocalCluster) -> list[str]:
    """sdcguard taints on the node that nothing accounts for: testing without an
    unfinished SDCTest, quarantine without an open RepairTicket, the gate on a node
    whose state says it is qualified."""
    node = json.loads(kubectl(cluster, "get", "node", NODE, "-o", "json"))
    state = node["metadata"].get("labels", {}).get(STATE_LABEL, "")
    tests = _tests_of(cluster)
    unfinished = [t for t in tests if not (t.get("status") or {}).get("completionTime")]
    tickets = kubectl_items(cluster, "repairtickets")
    open_tickets = [
        t
        for t in tickets
        if t["spec"]["nodeName"] == NODE and (t.get("status") or {}).get("phase") != "Closed"
    ]
    bad = []
    for taint in node["spec"].get("taints") or []:
        key = taint["key"]
        if key == "sdcguard.dev/testing" and not unfinished:
            bad.append(f"{key} with no unfinished SDCTest (state {state})")
        elif key == "sdcguard.dev/quarantined" and not open_tickets:
            bad.append(f"{key} with no open RepairTicket (state {state})")
        elif key == "sdcguard.dev/unqualified" and state == "Qualified":
            bad.append(f"{key} on a Qualified node")
        elif key.startswith("sdcguard.dev/") and key not in (
            "sdcguard.dev/testing",
            "sdcguard.dev/quarantined",
            "sdcguard.dev/unqualified",
        ):
            bad.append(f"{key}: not a taint of this policy")
    return bad
