"""``make demo`` / ``python -m sdcdev.sim.demo``: a fleet through the whole lifecycle.

One command, on a machine with nothing running:

1. starts a local control plane (etcd, kube-apiserver, controller-manager, scheduler;
   :mod:`sdcdev.cluster.localcluster`, binaries built once per machine and cached) and
   its real node (containerd, a CNI bridge, the kubelet, a test device plugin with
   ``nvidia.com/gpu: 2``; the images built once per content by ``images/build.sh``);
2. installs sdcguard with ``helm install`` of ``charts/sdcguard``: the CRDs, RBAC and
   the operator Deployment, whose Pod runs on the real node, in-cluster with the
   chart's ServiceAccount (:mod:`sdcdev.cluster.operator_pod` holds the local-cluster
   values); it says where the operator runs (Pod, node, container runtime);
3. creates a fast demo SDCPolicy (10 s probe budget, consensus of 3 for the baseline,
   re-screening after 30 s idle) and starts the fleet simulator with ``fleets/demo.yaml``:
   nine GPU and Trainium nodes, one with steady attention-output corruption (like the
   study's 4.78e-3 node) and one that is sick only now and then; the simulated repair shop
   resolves tickets after 20 s;
4. screens the real node under a policy of its own, in real probe containers: acceptance,
   then a fault the demo injects, confirmation, quarantine, repair and verification
   (:mod:`sdcdev.sim.demo_realnode`), each verdict printed beside the termination
   message the kubelet wrote;
5. shows every node's state, current test, last verdict and what it waits for, refreshed
   in place on a terminal (plain lines otherwise), while the nodes join, are screened,
   the sick ones are confirmed and quarantined with a RepairTicket, repaired, verified and
   returned to the pool;
6. ends when the faulty nodes are back Qualified after their repair and every node is
   Qualified (or after ``--timeout`` seconds, saying what it still waited for), prints a
   summary and what ``kubectl sdc fleet`` shows of the demo fleet (failures per hardware
   type, onset to quarantine, re-certification, exposure; also in ``demo-out/fleet.txt``)
   and writes ``demo-out/summary.json``, ``demo-out/timeline.png`` (one row per
   node coloured by state over time, a marker per test verdict) and the operator's and
   simulator's logs.

``--simulated-only`` (for a host that cannot run the real node: no root, no cgroups)
leaves the real node out: the chart is rendered with ``helm template``, its CRDs, RBAC
and PriorityClass applied, and the operator runs as a local process with a token of the
chart's ServiceAccount (:mod:`sdcdev.sim.demo_install`).

Everything it started stops when it ends, on Ctrl-C or SIGTERM; the control plane and the
operator also die with it if it is killed outright (PR_SET_PDEATHSIG).

Exit codes: 0 done, 1 the lifecycle did not complete in time, 2 set-up failed, 130
interrupted.

:func:`run_demo` is the core, for tests: it runs the same steps against any control
plane (the e2e tests pass the session's cluster) and returns a :class:`DemoResult`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from sdcdev.cluster import localcluster, operator_pod, realnode
from sdcdev.sim.demo_install import (
    ControlPlane,
    DemoError,
    Installation,
    LocalOperator,
    PolicySettings,
    install,
    kubectl_sdc,
    policy_body,
    start_operator,
    uninstall,
)
from sdcdev.sim.demo_realnode import (
    ChartOperator,
    KubeletVerdict,
    RealNodeScript,
    real_node_policy_body,
    reset_node,
)
from sdcdev.sim.demo_report import (
    Display,
    NullDisplay,
    PlainDisplay,
    TerminalDisplay,
    build_summary,
    plot_timeline,
    summary_lines,
)
from sdcdev.sim.demo_watch import (
    PoolBudget,
    Recorder,
    RecorderView,
    Reservation,
    pending_goals,
    summarize_events,
)
from sdcdev.sim.fleet import DEMO_FLEET, Fleet, FleetError, load_fleet
from sdcdev.sim.kube import JsonDict, Kube
from sdcdev.sim.ports import free_port
from sdcdev.sim.simulator import SimOptions, Simulator
from sdcdev.sim.workloads import WORKLOAD_LABEL
from sdcguard.api.common import GROUP, VERSION

KOPF_FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"


@dataclass(frozen=True)
class DemoConfig:
    """One demo run. The defaults are ``make demo``'s."""

    fleet: Path = DEMO_FLEET
    policy: str = "demo"
    release: str = "sdcguard"
    namespace: str = "sdcguard-system"
    settings: PolicySettings = field(default_factory=PolicySettings)
    repair_delay_seconds: float = 20.0
    timeout_seconds: float = 300.0
    """Limit on the lifecycle (after set-up)."""
    stall_seconds: float | None = None
    """Give up sooner when nothing moved for this long: no node changed state and no test,
    ticket, probe run or re-screening was added. A slow machine keeps the run going up to
    ``timeout_seconds``; a stuck one ends here. None: only ``timeout_seconds``."""
    max_parallel_probes: int | None = None
    """Probes the simulator runs at once; default: the fleet file's, else the CPU count."""
    workloads: bool | None = None
    """Customer pods; default: the fleet file's ``workloads.enabled``."""
    resync_seconds: float = 5.0
    allow_rescreening: bool = False
    """Count a node being re-screened after customer use as done (large fleets rarely
    have every node Qualified at one instant)."""
    min_rescreenings: int = 0
    """Also wait until this many serving nodes were re-screened after customer use."""
    end_workloads_when_settled: bool = False
    """Once the rest is done, stop the customer workloads and end the running ones (an
    evening lull): every node used since its qualification returns from use at once, a
    burst of re-screenings the budgets must pace."""
    out_dir: Path | None = Path("demo-out")
    cleanup: bool = False
    """Delete everything the run created (policy, tests, tickets, new baselines, nodes,
    RBAC, namespace): for a shared control plane. The demo's own throwaway one needs none."""
    poll_seconds: float = 1.0
    real_node: bool = False
    """The operator as the chart's Pod (``helm install``) on the control plane's real node,
    and that node as a row of its own under policy ``<policy>-real``, through acceptance,
    an injected fault, quarantine, repair and verification in real probe containers
    (:mod:`sdcdev.sim.demo_realnode`). Off: the operator runs as a local process."""

    @property
    def real_policy(self) -> str:
        return f"{self.policy}-real"


