"""A real Kubernetes node for the local cluster: containerd, CNI, a kubelet, a device plugin.

``RealNode(cluster).start()`` joins one node to a running :class:`LocalCluster`:

- containerd (Debian's package) as a plain process with its own config, state
  and socket; its image store lives in the cache (``$SDCGUARD_CACHE/node``) so
  images are imported once per machine, not once per start;
- a CNI bridge network (``/usr/lib/cni`` plugins) with no gateway and no route
  off the bridge: Pods reach each other and nothing else, the host included
  (the network rule: test traffic stays on loopback or in our own namespaces);
- the kubelet built from the same ``k8s.io/kubernetes`` version as the control
  plane (``KUBELET_VERSION`` in build-binaries.sh, 1.37.2; kubelets from 1.35 refuse
  this host's cgroup v1 unless ``failCgroupV1: false`` is set, as below; containerd
  1.6.20 serves the CRI v1 API they speak), authenticating as ``system:node:<name>``,
  with its node IP on an interface of our own with nothing attached (``NODE_IP``: a
  local address, never on a wire; the kubelet refuses 127.0.0.1) and serving there only;
- the project's test device plugin (``tests/cluster/node/deviceplugin``),
  which advertises ``nvidia.com/gpu`` (by default 2) with no hardware behind
  it, so a probe Job's GPU request is admitted by the real kubelet.

Images come from ``images/build.sh`` (OCI archives, ``localhost/`` names, see
there) and are imported with ``ctr``; Pods use them with ``imagePullPolicy``
``Never`` or ``IfNotPresent``: no registry is contacted.

Host requirements: Linux, root, cgroups (v1 or v2), and the Debian packages
``tests/cluster/node/setup-host.sh`` installs. A missing one raises
:class:`ClusterError` saying which; nothing is skipped silently.

The kubelet's device-plugin directory is fixed (``/var/lib/kubelet/device-plugins``),
so one real node runs per machine at a time (a lock says so if a second starts).

``stop()`` stops the kubelet, kills and deletes every container through
containerd, stops containerd, unmounts everything under its directories,
deletes the network namespaces, bridge and cgroups it created and restores
what it changed: no process, mount or container stays behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sdcdev import REPO

if TYPE_CHECKING:
    from sdcdev.cluster.localcluster import LocalCluster

#: Installs containerd, runc, the CNI plugins, buildah and mmdebstrap when missing.
SETUP_HOST = REPO / "tests" / "cluster" / "node" / "setup-host.sh"
NODE_NAME = "real-node-0"
BRIDGE = "sdcg0"
# The node's address. The kubelet refuses a loopback node IP (it then reports no
# address at all, and host-network Pods get no Pod IP, so Services have no
# endpoints). A /32 on an interface of our own with nothing attached (a bridge
# without ports: this kernel has no dummy driver) is a local address like
# 127.0.0.1: packets to it are delivered inside the machine and never reach a
# wire. The kubelet serves on it; the API server reaches it as the InternalIP.
NODE_LINK = "sdcg-node0"
NODE_IP = "10.245.255.1"
POD_SUBNET = "10.244.0.0/24"
CNI_BIN_DIR = Path("/usr/lib/cni")
PROBE_RUNTIME_HANDLER = "sdcguard-probe"
"""A containerd runtime handler besides runc, for a probe RuntimeClass to name."""
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
NETNS_DIR = Path("/var/run/netns")
LOCK_FILE = Path("/run/sdcguard-realnode.lock")
CGROUP_ROOT = Path("/sys/fs/cgroup")


class ClusterError(RuntimeError):
    """A local-cluster problem a person can act on; the message says how."""


def _log(message: str) -> None:
    print(f"[localcluster] node: {message}", file=sys.stderr, flush=True)


def _error(message: str) -> ClusterError:
    return ClusterError(message)


def cache_dir() -> Path:
    return Path(
        os.environ.get("SDCGUARD_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sdcguard"
    )


def check_host() -> None:
    """Raise ClusterError naming what this host lacks for a real node."""
    if os.uname().sysname != "Linux":
        raise _error(f"a real node needs Linux (this is {os.uname().sysname})")
    if os.geteuid() != 0:
        raise _error(
            "a real node needs root (containerd, mounts, network namespaces, cgroups); "
            "run as root, or use the simulated fleet only"
        )
    if not (CGROUP_ROOT / "memory").is_dir() and not (CGROUP_ROOT / "cgroup.controllers").exists():
        raise _error(f"no cgroup hierarchy under {CGROUP_ROOT}; the kubelet needs cgroups")
    proc = subprocess.run(["bash", str(SETUP_HOST)], check=False, text=True)
    if proc.returncode != 0:
        raise _error(
            "the host lacks containerd/runc/CNI plugins and installing them failed "
            "(see above); install: apt-get install containerd runc containernetworking-plugins "
            "iptables buildah mmdebstrap"
        )
    for tool in ("containerd", "ctr", "runc", "ip", "mount", "umount"):
        if shutil.which(tool) is None:
            raise _error(f"{tool} not found on PATH")


def build_images(names: tuple[str, ...]) -> dict[str, tuple[str, Path]]:
    """Build (or find cached) images; name -> (reference, OCI archive)."""
    proc = subprocess.run(
        ["bash", str(REPO / "images" / "build.sh"), *names],
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise _error(f"building images {names} failed (see the error above)")
    out: dict[str, tuple[str, Path]] = {}
    for line in proc.stdout.splitlines():
        name, ref, archive = line.split()
        out[name] = (ref, Path(archive))
    return out


def _mounts_under(*prefixes: Path) -> list[str]:
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if any(point == str(p) or point.startswith(f"{p}/") for p in prefixes):
                found.append(point)
    return found


def unmount_under(*prefixes: Path) -> int:
    """Unmount everything at or below the prefixes, deepest first; returns how many."""
    n = 0
    for _ in range(5):
        points = sorted(set(_mounts_under(*prefixes)), key=len, reverse=True)
        if not points:
            break
        for point in points:
            if subprocess.run(["umount", point], capture_output=True, check=False).returncode:
                subprocess.run(["umount", "-l", point], capture_output=True, check=False)
            n += 1
    return n


def _pids_matching(needle: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if needle in cmdline:
            pids.append(int(entry.name))
    return pids


def _kill_and_wait(pids: list[int], timeout: float = 10) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.1)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _remove_dead_cluster_dir(state_dir: Path) -> None:
    """Remove a LocalCluster's own temporary state directory (``sdcguard-cluster-*``:
    etcd's data, in memory under /dev/shm) once no process it recorded is alive."""
    pids_file = state_dir / "pids"
    if not state_dir.name.startswith("sdcguard-cluster-") or not pids_file.is_file():
        return
    with contextlib.suppress(OSError, ValueError):
        pids = [int(line.split()[1]) for line in pids_file.read_text().splitlines() if line]
        if not any(Path(f"/proc/{pid}").exists() for pid in pids):
            shutil.rmtree(state_dir, ignore_errors=True)


