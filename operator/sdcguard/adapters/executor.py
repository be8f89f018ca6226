"""Applying one node's decision: the objects, the node patch, evictions, statuses and
Events, in that order (see :meth:`Executor.apply`)."""

from __future__ import annotations

import datetime as dt
from collections import Counter

import structlog
from kubernetes.client.exceptions import ApiException

from sdcguard.adapters import hardware
from sdcguard.adapters.history import HardwareHistory
from sdcguard.adapters.kube import KubeWriter
from sdcguard.adapters.node_writes import NodePatchStage, annotation_plan
from sdcguard.adapters.observe import TicketSnapshot, node_claim
from sdcguard.adapters.pass_state import (
    TICKET_STATUS_GRACE,
    Expectations,
    FleetView,
    KnownTests,
    LazyDeviceTaints,
    NodeDeletePermission,
)
from sdcguard.adapters.test_runner import TestRunner
from sdcguard.adapters.workload_record import WorkloadBook
from sdcguard.api import (
    BlastRadius,
    Finding,
    HardwareIdentity,
    HistoryEntry,
    ObjectMeta,
    QuarantinedDevice,
    RepairTicket,
    RepairTicketSpec,
    RepairTicketStatus,
    Resolution,
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
    to_patch,
)
from sdcguard.builders.probe_job import job_name
from sdcguard.domain import keys
from sdcguard.domain.blast import owner_message
from sdcguard.domain.decide import Decision, closes_as_replaced, node_gone_closing, wait_reason
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
from sdcguard.domain.observed import NodeFacts, NodeSnapshot, TicketFacts
from sdcguard.domain.plan import OpenTicketStatus, Stage, Step
from sdcguard.domain.testphase import (
    TestEvent,
    phase_transition,
)
from sdcguard.metrics import Metrics
from sdcguard.settings import Settings

log = structlog.get_logger("sdcguard.reconcile")


