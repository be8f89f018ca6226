"""The real node as Kubernetes sees it, and a Pod in a real container on it."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from sdcdev.cluster.localcluster import LocalCluster
from sdcdev.cluster.realnode import NODE_IP
from tests.realnode.conftest import kubectl

pytestmark = pytest.mark.cluster


def test_node_is_ready_on_containerd_with_a_local_address_and_test_gpus(
    real_cluster: LocalCluster,
) -> None:
    node = json.loads(kubectl(real_cluster, "get", "node", "real-node-0", "-o", "json"))
    info = node["status"]["nodeInfo"]
    assert info["containerRuntimeVersion"].startswith("containerd://"), info
    # The node runs the kubelet build-binaries.sh built (KUBELET_VERSION, by default the
    # control plane's own version), within the supported skew: not newer than the API
    # server and at most three minors older.
    assert real_cluster.node is not None
    assert info["kubeletVersion"] == real_cluster.node.kubelet_version()
    status, body = real_cluster.request("/version")
    assert status == 200, body
    server = json.loads(body)["gitVersion"]
    kubelet_minor = int(info["kubeletVersion"].split(".")[1])
    server_minor = int(server.split(".")[1])
    assert 0 <= server_minor - kubelet_minor <= 3, (info["kubeletVersion"], server)
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == NODE_IP
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "2"
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready[0]["status"] == "True"
    wide = kubectl(real_cluster, "get", "nodes", "-o", "wide")
    assert "containerd://" in wide and "real-node-0" in wide


def test_pod_runs_as_nonroot_with_readonly_root_and_gets_a_termination_message(
    real_cluster: LocalCluster,
) -> None:
    """The kubelet runs the probe image and copies /dev/termination-log into the status."""
    assert real_cluster.node is not None
    probe = real_cluster.node.image_refs["probe"]
    name = f"rn-{uuid.uuid4().hex[:6]}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65532},
            "containers": [
                {
                    "name": "c",
                    "image": probe,
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c"],
                    "args": [
                        "import os; open('/dev/termination-log','w').write("
                        "f'uid={os.getuid()} gpus={os.environ.get(\"TEST_DEVICE_IDS\")}'); "
                        "open('/probe-root-write','w')"
                    ],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    "securityContext": {"readOnlyRootFilesystem": True},
                }
            ],
        },
    }
    kubectl_apply(real_cluster, pod)
    state = wait_terminated(real_cluster, name, timeout=90)
    # Writing to the read-only root fails, so the container exits non-zero after
    # writing its message.
    assert state["exitCode"] != 0
    assert state["message"].startswith("uid=65532 gpus=test-dev-"), state
    kubectl(real_cluster, "delete", "pod", name, "--wait=false")


def test_a_pod_still_running_when_the_node_stops(real_cluster: LocalCluster) -> None:
    """Left running on purpose: the session's teardown stops the node under it and
    checks that no process, mount, network namespace or cgroup remains."""
    assert real_cluster.node is not None
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "left-running", "namespace": "default"},
        "spec": {
            "automountServiceAccountToken": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65532},
            "containers": [
                {
                    "name": "c",
                    "image": real_cluster.node.image_refs["operator"],
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-c", "import time; time.sleep(3600)"],
                    "volumeMounts": [{"name": "mem", "mountPath": "/scratch"}],
                }
            ],
            "volumes": [{"name": "mem", "emptyDir": {"medium": "Memory"}}],
        },
    }
    kubectl_apply(real_cluster, pod)
    deadline = time.monotonic() + 60
    phase = ""
    while time.monotonic() < deadline:
        phase = json.loads(kubectl(real_cluster, "get", "pod", "left-running", "-o", "json"))[
            "status"
        ].get("phase", "")
        if phase == "Running":
            break
        time.sleep(1)
    assert phase == "Running"
    assert real_cluster.node.ctr("tasks", "ls", "-q").stdout.split()


def kubectl_apply(cluster: LocalCluster, obj: dict[str, object]) -> None:
    import subprocess

    proc = subprocess.run(
        ["kubectl", "apply", "-f", "-"],
        input=json.dumps(obj),
        env=cluster.env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def wait_terminated(cluster: LocalCluster, pod: str, timeout: float) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    last: dict[str, object] = {}
    while time.monotonic() < deadline:
        obj = json.loads(kubectl(cluster, "get", "pod", pod, "-o", "json"))
        last = obj.get("status", {})
        for cs in last.get("containerStatuses", []) or []:  # type: ignore[union-attr]
            if "terminated" in cs.get("state", {}):
                return dict(cs["state"]["terminated"])
        time.sleep(1)
    raise AssertionError(f"pod {pod} did not terminate within {timeout:.0f}s: {last}")
