"""The operator as the chart's Pod on the local cluster's real node.

``install_operator(cluster, release, namespace)`` runs ``helm install`` of
``charts/sdcguard`` with the images ``images/build.sh`` built (``localhost/``
names, ``imagePullPolicy: Never``: no registry is contacted) and waits until the
Deployment's Pod is Ready through its own probes.

Local-cluster settings, and why:

- ``hostNetwork: true`` and ``KUBERNETES_SERVICE_HOST/PORT`` naming the API
  server on 127.0.0.1. The local API server listens on loopback only (test
  traffic stays on loopback), and a Pod in the Pod network has no route to the
  host's loopback. kube-proxy would not change that: its DNAT for the
  ``kubernetes`` Service would point at the same loopback endpoint, reachable
  only from the host's network namespace anyway. A host-network Pod is the
  smallest thing that works, and the operator still runs in-cluster: its
  ServiceAccount token is the one the kubelet projects, its CA the cluster's.
  In a real cluster leave both unset.
- free ports for ``/metrics`` and ``/healthz``, since with the host network
  they are ports of the machine;
- a node selector for the real node (the rest of a fleet may be simulated) and
  tolerations of sdcguard's own gate and testing taints, since on a one-node
  cluster the operator runs on the node it screens.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

import yaml

from sdcdev.cluster.helm import CHART, run_helm
from sdcdev.cluster.localcluster import LocalCluster
from sdcdev.cluster.realnode import ClusterError
from sdcdev.sim.ports import free_port


@dataclass(frozen=True)
class OperatorPod:
    """Where the chart's operator Pod runs."""

    release: str
    namespace: str
    pod: str
    node: str
    runtime: str
    metrics_service: str
    metrics_port: int
    """The metrics Service's port."""
    container_metrics_port: int | None
    """The operator container's port named ``metrics`` (what :func:`pod_metrics` asks
    the Pod for); None if the chart named none."""
    ready_seconds: float
    """From ``helm install`` to the Pod's Ready condition."""


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def local_values(cluster: LocalCluster) -> dict[str, Any]:
    """Chart values for the real node of ``cluster`` (see the module docstring)."""
    if cluster.node is None:
        raise ClusterError(
            "the chart's operator Pod needs a real node (LocalCluster(real_node=True))"
        )
    refs = cluster.node.image_refs
    op_repo, op_tag = refs["operator"].rsplit(":", 1)
    probe_repo, probe_tag = refs["probe"].rsplit(":", 1)
    api_port = urllib.parse.urlsplit(cluster.server).port
    return {
        "image": {"repository": op_repo, "tag": op_tag, "pullPolicy": "Never"},
        "probe": {"image": {"repository": probe_repo, "tag": probe_tag}},
        "hostNetwork": True,
        "operator": {
            "metricsPort": free_port(),
            "healthPort": free_port(),
            "extraEnv": {
                "KUBERNETES_SERVICE_HOST": {"value": "127.0.0.1"},
                "KUBERNETES_SERVICE_PORT": {"value": str(api_port)},
            },
        },
        "nodeSelector": {"sdcguard.dev/real-node": "true"},
        "tolerations": {
            "sdcguard.dev/unqualified": {"operator": "Exists"},
            "sdcguard.dev/testing": {"operator": "Exists"},
        },
    }


def install_command(cluster: LocalCluster, release: str = "sdcguard") -> str:
    """The exact ``helm install`` of the chart for ``cluster``'s real node: writes the
    values (image tags, API server port, free host ports) beside its kubeconfig and
    returns the command that reads them, so a person installs with one line."""
    assert cluster.state_dir is not None
    path = cluster.state_dir / "sdcguard-values.yaml"
    path.write_text(yaml.safe_dump(local_values(cluster), sort_keys=True))
    return (
        f"helm install {release} {CHART} -n sdcguard-system --create-namespace "
        f"--set policy.mode=Observe -f {path}"
    )


