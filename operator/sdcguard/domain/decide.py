"""``decide(observed, policy, now)``: the next state of one node, what to do, when to look again.

One pass reads the observations in this order and fires the first event that applies:

1. opt-out label (``sdcguard.dev/exclude=true``) and opting in again;
2. requests by people (``sdcguard.dev/quarantine``, ``sdcguard.dev/release``);
3. the outcome of the node's current test (with confirmation, see judging);
4. a test someone else started on the node (adopted);
5. the repair ticket (acknowledged, resolved, retire);
6. a workload's suspicion (``sdcguard.dev/suspect``);
7. the schedule: acceptance of new nodes, return from use after ``idleFor``, expiry
   after ``maxQualificationAge``, re-tests of suspects and repairs, all within the
   pool's budgets, never while a pending pod needs the node, never while paused, and
   (for routine re-screening) never while the circuit breaker is open.

With no event, the decision only keeps the node consistent with its state (label,
and in Enforce mode the taints and cordon the state implies).

Safety rules applied to every action: only taints recorded as ours are removed (the
gate taint put on at registration is adopted, since it exists for sdcguard to
remove); a node is uncordoned only if sdcguard cordoned it; autoscaler annotations
are removed only if sdcguard set them; Observe mode drops every action that changes
scheduling, deletes a node or reaches a repair system (see lifecycle.OBSERVE_SUPPRESSED)
and keeps labels, annotations, tests and Events, so the state machine still runs. In
Observe mode a node that registered with the gate taint has it removed at first sight:
the gate exists for sdcguard, and Observe must not keep a node out of work.

Adapters apply the actions in order: objects first (tests, tickets), the node patch
(see nodepatch) last, so a crash in between repeats the same decision, and names
derived from the node's ``sdcguard.dev/seq`` make the repeat create nothing twice.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from sdcguard.api import (
    Mode,
    QuarantinedDevice,
    QuarantineRecord,
    QuarantineScope,
    RepairStrategy,
    Resolution,
    RetireAction,
    ScreeningReason,
    SDCPolicySpec,
    Suite,
    TicketPhase,
    Verdict,
    parse_duration,
)
from sdcguard.domain import keys
from sdcguard.domain.budgets import PoolMember, PoolUsage, add_member, can_reserve
from sdcguard.domain.devicetaints import (
    ScopeChoice,
    SliceDevice,
    choose_scope,
    device_ticket_tails,
    judge_devices,
    rule_name,
    under_verification,
)
from sdcguard.domain.echo import bounded
from sdcguard.domain.judging import Outcome, assess, retry_time
from sdcguard.domain.lifecycle import (
    OBSERVE_SUPPRESSED,
    TABLE,
    Action,
    AddTaint,
    AdoptTest,
    Annotate,
    BackOff,
    CancelTest,
    CloseTicket,
    Cordon,
    CreateTest,
    CreateTicket,
    Drain,
    EmitEvent,
    EndDrain,
    Event,
    ForgetSuspicion,
    ForgetTest,
    HoldQuarantine,
    IllegalTransition,
    KeepSuspicion,
    MarkQualified,
    NodeState,
    RaiseCycle,
    RecordHardware,
    RemoveTaint,
    Retire,
    SetAutoscalerAnnotations,
    SetLabel,
    SetTicketPhase,
    TaintDevices,
    TaintRole,
    Uncordon,
    UntaintDevices,
    history_note,
    transition,
)
from sdcguard.domain.observed import NodeFacts, Observed, TestFacts, TicketFacts
from sdcguard.domain.plan import Plan
from sdcguard.domain.reports import report_reference
from sdcguard.domain.waits import Wait, WaitReason, publish

W = WaitReason

PROBE_TOLERATED_CORDON = "node.kubernetes.io/unschedulable"
"""The cordon taint: probe Pods tolerate it so cordoned (quarantined) nodes can be verified."""
REQUEUE_AFTER_TRANSITION = 10.0
REQUEUE_TEST_RUNNING = 60.0
REQUEUE_WAITING = 120.0
REQUEUE_MAX = 3600.0

S = NodeState
E = Event
Changes = dict[str, str | None]


@dataclass(frozen=True)
class Decision:
    """What to do with one node; the adapters apply ``actions`` and requeue."""

    node: str
    previous: NodeState | None
    """The state label before (None: never seen)."""
    state: NodeState
    event: Event | None
    actions: tuple[Action, ...]
    suppressed: tuple[Action, ...] = ()
    """Actions Observe mode dropped (for "would have" Events and logs)."""
    requeue_after: float | None = None
    """Seconds until the node should be decided again (None: only on change)."""
    note: str = ""
    """Why, in one line (logs, conditions)."""
    starts_test: bool = False
    takes_node: bool = False
    """Whether the decision holds a node that was serving (counts against maxUnavailable)."""
    waits_for_budget: bool = False
    """A test is due but the pool's budget is used up: a candidate when budget frees up."""
    illegal: IllegalTransition | None = None
    """The event chosen has no row in this state (a bug): nothing is done for the node."""
    held: bool = False
    """The node's confirmed failure is held by the open circuit breaker."""
    wait: Wait | None = None
    """Why sdcguard holds back the node's next step (None: it does not); its reason is
    the Waiting condition's."""
    waiting_test: str | None = None
    """The SDCTest that waits (its Waiting condition says why), when the wait is a test's."""

    @property
    def waiting(self) -> str | None:
        """The wait's message (None: no wait)."""
        return self.wait.message if self.wait is not None else None

    @property
    def changed(self) -> bool:
        """Whether the node changes state."""
        return self.event is not None and self.state != self.previous

    @property
    def plan(self) -> Plan:
        """``actions`` in the order the executor applies them (see ``domain.plan``)."""
        return Plan.of(self.actions)


@dataclass
class _Step:
    """The event chosen (or none), and what it needs to be bound."""

    event: Event | None
    detail: str
    changes: Changes = field(default_factory=dict)
    """Only the request annotation the step answered (consumed); what a row remembers
    is in its bookkeeping actions."""
    requeue: float | None = None
    suite: Suite | None = None
    """Suite for CreateTest rows that leave it open."""
    attempt: int = 1
    evidence: tuple[str, ...] = ()
    suspect_checks: frozenset[str] = frozenset()
    """The checks still suspect after the outcome (for KeepSuspicion)."""
    waits: Wait | None = None
    """Why the operator holds back the node's next step (published on the node, the
    ticket's Waiting condition, ``kubectl sdc status``, and an Event once it lasts)."""
    waiting_test: str | None = None
    """The SDCTest the wait holds back, if it is a test's (its Waiting condition)."""
    returned: tuple[str, ...] = ()
    """Scope Device: the device tickets whose devices passed verification (they close)."""
    refailed: tuple[str, ...] = ()
    """Scope Device: the device tickets whose devices failed verification again."""

    @classmethod
    def waiting(
        cls, wait: Wait, requeue: float, test: str | None = None, *, note: str = ""
    ) -> _Step:
        """No event: the node's next step waits (``test``: the SDCTest the wait holds
        back, when it is a test's); ``note``: the decision's note, if not the wait's."""
        return cls(None, note or wait.message, requeue=requeue, waits=wait, waiting_test=test)