def _is_stale_shim(pid: int, node_dir: Path) -> bool:
    """A containerd shim of an earlier real node: its ``-address`` is the socket of a
    LocalCluster node directory (not ``node_dir``) that no longer exists."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False
    if "-address" not in argv or argv.index("-address") + 1 >= len(argv):
        return False
    sock = Path(argv[argv.index("-address") + 1])
    ours = sock.name == "containerd.sock" and sock.parent.name == "containerd"
    state_dir = sock.parent.parent.parent
    cluster_dir = (
        state_dir.name.startswith("sdcguard-cluster-") or state_dir.name == ".localcluster"
    )
    return ours and cluster_dir and sock.parent.parent != node_dir and not sock.exists()


def _kubepods_cgroups() -> list[Path]:
    found: list[Path] = []
    if not CGROUP_ROOT.is_dir():
        return found
    for ctrl in CGROUP_ROOT.iterdir():
        candidate = ctrl / "kubepods"
        if candidate.is_dir():
            found.append(candidate)
    if (CGROUP_ROOT / "kubepods").is_dir():
        found.append(CGROUP_ROOT / "kubepods")
    return found


def _rmdir_tree(top: Path) -> None:
    """rmdir a cgroup tree bottom-up (cgroup files cannot be unlinked, dirs can)."""
    for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda t: -len(t[0])):
        with contextlib.suppress(OSError):
            os.rmdir(dirpath)


def purge_containers(sock: Path) -> None:
    """Kill and delete every container in containerd's k8s.io namespace (and its snapshot)."""
    if not sock.exists() or shutil.which("ctr") is None:
        return
    ctr = ["ctr", "--address", str(sock), "-n", "k8s.io"]

    def run(*args: str) -> str:
        try:
            proc = subprocess.run([*ctr, *args], capture_output=True, text=True, timeout=20)
        except subprocess.TimeoutExpired:
            return ""
        return proc.stdout if proc.returncode == 0 else ""

    if not run("version"):
        return  # containerd is not running
    tasks = [line.split()[0] for line in run("tasks", "ls").splitlines()[1:] if line.strip()]
    for task in tasks:
        run("tasks", "kill", "-s", "SIGKILL", task)
    for task in tasks:
        run("tasks", "delete", "-f", task)
    for container in run("containers", "ls", "-q").split():
        run("containers", "delete", container)


