"""The chart's own admission objects, rendered by helm and applied to the local
control plane, so the attack tests run against exactly what the chart ships."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sdcdev.cluster.localcluster import LocalCluster, _issue
from tests.chart.helm import render

ADMISSION_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


def kubectl(cluster: LocalCluster, *args: str, stdin: str | None = None) -> str:
    proc = subprocess.run(
        ["kubectl", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=cluster.env(),
        check=False,
        timeout=60,
    )
    if proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed: {proc.stderr}")
    return proc.stdout


def chart_objects(
    release: str,
    kinds: tuple[str, ...],
    values: dict[str, Any] | None = None,
    namespace: str = "sdcguard-system",
) -> list[dict[str, Any]]:
    docs = render(values, release=release, namespace=namespace)
    return [d for d in docs if d["kind"] in kinds]


@contextmanager
def applied(cluster: LocalCluster, objects: list[dict[str, Any]]) -> Iterator[None]:
    """``objects`` applied for the block, deleted after it."""
    body = json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    kubectl(cluster, "apply", "-f", "-", stdin=body)
    try:
        yield
    finally:
        subprocess.run(
            ["kubectl", "delete", "--ignore-not-found", "--wait=false", "-f", "-"],
            input=body,
            capture_output=True,
            text=True,
            env=cluster.env(),
            check=False,
        )


def until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """``predicate()``'s first truthy value; the API server loads a new admission
    policy a moment after it is created, so a refusal is awaited, not assumed."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.3)


def client_certificate(cluster: LocalCluster, name: str, user: str, groups: list[str]) -> Path:
    """A client certificate for ``user`` in ``groups`` signed by the cluster's CA (as a
    kubelet's is); returns the folder holding ``name.crt`` and ``name.key``."""
    assert cluster.state_dir is not None
    pki = cluster.state_dir / "pki"
    subject = "".join(f"/O={g}" for g in groups) + f"/CN={user}"
    _issue(
        pki,
        name,
        subject,
        "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n",
    )
    return pki
