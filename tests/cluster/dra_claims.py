"""ResourceClaims, their Pods and DeviceTaintRules on simulated DRA nodes, for tests.

:class:`Env` holds a test's claims (through the ``gpu.nvidia.com`` DeviceClass that
:mod:`sdcdev.sim.dra` installs), the Pods using them (run by the simulated kubelet)
and the rules it wrote, and reads back where the real kube-scheduler placed them.
"""

from __future__ import annotations

from typing import Any

from kubernetes.client.exceptions import ApiException

from sdcdev.harness import wait_for
from sdcdev.sim.dra import DEVICE_CLASS
from sdcdev.sim.fleet import RUN_SECONDS_ANNOTATION
from sdcdev.sim.kube import Kube
from sdcguard.domain.dra import NVIDIA_GPU_DRIVER

RULES = "/apis/resource.k8s.io/v1/devicetaintrules"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
TAINT_KEY = "sdcguard.test/sdc"


class Env:
    """Two simulated DRA nodes, ``<prefix>-a`` and ``<prefix>-b`` of the fleet named
    ``prefix``, and the namespace ``prefix`` for the claims and Pods; :meth:`cleanup`
    removes what was made through it."""

    def __init__(self, kube: Kube, prefix: str) -> None:
        self.kube = kube
        self.prefix = prefix
        self.a = f"{prefix}-a"
        self.b = f"{prefix}-b"
        self.namespace = prefix
        self.rules: list[str] = []
        self.pods: list[str] = []
        self.claims: list[str] = []

    # Objects ---------------------------------------------------------------------
    def taint(self, name: str, effect: str, **selector: str) -> dict[str, Any]:
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceTaintRule",
            "metadata": {"name": f"{self.prefix}-{name}"},
            "spec": {
                "deviceSelector": {"driver": NVIDIA_GPU_DRIVER, **selector},
                "taint": {"key": TAINT_KEY, "value": "failed", "effect": effect},
            },
        }
        rule = self.kube.request("POST", RULES, body=body)
        self.rules.append(rule["metadata"]["name"])
        return rule

    def claim(
        self, name: str, count: int = 1, tolerations: list[dict[str, str]] | None = None
    ) -> None:
        exactly: dict[str, Any] = {"deviceClassName": DEVICE_CLASS, "count": count}
        if tolerations:
            exactly["tolerations"] = tolerations
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}},
        }
        self.kube.request(
            "POST",
            f"/apis/resource.k8s.io/v1/namespaces/{self.namespace}/resourceclaims",
            body=body,
        )
        self.claims.append(name)

    def pod(
        self,
        name: str,
        count: int = 1,
        node: str | None = None,
        tolerations: list[dict[str, str]] | None = None,
    ) -> None:
        """A Pod using a claim of its own for ``count`` GPUs (on ``node`` when given)."""
        self.claim(name, count, tolerations)
        spec: dict[str, Any] = {
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "train",
                    "image": "registry.example/train:1",
                    "resources": {"claims": [{"name": "gpus"}]},
                }
            ],
            "resourceClaims": [{"name": "gpus", "resourceClaimName": name}],
            "nodeSelector": {"sim.sdcguard.dev/fleet": self.prefix},
        }
        if node is not None:
            spec["nodeSelector"] = {"kubernetes.io/hostname": node}
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "annotations": {RUN_SECONDS_ANNOTATION: "3600"}},
            "spec": spec,
        }
        self.kube.request("POST", f"/api/v1/namespaces/{self.namespace}/pods", body=body)
        self.pods.append(name)

    def get_pod(self, name: str) -> dict[str, Any] | None:
        try:
            return self.kube.request("GET", f"/api/v1/namespaces/{self.namespace}/pods/{name}")
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def allocated(self, claim: str) -> list[tuple[str, str]] | None:
        """(pool, device) of each device allocated to ``claim``; None while unallocated."""
        obj = self.kube.request(
            "GET", f"/apis/resource.k8s.io/v1/namespaces/{self.namespace}/resourceclaims/{claim}"
        )
        allocation = (obj.get("status") or {}).get("allocation")
        if not allocation:
            return None
        return sorted((r["pool"], r["device"]) for r in allocation["devices"]["results"])

    def running_on(self, pod: str) -> str | None:
        obj = self.get_pod(pod)
        if obj and (obj.get("status") or {}).get("phase") == "Running":
            return str(obj["spec"]["nodeName"])
        return None

    def unschedulable(self, pod: str) -> str | None:
        """The scheduler's message once it found no node for ``pod``."""
        obj = self.get_pod(pod)
        for c in ((obj or {}).get("status") or {}).get("conditions") or []:
            if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable":
                return str(c.get("message", ""))
        return None

    def cleanup(self) -> None:
        ns = self.namespace
        for pod in self.pods:
            try:
                self.kube.request(
                    "DELETE",
                    f"/api/v1/namespaces/{ns}/pods/{pod}",
                    body={"gracePeriodSeconds": 0},
                )
            except ApiException as exc:
                if exc.status != 404:
                    raise
        for claim in self.claims:
            path = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{claim}"
            try:
                self.kube.request("DELETE", path)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        for rule in self.rules:
            try:
                self.kube.request("DELETE", f"{RULES}/{rule}")
            except ApiException as exc:
                if exc.status != 404:
                    raise
        wait_for(
            lambda: all(self.get_pod(p) is None for p in self.pods),
            30,
            "the test's pods to be gone",
        )
        # A claim keeps its devices allocated until the claim controller has removed its
        # finalizer (after its Pod is gone): the next test's claims start from free
        # devices, not from a scheduling retry that waits on that release.
        wait_for(
            lambda: all(self.get_claim(c) is None for c in self.claims),
            30,
            "the test's claims to be gone",
        )
        self.rules, self.pods, self.claims = [], [], []

    def get_claim(self, name: str) -> dict[str, Any] | None:
        path = f"/apis/resource.k8s.io/v1/namespaces/{self.namespace}/resourceclaims/{name}"
        try:
            return self.kube.request("GET", path)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