@dataclass
class DemoResult:
    """How a run ended, and everything it saw."""

    ok: bool
    outcome: str
    summary: dict[str, Any]
    view: RecorderView
    budgets: dict[str, PoolBudget]
    reservations: list[Reservation]
    events: list[dict[str, Any]]
    operator_log: Path
    operator_where: str = ""
    """Where the operator ran: the chart's Pod, its node and runtime; or a local process."""
    kubelet_verdicts: dict[str, KubeletVerdict] = field(default_factory=dict)
    """The real node's tests: each probe result from its Pod's termination message."""
    summary_path: Path | None = None
    timeline_path: Path | None = None
    fleet_figures: str = ""
    """What ``kubectl sdc fleet`` printed on the demo fleet at the end."""
    fleet_path: Path | None = None


def _list(api: client.ApiClient, plural: str) -> list[JsonDict]:
    return list(Kube(api).request("GET", f"/apis/{GROUP}/{VERSION}/{plural}").get("items") or [])


def _get(api: client.ApiClient, plural: str, name: str) -> JsonDict:
    return Kube(api).request("GET", f"/apis/{GROUP}/{VERSION}/{plural}/{name}")


def _foreign_policies(api: client.ApiClient, fleet: Fleet, mine: str) -> list[str]:
    """Other SDCPolicies that would also select the fleet's nodes (screening them twice)."""
    clashes = []
    for item in _list(api, "sdcpolicies"):
        name = item["metadata"]["name"]
        if name == mine:
            continue
        match = ((item.get("spec") or {}).get("nodeSelector") or {}).get("matchLabels") or {}
        if any(all(n.labels.get(k) == v for k, v in match.items()) for n in fleet.nodes):
            clashes.append(name)
    return clashes


def delete_custom(api: client.ApiClient, plural: str, name: str) -> None:
    """Delete one of our objects, dropping Kopf's finalizer when no operator is left to."""
    custom = client.CustomObjectsApi(api)
    with contextlib.suppress(ApiException):
        custom.delete_cluster_custom_object(GROUP, VERSION, plural, name)
    with contextlib.suppress(ApiException):
        obj = _get(api, plural, name)
        finalizers = obj["metadata"].get("finalizers") or []
        if KOPF_FINALIZER in finalizers:
            kept = [f for f in finalizers if f != KOPF_FINALIZER]
            custom.patch_cluster_custom_object(
                GROUP, VERSION, plural, name, {"metadata": {"finalizers": kept or None}}
            )


