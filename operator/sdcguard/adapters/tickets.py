"""RepairTickets: created with the evidence, the findings and the blast radius, then
moved along their phases, their Waiting condition kept, and closed when their node is
gone (the objects and statuses stages of a plan, ``Executor.apply``)."""

from __future__ import annotations

import datetime as dt
from collections import Counter

import structlog
from kubernetes.client.exceptions import ApiException

from sdcguard.adapters import hardware
from sdcguard.adapters.kube import KubeWriter
from sdcguard.adapters.observe import TicketSnapshot
from sdcguard.adapters.pass_state import TICKET_STATUS_GRACE, Expectations, FleetView, KnownTests
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
    TicketPhase,
    find_condition,
    set_condition,
    to_body,
    to_patch,
)
from sdcguard.domain import keys
from sdcguard.domain.blast import owner_message
from sdcguard.domain.decide import closes_as_replaced, node_gone_closing
from sdcguard.domain.echo import bounded
from sdcguard.domain.lifecycle import CreateTicket, RaiseCycle
from sdcguard.domain.observed import NodeSnapshot, TicketFacts
from sdcguard.domain.waits import Wait
from sdcguard.metrics import Metrics

log = structlog.get_logger("sdcguard.reconcile")


class RepairTickets:
    """Writes RepairTickets. Of its own it keeps the tickets it closed as Replaced (until
    the watch brings them back) and the workload records a new ticket's blast radius
    comes from."""

    def __init__(
        self,
        writer: KubeWriter,
        metrics: Metrics,
        known: KnownTests,
        expectations: Expectations,
        workloads: WorkloadBook | None = None,
    ) -> None:
        self._writer = writer
        self._metrics = metrics
        self._known = known
        self._expectations = expectations
        self.workloads = workloads
        """Every node's workload record: a quarantine's ticket carries its blast radius
        (handed in once the inventory keeps them)."""
        self._replaced: dict[str, str | None] = {}
        """Tickets closed as Replaced, with the resourceVersion they had (until it moves)."""

    def prune(self, view: FleetView) -> None:
        """Forget the tickets the view no longer has (full passes only)."""
        tickets = {t.name for snapshots in view.tickets.values() for t in snapshots}
        for name in [n for n in self._replaced if n not in tickets]:
            del self._replaced[name]

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
                    self._writer.patch_custom(
                        "repairtickets", name, {"spec": to_patch(spec, "resolution")}
                    )
                self.set_phase(view, node_name, name, TicketPhase.CLOSED, message, now)
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

    def create(
        self,
        policy: SDCPolicy,
        node_body: NodeSnapshot,
        action: CreateTicket,
        view: FleetView,
        now: dt.datetime,
        counts: Counter[str],
    ) -> tuple[bool, BlastRadius | None]:
        """Create the ticket, with the node's blast radius; False when it existed (its
        status is then left alone here). The radius is returned either way: a ticket an
        interrupted attempt created a moment ago may not be in the copy yet, and its
        owners are then told of the radius as it stands now."""
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
        created = self._writer.create_custom("repairtickets", body)
        if created is None:
            counts["tickets-existed"] += 1
            return False, radius
        counts["tickets-created"] += 1
        return True, radius

    def tell_owners(
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
        self._metrics.blast_radius_workloads.labels(policy=policy).inc(len(radius.workloads))
        for workload in radius.workloads:
            self._writer.event(
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

    def open_status(
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
        self._writer.patch_custom_status("repairtickets", name, to_patch(status, *fields))

    def restore_status(
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
                self.tell_owners(policy, seen.node_name, seen.name, radius, now, counts)
                told.append(radius)
            before = spec.hardware.cycles_before if spec else 0
            self.open_status(seen.name, message, created, cycle=before + 1, retired=retired)
            counts["ticket-status-restored"] += 1

    def seen(self, view: FleetView, node: str, name: str) -> TicketSnapshot | None:
        for seen in view.tickets.get(node, []):
            if seen.name == name:
                return seen
        return None

    def _ticket(self, view: FleetView, node: str, name: str) -> RepairTicket | None:
        seen = self.seen(view, node, name)
        return seen.ticket if seen is not None else None

    def set_phase(
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
        self._writer.patch_custom_status("repairtickets", name, to_patch(new, *fields))

    def waiting(
        self, view: FleetView, node: str, name: str, wait: Wait | None, now: dt.datetime
    ) -> None:
        """The ticket's Waiting condition says why the node's next step waits (node not
        Ready, breaker, back-off); written only when it changes."""
        ticket = self._ticket(view, node, name)
        if ticket is None:
            return
        conditions = ticket.status.conditions if ticket.status else []
        previous = find_condition(conditions, "Waiting")
        if wait is None:
            if previous is None or previous.status == "False":
                return
            updated = set_condition(conditions, "Waiting", "False", "NotWaiting", "", now)
        else:
            if (
                previous is not None
                and previous.status == "True"
                and previous.message == wait.message
            ):
                return
            updated = set_condition(
                conditions, "Waiting", "True", wait.reason.value, wait.message, now
            )
        new = (ticket.status or RepairTicketStatus()).model_copy(update={"conditions": updated})
        try:
            self._writer.patch_custom_status("repairtickets", name, to_patch(new, "conditions"))
        except ApiException as exc:  # the next pass writes it again
            log.warning("ticket condition not written", ticket=name, status=exc.status)

    def raise_cycle(self, view: FleetView, node: str, action: RaiseCycle, now: dt.datetime) -> None:
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
        self._writer.patch_custom("repairtickets", action.name, {"spec": to_patch(spec, *fields)})
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
        self._writer.patch_custom_status(
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
