"""Applying one node's decision: the objects, the node patch, evictions, statuses and
Events, in that order (see :meth:`Executor.apply`)."""

from __future__ import annotations

import datetime as dt
from collections import Counter

import structlog
from kubernetes.client.exceptions import ApiException

from sdcguard.adapters.history import HardwareHistory
from sdcguard.adapters.kube import KubeWriter
from sdcguard.adapters.node_writes import NodePatchStage
from sdcguard.adapters.observe import node_claim
from sdcguard.adapters.pass_state import (
    Expectations,
    FleetView,
    KnownTests,
    LazyDeviceTaints,
    NodeDeletePermission,
)
from sdcguard.adapters.test_runner import TestRunner
from sdcguard.adapters.tickets import RepairTickets
from sdcguard.api import (
    BlastRadius,
    Mode,
    ObjectMeta,
    SDCPolicy,
    SDCTest,
    SDCTestPhase,
    SDCTestSpec,
    SDCTestStatus,
    Suite,
    TicketPhase,
    find_condition,
    set_condition,
    suite_of,
    to_body,
)
from sdcguard.builders.probe_job import job_name
from sdcguard.domain import keys
from sdcguard.domain.decide import Decision
from sdcguard.domain.devicetaints import rule_name, wanted_rules
from sdcguard.domain.echo import bounded
from sdcguard.domain.lifecycle import (
    CancelTest,
    CloseTicket,
    CreateTest,
    CreateTicket,
    EmitEvent,
    NodeState,
    RaiseCycle,
    Retire,
    SetTicketPhase,
    TaintDevices,
    UntaintDevices,
)
from sdcguard.domain.nodepatch import NodePatch
from sdcguard.domain.observed import NodeFacts, NodeSnapshot
from sdcguard.domain.plan import OpenTicketStatus, Stage, Step
from sdcguard.domain.testphase import (
    TestEvent,
    phase_transition,
)
from sdcguard.metrics import Metrics
from sdcguard.settings import Settings

log = structlog.get_logger("sdcguard.reconcile")


