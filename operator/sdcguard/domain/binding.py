"""Binding a lifecycle row to one node: the row's names and keys filled in.

The binder takes a row (of the lifecycle table, or of the upkeep table when no event
applies) and the reading of the node's observations, and returns the bound transition:
the actions the adapters apply, nothing added or changed afterwards. It fills in
names (tests and tickets from the node's counter), keys (the policy's taint keys),
the objects involved (the ticket, its devices, the test), and turns bookkeeping into
annotation changes (one Annotate action). It evaluates a row's guards (``Only``),
which the row states as data, and keeps the safety rules every action obeys:

- only taints recorded as ours are removed (the gate taint a node registered with is
  adopted, since it exists for sdcguard to remove), and someone else's taint of the
  same key is not adopted;
- a node is uncordoned only if sdcguard cordoned it, and cordoned only if it is not;
  autoscaler annotations are removed only if sdcguard set them;
- what is there already is not written again (a test that is not running is not
  cancelled; a ticket that exists is not created).

Observe mode: the actions that change scheduling, delete a node or reach a repair
system (``lifecycle.OBSERVE_SUPPRESSED``) are set aside as ``suppressed`` (for "would
have" Events), labels, annotations, tests and Events stay, and a node that registered
with the gate taint has it removed: the gate exists for sdcguard, and Observe must not
keep a node out of work.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sdcguard.api import (
    Mode,
    QuarantinedDevice,
    QuarantineRecord,
    QuarantineScope,
    RepairStrategy,
    RetireAction,
    SDCPolicySpec,
    Suite,
    TicketPhase,
)
from sdcguard.domain import keys
from sdcguard.domain.devicetaints import (
    ScopeChoice,
    SliceDevice,
    choose_scope,
    device_ticket_tails,
    rule_name,
    under_verification,
)
from sdcguard.domain.echo import bounded
from sdcguard.domain.keys import observed_failure_text
from sdcguard.domain.lifecycle import (
    BOOKKEEPING,
    OBSERVE_SUPPRESSED,
    AcknowledgedIntoRepair,
    Action,
    AddTaint,
    AdoptTest,
    Annotate,
    BackOff,
    CancelTest,
    CloseTicket,
    Cordon,
    CorrectLabel,
    CreateTest,
    CreateTicket,
    DrainDeadline,
    EmitEvent,
    EndDrain,
    EnterState,
    ForgetSuspicion,
    ForgetTest,
    Guard,
    HoldQuarantine,
    KeepDeviceRules,
    KeepSuspicion,
    LeaveTest,
    MarkQualified,
    NoteHistory,
    Only,
    OpenTicketStatus,
    RaiseCycle,
    RecordHardware,
    RecordWait,
    RemoveTaint,
    Retire,
    RowAction,
    SetAutoscalerAnnotations,
    SetLabel,
    SetTicketPhase,
    TaintDevices,
    TaintRole,
    Uncordon,
    UntaintDevices,
    UntaintReturnedDevices,
    history_note,
)
from sdcguard.domain.observed import TicketFacts
from sdcguard.domain.reading import Changes, Reader, Reading
from sdcguard.domain.states import Event, NodeState
from sdcguard.domain.waits import publish

S = NodeState
E = Event
_BOOKKEEPING = frozenset(BOOKKEEPING)


def taint_key(policy: SDCPolicySpec, role: TaintRole) -> str:
    """The policy's key of a taint role."""
    return {
        TaintRole.GATE: policy.taints.gate,
        TaintRole.TESTING: policy.taints.testing,
        TaintRole.QUARANTINE: policy.taints.quarantine,
    }[role]


def taint_effect(policy: SDCPolicySpec, role: TaintRole) -> str:
    return policy.quarantine.taint_effect if role == TaintRole.QUARANTINE else "NoSchedule"


