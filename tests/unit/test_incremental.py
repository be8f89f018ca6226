"""Deciding only the nodes that changed: the domain's part (no write for a node that
only waits, budgets that count the nodes not decided, routine Events) and the
reconciler's targeted and urgent passes, run in-process in dry-run mode."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import Counter
from typing import Any

from kubernetes import client

from sdcguard.adapters import observe
from sdcguard.adapters.kube import KubeWriter
from sdcguard.adapters.pass_state import TestSnapshot
from sdcguard.adapters.reconciler import FleetView, Reconciler, UrgentWork
from sdcguard.adapters.urgent import failures_first
from sdcguard.api import SDCPolicy
from sdcguard.domain import keys
from sdcguard.domain.budgets import PoolMember, pool_usage
from sdcguard.domain.decide import decide
from sdcguard.domain.lifecycle import AddTaint, EmitEvent, NodeState, SetLabel
from sdcguard.domain.observed import NodeSnapshot, Observed, Taint
from sdcguard.domain.scheduling import decide_all
from sdcguard.metrics import Metrics
from sdcguard.settings import Settings
from tests.unit.factories import NOW, node, policy

GATE = "sdcguard.dev/unqualified"


def _gated(name: str, **kw: Any) -> Observed:
    return Observed(
        node=node(name, taints=(Taint(GATE, "NoSchedule"),), **kw),
        idle_since=NOW - dt.timedelta(hours=1),
    )


# Domain ----------------------------------------------------------------------------


def test_a_gated_node_waiting_for_budget_costs_no_write() -> None:
    spec = policy(budgets={"maxConcurrentTests": 1})
    decisions = decide_all([_gated("gpu-1"), _gated("gpu-2")], spec, NOW)
    started, waiting = decisions
    assert started.starts_test and not started.waits_for_budget
    assert waiting.actions == () and waiting.waits_for_budget
    assert waiting.state == NodeState.UNQUALIFIED and waiting.previous is None


def test_the_reservation_labels_and_adopts_the_gate_the_first_sight_skipped() -> None:
    decision = decide(_gated("gpu-1"), policy(), NOW)
    assert any(isinstance(a, SetLabel) and a.state == NodeState.TESTING for a in decision.actions)
    gate = [a for a in decision.actions if isinstance(a, AddTaint) and a.key == GATE]
    assert gate, "the gate taint it registered with is adopted at the reservation"


def test_an_ungated_new_node_is_still_gated_at_first_sight() -> None:
    spec = policy(budgets={"maxConcurrentTests": 1})
    observed = Observed(node=node("gpu-1"), idle_since=NOW - dt.timedelta(hours=1))
    busy = pool_usage([PoolMember(pool="", held=False, testing=True)])
    (decision,) = decide_all([observed], spec, NOW, others=busy)
    assert any(isinstance(a, AddTaint) and a.key == GATE for a in decision.actions)
    assert decision.waits_for_budget


def test_nodes_not_decided_count_against_the_budget() -> None:
    spec = policy(budgets={"maxConcurrentTests": 2})
    busy = pool_usage([PoolMember(pool="", held=False, testing=True)])
    decisions = decide_all([_gated("gpu-1"), _gated("gpu-2")], spec, NOW, others=busy)
    assert [d.starts_test for d in decisions] == [True, False]
    assert decisions[1].waits_for_budget


def test_clean_screening_events_are_routine() -> None:
    decision = decide(_gated("gpu-1"), policy(), NOW)
    events = [a for a in decision.actions if isinstance(a, EmitEvent)]
    assert [(e.reason, e.routine) for e in events] == [("TestStarted", True)]


# Reconciler ------------------------------------------------------------------------


def _body(
    name: str, rv: int, labels: dict[str, str], annotations: dict[str, str], spec: dict[str, Any]
) -> NodeSnapshot:
    body = {
        "metadata": {
            "name": name,
            "uid": f"{name}-uid-0000",
            "resourceVersion": str(rv),
            "creationTimestamp": "2025-06-01T10:00:00Z",
            "labels": {"sdcguard.dev/accelerator": "true", **labels},
            "annotations": annotations,
        },
        "spec": spec,
        "status": {
            "allocatable": {"nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    return NodeSnapshot.from_body(body)


def _node_body(name: str, rv: int = 1, **annotations: str) -> NodeSnapshot:
    """A gated node that just joined."""
    return _body(
        name, rv, {}, dict(annotations), {"taints": [{"key": GATE, "effect": "NoSchedule"}]}
    )


def _qualified_body(name: str, rv: int = 1, **annotations: str) -> NodeSnapshot:
    """A node screened an hour ago and in service: untainted, nothing to do."""
    qualified_at = keys.format_time(NOW - dt.timedelta(hours=1))
    labels = {keys.LABEL_STATE: "Qualified"}
    return _body(name, rv, labels, {keys.QUALIFIED_AT: qualified_at, **annotations}, {})


def _policy_body(max_tests: int) -> SDCPolicy:
    return SDCPolicy.model_validate(
        {
            "apiVersion": "sdcguard.dev/v1alpha1",
            "kind": "SDCPolicy",
            "metadata": {"name": "fleet", "generation": 1, "resourceVersion": "1"},
            "spec": {"budgets": {"maxConcurrentTests": max_tests}},
        }
    )


def _view(nodes: dict[str, NodeSnapshot]) -> FleetView:
    return FleetView(nodes=nodes, policies={"fleet": {}})


class _Spy(KubeWriter):
    """The dry-run writer, remembering which node each write was for."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.by_node: Counter[str] = Counter()
        self.order: list[str] = []

    def patch_node(self, name: str, patch: dict[str, Any]) -> None:
        self.by_node[name] += 1
        self.order.append(name)
        super().patch_node(name, patch)

    def create_custom(self, plural: str, body: dict[str, Any]) -> dict[str, Any] | None:
        node = str(body.get("spec", {}).get("nodeName"))
        self.by_node[node] += 1
        self.order.append(node)
        return super().create_custom(plural, body)


