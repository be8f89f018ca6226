"""Installing sdcguard for ``--simulated-only`` demos and the e2e fleet tests, as the chart does.

Without a real node nothing would run the operator's own Pod, so the chart is rendered with
``helm template`` and only what a running operator needs is applied: the CRDs,
the ServiceAccount, the RBAC and the probe PriorityClass. The operator then
runs as a local process with a token of the chart's ServiceAccount (minted
with the TokenRequest API), so it has exactly the chart's permissions and no
admin rights, and with the environment the chart's Deployment would give it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sdcdev import REPO
from sdcdev.sim.catalogue import INSTANCE_TYPE_LABEL
from sdcdev.sim.fleet import FLEET_LABEL
from sdcdev.sim.ports import free_port
from sdcguard.api.common import GROUP, VERSION

CHART = REPO / "charts" / "sdcguard"
PLURALS = ("sdcpolicies", "sdctests", "repairtickets", "sdcbaselines")
#: What a running operator needs from the chart; the Deployment, Service,
#: dashboard and monitoring objects are left out (nothing would run them).
INSTALLED_KINDS = (
    "CustomResourceDefinition",
    "PriorityClass",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
)


class DemoError(RuntimeError):
    """A set-up step failed; the message says which and what to look at."""


class ControlPlane(Protocol):
    """What the demo needs of a control plane (``sdcdev.cluster.localcluster.LocalCluster``)."""

    server: str
    kubeconfig: Path
    bin_dirs: list[str]

    @property
    def ca_file(self) -> Path: ...


def _tool(name: str, cp: ControlPlane) -> str:
    for d in cp.bin_dirs:
        candidate = Path(d) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise DemoError(f"{name} not found in {cp.bin_dirs}; run `make binaries`")


def _run(argv: Sequence[str], *, what: str, stdin: str | None = None) -> str:
    with tempfile.TemporaryDirectory(prefix="sdcguard-helm-") as home:
        env = {
            **os.environ,
            # helm keeps caches and registry config under $HOME; keep them out of the way.
            "HELM_CACHE_HOME": f"{home}/cache",
            "HELM_CONFIG_HOME": f"{home}/config",
            "HELM_DATA_HOME": f"{home}/data",
        }
        proc = subprocess.run(
            list(argv),
            input=stdin,
            capture_output=True,
            text=True,
            env=env,
            check=False,
            timeout=180,
        )
    if proc.returncode != 0:
        raise DemoError(f"{what} failed (exit {proc.returncode}): {proc.stderr.strip()[-1500:]}")
    return proc.stdout


@dataclass
class Installation:
    """The chart objects applied for one release, and what the operator process needs."""

    release: str
    namespace: str
    service_account: str
    docs: list[dict[str, Any]]
    operator_env: dict[str, str] = field(default_factory=dict)
    """The env of the chart's operator container (literal values only)."""

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d.get("kind") == kind]