def _taint_key(policy: SDCPolicySpec, role: TaintRole) -> str:
    return {
        TaintRole.GATE: policy.taints.gate,
        TaintRole.TESTING: policy.taints.testing,
        TaintRole.QUARANTINE: policy.taints.quarantine,
    }[role]


def _taint_effect(policy: SDCPolicySpec, role: TaintRole) -> str:
    return policy.quarantine.taint_effect if role == TaintRole.QUARANTINE else "NoSchedule"


def _covering_suite(policy: SDCPolicySpec, checks: frozenset[str]) -> Suite:
    """The suite that re-tests every suspected check (requalification if it does)."""
    for suite in (Suite.REQUALIFICATION, Suite.ACCEPTANCE, Suite.REPAIR_VERIFICATION):
        if checks <= {c.name.value for c in policy.suites.checks(suite)}:
            return suite
    return Suite.REQUALIFICATION


def _until(when: dt.datetime, now: dt.datetime) -> float:
    return min(REQUEUE_MAX, max(1.0, (when - now).total_seconds()))


def recover_state(observed: Observed, policy: SDCPolicySpec) -> NodeState | None:
    """The state a node's resources imply when its state label is missing or mangled.

    A person or a tool may delete or overwrite ``sdcguard.dev/state``; the node's
    tickets, our taints, its current test and its qualification still say where it
    is, so it is neither re-gated nor re-tested nor released by accident. None: a
    node sdcguard never handled.
    """
    node, ticket, test = observed.node, observed.ticket, observed.test
    if ticket is not None:
        return {
            TicketPhase.VERIFYING: S.VERIFYING,
            TicketPhase.IN_REPAIR: S.REPAIRING,
            TicketPhase.ACKNOWLEDGED: S.QUARANTINED,
            TicketPhase.RETIRED: S.RETIRED,
        }.get(ticket.phase, S.QUARANTINED)
    quarantine = policy.taints.quarantine
    if node.has_taint(quarantine) and quarantine in node.owned_taints:
        return S.QUARANTINED
    if test is not None and not test.finished and test.name == node.current_test:
        return S.SUSPECT if node.suspect_checks else S.TESTING
    if node.suspect_checks:
        return S.SUSPECT
    if node.qualified_at is not None:
        return S.QUALIFIED
    return None


def believed_state(observed: Observed, policy: SDCPolicySpec) -> NodeState:
    """The node's state: its label, unless the label is absent, names no state, or
    claims ``Qualified`` against the records (a gate or quarantine taint of ours, our
    testing reservation, or an open ticket); then the state the records imply.

    The label is output, never input: ``kubectl label node N sdcguard.dev/state=Qualified``
    on a gated node does not let the node in.
    """
    label = observed.node.state
    if label == S.QUALIFIED and _contradicts_qualified(observed, policy):
        label = None
    return label or recover_state(observed, policy) or S.UNQUALIFIED


def _contradicts_qualified(observed: Observed, policy: SDCPolicySpec) -> bool:
    node, taints = observed.node, policy.taints
    if observed.ticket is not None or node.has_taint(taints.gate):
        return True
    return any(
        node.has_taint(key) and key in node.owned_taints
        for key in (taints.quarantine, taints.testing)
    )


def closes_as_replaced(ticket: TicketFacts, policy: SDCPolicySpec, node_exists: bool) -> bool:
    """With the Replace strategy, a ticket InRepair whose Node is gone is done: the
    replacement joins as a new node (acceptance), so the ticket closes as Replaced."""
    return (
        not node_exists
        and policy.repair.strategy == RepairStrategy.REPLACE
        and ticket.phase == TicketPhase.IN_REPAIR
    )


def node_gone_closing(ticket: TicketFacts, policy: SDCPolicySpec, node: str) -> str | None:
    """The closing message for an unfinished ticket whose Node is gone, or None when
    the ticket is finished already.

    Deleted for replacement (Replace strategy, InRepair) it closes as Replaced. Deleted
    by someone else (an autoscaler's expiry or node repair, a person) the quarantined
    hardware left the cluster all the same: nothing is left to repair or verify here, and
    a Node of the same name or instance later joins as a new node (acceptance)."""
    if ticket.phase in (TicketPhase.CLOSED, TicketPhase.RETIRED):
        return None
    if closes_as_replaced(ticket, policy, False):
        return f"node {node} deleted for replacement; its successor joins as new"
    return (
        f"node {node} was deleted while its ticket was {ticket.phase.value}, not by "
        "sdcguard (an autoscaler's expiry or node repair, or a person); nothing is left "
        "to repair or verify, and a successor joins as new"
    )


