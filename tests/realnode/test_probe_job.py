"""The operator's probe Job manifest, as built, in a real container on the real node.

The Job comes from ``sdcguard.builders.probe_job.build_probe_job`` (security
context, no ServiceAccount token, tolerations, termination-message policy, GPU
request, deadline); the kubelet runs the probe image, and the result is read
from the termination message the kubelet copied into the Pod status, as the
operator reads it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from sdcdev.cluster.localcluster import LocalCluster
from sdcdev.cluster.realnode import PROBE_RUNTIME_HANDLER
from sdcguard.builders.probe_job import ProbeJobRequest, build_probe_job
from sdcprobe.result import parse_result
from tests.realnode.conftest import kubectl
from tests.realnode.test_node import kubectl_apply

pytestmark = pytest.mark.cluster

CHECKS = ("compute", "collective", "golden")
#: The demo's real-node budget. At 10 s the probe exited non-zero once while the three
#: test groups loaded a slow machine (the output was not kept then).
BUDGET = 20
ROOT = Path(__file__).resolve().parents[2]


def _request(cluster: LocalCluster, name: str, namespace: str) -> ProbeJobRequest:
    assert cluster.node is not None
    return ProbeJobRequest(
        test_name=name,
        test_uid=str(uuid.uuid4()),
        node_name=cluster.node.name,
        namespace=namespace,
        image=cluster.node.image_refs["probe"],
        checks=CHECKS,
        budget_seconds=BUDGET,
        active_deadline_seconds=300,
        ttl_seconds_after_finished=600,
        accelerators=(("nvidia.com/gpu", 2),),
        tolerated_taint_keys=("sdcguard.dev/unqualified", "sdcguard.dev/testing"),
        cpu_devices=2,
        seed=7,
    )


def test_probe_job_as_built_runs_in_a_container_and_reports_through_the_kubelet(
    real_cluster: LocalCluster,
) -> None:
    ns = f"rn-probe-{uuid.uuid4().hex[:5]}"
    kubectl(real_cluster, "create", "namespace", ns)
    name = "t1"
    job = build_probe_job(_request(real_cluster, name, ns))
    # The SDCTest owner is absent here; without the reference the Job is not collected.
    job["metadata"].pop("ownerReferences")
    try:
        t0 = time.monotonic()
        kubectl_apply(real_cluster, job)
        pod = _wait_pod_finished(real_cluster, ns, name, timeout=240)
        wall = time.monotonic() - t0
        cs = pod["status"]["containerStatuses"][0]
        term = cs["state"]["terminated"]
        # The container's output, through the API server's proxy to the kubelet (its
        # client certificate is what the kubelet authenticates).
        logs = kubectl(real_cluster, "logs", "-n", ns, pod["metadata"]["name"])
        assert term["exitCode"] == 0, (term, logs)
        assert "sdcprobe: pass: all checks pass on 2 device(s)" in logs, logs
        result = parse_result(term["message"])
        assert result.verdict == "pass", result
        assert set(result.checks) == set(CHECKS)
        assert result.fingerprint is not None
        assert result.fingerprint.backend == "cpu"
        assert result.fingerprint.device_count == 2
        # The kubelet ran it on the real node, with the device plugin's GPUs allocated.
        assert pod["spec"]["nodeName"] == real_cluster.node.name  # type: ignore[union-attr]
        assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
        started = term["startedAt"]
        print(
            f"probe Job on the real node: {wall:.1f}s from create to the kubelet's termination "
            f"message (container {started} to {term['finishedAt']})"
        )
        plain = _plain_process_seconds()
        print(f"the same probe as a plain process: {plain:.1f}s")
    finally:
        # Pass or fail, its Pod must not hold the node's GPUs for the tests after it.
        kubectl(real_cluster, "delete", "namespace", ns, "--wait=false")


def test_a_probe_runs_under_a_runtime_class_the_node_configures(
    real_cluster: LocalCluster,
) -> None:
    """A RuntimeClass names the node's second containerd handler (as GPU Operator installs
    name "nvidia"); the probe Job built with it runs there and passes. A handler the node
    lacked would fail the Pod's sandbox, so the pass is the handler's."""
    ns = f"rn-rc-{uuid.uuid4().hex[:5]}"
    runtime_class = f"probe-{uuid.uuid4().hex[:5]}"
    kubectl(real_cluster, "create", "namespace", ns)
    kubectl_apply(
        real_cluster,
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": runtime_class},
            "handler": PROBE_RUNTIME_HANDLER,
        },
    )
    name = "t-rc"
    request = dataclasses.replace(_request(real_cluster, name, ns), runtime_class=runtime_class)
    job = build_probe_job(request)
    job["metadata"].pop("ownerReferences")
    try:
        kubectl_apply(real_cluster, job)
        pod = _wait_pod_finished(real_cluster, ns, name, timeout=240)
        assert pod["spec"]["runtimeClassName"] == runtime_class  # type: ignore[index]
        term = pod["status"]["containerStatuses"][0]["state"]["terminated"]  # type: ignore[index]
        assert term["exitCode"] == 0, term
        assert parse_result(term["message"]).verdict == "pass"
    finally:
        kubectl(real_cluster, "delete", "namespace", ns, "--wait=false")
        kubectl(real_cluster, "delete", "runtimeclass", runtime_class, "--wait=false")


def _plain_process_seconds() -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        env = dict(os.environ, PYTHONPATH=str(ROOT / "jobs"))
        t0 = time.monotonic()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "sdcprobe",
                "run",
                "--checks",
                ",".join(CHECKS),
                "--device",
                "cpu",
                "--budget",
                str(BUDGET),
                "--result-file",
                str(out),
                "--cpu-devices",
                "2",
                "--seed",
                "7",
            ],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
        seconds = time.monotonic() - t0
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert parse_result(out.read_text()).verdict == "pass"
        return seconds


def _wait_pod_finished(
    cluster: LocalCluster, namespace: str, test: str, timeout: float
) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        pods = json.loads(
            kubectl(
                cluster,
                "get",
                "pods",
                "-n",
                namespace,
                "-l",
                f"sdcguard.dev/test={test}",
                "-o",
                "json",
            )
        )["items"]
        for pod in pods:
            last = pod.get("status")
            if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                return dict(pod)
        time.sleep(1)
    raise AssertionError(f"probe Pod of {test} did not finish within {timeout:.0f}s: {last}")