class Executor:
    """Applies decisions in the documented order. Of its own it keeps the tickets it
    closed as Replaced (until the watch brings them back) and the nodes whose refused
    deletion it told; what it reads and writes besides goes through its collaborators."""

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
        workloads: WorkloadBook | None = None,
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
        self.device_taints = LazyDeviceTaints(writer)
        self.workloads = workloads
        """Every node's workload record: a quarantine's ticket carries its blast radius
        (handed in once the inventory keeps them)."""
        self._replaced: dict[str, str | None] = {}
        """Tickets closed as Replaced, with the resourceVersion they had (until it moves)."""
        self._told_forbidden: set[str] = set()
        """Nodes whose replacement a missing permission refused, told once each."""

    def prune(self, view: FleetView) -> None:
        """Forget the tickets the view no longer has (full passes only)."""
        tickets = {t.name for snapshots in view.tickets.values() for t in snapshots}
        for name in [n for n in self._replaced if n not in tickets]:
            del self._replaced[name]

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
           once no pod is left to ask, the drain's deadline goes (a plan of one
           annotation step, written by the node-patch stage like every Node write);
        4. statuses: a new ticket's workloads are told (a Warning Event to each owner),
           then its Open status is written: a ticket with a status has told them;
        5. the hardware's history (the node patch names it: ``HardwareHistory.restore``);
        6. Events about the node, which only tell what the objects already record;
        7. deleting the Node (replacement, retirement by deletion).

        A crash in between repeats the same decision, and deterministic names make the
        repeat a no-op (an Event about the node may be lost). A ticket the repeat finds
        without a status was created by the interrupted attempt, which told no owner:
        the repeat tells them and writes its status (so does the status restored late,
        :meth:`restore_ticket_status`); an owner may be told twice, never not at all."""
        node_name = decision.node
        body = view.nodes[node_name]
        node = NodeFacts.from_snapshot(
            body, policy.spec.accelerators, policy.spec.budgets.pool_label
        )
        plan = decision.plan
        opened: dict[str, BlastRadius | None] = {}
        for step in plan.stage(Stage.OBJECTS):
            self._apply_object(policy, body, step, view, now, counts, opened)
        patch = self._node_patch.apply(
            node, plan.stage(Stage.NODE_PATCH), body.resource_version, counts
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
                    self._tell_owners(
                        policy.metadata.name, node_name, step.name, radius, now, counts
                    )
                    told = True
                self._open_ticket_status(
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
                created, radius = self._create_ticket(policy, body, step, view, now, counts)
                if created:
                    opened[step.name] = radius
                else:
                    seen = self._seen_ticket(view, node_name, step.name)
                    if seen is not None and not seen.has_status and seen.ticket is not None:
                        opened[step.name] = seen.ticket.spec.blast_radius
                        counts["tickets-resumed"] += 1
            case SetTicketPhase(phase=phase, name=name, message=message):
                self._ticket_status(view, node_name, name, phase, message, now)
            case CloseTicket(name=name, message=message):
                self._ticket_status(view, node_name, name, TicketPhase.CLOSED, message, now)
            case RaiseCycle():
                self._raise_cycle(view, node_name, step, now)
            case Retire(name=name) if name:
                self._ticket_status(view, node_name, name, TicketPhase.RETIRED, "retired", now)
            case Retire():
                pass
            case TaintDevices():
                self._taint_devices(policy, node_name, step, view, counts)
            case UntaintDevices(devices=devices):
                names = [rule_name(node_name, d.key) for d in devices] if devices else None
                plan = self.device_taints.get().ensure(node_name, [], prune=True, only=names)
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
        """Evict the node's pods; once none is left to ask, the drain's deadline goes."""
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
            # Nothing is left to evict: the drain's deadline goes (a follow-up plan of
            # the evictions stage, written by the node-patch stage), or every later pass
            # would drain again until it ran out.
            self._node_patch.annotate(node_name, annotation_plan([(keys.DRAIN_UNTIL, None)]))

    def close_node_gone(
        self,
        policy: SDCPolicy,
        view: FleetView,
        node_name: str,
        now: dt.datetime,
        counts: Counter[str],
    ) -> None:
        """Close the unfinished tickets of a deleted node: as Replaced when sdcguard
        deleted it for replacement, with the true reason when someone else did."""
        for seen in view.tickets.get(node_name, []):
            ticket = seen.ticket
            if ticket is None or ticket.spec.policy_ref != policy.metadata.name:
                continue
            facts = TicketFacts.from_api(ticket)
            message = node_gone_closing(facts, policy.spec, node_name)
            if message is None:
                continue
            replaced = closes_as_replaced(facts, policy.spec, False)
            name = ticket.metadata.name
            if self._replaced.get(name) == ticket.metadata.resource_version:
                continue  # closed already; the watch has not brought it back yet
            try:
                if replaced and ticket.spec.resolution is None:
                    spec = ticket.spec.model_copy(update={"resolution": Resolution.REPLACED})
                    self.writer.patch_custom(
                        "repairtickets", name, {"spec": to_patch(spec, "resolution")}
                    )
                self._ticket_status(view, node_name, name, TicketPhase.CLOSED, message, now)
            except ApiException as exc:
                counts[f"ticket-close-error-{exc.status}"] += 1
                continue
            self._replaced[name] = ticket.metadata.resource_version
            if replaced:
                counts["tickets-replaced"] += 1
                log.info("ticket closed: node replaced", ticket=name, node=node_name)
            else:
                counts["tickets-node-gone"] += 1
                log.info("ticket closed: node deleted by others", ticket=name, node=node_name)

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

    def _create_ticket(
        self,
        policy: SDCPolicy,
        node_body: NodeSnapshot,
        action: CreateTicket,
        view: FleetView,
        now: dt.datetime,
        counts: Counter[str],
    ) -> tuple[bool, BlastRadius | None]:
        """Create the ticket, with the node's blast radius; False when it existed (its
        status is then left alone)."""
        evidence = list(dict.fromkeys(action.evidence))
        name = node_body.name
        quarantine = action.quarantine
        findings = self._findings(view, name, evidence)
        if quarantine is not None and quarantine.scope == "Device" and quarantine.devices:
            # A device's ticket: the findings that name its device, by UUID where the
            # tests reported UUIDs (the index can differ between tests), else by index.
            findings = self._device_findings(view, name, findings, quarantine.devices)
        identity = hardware.node_identity(node_body, view.id_holders(node_body))
        tests = self._known.judged(view, name, self._expectations)
        devices = next(
            (
                tests[t].device_ids
                for t in reversed(evidence)
                if t in tests and any(tests[t].device_ids)
            ),
            (),
        )
        radius = None
        if self.workloads is not None:
            radius = self.workloads.blast_radius(name, _second(now))
        ticket = RepairTicket(
            metadata=ObjectMeta(name=action.name, labels={keys.LABEL_NODE: name[:63]}),
            spec=RepairTicketSpec(
                node_name=name,
                policy_ref=policy.metadata.name,
                hardware=HardwareIdentity.model_validate(
                    {
                        "providerID": node_body.provider_id or None,
                        "systemUUID": node_body.system_uuid or None,
                        "machineID": node_body.machine_id or None,
                        # Scope Device: the tainted GPUs; otherwise every device the
                        # probe named.
                        "deviceIDs": [d.uuid for d in quarantine.devices if d.uuid]
                        if quarantine and quarantine.devices
                        else list(dict.fromkeys(d for d in devices if d))[:64],
                        "untrusted": [u.model_dump(by_alias=True) for u in identity.untrusted],
                        "records": list(identity.records),
                        "cyclesBefore": action.before,
                    }
                ),
                evidence=evidence,
                findings=findings,
                blast_radius=radius,
                quarantine=quarantine,
            ),
        )
        body = to_body(ticket)
        created = self.writer.create_custom("repairtickets", body)
        if created is None:
            counts["tickets-existed"] += 1
            return False, None
        counts["tickets-created"] += 1
        return True, radius

    def _tell_owners(
        self,
        policy: str,
        node: str,
        ticket: str,
        radius: BlastRadius,
        now: dt.datetime,
        counts: Counter[str],
    ) -> None:
        """A Warning Event to each affected workload, in its namespace (needs ``create
        events`` there: a refusal is logged, and the ticket records the workloads anyway)."""
        self.metrics.blast_radius_workloads.labels(policy=policy).inc(len(radius.workloads))
        for workload in radius.workloads:
            self.writer.event(
                kind=workload.kind,
                name=workload.name,
                uid=workload.uid,
                api_version=workload.api_version,
                namespace=workload.namespace,
                namespaced=True,
                reason="SDCBlastRadius",
                message=owner_message(node, radius, workload, ticket),
                now=now,
                warning=True,
            )
            counts["blast-radius-events"] += 1

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
        published = self.device_taints.get().node_devices(node)
        wanted = [
            rule
            for i, device in enumerate(action.devices)
            for rule in wanted_rules(
                node, action.ticket_of(i), action.reason, action.effect, [device], published
            )
        ]
        plan = self.device_taints.get().ensure(node, wanted, prune=False)
        counts["device-rules-created"] += len(plan.create)
        counts["device-rules-updated"] += len(plan.update)
        if plan.conflicts:
            counts["device-rules-conflict"] += len(plan.conflicts)

    def _device_findings(
        self,
        view: FleetView,
        node: str,
        findings: list[Finding],
        devices: list[QuarantinedDevice],
    ) -> list[Finding]:
        """The findings that name one of ``devices``."""
        tests = self._known.judged(view, node, self._expectations)
        uuids = {d.uuid.lower() for d in devices if d.uuid}
        indices = {d.index for d in devices if d.index is not None}

        def names_device(finding: Finding) -> bool:
            if finding.odd_device is None:
                return False
            ids = tests[finding.test].device_ids if finding.test in tests else ()
            if any(ids) and uuids:
                known = ids[finding.odd_device] if finding.odd_device < len(ids) else ""
                return known.lower() in uuids
            return finding.odd_device in indices

        return [f for f in findings if names_device(f)]

    def _findings(self, view: FleetView, node: str, evidence: list[str]) -> list[Finding]:
        """Where the evidence tests' failed checks located the fault, in evidence order."""
        by_name = self._known.judged(view, node, self._expectations)
        found = [f for name in evidence if name in by_name for f in by_name[name].findings]
        return found[:64]

    def _open_ticket_status(
        self,
        name: str,
        message: str,
        now: dt.datetime,
        *,
        cycle: int = 1,
        retired: bool = False,
    ) -> None:
        """A new ticket's first status: Open at the repair cycle it begins; Retired at
        once (closed) when the hardware has no cycle left."""
        at = _second(now)
        status = _opened(at, cycle, message)
        if retired:
            why = f"retired: repair cycle {cycle} is past the policy's maxRepairCycles"
            retire = HistoryEntry(time=at, phase=TicketPhase.RETIRED, message=why)
            status = status.model_copy(
                update={
                    "phase": TicketPhase.RETIRED,
                    "closed_at": at,
                    "history": [*status.history, retire],
                }
            )
        fields = ["phase", "cycle", "opened_at", "history"] + (["closed_at"] if retired else [])
        self.writer.patch_custom_status("repairtickets", name, to_patch(status, *fields))

    def restore_ticket_status(
        self,
        tickets: list[TicketSnapshot],
        now: dt.datetime,
        counts: Counter[str],
        retired: bool = False,
    ) -> None:
        """A ticket whose status never came (the operator died between creating it and
        writing its status, which follows the taint) gets it, dated at its creation, at
        the repair cycle it began (its hardware's earlier cycles plus one); ``retired``:
        the node was retired by the same decision (a ticket born Retired). Its owners
        were never told (they are told before the status is written): they are told
        now, once per incident (the tickets of one incident share its blast radius)."""
        told: list[BlastRadius] = []
        for seen in tickets:
            created = seen.created
            if seen.has_status or created is None or now - created < TICKET_STATUS_GRACE:
                continue
            message = "opened (status written after an interruption)"
            spec = seen.ticket.spec if seen.ticket else None
            radius = spec.blast_radius if spec else None
            if spec is not None and radius is not None and radius not in told:
                policy = spec.policy_ref or ""
                self._tell_owners(policy, seen.node_name, seen.name, radius, now, counts)
                told.append(radius)
            before = spec.hardware.cycles_before if spec else 0
            self._open_ticket_status(seen.name, message, created, cycle=before + 1, retired=retired)
            counts["ticket-status-restored"] += 1

    def _seen_ticket(self, view: FleetView, node: str, name: str) -> TicketSnapshot | None:
        for seen in view.tickets.get(node, []):
            if seen.name == name:
                return seen
        return None

    def _ticket(self, view: FleetView, node: str, name: str) -> RepairTicket | None:
        seen = self._seen_ticket(view, node, name)
        return seen.ticket if seen is not None else None

    def _ticket_status(
        self,
        view: FleetView,
        node: str,
        name: str,
        phase: TicketPhase,
        message: str,
        now: dt.datetime,
    ) -> None:
        ticket = self._ticket(view, node, name)
        status = ticket.status if ticket and ticket.status else None
        if status is not None and status.phase == phase:
            return
        fields = ["phase", "history"]
        if status is None and ticket is not None:
            # Its Open status never came (the node patch after its creation conflicted,
            # or the operator died there) and a later phase comes first: the history
            # still begins where the ticket opened, at the cycle it began.
            opened = ticket.metadata.creation_timestamp or _second(now)
            cycle = ticket.spec.hardware.cycles_before + 1
            status = _opened(opened, cycle, "opened (status written late)")
            fields += ["cycle", "opened_at"]
        entry = HistoryEntry(time=_second(now), phase=phase, message=bounded(message))
        history = [*(status.history if status else []), entry][-256:]
        new = (status or RepairTicketStatus()).model_copy(
            update={"phase": phase, "history": history, "closed_at": _second(now)}
        )
        if phase in (TicketPhase.CLOSED, TicketPhase.RETIRED):
            fields.append("closed_at")
        self.writer.patch_custom_status("repairtickets", name, to_patch(new, *fields))

    def ticket_waiting(
        self, view: FleetView, node: str, name: str, waiting: str | None, now: dt.datetime
    ) -> None:
        """The ticket's Waiting condition says why the node's next step waits (node not
        Ready, breaker, back-off); written only when it changes."""
        ticket = self._ticket(view, node, name)
        if ticket is None:
            return
        conditions = ticket.status.conditions if ticket.status else []
        previous = find_condition(conditions, "Waiting")
        if waiting is None:
            if previous is None or previous.status == "False":
                return
            updated = set_condition(conditions, "Waiting", "False", "NotWaiting", "", now)
        else:
            if previous is not None and previous.status == "True" and previous.message == waiting:
                return
            updated = set_condition(
                conditions, "Waiting", "True", wait_reason(waiting), waiting, now
            )
        new = (ticket.status or RepairTicketStatus()).model_copy(update={"conditions": updated})
        try:
            self.writer.patch_custom_status("repairtickets", name, to_patch(new, "conditions"))
        except ApiException as exc:  # the next pass writes it again
            log.warning("ticket condition not written", ticket=name, status=exc.status)

    def test_waiting(self, test: SDCTest, decision: Decision, now: dt.datetime) -> None:
        """An unfinished SDCTest's Waiting condition: True, with the reason and why, on
        the test the node's wait holds back; False again on it once it stops waiting.
        Written only when it changes."""
        status = test.status or SDCTestStatus()
        previous = find_condition(status.conditions, "Waiting")
        waiting = decision.waiting if decision.waiting_test == test.metadata.name else None
        if waiting is None:
            if previous is None or previous.status == "False":
                return
            conditions = set_condition(
                status.conditions, "Waiting", "False", "NotWaiting", "nothing holds it back", now
            )
        else:
            reason = wait_reason(waiting)
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

    def _raise_cycle(
        self, view: FleetView, node: str, action: RaiseCycle, now: dt.datetime
    ) -> None:
        ticket = self._ticket(view, node, action.name)
        if ticket is None or (action.test and action.test in ticket.spec.evidence):
            return
        evidence = [*ticket.spec.evidence, action.test] if action.test else ticket.spec.evidence
        findings = [*ticket.spec.findings, *self._findings(view, node, [action.test])][-64:]
        spec = ticket.spec.model_copy(
            update={
                "evidence": evidence,
                "findings": findings,
                "resolution": None,
                "resolution_note": None,
            }
        )
        fields = ("evidence", "findings", "resolution", "resolution_note")
        self.writer.patch_custom("repairtickets", action.name, {"spec": to_patch(spec, *fields)})
        status = ticket.status or RepairTicketStatus()
        cycle = status.cycle + 1
        message = f"repair cycle {cycle}: verification {action.test} failed"
        entry = HistoryEntry(time=_second(now), phase=TicketPhase.OPEN, message=message)
        new = status.model_copy(
            update={
                "phase": TicketPhase.OPEN,
                "cycle": cycle,
                "history": [*status.history, entry][-256:],
            }
        )
        self.writer.patch_custom_status(
            "repairtickets", action.name, to_patch(new, "phase", "cycle", "history")
        )


def _second(now: dt.datetime) -> dt.datetime:
    """``now`` in UTC to the second, as Kubernetes writes times."""
    return now.astimezone(dt.UTC).replace(microsecond=0)


def _opened(at: dt.datetime, cycle: int, message: str) -> RepairTicketStatus:
    """A ticket's status as it opens: Open at ``at``, at repair cycle ``cycle``."""
    entry = HistoryEntry(time=at, phase=TicketPhase.OPEN, message=bounded(message))
    return RepairTicketStatus(
        phase=TicketPhase.OPEN, cycle=max(1, cycle), opened_at=at, history=[entry]
    )
