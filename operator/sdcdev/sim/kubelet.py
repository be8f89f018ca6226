"""The simulated kubelet: runs Pods bound to the fleet's nodes and reports their status.

One watch follows every Pod with a ``spec.nodeName`` and keeps those on the
fleet's nodes. A new probe Pod (its container runs ``sdcprobe``) waits in a
queue, still Pending, until one of ``max_parallel`` workers takes it; the
worker writes Running, runs the probe command for real on this machine's CPU
(see :mod:`sdcdev.sim.probe_command`) with the node's fault profile, and
writes Succeeded or Failed with the exit code and the result file as the
termination message. A Pod annotated ``sim.sdcguard.dev/run-command: "true"``
(a training Job's Pod) has its own command run as a process, with its
environment, its ServiceAccount token and its GPUs (see
:mod:`sdcdev.sim.commands`); it ends with the process's exit code. Any other Pod
(a customer workload) is Running at once and Succeeds after its
``sim.sdcguard.dev/run-seconds`` annotation (default 60 s).

Like a kubelet it honours ``activeDeadlineSeconds`` (the probe is killed; the
Pod fails with reason DeadlineExceeded) and deletion: the process is stopped,
a terminal status written, and the Pod deleted with grace period 0, since no
other kubelet will finish the deletion.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import structlog
from kubernetes.client.exceptions import ApiException

from sdcdev.sim.commands import command_env, gpu_uuids, local_argv, service_env
from sdcdev.sim.dra import claimed_minors
from sdcdev.sim.fleet import RUN_SECONDS_ANNOTATION
from sdcdev.sim.kube import JsonDict, Kube, ListWatch, retry_call
from sdcdev.sim.pods import (
    Container,
    PodKind,
    PodView,
    container_env,
    expand,
    parse_pod,
    running_status,
    secret_mounts,
    terminated_status,
    termination_message,
)
from sdcdev.sim.probe_command import UnsupportedProbeCommand, probe_invocation
from sdcdev.sim.state import FleetState, ProbeRecord, outcome_of
from sdcdev.sim.timers import TimerHandle, Timers
from sdcguard.api.common import parse_time

log = structlog.get_logger("sdcdev.sim")

DEFAULT_RUN_SECONDS = 60.0
DEADLINE_MESSAGE = "Pod was active on the node longer than the specified deadline"
#: A deleted probe gets at most this long between SIGTERM and SIGKILL.
MAX_KILL_GRACE_SECONDS = 5.0

TaskState = Literal["queued", "running", "finished"]


@dataclass
class PodTask:
    """One Pod the simulated kubelet owns."""

    pod: PodView
    kind: PodKind
    state: TaskState = "queued"
    cancel: threading.Event = field(default_factory=threading.Event)
    started: datetime | None = None
    timer: TimerHandle | None = None
    finalizing: bool = False

    @property
    def uid(self) -> str:
        return self.pod.metadata.uid

    @property
    def node(self) -> str:
        return self.pod.spec.node_name or ""


def _die_with_parent() -> None:
    """Child pre-exec hook: the probe gets SIGKILL if the simulator dies."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _exit_code(returncode: int) -> int:
    """Like a container runtime: death by signal N is exit code 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def _verdict(message: str) -> str | None:
    with contextlib.suppress(ValueError, AttributeError):
        doc = json.loads(message)
        if isinstance(doc, dict) and isinstance(doc.get("verdict"), str):
            return str(doc["verdict"])
    return None


def run_seconds(pod: PodView) -> float:
    raw = pod.metadata.annotations.get(RUN_SECONDS_ANNOTATION)
    try:
        return max(0.0, float(raw)) if raw is not None else DEFAULT_RUN_SECONDS
    except ValueError:
        return DEFAULT_RUN_SECONDS


def _requested(container: Container, resource: str | None) -> int:
    """How many of the extended ``resource`` the container asks for (limits, else requests)."""
    if resource is None:
        return 0
    raw = container.resources.limits.get(resource) or container.resources.requests.get(resource)
    return int(raw) if raw and raw.isdigit() else 0


def _probe_base_env() -> dict[str, str]:
    """This process's environment, with the probe package importable."""
    env = dict(os.environ)
    with contextlib.suppress(ImportError):
        import sdcprobe

        root = str(Path(sdcprobe.__file__).resolve().parent.parent)
        parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if root not in parts:
            env["PYTHONPATH"] = os.pathsep.join([root, *parts])
    return env