def _reconciler(**settings_: Any) -> tuple[Reconciler, _Spy]:
    metrics = Metrics()
    writer = _Spy(api=client.ApiClient(), metrics=metrics, dry_run=True)
    settings = Settings(metrics_port=0, **settings_)
    return Reconciler(writer=writer, settings=settings, metrics=metrics), writer


def test_targeted_pass_fills_freed_budget_in_priority_order_and_nothing_else() -> None:
    nodes = {f"gpu-{i}": _node_body(f"gpu-{i}") for i in range(6)}
    view = _view(nodes)
    rec, writer = _reconciler()
    rec.run_pass(_policy_body(2), view, NOW)
    assert writer.writes["sdctests-create"] == 2
    assert writer.writes["node-patch"] == 2, "the four waiting nodes cost no write"
    assert set(writer.by_node) == {"gpu-0", "gpu-1"}

    # Nothing changed: a targeted pass decides nothing and writes nothing.
    writer.writes.clear()
    writer.by_node.clear()
    rec.run_pass(_policy_body(2), view, NOW, dirty=())
    assert sum(writer.writes.values()) == 0
    assert rec.last_counts["nodes-decided"] == 0

    # One more slot: exactly one waiting node, the first in priority order, starts.
    rec.run_pass(_policy_body(3), view, NOW, dirty=())
    assert writer.writes["sdctests-create"] == 1
    assert set(writer.by_node) == {"gpu-2"}


def test_targeted_pass_decides_only_the_dirty_nodes() -> None:
    nodes = {f"gpu-{i}": _node_body(f"gpu-{i}") for i in range(4)}
    rec, writer = _reconciler()
    rec.run_pass(_policy_body(1), _view(nodes), NOW)
    writer.writes.clear()
    writer.by_node.clear()
    nodes["gpu-3"] = _node_body("gpu-3", rv=2, **{keys.REQUEST_QUARANTINE: "fans"})
    rec.run_pass(_policy_body(1), _view(nodes), NOW, dirty=["gpu-3"])
    assert rec.last_counts["nodes-decided"] == 1
    assert writer.by_node == Counter({"gpu-3": 2})  # its ticket, its patch


