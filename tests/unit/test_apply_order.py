"""The order in which one decision's writes go out, and drains that a PDB holds up.

A recording writer stands in for the API server here (the operator tests run the
same paths against a real one); it keeps every call in order.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sdcguard.adapters.kube import EvictionResult, KubeWriter
from sdcguard.adapters.observe import TicketSnapshot
from sdcguard.adapters.reconciler import FleetView, Reconciler
from sdcguard.api import RepairTicketStatus, SDCPolicy, TicketPhase
from sdcguard.domain import keys
from sdcguard.domain.actions import Annotate
from sdcguard.domain.believed import believed_state
from sdcguard.domain.decide import decide
from sdcguard.domain.lifecycle import Drain, EmitEvent, Event, NodeState
from sdcguard.domain.observed import NodeSnapshot, Observed
from sdcguard.metrics import Metrics
from sdcguard.settings import Settings
from tests.unit.factories import NOW, node, policy, ticket


class _Recorder(KubeWriter):
    """Every write in order; evictions answer as ``eviction`` says."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.calls: list[tuple[str, Any]] = []
        self.eviction: EvictionResult | Exception = EvictionResult(asked=1)

    def patch_node(self, name: str, patch: dict[str, Any]) -> None:
        self.calls.append(("node-patch", patch))

    def patch_node_status(self, name: str, patch: dict[str, Any]) -> None:
        self.calls.append(("node-status-patch", patch))

    def create_custom(self, plural: str, body: dict[str, Any]) -> dict[str, Any] | None:
        self.calls.append((f"{plural}-create", body))
        return body

    def patch_custom_status(self, plural: str, name: str, status: dict[str, Any]) -> None:
        self.calls.append((f"{plural}-status", status))

    def patch_custom(self, plural: str, name: str, patch: dict[str, Any]) -> None:
        self.calls.append((f"{plural}-patch", patch))

    def evict_pods_on_node(
        self, node: str, skip_namespaces: tuple[str, ...] = ()
    ) -> EvictionResult:
        self.calls.append(("evict", node))
        if isinstance(self.eviction, Exception):
            raise self.eviction
        return self.eviction

    def event(self, **kw: Any) -> None:
        self.calls.append(("event", kw["reason"]))

    def delete_node(self, name: str, node_claim: str | None = None) -> None:
        self.calls.append(("node-delete", name))
        if node_claim is not None:
            self.calls.append(("nodeclaim-delete", node_claim))