class _Reader:
    """The observations of one node, read against the policy at one instant."""

    def __init__(self, observed: Observed, policy: SDCPolicySpec, now: dt.datetime) -> None:
        self.obs = observed
        self.node: NodeFacts = observed.node
        self.policy = policy
        self.now = now
        self.state = believed_state(observed, policy)
        self.budget_blocked = False
        """Set when a due test was refused only by the pool's budget."""

    # Gates -----------------------------------------------------------------------

    def holding(self) -> bool:
        """The node carries our testing taint already (no new reservation needed)."""
        key = self.policy.taints.testing
        return key in self.node.owned_taints and self.node.has_taint(key)

    def cannot_run(self) -> Wait | None:
        """Why a probe could not run on the node now (a test a person asked for waits only
        for these: budgets, back-off and the breaker give way to the request)."""
        node = self.node
        if not node.ready:
            return Wait(W.NODE_NOT_READY, "node not Ready")
        foreign = self.untolerated_taints()
        if foreign:
            return Wait(W.FOREIGN_TAINT, f"taint {foreign[0]} keeps probes off the node too")
        if node.accelerators <= 0:
            return Wait(W.NO_ACCELERATORS, "no allocatable accelerators yet")
        return None

    def blocked(self, *, takes_node: bool, routine: bool = False) -> Wait | None:
        """Why a test cannot start now, or None when it can."""
        node, obs = self.node, self.obs
        if self.policy.paused:
            return Wait(W.POLICY_PAUSED, "policy paused: no new tests")
        cannot = self.cannot_run()
        if cannot:
            return cannot
        if routine and obs.breaker_open:
            return Wait(W.BREAKER_OPEN, "circuit breaker open: routine screening stopped")
        retry = node.retry_after
        if retry is not None and retry > self.now:
            until = keys.format_time(retry)
            return Wait(W.BACK_OFF, f"backing off after inconclusive results until {until}")
        if obs.test is not None and not obs.test.finished:
            return Wait(W.ANOTHER_TEST, f"test {obs.test.name} still running")
        if takes_node and obs.pending_pod_needs_node:
            return Wait(W.PENDING_POD, "a pending pod needs this node")
        check = can_reserve(
            obs.usage,
            self.policy.budgets,
            takes_node=takes_node,
            devices=obs.devices_serving,
            own=obs.pool_member().devices_held,
        )
        self.budget_blocked = not check.allowed
        return None if check.allowed else Wait(W.BUDGET, check.reason)

    def untolerated_taints(self) -> list[str]:
        """Taints of others that repel probe Pods (they tolerate only sdcguard's own taints
        and the cordon), so a test started now could never run."""
        ours = {self.policy.taints.gate, self.policy.taints.testing, self.policy.taints.quarantine}
        return sorted(
            f"{t.key}:{t.effect}"
            for t in self.node.taints
            if t.effect in ("NoSchedule", "NoExecute")
            and t.key not in ours
            and t.key != PROBE_TOLERATED_CORDON
        )

    def next_attempt(self) -> int:
        return min(100, self.node.inconclusive_count + 1)

    # Steps -----------------------------------------------------------------------

    def step(self) -> _Step:
        for finder in (
            self._exclusion,
            self._requests,
            self._outcome,
            self._adoption,
            self._ticket,
            self._draining,
            self._suspicion,
            self._schedule,
        ):
            found = finder()
            if found is not None:
                return found
        return _Step(None, f"{self.state}: nothing to do", requeue=REQUEUE_MAX)

    def _exclusion(self) -> _Step | None:
        if self.node.excluded:
            if self.state == S.EXCLUDED:
                return _Step(None, "excluded: sdcguard touches nothing")
            return _Step(E.OPTED_OUT, f"label {keys.LABEL_EXCLUDE}=true")
        if self.state == S.EXCLUDED:
            return _Step(E.OPTED_IN, f"label {keys.LABEL_EXCLUDE} removed")
        return None

    def _requests(self) -> _Step | None:
        for key, event in (
            (keys.REQUEST_QUARANTINE, E.MANUAL_QUARANTINE),
            (keys.REQUEST_RELEASE, E.MANUAL_RELEASE),
        ):
            if key not in self.node.annotations:
                continue
            why = bounded(self.node.annotations[key] or "no reason given", 512)
            if (self.state, event) not in TABLE:
                return _Step(
                    None,
                    f"{key} ignored in state {self.state}",
                    {key: None},
                    requeue=REQUEUE_AFTER_TRANSITION,
                )
            return _Step(event, f"{key}: {why}", {key: None}, evidence=self.node.evidence)
        return None

    def _outcome(self) -> _Step | None:
        if self.state not in (S.TESTING, S.SUSPECT, S.VERIFYING):
            return None
        test, current = self.obs.test, self.node.current_test
        if current is None:
            if self.state == S.TESTING:
                return self._inconclusive("no test is recorded for this node")
            return None
        if test is None or test.name != current:
            return self._inconclusive(f"SDCTest {current} is gone")
        if not test.finished:
            if test.awaiting_baseline:
                wait = Wait(
                    W.AWAITING_BASELINE,
                    f"test {test.name} waits for a baseline: its digests are recorded, and "
                    f"{self.policy.baseline.quorum} nodes must agree",
                )
                return _Step.waiting(wait, REQUEUE_TEST_RUNNING, test.name)
            if self.obs.probe_unschedulable:
                wait = Wait(
                    W.PROBE_UNSCHEDULABLE,
                    f"its probe Pod cannot be scheduled: {self.obs.probe_unschedulable}",
                ).about(f"test {test.name} waits")
                return _Step.waiting(wait.bounded(), REQUEUE_TEST_RUNNING, test.name)
            if self.obs.queued:
                queued = self.obs.queued[0]
                wait = Wait(W.ANOTHER_TEST, f"test {test.name} still running")
                return _Step.waiting(
                    wait.about(f"test {queued} waits"), REQUEUE_TEST_RUNNING, queued
                )
            return _Step(
                None, f"waiting for {test.name} ({test.phase})", requeue=REQUEUE_TEST_RUNNING
            )

        if self.state == S.VERIFYING:
            if self.obs.ticket is not None and self.obs.ticket.members:
                return self._verify_devices(test)
            return self._verification(test.verdict, test.name, test.message)
        hardware = self.obs.hardware
        suspect = self.node.suspect_checks if self.state == S.SUSPECT else frozenset()
        found = assess(test, suspect, self.policy.confirmation)
        evidence = (
            (*self.node.evidence, test.name) if test.verdict == Verdict.SDC else self.node.evidence
        )
        checks = found.suspect_checks
        if found.outcome == Outcome.CLEARED:
            return _Step(E.TEST_PASSED, found.message)
        if found.outcome == Outcome.CONFIRMED:
            if self.obs.breaker_open:
                detail = (
                    f"{found.message}; quarantine held: circuit breaker open "
                    "(re-tested when it closes, or on request)"
                )
                return _Step(E.QUARANTINE_HELD, detail, evidence=evidence, suspect_checks=checks)
            limit = self.policy.repair.max_repair_cycles
            if hardware is not None and hardware.cycles >= limit:
                detail = (
                    f"{found.message}; its hardware used {hardware.cycles} of {limit} repair "
                    f"cycles within {self.policy.repair.repair_cycle_window}: "
                    f"{hardware.describe()}"
                )
                return _Step(E.REPAIR_CYCLES_EXCEEDED, detail, evidence=evidence)
            return _Step(E.TEST_FAILED, found.message, evidence=evidence)
        if found.outcome == Outcome.NEEDS_RERUN:
            rerun = test.attempt + 1 if test.reason == ScreeningReason.CONFIRMATION else 1
            event = (
                E.TEST_FAILED_UNCONFIRMED if test.verdict == Verdict.SDC else E.CONFIRMATION_PASSED
            )
            return _Step(
                event,
                found.message,
                suite=test.suite,
                attempt=rerun,
                evidence=evidence,
                suspect_checks=checks,
            )
        if found.outcome == Outcome.FLAKY:
            return _Step(E.FLAKY, found.message, evidence=evidence, suspect_checks=checks)
        return self._inconclusive(found.message)

    def _verification(self, verdict: Verdict | None, name: str, message: str) -> _Step:
        said = f"{name}: {message}" if message else name
        if verdict == Verdict.PASS:
            return _Step(E.VERIFICATION_PASSED, said)
        if verdict == Verdict.SDC:
            ticket, hardware = self.obs.ticket, self.obs.hardware
            cycle = ticket.cycle if ticket else 1
            if hardware is not None:
                # Cycles of earlier tickets (under this Node name or another) count too.
                cycle = max(cycle, hardware.cycles)
            if cycle >= self.policy.repair.max_repair_cycles:
                detail = f"{said}; repair cycle {cycle} of {self.policy.repair.max_repair_cycles}"
                return _Step(E.REPAIR_CYCLES_EXCEEDED, detail)
            return _Step(
                E.VERIFICATION_FAILED, f"{said}; repair cycle {cycle + 1} begins", evidence=(name,)
            )
        return self._inconclusive(said)

    def _verify_devices(self, test: TestFacts) -> _Step:
        """Scope Device: judge each device ticket under verification on its own (see
        ``devicetaints.judge_devices``): the devices that passed return, those that
        failed again stay out with their ticket's cycle raised, the rest wait for their
        repair."""
        ticket = self.obs.ticket
        assert ticket is not None
        said = f"{test.name}: {test.message}" if test.message else test.name
        if test.verdict not in (Verdict.PASS, Verdict.SDC):
            return self._inconclusive(said)
        judged = judge_devices(ticket.members, test.findings, test.device_ids, test.verdict)
        limit = self.policy.repair.max_repair_cycles
        by_name = {m.name: m for m in ticket.members}
        hardware = self.obs.hardware
        for name in judged.failed:
            cycle = by_name[name].cycle
            if hardware is not None:
                # The GPU's cycles under earlier tickets (on this host or another) count.
                own = [hardware.device_cycles.get(d.uuid.lower(), 0) for d in by_name[name].devices]
                cycle = max([cycle, *own])
            if cycle >= limit:
                detail = f"{said}; {judged.message}; ticket {name}: repair cycle {cycle} of {limit}"
                return _Step(E.REPAIR_CYCLES_EXCEEDED, detail)
        detail = f"{said}; {judged.message}"
        if not judged.failed and not judged.waiting:
            return _Step(E.VERIFICATION_PASSED, detail, returned=judged.passed)
        if not judged.passed:
            return _Step(
                E.VERIFICATION_FAILED, detail, evidence=(test.name,), refailed=judged.failed
            )
        return _Step(
            E.DEVICES_RETURNED,
            detail,
            evidence=(test.name,),
            returned=judged.passed,
            refailed=judged.failed,
        )

    def back_off(self, count: int) -> Changes:
        """The inconclusive count and the time before the node is screened again."""
        base = parse_duration(self.policy.triggers.inconclusive_backoff)
        return {
            keys.INCONCLUSIVE: str(count) if count else None,
            keys.RETRY_AFTER: keys.format_time(retry_time(self.now, base, max(1, count))),
        }

    def _inconclusive(self, why: str) -> _Step:
        count = self.node.inconclusive_count + 1
        if self.state == S.TESTING:
            event = E.TEST_INCONCLUSIVE if self.node.qualified_at else E.ACCEPTANCE_INCONCLUSIVE
        else:
            event = E.TEST_INCONCLUSIVE
        return _Step(event, f"{why} (inconclusive #{count})")

    def _adoption(self) -> _Step | None:
        test = self.obs.test
        if (
            self.state in (S.UNQUALIFIED, S.QUALIFIED, S.SUSPECT)
            and test is not None
            and not test.finished
            and test.name != self.node.current_test
        ):
            blocked = self.cannot_run()
            if blocked:
                wait = blocked.about(f"test {test.name} waits")
                return _Step.waiting(wait, REQUEUE_WAITING, test.name)
            return _Step(E.TEST_STARTED, f"adopted {test.name}")
        return None

    def _ticket(self) -> _Step | None:
        ticket = self.obs.ticket
        if self.state not in (S.QUARANTINED, S.REPAIRING) or ticket is None:
            return None
        if ticket.resolution == Resolution.RETIRE:
            return _Step(E.TICKET_RETIRE, f"ticket {ticket.name} resolved Retire")
        if ticket.resolution is not None:
            # Scope Device: the node serves with its other devices, and verifying takes it.
            blocked = self.blocked(takes_node=bool(ticket.devices) and not self.holding())
            if blocked:
                return _Step.waiting(blocked.about("verification waits"), self._wait_requeue())
            return _Step(
                E.TICKET_RESOLVED, f"ticket {ticket.name} resolved {ticket.resolution}; verifying"
            )
        if self.state == S.QUARANTINED and ticket.acknowledged:
            if self.policy.repair.strategy == RepairStrategy.REPLACE:
                if self.obs.breaker_open:
                    wait = Wait(W.BREAKER_OPEN, "circuit breaker open")
                    return _Step.waiting(wait.about("replacement waits"), REQUEUE_WAITING)
                return _Step(E.REPLACE_DUE, f"ticket {ticket.name} acknowledged")
            return _Step(E.REPAIR_STARTED, f"ticket {ticket.name} acknowledged")
        return None

    def _draining(self) -> _Step | None:
        """A drain whose evictions a PodDisruptionBudget refused goes on, with back-off,
        until ``sdcguard.dev/drain-until``."""
        if self.state not in (S.QUARANTINED, S.REPAIRING):
            return None
        raw = self.node.annotations.get(keys.DRAIN_UNTIL)
        if raw is None:
            return None
        until = keys.parse_time(raw)
        if until is None or until <= self.now or not self.policy.quarantine.drain:
            return _Step(
                E.DRAIN_TIMED_OUT,
                "pods are left: evictions were refused until the drain's time ran out",
                requeue=REQUEUE_MAX,
            )
        timeout = dt.timedelta(seconds=self.policy.quarantine.drain_timeout_seconds)
        elapsed = (self.now - (until - timeout)).total_seconds()
        backoff = min(60.0, max(2.0, elapsed / 2), _until(until, self.now))
        return _Step(E.DRAIN_DUE, "evicting pods again", requeue=backoff)

    def _suspicion(self) -> _Step | None:
        key = keys.REQUEST_SUSPECT
        if key not in self.node.annotations or self.state == S.TESTING:
            return None  # a running test answers first; the request waits for it
        why = bounded(self.node.annotations[key] or "no reason given", 512)
        if self.state == S.QUALIFIED and self.policy.triggers.on_suspect:
            changes: Changes = {key: None}
            report = report_reference(self.node.annotations[key])
            if report is not None:
                # The report is evidence: it goes on the ticket if the probe confirms.
                changes[keys.EVIDENCE] = keys.join_list((*self.node.evidence, report))
            return _Step(E.SUSPECTED, why, changes)
        ignored = (
            "triggers.onSuspect is off" if self.state == S.QUALIFIED else f"node is {self.state}"
        )
        return _Step(
            None, f"{key} ignored: {ignored}", {key: None}, requeue=REQUEUE_AFTER_TRANSITION
        )

    def _schedule(self) -> _Step | None:
        return {
            S.UNQUALIFIED: self._join,
            S.QUALIFIED: self._requalify,
            S.SUSPECT: self._retest_suspect,
            S.VERIFYING: self._retest_repair,
        }.get(self.state, lambda: None)()

    def _start(self, event: Event, detail: str, *, suite: Suite | None = None) -> _Step:
        return _Step(event, detail, suite=suite, attempt=self.next_attempt())

    def _join(self) -> _Step | None:
        hardware = self.obs.hardware
        if hardware is not None and hardware.retired is not None:
            return _Step(E.HARDWARE_RETIRED, f"{hardware.describe()}; {hardware.retired}")
        if not self.policy.triggers.on_join:
            return _Step(E.ADMITTED, "acceptance disabled")
        first_sight = self.node.state is None
        registered_gated = self.node.has_taint(self.policy.taints.gate)
        if first_sight and self.obs.idle_since is None and not registered_gated:
            # Installing sdcguard on a busy fleet must not gate nodes that already serve:
            # they count as qualified long ago and are screened in their first idle window.
            if self.obs.joined_after_start:
                # A new node without the gate: work landed before sdcguard saw it.
                return _Step(
                    E.ADMITTED,
                    f"joined without the gate taint {self.policy.taints.gate} and ran "
                    "workloads before sdcguard saw it; register new nodes with the gate "
                    "(Karpenter NodePool startupTaints, kubelet --register-with-taints)",
                )
            return _Step(E.ADMITTED, "already running workloads when first seen")
        if self.obs.idle_since is None:
            return _Step(
                None, "gated; waiting for accelerator pods to leave", requeue=REQUEUE_WAITING
            )
        blocked = self.blocked(takes_node=False)
        if blocked:
            wait = blocked.about("acceptance waits")
            return _Step.waiting(wait, self._wait_requeue(), note=f"gated; {wait.message}")
        if hardware is not None and hardware.known:
            return self._start(
                E.REJOINED, f"{hardware.describe()}; test started, gated until it passes"
            )
        return self._start(E.JOINED, "started; the node stays gated until it passes")

    def _requalify(self) -> _Step | None:
        triggers, idle_since = self.policy.triggers, self.obs.idle_since
        qualified_at = self.node.qualified_at
        due: list[tuple[dt.datetime, Event, str]] = []
        if triggers.max_qualification_age != "0":
            age = dt.timedelta(seconds=parse_duration(triggers.max_qualification_age))
            expires = qualified_at + age if qualified_at else self.now
            due.append((expires, E.EXPIRY_DUE, "qualification expired"))
        used = idle_since is not None and (qualified_at is None or idle_since > qualified_at)
        if triggers.on_return_from_use.enabled and used and idle_since is not None:
            idle_for = dt.timedelta(seconds=parse_duration(triggers.on_return_from_use.idle_for))
            due.append(
                (idle_since + idle_for, E.IDLE_DUE, f"idle since {keys.format_time(idle_since)}")
            )
        if not due:
            return _Step(None, "qualified; no re-screening configured", requeue=REQUEUE_MAX)
        when, event, why = min(due, key=lambda d: d[0])
        if when > self.now:
            return _Step(
                None,
                f"qualified; next screening {keys.format_time(when)}",
                requeue=_until(when, self.now),
            )
        if idle_since is None:
            return _Step(None, f"{why}; waiting for an idle window", requeue=REQUEUE_MAX)
        blocked = self.blocked(takes_node=True, routine=True)
        if blocked:
            return _Step(None, f"{why}; waits: {blocked.message}", requeue=self._wait_requeue())
        return self._start(event, why)

    def _retest_suspect(self) -> _Step | None:
        if keys.HELD in self.node.annotations and self.obs.breaker_open:
            return _Step(
                None,
                "quarantine held: circuit breaker open; re-tested when it closes, or on "
                "request (kubectl sdc test)",
                requeue=REQUEUE_WAITING,
            )
        if self.obs.idle_since is None:
            # Held (our testing taint): no new work lands; the re-test starts once the
            # running work is done, and pending pods do not hold it back.
            why = (
                "held; waiting for running work to finish"
                if self.holding()
                else ("waiting for an idle window")
            )
            return _Step(None, f"suspect; {why}", requeue=REQUEUE_WAITING)
        blocked = self.blocked(takes_node=not self.holding())
        if blocked:
            wait = blocked.about("re-test waits")
            return _Step.waiting(wait, self._wait_requeue(), note=f"suspect; {wait.message}")
        suite = _covering_suite(self.policy, self.node.suspect_checks)
        checks = ", ".join(sorted(self.node.suspect_checks)) or "reported by a workload"
        return self._start(E.RETEST_DUE, f"re-testing ({checks})", suite=suite)

    def _retest_repair(self) -> _Step | None:
        if self.obs.ticket is None:
            return _Step(None, "verifying, but the ticket is gone", requeue=REQUEUE_WAITING)
        blocked = self.blocked(takes_node=False)
        if blocked:
            return _Step.waiting(blocked.about("verification waits"), self._wait_requeue())
        return self._start(E.RETEST_DUE, "verifying the repair again")

    def _wait_requeue(self) -> float:
        retry = self.node.retry_after
        if retry is not None and retry > self.now:
            return _until(retry, self.now)
        return REQUEUE_WAITING