def test_urgent_work_is_served_during_a_pass_and_the_pass_skips_its_nodes() -> None:
    nodes = {f"gpu-{i}": _node_body(f"gpu-{i}") for i in range(3)}
    rec, writer = _reconciler()
    fresh = dict(nodes)
    fresh["gpu-1"] = _node_body("gpu-1", rv=2, **{keys.REQUEST_QUARANTINE: "fans"})
    rec.offer_urgent(UrgentWork(_policy_body(5), _view(fresh), frozenset({"gpu-1"}), NOW))
    rec.run_pass(_policy_body(5), _view(nodes), NOW)
    assert rec.take_unserved() == []
    # gpu-1 was decided once, from the fresher view (quarantined: a ticket, a patch);
    # the full pass's stale decision for it (start a test) was skipped.
    assert writer.writes["repairtickets-create"] == 1
    assert writer.by_node["gpu-1"] == 2
    assert writer.writes["sdctests-create"] == 2


def test_urgent_work_is_served_while_a_long_pass_applies_decisions_that_change_nothing() -> None:
    """A full pass over a settled fleet writes nothing, yet deciding thousands of nodes
    takes a while: a probe's end offered meanwhile is served within 256 of them, and
    the pass leaves that node as the urgent work left it (not its own older decision)."""
    settled = {f"gpu-{i:03d}": _qualified_body(f"gpu-{i:03d}") for i in range(600)}
    rec, writer = _reconciler()
    rec.run_pass(_policy_body(600), _view(settled), NOW)
    assert set(writer.writes) == {"sdcpolicies-status"}, "a settled fleet: no node to write"
    act, serve = rec._act, rec._serve_urgent
    fresh = dict(settled)
    fresh["gpu-599"] = _qualified_body("gpu-599", rv=3, **{keys.REQUEST_QUARANTINE: "fans"})
    memory = rec._memory["fleet"]
    assert memory.states["gpu-599"] == "Qualified"
    applied: list[str] = []  # the nodes whose decision the full pass has applied so far
    served_after: list[int] = []
    set_member = memory.pools.set_member

    def counting_set_member(node: str, member: PoolMember) -> None:
        applied.append(node)
        set_member(node, member)

    def offering_act(*args: Any, **kwargs: Any) -> float:
        if not served_after:  # the full pass's: the probe's end arrives as it starts
            served_after.append(-1)
            rec.offer_urgent(
                UrgentWork(_policy_body(600), _view(fresh), frozenset({"gpu-599"}), NOW)
            )
        return act(*args, **kwargs)

    def counting_serve() -> None:
        if served_after and not rec.urgent.depth and rec.urgent.waiting():
            served_after.append(len(applied))
        serve()

    memory.pools.set_member = counting_set_member  # type: ignore[method-assign]
    rec._act = offering_act  # type: ignore[method-assign]
    rec._serve_urgent = counting_serve  # type: ignore[method-assign]
    rec.run_pass(_policy_body(600), _view(settled), NOW)
    assert rec.take_unserved() == []
    assert writer.writes["repairtickets-create"] == 1, "the urgent work was served"
    assert served_after[1] <= 256, f"served only after {served_after[1]} of 600 nodes"
    assert applied.count("gpu-599") == 1, "applied once: by the urgent pass, not again"
    assert memory.states["gpu-599"] == "Quarantined", "the pass's older decision did not win"