def _baseline_names(api: client.ApiClient) -> set[str]:
    return {i["metadata"]["name"] for i in _list(api, "sdcbaselines")}


def delete_policy(
    api: client.ApiClient, name: str, operator: LocalOperator | ChartOperator | None
) -> None:
    """Delete the policy while the operator runs (its finalizer goes with the operator's
    blessing); without a live operator, drop the finalizer."""
    custom = client.CustomObjectsApi(api)
    with contextlib.suppress(ApiException):
        custom.delete_cluster_custom_object(GROUP, VERSION, "sdcpolicies", name)
    deadline = time.monotonic() + (30 if operator is not None and operator.alive else 0)
    while time.monotonic() < deadline:
        try:
            _get(api, "sdcpolicies", name)
        except ApiException:
            return
        time.sleep(0.5)
    delete_custom(api, "sdcpolicies", name)


def _instance_type(api: client.ApiClient, node: str) -> str:
    meta = client.CoreV1Api(api).read_node(node).metadata
    labels = (meta.labels if meta else None) or {}
    return str(labels.get("node.kubernetes.io/instance-type") or "real")


def _delete_namespace(api: client.ApiClient, name: str) -> None:
    with contextlib.suppress(ApiException):
        client.CoreV1Api(api).delete_namespace(name)


def _remove_run_objects(
    api: client.ApiClient,
    cfg: DemoConfig,
    fleet: Fleet,
    baselines_before: set[str],
    real_nodes: Sequence[str] = (),
) -> None:
    """Tests, tickets, probe Jobs and Pods, and the baselines this run created."""
    names = {n.name for n in fleet.nodes} | set(real_nodes)
    for plural in ("sdctests", "repairtickets"):
        with contextlib.suppress(ApiException):
            for item in _list(api, plural):
                spec = item.get("spec") or {}
                if spec.get("policyRef") in (cfg.policy, cfg.real_policy) or (
                    spec.get("nodeName") in names
                ):
                    delete_custom(api, plural, item["metadata"]["name"])
    with contextlib.suppress(ApiException):
        for name in _baseline_names(api) - baselines_before:
            delete_custom(api, "sdcbaselines", name)
    batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
    with contextlib.suppress(ApiException):
        batch.delete_collection_namespaced_job(cfg.namespace, propagation_policy="Background")
    with contextlib.suppress(ApiException):
        # No kubelet will confirm a graceful deletion of a probe Pod: delete at once.
        core.delete_collection_namespaced_pod(cfg.namespace, grace_period_seconds=0)


class ChartInstaller(Protocol):
    """:mod:`sdcdev.cluster.operator_pod`: helm install of the chart on the real node."""

    def install_operator(
        self, cluster: Any, release: str, namespace: str, values: dict[str, Any] | None = ...
    ) -> Any: ...

    def uninstall_operator(self, cluster: Any, op_release: str, namespace: str) -> None: ...


def _install_chart_operator(
    cp: Any, api: client.ApiClient, cfg: DemoConfig, chart: ChartInstaller
) -> ChartOperator:
    """helm install: the chart's CRDs, RBAC and operator Deployment, whose Pod runs on the
    real node; no policy from the chart (the demo brings its own)."""
    values = {
        "policy": {"create": False},
        "operator": {"logFormat": "json", "resyncSeconds": int(cfg.resync_seconds)},
    }
    try:
        op = chart.install_operator(cp, cfg.release, cfg.namespace, values)
    except Exception as exc:  # the local cluster's ClusterError, or helm's failure
        raise DemoError(f"helm install of the operator on the real node failed: {exc}") from None
    node = cp.node

    def logs() -> str:
        return str(node.pod_logs(cfg.namespace, op.pod, tail=1_000_000)) if node else ""

    return ChartOperator(
        api=api,
        release=cfg.release,
        namespace=cfg.namespace,
        pod=op.pod,
        node=op.node,
        runtime=op.runtime,
        ready_seconds=op.ready_seconds,
        uninstall=lambda: chart.uninstall_operator(cp, cfg.release, cfg.namespace),
        logs=logs,
    )


