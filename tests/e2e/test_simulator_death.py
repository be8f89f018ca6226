"""When the simulator dies, the operator's view stays honest.

A one-node fleet runs as its own ``python -m sdcdev.sim`` process, which is SIGKILLed
while the node's acceptance probe runs. Nothing reports for the node any more: the
node-lifecycle controller marks it NotReady once its heartbeats stop, and the probe Pod
stays "Running" forever, so the Job's activeDeadlineSeconds ends it. The test must end
with verdict Timeout (inconclusive evidence), never Pass, and the node must stay gated
with no new test while it is NotReady.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sdcdev.cluster.localcluster import LocalCluster
from sdcdev.harness import wait_passes
from sdcdev.sim.demo import delete_custom, delete_policy
from sdcdev.sim.demo_install import (
    GROUP,
    REPO,
    VERSION,
    LocalOperator,
    PolicySettings,
    install,
    policy_body,
    start_operator,
    uninstall,
)
from sdcdev.sim.ports import free_port
from tests.e2e.helpers import RunNames

NODE = "lost-h100-00"
GATE = "sdcguard.dev/unqualified"
FLEET = {
    "name": "lost",
    "defaults": {"taints": [f"{GATE}:NoSchedule"], "cpuDevices": 2},
    "nodes": [{"name": NODE, "instanceType": "p5.48xlarge", "pool": "h100-train"}],
    "workloads": {"enabled": False},
    "repair": {"enabled": False},
}


def _ready(core: client.CoreV1Api) -> str | None:
    for cond in core.read_node(NODE).status.conditions or []:
        if cond.type == "Ready":
            return str(cond.status)
    return None


def _tests(custom: client.CustomObjectsApi) -> list[dict[str, Any]]:
    items = custom.list_cluster_custom_object(GROUP, VERSION, "sdctests")["items"]
    return [i for i in items if i["spec"]["nodeName"] == NODE]


def _job_deadline_exceeded(api: client.ApiClient, namespace: str) -> bool:
    """The probe Job hit activeDeadlineSeconds (FailureTarget first, Failed once the Pod
    is gone)."""
    jobs = client.BatchV1Api(api).list_namespaced_job(namespace).items
    return any(
        c.reason == "DeadlineExceeded" and c.status == "True"
        for j in jobs
        for c in j.status.conditions or []
    )


def _wait(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def test_dead_simulator_means_notready_nodes_and_a_timed_out_probe(
    cluster: LocalCluster, api_client: client.ApiClient, names: RunNames, tmp_path: Path
) -> None:
    fleet_file = tmp_path / "lost.yaml"
    fleet_file.write_text(yaml.safe_dump(FLEET))
    core, custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
    inst = install(cluster, api_client, release=names.release, namespace=names.namespace)
    operator: LocalOperator | None = None
    sim: subprocess.Popen[bytes] | None = None
    metrics_port = free_port()
    try:
        operator = start_operator(
            cluster,
            api_client,
            inst,
            workdir=tmp_path,
            log_path=tmp_path / "operator.log",
            metrics_port=metrics_port,
        )
        # A 30 s budget: the probe is still running when the simulator is killed.
        settings = PolicySettings(budget_seconds=30, active_deadline_seconds=60)
        custom.create_cluster_custom_object(
            GROUP, VERSION, "sdcpolicies", policy_body(names.policy, "lost", settings)
        )
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(str(REPO / p) for p in ("operator", "jobs", ".")),
        }
        with (tmp_path / "sim.log").open("wb") as log:
            sim = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "sdcdev.sim",
                    "--kubeconfig",
                    str(cluster.kubeconfig),
                    "--fleet",
                    str(fleet_file),
                    "--heartbeat-seconds",
                    "5",
                    "--log-format",
                    "json",
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

        def probe_running() -> bool:
            pods = core.list_namespaced_pod(
                inst.namespace, label_selector="app.kubernetes.io/component=sdcprobe"
            ).items
            return any(p.spec.node_name == NODE and p.status.phase == "Running" for p in pods)

        _wait(probe_running, 90, "the acceptance probe to run")
        assert _ready(core) == "True"
        os.killpg(sim.pid, signal.SIGKILL)
        sim.wait(timeout=10)
        killed = time.monotonic()

        phases: set[str] = set()
        not_ready_after: float | None = None
        job_ended_after: float | None = None
        deadline = killed + 150
        while time.monotonic() < deadline:
            tests = _tests(custom)
            phases |= {(t.get("status") or {}).get("phase", "Pending") for t in tests}
            now = time.monotonic() - killed
            if not_ready_after is None and _ready(core) != "True":
                not_ready_after = now
            if job_ended_after is None and _job_deadline_exceeded(api_client, inst.namespace):
                job_ended_after = now
            judged = any((t.get("status") or {}).get("verdict") for t in tests)
            # Give the operator a few passes (resync 5 s) after the Job's deadline.
            settled = judged or (job_ended_after is not None and now - job_ended_after > 8)
            if settled and not_ready_after is not None:
                break
            time.sleep(1)
        assert "Passed" not in phases, phases
        assert not_ready_after is not None, "the node never went NotReady"
        assert not_ready_after < 100, not_ready_after
        assert _ready(core) == "Unknown"  # the node-lifecycle controller: kubelet stopped posting
        tests = _tests(custom)
        assert len(tests) == 1, [t["metadata"]["name"] for t in tests]
        # The Job's activeDeadlineSeconds fired: seen on the Job, or (the operator deletes a
        # finished test's Job, so it may be gone before the next look) in the reason the
        # operator gives only for a Job that ran past its deadline.
        ended = tests[0].get("status") or {}
        assert job_ended_after is not None or ended.get("reason") == "TimedOut", (
            "the probe Job's activeDeadlineSeconds never fired",
            ended,
        )
        node = core.read_node(NODE)
        assert node.metadata.labels["sdcguard.dev/state"] != "Qualified"
        assert GATE in {t.key for t in node.spec.taints or []}
        status = tests[0].get("status") or {}
        assert status["verdict"] == "Timeout", status
        # The node is not Ready, so no retry starts in a whole full pass; it stays gated
        # and unqualified.
        wait_passes(f"http://127.0.0.1:{metrics_port}/metrics", names.policy)
        node = core.read_node(NODE)
        assert node.metadata.labels["sdcguard.dev/state"] == "Unqualified"
        assert GATE in {t.key for t in node.spec.taints or []}
        assert len(_tests(custom)) == 1
        # A dead node's probe is no evidence of wrong answers: Inconclusive, not Failed.
        assert status["phase"] == "Inconclusive", status
        print(f"NotReady {not_ready_after:.0f}s after the simulator died; {status['message']}")
    finally:
        delete_policy(api_client, names.policy, operator)
        if operator is not None:
            operator.stop()
        if sim is not None and sim.poll() is None:
            os.killpg(sim.pid, signal.SIGKILL)
            sim.wait(timeout=10)
        for test in _tests(custom):
            delete_custom(api_client, "sdctests", test["metadata"]["name"])
        with contextlib.suppress(ApiException):
            client.BatchV1Api(api_client).delete_collection_namespaced_job(
                inst.namespace, propagation_policy="Background"
            )
        with contextlib.suppress(ApiException):
            core.delete_collection_namespaced_pod(inst.namespace, grace_period_seconds=0)
        with contextlib.suppress(ApiException):
            client.CoordinationV1Api(api_client).delete_namespaced_lease(NODE, "kube-node-lease")
        with contextlib.suppress(ApiException):
            core.delete_node(NODE)
        uninstall(api_client, inst)