def test_a_pass_leaves_nodes_decided_while_its_view_was_copied_to_that_decision() -> None:
    nodes = {f"gpu-{i}": _node_body(f"gpu-{i}") for i in range(3)}
    rec, writer = _reconciler()
    before = rec.mark()
    # A probe end served while the pass's view was being copied (another thread).
    fresh = dict(nodes)
    fresh["gpu-1"] = _node_body("gpu-1", rv=2, **{keys.REQUEST_QUARANTINE: "fans"})
    rec.offer_urgent(UrgentWork(_policy_body(5), _view(fresh), frozenset({"gpu-1"}), NOW))
    rec.serve_offered()
    assert rec.served_since(before) == {"gpu-1"} and rec.served_since(rec.mark()) == set()
    # The view, copied before that decision, still shows gpu-1 untouched.
    rec.run_pass(_policy_body(5), _view(nodes), NOW, since=before)
    assert writer.writes["repairtickets-create"] == 1
    assert writer.by_node["gpu-1"] == 2, "decided once, from the fresher view"
    assert writer.writes["sdctests-create"] == 2
    # Without the mark the same stale view decides gpu-1 again (the case it prevents).
    rec2, writer2 = _reconciler()
    rec2.offer_urgent(UrgentWork(_policy_body(5), _view(fresh), frozenset({"gpu-1"}), NOW))
    rec2.serve_offered()
    rec2.run_pass(_policy_body(5), _view(nodes), NOW)
    assert writer2.by_node["gpu-1"] > 2


def test_a_failing_request_costs_only_its_node() -> None:
    nodes = {f"gpu-{i}": _node_body(f"gpu-{i}") for i in range(3)}
    rec, writer = _reconciler()
    original = writer.patch_node

    def flaky(name: str, patch: dict[str, Any]) -> None:
        if name == "gpu-0":
            raise ConnectionResetError("connection reset by peer")
        original(name, patch)

    writer.patch_node = flaky  # type: ignore[method-assign]
    rec.run_pass(_policy_body(5), _view(nodes), NOW)
    assert rec.last_counts["apply-error-other"] == 1
    assert writer.by_node["gpu-1"] == 2 and writer.by_node["gpu-2"] == 2


def test_routine_events_only_when_asked_for() -> None:
    nodes = {"gpu-0": _node_body("gpu-0")}
    quiet, quiet_writer = _reconciler()
    quiet.run_pass(_policy_body(1), _view(nodes), NOW)
    assert quiet_writer.writes["event"] == 0 and quiet_writer.writes["sdctests-create"] == 1
    chatty, chatty_writer = _reconciler(routine_events=True)
    chatty.run_pass(_policy_body(1), _view(nodes), NOW)
    assert chatty_writer.writes["event"] == 1  # TestStarted


def test_urgent_work_with_a_partial_view_forgets_no_other_node() -> None:
    nodes = {f"gpu-{i}": _node_body(f"gpu-{i}") for i in range(3)}
    rec, writer = _reconciler()
    rec.run_pass(_policy_body(5), _view(nodes), NOW)
    writer.by_node.clear()
    partial = _view({"gpu-1": _node_body("gpu-1", rv=2, **{keys.REQUEST_QUARANTINE: "fans"})})
    partial.complete = False
    later = _view({"gpu-1": partial.nodes["gpu-1"]})
    later.complete = False
    # Two offers in a row are served as one pass over the merged view.
    rec.offer_urgent(UrgentWork(_policy_body(5), partial, frozenset({"gpu-1"}), NOW))
    rec.offer_urgent(UrgentWork(_policy_body(5), later, frozenset({"gpu-1"}), NOW))
    rec.run_pass(_policy_body(5), _view(nodes), NOW, dirty=())
    assert writer.by_node == Counter({"gpu-1": 2})
    assert writer.writes["repairtickets-create"] == 1
    memory = rec._memory["fleet"]
    assert set(memory.states) == {"gpu-0", "gpu-1", "gpu-2"}
    assert memory.states["gpu-1"] == "Quarantined"


def _ended_probe(node_name: str, phase: str) -> observe.ProbePod:
    return observe.ProbePod(
        test_name=f"{node_name}-t1",
        name=f"{node_name}-t1-pod",
        node_name=node_name,
        phase=phase,
        exit_code=1 if phase == "Failed" else 0,
        message_z=None,
        terminated_reason="Error" if phase == "Failed" else "Completed",
        pod_reason="",
        started=NOW,
        finished=NOW,
        deleted=False,
    )