def run_demo(
    cp: ControlPlane,
    cfg: DemoConfig,
    *,
    display: Display | None = None,
    control_plane_seconds: float = 0.0,
    stop: threading.Event | None = None,
    chart: ChartInstaller | None = None,
) -> DemoResult:
    """Install, run the operator and the fleet, watch the lifecycle to its end, report.

    ``cp`` is a started control plane (``LocalCluster``). With ``cfg.real_node`` it must
    have its real node, and ``chart`` installs the operator there. Raises
    :class:`DemoError` when set-up fails; a lifecycle that does not complete returns a
    result with ``ok`` False.
    """
    real_node = getattr(cp, "node", None) if cfg.real_node else None
    if cfg.real_node and (real_node is None or chart is None):
        raise DemoError(
            "the demo's real node is not running (LocalCluster(real_node=True)); "
            "run without it: python -m sdcdev.sim.demo --simulated-only"
        )
    display = display or NullDisplay()
    t_start = time.monotonic()
    api = config.new_client_from_config(str(cp.kubeconfig))  # type: ignore[no-untyped-call]
    try:
        fleet = load_fleet(cfg.fleet)
    except FleetError as exc:
        raise DemoError(str(exc)) from None
    workdir = Path(tempfile.mkdtemp(prefix="sdcguard-demo-"))
    out_dir = cfg.out_dir or workdir
    out_dir.mkdir(parents=True, exist_ok=True)
    operator_log = out_dir / "operator.log"
    operator_log.write_bytes(b"")
    baselines_before: set[str] = set()
    inst: Installation | None = None
    operator: LocalOperator | ChartOperator | None = None
    sim: Simulator | None = None
    recorder: Recorder | None = None
    script: RealNodeScript | None = None
    real_names: dict[str, str] = {}
    policies = [cfg.policy]
    try:
        if real_node is not None and chart is not None:
            display.note(
                f"helm install {cfg.release} charts/sdcguard: CRDs, RBAC and the operator "
                f"Deployment; waiting for its Pod to be Ready on {real_node.name} "
                "(image imported into containerd, probes through the kubelet)"
            )
            t_helm = time.monotonic()
            operator = _install_chart_operator(cp, api, cfg, chart)
            display.note(
                f"operator running as {operator.where()}, Ready "
                f"{time.monotonic() - t_helm:.0f}s after helm install"
            )
            real_names = {real_node.name: _instance_type(api, real_node.name)}
        else:
            display.note("installing the chart's CRDs, ServiceAccount and RBAC (helm template)")
            inst = install(cp, api, release=cfg.release, namespace=cfg.namespace)
        clashes = _foreign_policies(api, fleet, cfg.policy)
        if clashes:
            raise DemoError(
                f"SDCPolicy {', '.join(clashes)} also selects the fleet's nodes; delete it "
                "first (`kubectl delete sdcpolicy NAME` while an operator runs)"
            )
        baselines_before = _baseline_names(api)
        if inst is not None:
            metrics_port = free_port()
            display.note(
                f"starting the operator as ServiceAccount {inst.namespace}/"
                f"{inst.service_account} (metrics on http://127.0.0.1:{metrics_port}/metrics)"
            )
            operator = start_operator(
                cp,
                api,
                inst,
                workdir=workdir,
                log_path=operator_log,
                resync_seconds=cfg.resync_seconds,
                metrics_port=metrics_port,
            )
        custom = client.CustomObjectsApi(api)
        custom.create_cluster_custom_object(
            GROUP, VERSION, "sdcpolicies", policy_body(cfg.policy, fleet.name, cfg.settings)
        )
        if real_node is not None:
            policies.append(cfg.real_policy)
            custom.create_cluster_custom_object(
                GROUP,
                VERSION,
                "sdcpolicies",
                # Fault injection makes every GEMM round dearer: on a loaded machine a 10 s
                # budget with the fault on may not hold the smallest plan; 20 s leaves
                # room. The real node's row is not the demo's longest.
                real_node_policy_body(
                    cfg.real_policy, max(20, cfg.settings.budget_seconds), cfg.settings.checks
                ),
            )
            script = RealNodeScript(
                api=api,
                kubeconfig=cp.kubeconfig,
                node=real_node.name,
                policy=cfg.real_policy,
                namespace=cfg.namespace,
                note=lambda text: display.note(
                    f"[{recorder.now() if recorder else 0:.0f}s] {text}"
                ),
            )
        sim = Simulator(
            fleet,
            api,
            SimOptions(
                max_parallel_probes=cfg.max_parallel_probes,
                workloads=cfg.workloads,
                repair_delay_seconds=cfg.repair_delay_seconds,
                workdir=workdir / "sim",
            ),
        )
        setup_seconds = control_plane_seconds + time.monotonic() - t_start
        recorder = Recorder(
            api,
            fleet,
            cfg.policy,
            max_concurrent_tests=cfg.settings.max_concurrent_tests,
            max_unavailable=cfg.settings.max_unavailable,
            snapshot=sim.snapshot,
            real_nodes=real_names,
            real_policy=cfg.real_policy if real_names else None,
        )
        recorder.start()
        display.note(f"registering {len(fleet.nodes)} simulated nodes (fleet {fleet.name})")
        sim.start()
        lull = (lambda: end_customer_work(sim)) if cfg.end_workloads_when_settled else None
        assert operator is not None
        ok, outcome = _watch(recorder, cfg, display, operator, stop, lull, script)
        lifecycle_seconds = recorder.now()
        view = recorder.view()
        events = _settled_events(api, view.nodes)
        figures = kubectl_sdc(cp.kubeconfig, "fleet")
        summary = build_summary(
            view,
            outcome=outcome,
            ok=ok,
            fleet=fleet.name,
            policy=cfg.policy,
            timings={
                "controlPlaneSeconds": control_plane_seconds,
                "setupSeconds": setup_seconds,
                "lifecycleSeconds": lifecycle_seconds,
            },
            settings={
                **asdict(cfg.settings),
                "repairDelaySeconds": cfg.repair_delay_seconds,
                "maxParallelProbes": sim.state.max_parallel_probes,
                "timeoutSeconds": cfg.timeout_seconds,
            },
            events=events,
            budgets=recorder.budgets,
            reservations=recorder.reservations,
        )
        result = DemoResult(
            ok=ok,
            outcome=outcome,
            summary=summary,
            view=view,
            budgets=recorder.budgets,
            reservations=list(recorder.reservations),
            events=events,
            operator_log=operator_log,
            operator_where=operator.where()
            if isinstance(operator, ChartOperator)
            else "a local process (python -m sdcguard) with the chart's ServiceAccount token",
            kubelet_verdicts=dict(script.verdicts) if script is not None else {},
            fleet_figures=figures,
        )
        if cfg.out_dir is not None:
            result.fleet_path = out_dir / "fleet.txt"
            result.fleet_path.write_text(figures)
            result.summary_path = out_dir / "summary.json"
            result.summary_path.write_text(json.dumps(summary, indent=1, default=str) + "\n")
            result.timeline_path = plot_timeline(summary, out_dir / "timeline.png")
        return result
    finally:
        # Every step runs even if an earlier one fails: nothing may be left running.
        steps: list[Callable[[], object]] = [display.close]
        if recorder is not None:
            steps.append(recorder.stop)
        if isinstance(operator, ChartOperator):
            steps.append(lambda: operator.save_log(operator_log) if operator else None)
        if cfg.cleanup:
            for name in policies:
                steps.append(functools.partial(delete_policy, api, name, operator))
        if operator is not None and (cfg.cleanup or not isinstance(operator, ChartOperator)):
            # The chart's Pod goes with the throwaway cluster's node otherwise.
            steps.append(operator.stop)
        if sim is not None:
            steps.append(lambda: sim.stop(cleanup=cfg.cleanup) if sim else None)
        if cfg.cleanup:
            real = list(real_names)
            steps.append(lambda: _remove_run_objects(api, cfg, fleet, baselines_before, real))
            if inst is not None:
                steps.append(lambda: uninstall(api, inst) if inst else None)
            for name in real:
                steps.append(functools.partial(reset_node, api, name))
            if isinstance(operator, ChartOperator):
                steps.append(lambda: _delete_namespace(api, cfg.namespace))
        steps.append(api.close)
        for step in steps:
            try:
                step()
            except Exception as exc:
                print(f"sdcguard demo: a clean-up step failed: {exc!r}"[:400], file=sys.stderr)
        shutil.rmtree(workdir, ignore_errors=True)


