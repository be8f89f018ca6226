"""A control plane that serves DRA device taints, and the operator against it.

Kubernetes 1.37 serves DeviceTaintRule as resource.k8s.io/v1 (GA, on by default).
Before that it needs the DRADeviceTaints feature gate and, for the alpha API (1.33-1.35,
checked on the 1.34.4 build: resource.k8s.io/v1alpha3 serves devicetaintrules, v1
serves resourceslices), runtime-config resource.k8s.io/v1alpha3=true; 1.36 serves it as
v1beta2. The session's shared control plane is started without those flags, so before
1.37 these tests start their own; from 1.37 on they use the shared one.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from sdcdev.cluster import localcluster
from sdcdev.cluster.localcluster import LocalCluster
from sdcdev.harness import OperatorProcess, apply_crds, delete_all, ensure_namespace


def device_taint_args(minor: int) -> list[str]:
    """kube-apiserver flags that serve DeviceTaintRules on Kubernetes 1.``minor``."""
    if minor >= 37:
        return []
    version = "v1beta2" if minor == 36 else "v1alpha3"
    return [
        "--feature-gates=DRADeviceTaints=true",
        f"--runtime-config=resource.k8s.io/{version}=true",
    ]


def apiserver_minor() -> int:
    out = subprocess.run(
        [localcluster.find_binary("kube-apiserver", localcluster.binary_path()), "--version"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    m = re.search(r"v1\.(\d+)\.", out)
    assert m, f"kube-apiserver --version said {out!r}"
    return int(m.group(1))


@pytest.fixture(scope="session")
def dra_cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    args = device_taint_args(apiserver_minor())
    if not args:  # 1.37 on: the session's own control plane serves them
        yield request.getfixturevalue("cluster")
        return
    with LocalCluster(extra_apiserver_args=args) as c:
        yield c


@pytest.fixture(scope="session")
def dra_api(dra_cluster: LocalCluster) -> client.ApiClient:
    api: client.ApiClient = config.new_client_from_config(str(dra_cluster.kubeconfig))
    apply_crds(api)
    ensure_namespace(api)
    return api


@pytest.fixture(scope="module")
def dra_operator(
    dra_cluster: LocalCluster, dra_api: client.ApiClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    log = Path(tmp_path_factory.mktemp("operator")) / "operator.log"
    proc = OperatorProcess(dra_cluster.kubeconfig, log).start()
    try:
        yield proc
    finally:
        proc.stop()
        delete_all(dra_api)