def test_a_failed_probes_node_is_decided_first_and_alone() -> None:
    """Probe ends offered together: the node whose probe Pod failed is decided in a
    pass of its own before the others, so its quarantine waits for none of their
    writes; the others are decided together."""
    nodes = {f"gpu-{i}": _node_body(f"gpu-{i}") for i in range(3)}
    rec, writer = _reconciler()
    rec.run_pass(_policy_body(5), _view(nodes), NOW)
    writer.order.clear()
    urgent = {n: _node_body(n, rv=2, **{keys.REQUEST_QUARANTINE: "fans"}) for n in nodes}
    view = _view(urgent)
    view.complete = False
    view.probe_pods = {
        p.test_name: [p]
        for p in (_ended_probe("gpu-0", "Succeeded"), _ended_probe("gpu-2", "Failed"))
    }
    work = UrgentWork(_policy_body(5), view, frozenset(urgent), NOW)
    assert failures_first(work) == [frozenset({"gpu-2"}), frozenset({"gpu-0", "gpu-1"})]
    rec.offer_urgent(work)
    rec.run_pass(_policy_body(5), _view(nodes), NOW, dirty=())
    # Each quarantine is a ticket and a patch: gpu-2's both come first.
    assert writer.order[:2] == ["gpu-2", "gpu-2"]
    assert sorted(writer.order[2:]) == ["gpu-0", "gpu-0", "gpu-1", "gpu-1"]


def test_a_probe_pods_result_is_kept_compressed_and_read_back_intact() -> None:
    message = '{"schema_version":1,"checks":{"golden":{"digest":"' + "ab" * 32 + '"}}}' * 40
    body = {
        "metadata": {
            "name": "sdcprobe-t-1-abcde",
            "labels": {
                "app.kubernetes.io/component": "sdcprobe",
                "sdcguard.dev/test": "t-1",
            },
        },
        "spec": {"nodeName": "gpu-1"},
        "status": {
            "phase": "Succeeded",
            "containerStatuses": [{"state": {"terminated": {"exitCode": 0, "message": message}}}],
        },
    }
    pod = observe.probe_pod(body)
    assert pod is not None and pod.message_z is not None
    assert pod.termination_message == message
    assert len(pod.message_z) < len(message) / 4


def _ticket_without_status(name: str, created: str, **spec: Any) -> observe.TicketSnapshot:
    """A RepairTicket for gpu-0 of policy fleet, created at ``created``, with no status."""
    return observe.TicketSnapshot.from_body(
        {
            "apiVersion": "sdcguard.dev/v1alpha1",
            "kind": "RepairTicket",
            "metadata": {"name": name, "resourceVersion": "7", "creationTimestamp": created},
            "spec": {"nodeName": "gpu-0", "policyRef": "fleet", **spec},
        }
    )


def test_a_ticket_left_without_status_gets_one_after_a_grace_period() -> None:
    def ticket(name: str, age: dt.timedelta) -> observe.TicketSnapshot:
        return _ticket_without_status(name, keys.format_time(NOW - age), evidence=[])

    nodes = {"gpu-0": _node_body("gpu-0")}
    rec, writer = _reconciler()
    view = _view(nodes)
    view.tickets = {"gpu-0": [ticket("fresh", dt.timedelta(seconds=5))]}
    rec.run_pass(_policy_body(1), view, NOW)
    assert writer.writes["repairtickets-status"] == 0, "its own status write is on its way"
    view = _view({"gpu-0": _node_body("gpu-0", rv=2)})  # the node patch came back
    view.tickets = {"gpu-0": [ticket("stale", dt.timedelta(minutes=2))]}
    rec.run_pass(_policy_body(1), view, NOW, dirty=["gpu-0"])
    assert writer.writes["repairtickets-status"] == 1
    assert rec.last_counts["ticket-status-restored"] == 1