def cleanup(node_dir: Path, containerd_root: Path) -> None:
    """Remove what a node left behind (idempotent; also after a crash).

    Reads ``node_dir/created.json`` (written at start: the network namespaces
    and bridge that existed before, the cgroups the kubelet created, and
    ip_forward's old value) so only what this node made is removed.
    """
    record: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        record = json.loads((node_dir / "created.json").read_text())
    purge_containers(node_dir / "containerd" / "containerd.sock")
    # Any process still naming our directories: containerd, its shims, the kubelet.
    _kill_and_wait(_pids_matching(str(node_dir)))
    if "netns_before" in record:
        for ns in _new_netns(record):
            subprocess.run(["umount", str(NETNS_DIR / ns)], capture_output=True, check=False)
            with contextlib.suppress(OSError):
                (NETNS_DIR / ns).unlink()
    unmount_under(node_dir, containerd_root, DEVICE_PLUGIN_DIR.parent)
    if record.get("bridge_created") and Path(f"/sys/class/net/{BRIDGE}").exists():
        subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True, check=False)
    if record.get("node_link_created") and Path(f"/sys/class/net/{NODE_LINK}").exists():
        subprocess.run(["ip", "link", "delete", NODE_LINK], capture_output=True, check=False)
    for top in record.get("cgroups_created", []):
        _rmdir_tree(Path(top))
    if record.get("ip_forward") is not None:
        with contextlib.suppress(OSError):
            Path("/proc/sys/net/ipv4/ip_forward").write_text(str(record["ip_forward"]))
    if record.get("var_lib_kubelet_created"):
        shutil.rmtree(DEVICE_PLUGIN_DIR.parent, ignore_errors=True)
    elif DEVICE_PLUGIN_DIR.is_dir():
        for name in ("kubelet.sock", "kubelet_internal_checkpoint"):
            with contextlib.suppress(OSError):
                (DEVICE_PLUGIN_DIR / name).unlink()
        for sock_file in DEVICE_PLUGIN_DIR.glob("*-sdcguard-test.sock"):
            sock_file.unlink()
    logs = Path("/var/log/containers")
    if logs.is_dir():
        for link in logs.glob("*.log"):
            with contextlib.suppress(OSError):
                if str(node_dir) in os.readlink(link):
                    link.unlink()
    shutil.rmtree(node_dir, ignore_errors=True)


def _new_netns(record: dict[str, Any]) -> list[str]:
    before = set(record.get("netns_before", []))
    if not NETNS_DIR.is_dir():
        return []
    return [
        p.name for p in NETNS_DIR.iterdir() if p.name.startswith("cni-") and p.name not in before
    ]