def render_chart(
    cp: ControlPlane, release: str, namespace: str, values: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """``helm template --include-crds`` of the chart, as objects."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
        yaml.safe_dump(dict(values), fh)
    try:
        out = _run(
            [
                _tool("helm", cp),
                "template",
                release,
                str(CHART),
                "--namespace",
                namespace,
                "--include-crds",
                "-f",
                fh.name,
            ],
            what="helm template of charts/sdcguard",
        )
    finally:
        os.unlink(fh.name)
    return [d for d in yaml.safe_load_all(out) if isinstance(d, dict)]


def chart_values(resync_seconds: float) -> dict[str, Any]:
    """Values for a local operator: no policy from the chart (the demo brings its own)."""
    return {
        "policy": {"create": False},
        "operator": {"logFormat": "json", "resyncSeconds": int(resync_seconds)},
        "metrics": {"dashboard": {"enabled": False}, "service": {"enabled": False}},
        # helm test reads /metrics through the Service, which a local operator has not.
        "helmTest": {"enabled": False},
        # A local operator is a process beside the test, with no key Secret mounted:
        # it seals nothing (the operator Pod's install keeps attestation on, and the
        # simulated kubelet mounts each probe's Secret, so simulated probes seal too).
        "probe": {"attestation": {"enabled": False}},
    }


def install(
    cp: ControlPlane,
    api: client.ApiClient,
    *,
    release: str,
    namespace: str,
    resync_seconds: float = 5,
    values: Mapping[str, Any] | None = None,
) -> Installation:
    """Render the chart and apply its CRDs, ServiceAccount, RBAC and PriorityClass.
    ``values``: more chart values, top-level sections beside the local operator's
    (``{"rbac": {"allowDeviceTaints": True}}`` for a policy with scope Device)."""
    docs = render_chart(cp, release, namespace, {**chart_values(resync_seconds), **(values or {})})
    wanted = [d for d in docs if d.get("kind") in INSTALLED_KINDS]
    deployment = next((d for d in docs if d.get("kind") == "Deployment"), None)
    accounts = [d for d in wanted if d["kind"] == "ServiceAccount"]
    if deployment is None or len(accounts) != 1:
        raise DemoError("the rendered chart has no operator Deployment or ServiceAccount")
    core = client.CoreV1Api(api)
    with contextlib.suppress(ApiException):  # 409: it exists
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    _run(
        [
            _tool("kubectl", cp),
            "--kubeconfig",
            str(cp.kubeconfig),
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=sdcguard-demo",
            "-f",
            "-",
        ],
        what="kubectl apply of the chart's CRDs and RBAC",
        stdin=yaml.safe_dump_all(wanted),
    )
    wait_served(api)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}
    env["SDCGUARD_NAMESPACE"] = namespace  # a fieldRef in the Pod
    return Installation(
        release=release,
        namespace=namespace,
        service_account=accounts[0]["metadata"]["name"],
        docs=wanted,
        operator_env=env,
    )


def wait_served(api: client.ApiClient, timeout: float = 60) -> None:
    """Until every sdcguard resource can be listed (the CRDs are established)."""
    custom = client.CustomObjectsApi(api)
    deadline = time.monotonic() + timeout
    missing: list[str] = list(PLURALS)
    while time.monotonic() < deadline:
        for plural in list(missing):
            try:
                custom.list_cluster_custom_object(GROUP, VERSION, plural, limit=1)
                missing.remove(plural)
            except ApiException:
                pass
        if not missing:
            return
        time.sleep(0.3)
    raise DemoError(f"CRDs not served after {timeout:.0f}s: {missing}")


def uninstall(api: client.ApiClient, inst: Installation) -> None:
    """Delete what :func:`install` applied, except the CRDs (other users may rely on them)."""
    rbac = client.RbacAuthorizationV1Api(api)
    sched = client.SchedulingV1Api(api)
    core = client.CoreV1Api(api)
    for doc in reversed(inst.docs):
        kind, meta = doc["kind"], doc["metadata"]
        name, ns = meta["name"], meta.get("namespace")
        with contextlib.suppress(ApiException):
            if kind == "ClusterRoleBinding":
                rbac.delete_cluster_role_binding(name)
            elif kind == "ClusterRole":
                rbac.delete_cluster_role(name)
            elif kind == "RoleBinding":
                rbac.delete_namespaced_role_binding(name, ns)
            elif kind == "Role":
                rbac.delete_namespaced_role(name, ns)
            elif kind == "PriorityClass":
                sched.delete_priority_class(name)
    with contextlib.suppress(ApiException):
        core.delete_namespace(inst.namespace)


def mint_token(api: client.ApiClient, inst: Installation, seconds: int = 3600) -> str:
    """A bound token of the chart's ServiceAccount (TokenRequest API, like ``kubectl create
    token``): the operator gets the chart's permissions, nothing more."""
    body = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=seconds)
    )
    resp = client.CoreV1Api(api).create_namespaced_service_account_token(
        inst.service_account, inst.namespace, body
    )
    if resp.status is None or not resp.status.token:
        raise DemoError(
            f"TokenRequest for {inst.namespace}/{inst.service_account} returned no token"
        )
    return str(resp.status.token)


def write_kubeconfig(path: Path, cp: ControlPlane, token: str, user: str) -> Path:
    text = yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "local",
                    "cluster": {"server": cp.server, "certificate-authority": str(cp.ca_file)},
                }
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
            "current-context": "local",
        }
    )
    path.write_text(text)
    path.chmod(0o600)
    return path