def install_operator(
    cluster: LocalCluster,
    release: str,
    namespace: str,
    values: dict[str, Any] | None = None,
    timeout: float = 240,
) -> OperatorPod:
    """helm install the chart and wait for its operator Pod to be Ready on the real node."""
    merged = _merge(local_values(cluster), values or {})
    t0 = time.monotonic()
    run_helm(
        "install",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--create-namespace",
        env=cluster.env(),
        values=merged,
    )
    selector = urllib.parse.quote(
        f"app.kubernetes.io/instance={release},app.kubernetes.io/component=operator"
    )
    deadline = t0 + timeout
    last = "no Pod yet"
    while time.monotonic() < deadline:
        status, body = cluster.request(
            f"/api/v1/namespaces/{namespace}/pods?labelSelector={selector}"
        )
        if status == 200:
            for pod in json.loads(body)["items"]:
                st = pod.get("status", {})
                ready = any(
                    c["type"] == "Ready" and c["status"] == "True" for c in st.get("conditions", [])
                )
                waiting = [
                    cs["state"]["waiting"].get("reason", "")
                    for cs in st.get("containerStatuses", [])
                    if "waiting" in cs.get("state", {})
                ]
                last = f"{pod['metadata']['name']}: phase {st.get('phase')}, waiting {waiting}"
                if waiting and cluster.node is not None:
                    last += "\n" + cluster.node.pod_logs(namespace, pod["metadata"]["name"])
                if {"CrashLoopBackOff", "ErrImageNeverPull", "CreateContainerError"} & set(waiting):
                    raise ClusterError(f"the operator Pod of {release} cannot start: {last}")
                if ready:
                    node_name = pod["spec"]["nodeName"]
                    _, node_body = cluster.request(f"/api/v1/nodes/{node_name}")
                    runtime = json.loads(node_body)["status"]["nodeInfo"]["containerRuntimeVersion"]
                    return OperatorPod(
                        release=release,
                        namespace=namespace,
                        pod=pod["metadata"]["name"],
                        node=node_name,
                        runtime=runtime,
                        metrics_service=f"{release}-metrics"
                        if "sdcguard" in release
                        else f"{release}-sdcguard-metrics",
                        metrics_port=int(merged["metrics"]["service"]["port"])
                        if "metrics" in merged
                        else 8080,
                        container_metrics_port=_named_port(pod, "metrics"),
                        ready_seconds=time.monotonic() - t0,
                    )
        time.sleep(0.5)
    raise ClusterError(
        f"the operator Pod of {release} was not Ready within {timeout:.0f}s ({last})"
    )


def _named_port(pod: dict[str, Any], name: str) -> int | None:
    """The first container port called ``name`` in a Pod's body."""
    for container in pod["spec"]["containers"]:
        for port in container.get("ports") or []:
            if port.get("name") == name:
                return int(port["containerPort"])
    return None


def scrape_metrics(cluster: LocalCluster, op: OperatorPod) -> str:
    """GET /metrics through the chart's Service (the API server's service proxy)."""
    status, body = cluster.request(
        f"/api/v1/namespaces/{op.namespace}/services/"
        f"http:{op.metrics_service}:metrics/proxy/metrics",
        timeout=10,
    )
    if status != 200:
        raise ClusterError(
            f"scraping /metrics through {op.metrics_service} gave {status}: {body[:300]!r}"
        )
    return body.decode()


def pod_metrics(cluster: LocalCluster, op: OperatorPod) -> str | None:
    """GET /metrics of the operator's Pod itself (the API server's Pod proxy, at the
    Pod's container port named ``metrics``), or None while it does not answer. Unlike
    the Service, it keeps answering while the node is NotReady and the Pod has left the
    Service's endpoints: a test that stops the node's kubelet counts the operator's
    passes through it (``harness.wait_passes``)."""
    if op.container_metrics_port is None:
        return None
    proxy = f"/api/v1/namespaces/{op.namespace}/pods/{op.pod}:{op.container_metrics_port}"
    try:
        status, body = cluster.request(f"{proxy}/proxy/metrics", timeout=10)
    except OSError:
        return None
    return body.decode() if status == 200 else None


def uninstall_operator(cluster: LocalCluster, op_release: str, namespace: str) -> None:
    run_helm(
        "uninstall", op_release, "--namespace", namespace, "--wait", env=cluster.env(), check=False
    )