class _Binder:
    """Turns table rows into concrete actions for one node (see module docstring)."""

    def __init__(self, reader: _Reader, step: _Step, target: NodeState) -> None:
        self.r = reader
        self.step = step
        self.target = target
        self.seq = reader.node.seq
        self.changes: Changes = dict(step.changes)
        self._ticket_names: tuple[str, ...] | None = None
        self._choice: ScopeChoice | None = None

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
        refailed = set(self.step.refailed)
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
        evidence = self.step.evidence or node.evidence
        hardware = r.obs.hardware
        used = hardware.cycles if hardware is not None else 0
        begins = self.step.event in (E.TEST_FAILED, E.REPAIR_CYCLES_EXCEEDED)
        names = self._new_ticket_names()
        if len(names) == 1 and not self.quarantined_devices():
            cycle = used + 1 if begins else max(1, used)
            return (
                CreateTicket(
                    names[0], evidence, self.step.detail, cycle, retired, used, self._record()
                ),
            )
        made = []
        for i, name in enumerate(names):
            uuid = self.choice.devices[i].device.uuid
            own = hardware.device_cycles.get(uuid.lower(), 0) if hardware and uuid else 0
            cycle = own + 1 if begins else max(1, own)
            record = self._record(only=i)
            made.append(CreateTicket(name, evidence, self.step.detail, cycle, retired, own, record))
        return tuple(made)

    def bind(self, action: Action) -> Action | tuple[Action, ...] | None:
        """The action with the node's names and keys filled in (None: nothing to do
        here). Bookkeeping actions become annotation changes (``self.changes``)."""
        r, node, policy = self.r, self.r.node, self.r.policy
        ticket = r.obs.ticket
        match action:
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
                self.changes[keys.SUSPECT_CHECKS] = keys.join_list(self.step.suspect_checks)
                self.changes[keys.EVIDENCE] = keys.join_list(self.step.evidence)
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
            case EndDrain():
                self.changes[keys.DRAIN_UNTIL] = None
                return None
            case AddTaint(role=TaintRole.TESTING) if (
                self.step.event == E.SUSPECTED and not policy.triggers.hold_suspects
            ):
                return None
            case AddTaint(role=TaintRole.QUARANTINE) if self.quarantined_devices():
                if ticket is not None:
                    return taint_devices(ticket, bounded(self.step.detail, 1024), policy)
                names = self._new_ticket_names()
                return TaintDevices(
                    names[0],
                    self.quarantined_devices(),
                    bounded(self.step.detail, 1024),
                    policy.quarantine.device_taint_effect,
                    names,
                )
            case RemoveTaint(role=TaintRole.QUARANTINE) if ticket and ticket.devices:
                return UntaintDevices(ticket.name)
            case UntaintDevices():
                if ticket is None or not ticket.devices:
                    return None
                going = set(self.step.returned)
                if not going:
                    return UntaintDevices(ticket.name)
                devices = tuple(d for m in ticket.members if m.name in going for d in m.devices)
                return UntaintDevices(ticket.name, devices)
            case Cordon() | Drain() if self.target != S.RETIRED and self.quarantined_devices():
                return None  # the node serves with its other devices
            case AddTaint(role=role):
                key = _taint_key(policy, role)
                if node.has_taint(key) and (key in node.owned_taints or role != TaintRole.GATE):
                    return None  # ours already, or someone else's that we do not adopt
                return AddTaint(role, key, _taint_effect(policy, role))
            case RemoveTaint(role=role):
                key = _taint_key(policy, role)
                return RemoveTaint(role, key) if key in node.owned_taints else None
            case Cordon():
                wanted = (
                    policy.repair.retire_action == RetireAction.CORDON
                    if self.target == S.RETIRED
                    else policy.quarantine.cordon
                )
                return action if wanted and not node.unschedulable else None
            case Uncordon():
                return action if node.cordoned_by_us else None
            case Drain():
                if not policy.quarantine.drain or policy.mode == Mode.OBSERVE:
                    return None
                timeout = policy.quarantine.drain_timeout_seconds
                if self.step.event != E.DRAIN_DUE and timeout > 0:
                    until = self.r.now + dt.timedelta(seconds=timeout)
                    self.changes[keys.DRAIN_UNTIL] = keys.format_time(until)
                return action
            case SetAutoscalerAnnotations(on=True):
                in_place = policy.repair.strategy == RepairStrategy.IN_PLACE
                missing = any(k not in node.annotations for k in keys.AUTOSCALER_ANNOTATIONS)
                return action if in_place and missing else None
            case SetAutoscalerAnnotations(on=False):
                return action if node.owned_annotations else None
            case CreateTest(suite=suite, reason=reason):
                name = self._name()
                self.changes[keys.CURRENT_TEST] = name
                return CreateTest(
                    suite=suite or self.step.suite or Suite.REQUALIFICATION,
                    reason=reason,
                    name=name,
                    attempt=self.step.attempt,
                    # Scope Device: the (first) device ticket this verification answers for.
                    ticket=self._phase_targets(TicketPhase.VERIFYING)[0] if ticket else None,
                )
            case CancelTest():
                test = r.obs.test
                if test is None or test.finished:
                    return None
                return CancelTest(test.name, self.step.detail)
            case CreateTicket(retired=retired):
                return None if ticket is not None else self._create_tickets(retired)
            case RecordHardware(failure=failure, retire=retire):
                if self.step.event == E.DEVICES_RETURNED and not self.step.refailed:
                    return None  # every device under verification passed
                failed = r.obs.test.name if r.obs.test is not None and failure else ""
                names = self._ticket_names or ()
                named = ticket.name if ticket is not None else (names[0] if names else "")
                return RecordHardware(
                    failure,
                    retire,
                    failed,
                    named,
                    self.step.detail,
                    self._device_tickets(names),
                )
            case SetTicketPhase(name=name) if name:
                return action  # named already (a device ticket)
            case SetTicketPhase(phase=phase):
                return tuple(
                    SetTicketPhase(phase, name, self.step.detail)
                    for name in self._phase_targets(phase)
                )
            case CloseTicket():
                if self.step.event == E.DEVICES_RETURNED or self.step.returned:
                    names = self.step.returned
                else:
                    names = self._members(())
                return tuple(CloseTicket(name, self.step.detail) for name in names)
            case RaiseCycle():
                failed = self.step.evidence[0] if self.step.evidence else ""
                names = self.step.refailed if ticket and ticket.members else self._members(())
                return tuple(RaiseCycle(name, failed) for name in names)
            case Retire():
                delete = policy.repair.retire_action == RetireAction.DELETE
                if ticket is None:
                    return Retire("", delete_node=delete)  # born Retired (its Open status)
                names = self._members(())
                # A device ticket retired retires the node: all its tickets go with it.
                return (
                    Retire(names[0], delete_node=delete),
                    *(SetTicketPhase(TicketPhase.RETIRED, n, self.step.detail) for n in names[1:]),
                )
            case MarkQualified():
                return MarkQualified(r.now, r.obs.test.fingerprint if r.obs.test else "")
            case EmitEvent(reason=reason, message=message, warning=warning, routine=routine):
                text = message.format(node=node.name, detail=self.step.detail)
                return EmitEvent(reason, text, warning, routine)
            case _:
                return action


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