def _die_with_parent() -> None:
    """Child pre-exec hook: SIGKILL when the demo dies, so nothing outlives it."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def kubectl_sdc(kubeconfig: Path, *args: str, timeout: float = 120) -> str:
    """Run the ``kubectl sdc`` plugin (``python -m sdcguard.cli``) against the demo's
    cluster as a person would; returns what it printed (its error output on failure)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(REPO / "operator"), str(REPO / "jobs"), os.environ.get("PYTHONPATH", "")]
        ),
    }
    command = [sys.executable, "-m", "sdcguard.cli", *args, "--kubeconfig", str(kubeconfig)]
    try:
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return f"kubectl sdc {' '.join(args)}: no answer in {timeout:.0f}s"
    if done.returncode != 0:
        return f"kubectl sdc {' '.join(args)} failed: {done.stderr.strip()[-2000:]}"
    return done.stdout


class LocalOperator:
    """``python -m sdcguard`` as a local process with the chart's env and a ServiceAccount
    kubeconfig."""

    def __init__(self, kubeconfig: Path, env: Mapping[str, str], log_path: Path) -> None:
        self.kubeconfig = kubeconfig
        self.env = dict(env)
        self.log_path = log_path
        self.health_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 90) -> None:
        env = {
            **os.environ,
            **self.env,
            "KUBECONFIG": str(self.kubeconfig),
            "PYTHONPATH": os.pathsep.join(
                [str(REPO / "operator"), str(REPO / "jobs"), os.environ.get("PYTHONPATH", "")]
            ),
        }
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "sdcguard",
                    "--liveness",
                    f"http://127.0.0.1:{self.health_port}/healthz",
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise DemoError(
                    f"the operator exited with code {self.proc.returncode} at start-up; "
                    f"last log lines:\n{self.log_tail(30)}"
                )
            try:
                url = f"http://127.0.0.1:{self.health_port}/healthz"
                with urllib.request.urlopen(url, timeout=2):
                    return
            except OSError:
                time.sleep(0.5)
        raise DemoError(f"the operator did not become live in {timeout:.0f}s:\n{self.log_tail()}")

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 20) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def start_operator(
    cp: ControlPlane,
    api: client.ApiClient,
    inst: Installation,
    *,
    workdir: Path,
    log_path: Path,
    resync_seconds: float = 5,
    metrics_port: int = 0,
) -> LocalOperator:
    """Start the operator with a fresh ServiceAccount token and the chart's environment."""
    token = mint_token(api, inst)
    kubeconfig = write_kubeconfig(
        workdir / "operator.kubeconfig",
        cp,
        token,
        user=f"system:serviceaccount:{inst.namespace}:{inst.service_account}",
    )
    env = {
        **inst.operator_env,
        "SDCGUARD_METRICS_PORT": str(metrics_port),
        "SDCGUARD_RESYNC_SECONDS": str(resync_seconds),
        "SDCGUARD_LOG_FORMAT": "json",
    }
    operator = LocalOperator(kubeconfig, env, log_path)
    try:
        operator.start()
    except BaseException:
        operator.stop()
        raise
    return operator


@dataclass(frozen=True)
class PolicySettings:
    """The demo policy's fast settings (every field is an SDCPolicy field)."""

    budget_seconds: int = 10
    active_deadline_seconds: int = 120
    idle_for: str = "30s"
    inconclusive_backoff: str = "15s"
    quorum: int = 3
    max_concurrent_tests: int = 2
    max_unavailable: int | str = "50%"
    max_repair_cycles: int = 2
    reruns: int = 1
    checks: tuple[str, ...] = ("compute", "collective", "golden")


def policy_body(name: str, fleet_name: str, s: PolicySettings) -> dict[str, Any]:
    """An SDCPolicy for the simulated fleet's nodes, with pools by instance type."""
    suite = [{"name": c} for c in s.checks]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SDCPolicy",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"matchLabels": {FLEET_LABEL: fleet_name}},
            "triggers": {
                "onJoin": True,
                "onReturnFromUse": {"enabled": True, "idleFor": s.idle_for},
                "inconclusiveBackoff": s.inconclusive_backoff,
            },
            "suites": {
                "acceptance": suite,
                "requalification": suite,
                "repairVerification": suite,
            },
            "probe": {
                "budgetSeconds": s.budget_seconds,
                "activeDeadlineSeconds": s.active_deadline_seconds,
                "ttlSecondsAfterFinished": 900,
            },
            "budgets": {
                "maxConcurrentTests": s.max_concurrent_tests,
                "maxUnavailable": s.max_unavailable,
                "poolLabel": INSTANCE_TYPE_LABEL,
            },
            "confirmation": {"reruns": s.reruns},
            "repair": {"maxRepairCycles": s.max_repair_cycles},
            "baseline": {"mode": "Consensus", "quorum": s.quorum},
        },
    }