@dataclass(frozen=True)
class Bound:
    """A row bound to one node: the whole transition."""

    actions: tuple[Action, ...]
    """What the adapters apply (see ``domain.plan`` for the order)."""
    suppressed: tuple[Action, ...]
    """What Observe mode set aside."""
    requeue: float | None
    """When to look again (a wait that is to be told in an Event shortens it)."""
    changes: dict[str, str | None]
    """Every annotation the bookkeeping set (the Annotate action holds those that
    differ from the node's)."""


class Binder:
    """Binds a row's actions for one node (see the module docstring)."""

    def __init__(
        self,
        reader: Reader,
        reading: Reading,
        target: NodeState,
        requeue: float | None,
    ) -> None:
        self.r = reader
        self.reading = reading
        self.target = target
        self.requeue = requeue
        self.seq = reader.node.seq
        self.labelled = reader.node.state
        """The state the node's label names (None: none, or not a state)."""
        self.changes: Changes = dict(reading.changes)
        self._ticket_names: tuple[str, ...] | None = None
        self._choice: ScopeChoice | None = None
        self._created: list[CreateTicket] = []
        self._bound: list[Action] = []

    def bind_all(self, row: tuple[RowAction, ...]) -> Bound:
        """Every action of ``row`` bound, in the row's order, then the node's annotation
        changes (one Annotate action), then Observe mode's rule."""
        for action in row:
            if type(action) in _BOOKKEEPING:  # the most frequent: every row ends with some
                made = self._remember(action)
                if made is not None:
                    self._bound.append(made)
            else:
                self._add(self.bind(action))
        node = self.r.node
        policy = self.r.policy
        if (
            policy.mode == Mode.OBSERVE
            and self.target == NodeState.QUARANTINED
            and any(isinstance(a, CreateTicket) for a in self._bound)
        ):
            # The ticket Observe does not open: remember the failure, so that Enforce
            # confirms it (a re-test) instead of quarantining on it unseen.
            test = self.r.obs.test
            failed = test.failed_checks if test is not None else frozenset()
            self.changes[keys.OBSERVED_FAILURE] = observed_failure_text(
                self.reading.evidence or node.evidence, failed | node.suspect_checks
            )
        changes = tuple(
            (k, v) for k, v in sorted(self.changes.items()) if node.annotations.get(k) != v
        )
        if changes:
            self._bound.append(Annotate(changes))
        bound, suppressed = self._bound, []
        if policy.mode == Mode.OBSERVE:
            suppressed = [a for a in bound if isinstance(a, OBSERVE_SUPPRESSED)]
            bound = [a for a in bound if not isinstance(a, OBSERVE_SUPPRESSED)]
            gate = policy.taints.gate
            if node.has_taint(gate):
                bound.append(RemoveTaint(TaintRole.GATE, gate, registered=True))
        return Bound(tuple(bound), tuple(suppressed), self.requeue, dict(self.changes))

    def _add(self, made: Action | tuple[Action, ...] | None) -> None:
        if isinstance(made, tuple):
            self._bound += made
        elif made is not None:
            self._bound.append(made)

    def holds(self, guard: Guard) -> bool:
        """Whether ``guard`` holds for this node, its quarantine and the policy."""
        policy = self.r.policy
        if guard in (Guard.NODE_SCOPE, Guard.DEVICE_SCOPE):
            return bool(self.quarantined_devices()) == (guard == Guard.DEVICE_SCOPE)
        if guard == Guard.DEVICES_REFAILED:
            return bool(self.reading.refailed)
        if guard == Guard.GATED:
            return policy.triggers.on_join and self.r.node.qualified_at is None
        if guard == Guard.HOLD_SUSPECTS:
            return policy.triggers.hold_suspects
        if guard == Guard.CORDON:
            return policy.quarantine.cordon
        if guard == Guard.DRAIN:
            return policy.quarantine.drain and policy.mode != Mode.OBSERVE
        if guard == Guard.IN_PLACE:
            return policy.repair.strategy == RepairStrategy.IN_PLACE
        if guard == Guard.RETIRE_BY_CORDON:
            return policy.repair.retire_action == RetireAction.CORDON
        return policy.repair.retire_action == RetireAction.DELETE  # RETIRE_BY_DELETE

    def _new_ticket_names(self) -> tuple[str, ...]:
        """The names of the tickets this decision opens (the same, however often asked):
        one, or for a quarantine of scope Device one per device, in the devices' order,
        all from one step of the node's counter (``<node>-<uid>-<seq>-<device>``)."""
        if self._ticket_names is None:
            devices = self.quarantined_devices()
            tails = device_ticket_tails(devices) if devices else ("",)
            self.seq += 1
            self.changes[keys.SEQ] = str(self.seq)
            self._ticket_names = tuple(self._named(f"-{t}" if t else "") for t in tails)
        return self._ticket_names

    def _new_ticket_name(self) -> str:
        """The first (or only) ticket this decision opens."""
        return self._new_ticket_names()[0]

    @property
    def choice(self) -> ScopeChoice:
        """The scope of the quarantine this decision opens (domain.devicetaints)."""
        if self._choice is None:
            test = self.r.obs.test
            findings = test.findings if test is not None else ()
            uuids = test.device_ids if test is not None else ()
            self._choice = choose_scope(
                self.r.policy.quarantine, findings, self.r.obs.devices, uuids
            )
        return self._choice

    def quarantined_devices(self) -> tuple[SliceDevice, ...]:
        """The devices a quarantine of scope Device takes out (empty: the whole node).
        An open ticket keeps the scope it was opened with."""
        ticket = self.r.obs.ticket
        if ticket is not None:
            return ticket.devices
        if self.target != S.QUARANTINED or self.choice.scope != QuarantineScope.DEVICE:
            return ()
        return tuple(p.device for p in self.choice.devices)

    def _record(self, only: int | None = None) -> QuarantineRecord:
        """The ticket's ``spec.quarantine``; ``only``: the one device (by its position in
        the choice) of a device ticket."""
        node = self.r.node.name
        choice = self.choice
        picked = choice.devices if only is None else (choice.devices[only],)
        return QuarantineRecord(
            scope=choice.scope.value,
            reason=choice.reason.value,
            message=bounded(choice.message, 1024),
            devices=[
                QuarantinedDevice(
                    index=p.index,
                    uuid=p.device.uuid or None,
                    driver=p.device.driver,
                    pool=p.device.pool,
                    device=p.device.name,
                    rule=rule_name(node, p.device.key),
                )
                for p in picked
            ],
        )

    def _name(self) -> str:
        self.seq += 1
        self.changes[keys.SEQ] = str(self.seq)
        return self._named("")

    def _named(self, tail: str) -> str:
        """``<node>-<uid>-<seq><tail>`` at the counter's current value (at most 253)."""
        node = self.r.node
        suffix = (f"-{node.uid[:5]}-{self.seq}" if node.uid else f"-{self.seq}") + tail
        return node.name[: 253 - len(suffix)] + suffix

    def _members(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """``names`` if the step named any device tickets, else every ticket of the
        incident (the node's one ticket for scope Node)."""
        ticket = self.r.obs.ticket
        if names:
            return names
        if ticket is None:
            return ()
        return tuple(m.name for m in ticket.members) or (ticket.name,)

    def _device_tickets(self, names: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
        """(GPU UUID, its ticket) for the hardware history of a quarantine of scope
        Device: the devices this decision quarantines, or of an open incident those that
        failed verification again (all of them when the step names none)."""
        ticket = self.r.obs.ticket
        if ticket is None:
            devices = self.quarantined_devices()
            return tuple((d.uuid, n) for d, n in zip(devices, names, strict=False) if d.uuid)
        refailed = set(self.reading.refailed)
        chosen = [m for m in ticket.members if not refailed or m.name in refailed]
        return tuple((d.uuid, m.name) for m in chosen for d in m.devices if d.uuid)

    def _phase_targets(self, phase: TicketPhase) -> tuple[str, ...]:
        """The tickets a phase change applies to: scope Device moves to Verifying only
        the resolved device tickets, and to InRepair only the acknowledged ones."""
        ticket = self.r.obs.ticket
        if ticket is None:
            return ()
        members = ticket.members
        if not members:
            return (ticket.name,)
        if phase == TicketPhase.VERIFYING:
            chosen = under_verification(members)
        elif phase == TicketPhase.IN_REPAIR:
            chosen = tuple(m for m in members if m.acknowledged and not m.resolved)
        else:
            chosen = members
        return tuple(m.name for m in chosen) or (ticket.name,)

    def _create_tickets(self, retired: bool) -> tuple[CreateTicket, ...]:
        """The CreateTicket of this decision's quarantine: one, or one per device (scope
        Device), each device's cycle counted from its own GPU's history."""
        r, node = self.r, self.r.node
        evidence = self.reading.evidence or node.evidence
        hardware = r.obs.hardware
        used = hardware.cycles if hardware is not None else 0
        begins = self.reading.event in (E.TEST_FAILED, E.REPAIR_CYCLES_EXCEEDED)
        names = self._new_ticket_names()
        if len(names) == 1 and not self.quarantined_devices():
            cycle = used + 1 if begins else max(1, used)
            return (
                CreateTicket(
                    names[0], evidence, self.reading.detail, cycle, retired, used, self._record()
                ),
            )
        made = []
        for i, name in enumerate(names):
            uuid = self.choice.devices[i].device.uuid
            own = hardware.device_cycles.get(uuid.lower(), 0) if hardware and uuid else 0
            cycle = own + 1 if begins else max(1, own)
            record = self._record(only=i)
            made.append(
                CreateTicket(name, evidence, self.reading.detail, cycle, retired, own, record)
            )
        return tuple(made)

    def bind(self, action: RowAction) -> Action | tuple[Action, ...] | None:
        """The action with the node's names and keys filled in (None: nothing to do
        here). Bookkeeping actions become annotation changes (``self.changes``)."""
        r, node, policy, reading = self.r, self.r.node, self.r.policy, self.reading
        ticket = r.obs.ticket
        match action:
            case Only(when=when, actions=guarded):
                if not all(self.holds(g) for g in when):
                    return None
                made: list[Action] = []
                for inner in guarded:
                    one = self.bind(inner)
                    if isinstance(one, tuple):
                        made += one
                    elif one is not None:
                        made.append(one)
                return tuple(made)
            case SetLabel(state=state):
                # Written when the state changes, or when the label does not say it.
                return action if state != r.state or self.labelled != state else None
            case _ if type(action) in _BOOKKEEPING:
                return self._remember(action)
            case TaintDevices():
                detail = bounded(reading.detail, 1024)
                if ticket is not None:
                    return taint_devices(ticket, detail, policy)
                names = self._new_ticket_names()
                return TaintDevices(
                    names[0],
                    self.quarantined_devices(),
                    detail,
                    policy.quarantine.device_taint_effect,
                    names,
                )
            case KeepDeviceRules():
                if ticket is None or not ticket.devices:
                    return None
                return taint_devices(ticket, f"ticket {ticket.name}", policy)
            case AcknowledgedIntoRepair():
                members = ticket.members if ticket is not None else ()
                return tuple(
                    SetTicketPhase(TicketPhase.IN_REPAIR, m.name, "acknowledged")
                    for m in members
                    if m.acknowledged
                    and not m.resolved
                    and m.phase in (TicketPhase.OPEN, TicketPhase.ACKNOWLEDGED)
                )
            case UntaintDevices():
                return UntaintDevices(ticket.name) if ticket is not None else None
            case UntaintReturnedDevices():
                if ticket is None:
                    return None
                going = set(reading.returned)
                if not going:
                    return UntaintDevices(ticket.name)
                devices = tuple(d for m in ticket.members if m.name in going for d in m.devices)
                return UntaintDevices(ticket.name, devices)
            case AddTaint(role=role):
                key = taint_key(policy, role)
                if node.has_taint(key) and (key in node.owned_taints or role != TaintRole.GATE):
                    return None  # ours already, or someone else's that we do not adopt
                return AddTaint(role, key, taint_effect(policy, role))
            case RemoveTaint(role=role):
                key = taint_key(policy, role)
                return RemoveTaint(role, key) if key in node.owned_taints else None
            case Cordon():
                return None if node.unschedulable else action
            case Uncordon():
                return action if node.cordoned_by_us else None
            case SetAutoscalerAnnotations(on=True):
                missing = any(k not in node.annotations for k in keys.AUTOSCALER_ANNOTATIONS)
                return action if missing else None
            case SetAutoscalerAnnotations(on=False):
                return action if node.owned_annotations else None
            case CreateTest(suite=suite, reason=reason):
                name = self._name()
                self.changes[keys.CURRENT_TEST] = name
                return CreateTest(
                    suite=suite or reading.suite or Suite.REQUALIFICATION,
                    reason=reason,
                    name=name,
                    attempt=reading.attempt,
                    # Scope Device: the (first) device ticket this verification answers for.
                    ticket=self._phase_targets(TicketPhase.VERIFYING)[0] if ticket else None,
                )
            case CancelTest():
                test = r.obs.test
                if test is None or test.finished:
                    return None
                return CancelTest(test.name, reading.detail)
            case CreateTicket(retired=retired):
                if ticket is not None and (ticket.opened or self.reading.event is None):
                    return None
                # No ticket, or (a transition, not upkeep) one whose status never came:
                # the same decision, cut off after creating it, made again. Its name is
                # the decision's, so the create finds it, and the executor tells its
                # owners and writes its status (``Executor._apply_object``). Upkeep
                # leaves such a ticket to its own status write, on its way, or to
                # ``RepairTickets.restore_status`` after the grace.
                created = self._create_tickets(retired)
                self._created += created
                return created
            case OpenTicketStatus():
                return tuple(
                    OpenTicketStatus(c.name, c.message, c.cycle, c.retired) for c in self._created
                )
            case RecordHardware(failure=failure, retire=retire):
                failed = r.obs.test.name if r.obs.test is not None and failure else ""
                names = self._ticket_names or ()
                named = ticket.name if ticket is not None else (names[0] if names else "")
                return RecordHardware(
                    failure,
                    retire,
                    failed,
                    named,
                    reading.detail,
                    self._device_tickets(names),
                )
            case SetTicketPhase(name=name) if name:
                return action  # named already (a device ticket)
            case SetTicketPhase(phase=phase):
                return tuple(
                    SetTicketPhase(phase, name, reading.detail)
                    for name in self._phase_targets(phase)
                )
            case CloseTicket():
                if reading.event == E.DEVICES_RETURNED or reading.returned:
                    names = reading.returned
                else:
                    names = self._members(())
                return tuple(CloseTicket(name, reading.detail) for name in names)
            case RaiseCycle():
                failed = reading.evidence[0] if reading.evidence else ""
                names = reading.refailed if ticket and ticket.members else self._members(())
                return tuple(RaiseCycle(name, failed) for name in names)
            case Retire():
                delete = policy.repair.retire_action == RetireAction.DELETE
                if ticket is None:
                    return Retire("", delete_node=delete)  # born Retired (its Open status)
                names = self._members(())
                # A device ticket retired retires the node: all its tickets go with it.
                return (
                    Retire(names[0], delete_node=delete),
                    *(SetTicketPhase(TicketPhase.RETIRED, n, reading.detail) for n in names[1:]),
                )
            case MarkQualified():
                test = r.obs.test
                if test is None:
                    return MarkQualified(r.now, "")
                return MarkQualified(r.now, test.fingerprint, test.name, test.seed, test.data_seed)
            case EmitEvent(reason=reason, message=message, warning=warning, routine=routine):
                text = message.format(node=node.name, detail=reading.detail)
                return EmitEvent(reason, text, warning, routine)
            case _:
                return action

    def _remember(self, action: RowAction) -> EmitEvent | None:
        """A bookkeeping action bound: annotation changes (``self.changes``), and for a
        wait told or a corrected label an Event."""
        r, node, policy, reading = self.r, self.r.node, self.r.policy, self.reading
        match action:
            case RecordWait():
                return self._record_wait()
            case CorrectLabel():
                label = node.state_label
                if label is None or label == r.state.value:
                    return None
                # Someone wrote the label by hand (or mangled it): the records win.
                return EmitEvent(
                    "StateLabelCorrected",
                    f"{node.name}: label {keys.LABEL_STATE}={label} disagrees with the "
                    f"records; the state is {r.state.value}, and the label says so again",
                    warning=True,
                )
            case EnterState():
                if self.labelled != self.target:
                    self.changes[keys.STATE_SINCE] = keys.format_time(r.now)
                return None
            case EndDrain():
                self.changes[keys.DRAIN_UNTIL] = None
                return None
            case LeaveTest():
                # Leaving a test behind: its outcome no longer counts.
                self.changes.setdefault(keys.CURRENT_TEST, None)
                return None
            case NoteHistory():
                history = tuple(a for a in self._bound if isinstance(a, RecordHardware))
                if history and policy.mode != Mode.OBSERVE:
                    # Written after the node patch (plan.Stage.HISTORY): the patch says
                    # what, so a pass after an interruption in between can still write it.
                    self.changes[keys.HISTORY] = history_note(history, r.now)
                elif self.labelled != self.target:
                    self.changes[keys.HISTORY] = None  # it belongs to the state it came with
                return None
            case ForgetTest():
                self.changes.update(
                    {keys.CURRENT_TEST: None, keys.INCONCLUSIVE: None, keys.RETRY_AFTER: None}
                )
                return None
            case ForgetSuspicion():
                self.changes.update(
                    {keys.SUSPECT_CHECKS: None, keys.EVIDENCE: None, keys.HELD: None}
                )
                return None
            case KeepSuspicion():
                self.changes[keys.SUSPECT_CHECKS] = keys.join_list(reading.suspect_checks)
                self.changes[keys.EVIDENCE] = keys.join_list(reading.evidence)
                return None
            case HoldQuarantine():
                by = r.obs.test.name if r.obs.test else "its test"
                self.changes[keys.HELD] = f"circuit breaker open; confirmed by {by}"
                return None
            case BackOff(count=count):
                self.changes.update(r.back_off(node.inconclusive_count + (1 if count else 0)))
                return None
            case AdoptTest():
                if r.obs.test is not None:
                    self.changes[keys.CURRENT_TEST] = r.obs.test.name
                return None
            case DrainDeadline():
                timeout = policy.quarantine.drain_timeout_seconds
                if timeout > 0:
                    until = r.now + dt.timedelta(seconds=timeout)
                    self.changes[keys.DRAIN_UNTIL] = keys.format_time(until)
                return None
        return None

    def _record_wait(self) -> EmitEvent | None:
        """Publish the reading's wait on the node (``domain.waits``); a transition ends it."""
        reading, node = self.reading, self.r.node
        published = publish(reading.wait, node.name, node.annotations, self.requeue, self.r.now)
        self.changes.update(published.changes)
        self.requeue = published.requeue
        if published.event_message is None:
            return None
        return EmitEvent("Waiting", published.event_message, warning=True)


def taint_devices(ticket: TicketFacts, reason: str, policy: SDCPolicySpec) -> TaintDevices:
    """The DeviceTaintRules an open incident of scope Device keeps: one per device, each
    naming its own ticket."""
    pairs = [(d, m.name) for m in ticket.members for d in m.devices]
    return TaintDevices(
        ticket.name,
        tuple(d for d, _ in pairs),
        reason,
        policy.quarantine.device_taint_effect,
        tuple(n for _, n in pairs),
    )