def _verifies_in_service(reader: _Reader, bound: list[Action]) -> bool:
    """A verification starts on a node whose quarantine is of scope Device, unreserved."""
    ticket = reader.obs.ticket
    verifies = any(
        isinstance(a, CreateTest) and a.reason == ScreeningReason.REPAIR_VERIFICATION for a in bound
    )
    testing = _taint_key(reader.policy, TaintRole.TESTING)
    return bool(ticket and ticket.devices and verifies and not reader.node.has_taint(testing))


def _heal(reader: _Reader) -> list[Action]:
    """Actions that make the node match its state (Enforce only; adds, never removes)."""
    policy, node, state = reader.policy, reader.node, reader.state
    roles: list[TaintRole] = []
    actions: list[Action] = []
    gated = policy.triggers.on_join and node.qualified_at is None
    if state == S.UNQUALIFIED and gated:
        roles.append(TaintRole.GATE)
    elif state == S.TESTING:
        roles += [TaintRole.GATE, TaintRole.TESTING] if gated else [TaintRole.TESTING]
    elif (ticket := reader.obs.ticket) is not None and ticket.devices and state != S.RETIRED:
        # Scope Device: the node serves with its other devices, reserved only to verify.
        # Its rules are ensured on every look: a rule deleted by hand comes back, and a
        # device renamed in its ResourceSlice (a driver restart) is selected anew.
        if state == S.VERIFYING:
            roles.append(TaintRole.TESTING)
        actions.append(taint_devices(ticket, f"ticket {ticket.name}", policy))
        if state == S.REPAIRING:
            # A device ticket acknowledged after its node entered repair enters it too.
            actions += [
                SetTicketPhase(TicketPhase.IN_REPAIR, m.name, "acknowledged")
                for m in ticket.members
                if m.acknowledged
                and not m.resolved
                and m.phase in (TicketPhase.OPEN, TicketPhase.ACKNOWLEDGED)
            ]
    elif state in (S.QUARANTINED, S.REPAIRING, S.VERIFYING, S.RETIRED):
        roles.append(TaintRole.QUARANTINE)
        actions.append(Cordon())
        if state == S.QUARANTINED and reader.obs.ticket is None:
            actions.append(CreateTicket())
    return [AddTaint(role) for role in roles] + actions