def _body(annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "gpu-1",
            "uid": "0a1b2c3d-0000",
            "resourceVersion": "5",
            "labels": {keys.LABEL_STATE: "Qualified"},
            "annotations": {
                keys.QUALIFIED_AT: "2025-06-01T10:00:00Z",
                keys.REQUEST_QUARANTINE: "bad HBM row",
                **(annotations or {}),
            },
        },
        "spec": {"taints": []},
        "status": {
            "allocatable": {"nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def _snapshot(body: dict[str, Any]) -> NodeSnapshot:
    return NodeSnapshot.from_body(body)


def _policy_body(**quarantine: Any) -> SDCPolicy:
    return SDCPolicy.model_validate(
        {
            "apiVersion": "sdcguard.dev/v1alpha1",
            "kind": "SDCPolicy",
            "metadata": {"name": "fleet", "generation": 1, "resourceVersion": "1"},
            "spec": {"quarantine": {"cordon": True, "drain": True, **quarantine}},
        }
    )


def _run(eviction: EvictionResult | Exception) -> tuple[Reconciler, _Recorder]:
    metrics = Metrics()
    writer = _Recorder(api=client.ApiClient(), metrics=metrics)
    writer.eviction = eviction
    rec = Reconciler(writer=writer, settings=Settings(metrics_port=0), metrics=metrics)
    view = FleetView(nodes={"gpu-1": _snapshot(_body())}, policies={"fleet": {}})
    rec.run_pass(_policy_body(), view, NOW)
    return rec, writer


def test_a_quarantine_writes_objects_then_the_node_then_evicts_then_statuses_then_events() -> None:
    rec, writer = _run(EvictionResult(asked=2))
    kinds = [kind for kind, _ in writer.calls]
    assert kinds == [
        "repairtickets-create",
        "node-patch",
        "node-status-patch",  # the SDCQualified condition: False
        "evict",
        "repairtickets-status",
        "event",
        "sdcpolicies-status",  # the pass's own bookkeeping, after every decision
    ], kinds
    patch = writer.calls[1][1]
    assert any(t["key"] == "sdcguard.dev/quarantined" for t in patch["spec"]["taints"])
    assert patch["spec"]["unschedulable"] is True
    assert keys.DRAIN_UNTIL in patch["metadata"]["annotations"]
    # Every pod was asked to leave: noted, and the next pass's plan ends the drain (one
    # node patch per decision, none after it).
    assert rec.executor.drained == {"gpu-1"}


def test_a_drain_that_asked_every_pod_ends_in_the_next_plan() -> None:
    spec = policy(quarantine={"cordon": True, "drain": True, "drainTimeoutSeconds": 600})
    asked = dataclasses.replace(_quarantined(NOW + dt.timedelta(minutes=5)), drain_asked=True)
    ended = decide(asked, spec, NOW)
    assert ended.event == Event.DRAIN_DONE and ended.state == NodeState.QUARANTINED
    assert Drain() not in ended.actions
    assert ended.actions == (Annotate(((keys.DRAIN_UNTIL, None),)),), "only the deadline goes"


def test_evictions_refused_by_a_pdb_leave_the_drain_pending() -> None:
    rec, writer = _run(EvictionResult(asked=0, blocked=1))
    patches = [body for kind, body in writer.calls if kind == "node-patch"]
    assert len(patches) == 1, "the deadline stays while a pod is left"
    assert rec.executor.drained == set(), "the drain goes on"
    assert rec.last_counts["pods-eviction-refused"] == 1
    assert "repairtickets-status" in [k for k, _ in writer.calls], "the ticket is opened"


def test_an_eviction_error_never_prevents_the_taint_or_the_ticket() -> None:
    rec, writer = _run(ConnectionResetError("connection reset by peer"))
    kinds = [kind for kind, _ in writer.calls]
    assert kinds.index("node-patch") < kinds.index("evict") < kinds.index("repairtickets-status")
    assert "event" in kinds
    assert rec.last_counts["drain-errors"] == 1
    assert rec.last_counts.get("apply-error-other", 0) == 0


def _quarantined(until: dt.datetime) -> Observed:
    return Observed(
        node=node(
            state=NodeState.QUARANTINED,
            annotations={keys.DRAIN_UNTIL: keys.format_time(until)},
        ),
        ticket=ticket(),
    )


def test_a_pending_drain_evicts_again_with_back_off_until_its_deadline() -> None:
    spec = policy(quarantine={"cordon": True, "drain": True, "drainTimeoutSeconds": 600})
    soon = decide(_quarantined(NOW + dt.timedelta(minutes=9, seconds=59)), spec, NOW)
    assert soon.event == Event.DRAIN_DUE and Drain() in soon.actions
    assert soon.requeue_after == 2.0
    later = decide(_quarantined(NOW + dt.timedelta(minutes=2)), spec, NOW)
    assert later.event == Event.DRAIN_DUE and later.requeue_after == 60.0
    assert later.requeue_after is not None and soon.requeue_after < later.requeue_after

    over = decide(_quarantined(NOW - dt.timedelta(seconds=1)), spec, NOW)
    assert over.event == Event.DRAIN_TIMED_OUT and Drain() not in over.actions
    assert any(isinstance(a, EmitEvent) and a.reason == "DrainIncomplete" for a in over.actions)
    assert over.state == NodeState.QUARANTINED


def test_a_quarantine_in_observe_mode_sets_no_drain() -> None:
    spec = policy(mode="Observe", quarantine={"cordon": True, "drain": True})
    observed = Observed(
        node=node(
            state=NodeState.QUALIFIED,
            annotations={keys.REQUEST_QUARANTINE: "x"},
            qualified_at=NOW - dt.timedelta(days=1),
        )
    )
    decision = decide(observed, spec, NOW)
    assert Drain() not in decision.actions
    assert all(keys.DRAIN_UNTIL not in dict(getattr(a, "changes", ())) for a in decision.actions)


def test_an_illegal_transition_costs_only_its_node(monkeypatch: Any) -> None:
    """One node whose event has no row: counted, a condition on the policy, the other
    nodes decided and written as usual (it used to fail the whole pass, every 2 s)."""
    import importlib

    decide_mod = importlib.import_module("sdcguard.domain.decide")
    from sdcguard.domain.lifecycle import IllegalTransition

    real = decide_mod.transition

    def transition(state: NodeState, event: Event) -> Any:
        if event == Event.MANUAL_QUARANTINE and state == NodeState.QUALIFIED:
            raise IllegalTransition(state, event)
        return real(state, event)

    monkeypatch.setattr(decide_mod, "transition", transition)
    metrics = Metrics()
    writer = _Recorder(api=client.ApiClient(), metrics=metrics)
    rec = Reconciler(writer=writer, settings=Settings(metrics_port=0), metrics=metrics)
    fresh = _body()
    fresh["metadata"] = {
        **fresh["metadata"],
        "name": "gpu-2",
        "labels": {},
        "annotations": {},
    }
    fresh["spec"] = {"taints": [{"key": "sdcguard.dev/unqualified", "effect": "NoSchedule"}]}
    view = FleetView(
        nodes={"gpu-1": _snapshot(_body()), "gpu-2": _snapshot(fresh)}, policies={"fleet": {}}
    )
    rec.run_pass(_policy_body(), view, NOW)
    kinds = [kind for kind, _ in writer.calls]
    assert "sdctests-create" in kinds, "the other node's acceptance test starts"
    assert "repairtickets-create" not in kinds, "the bad node is left as it is"
    sample = metrics.illegal_transitions.labels(from_state="Qualified", event="ManualQuarantine")
    assert sample._value.get() == 1
    status = next(body for kind, body in writer.calls if kind == "sdcpolicies-status")
    cond = next(c for c in status["conditions"] if c["type"] == "IllegalTransition")
    assert cond["status"] == "True" and "gpu-1 (Qualified on ManualQuarantine)" in cond["message"]


def _neuron_node(name: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "uid": f"{name}-uid-0000",
            "resourceVersion": "3",
            "creationTimestamp": "2025-06-01T10:00:00Z",
            "labels": {"sdcguard.dev/state": "Qualified"},
            "annotations": {keys.QUALIFIED_AT: "2025-05-01T10:00:00Z"},
        },
        "spec": {"taints": []},
        "status": {
            "allocatable": {"aws.amazon.com/neuroncore": "32"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def _pod(node: str | None, resources: dict[str, str], phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"name": f"train-{node}", "namespace": "ml"},
        "spec": {
            **({"nodeName": node} if node else {}),
            "containers": [{"name": "c", "resources": {"limits": resources}}],
        },
        "status": {"phase": phase},
    }


def test_idle_and_pending_demand_use_the_policys_accelerators() -> None:
    """A node running pods that request a Neuron core resource (not in the default list)
    is busy for a policy that lists it, and a pending pod asking for it holds screening
    back; a pod asking for another device does neither."""
    from sdcguard.adapters import observe

    policy_body = {
        "apiVersion": "sdcguard.dev/v1alpha1",
        "kind": "SDCPolicy",
        "metadata": {"name": "fleet", "generation": 1, "resourceVersion": "1"},
        "spec": {
            "accelerators": ["aws.amazon.com/neuroncore"],
            "triggers": {"maxQualificationAge": "1h"},
            "budgets": {"maxUnavailable": "100%"},
        },
    }

    def tests_started(pods: list[dict[str, Any]]) -> int:
        metrics = Metrics()
        writer = _Recorder(api=client.ApiClient(), metrics=metrics)
        rec = Reconciler(writer=writer, settings=Settings(metrics_port=0), metrics=metrics)
        view = FleetView(
            nodes={n: _snapshot(_neuron_node(n)) for n in ("trn-1", "trn-2")},
            policies={"fleet": {}},
        )
        for pod in pods:
            if (use := observe.pod_use(pod)) is not None:
                view.busy.setdefault(use.node_name, []).append(use)
            if (demand := observe.pending_demand(pod)) is not None:
                view.pending.append(demand)
        rec.run_pass(SDCPolicy.model_validate(policy_body), view, NOW)
        return sum(1 for kind, _ in writer.calls if kind == "sdctests-create")

    assert tests_started([]) == 2, "both expired qualifications are screened"
    assert tests_started([_pod("trn-1", {"aws.amazon.com/neuroncore": "32"})]) == 1
    pending = _pod(None, {"aws.amazon.com/neuroncore": "16"}, phase="Pending")
    assert tests_started([pending]) == 0, "a pending pod needs these nodes"
    other = [
        _pod("trn-1", {"example.com/nic": "1"}),
        _pod(None, {"example.com/nic": "1"}, "Pending"),
    ]
    assert tests_started(other) == 2, "another device makes no node busy"


def test_probe_command_args_suite_budget_and_catch_target_reach_the_job() -> None:
    """spec.probe.command and args, the suite's own budget and the catch target are not
    accepted and ignored: the Job runs the command, passes the extra arguments after
    sdcguard's, plans the suite's budget and asks for the policy's catch target."""
    from sdcguard.api import SDCPolicy, SDCTest
    from sdcguard.builders.probe_job import build_probe_job
    from sdcguard.domain.observed import NodeFacts

    policy_doc = {
        "metadata": {"name": "fleet"},
        "spec": {
            "probe": {
                "command": ["/opt/probe/bin/sdcprobe"],
                "args": ["--threads", "4"],
                "activeDeadlineSeconds": 1800,
                "budgetSeconds": 300,
                "catchTarget": {"chance": 0.999, "activeFraction": 0.1, "onShortfall": "Refuse"},
                "memoryDwellSeconds": 2.5,
            },
            "suites": {
                "requalification": [{"name": "compute"}, {"name": "golden"}],
                "budgetSeconds": {"requalification": 600},
            },
        },
    }
    policy = SDCPolicy.model_validate(policy_doc)

    def test_of(suite: str) -> SDCTest:
        return SDCTest.model_validate(
            {
                "metadata": {"name": f"gpu-1-{suite.lower()}-3", "uid": "u"},
                "spec": {"nodeName": "gpu-1", "policyRef": "fleet", "suite": suite},
            }
        )

    metrics = Metrics()
    rec = Reconciler(
        writer=_Recorder(api=client.ApiClient(), metrics=metrics),
        settings=Settings(metrics_port=0),
        metrics=metrics,
    )
    body = _snapshot(_body())
    facts = NodeFacts.from_snapshot(body, policy.spec.accelerators)

    def args_of(policy: SDCPolicy, suite: str) -> tuple[list[str], list[str]]:
        job = build_probe_job(rec.runner.probe_request(policy, test_of(suite), facts, body))
        container = job["spec"]["template"]["spec"]["containers"][0]
        return container["command"], container["args"]

    command, args = args_of(policy, "requalification")
    assert command == ["/opt/probe/bin/sdcprobe"]
    assert args[:3] == ["run", "--checks", "compute,golden"] and args[-2:] == ["--threads", "4"]
    assert args[args.index("--budget") + 1] == "600"
    assert "--timeout" not in args  # the Job's deadline (--deadline) is the hard limit
    assert args[args.index("--catch-target") + 1] == "0.999"
    assert args[args.index("--catch-fraction") + 1] == "0.1"
    assert args[args.index("--catch-shortfall") + 1] == "refuse"
    assert args[args.index("--memory-dwell") + 1] == "2.5"
    # A suite without its own budget: the probe's, and repair verification 1.5 times it.
    assert args_of(policy, "acceptance")[1][args.index("--budget") + 1] == "300"
    _, verify = args_of(policy, "repairVerification")
    assert verify[verify.index("--budget") + 1] == "450"
    plain = SDCPolicy.model_validate({"metadata": {"name": "fleet"}})
    command, args = args_of(plain, "requalification")
    assert command == ["python", "-m", "sdcprobe"]
    assert args[args.index("--catch-target") + 1] == "0.99"
    assert args[args.index("--catch-shortfall") + 1] == "flag"
    assert "--memory-dwell" not in args  # the probe's default for the device


def test_the_new_tickets_status_is_built_from_the_model_and_sets_only_its_fields() -> None:
    _, writer = _run(EvictionResult(asked=1))
    status = next(body for kind, body in writer.calls if kind == "repairtickets-status")
    # A merge patch: fields it does not name (the sinks' notification record) stay.
    assert set(status) == {"phase", "cycle", "openedAt", "history"}
    assert status["openedAt"] == keys.format_time(NOW)
    parsed = RepairTicketStatus.model_validate(status)
    assert parsed.phase == TicketPhase.OPEN and parsed.cycle == 1
    assert [(h.phase, h.time) for h in parsed.history] == [
        (TicketPhase.OPEN, NOW.replace(microsecond=0))
    ]
    assert parsed.history[0].message


class _ConflictFirst(_Recorder):
    """The first node patch is refused with 409 (the node changed since it was read)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.conflicts = 1

    def patch_node(self, name: str, patch: dict[str, Any]) -> None:
        if self.conflicts:
            self.conflicts -= 1
            self.calls.append(("node-patch-409", patch))
            raise ApiException(status=409, reason="Conflict")
        super().patch_node(name, patch)


def test_a_quarantine_cut_off_after_its_ticket_is_made_again_whole() -> None:
    """The plan creates the ticket before the node patch. A 409 on that patch leaves a
    ticket without a status on a node still labelled Qualified, its request still on it.
    The next pass makes the same decision again, whole: not the upkeep of a quarantined
    node (taint and cordon), which would never drain it, revoke its qualification,
    write the ticket's status or tell anyone."""
    metrics = Metrics()
    writer = _ConflictFirst(api=client.ApiClient(), metrics=metrics)
    writer.eviction = EvictionResult(asked=0, blocked=1)
    rec = Reconciler(writer=writer, settings=Settings(metrics_port=0), metrics=metrics)
    spec = _policy_body(drainTimeoutSeconds=300)
    rec.run_pass(spec, FleetView(nodes={"gpu-1": _snapshot(_body())}, policies={"fleet": {}}), NOW)
    assert [k for k, _ in writer.calls][:2] == ["repairtickets-create", "node-patch-409"]
    assert "evict" not in [k for k, _ in writer.calls], "nothing after the refused patch"
    (first,) = [b for k, b in writer.calls if k == "repairtickets-create"]
    name = first["metadata"]["name"]
    # The watch brings the ticket (no status yet) and the node as it was; later pass.
    meta = {
        **first["metadata"],
        "resourceVersion": "7",
        "creationTimestamp": "2025-06-01T12:00:00Z",
    }
    tickets = {"gpu-1": [TicketSnapshot.from_body({**first, "metadata": meta})]}
    body = _body()
    body["metadata"]["resourceVersion"] = "6"
    writer.calls.clear()
    view = FleetView(nodes={"gpu-1": _snapshot(body)}, tickets=tickets, policies={"fleet": {}})
    rec.run_pass(spec, view, NOW + dt.timedelta(seconds=2))
    kinds = [k for k, _ in writer.calls]
    assert [b["metadata"]["name"] for k, b in writer.calls if k == "repairtickets-create"] == [
        name
    ], "the same ticket, by the decision's name"
    (patch,) = [b for k, b in writer.calls if k == "node-patch"]
    annotations = patch["metadata"]["annotations"]
    assert keys.DRAIN_UNTIL in annotations and annotations[keys.QUALIFIED_AT] is None
    assert any(t["key"] == "sdcguard.dev/quarantined" for t in patch["spec"]["taints"])
    assert patch["spec"]["unschedulable"] is True
    assert kinds.index("node-patch") < kinds.index("evict") < kinds.index("repairtickets-status")
    events = [reason for k, reason in writer.calls if k == "event"]
    assert events == ["Quarantined"], events  # not StateLabelCorrected
    assert rec.last_counts["to-quarantined"] == 1


def test_a_ticket_contradicts_a_qualified_label_once_its_status_is_written() -> None:
    spec = policy()
    qualified = node(state=NodeState.QUALIFIED, qualified_at=NOW - dt.timedelta(days=1))
    unopened = dataclasses.replace(ticket(), opened=False)
    assert believed_state(Observed(node=qualified, ticket=unopened), spec) == NodeState.QUALIFIED
    assert believed_state(Observed(node=qualified, ticket=ticket()), spec) == NodeState.QUARANTINED
    # Without a label, any ticket still says where the node is.
    unlabelled = node(state=None)
    assert believed_state(Observed(node=unlabelled, ticket=unopened), spec) == NodeState.QUARANTINED