class SimKubelet:
    """Runs the Pods bound to the fleet's nodes."""

    def __init__(
        self,
        kube: Kube,
        state: FleetState,
        timers: Timers,
        *,
        max_parallel: int,
        workdir: Path,
        python: str = sys.executable,
        base_env: Mapping[str, str] | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        probes: bool = True,
    ) -> None:
        """``probes=False`` leaves probe Pods to another runner (a test's scripted one)."""
        self.kube = kube
        self.probes = probes
        self.state = state
        self.timers = timers
        self.max_parallel = max_parallel
        self.workdir = workdir
        self.python = python
        self.base_env = dict(base_env) if base_env is not None else _probe_base_env()
        self.clock = clock
        self._tasks: dict[str, PodTask] = {}
        self._lock = threading.Lock()
        self._queue: queue.Queue[PodTask | None] = queue.Queue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self._gpus_held: dict[str, dict[str, list[int]]] = {}
        """node -> Pod key -> the GPU indices a command Pod holds."""
        self.watch = ListWatch(
            kube,
            "/api/v1/pods",
            query={"fieldSelector": "spec.nodeName!="},
            on_sync=self._on_sync,
            on_event=self._on_event,
            stop_event=self._stop,
        )

    # Lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        t = threading.Thread(target=self.watch.run, name="sim-pod-watch", daemon=True)
        t.start()
        self._threads.append(t)
        for i in range(self.max_parallel):
            w = threading.Thread(target=self._worker, name=f"sim-probe-{i}", daemon=True)
            w.start()
            self._threads.append(w)

    def stop(self) -> None:
        """Stop watching and kill running probes (their Pods stay as they are, like a dead node)."""
        self.watch.stop()
        for _ in range(self.max_parallel):
            self._queue.put(None)
        with self._lock:
            procs = list(self._processes.values())
        for proc in procs:
            self._kill(proc, grace=0.0)
        for t in self._threads:
            t.join(timeout=10)

    # Watch callbacks (watch thread: cheap, no API calls) -------------------------
    def _on_sync(self, items: list[JsonDict]) -> None:
        seen = set()
        for obj in items:
            pod = self._ours(obj)
            if pod is not None:
                seen.add(pod.metadata.uid)
                self._handle(pod)
        with self._lock:
            gone = [t for uid, t in self._tasks.items() if uid not in seen]
        for task in gone:
            self._gone(task)

    def _on_event(self, kind: str, obj: JsonDict) -> None:
        pod = self._ours(obj)
        if pod is None:
            return
        if kind == "DELETED":
            with self._lock:
                task = self._tasks.get(pod.metadata.uid)
            if task is not None:
                self._gone(task)
            return
        self._handle(pod)

    def _ours(self, obj: JsonDict) -> PodView | None:
        node = (obj.get("spec") or {}).get("nodeName")
        if not self.state.has(node):
            return None
        try:
            pod = parse_pod(obj)
        except ValueError as exc:
            log.warning("sim.pod.unreadable", error=str(exc)[:300])
            return None
        if not self.probes and pod.kind == "probe":
            return None
        return pod

    def _handle(self, pod: PodView) -> None:
        uid = pod.metadata.uid
        with self._lock:
            task = self._tasks.get(uid)
            if task is not None:
                task.pod = pod
            elif pod.terminal:
                return  # finished before we saw it (or by a previous simulator)
            else:
                task = PodTask(pod=pod, kind=pod.kind)
                self._tasks[uid] = task
                if not pod.deleting:
                    self._admit(task)
                    return
        if pod.deleting:
            self._delete_requested(task)

    def _admit(self, task: PodTask) -> None:
        """A new Pod: queue a probe, start a workload. Called with the lock held."""
        if task.kind == "probe":
            self.state.pod_queued(task.node, task.pod.key)
            log.info("sim.probe.queued", node=task.node, pod=task.pod.key)
            self._queue.put(task)
        elif task.kind == "command":
            t = threading.Thread(
                target=self._command_thread, args=(task,), name=f"sim-cmd-{task.pod.key}"
            )
            t.daemon = True
            t.start()
        else:
            self.timers.call_soon(lambda: self._start_workload(task), f"start {task.pod.key}")

    def _delete_requested(self, task: PodTask) -> None:
        with self._lock:
            if task.cancel.is_set():
                return
            task.cancel.set()
            state = task.state
            if task.timer is not None:
                task.timer.cancel()
        if state != "running" or task.kind == "workload":
            # No process to stop: finish the deletion now. A running probe's
            # worker does it once the process is gone.
            self.timers.call_soon(lambda: self._finalize_deleted(task), f"finalize {task.pod.key}")

    def _gone(self, task: PodTask) -> None:
        """The Pod object no longer exists: stop whatever runs for it."""
        with self._lock:
            self._tasks.pop(task.uid, None)
            task.cancel.set()
            task.finalizing = True
            if task.timer is not None:
                task.timer.cancel()
            proc = self._processes.get(task.uid)
        if proc is not None:
            self._kill(proc, grace=0.0)
        self.state.pod_dropped(task.node, task.pod.key)

    # Status writing ---------------------------------------------------------------
    def _host_ip(self, task: PodTask) -> str:
        return self.state.config(task.node).internal_ip

    def _write(self, task: PodTask, body: JsonDict) -> bool:
        pod = task.pod
        return retry_call(
            lambda: self.kube.patch_pod_status(pod.metadata.namespace, pod.metadata.name, body),
            what=f"status of {pod.key}",
        )

    def _write_terminated(
        self,
        task: PodTask,
        *,
        exit_code: int,
        message: str = "",
        reason: str | None = None,
        pod_reason: str | None = None,
        pod_message: str | None = None,
    ) -> bool:
        now = self.clock()
        container = task.pod.probe_container()
        body = terminated_status(
            task.pod,
            host_ip=self._host_ip(task),
            started=task.started or now,
            finished=now,
            exit_code=exit_code,
            message=message,
            reason=reason,
            pod_reason=pod_reason,
            pod_message=pod_message,
            main_container=container.name if container else None,
        )
        return self._write(task, body)

    def _finalize_deleted(self, task: PodTask) -> None:
        """Finish a deletion like a kubelet: terminal status, then delete with grace 0."""
        pod = task.pod
        with self._lock:
            if task.finalizing:
                return
            task.finalizing = True
        if not pod.terminal and task.state != "finished":
            self._write_terminated(
                task,
                exit_code=137 if task.state == "running" else 0,
                reason="Error" if task.state == "running" else "ContainerStatusUnknown",
                pod_reason="Terminated" if task.state != "running" else None,
                pod_message="deleted before it finished",
            )
        task.state = "finished"
        with contextlib.suppress(Exception):
            self.kube.force_delete_pod(pod.metadata.namespace, pod.metadata.name, pod.metadata.uid)
        self.state.pod_dropped(task.node, pod.key)
        with self._lock:
            self._tasks.pop(task.uid, None)
        log.info("sim.pod.deleted", node=task.node, pod=pod.key, kind=task.kind)

    # Customer workloads (timer thread) --------------------------------------------
    def _start_workload(self, task: PodTask) -> None:
        if task.cancel.is_set():
            return
        now = self.clock()
        pod = task.pod
        task.started = parse_time(pod.status.start_time) or now
        if pod.status.phase != "Running" and not self._write(
            task, running_status(pod, host_ip=self._host_ip(task), started=task.started)
        ):
            return
        task.state = "running"
        self.state.pod_started(task.node, pod.key, "workload")
        elapsed = (now - task.started).total_seconds()
        duration = run_seconds(pod)
        deadline = pod.spec.active_deadline_seconds
        if deadline is not None and deadline < duration:
            finish: Callable[[], None] = lambda: self._finish_workload(task, deadline_hit=True)  # noqa: E731
            duration = float(deadline)
        else:
            finish = lambda: self._finish_workload(task, deadline_hit=False)  # noqa: E731
        with self._lock:
            if not task.cancel.is_set():
                task.timer = self.timers.call_later(duration - elapsed, finish, f"end {pod.key}")
        log.info("sim.workload.started", node=task.node, pod=pod.key, seconds=round(duration, 1))

    def _finish_workload(self, task: PodTask, *, deadline_hit: bool) -> None:
        if task.cancel.is_set():
            return
        if deadline_hit:
            self._write_terminated(
                task,
                exit_code=137,
                pod_reason="DeadlineExceeded",
                pod_message=DEADLINE_MESSAGE,
            )
        else:
            self._write_terminated(task, exit_code=0)
        task.state = "finished"
        self.state.workload_finished(task.node, task.pod.key)
        with self._lock:
            self._tasks.pop(task.uid, None)
        log.info("sim.workload.finished", node=task.node, pod=task.pod.key, deadline=deadline_hit)

    # Probes (worker threads) --------------------------------------------------------
    def _worker(self) -> None:
        while not self._stop.is_set():
            task = self._queue.get()
            if task is None or self._stop.is_set():
                return
            if task.cancel.is_set():
                continue
            try:
                self._run_probe(task)
            except Exception as exc:
                log.exception("sim.probe.crashed", pod=task.pod.key, error=repr(exc)[:300])
                self.state.pod_dropped(task.node, task.pod.key)

    def _kill(self, proc: subprocess.Popen[bytes], grace: float) -> None:
        """SIGTERM the probe's process group, SIGKILL after ``grace`` seconds."""
        if proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM if grace > 0 else signal.SIGKILL)
        if grace > 0:
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)

    def _run_probe(self, task: PodTask) -> None:
        pod = task.pod
        node = self.state.config(task.node)
        container = pod.probe_container()
        assert container is not None
        host_ip = node.internal_ip
        env = container_env(pod, container, host_ip)
        gpus = _requested(container, node.instance_type.accelerator_resource)
        claimed = pod.claim_names()
        if node.dra and claimed:
            # A DRA node's claims: the GPUs the scheduler allocated them, as NVIDIA's
            # kubelet plugin hands them to the container (by UUID).
            minors = claimed_minors(self.kube, pod.metadata.namespace, claimed, task.node)
            uuids = [gpu_uuids(task.node, 1, i)[0] for i in minors]
            env.setdefault("NVIDIA_VISIBLE_DEVICES", ",".join(uuids))
        elif node.instance_type.accelerator_resource == "nvidia.com/gpu" and gpus:
            # As the NVIDIA toolkit gives a container its GPUs: by UUID. The probe's
            # simulated device i is the node's GPU i.
            env.setdefault("NVIDIA_VISIBLE_DEVICES", ",".join(gpu_uuids(task.node, gpus)))
        command = [expand(c, env) for c in container.command]
        args = [expand(a, env) for a in container.args]
        poddir = (
            self.workdir / f"{pod.metadata.namespace}_{pod.metadata.name}_{pod.metadata.uid[:8]}"
        )
        poddir.mkdir(parents=True, exist_ok=True)
        env = self._mount_secrets(pod, container, poddir, env)
        result_file = poddir / "termination-log"
        result_file.write_bytes(b"")
        faults_env = self.state.draw_faults(task.node)

        now = self.clock()
        task.started = now
        try:
            inv = probe_invocation(
                command,
                args,
                env,
                python=self.python,
                result_file=str(result_file),
                cpu_devices=node.cpu_devices,
                faults_env=faults_env,
                base_env=self.base_env,
            )
        except UnsupportedProbeCommand as exc:
            self._write_terminated(task, exit_code=128, reason="StartError", message=str(exc))
            task.state = "finished"
            self.state.probe_finished(
                task.node,
                ProbeRecord(pod.key, 128, "error", 0.0, now.isoformat(), False, None),
            )
            log.warning("sim.probe.unsupported", node=task.node, pod=pod.key, error=str(exc))
            return

        with self._lock:
            if task.cancel.is_set():
                return  # deleted while queued; the finalizer runs on the timer thread
            task.state = "running"
        if not self._write(task, running_status(pod, host_ip=host_ip, started=now)):
            # The pod vanished before it started.
            task.state = "finished"
            self.state.pod_dropped(task.node, pod.key)
            return
        self.state.pod_started(task.node, pod.key, "probe")
        (poddir / "command").write_text(
            json.dumps({"argv": inv.argv, "faults_injected": inv.faults_injected}, indent=1)
        )
        t0 = time.monotonic()
        with open(poddir / "stdout", "wb") as out, open(poddir / "stderr", "wb") as err:
            proc = subprocess.Popen(
                list(inv.argv),
                env=dict(inv.env),
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                cwd=poddir,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        with self._lock:
            self._processes[task.uid] = proc
        log.info(
            "sim.probe.started",
            node=task.node,
            pod=pod.key,
            pid=proc.pid,
            faults_injected=inv.faults_injected,
            argv=" ".join(inv.argv[1:]),
        )
        stopped = self._supervise(task, proc, t0)
        with self._lock:
            self._processes.pop(task.uid, None)
        if stopped == "stopped":
            return  # killed by stop(): a dead kubelet reports nothing
        stopped_by = None if stopped == "exited" else stopped
        seconds = time.monotonic() - t0
        code = _exit_code(proc.returncode if proc.returncode is not None else -9)
        finished = self.clock()

        if stopped_by == "deleted":
            outcome = "deleted"
            message = ""
            self.timers.call_soon(lambda: self._finalize_deleted(task), f"finalize {pod.key}")
        elif stopped_by == "deadline":
            outcome = "deadline"
            message = ""
            self._write_terminated(
                task, exit_code=code, pod_reason="DeadlineExceeded", pod_message=DEADLINE_MESSAGE
            )
        else:
            outcome = outcome_of(code)
            message = termination_message(
                result_file.read_bytes(),
                _tail(poddir / "stderr") + _tail(poddir / "stdout"),
                code,
                container.termination_message_policy,
            )
            self._write_terminated(task, exit_code=code, message=message)
        if stopped_by != "deleted":
            task.state = "finished"
            with self._lock:
                self._tasks.pop(task.uid, None)
        record = ProbeRecord(
            pod=pod.key,
            exit_code=code,
            outcome=outcome,
            seconds=round(seconds, 2),
            finished_at=finished.strftime("%Y-%m-%dT%H:%M:%SZ"),
            faults_injected=inv.faults_injected,
            verdict=_verdict(message),
        )
        self.state.probe_finished(task.node, record)
        log.info(
            "sim.probe.finished",
            node=task.node,
            pod=pod.key,
            exit_code=code,
            outcome=outcome,
            seconds=record.seconds,
            faults_injected=inv.faults_injected,
        )

    # Command Pods (one thread each: a Job's ranks must all run at once) ------------------
    def _command_thread(self, task: PodTask) -> None:
        try:
            self._run_command(task)
        except Exception as exc:
            log.exception("sim.command.crashed", pod=task.pod.key, error=repr(exc)[:300])
            self.state.pod_dropped(task.node, task.pod.key)
        finally:
            with self._lock:
                self._gpus_held.get(task.node, {}).pop(task.pod.key, None)

    def _claim_gpus(self, task: PodTask) -> list[str]:
        """The node's GPUs for this Pod, as the device plugin would allocate them."""
        node = self.state.config(task.node)
        resource = node.instance_type.accelerator_resource
        if resource is None:
            return []
        want = sum(_requested(c, resource) for c in task.pod.spec.containers)
        with self._lock:
            held = self._gpus_held.setdefault(task.node, {})
            taken = {i for used in held.values() for i in used}
            free = [i for i in range(node.instance_type.accelerator_count) if i not in taken]
            mine = free[:want]
            held[task.pod.key] = mine
        return [gpu_uuids(task.node, 1, i)[0] for i in mine]

    def _mount_secrets(
        self, pod: PodView, container: Container, poddir: Path, env: dict[str, str]
    ) -> dict[str, str]:
        """Mount the container's Secret volumes as a kubelet does, one file per key, in
        the Pod's directory; an env value naming a mount path (or a file in it) is
        pointed there, since the probe runs as a process, not in a mount namespace. A
        Secret that cannot be read is left unmounted and logged: what reads it then
        finds nothing (an attested probe's result is Unattested, never a pass)."""
        moved: dict[str, str] = {}
        for index, (secret, mount_path) in enumerate(secret_mounts(pod, container)):
            try:
                body = self.kube.request(
                    "GET", f"/api/v1/namespaces/{pod.metadata.namespace}/secrets/{secret}"
                )
            except ApiException as exc:
                log.warning("sim.secret.unmounted", pod=pod.key, secret=secret, status=exc.status)
                continue
            target = poddir / "volumes" / f"{index}-{secret}"
            target.mkdir(parents=True, exist_ok=True)
            for key, value in (body.get("data") or {}).items():
                path = target / key
                path.write_bytes(base64.b64decode(value))
                path.chmod(0o440)
            moved[mount_path.rstrip("/")] = str(target)
        if not moved:
            return env
        out = dict(env)
        for name, value in env.items():
            for mount_path, local in moved.items():
                if value == mount_path or value.startswith(mount_path + "/"):
                    out[name] = local + value[len(mount_path) :]
        return out

    def _identity(self, pod: PodView, poddir: Path) -> dict[str, str]:
        """The environment a kubelet gives a container besides its own: the API
        server's address and the Pod's ServiceAccount token, bound to the Pod."""
        config = self.kube.api_client.configuration
        env = service_env(str(config.host))
        if pod.spec.automount_service_account_token is False:
            return env
        account = pod.spec.service_account_name or "default"
        made = self.kube.request(
            "POST",
            f"/api/v1/namespaces/{pod.metadata.namespace}/serviceaccounts/{account}/token",
            body={
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {
                    "audiences": [],
                    "expirationSeconds": 3600,
                    "boundObjectRef": {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": pod.metadata.name,
                        "uid": pod.metadata.uid,
                    },
                },
            },
        )
        secrets = poddir / "serviceaccount"
        secrets.mkdir(parents=True, exist_ok=True)
        (secrets / "token").write_text(str(made["status"]["token"]))
        (secrets / "namespace").write_text(pod.metadata.namespace)
        env["SDCGUARD_TOKEN_FILE"] = str(secrets / "token")
        if config.ssl_ca_cert:
            (secrets / "ca.crt").write_bytes(Path(config.ssl_ca_cert).read_bytes())
            env["SDCGUARD_CA_FILE"] = str(secrets / "ca.crt")
        return env

    def _run_command(self, task: PodTask) -> None:
        pod = task.pod
        container = pod.spec.containers[0]
        host_ip = self._host_ip(task)
        pod_env = container_env(pod, container, host_ip)
        poddir = (
            self.workdir / f"{pod.metadata.namespace}_{pod.metadata.name}_{pod.metadata.uid[:8]}"
        )
        poddir.mkdir(parents=True, exist_ok=True)
        now = self.clock()
        task.started = now
        try:
            argv = local_argv(
                [expand(a, pod_env) for a in [*container.command, *container.args]], self.python
            )
            identity = self._identity(pod, poddir)
        except (ValueError, OSError, ApiException) as exc:
            # Like a kubelet that cannot create the container (or mount its token).
            self._write_terminated(task, exit_code=128, reason="StartError", message=str(exc))
            task.state = "finished"
            self.state.pod_dropped(task.node, pod.key)
            log.warning("sim.command.unstartable", node=task.node, pod=pod.key, error=str(exc))
            return
        gpus = self._claim_gpus(task)
        if gpus:
            identity["NVIDIA_VISIBLE_DEVICES"] = ",".join(gpus)
        env = command_env(self.base_env, pod_env, identity)
        with self._lock:
            if task.cancel.is_set():
                return
            task.state = "running"
        if not self._write(task, running_status(pod, host_ip=host_ip, started=now)):
            task.state = "finished"
            self.state.pod_dropped(task.node, pod.key)
            return
        self.state.pod_started(task.node, pod.key, "command")
        with open(poddir / "stdout", "wb") as out, open(poddir / "stderr", "wb") as err:
            proc = subprocess.Popen(
                argv,
                env=env,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                cwd=poddir,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        with self._lock:
            self._processes[task.uid] = proc
        log.info("sim.command.started", node=task.node, pod=pod.key, pid=proc.pid, gpus=len(gpus))
        stopped_by = self._supervise(task, proc, time.monotonic())
        with self._lock:
            self._processes.pop(task.uid, None)
        if stopped_by == "stopped":
            return
        code = _exit_code(proc.returncode if proc.returncode is not None else -9)
        if stopped_by == "deleted":
            self.timers.call_soon(lambda: self._finalize_deleted(task), f"finalize {pod.key}")
            return
        if stopped_by == "deadline":
            self._write_terminated(
                task, exit_code=code, pod_reason="DeadlineExceeded", pod_message=DEADLINE_MESSAGE
            )
        else:
            message = termination_message(
                b"",
                _tail(poddir / "stderr") + _tail(poddir / "stdout"),
                code,
                container.termination_message_policy,
            )
            self._write_terminated(task, exit_code=code, message=message)
        task.state = "finished"
        with self._lock:
            self._tasks.pop(task.uid, None)
        self.state.workload_finished(task.node, pod.key)
        log.info("sim.command.finished", node=task.node, pod=pod.key, exit_code=code)

    def _supervise(
        self, task: PodTask, proc: subprocess.Popen[bytes], t0: float
    ) -> Literal["exited", "deleted", "deadline", "stopped"]:
        """Wait for a Pod's process, killing it on deletion or at its deadline."""
        pod = task.pod
        deadline = (
            t0 + pod.spec.active_deadline_seconds
            if pod.spec.active_deadline_seconds is not None
            else None
        )
        grace = min(float(pod.spec.termination_grace_period_seconds or 30), MAX_KILL_GRACE_SECONDS)
        while True:
            try:
                proc.wait(timeout=0.25)
                return "stopped" if self._stop.is_set() else "exited"
            except subprocess.TimeoutExpired:
                pass
            if task.cancel.is_set():
                self._kill(proc, grace)
                return "deleted"
            if self._stop.is_set():
                return "stopped"  # simulator shutting down: stop() kills the process
            if deadline is not None and time.monotonic() > deadline:
                self._kill(proc, grace)
                return "deadline"

    # Introspection --------------------------------------------------------------------
    def processes(self) -> dict[str, int]:
        """``namespace/name`` -> pid of each probe process running now."""
        with self._lock:
            return {
                t.pod.key: self._processes[uid].pid
                for uid, t in self._tasks.items()
                if uid in self._processes
            }

    def tracked(self) -> dict[str, str]:
        """``namespace/name`` -> task state, for tests and debugging."""
        with self._lock:
            return {t.pod.key: t.state for t in self._tasks.values()}


def _tail(path: Path, limit: int = 4096) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read()
    except OSError:
        return b""
