"""A real local Kubernetes control plane, run as plain processes.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler are built
with Go by ``tests/cluster/build-binaries.sh`` (cached per machine, keyed by version) and
started here on loopback with:

- TLS from a throwaway CA, an admin bearer token (group ``system:masters``);
- the Node and RBAC authorizers and the NodeRestriction admission plugin;
- service-account signing keys, so TokenRequest tokens authenticate for real;
- the controller-manager's default controllers (Deployments, ReplicaSets,
  PodDisruptionBudgets, Jobs, garbage collection, node lifecycle, the DRA
  claim and device-taint eviction controllers, ...) except the node
  taint-eviction controller, so nothing is evicted behind a test's back;
- the real scheduler;
- optionally (``real_node=True``, ``up --real-node``) a real node: containerd,
  CNI, a kubelet and a test device plugin (:mod:`sdcdev.cluster.realnode`).

Used three ways: the pytest session fixture (``tests/conftest.py``), the demo
and benchmarks (``LocalCluster`` in a ``with`` block), and by hand::

    python -m sdcdev.cluster.localcluster up      # prints the kubeconfig path
    python -m sdcdev.cluster.localcluster down
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import secrets
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sdcdev import REPO
from sdcdev.cluster import realnode
from sdcdev.cluster.realnode import NODE_NAME, ClusterError, RealNode
from sdcdev.sim.ports import free_port

#: Builds the binaries (once per machine, cached by version) and prints their directories.
BUILD_BINARIES = REPO / "tests" / "cluster" / "build-binaries.sh"
DEFAULT_STATE_DIR = REPO / ".localcluster"
# Every controller the controller-manager runs by default ("*": Deployment,
# ReplicaSet, disruption for PDBs, Job, CronJob, DaemonSet, StatefulSet,
# endpoints, garbage collector, TTL-after-finished, service accounts,
# namespaces, root CA publisher, node lifecycle, pod GC, ...), less one:
# - taint-eviction-controller: it deletes Pods from nodes tainted NoExecute
#   (a NotReady simulated node, a node a test taints); tests decide when Pods
#   go, so nothing is evicted behind their back. The node-lifecycle
#   controller still marks nodes whose heartbeats stop NotReady.
# Controllers that need a cloud provider (cloud-node-lifecycle, route,
# service-lb) and node IPAM (no --allocate-node-cidrs) stay off as in any
# cluster without them; bootstrap-signer and token-cleaner are off by default.
# The DRA controllers are on: resource-claim-controller (claims from
# templates, reservations) and device-taint-eviction-controller, which deletes
# Pods using a device a NoExecute DeviceTaintRule taints. Only DRA device
# taints move it, and only tests (or sdcguard) write those.
CONTROLLERS = "*,-taint-eviction-controller"

# DRA device taints by Kubernetes version (1.34.4 and 1.37.2 from their own
# source; 1.37.2 also checked on the built binaries: discovery lists
# devicetaintrules in resource.k8s.io/v1 with no flag set, and
# tests/cluster/test_dra_scheduler.py uses it; 1.36 from 1.37's feature-gate
# history, not built here):
#
# | version | DeviceTaintRule served as      | feature gates                        |
# |---------|--------------------------------|--------------------------------------|
# | 1.34    | resource.k8s.io/v1alpha3 (off) | DRADeviceTaints alpha, off           |
# | 1.36    | a beta version (off)           | DRADeviceTaints beta, on;            |
# |         |                                | DRADeviceTaintRules beta, off        |
# | 1.37    | resource.k8s.io/v1 (on)        | both GA, on by default               |
#
# So on 1.37 the control plane needs no --feature-gates or --runtime-config for
# device taints: ResourceSlices, DeviceClasses, ResourceClaims and
# DeviceTaintRules are all resource.k8s.io/v1, the scheduler's DRA plugin
# honours device taints, and the eviction controller runs by default.


def log(message: str) -> None:
    print(f"[localcluster] {message}", file=sys.stderr, flush=True)


def binary_path() -> list[str]:
    """Directories holding kube-*, etcd, kubectl and helm, building them once per machine."""
    proc = subprocess.run(
        ["bash", str(BUILD_BINARIES)],
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise ClusterError("building the control-plane binaries failed (see the error above)")
    return proc.stdout.strip().splitlines()[-1].split(":")


def find_binary(name: str, dirs: list[str]) -> str:
    for d in dirs:
        candidate = Path(d) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise ClusterError(f"{name} not found in {dirs}; run `make binaries` to build it")


def check_port_free(port: int, what: str) -> None:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            raise ClusterError(
                f"port {port} for {what} is already in use ({exc.strerror}); stop whatever "
                f"listens there (`ss -ltnp 'sport = :{port}'`) or run "
                "`python -m sdcdev.cluster.localcluster down`"
            ) from None


def _die_with_parent() -> None:
    """Child pre-exec hook: receive SIGKILL when the starting process dies."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ClusterError(f"openssl {args[0]} failed: {proc.stderr.strip()[-300:]}")