def _ticket_statuses_of_a_pass(
    node: NodeSnapshot, ticket: observe.TicketSnapshot
) -> list[dict[str, Any]]:
    """The ticket status patches one full pass over ``node`` and its ``ticket`` writes."""
    statuses: list[dict[str, Any]] = []

    class _Statuses(_Spy):
        def patch_custom_status(self, plural: str, name: str, status: dict[str, Any]) -> None:
            statuses.append(status)
            super().patch_custom_status(plural, name, status)

    metrics = Metrics()
    writer = _Statuses(api=client.ApiClient(), metrics=metrics, dry_run=True)
    rec = Reconciler(writer=writer, settings=Settings(metrics_port=0), metrics=metrics)
    view = _view({"gpu-0": node})
    view.tickets = {"gpu-0": [ticket]}
    rec.run_pass(_policy_body(1), view, NOW)
    return statuses


def test_a_ticket_born_retired_gets_its_retired_status_after_an_interruption() -> None:
    """The hardware had no repair cycle left: the ticket was created, the node retired,
    and the operator died before the ticket's status. It is restored Retired, at the
    cycle it began (the hardware's earlier cycles plus one), not Open at cycle 1."""
    created = keys.format_time(NOW - dt.timedelta(minutes=2))
    ticket = _ticket_without_status(
        "t-3", created, hardware={"providerID": "p-1", "cyclesBefore": 2}
    )
    node = _node_body("gpu-0")
    node = dataclasses.replace(node, labels={**node.labels, keys.LABEL_STATE: "Retired"})
    statuses = _ticket_statuses_of_a_pass(node, ticket)
    restored = [s for s in statuses if "openedAt" in s]
    assert len(restored) == 1
    assert (restored[0]["phase"], restored[0]["cycle"]) == ("Retired", 3)
    assert [h["phase"] for h in restored[0]["history"]] == ["Open", "Retired"]


def test_a_ticket_whose_open_status_was_lost_still_opens_its_history() -> None:
    """The repair side took the ticket (spec.external) before its Open status came (the
    node patch after the ticket's creation conflicted): the first phase written, InRepair,
    comes after an Open entry dated at the ticket's creation, at the cycle it began."""
    created = keys.format_time(NOW - dt.timedelta(seconds=5))
    ticket = _ticket_without_status(
        "t-1",
        created,
        hardware={"providerID": "p-1", "cyclesBefore": 1},
        external={"system": "sim", "id": "SIM-1"},
    )
    node = _node_body("gpu-0", **{keys.OWNED_TAINTS: "sdcguard.dev/quarantined"})
    node = dataclasses.replace(
        node,
        labels={**node.labels, keys.LABEL_STATE: "Quarantined"},
        taints=(Taint("sdcguard.dev/quarantined", "NoSchedule"),),
    )
    statuses = _ticket_statuses_of_a_pass(node, ticket)
    written = [s for s in statuses if s.get("phase") == "InRepair"]
    assert len(written) == 1, statuses
    assert [h["phase"] for h in written[0]["history"]] == ["Open", "InRepair"]
    assert written[0]["history"][0]["time"] == created
    assert (written[0]["openedAt"], written[0]["cycle"]) == (created, 2)


def test_a_karpenter_nodes_node_claim_is_kept_in_the_trimmed_node() -> None:
    """Replace deletes the NodeClaim of a Node Karpenter launched: the trimmed Node keeps
    that owner (and no other owner reference)."""
    body = {
        "metadata": {
            "name": "n1",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": "x", "uid": "1"},
                {
                    "apiVersion": "karpenter.sh/v1",
                    "kind": "NodeClaim",
                    "name": "gpu-abc",
                    "uid": "2",
                },
            ],
        }
    }
    snapshot = NodeSnapshot.from_body(body)
    assert snapshot.node_claim == "gpu-abc"
    assert observe.node_claim(snapshot) == "gpu-abc"
    assert observe.node_claim(NodeSnapshot.from_body({"metadata": {"name": "n2"}})) is None
    assert observe.node_claim(None) is None