class Executor:
    """Applies decisions in the documented order. Of its own it keeps only the nodes
    whose refused deletion it told; what it reads and writes besides goes through its
    collaborators (tickets, tests, the node-patch stage, the hardware's history)."""

    def __init__(
        self,
        writer: KubeWriter,
        settings: Settings,
        metrics: Metrics,
        *,
        known: KnownTests,
        expectations: Expectations,
        runner: TestRunner,
        history: HardwareHistory,
        permission: NodeDeletePermission,
        node_patch: NodePatchStage,
        tickets: RepairTickets,
        device_taints: LazyDeviceTaints,
    ) -> None:
        self.writer = writer
        self.settings = settings
        self.metrics = metrics
        self._known = known
        self._expectations = expectations
        self._runner = runner
        self._history = history
        self._permission = permission
        self._node_patch = node_patch
        self._device_taints = device_taints
        self._tickets = tickets
        self._told_forbidden: set[str] = set()
        """Nodes whose replacement a missing permission refused, told once each."""
        self.drained: set[str] = set()
        """Nodes whose last drain asked every pod it had left to leave: the next pass's
        plan ends the drain (``DrainDone``), and the reconciler forgets the node once its
        deadline is gone."""

    def apply(
        self,
        policy: SDCPolicy,
        decision: Decision,
        view: FleetView,
        now: dt.datetime,
        counts: Counter[str],
    ) -> None:
        """Apply one decision's plan, stage by stage (``domain.plan``):

        1. objects: SDCTests, RepairTickets and their phase changes;
        2. the node patch (labels, annotations, taints, cordon, ownership), one write;
        3. evictions (a drain), so evicted pods find the node tainted and cordoned; an
           eviction error is logged and retried by a later pass, it never undoes 1-2;
           once no pod is left to ask, the next pass's plan ends the drain
           (``DrainDone``: its deadline goes in that pass's node patch);
        4. statuses: a new ticket's workloads are told (a Warning Event to each owner),
           then its Open status is written: a ticket with a status has told them;
        5. the hardware's history (the node patch names it: ``HardwareHistory.restore``);
        6. Events about the node, which only tell what the objects already record;
        7. deleting the Node (replacement, retirement by deletion).

        A crash in between repeats the same decision, and deterministic names make the
        repeat a no-op (an Event about the node may be lost). A ticket the repeat finds
        without a status was created by the interrupted attempt, which told no owner:
        the repeat tells them and writes its status (so does the status restored late,
        ``RepairTickets.restore_status``); an owner may be told twice, never not at all."""
        node_name = decision.node
        body = view.nodes[node_name]
        node = NodeFacts.from_snapshot(
            body, policy.spec.accelerators, policy.spec.budgets.pool_label, policy.spec.dra_classes
        )
        plan = decision.plan
        opened: dict[str, BlastRadius | None] = {}
        for step in plan.stage(Stage.OBJECTS):
            self._apply_object(policy, body, step, view, now, counts, opened)
        patch = self._node_patch.apply(
            node,
            plan.stage(Stage.NODE_PATCH),
            body.resource_version,
            counts,
            enforce=policy.spec.mode == Mode.ENFORCE,
            now=now,
        )
        if plan.stage(Stage.EVICTIONS):
            self._drain(node_name, patch, node, counts)
        told = False
        for step in plan.stage(Stage.STATUSES):
            if isinstance(step, OpenTicketStatus) and step.name in opened:
                radius = opened[step.name]
                if radius is not None and not told:
                    # One incident, one message to each owner (scope Device opens a
                    # ticket per device, all with the node's blast radius): it names
                    # the first.
                    self._tickets.tell_owners(
                        policy.metadata.name, node_name, step.name, radius, now, counts
                    )
                    told = True
                self._tickets.open_status(
                    step.name, step.message, now, cycle=step.cycle, retired=step.retired
                )
        note = patch.annotations.get(keys.HISTORY)
        self._history.apply(view, body, plan.stage(Stage.HISTORY), note, now, counts)
        for step in plan.stage(Stage.EVENTS):
            if isinstance(step, EmitEvent) and (self.settings.routine_events or not step.routine):
                self.writer.event(
                    kind="Node",
                    name=node_name,
                    uid=node.uid or None,
                    reason=step.reason,
                    message=step.message,
                    now=now,
                    warning=step.warning,
                )
        if decision.changed:
            counts[f"to-{decision.state.value.lower()}"] += 1
            if decision.state == NodeState.QUARANTINED:
                self.metrics.quarantines.labels(policy=policy.metadata.name).inc()
            log.info(
                "transition",
                node=node_name,
                previous=decision.previous,
                state=decision.state.value,
                trigger=decision.event,
                note=decision.note,
            )
        if plan.deletes_node:
            self.writer.delete_node(node_name, node_claim(view.nodes.get(node_name)))

    def _apply_object(
        self,
        policy: SDCPolicy,
        body: NodeSnapshot,
        step: Step,
        view: FleetView,
        now: dt.datetime,
        counts: Counter[str],
        opened: dict[str, BlastRadius | None],
    ) -> None:
        """One step of the objects stage; ``opened`` gathers the tickets created, with
        their blast radius, and those an interrupted attempt of this decision created
        without a status (their owners were never told)."""
        node_name = body.name
        match step:
            case CreateTest():
                self._create_test(policy, node_name, step, counts)
            case CancelTest():
                self._cancel_test(view, node_name, step, now, counts)
            case CreateTicket():
                created, radius = self._tickets.create(policy, body, step, view, now, counts)
                seen = None if created else self._tickets.seen(view, node_name, step.name)
                if created:
                    opened[step.name] = radius
                elif seen is None:
                    # It exists, and the copy has not seen it yet: an interrupted attempt
                    # of this decision created it a moment ago (its name is the
                    # decision's), before its owners were told and its status written,
                    # or, rarely, after. Told and written now: an owner may be told
                    # twice, never not at all (waiting for restore_status's grace would
                    # leave them untold for half a minute).
                    opened[step.name] = radius
                    counts["tickets-resumed"] += 1
                elif not seen.has_status and seen.ticket is not None:
                    opened[step.name] = seen.ticket.spec.blast_radius
                    counts["tickets-resumed"] += 1
            case SetTicketPhase(phase=phase, name=name, message=message):
                self._tickets.set_phase(view, node_name, name, phase, message, now)
            case CloseTicket(name=name, message=message):
                self._tickets.set_phase(view, node_name, name, TicketPhase.CLOSED, message, now)
            case RaiseCycle():
                self._tickets.raise_cycle(view, node_name, step, now)
            case Retire(name=name) if name:
                self._tickets.set_phase(view, node_name, name, TicketPhase.RETIRED, "retired", now)
            case Retire():
                pass
            case TaintDevices():
                self._taint_devices(policy, node_name, step, view, counts)
            case UntaintDevices(devices=devices):
                names = [rule_name(node_name, d.key) for d in devices] if devices else None
                plan = self._device_taints.get().ensure(node_name, [], prune=True, only=names)
                counts["device-rules-deleted"] += len(plan.delete)
            case _:
                raise ValueError(f"{type(step).__name__} is not a node decision's object step")

    def refused_delete(
        self, policy: SDCPolicy, decision: Decision, view: FleetView, now: dt.datetime
    ) -> bool:
        """A decision that deletes the Node while the operator may not delete Nodes is
        not applied at all (the node stays as it is, its ticket too); told once per node
        in a log line and a Warning Event that name the chart value to set."""
        if not decision.plan.deletes_node or self._permission.allowed(now) is not False:
            self._told_forbidden.discard(decision.node)
            return False
        node = decision.node
        if node not in self._told_forbidden:
            self._told_forbidden.add(node)
            message = (
                f"{node} was not deleted for replacement: the operator may not delete Nodes "
                "(install the chart with rbac.allowNodeDelete=true); it stays "
                f"{decision.previous.value if decision.previous else 'as it is'}"
            )
            log.error(
                "node delete forbidden; decision not applied",
                node=node,
                policy=policy.metadata.name,
                chart_value="rbac.allowNodeDelete=true",
            )
            seen = view.nodes.get(node)
            uid = seen.uid if seen is not None else None
            self.writer.event(
                kind="Node",
                name=node,
                uid=uid or None,
                reason="NodeDeleteForbidden",
                message=message,
                now=now,
                warning=True,
            )
        return True

    def _drain(
        self, node_name: str, patch: NodePatch, node: NodeFacts, counts: Counter[str]
    ) -> None:
        """Evict the node's pods; once none is left to ask, the node is noted as drained
        (the next pass's plan ends the drain)."""
        self.drained.discard(node_name)  # only this attempt's answer counts
        try:
            result = self.writer.evict_pods_on_node(
                node_name, skip_namespaces=(self.settings.namespace,)
            )
        except Exception as exc:  # the list failed: a later pass (DrainDue) asks again
            counts["drain-errors"] += 1
            log.warning(
                "drain failed; retrying", node=node_name, error=f"{type(exc).__name__}: {exc}"
            )
            return
        counts["pods-evicted"] += result.asked
        counts["pods-eviction-refused"] += result.blocked
        pending = patch.annotations.get(keys.DRAIN_UNTIL, node.annotations.get(keys.DRAIN_UNTIL))
        if not result.done:
            log.info(
                "drain incomplete; retrying",
                node=node_name,
                refused=result.blocked,
                failed=result.failed,
                until=pending,
            )
        elif pending is not None:
            # Nothing is left to evict: the next pass ends the drain in its plan
            # (``DrainDone``), or every later pass would drain again until it ran out.
            self.drained.add(node_name)

    def _cancel_test(
        self,
        view: FleetView,
        node_name: str,
        action: CancelTest,
        now: dt.datetime,
        counts: Counter[str],
    ) -> None:
        """The test ends as Cancelled (no verdict), and its probe Job goes."""
        for body in view.tests.get(node_name, []):
            known = self._known.read(body, node_name)
            if known is None or known.name != action.name or known.running is None:
                continue
            test = known.running
            written = self._expectations.written_test(
                test.metadata.name, test.metadata.resource_version or ""
            )
            test = written or test
            current = (test.status or SDCTestStatus()).phase
            if current.finished:
                continue
            row = phase_transition(current, TestEvent.CANCELLED)  # WriteStatus, DeleteJob
            status = (test.status or SDCTestStatus()).model_copy(
                update={
                    "phase": row.target,
                    "reason": "Cancelled",
                    "message": bounded(action.message, 4096),
                    "completion_time": now,
                    "conditions": set_condition(
                        (test.status or SDCTestStatus()).conditions,
                        "Complete",
                        "True",
                        "Cancelled",
                        bounded(action.message),
                        now,
                    ),
                }
            )
            self._runner.write_status(test, status)
            self.writer.delete_job(self.settings.namespace, job_name(test.metadata.name))
            counts["tests-cancelled"] += 1
            self.metrics.tests.labels(
                suite=suite_of(test).value, phase=SDCTestPhase.CANCELLED.value
            ).inc()
            log.info("test cancelled", test=test.metadata.name, node=node_name)

    def _create_test(
        self, policy: SDCPolicy, node: str, action: CreateTest, counts: Counter[str]
    ) -> None:
        test = SDCTest(
            metadata=ObjectMeta(name=action.name, labels={keys.LABEL_NODE: node[:63]}),
            spec=SDCTestSpec(
                node_name=node,
                policy_ref=policy.metadata.name,
                suite=action.suite or Suite.REQUALIFICATION,
                reason=action.reason,
                attempt=action.attempt,
                ticket_ref=action.ticket,
            ),
        )
        body = to_body(test)
        created = self.writer.create_custom("sdctests", body)
        counts["tests-created" if created is not None else "tests-existed"] += 1

    def _taint_devices(
        self,
        policy: SDCPolicy,
        node: str,
        action: TaintDevices,
        view: FleetView,
        counts: Counter[str],
    ) -> None:
        """Write (or correct) one DeviceTaintRule per device; a device found under a new
        name or pool in the node's ResourceSlices (a driver restart) is selected there."""
        published = self._device_taints.get().node_devices(node)
        wanted = [
            rule
            for i, device in enumerate(action.devices)
            for rule in wanted_rules(
                node, action.ticket_of(i), action.reason, action.effect, [device], published
            )
        ]
        plan = self._device_taints.get().ensure(node, wanted, prune=False)
        counts["device-rules-created"] += len(plan.create)
        counts["device-rules-updated"] += len(plan.update)
        if plan.conflicts:
            counts["device-rules-conflict"] += len(plan.conflicts)

    def test_waiting(self, test: SDCTest, decision: Decision, now: dt.datetime) -> None:
        """An unfinished SDCTest's Waiting condition: True, with the reason and why, on
        the test the node's wait holds back; False again on it once it stops waiting.
        Written only when it changes."""
        status = test.status or SDCTestStatus()
        previous = find_condition(status.conditions, "Waiting")
        wait = decision.wait if decision.waiting_test == test.metadata.name else None
        if wait is None:
            if previous is None or previous.status == "False":
                return
            conditions = set_condition(
                status.conditions, "Waiting", "False", "NotWaiting", "nothing holds it back", now
            )
        else:
            reason, waiting = wait.reason.value, wait.message
            if previous is not None and (previous.status, previous.reason, previous.message) == (
                "True",
                reason,
                waiting,
            ):
                return
            conditions = set_condition(status.conditions, "Waiting", "True", reason, waiting, now)
        try:
            self._runner.write_status(test, status.model_copy(update={"conditions": conditions}))
        except ApiException as exc:  # the next pass writes it again
            log.warning("test condition not written", test=test.metadata.name, status=exc.status)