def _issue(pki: Path, name: str, subject: str, extensions: str) -> None:
    """A key and a certificate signed by the local CA: ``name.key``, ``name.crt``."""
    _openssl("genrsa", "-out", f"{name}.key", "2048", cwd=pki)
    (pki / f"{name}.cnf").write_text(f"[req]\ndistinguished_name=dn\n[dn]\n[ext]\n{extensions}")
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=pki)
    _openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "30",
        "-extfile",
        f"{name}.cnf",
        "-extensions",
        "ext",
        "-out",
        f"{name}.crt",
        cwd=pki,
    )


def make_pki(pki: Path) -> None:
    """A throwaway CA, a serving certificate for 127.0.0.1, the API server's client
    certificate for kubelets (logs, exec) and the SA key pair."""
    if shutil.which("openssl") is None:
        raise ClusterError("openssl is not installed; install it (apt-get install openssl)")
    pki.mkdir(parents=True, exist_ok=True)
    _openssl("genrsa", "-out", "ca.key", "2048", cwd=pki)
    _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        "ca.key",
        "-days",
        "30",
        "-subj",
        "/CN=sdcguard-local-ca",
        "-out",
        "ca.crt",
        cwd=pki,
    )
    _issue(
        pki,
        "server",
        "/CN=kube-apiserver",
        "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,"
        "DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:10.0.0.1\n"
        "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    # The kubelet authenticates the API server by this certificate (its clientCAFile
    # is the local CA) when the API server proxies logs and exec to it; without one
    # the kubelet answers 401 and `kubectl logs` on the real node fails.
    _issue(
        pki,
        "kubelet-client",
        "/O=system:masters/CN=kube-apiserver-kubelet-client",
        "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n",
    )
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


def kubeconfig_text(server: str, ca: Path, token: str, user: str = "admin") -> str:
    return f"""apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: {user}
  user:
    token: {token}
contexts:
- name: local
  context: {{cluster: local, user: {user}}}
current-context: local
"""


@dataclass
class LocalCluster:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler.

    ``with LocalCluster() as c:`` starts everything and yields when the API
    server is ready; leaving the block stops every process it started.
    """

    state_dir: Path | None = None
    die_with_parent: bool = True
    apiserver_port: int | None = None
    extra_apiserver_args: list[str] = field(default_factory=list)
    controllers: str = CONTROLLERS
    real_node: bool = False
    """Also start a real node (containerd + kubelet + test device plugin); needs root."""
    real_node_images: tuple[str, ...] = ("operator", "probe")
    """Images (images/build.sh names) the real node imports; the pause image always."""
    """kube-controller-manager --controllers (benchmarks of huge simulated fleets drop
    node-lifecycle-controller, which would mark nodes without heartbeats NotReady)."""
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _own_state_dir: bool = False

    # Filled by start().
    server: str = ""
    kubeconfig: Path = Path()
    token: str = ""
    node_token: str = ""
    bin_dirs: list[str] = field(default_factory=list)
    node: RealNode | None = None

    def __enter__(self) -> LocalCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def compact_etcd(self) -> int:
        """Compact etcd's history up to its current revision (as the API server does
        every 5 minutes): a watch from an older resourceVersion then gets 410 Gone.
        Returns the revision."""
        import json

        def post(path: str, body: dict[str, object]) -> dict[str, Any]:
            request = urllib.request.Request(
                f"{self.etcd_url}{path}",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=10) as response:
                answer: dict[str, Any] = json.loads(response.read())
                return answer

        revision = int(post("/v3/kv/range", {"key": "AA=="})["header"]["revision"])
        post("/v3/kv/compaction", {"revision": revision, "physical": True})
        return revision

    @property
    def ca_file(self) -> Path:
        assert self.state_dir is not None
        return self.state_dir / "pki" / "ca.crt"

    def env(self) -> dict[str, str]:
        """Environment for subprocesses: KUBECONFIG and PATH with kubectl/helm."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = os.pathsep.join([*self.bin_dirs, env.get("PATH", "")])
        return env

    def start(self) -> None:
        self.bin_dirs = binary_path()
        if self.state_dir is None:
            # tmpfs when there is one: etcd's fsyncs dominate start-up on disk.
            base = "/dev/shm" if Path("/dev/shm").is_dir() else None
            self.state_dir = Path(tempfile.mkdtemp(prefix="sdcguard-cluster-", dir=base))
            self._own_state_dir = True
        self.state_dir.mkdir(parents=True, exist_ok=True)
        pki = self.state_dir / "pki"
        t0 = time.monotonic()
        make_pki(pki)
        self.token = secrets.token_hex(16)
        # The real node's kubelet authenticates as system:node:<name> (Node
        # authorizer, NodeRestriction); the token is there whether or not a
        # node is started, so one can join a running control plane.
        self.node_token = secrets.token_hex(16)
        (self.state_dir / "tokens.csv").write_text(
            f'{self.token},admin,admin-uid,"system:masters"\n'
            f'{self.node_token},system:node:{NODE_NAME},node-uid,"system:nodes"\n'
        )
        etcd_port, peer_port = free_port(), free_port()
        api_port = self.apiserver_port or free_port()
        check_port_free(api_port, "kube-apiserver")
        self.server = f"https://127.0.0.1:{api_port}"
        self.kubeconfig = self.state_dir / "kubeconfig"
        self.kubeconfig.write_text(kubeconfig_text(self.server, pki / "ca.crt", self.token))

        self._spawn(
            "etcd",
            [
                find_binary("etcd", self.bin_dirs),
                "--name=local",
                f"--data-dir={self.state_dir / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-cluster=local=http://127.0.0.1:{peer_port}",
                "--unsafe-no-fsync",
                "--quota-backend-bytes=8589934592",
                "--log-level=warn",
            ],
        )
        self.etcd_url = f"http://127.0.0.1:{etcd_port}"
        self._wait_http(f"{self.etcd_url}/health", "etcd", timeout=30)
        self._spawn(
            "kube-apiserver",
            [
                find_binary("kube-apiserver", self.bin_dirs),
                f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                # 1.37 refuses a loopback advertise address for the endpoint
                # reconciler (the default/kubernetes Endpoints). Nothing here
                # reaches the API server through that Service (no kube-proxy;
                # the real node's operator Pod is given the address directly).
                "--endpoint-reconciler-type=none",
                f"--secure-port={api_port}",
                f"--tls-cert-file={pki / 'server.crt'}",
                f"--tls-private-key-file={pki / 'server.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--kubelet-client-certificate={pki / 'kubelet-client.crt'}",
                f"--kubelet-client-key={pki / 'kubelet-client.key'}",
                f"--token-auth-file={self.state_dir / 'tokens.csv'}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--allow-privileged=true",
                "--profiling=false",
                "--event-ttl=2h",
                f"--cert-dir={self.state_dir / 'apiserver-certs'}",
                # The real node registers a local address as its InternalIP;
                # without this the API server would resolve the node's hostname
                # through the machine's DNS (traffic off the machine) for logs.
                "--kubelet-preferred-address-types=InternalIP",
                *self.extra_apiserver_args,
            ],
        )
        # The test groups start their control planes at once, some niced: on a slow
        # machine the first readiness can take minutes (it returns as soon as it is).
        self._wait_ready(timeout=240)
        common = [
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
        ]
        self._spawn(
            "kube-controller-manager",
            [
                find_binary("kube-controller-manager", self.bin_dirs),
                *common,
                f"--secure-port={free_port()}",
                f"--controllers={self.controllers}",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                "--use-service-account-credentials=false",
                "--concurrent-job-syncs=20",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
            ],
        )
        self._spawn(
            "kube-scheduler",
            [
                find_binary("kube-scheduler", self.bin_dirs),
                *common,
                f"--secure-port={free_port()}",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
            ],
        )
        self._wait_default_serviceaccount(timeout=60)
        log(f"control plane ready at {self.server} in {time.monotonic() - t0:.1f}s")
        if self.real_node:
            self.start_real_node()

    def start_real_node(self) -> RealNode:
        """Join a real node (containerd, kubelet, device plugin) to this control plane."""
        if self.node is None:
            node = RealNode(self, images=self.real_node_images)
            self.node = node
            node.start()
        return self.node

    def _spawn(self, name: str, argv: list[str]) -> None:
        assert self.state_dir is not None
        logf = open(self.state_dir / f"{name}.log", "ab")  # noqa: SIM115 (child owns it)
        proc = subprocess.Popen(
            argv,
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent if self.die_with_parent else None,
        )
        logf.close()
        self.processes[name] = proc
        (self.state_dir / "pids").open("a").write(f"{name} {proc.pid}\n")

    def _check_alive(self) -> None:
        assert self.state_dir is not None
        for name, proc in self.processes.items():
            if proc.poll() is not None:
                tail = (self.state_dir / f"{name}.log").read_text(errors="replace")[-1500:]
                raise ClusterError(
                    f"{name} exited with code {proc.returncode} during start-up; "
                    f"last log lines:\n{tail}"
                )

    def _wait_http(self, url: str, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
            time.sleep(0.2)
        raise ClusterError(f"{what} did not become healthy within {timeout:.0f}s ({url})")

    def _ssl(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def request(self, path: str, timeout: float = 5, method: str = "GET") -> tuple[int, bytes]:
        req = urllib.request.Request(
            self.server + path, headers={"Authorization": f"Bearer {self.token}"}, method=method
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self._ssl()) as resp:
                return int(resp.status), resp.read()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read()

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            with contextlib.suppress(OSError):
                status, _ = self.request("/readyz", timeout=2)
                if status == 200:
                    return
            time.sleep(0.3)
        raise ClusterError(f"kube-apiserver not ready within {timeout:.0f}s; see its log")

    def _wait_default_serviceaccount(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            status, _ = self.request("/api/v1/namespaces/default/serviceaccounts/default")
            if status == 200:
                return
            time.sleep(0.3)
        raise ClusterError("the service-account controller did not create default/default")

    def stop(self) -> None:
        """Stop the real node, then each process (apiserver first, etcd last); remove temp state."""
        if self.node is not None:
            try:
                self.node.stop()
            finally:
                self.node = None
        order = ["kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"]
        for name in order:
            proc = self.processes.get(name)
            if proc is not None and proc.poll() is None:
                proc.terminate()
        for name in order:
            proc = self.processes.get(name)
            if proc is None:
                continue
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self.processes.clear()
        if self._own_state_dir and self.state_dir is not None:
            shutil.rmtree(self.state_dir, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def down(state_dir: Path) -> int:
    """Stop a cluster started by ``up``; returns how many processes were stopped."""
    pids_file = state_dir / "pids"
    if not pids_file.exists():
        return 0
    entries = [line.split() for line in pids_file.read_text().splitlines() if line.strip()]
    if (state_dir / "node").exists():
        # The kubelet and device plugin first (nothing restarts containers), then
        # the node's containers, mounts, namespaces and cgroups, and containerd.
        for name, pid in entries:
            if name in ("node-kubelet", "node-deviceplugin") and _pid_alive(int(pid)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGTERM)
        realnode.cleanup(state_dir / "node", realnode.RealNode.containerd_root_dir())
    stopped = 0
    for _name, pid in reversed(entries):
        if _pid_alive(int(pid)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGTERM)
                stopped += 1
    deadline = time.monotonic() + 15
    for _name, pid in entries:
        while _pid_alive(int(pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _pid_alive(int(pid)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    shutil.rmtree(state_dir, ignore_errors=True)
    return stopped


INSTALL_COMMAND = "install-command"
"""The helm install ``up`` printed, kept in the state directory for ``install``."""


def install(state_dir: Path) -> int:
    """Run the exact ``helm install`` that ``up`` printed for this cluster (image tags,
    API server port and host ports filled in), with its kubeconfig and binaries."""
    saved = state_dir / INSTALL_COMMAND
    if not saved.is_file():
        raise ClusterError(
            f"no install command in {state_dir}: start the cluster with a real node first "
            "(make cluster-up)"
        )
    command = saved.read_text().strip()
    env = dict(os.environ)
    env["KUBECONFIG"] = str(state_dir / "kubeconfig")
    env["PATH"] = os.pathsep.join([*binary_path(), env.get("PATH", "")])
    log(f"running: {command}")
    proc = subprocess.run(shlex.split(command), env=env, check=False)
    if proc.returncode != 0:
        return proc.returncode
    log(
        "installed; watch it come up with: kubectl -n sdcguard-system get pods -w "
        f"(KUBECONFIG={env['KUBECONFIG']})"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    up_p = sub.add_parser("up", help="start the control plane in the background")
    up_p.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    up_p.add_argument("--port", type=int, default=None, help="kube-apiserver port")
    up_p.add_argument(
        "--real-node",
        action="store_true",
        help="also start a real node: containerd, CNI, kubelet, test device plugin (root)",
    )
    down_p = sub.add_parser("down", help="stop a control plane started with up")
    down_p.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    install_p = sub.add_parser(
        "install", help="run the helm install that up printed (the operator on the real node)"
    )
    install_p.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    sub.add_parser("build", help="build/fetch the binaries only")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "build":
            print(":".join(binary_path()))
            return 0
        if args.cmd == "install":
            return install(args.state_dir)
        if args.cmd == "down":
            n = down(args.state_dir)
            log(f"stopped {n} process(es)" if n else "nothing was running")
            return 0
        if (args.state_dir / "pids").exists():
            down(args.state_dir)
        cluster = LocalCluster(
            state_dir=args.state_dir,
            die_with_parent=False,
            apiserver_port=args.port,
            real_node=args.real_node,
        )
        try:
            cluster.start()
        except BaseException:
            cluster.stop()
            raise
        print(cluster.kubeconfig)
        if cluster.node is not None:
            subprocess.run(
                ["kubectl", "get", "nodes", "-o", "wide"], env=cluster.env(), check=False
            )
        # kubectl sdc: the checkout's launcher, run by this (the venv's) Python.
        plugin = [*cluster.bin_dirs, str(REPO / "charts/krew")]
        log(
            f"export KUBECONFIG={cluster.kubeconfig} PATH={':'.join(plugin)}:$PATH "
            f"SDCGUARD_PYTHON={sys.executable}"
        )
        if cluster.node is not None:
            from sdcdev.cluster.operator_pod import install_command

            command = install_command(cluster)
            (args.state_dir / INSTALL_COMMAND).write_text(command + "\n")
            log(f"install the operator: {command}  (or: make cluster-install)")
        log("stop with: make cluster-down")
        return 0
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