def decide(observed: Observed, policy: SDCPolicySpec, now: dt.datetime) -> Decision:
    """The next state of ``observed.node``, the actions that get it there, and when to look again.

    Pure: reads only its arguments. Raises IllegalTransition only on a bug (an event
    chosen for a state that has no row for it).
    """
    reader = _Reader(observed, policy, now)
    node, state = observed.node, reader.state
    step = reader.step()
    if step.event is None:
        target = state
        template: list[Action] = [] if policy.mode == Mode.OBSERVE else _heal(reader)
        requeue = step.requeue
    else:
        row = transition(state, step.event)
        target = row.target
        template = list(row.actions)
        requeue = REQUEUE_AFTER_TRANSITION if step.requeue is None else step.requeue
    binder = _Binder(reader, step, target)
    bound: list[Action] = []
    for action in template:
        made = binder.bind(action)
        if isinstance(made, tuple):
            bound += made
        elif made is not None:
            bound.append(made)
    reserves_in_service = _verifies_in_service(reader, bound)
    if reserves_in_service:
        # A device-scope quarantine left the node serving: reserve it, so the
        # verification probe gets every device (the failed one included) once the
        # workloads on the others end.
        testing = _taint_key(policy, TaintRole.TESTING)
        bound.append(AddTaint(TaintRole.TESTING, testing, _taint_effect(policy, TaintRole.TESTING)))
    elif (
        step.event is not None
        and target == S.QUARANTINED
        and observed.ticket is not None
        and observed.ticket.devices
        and policy.taints.testing in node.owned_taints
    ):
        # A failed verification: the devices stay tainted, the node serves again.
        bound.append(RemoveTaint(TaintRole.TESTING, policy.taints.testing))
    observe = policy.mode == Mode.OBSERVE
    gate = policy.taints.gate
    if not (observe and node.has_taint(gate)) and _unseen_and_waiting(reader, step, bound):
        # A gated node that waits for its acceptance test: its taint says all there is
        # to say. Label and adopt nothing yet (the reservation does both), so a node
        # costs no write until its test starts.
        return Decision(
            node=node.name,
            previous=None,
            state=target,
            event=None,
            actions=(),
            requeue_after=step.requeue,
            note=step.detail,
            waits_for_budget=reader.budget_blocked,
        )
    if node.state != target and not any(isinstance(a, SetLabel) for a in bound):
        bound.insert(0, SetLabel(target))
    wait = step.waits.bounded() if step.waits and step.event is None else None
    published = publish(wait, node.name, node.annotations, requeue, now)
    binder.changes.update(published.changes)
    requeue = published.requeue
    if published.event_message is not None:
        bound.append(EmitEvent("Waiting", published.event_message, warning=True))
    label = node.state_label
    if label is not None and label != state.value:
        # Someone wrote the label by hand (or mangled it): the records win, and say so.
        bound.append(
            EmitEvent(
                "StateLabelCorrected",
                f"{node.name}: label {keys.LABEL_STATE}={label} disagrees with the records; "
                f"the state is {state.value}, and the label says so again",
                warning=True,
            )
        )
    if node.state != target:
        binder.changes[keys.STATE_SINCE] = keys.format_time(now)
    if target not in (S.QUARANTINED, S.REPAIRING):
        binder.changes[keys.DRAIN_UNTIL] = None  # a drain ends with the quarantine
    if step.event is not None and keys.CURRENT_TEST not in binder.changes:
        binder.changes[keys.CURRENT_TEST] = (
            None  # leaving a test behind: its outcome no longer counts
        )
    history = tuple(a for a in bound if isinstance(a, RecordHardware))
    if history and not observe:
        # Written after the node patch (plan.Stage.HISTORY): the patch says what, so a
        # pass after an interruption in between can still write it.
        binder.changes[keys.HISTORY] = history_note(history, now)
    elif node.state != target:
        binder.changes[keys.HISTORY] = None  # the note belongs to the state it came with
    changes = tuple(
        (k, v) for k, v in sorted(binder.changes.items()) if node.annotations.get(k) != v
    )
    if changes:
        bound.append(Annotate(changes))

    suppressed: tuple[Action, ...] = ()
    if observe:
        suppressed = tuple(a for a in bound if isinstance(a, OBSERVE_SUPPRESSED))
        bound = [a for a in bound if not isinstance(a, OBSERVE_SUPPRESSED)]
        if node.has_taint(gate):
            # Observe changes no scheduling, and that includes sdcguard's own gate: a node
            # that registered with it is let in at once, whatever its tests will say.
            bound.append(RemoveTaint(TaintRole.GATE, gate, registered=True))
    starts_test = any(isinstance(a, CreateTest) for a in bound)
    held = target == S.SUSPECT and {**node.annotations, **binder.changes}.get(keys.HELD)
    # Only a node that was serving counts against maxUnavailable when we reserve it.
    takes_node = reserves_in_service or (
        state in (S.QUALIFIED, S.SUSPECT)
        and any(isinstance(a, AddTaint) and a.role == TaintRole.TESTING for a in bound)
    )
    return Decision(
        node=node.name,
        previous=node.state,
        state=target,
        event=step.event,
        actions=tuple(bound),
        suppressed=suppressed,
        requeue_after=requeue,
        note=step.detail,
        starts_test=starts_test,
        takes_node=takes_node,
        waits_for_budget=reader.budget_blocked and not starts_test,
        held=bool(held),
        wait=wait,
        waiting_test=step.waiting_test if wait is not None else None,
    )


