"""Applying one node's decision: the objects, the node patch, evictions, statuses and
Events, in that order (see :meth:`Executor.apply`)."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Mapping
from typing import Any

import structlog
from kubernetes.client.exceptions import ApiException

from sdcguard.adapters.observe import node_claim
from sdcguard.adapters.pass_state import (
    TICKET_STATUS_GRACE,
    FleetView,
    _rv,
)
from sdcguard.adapters.test_runner import TestRunner
from sdcguard.api import (
    Finding,
    HardwareIdentity,
    ObjectMeta,
    RepairTicket,
    RepairTicketSpec,
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
    to_body,
)
from sdcguard.builders.probe_job import job_name
from sdcguard.domain import keys
from sdcguard.domain.decide import Decision, closes_as_replaced, node_gone_closing
from sdcguard.domain.echo import bounded
from sdcguard.domain.lifecycle import (
    CancelTest,
    CloseTicket,
    CreateTest,
    CreateTicket,
    DeleteNode,
    Drain,
    EmitEvent,
    NodeState,
    RaiseCycle,
    Retire,
    SetTicketPhase,
)
from sdcguard.domain.nodepatch import NodePatch, plan_node_patch
from sdcguard.domain.observed import NodeFacts, TestFacts, TicketFacts
from sdcguard.domain.testphase import (
    TestEvent,
    phase_transition,
)

log = structlog.get_logger("sdcguard.reconcile")


class Executor(TestRunner):
    """Applies decisions in the documented order."""

    def apply(
        self,
        policy: SDCPolicy,
        decision: Decision,
        view: FleetView,
        now: dt.datetime,
        counts: Counter[str],
    ) -> None:
        """Apply one decision in this order:

        1. objects: SDCTests, RepairTickets and their phase changes;
        2. the node patch (labels, annotations, taints, cordon, ownership), one write;
        3. evictions (a drain), so evicted pods find the node tainted and cordoned; an
           eviction error is logged and retried by a later pass, it never undoes 1-2;
        4. statuses: a new ticket's Open status;
        5. Events, which only tell what the objects already record;
        6. deleting the Node (replacement, retirement by deletion).

        A crash in between repeats the same decision, and deterministic names make the
        repeat a no-op (an Event may be lost)."""
        node_name = decision.node
        body = view.nodes[node_name]
        node = NodeFacts.from_body(body, policy.spec.accelerators, policy.spec.budgets.pool_label)
        delete_node = False
        drain = False
        events: list[EmitEvent] = []
        opened: list[CreateTicket] = []
        for action in decision.actions:
            if isinstance(action, CreateTest):
                self._create_test(policy, node_name, action, counts)
            elif isinstance(action, CancelTest):
                self._cancel_test(view, node_name, action, now, counts)
            elif isinstance(action, CreateTicket):
                if self._create_ticket(policy, body, action, view, counts):
                    opened.append(action)
            elif isinstance(action, SetTicketPhase):
                self._ticket_status(view, node_name, action.name, action.phase, action.message, now)
            elif isinstance(action, CloseTicket):
                self._ticket_status(
                    view, node_name, action.name, TicketPhase.CLOSED, action.message, now
                )
            elif isinstance(action, RaiseCycle):
                self._raise_cycle(view, node_name, action, now)
            elif isinstance(action, Retire):
                if action.name:
                    self._ticket_status(
                        view, node_name, action.name, TicketPhase.RETIRED, "retired", now
                    )
                delete_node = delete_node or action.delete_node
            elif isinstance(action, EmitEvent):
                if self.settings.routine_events or not action.routine:
                    events.append(action)
            elif isinstance(action, Drain):
                drain = True
            elif isinstance(action, DeleteNode):
                delete_node = True
        patch = plan_node_patch(node, decision.actions)
        if not patch.empty:
            rv = str(body["metadata"].get("resourceVersion", ""))
            self.writer.patch_node(node_name, patch.body(rv))
            self.expect_nodes[node_name] = rv
            counts["node-patches"] += 1
        if drain:
            self._drain(node_name, patch, node, counts)
        # A new ticket's status (Open, its history) after the taint: the ticket itself,
        # created before the patch, is the record of why (a ticket without a status
        # reads as Open), so the quarantine waits for one write less.
        for ticket in opened:
            self._open_ticket_status(ticket, now)
        # Events last: they only tell; the objects and the node already say it all.
        for event in events:
            self.writer.event(
                kind="Node",
                name=node_name,
                uid=node.uid or None,
                reason=event.reason,
                message=event.message,
                now=now,
                warning=event.warning,
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
        if delete_node:
            self.writer.delete_node(node_name, node_claim(view.nodes.get(node_name)))

    def refused_delete(
        self, policy: SDCPolicy, decision: Decision, view: FleetView, now: dt.datetime
    ) -> bool:
        """A decision that deletes the Node while the operator may not delete Nodes is
        not applied at all (the node stays as it is, its ticket too); told once per node
        in a log line and a Warning Event that name the chart value to set."""
        deletes = any(
            isinstance(a, DeleteNode) or (isinstance(a, Retire) and a.delete_node)
            for a in decision.actions
        )
        if not deletes or self.node_delete_allowed(now) is not False:
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
            uid = (view.nodes.get(node) or {}).get("metadata", {}).get("uid")
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
            self.writer.patch_node(
                node_name, {"metadata": {"annotations": {keys.DRAIN_UNTIL: None}}}
            )

    def _close_node_gone(
        self,
        policy: SDCPolicy,
        view: FleetView,
        node_name: str,
        now: dt.datetime,
        counts: Counter[str],
    ) -> None:
        """Close the unfinished tickets of a deleted node: as Replaced when sdcguard
        deleted it for replacement, with the true reason when someone else did."""
        for body in view.tickets.get(node_name, []):
            ticket = self._ticket_obj(body)
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
                    self.writer.patch_custom(
                        "repairtickets", name, {"spec": {"resolution": Resolution.REPLACED.value}}
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
            known = self._test(body, node_name)
            if known is None or known.name != action.name or known.running is None:
                continue
            test = known.running
            expected = self.expect_tests.get(test.metadata.name)
            if expected is not None and expected[0] == test.metadata.resource_version:
                test = expected[1]
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
            self._write_test_status(test, status)
            self.writer.delete_job(self.settings.namespace, job_name(test.metadata.name))
            counts["tests-cancelled"] += 1
            self.metrics.tests.labels(
                suite=test.spec.suite.value, phase=SDCTestPhase.CANCELLED.value
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
        node_body: Mapping[str, Any],
        action: CreateTicket,
        view: FleetView,
        counts: Counter[str],
    ) -> bool:
        """Create the ticket; False when it existed (its status is then left alone)."""
        evidence = list(dict.fromkeys(action.evidence))
        findings = self._findings(view, str(node_body["metadata"]["name"]), evidence)
        meta, spec = node_body["metadata"], node_body["spec"]
        ticket = RepairTicket(
            metadata=ObjectMeta(name=action.name, labels={keys.LABEL_NODE: meta["name"][:63]}),
            spec=RepairTicketSpec(
                node_name=meta["name"],
                policy_ref=policy.metadata.name,
                hardware=HardwareIdentity.model_validate(
                    {
                        "providerID": spec.get("providerID") or None,
                        "systemUUID": (node_body["status"].get("nodeInfo") or {}).get("systemUUID")
                        or None,
                    }
                ),
                evidence=evidence,
                findings=findings,
            ),
        )
        body = to_body(ticket)
        created = self.writer.create_custom("repairtickets", body)
        if created is None:
            counts["tickets-existed"] += 1
            return False
        counts["tickets-created"] += 1
        return True

    def _findings(self, view: FleetView, node: str, evidence: list[str]) -> list[Finding]:
        """Where the evidence tests' failed checks located the fault, in evidence order."""
        by_name: dict[str, TestFacts] = {}
        for body in view.tests.get(node, []):
            known = self._test(body, node)
            if known is None:
                continue
            facts = known.facts
            written = self.expect_tests.get(known.name)
            if written is not None and written[0] == _rv(body):
                facts = TestFacts.from_api(written[1])  # judged in this pass, not back yet
            by_name[known.name] = facts
        found = [f for name in evidence if name in by_name for f in by_name[name].findings]
        return found[:64]

    def _open_ticket_status(self, action: CreateTicket, now: dt.datetime) -> None:
        status = {
            "phase": TicketPhase.OPEN.value,
            "cycle": 1,
            "openedAt": keys.format_time(now),
            "history": [
                {"time": keys.format_time(now), "phase": "Open", "message": bounded(action.message)}
            ],
        }
        self.writer.patch_custom_status("repairtickets", action.name, status)

    def _restore_ticket_status(
        self, bodies: list[dict[str, Any]], now: dt.datetime, counts: Counter[str]
    ) -> None:
        """A ticket whose status never came (the operator died between creating it and
        writing its status, which follows the taint) gets it, dated at its creation."""
        for body in bodies:
            meta = body.get("metadata") or {}
            created = keys.parse_time(meta.get("creationTimestamp"))
            if body.get("status") or created is None or now - created < TICKET_STATUS_GRACE:
                continue
            message = "opened (status written after an interruption)"
            self._open_ticket_status(CreateTicket(str(meta.get("name", "")), (), message), created)
            counts["ticket-status-restored"] += 1

    def _ticket(self, view: FleetView, node: str, name: str) -> RepairTicket | None:
        for body in view.tickets.get(node, []):
            if body.get("metadata", {}).get("name") == name:
                return self._ticket_obj(body)
        return None

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
        history = [to_body(h) for h in (status.history if status else [])]
        history.append(
            {"time": keys.format_time(now), "phase": phase.value, "message": bounded(message)}
        )
        patch: dict[str, Any] = {"phase": phase.value, "history": history[-256:]}
        if phase in (TicketPhase.CLOSED, TicketPhase.RETIRED):
            patch["closedAt"] = keys.format_time(now)
        self.writer.patch_custom_status("repairtickets", name, patch)

    def _ticket_waiting(
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
            updated = set_condition(conditions, "Waiting", "True", "Waiting", waiting, now)
        try:
            self.writer.patch_custom_status(
                "repairtickets", name, {"conditions": [to_body(c) for c in updated]}
            )
        except ApiException as exc:  # the next pass writes it again
            log.warning("ticket condition not written", ticket=name, status=exc.status)

    def _raise_cycle(
        self, view: FleetView, node: str, action: RaiseCycle, now: dt.datetime
    ) -> None:
        ticket = self._ticket(view, node, action.name)
        if ticket is None or (action.test and action.test in ticket.spec.evidence):
            return
        evidence = [*ticket.spec.evidence, action.test] if action.test else ticket.spec.evidence
        findings = [*ticket.spec.findings, *self._findings(view, node, [action.test])][-64:]
        self.writer.patch_custom(
            "repairtickets",
            action.name,
            {
                "spec": {
                    "evidence": evidence,
                    "findings": [to_body(f) for f in findings],
                    "resolution": None,
                    "resolutionNote": None,
                }
            },
        )
        status = ticket.status
        cycle = (status.cycle if status else 1) + 1
        history = [to_body(h) for h in (status.history if status else [])]
        message = f"repair cycle {cycle}: verification {action.test} failed"
        history.append({"time": keys.format_time(now), "phase": "Open", "message": message})
        self.writer.patch_custom_status(
            "repairtickets",
            action.name,
            {"phase": TicketPhase.OPEN.value, "cycle": cycle, "history": history[-256:]},
        )