def end_customer_work(sim: Simulator) -> str:
    """No new customer pods, and the fleet's running ones end (their Pods are deleted)."""
    if sim.workloads is not None:
        sim.workloads.stop()
    namespace = sim.fleet.workloads.namespace
    pods = sim.kube.list_pods(namespace, label_selector=f"{WORKLOAD_LABEL}={sim.fleet.name}")
    for pod in pods:
        with contextlib.suppress(ApiException):
            sim.kube.delete_pod(namespace, pod["metadata"]["name"])
    return f"customer workloads stopped; {len(pods)} customer pods ended"


def progress_marks(view: RecorderView) -> tuple[int, ...]:
    """What grows while a run moves: transitions, tests, tickets, probe runs (finished and
    started) and re-screenings. A run whose marks stay put is stuck, however slow the
    machine."""
    return (
        len(view.transitions),
        len(view.tests),
        sum(1 for t in view.tests.values() if t.started is not None),
        sum(1 for t in view.tests.values() if t.finished),
        len(view.tickets),
        sum(t.cycle + (t.phase in ("Closed", "Retired")) for t in view.tickets.values()),
        len(view.probes),
        view.probes_running,
        view.rescreenings,
    )


def _watch(
    recorder: Recorder,
    cfg: DemoConfig,
    display: Display,
    operator: LocalOperator | ChartOperator,
    stop: threading.Event | None,
    lull: Callable[[], str] | None = None,
    script: RealNodeScript | None = None,
) -> tuple[bool, str]:
    """Poll and show until the lifecycle is complete, the time is up, nothing has moved
    for ``cfg.stall_seconds``, or someone stops us."""
    deadline = time.monotonic() + cfg.timeout_seconds
    moved_at = time.monotonic()
    last_moves: tuple[int, ...] = ()
    try:
        while True:
            recorder.poll()
            view = recorder.view()
            if (moves := progress_marks(view)) != last_moves:
                moved_at, last_moves = time.monotonic(), moves
            if script is not None:
                script.step(view)
            pending = pending_goals(
                view,
                allow_rescreening=cfg.allow_rescreening,
                min_rescreenings=cfg.min_rescreenings,
            )
            if lull is not None and not pending_goals(
                view, allow_rescreening=cfg.allow_rescreening
            ):
                display.note(f"[{view.t:.0f}s] {lull()}")
                lull = None
            display.update(view, pending)
            if not pending:
                repaired = [
                    t.name for t in view.nodes.values() if t.first("Quarantined") is not None
                ]
                return True, (
                    f"{', '.join(repaired) or 'no node'} quarantined, repaired and returned; "
                    f"all {len(view.nodes)} nodes Qualified"
                )
            if not operator.alive:
                return False, "the operator exited; see operator.log"
            if stop is not None and stop.is_set():
                return False, "stopped"
            if time.monotonic() > deadline:
                return False, (
                    f"timed out after {cfg.timeout_seconds:.0f}s waiting for "
                    + "; ".join(pending[:4])
                )
            if cfg.stall_seconds is not None and time.monotonic() - moved_at > cfg.stall_seconds:
                return False, (
                    f"nothing moved for {cfg.stall_seconds:g}s (no transition, test, ticket "
                    "or probe run) while waiting for " + "; ".join(pending[:4])
                )
            time.sleep(cfg.poll_seconds)
    except KeyboardInterrupt:
        return False, "interrupted"