def _unseen_and_waiting(reader: _Reader, step: _Step, bound: list[Action]) -> bool:
    """Never labelled, still Unqualified, and nothing to do but bookkeeping: the only
    node action would adopt the gate taint it already carries."""
    node = reader.node
    if node.state_label is not None or reader.state != S.UNQUALIFIED or step.event is not None:
        return False
    if step.waiting_test is not None:
        return False  # a test a person created waits: say why, on it and the node
    if step.changes or node.annotations.get(keys.CURRENT_TEST):
        return False
    gate = reader.policy.taints.gate
    return node.has_taint(gate) and all(isinstance(a, AddTaint) and a.key == gate for a in bound)


_PRIORITY = {
    S.VERIFYING: 0,
    S.QUARANTINED: 0,
    S.REPAIRING: 0,
    S.UNQUALIFIED: 1,
    S.SUSPECT: 2,
    S.TESTING: 3,
    S.QUALIFIED: 4,
}
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def priority(observed: Observed) -> tuple[int, dt.datetime, str]:
    """The order in which nodes get budget: repairs and new nodes first, then suspects,
    then the longest-qualified nodes."""
    state = observed.node.state or S.UNQUALIFIED
    return (_PRIORITY.get(state, 5), observed.node.qualified_at or _EPOCH, observed.node.name)