def _testing_node(name: str, test: str) -> NodeSnapshot:
    """A node held for its test (our testing taint, recorded as ours)."""
    body = {
        "metadata": {
            "name": name,
            "uid": f"{name}-uid-0000",
            "resourceVersion": "3",
            "creationTimestamp": "2025-06-01T10:00:00Z",
            "labels": {"sdcguard.dev/accelerator": "true", keys.LABEL_STATE: "Testing"},
            "annotations": {
                keys.CURRENT_TEST: test,
                keys.OWNED_TAINTS: "sdcguard.dev/testing",
                keys.SEQ: "1",
            },
        },
        "spec": {"taints": [{"key": "sdcguard.dev/testing", "effect": "NoSchedule"}]},
        "status": {
            "allocatable": {"nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    return NodeSnapshot.from_body(body)


def _passed_test(name: str, node_name: str) -> TestSnapshot:
    return TestSnapshot.from_body(
        {
            "metadata": {"name": name, "creationTimestamp": "2025-06-01T11:00:00Z"},
            "spec": {"nodeName": node_name, "policyRef": "fleet", "reason": "Join"},
            "status": {
                "phase": "Passed",
                "verdict": "Pass",
                "startTime": "2025-06-01T11:00:00Z",
                "completionTime": "2025-06-01T11:01:00Z",
            },
        }
    )


def test_before_the_workload_pods_have_listed_only_finished_tests_are_decided() -> None:
    """A restart on a big fleet: every kind but the workload Pods has listed. The node
    whose test passed is released at once; a gated node missing from the partial Pod
    copy (it would look idle) is not reserved, and the policy's counts are not written
    from the few nodes decided. Once the Pods are known the same view reserves it."""
    nodes = {"gpu-0": _node_body("gpu-0"), "gpu-1": _testing_node("gpu-1", "gpu-1-t1")}
    view = _view(nodes)
    view.complete = False
    view.workloads_known = False
    view.tests = {"gpu-1": [_passed_test("gpu-1-t1", "gpu-1")]}
    rec, writer = _reconciler()
    rec.offer_urgent(UrgentWork(_policy_body(5), view, frozenset(nodes), NOW))
    rec.serve_offered()
    assert rec.take_unserved() == []
    assert writer.by_node == Counter({"gpu-1": 1}), "gpu-1 released; gpu-0 untouched"
    assert writer.writes["sdctests-create"] == 0
    assert not [k for k in writer.writes if k.startswith("sdcpolicies")]
    assert rec._memory["fleet"].states == {"gpu-1": "Qualified"}

    writer.by_node.clear()
    known = _view({"gpu-0": nodes["gpu-0"]})
    known.complete = False
    rec.offer_urgent(UrgentWork(_policy_body(5), known, frozenset({"gpu-0"}), NOW))
    rec.serve_offered()
    assert writer.writes["sdctests-create"] == 1
    assert writer.by_node == Counter({"gpu-0": 2})  # its test, its reservation


def test_no_stage_of_a_full_pass_keeps_urgent_work_waiting_for_the_whole_fleet() -> None:
    """Every per-node stretch of a full pass (counting the pools, deciding, applying,
    exporting the budgets) serves urgent work at least every 256 nodes or so: counted
    as pool shares read between two checks."""
    from sdcguard.domain.observed import Observed as ObservedClass

    settled = {f"gpu-{i:04d}": _qualified_body(f"gpu-{i:04d}") for i in range(2000)}
    rec, _ = _reconciler()
    rec.run_pass(_policy_body(100), _view(settled), NOW)
    since_check = [0]
    longest = [0]
    serve = rec._serve_urgent
    pool_member = ObservedClass.pool_member

    def counting_pool_member(self: Observed, holding: frozenset[str]) -> PoolMember:
        since_check[0] += 1
        longest[0] = max(longest[0], since_check[0])
        return pool_member(self, holding)

    def checking_serve() -> None:
        since_check[0] = 0
        serve()

    rec._serve_urgent = checking_serve  # type: ignore[method-assign]
    ObservedClass.pool_member = counting_pool_member  # type: ignore[method-assign]
    try:
        rec.run_pass(_policy_body(100), _view(settled), NOW)
    finally:
        ObservedClass.pool_member = pool_member  # type: ignore[method-assign]
    assert 0 < longest[0] <= 2 * 256, f"{longest[0]} nodes between two urgent checks"


def test_the_budget_gauges_tell_the_pools_as_the_pass_left_them() -> None:
    nodes = {f"gpu-{i}": _node_body(f"gpu-{i}") for i in range(6)}
    rec, _ = _reconciler()
    rec.run_pass(_policy_body(2), _view(nodes), NOW)

    def gauge(budget: str) -> float | None:
        return rec.metrics.registry.get_sample_value(
            "sdcguard_budget_in_use", {"policy": "fleet", "pool": "default", "budget": budget}
        )

    # Two reservations written (tests running), four waiting for budget; joiners were
    # never in service, so none is counted as taken out of it.
    assert (gauge("tests"), gauge("unavailable")) == (2, 0)

    # A quarantine is counted as soon as the pass wrote it (not at the next full pass).
    fleet = {f"gpu-{i}": _qualified_body(f"gpu-{i}") for i in range(4)}
    fleet["gpu-3"] = _qualified_body("gpu-3", **{keys.REQUEST_QUARANTINE: "fans"})
    rec, _ = _reconciler()
    rec.run_pass(_policy_body(2), _view(fleet), NOW)
    assert (gauge("tests"), gauge("unavailable")) == (0, 1)


def _expired_body(name: str, product: str, hours: float) -> NodeSnapshot:
    """A qualified node whose qualification is older than maxQualificationAge."""
    qualified_at = keys.format_time(NOW - dt.timedelta(hours=hours))
    labels = {keys.LABEL_STATE: "Qualified", "nvidia.com/gpu.product": product}
    return _body(name, 1, labels, {keys.QUALIFIED_AT: qualified_at}, {})


def _finished(name: str, node_name: str, hours: float, verdict: str) -> TestSnapshot:
    return TestSnapshot.slim(
        {
            "apiVersion": "sdcguard.dev/v1alpha1",
            "kind": "SDCTest",
            "metadata": {"name": name, "resourceVersion": "1"},
            "spec": {"nodeName": node_name, "policyRef": "fleet"},
            "status": {
                "phase": "Passed" if verdict == "Pass" else "Failed",
                "verdict": verdict,
                "completionTime": keys.format_time(NOW - dt.timedelta(hours=hours)),
                "checks": [{"name": "gemm", "verdict": verdict, "catchChance": 0.95}],
            },
        }
    )


def test_a_pass_gives_budget_in_the_risk_order_and_says_why_in_the_status() -> None:
    # Three expired nodes wait for one test slot. Today's order takes the oldest
    # qualification (old-a); the risk order takes the node a training job reported.
    nodes = {
        "old-a": _expired_body("old-a", "A100", 900),
        "reported-h": _expired_body("reported-h", "H100", 400),
        "plain-h": _expired_body("plain-h", "H100", 500),
    }
    history = {
        "seen-a": [_finished("a1", "seen-a", 300, "Pass"), _finished("a2", "seen-a", 10, "Pass")],
        "seen-h": [_finished("h1", "seen-h", 300, "Pass"), _finished("h2", "seen-h", 10, "SDC")],
    }
    for name, product in (("seen-a", "A100"), ("seen-h", "H100")):
        nodes[name] = _expired_body(name, product, 10)  # qualified again since: not due
    view = dataclasses.replace(_view(nodes), tests=history)
    rec, writer = _reconciler()
    rec.risk.reports = lambda: [("reported-h", NOW - dt.timedelta(hours=48))]
    rec.run_pass(_policy_body(1), view, NOW)
    assert writer.writes["sdctests-create"] == 1
    memory = rec._memory["fleet"]
    waiting = {"plain-h", "old-a", "seen-a", "seen-h"}  # the seen ones: back from use
    assert set(memory.waiting) == waiting, "reported-h got the slot"
    first = memory.budget_order[0]
    assert [n.node for n in memory.budget_order][:1] == ["plain-h"]
    assert first.basis == "risk" and first.chance
    assert "type 1/2 failed" in first.reason and "500h ago" in first.reason
    assert memory.overtaken == dict.fromkeys(waiting, 1)