@dataclass
class RealNode:
    """One containerd + kubelet node joined to ``cluster``."""

    cluster: LocalCluster
    name: str = NODE_NAME
    gpus: int = 2
    gpu_resource: str = "nvidia.com/gpu"
    images: tuple[str, ...] = ("operator", "probe")
    """Images (of images/build.sh) to build if needed and import; the pause image always."""
    image_refs: dict[str, str] = field(default_factory=dict)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _lock: Any = None

    @property
    def node_dir(self) -> Path:
        assert self.cluster.state_dir is not None
        return self.cluster.state_dir / "node"

    @staticmethod
    def containerd_root_dir() -> Path:
        """containerd's root (image store, snapshots) persists in the cache: import once."""
        return cache_dir() / "node" / "containerd-root"

    @property
    def containerd_root(self) -> Path:
        return self.containerd_root_dir()

    @property
    def containerd_sock(self) -> Path:
        return self.node_dir / "containerd" / "containerd.sock"

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            ["ctr", "--address", str(self.containerd_sock), "-n", "k8s.io", *args],
            capture_output=True,
            text=True,
            check=False,
        )
        if check and proc.returncode != 0:
            raise _error(f"ctr {' '.join(args)} failed: {proc.stderr.strip()[-400:]}")
        return proc

    def start(self) -> None:
        t0 = time.monotonic()
        check_host()
        self._take_lock()
        built = build_images(("pause", *self.images))
        self.image_refs = {name: ref for name, (ref, _archive) in built.items()}
        self.node_dir.mkdir(parents=True, exist_ok=True)
        self._record_host_state()
        self._write_cni()
        self._node_address()
        self._start_containerd()
        # Containers of an earlier run that crashed (the image store persists).
        purge_containers(self.containerd_sock)
        imported = self._import_images(built)
        if imported:
            # containerd 1.6's CRI image store learns about imports on restart.
            self._stop_process("containerd")
            self._start_containerd()
        self._start_kubelet()
        self._spawn(
            "deviceplugin",
            [
                self._bin("deviceplugin"),
                f"-resource={self.gpu_resource}",
                f"-count={self.gpus}",
                f"-dir={DEVICE_PLUGIN_DIR}",
            ],
        )
        self._wait_node_ready(timeout=120)
        _log(
            f"{self.name} Ready with {self.gpus} x {self.gpu_resource} "
            f"in {time.monotonic() - t0:.1f}s"
        )

    # -- pieces ---------------------------------------------------------------------------

    def _take_lock(self) -> None:
        self._lock = open(LOCK_FILE, "a+")  # noqa: SIM115 (held for the node's lifetime)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.seek(0)
            holder = self._lock.read().strip()
            self._lock.close()
            self._lock = None
            raise _error(
                f"another real node runs on this machine ({holder}); the kubelet's "
                f"device-plugin directory {DEVICE_PLUGIN_DIR} is per machine. Stop it "
                "(python -m sdcdev.cluster.localcluster down) and retry"
            ) from None
        self._lock.seek(0)
        previous = self._lock.read().strip()
        self._lock.seek(0)
        self._lock.truncate()
        self._lock.write(f"pid {os.getpid()}, state {self.node_dir}\n")
        self._lock.flush()
        self._sweep_crashed_run(previous)

    def _sweep_crashed_run(self, previous: str) -> None:
        """Remove what an earlier node that was never stopped left (a run killed by hand,
        a crash): its containers' shims, mounts, network namespaces, bridge and cgroups,
        which the session teardown would count as this run's leaks. The lock is held,
        so no other real node runs: everything of an earlier one is stale."""
        old_dir = Path(previous.rpartition("state ")[2]) if "state " in previous else None
        if old_dir is not None and old_dir != self.node_dir and old_dir.is_dir():
            _log(f"removing what the earlier real node in {old_dir} left behind")
            cleanup(old_dir, self.containerd_root)
            _remove_dead_cluster_dir(old_dir.parent)
        # Shims of an earlier node whose directory is gone already (the state
        # directories of LocalCluster: sdcguard-cluster-*, .localcluster).
        orphans = [
            pid for pid in _pids_matching("containerd-shim") if _is_stale_shim(pid, self.node_dir)
        ]
        if orphans:
            _log(f"stopping {len(orphans)} containerd shims an earlier real node left")
            _kill_and_wait(orphans)
            unmount_under(self.containerd_root)

    def _record_host_state(self) -> None:
        record = {
            "netns_before": sorted(p.name for p in NETNS_DIR.iterdir())
            if NETNS_DIR.is_dir()
            else [],
            "bridge_created": not Path(f"/sys/class/net/{BRIDGE}").exists(),
            "node_link_created": not Path(f"/sys/class/net/{NODE_LINK}").exists(),
            "cgroups_created": [],
            "ip_forward": Path("/proc/sys/net/ipv4/ip_forward").read_text().strip(),
            "var_lib_kubelet_created": not DEVICE_PLUGIN_DIR.parent.exists(),
        }
        existing = {str(p) for p in _kubepods_cgroups()}
        record["kubepods_before"] = sorted(existing)
        (self.node_dir / "created.json").write_text(json.dumps(record))

    def _update_record(self) -> None:
        path = self.node_dir / "created.json"
        record = json.loads(path.read_text())
        before = set(record.get("kubepods_before", []))
        record["cgroups_created"] = sorted(
            str(p) for p in _kubepods_cgroups() if str(p) not in before
        )
        path.write_text(json.dumps(record))

    def _node_address(self) -> None:
        if Path(f"/sys/class/net/{NODE_LINK}").exists():
            return
        for argv in (
            ["ip", "link", "add", NODE_LINK, "type", "bridge"],
            ["ip", "addr", "add", f"{NODE_IP}/32", "dev", NODE_LINK],
            ["ip", "link", "set", NODE_LINK, "up"],
        ):
            proc = subprocess.run(argv, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise _error(f"{' '.join(argv)} failed: {proc.stderr.strip()}")

    def _write_cni(self) -> None:
        conf_dir = self.node_dir / "cni" / "net.d"
        conf_dir.mkdir(parents=True, exist_ok=True)
        # No gateway address on the bridge and no default route in Pods: a Pod
        # reaches the other Pods of this node and nothing else (not the host,
        # not the machine's network). The operator Pod uses the host network
        # (see the chart's hostNetwork value) and probes need no network.
        conflist = {
            "cniVersion": "1.0.0",
            "name": "sdcguard-local",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": False,
                    "isDefaultGateway": False,
                    "ipMasq": False,
                    "hairpinMode": False,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_SUBNET}]],
                        "dataDir": str(self.node_dir / "cni" / "ipam"),
                    },
                }
            ],
        }
        (conf_dir / "10-sdcguard.conflist").write_text(json.dumps(conflist, indent=2))

    def _start_containerd(self) -> None:
        cdir = self.node_dir / "containerd"
        cdir.mkdir(parents=True, exist_ok=True)
        self.containerd_root.mkdir(parents=True, exist_ok=True)
        pause = self.image_refs["pause"]
        config = f"""version = 2
root = "{self.containerd_root}"
state = "{cdir / "state"}"
disabled_plugins = ["io.containerd.internal.v1.tracing", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "{self.containerd_sock}"

[ttrpc]
  address = "{cdir / "containerd.sock.ttrpc"}"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  # This VM refuses a negative oom_score_adj; without this runc fails with
  # "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
    # A second handler, as GPU Operator installs add "nvidia": probes may name it
    # through a RuntimeClass (spec.probe.runtimeClassName).
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.{PROBE_RUNTIME_HANDLER}]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.{PROBE_RUNTIME_HANDLER}.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{self.node_dir / "cni" / "net.d"}"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{cdir / "opt"}"
"""
        (cdir / "config.toml").write_text(config)
        self._spawn("containerd", ["containerd", "--config", str(cdir / "config.toml")])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            self._check_alive()
            if self.containerd_sock.exists() and self.ctr("version", check=False).returncode == 0:
                return
            time.sleep(0.2)
        raise _error("containerd did not answer on its socket within 30s; see containerd.log")

    def _import_images(self, built: dict[str, tuple[str, Path]]) -> bool:
        present = set(self.ctr("images", "ls", "-q").stdout.split())
        # Images of this project whose archives images/build.sh pruned: their
        # content and snapshots are garbage-collected by containerd.
        kept = set()
        for archive in (cache_dir() / "images").glob("*.oci.tar"):
            name, tag = archive.name.removesuffix(".oci.tar").rsplit("-", 1)
            kept.add(f"localhost/sdcguard-{name}:{tag}")
        stale = [r for r in present if r.startswith("localhost/sdcguard-") and r not in kept]
        if stale:
            self.ctr("images", "rm", *stale, check=False)
        imported = False
        for name, (ref, archive) in built.items():
            if ref in present:
                continue
            t0 = time.monotonic()
            _log(f"importing {ref} ({archive.stat().st_size / 2**20:.0f} MiB) into containerd")
            self.ctr("images", "import", str(archive))
            _log(f"imported {name} in {time.monotonic() - t0:.1f}s")
            imported = True
        return imported

    def kubelet_version(self) -> str:
        """The version the node's kubelet binary reports (``v1.37.2``): build-binaries.sh
        builds it at ``KUBELET_VERSION``, which may differ from the control plane's."""
        proc = subprocess.run(
            [self._bin("kubelet"), "--version"], capture_output=True, text=True, check=False
        )
        if proc.returncode != 0 or not proc.stdout.startswith("Kubernetes v"):
            raise _error(f"kubelet --version failed: {(proc.stderr or proc.stdout).strip()}")
        return proc.stdout.split()[-1]

    def _bin(self, name: str) -> str:
        from sdcdev.cluster.localcluster import find_binary

        return find_binary(name, self.cluster.bin_dirs)

    def _start_kubelet(self) -> None:
        from sdcdev.cluster.localcluster import kubeconfig_text
        from sdcdev.sim.ports import free_port

        kdir = self.node_dir / "kubelet"
        (kdir / "root").mkdir(parents=True, exist_ok=True)
        (kdir / "pod-logs").mkdir(parents=True, exist_ok=True)
        DEVICE_PLUGIN_DIR.mkdir(parents=True, exist_ok=True)
        kubeconfig = kdir / "kubeconfig"
        kubeconfig.write_text(
            kubeconfig_text(
                self.cluster.server,
                self.cluster.ca_file,
                self.cluster.node_token,
                user=f"system:node:{self.name}",
            )
        )
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": NODE_IP,
            "port": free_port(),
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "cgroupDriver": "cgroupfs",
            # This host's cgroups are v1; from 1.35 the kubelet refuses v1 unless told
            # not to (the field exists since 1.31, so older kubelets take it too).
            "failCgroupV1": False,
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.containerd_sock}",
            "podLogsDir": str(kdir / "pod-logs"),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self.cluster.ca_file)},
            },
            "authorization": {"mode": "Webhook"},
            # Pods get no DNS configuration from the host (nothing resolves names here).
            "resolvConf": "",
            # Test images are imported once and must not be garbage-collected.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            # A busy shared machine must not make the kubelet evict the probe under test.
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
            },
            "oomScoreAdj": 0,
            "maxPods": 30,
            "serializeImagePulls": False,
            "registerNode": True,
            "nodeStatusUpdateFrequency": "5s",
        }
        (kdir / "config.yaml").write_text(json.dumps(config, indent=2))
        self._spawn(
            "kubelet",
            [
                self._bin("kubelet"),
                f"--config={kdir / 'config.yaml'}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={kdir / 'root'}",
                f"--cert-dir={kdir / 'pki'}",
                f"--hostname-override={self.name}",
                f"--node-ip={NODE_IP}",
                f"--node-labels=sdcguard.dev/real-node=true,node.kubernetes.io/instance-type=local-{self.gpus}gpu",
                "--v=1",
            ],
        )

    def _spawn(self, name: str, argv: list[str]) -> None:
        from sdcdev.cluster.localcluster import _die_with_parent

        logf = open(self.node_dir / f"{name}.log", "ab")  # noqa: SIM115 (child owns it)
        proc = subprocess.Popen(
            argv,
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent if self.cluster.die_with_parent else None,
            cwd=self.node_dir,
        )
        logf.close()
        self.processes[name] = proc
        assert self.cluster.state_dir is not None
        with (self.cluster.state_dir / "pids").open("a") as pids:
            pids.write(f"node-{name} {proc.pid}\n")

    def _check_alive(self) -> None:
        for name, proc in self.processes.items():
            if proc.poll() is not None:
                tail = (self.node_dir / f"{name}.log").read_text(errors="replace")[-2000:]
                raise _error(
                    f"{name} exited with code {proc.returncode} during start-up; "
                    f"last log lines:\n{tail}"
                )

    def _wait_node_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            self._check_alive()
            status, body = self.cluster.request(f"/api/v1/nodes/{self.name}")
            if status == 200:
                node = json.loads(body)
                ready = [
                    c for c in node.get("status", {}).get("conditions", []) if c["type"] == "Ready"
                ]
                gpus = node.get("status", {}).get("allocatable", {}).get(self.gpu_resource)
                last = f"Ready={ready[0]['status'] if ready else '?'}, {self.gpu_resource}={gpus}"
                if ready and ready[0]["status"] == "True" and gpus == str(self.gpus):
                    self._update_record()
                    return
            time.sleep(0.5)
        raise _error(
            f"node {self.name} not Ready with {self.gpus} {self.gpu_resource} within "
            f"{timeout:.0f}s ({last or 'not registered'}); see kubelet.log in {self.node_dir}"
        )

    def pod_logs(self, namespace: str, pod: str, tail: int = 40) -> str:
        """The last lines the kubelet logged for a Pod's containers (read from its log
        directory; the API server has no client certificate for the kubelet)."""
        lines: list[str] = []
        logs = self.node_dir / "kubelet" / "pod-logs"
        for path in sorted(logs.glob(f"{namespace}_{pod}_*/*/*.log")):
            text = path.read_text(errors="replace").splitlines()[-tail:]
            lines.append(f"--- {path.parent.name}/{path.name}")
            # CRI log lines: TIMESTAMP STREAM FLAG MESSAGE
            lines += [line.split(" ", 3)[-1] for line in text]
        return "\n".join(lines)

    def _stop_process(self, name: str, timeout: float = 20) -> None:
        proc = self.processes.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def kill(self, name: str) -> None:
        """SIGKILL the node's ``kubelet`` or ``containerd``, as a crash would: nothing is
        cleaned up, and the containers go on running under their shims."""
        if name not in ("kubelet", "containerd"):
            raise ValueError(f"kill: {name!r} is neither kubelet nor containerd")
        proc = self.processes.pop(name)
        proc.kill()
        proc.wait(timeout=10)
        _log(f"{name} (pid {proc.pid}) killed")

    def restart(self, name: str) -> None:
        """Start a killed ``kubelet`` or ``containerd`` again with the same configuration
        (the device plugin registers again with a new kubelet by itself)."""
        if name in self.processes and self.processes[name].poll() is None:
            return
        t0 = time.monotonic()
        {"kubelet": self._start_kubelet, "containerd": self._start_containerd}[name]()
        self._wait_node_ready(timeout=120)
        _log(f"{name} restarted; {self.name} Ready again in {time.monotonic() - t0:.1f}s")

    def stop(self) -> None:
        """Stop the kubelet first (so nothing restarts), then kill every container
        through containerd and remove what the Pods left (network namespaces, mounts):
        deterministic and quick, where deleting Pods through the API would race with
        their controllers creating replacements."""
        for name in ("deviceplugin", "kubelet"):
            self._stop_process(name)
        # Containers the kubelet did not get to, while containerd still runs.
        purge_containers(self.containerd_sock)
        self._stop_process("containerd")
        cleanup(self.node_dir, self.containerd_root)
        if self._lock is not None:
            self._lock.close()
            self._lock = None