def iter_decisions(
    observations: Iterable[Observed],
    policy: SDCPolicySpec,
    now: dt.datetime,
    others: Mapping[str, PoolUsage] | None = None,
    between: Callable[[], None] | None = None,
) -> Iterator[Decision]:
    """Decide nodes of a policy in one pass, so budgets hold across nodes; lazily, so
    a caller may attend to something urgent between two nodes of a long pass.

    Pool usage is computed from all observations plus ``others`` (the usage by pool of
    the policy's nodes not decided in this pass, as last seen), then each decision
    that starts a test reserves its share before the next node is decided. Repairs and
    new nodes go first, then suspects, then the longest-qualified nodes.

    A node whose event has no row in the lifecycle table (a bug) costs only that node:
    its decision does nothing and carries ``illegal``.

    ``between`` is called every 256 nodes while the pools are counted, before the first
    decision (the caller's chance to serve urgent work there too: at 20,000 nodes the
    count is some 0.1 s of CPU).
    """
    ordered = sorted(observations, key=priority)
    holding = frozenset({policy.taints.testing, policy.taints.quarantine})
    pools = dict(others or {})
    members = []
    for count, observed in enumerate(ordered):
        if between is not None and count % 256 == 255:
            between()
        member = observed.pool_member(holding)
        add_member(pools, member)
        members.append(member)
    for observed, before in zip(ordered, members, strict=True):
        usage = pools.get(observed.node.pool, PoolUsage(pool=observed.node.pool))
        try:
            decision = decide(dataclasses.replace(observed, usage=usage), policy, now)
        except IllegalTransition as exc:
            yield Decision(
                node=observed.node.name,
                previous=observed.node.state,
                state=exc.state,
                event=None,
                actions=(),
                requeue_after=REQUEUE_WAITING,
                note=str(exc),
                illegal=exc,
            )
            continue
        after = member_after(before, decision)
        # Only what a decision adds is counted before its write succeeds: a node it
        # holds (a test started, or a quarantine of a node that was not held) counts
        # for the next node at once; a release counts once it is written and seen.
        grown = PoolMember(
            before.pool,
            before.held or after.held,
            before.testing or after.testing,
            before.devices,
            max(before.devices_held, after.devices_held),
        )
        if grown != before:
            add_member(pools, before, -1)
            add_member(pools, grown)
        yield decision


_ALWAYS_HELD = frozenset({NodeState.QUARANTINED, NodeState.REPAIRING, NodeState.VERIFYING})


def member_after(before: PoolMember, decision: Decision) -> PoolMember:
    """The node's share of its pool once ``decision`` is applied (see budgets).

    Quarantine and repair states hold the node, unless only some of its devices are
    out of service (quarantine scope Device: the node serves with the others, as
    ``Observed.pool_member`` counts it); Testing and Suspect hold it as before, or once
    the decision takes a serving node for a test; any other state holds nothing. A
    test the decision starts counts as running.
    """
    tainted = [a for a in decision.actions if isinstance(a, TaintDevices)]
    device_scope = bool(tainted) or (
        decision.previous in (NodeState.QUARANTINED, NodeState.REPAIRING) and not before.held
    )
    out = len(tainted[0].devices) if tainted else before.devices_held
    if decision.state in (NodeState.QUARANTINED, NodeState.REPAIRING) and device_scope:
        held = False
    elif decision.state in _ALWAYS_HELD:
        held = True
    elif decision.state in (NodeState.TESTING, NodeState.SUSPECT):
        held = before.held or decision.takes_node
    else:
        held, out = False, 0
    devices_held = before.devices if held else min(before.devices, out) if device_scope else 0
    return PoolMember(
        before.pool, held, before.testing or decision.starts_test, before.devices, devices_held
    )


def decide_all(
    observations: Iterable[Observed],
    policy: SDCPolicySpec,
    now: dt.datetime,
    others: Mapping[str, PoolUsage] | None = None,
) -> list[Decision]:
    """Every decision of :func:`iter_decisions`, in priority order."""
    return list(iter_decisions(observations, policy, now, others))
