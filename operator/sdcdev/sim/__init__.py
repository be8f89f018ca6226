"""sdcdev.sim — a simulated accelerator fleet for a real Kubernetes control plane.

The simulator plays the kubelet of fake GPU/TPU/Trainium nodes against a real
kube-apiserver, scheduler and controller-manager. The operator cannot tell its
nodes from real ones: they register, stay Ready, run the Pods bound to them and
report their status; probe Pods run the real probe on this machine's CPU with
the node's configured fault profile.

Run it::

    python -m sdcdev.sim --kubeconfig K --fleet operator/sdcdev/sim/fleets/demo.yaml \\
        [--status-file status.json] [--max-parallel-probes N] [--cleanup]

or from Python (a demo runner, a test)::

    from sdcdev.sim import Simulator, SimOptions, load_fleet
    with Simulator(load_fleet(path), api_client, SimOptions(repair_delay_seconds=5)) as sim:
        ...
        sim.snapshot().node("h100-aws-03").last_probe   # what it is doing, how probes went

How it works
------------

**Fleet file** (:mod:`~sdcdev.sim.fleet`). YAML validated by pydantic; an
error is one line naming the entry (``nodes[3] (name 'h100-b')``) and the CLI
exits 2. Each node entry has a ``name`` (or ``namePrefix`` + ``count``), an
``instanceType`` from the built-in catalogue (:mod:`~sdcdev.sim.catalogue`:
``p5.48xlarge``, ``p4d.24xlarge``, ``a3-highgpu-8g``, ``trn1.32xlarge``,
``ct5lp-hightpu-4t``, ``ct5p-hightpu-4t``, ``m7i.8xlarge``), optional
``zone``, ``pool``, ``labels``, ``taints`` at registration (``key[=value]:Effect``
like kubelet ``--register-with-taints``), ``cpuDevices`` for the probe and a
``faultProfile``: ``faults`` (the probe's own fault specs, validated with
:class:`sdcprobe.faultspec.Fault`), ``intermittent`` (probability the faults
are present on a given probe run, drawn from a per-node seeded RNG) and
``repairsNeeded``. Top-level ``defaults``, ``workloads``, ``repair`` and
``probes`` sections set the rest. ``fleets/demo.yaml`` (8 nodes) and
``fleets/e2e-30.yaml`` (30 nodes) ship with the package.

**Registration and heartbeats** (:mod:`~sdcdev.sim.nodes`). Each Node is
created with the instance type's labels (instance type, zone, region, pool,
GPU feature discovery / GKE / Neuron labels), capacity and allocatable with
the accelerator's extended resource, addresses and ``nodeInfo``. One thread
then renews every node's Lease in ``kube-node-lease`` and the Ready
condition's heartbeat every ~10 s. If the simulator dies, the heartbeats stop
and the node-lifecycle controller marks the nodes NotReady (Ready=Unknown)
about 40-50 s later, as for a dead kubelet. A restarted simulator adopts its
existing nodes and leaves their taints (the operator's by then) alone.

**Kubelet** (:mod:`~sdcdev.sim.kubelet`). One watch follows Pods bound to
the fleet's nodes. A Pod whose container runs ``sdcprobe`` waits Pending in a
queue until one of ``max_parallel`` workers (default: CPU count) runs it: the
container's command is rewritten by the pure
:func:`~sdcdev.sim.probe_command.probe_invocation` (``sys.executable``,
``--device cpu``, the node's ``--cpu-devices`` unless set, a local
``--result-file``; on a node whose fault profile is active for this run,
``--allow-fault-injection`` and ``SDCPROBE_FAULTS``), the Pod's env (values and
downward-API field refs) is passed through, and the status is written as a
kubelet would: Running, then Succeeded/Failed with the exit code, reason
Completed/Error and the result file as the termination message.
``activeDeadlineSeconds`` kills the probe (Failed, DeadlineExceeded); a
deleted Pod's process is stopped and the Pod deleted with grace period 0. Any
other Pod "runs" for its ``sim.sdcguard.dev/run-seconds`` annotation (default
60 s) and Succeeds. Probe stdout/stderr/result files stay in the work dir.

**Adopted nodes** (:mod:`~sdcdev.sim.adopt`). An autoscaler with a fake cloud (Karpenter's
kwok provider) creates Node objects itself; a :class:`~sdcdev.sim.adopt.NodeAdopter` takes
on those matching an ``AdoptRule``'s labels (e.g. ``karpenter.sh/nodepool=gpu``) whose
instance type is in the catalogue: it writes their kubelet status, keeps them Ready and runs
their Pods like the fleet's own, with the rule's fault profile. Use it with
``adoption_fleet(name)``, a fleet of no nodes of its own.

**Customer workloads** (:mod:`~sdcdev.sim.workloads`). Pods in namespace
``customer`` arrive as a Poisson process, ask for one or all accelerators of
an instance type, go through the real scheduler (so taints and cordons count)
and run for an exponential time; finished ones are deleted after a while.

**Repair shop** (:mod:`~sdcdev.sim.repair`). Open RepairTickets get
``spec.external`` at once and, after ``repair.delaySeconds``, the node's
faults cleared and ``spec.resolution`` + ``spec.resolutionNote`` set. Missing
CRD: logged, retried.

**Observability**. structlog lines (``sim.probe.started``,
``sim.probe.finished``, ``sim.repair.resolved``, ...), :meth:`Simulator.snapshot`
and ``--status-file`` (the snapshot as JSON every 2 s).

**The demo** (:mod:`~sdcdev.sim.demo`, ``make demo``). A local control plane, the
chart's CRDs and RBAC, the operator as the chart's ServiceAccount, and this simulator
with ``fleets/demo.yaml``, watched live until the sick node is back from repair; it
writes ``demo-out/summary.json`` and ``demo-out/timeline.png``. The end-to-end tests
(``tests/e2e``) run the same core against the test session's control plane.
"""

from sdcdev.sim.fleet import (
    DEMO_FLEET,
    FaultProfile,
    Fleet,
    FleetError,
    NodeConfig,
    load_fleet,
    parse_fleet,
)
from sdcdev.sim.simulator import SimOptions, Simulator
from sdcdev.sim.state import FleetSnapshot, NodeActivity, ProbeRecord

__all__ = [
    "DEMO_FLEET",
    "FaultProfile",
    "Fleet",
    "FleetError",
    "FleetSnapshot",
    "NodeActivity",
    "NodeConfig",
    "ProbeRecord",
    "SimOptions",
    "Simulator",
    "load_fleet",
    "parse_fleet",
]