# The command ------------------------------------------------------------------------------


class _Signals:
    """The first SIGINT/SIGTERM unwinds (clean-up runs); later ones only say so."""

    def __init__(self) -> None:
        self.count = 0

    def install(self) -> None:
        signal.signal(signal.SIGINT, self._handle)
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.count += 1
        if self.count == 1:
            raise KeyboardInterrupt(signal.Signals(signum).name)
        print("sdcguard demo: cleaning up, one moment", file=sys.stderr, flush=True)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m sdcdev.sim.demo",
        description="Run a simulated accelerator fleet through sdcguard's whole lifecycle on "
        "a local control plane: acceptance, quarantine with a RepairTicket, repair, "
        "verification and return to the pool.",
    )
    p.add_argument("--fleet", type=Path, default=DEMO_FLEET, help="fleet file (default: demo)")
    p.add_argument("--out", type=Path, default=Path("demo-out"), help="where results go")
    p.add_argument(
        "--timeout", type=float, default=300.0, help="seconds the lifecycle may take (300)"
    )
    p.add_argument(
        "--stall",
        type=float,
        default=None,
        help="end sooner when nothing moved for this many seconds (default: only --timeout)",
    )
    p.add_argument("--repair-delay", type=float, default=20.0, help="repair shop delay (20 s)")
    p.add_argument("--budget", type=int, default=10, help="probe budget in seconds (10)")
    p.add_argument("--max-parallel-probes", type=int, help="default: the CPU count")
    p.add_argument("--no-workloads", action="store_true", help="no customer pods")
    p.add_argument("--plain", action="store_true", help="plain lines, even on a terminal")
    p.add_argument(
        "--simulated-only",
        action="store_true",
        help="no real node (it needs Linux, root and cgroups): the operator runs as a local "
        "process and every node is simulated",
    )
    return p


