"""Hand a detection to sdcguard: an SDCReport created in the job's own namespace.

Plain HTTPS to the API server with the Pod's own service-account token, so the
library needs no Kubernetes client. The job's ServiceAccount needs only
``create`` on ``sdcreports.sdcguard.dev`` in its namespace (see the chart README);
it never touches a Node. The operator checks the report (did the named Pod run
on that node?), rate-limits it and marks the node Suspect, so the probe screens
it when it is next idle: a report alone never quarantines anything.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import logging
import os
import re
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sdctrain.detection import Detection, Reporter

log = logging.getLogger("sdctrain")

# v1alpha1: served by the CRDs of every release (v1beta1 has the same schema and is
# what they store), so a training image keeps reporting across operator upgrades.
API_VERSION = "sdcguard.dev/v1alpha1"
PLURAL = "sdcreports"
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
#: Caps the operator's schema enforces; the library trims to them rather than be refused.
MAX_DETAIL = 1024
MAX_EVIDENCE = 16
MAX_EVIDENCE_VALUE = 256

_NAME_BAD = re.compile(r"[^a-z0-9-]+")


def report_name(detection: Detection) -> str:
    """A deterministic name, so a retried POST cannot create a second report."""
    base = _NAME_BAD.sub("-", (detection.job or detection.pod or "job").lower()).strip("-")[:40]
    key = f"{detection.job}|{detection.pod}|{detection.method}|{detection.step}|{detection.rank}"
    suffix = hashlib.sha256(key.encode()).hexdigest()[:10]
    return f"{base or 'job'}-s{detection.step}-r{detection.rank}-{suffix}"


def report_body(detection: Detection, now: dt.datetime | None = None) -> dict[str, Any]:
    """The SDCReport object for ``detection`` (raises ValueError if it names no node/Pod)."""
    if not detection.node or not detection.pod or not detection.namespace:
        raise ValueError(
            f"{detection.detail}: rank {detection.rank} has no node, Pod or namespace "
            "(set NODE_NAME, POD_NAME and POD_NAMESPACE from the downward API)"
        )
    stamp = (now or dt.datetime.now(dt.UTC)).astimezone(dt.UTC)
    spec: dict[str, Any] = {
        "nodeName": detection.node,
        "podName": detection.pod,
        "method": str(detection.method),
        "confirmation": str(detection.confirmation),
        "step": detection.step,
        "detail": detection.detail[:MAX_DETAIL],
        "observedAt": stamp.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "evidence": [
            {"name": k, "value": v[:MAX_EVIDENCE_VALUE]}
            for k, v in detection.evidence[:MAX_EVIDENCE]
        ],
    }
    if detection.rank is not None:
        spec["rank"] = detection.rank
    if detection.job:
        spec["jobName"] = detection.job
    if detection.gpu_uuid:
        spec["gpuUUID"] = detection.gpu_uuid[:128]
    return {
        "apiVersion": API_VERSION,
        "kind": "SDCReport",
        "metadata": {"name": report_name(detection), "namespace": detection.namespace},
        "spec": spec,
    }


Opener = Callable[[urllib.request.Request, float, ssl.SSLContext | None], tuple[int, bytes]]


def _open(
    req: urllib.request.Request, timeout: float, ctx: ssl.SSLContext | None
) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


def reporter_from_token(token: str) -> dict[str, str] | None:
    """``spec.reporter`` as the Pod's own bound ServiceAccount token names it (its
    unverified claims: the API server checks the token itself, and the chart's
    admission policy checks that the report repeats them); None for a token that is
    not a Pod-bound JWT."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        kube = claims["kubernetes.io"]
        reporter = {
            "podName": kube["pod"]["name"],
            "serviceAccount": kube["serviceaccount"]["name"],
        }
    except (IndexError, KeyError, TypeError, ValueError):
        return None
    if kube["pod"].get("uid"):
        reporter["podUID"] = kube["pod"]["uid"]
    if isinstance(kube.get("node"), dict) and kube["node"].get("name"):
        reporter["nodeName"] = kube["node"]["name"]
    return reporter


class KubeReporter(Reporter):
    """Creates SDCReports through the API server with a bearer token."""

    def __init__(
        self,
        server: str,
        token_file: Path,
        ca_file: Path | None = None,
        timeout: float = 5.0,
        opener: Opener = _open,
    ) -> None:
        self.server = server.rstrip("/")
        self.token_file = token_file
        self.ca_file = ca_file
        self.timeout = timeout
        self.opener = opener
        self.sent: list[str] = []

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> KubeReporter | None:
        """The in-cluster reporter, or None outside a Pod with a mounted token.

        ``SDCGUARD_API_SERVER``, ``SDCGUARD_TOKEN_FILE`` and ``SDCGUARD_CA_FILE``
        override the in-cluster defaults.
        """
        env = os.environ if env is None else env
        server = env.get("SDCGUARD_API_SERVER")
        if not server and env.get("KUBERNETES_SERVICE_HOST"):
            host = env["KUBERNETES_SERVICE_HOST"]
            host = f"[{host}]" if ":" in host else host
            server = f"https://{host}:{env.get('KUBERNETES_SERVICE_PORT', '443')}"
        token = Path(env.get("SDCGUARD_TOKEN_FILE", str(SA_DIR / "token")))
        if not server or not token.is_file():
            return None
        ca = Path(env.get("SDCGUARD_CA_FILE", str(SA_DIR / "ca.crt")))
        return cls(server, token, ca if ca.is_file() else None)

    def report(self, detection: Detection) -> str | None:
        """Create the report; returns its name (also when it already existed)."""
        body = report_body(detection)
        ns = body["metadata"]["namespace"]
        url = f"{self.server}/apis/{API_VERSION}/namespaces/{ns}/{PLURAL}"
        # Projected tokens rotate: read it for every request.
        token = self.token_file.read_text().strip()
        reporter = reporter_from_token(token)
        if reporter is not None:
            body["spec"]["reporter"] = reporter
        req = urllib.request.Request(
            url,
            data=json.dumps(body).encode(),
            method="POST",
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/json",
                "Accept": "application/json",
            },
        )
        ctx = ssl.create_default_context(cafile=str(self.ca_file)) if self.ca_file else None
        status, payload = self.opener(req, self.timeout, ctx)
        name = str(body["metadata"]["name"])
        if status in (200, 201, 409):  # 409: this very report exists already
            self.sent.append(name)
            return name
        message = payload[:300].decode(errors="replace")
        raise RuntimeError(f"creating SDCReport {ns}/{name} failed: HTTP {status}: {message}")