def _log_to_file(path: Path) -> None:
    """The simulator's structlog lines go to a file; the terminal belongs to the table."""
    from sdcguard.logs import configure_logging

    configure_logging("json", "info")
    handler = logging.FileHandler(path, mode="w")
    root = logging.getLogger()
    handler.setFormatter(root.handlers[0].formatter)
    root.handlers[:] = [handler]


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(list(argv) if argv is not None else None)
    signals = _Signals()
    signals.install()
    chart = None if args.simulated_only else operator_pod
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    _log_to_file(out / "simulator.log")
    cfg = DemoConfig(
        fleet=args.fleet,
        settings=PolicySettings(budget_seconds=args.budget),
        repair_delay_seconds=args.repair_delay,
        timeout_seconds=args.timeout,
        stall_seconds=args.stall,
        max_parallel_probes=args.max_parallel_probes,
        workloads=False if args.no_workloads else None,
        out_dir=out,
        real_node=not args.simulated_only,
    )
    title = f"sdcguard demo · fleet {args.fleet.stem} · policy {cfg.policy}"
    tty = sys.stdout.isatty() and not args.plain
    display: Display = (
        TerminalDisplay(title, cfg.settings.quorum, cfg.repair_delay_seconds)
        if tty
        else PlainDisplay(title, cfg.settings.quorum, cfg.repair_delay_seconds)
    )
    print(
        "sdcguard demo: starting a local control plane"
        + ("" if args.simulated_only else " and a real node (containerd, kubelet, CNI)")
        + " (the first run on a machine builds the binaries and images; that takes a while)",
        flush=True,
    )
    t0 = time.monotonic()
    try:
        with localcluster.LocalCluster(real_node=not args.simulated_only) as cp:
            result = run_demo(
                cp,
                cfg,
                display=display,
                control_plane_seconds=time.monotonic() - t0,
                chart=chart,
            )
            print("sdcguard demo: stopping the operator, the simulator and the control plane")
    except KeyboardInterrupt:
        print("\nsdcguard demo: interrupted; everything it started has stopped", file=sys.stderr)
        return 130
    except realnode.ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if not args.simulated_only:
            print(
                "(the simulated fleet runs without the real node: "
                "make demo DEMO_ARGS=--simulated-only)",
                file=sys.stderr,
            )
        return 2
    except DemoError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for line in summary_lines(result.summary):
        print(line)
    print(f"\nkubectl sdc fleet on the demo fleet:\n{result.fleet_figures.rstrip()}\n")
    print(f"the operator ran as {result.operator_where}")
    print(
        f"\nwrote {result.timeline_path}, {result.summary_path}, {result.fleet_path}, "
        f"{result.operator_log} "
        f"and {out / 'simulator.log'}"
    )
    if result.outcome == "interrupted":
        return 130
    return 0 if result.ok else 1


def _settled_events(api: Any, nodes: Any, quiet: float = 2.0, limit: float = 15.0) -> list[Any]:
    """sdcguard's Events on the fleet's Nodes once no new one has come for ``quiet``
    seconds (at most ``limit``): a transition's Event is posted after the node's write
    that the recorder saw, so a list made at once can miss the last ones."""

    def listed(before: list[Any]) -> list[Any]:
        try:
            return summarize_events(api, nodes)
        except Exception:  # the summary goes on without (or with the last) Events
            return before

    events = listed([])
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        time.sleep(quiet)
        fresh = listed(events)
        if fresh == events:
            break
        events = fresh
    return events


if __name__ == "__main__":
    sys.exit(main())
