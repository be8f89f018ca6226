"""Reading one node's observations into the event that applies, or into a wait.

One pass reads the observations in this order and fires the first event that applies:

1. opt-out label (``sdcguard.dev/exclude=true``) and opting in again;
2. requests by people (``sdcguard.dev/quarantine``, ``sdcguard.dev/release``);
3. the outcome of the node's current test (with confirmation, see judging);
4. a test someone else started on the node (adopted);
5. the repair ticket (acknowledged, resolved, retire);
6. a quarantine drain that goes on;
7. a workload's suspicion (``sdcguard.dev/suspect``);
8. the schedule: acceptance of new nodes, return from use after ``idleFor``, expiry
   after ``maxQualificationAge``, re-tests of suspects and repairs, all within the
   pool's budgets, never while a pending pod needs the node, never while paused, and
   (for routine re-screening) never while the circuit breaker is open.

A step held back says why as a typed wait (``domain.waits``).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from sdcguard.api import (
    BaselineMode,
    Mode,
    OverdueAction,
    RepairStrategy,
    Resolution,
    ScreeningReason,
    SDCPolicySpec,
    Suite,
    Verdict,
    parse_duration,
)
from sdcguard.domain import keys
from sdcguard.domain.baselines import unreachable_quorum
from sdcguard.domain.believed import believed_state
from sdcguard.domain.budgets import BudgetCheck, can_reserve
from sdcguard.domain.devicetaints import judge_devices
from sdcguard.domain.echo import bounded
from sdcguard.domain.judging import Outcome, assess, backoff_seconds, retry_time
from sdcguard.domain.lifecycle import TABLE
from sdcguard.domain.observed import NodeFacts, Observed, TestFacts
from sdcguard.domain.reports import report_reference
from sdcguard.domain.states import Event, NodeState
from sdcguard.domain.waits import Wait, WaitReason

PROBE_TOLERATED_CORDON = "node.kubernetes.io/unschedulable"
"""The cordon taint: probe Pods tolerate it so cordoned (quarantined) nodes can be verified."""
REQUEUE_AFTER_TRANSITION = 10.0
REQUEUE_TEST_RUNNING = 60.0
REQUEUE_WAITING = 120.0
REQUEUE_MAX = 3600.0

S = NodeState
E = Event
W = WaitReason
Changes = dict[str, str | None]


@dataclass
class Reading:
    """What the observations say happened: the event chosen (or none), and what binding
    its row needs."""

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

    @property
    def wait(self) -> Wait | None:
        """The wait this reading publishes (None with an event: a transition ends any
        wait), its message cut to what annotations and conditions keep."""
        return self.waits.bounded() if self.waits is not None and self.event is None else None

    @classmethod
    def waiting(
        cls, wait: Wait, requeue: float, test: str | None = None, *, note: str = ""
    ) -> Reading:
        """No event: the node's next step waits (``test``: the SDCTest the wait holds
        back, when it is a test's); ``note``: the decision's note, if not the wait's."""
        return cls(None, note or wait.message, requeue=requeue, waits=wait, waiting_test=test)


def _covering_suite(policy: SDCPolicySpec, checks: frozenset[str]) -> Suite:
    """The suite that re-tests every suspected check (requalification if it does)."""
    for suite in (Suite.REQUALIFICATION, Suite.ACCEPTANCE, Suite.REPAIR_VERIFICATION):
        if checks <= {c.name.value for c in policy.suites.checks(suite)}:
            return suite
    return Suite.REQUALIFICATION


def mixed_mig_message(offered: str) -> str:
    """Why a node with whole GPUs and MIG instances at once is not screened."""
    return (
        f"node offers whole GPUs and MIG instances at once ({offered}): sdcguard screens "
        "a node whose GPUs are all whole or all partitioned into MIG instances; "
        "repartition it so that every GPU is MIG-enabled, or none is"
    )


def _until(when: dt.datetime, now: dt.datetime) -> float:
    return min(REQUEUE_MAX, max(1.0, (when - now).total_seconds()))


class Reader:
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
        return self.node.has_taint(key) and key in self.node.owned_taints

    def cannot_run(self) -> Wait | None:
        """Why a probe could not run on the node now (a test a person asked for waits only
        for these: budgets, back-off and the breaker give way to the request)."""
        node = self.node
        if not node.ready:
            return Wait(W.NODE_NOT_READY, "node not Ready")
        foreign = self.untolerated_taints()
        if foreign:
            return Wait(
                W.FOREIGN_TAINT,
                f"taint {foreign[0]} keeps probes off the node: tolerate it in "
                "spec.probe.tolerations",
            )
        if node.mixed_mig:
            return Wait(W.MIXED_MIG, mixed_mig_message(node.mixed_mig))
        if self.obs.runtime_class_missing:
            name = self.policy.probe.runtime_class_name
            return Wait(
                W.RUNTIME_CLASS_MISSING,
                f"RuntimeClass {name} (spec.probe.runtimeClassName) does not exist, so the "
                "API server would refuse the probe Pod: create it (GPU Operator installs "
                "name it nvidia) or clear the field",
            )
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
        if retry is not None and retry > self.now and not self.back_off_waived():
            until = keys.format_time(retry)
            return Wait(
                W.BACK_OFF,
                f"backing off after inconclusive results until {until} "
                f"(kubectl sdc test {node.name} screens it now)",
            )
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
        if check.allowed and takes_node and obs.topology_wait:
            check = BudgetCheck(False, obs.topology_wait)
        self.budget_blocked = not check.allowed
        return None if check.allowed else Wait(W.BUDGET, check.reason)

    def back_off_waived(self) -> bool:
        """The policy switched from Observe to Enforce after the node's back-off began,
        and the node is not qualified: the switch gated it, so it is screened as soon as
        the budgets allow instead of waiting gated and idle. (When the back-off began is
        its end less its length: the test that started it is no longer the node's.)"""
        since, retry = self.obs.enforced_since, self.node.retry_after
        if since is None or retry is None or self.node.qualified_at is not None:
            return False
        base = parse_duration(self.policy.triggers.inconclusive_backoff)
        length = backoff_seconds(base, max(1, self.node.inconclusive_count))
        return retry - dt.timedelta(seconds=length) <= since

    def untolerated_taints(self) -> list[str]:
        """Taints of others that repel probe Pods, so a test started now could never run:
        a NoSchedule or NoExecute taint tolerated neither by sdcguard's own tolerations
        (its taints and the cordon) nor by the policy's (spec.probe.tolerations, matched
        as Kubernetes matches them: key, operator, value, effect). As key=value:effect."""
        ours = {self.policy.taints.gate, self.policy.taints.testing, self.policy.taints.quarantine}
        tolerations = self.policy.probe.tolerations
        return sorted(
            f"{t.key}={t.value}:{t.effect}" if t.value else f"{t.key}:{t.effect}"
            for t in self.node.taints
            if t.effect in ("NoSchedule", "NoExecute")
            and t.key not in ours
            and t.key != PROBE_TOLERATED_CORDON
            and not any(tol.tolerates(t.key, t.value, t.effect) for tol in tolerations)
        )

    def next_attempt(self) -> int:
        return min(100, self.node.inconclusive_count + 1)

    # Steps -----------------------------------------------------------------------

    def step(self) -> Reading:
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
        return Reading(None, f"{self.state}: nothing to do", requeue=REQUEUE_MAX)

    def _awaiting_baseline(self, test_name: str) -> str:
        """Why the test waits for a baseline, and, where its pool is smaller than the
        quorum (a consensus that can never form), the command that ends the wait."""
        quorum = self.policy.baseline.quorum
        text = (
            f"test {test_name} waits for a baseline: its digests are recorded, and "
            f"{quorum} nodes must agree"
        )
        pool_nodes = self.obs.usage.nodes
        if self.policy.baseline.mode == BaselineMode.CONSENSUS and unreachable_quorum(
            pool_nodes, quorum
        ):
            text += (
                f"; its pool has only {pool_nodes} node{'s' if pool_nodes != 1 else ''}, "
                f"so approve its digests: kubectl sdc baselines approve --node {self.node.name}"
            )
        return text

    def _exclusion(self) -> Reading | None:
        if self.node.excluded:
            if self.state == S.EXCLUDED:
                return Reading(None, "excluded: sdcguard touches nothing")
            return Reading(E.OPTED_OUT, f"label {keys.LABEL_EXCLUDE}=true")
        if self.state == S.EXCLUDED:
            return Reading(E.OPTED_IN, f"label {keys.LABEL_EXCLUDE} removed")
        return None

    def _requests(self) -> Reading | None:
        for key, event in (
            (keys.REQUEST_QUARANTINE, E.MANUAL_QUARANTINE),
            (keys.REQUEST_RELEASE, E.MANUAL_RELEASE),
        ):
            if key not in self.node.annotations:
                continue
            why = bounded(self.node.annotations[key] or "no reason given", 512)
            if (self.state, event) not in TABLE:
                return Reading(
                    None,
                    f"{key} ignored in state {self.state}",
                    {key: None},
                    requeue=REQUEUE_AFTER_TRANSITION,
                )
            return Reading(event, f"{key}: {why}", {key: None}, evidence=self.node.evidence)
        return None

    def _outcome(self) -> Reading | None:
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
                wait = Wait(W.AWAITING_BASELINE, self._awaiting_baseline(test.name))
                return Reading.waiting(wait, REQUEUE_TEST_RUNNING, test.name)
            late = self._work_before_the_gate()
            if late is not None:
                return late
            if self.obs.probe_unschedulable:
                wait = Wait(
                    W.PROBE_UNSCHEDULABLE,
                    f"its probe Pod cannot be scheduled: {self.obs.probe_unschedulable}",
                ).about(f"test {test.name} waits")
                return Reading.waiting(wait.bounded(), REQUEUE_TEST_RUNNING, test.name)
            if self.obs.queued:
                queued = self.obs.queued[0]
                wait = Wait(W.ANOTHER_TEST, f"test {test.name} still running")
                return Reading.waiting(
                    wait.about(f"test {queued} waits"), REQUEUE_TEST_RUNNING, queued
                )
            return Reading(
                None, f"waiting for {test.name} ({test.phase})", requeue=REQUEUE_TEST_RUNNING
            )

        if self.state == S.TESTING and test.ended_by_policy_change:
            said = f"{test.name} was cancelled by a policy change ({test.end_reason})"
            if self.node.qualified_at:
                return Reading(E.TEST_CANCELLED, said)
            return Reading(E.ACCEPTANCE_CANCELLED, said)
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
            return Reading(E.TEST_PASSED, found.message)
        if found.outcome == Outcome.CONFIRMED:
            if self.obs.breaker_open:
                detail = (
                    f"{found.message}; quarantine held: circuit breaker open "
                    "(re-tested when it closes, or on request)"
                )
                return Reading(E.QUARANTINE_HELD, detail, evidence=evidence, suspect_checks=checks)
            limit = self.policy.repair.max_repair_cycles
            if hardware is not None and hardware.cycles >= limit:
                detail = (
                    f"{found.message}; its hardware used {hardware.cycles} of {limit} repair "
                    f"cycles within {self.policy.repair.repair_cycle_window}: "
                    f"{hardware.describe()}"
                )
                return Reading(E.REPAIR_CYCLES_EXCEEDED, detail, evidence=evidence)
            return Reading(E.TEST_FAILED, found.message, evidence=evidence)
        if found.outcome == Outcome.NEEDS_RERUN:
            rerun = test.attempt + 1 if test.reason == ScreeningReason.CONFIRMATION else 1
            event = (
                E.TEST_FAILED_UNCONFIRMED if test.verdict == Verdict.SDC else E.CONFIRMATION_PASSED
            )
            return Reading(
                event,
                found.message,
                suite=test.suite,
                attempt=rerun,
                evidence=evidence,
                suspect_checks=checks,
            )
        if found.outcome == Outcome.FLAKY:
            return Reading(E.FLAKY, found.message, evidence=evidence, suspect_checks=checks)
        return self._inconclusive(found.message)

    def _verification(self, verdict: Verdict | None, name: str, message: str) -> Reading:
        said = f"{name}: {message}" if message else name
        if verdict == Verdict.PASS:
            return Reading(E.VERIFICATION_PASSED, said)
        if verdict == Verdict.SDC:
            ticket, hardware = self.obs.ticket, self.obs.hardware
            cycle = ticket.cycle if ticket else 1
            if hardware is not None:
                # Cycles of earlier tickets (under this Node name or another) count too.
                cycle = max(cycle, hardware.cycles)
            if cycle >= self.policy.repair.max_repair_cycles:
                detail = f"{said}; repair cycle {cycle} of {self.policy.repair.max_repair_cycles}"
                return Reading(E.REPAIR_CYCLES_EXCEEDED, detail)
            return Reading(
                E.VERIFICATION_FAILED, f"{said}; repair cycle {cycle + 1} begins", evidence=(name,)
            )
        return self._inconclusive(said)

    def _verify_devices(self, test: TestFacts) -> Reading:
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
                return Reading(E.REPAIR_CYCLES_EXCEEDED, detail)
        detail = f"{said}; {judged.message}"
        if not judged.failed and not judged.waiting:
            return Reading(E.VERIFICATION_PASSED, detail, returned=judged.passed)
        if not judged.passed:
            return Reading(
                E.VERIFICATION_FAILED, detail, evidence=(test.name,), refailed=judged.failed
            )
        return Reading(
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

    def _inconclusive(self, why: str) -> Reading:
        count = self.node.inconclusive_count + 1
        if self.state == S.TESTING:
            event = E.TEST_INCONCLUSIVE if self.node.qualified_at else E.ACCEPTANCE_INCONCLUSIVE
        else:
            event = E.TEST_INCONCLUSIVE
        return Reading(event, f"{why} (inconclusive #{count})")

    def _adoption(self) -> Reading | None:
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
                return Reading.waiting(wait, REQUEUE_WAITING, test.name)
            return Reading(E.TEST_STARTED, f"adopted {test.name}")
        return None

    def _ticket(self) -> Reading | None:
        ticket = self.obs.ticket
        if self.state == S.QUARANTINED and ticket is None:
            return self._observed_failure()
        if self.state not in (S.QUARANTINED, S.REPAIRING) or ticket is None:
            return None
        if ticket.resolution == Resolution.RETIRE:
            return Reading(E.TICKET_RETIRE, f"ticket {ticket.name} resolved Retire")
        if ticket.resolution is not None:
            # Scope Device: the node serves with its other devices, and verifying takes it.
            blocked = self.blocked(takes_node=bool(ticket.devices) and not self.holding())
            if blocked:
                return Reading.waiting(blocked.about("verification waits"), self._wait_requeue())
            return Reading(
                E.TICKET_RESOLVED, f"ticket {ticket.name} resolved {ticket.resolution}; verifying"
            )
        if self.state == S.QUARANTINED and ticket.acknowledged:
            if self.policy.repair.strategy == RepairStrategy.REPLACE:
                if self.obs.breaker_open:
                    wait = Wait(W.BREAKER_OPEN, "circuit breaker open")
                    return Reading.waiting(wait.about("replacement waits"), REQUEUE_WAITING)
                return Reading(E.REPLACE_DUE, f"ticket {ticket.name} acknowledged")
            return Reading(E.REPAIR_STARTED, f"ticket {ticket.name} acknowledged")
        return None

    def _observed_failure(self) -> Reading | None:
        """A quarantine Observe mode recorded without acting (no ticket, no taint), now
        under Enforce: confirm it first. One screening of an Observe policy, perhaps
        weeks old and never confirmed, is not enough to open a ticket on; the re-test
        (and its confirmation re-runs) decide, with the hardware history and repair
        cycle a confirmed failure always gets."""
        if self.policy.mode == Mode.OBSERVE:
            return None
        found = keys.parse_observed_failure(self.node.annotations.get(keys.OBSERVED_FAILURE))
        if found is None:
            return None  # lost ticket of an Enforce quarantine: upkeep opens it again
        tests, checks = found
        named = ", ".join(sorted(checks)) or "no check named"
        by = f" by {', '.join(tests)}" if tests else ""
        return Reading(
            E.OBSERVED_FAILURE,
            f"Observe mode recorded a failure ({named}){by}; the policy now enforces",
            {keys.OBSERVED_FAILURE: None},
            evidence=tests,
            suspect_checks=checks,
        )

    def _draining(self) -> Reading | None:
        """A drain whose evictions a PodDisruptionBudget refused goes on, with back-off,
        until ``sdcguard.dev/drain-until``; one that asked every pod ends."""
        if self.state not in (S.QUARANTINED, S.REPAIRING):
            return None
        raw = self.node.annotations.get(keys.DRAIN_UNTIL)
        if raw is None:
            return None
        if self.obs.drain_asked:
            return Reading(E.DRAIN_DONE, "every pod was asked to leave")
        until = keys.parse_time(raw)
        if until is None or until <= self.now or not self.policy.quarantine.drain:
            return Reading(
                E.DRAIN_TIMED_OUT,
                "pods are left: evictions were refused until the drain's time ran out",
                requeue=REQUEUE_MAX,
            )
        timeout = dt.timedelta(seconds=self.policy.quarantine.drain_timeout_seconds)
        elapsed = (self.now - (until - timeout)).total_seconds()
        backoff = min(60.0, max(2.0, elapsed / 2), _until(until, self.now))
        return Reading(E.DRAIN_DUE, "evicting pods again", requeue=backoff)

    def _suspicion(self) -> Reading | None:
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
            return Reading(E.SUSPECTED, why, changes)
        ignored = (
            "triggers.onSuspect is off" if self.state == S.QUALIFIED else f"node is {self.state}"
        )
        return Reading(
            None, f"{key} ignored: {ignored}", {key: None}, requeue=REQUEUE_AFTER_TRANSITION
        )

    def _schedule(self) -> Reading | None:
        return {
            S.UNQUALIFIED: self._join,
            S.QUALIFIED: self._requalify,
            S.SUSPECT: self._retest_suspect,
            S.VERIFYING: self._retest_repair,
        }.get(self.state, lambda: None)()

    def _start(self, event: Event, detail: str, *, suite: Suite | None = None) -> Reading:
        return Reading(event, detail, suite=suite, attempt=self.next_attempt())

    def _join(self) -> Reading | None:
        hardware = self.obs.hardware
        if hardware is not None and hardware.retired is not None:
            return Reading(E.HARDWARE_RETIRED, f"{hardware.describe()}; {hardware.retired}")
        if not self.policy.triggers.on_join:
            return Reading(E.ADMITTED, "acceptance disabled")
        first_sight = self.node.state is None
        registered_gated = self.node.has_taint(self.policy.taints.gate)
        if first_sight and self.obs.idle_since is None and not registered_gated:
            # Installing sdcguard on a busy fleet must not gate nodes that already serve:
            # they count as qualified long ago and are screened in their first idle window.
            return self._admitted_busy(
                "before sdcguard saw it", "already running workloads when first seen"
            )
        held = self.held_until_qualified()
        if self.obs.idle_since is None:
            return Reading(
                None, f"{held}; waiting for accelerator pods to leave", requeue=REQUEUE_WAITING
            )
        blocked = self.blocked(takes_node=False)
        if blocked:
            wait = blocked.about("acceptance waits")
            return Reading.waiting(wait, self._wait_requeue(), note=f"{held}; {wait.message}")
        if hardware is not None and hardware.known:
            return self._start(E.REJOINED, f"{hardware.describe()}; test started, {held}")
        return self._start(E.JOINED, f"started; {held} until it passes")

    def _admitted_busy(self, when: str, otherwise: str) -> Reading:
        """Admitted untested: the node ran workloads before sdcguard could gate it
        (``otherwise``: why, for a node that was there before the operator started)."""
        if self.obs.joined_after_start:
            # A new node without the gate: work landed before sdcguard gated it.
            return Reading(
                E.ADMITTED,
                f"joined without the gate taint {self.policy.taints.gate} and ran "
                f"workloads {when}; register new nodes with the gate "
                "(Karpenter NodePool startupTaints, kubelet --register-with-taints)",
            )
        return Reading(E.ADMITTED, otherwise)

    def _work_before_the_gate(self) -> Reading | None:
        """A node can take work in the moment before sdcguard gates it: the scheduler
        bound a Pod that sdcguard's copy had not seen when it reserved a node registered
        without the gate (or a Pod that tolerates the gate landed). The acceptance
        probe then cannot be scheduled beside that work, and the node already serves
        untested: the test yields and the node is admitted, as if sdcguard had seen the
        work first (screened in its first idle window). Only plain acceptance yields:
        hardware with a history joins through repair verification, which waits."""
        test = self.obs.test
        if (
            self.state != S.TESTING
            or test is None
            or test.suite != Suite.ACCEPTANCE
            or self.node.qualified_at is not None
            or self.obs.idle_since is not None
            or not self.obs.probe_unschedulable
        ):
            return None
        return self._admitted_busy(
            "before its acceptance test could start (bound before sdcguard gated it, or "
            "tolerating the gate; the test yields)",
            "took workloads before its acceptance test could start (the test yields)",
        )

    def held_until_qualified(self) -> str:
        """What an unqualified node is, in words true for the mode: Enforce gates it,
        Observe changes no scheduling (an Event that said "gated" there would be false)."""
        if self.policy.mode == Mode.OBSERVE:
            return "not yet qualified (Observe: not gated)"
        return "gated"

    def _requalify(self) -> Reading | None:
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
        if self.holding():
            # Held for an overdue re-screening: screened once idle, even if the policy
            # no longer forces it (the hold must not outlive its reason).
            due.append((self.now, E.EXPIRY_DUE, "held for its overdue re-screening"))
        if not due:
            return Reading(None, "qualified; no re-screening configured", requeue=REQUEUE_MAX)
        when, event, why = min(due, key=lambda d: d[0])
        if when > self.now:
            return Reading(
                None,
                f"qualified; next screening {keys.format_time(when)}",
                requeue=_until(when, self.now),
            )
        if idle_since is None:
            forced = self._force_overdue(qualified_at)
            if forced is not None:
                return forced
            return Reading(None, f"{why}; waiting for an idle window", requeue=REQUEUE_MAX)
        # Held for an overdue re-screening: pending pods no longer come first.
        blocked = self.blocked(takes_node=not self.holding(), routine=True)
        if blocked:
            return Reading(None, f"{why}; waits: {blocked.message}", requeue=self._wait_requeue())
        return self._start(event, why)

    def _force_overdue(self, qualified_at: dt.datetime | None) -> Reading | None:
        """triggers.overdue.action Drain, for a busy node whose qualification is older
        than maxQualificationAge: hold it (no new work lands; its screening starts once
        it is idle), and drain it once gracePeriod has passed since it became overdue.
        None: only warn (action Warn, Observe mode, or not overdue)."""
        triggers = self.policy.triggers
        if (
            triggers.overdue.action != OverdueAction.DRAIN
            or self.policy.mode == Mode.OBSERVE
            or triggers.max_qualification_age == "0"
            or qualified_at is None
        ):
            return None
        overdue_at = qualified_at + dt.timedelta(
            seconds=parse_duration(triggers.max_qualification_age)
        )
        if overdue_at > self.now:
            return None
        since = f"overdue since {keys.format_time(overdue_at)}"
        if not self.holding():
            return Reading(E.OVERDUE_HELD, since, requeue=REQUEUE_WAITING)
        drain_at = overdue_at + dt.timedelta(seconds=parse_duration(triggers.overdue.grace_period))
        if drain_at <= self.now:
            return Reading(
                E.OVERDUE_DRAIN_DUE,
                f"{since}; grace period over, draining for its re-screening",
                requeue=REQUEUE_WAITING,
            )
        return Reading(
            None,
            f"{since}; held, waiting for running work to finish (drained at "
            f"{keys.format_time(drain_at)})",
            requeue=min(REQUEUE_WAITING, _until(drain_at, self.now)),
        )

    def _retest_suspect(self) -> Reading | None:
        if keys.HELD in self.node.annotations and self.obs.breaker_open:
            return Reading(
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
            return Reading(None, f"suspect; {why}", requeue=REQUEUE_WAITING)
        blocked = self.blocked(takes_node=not self.holding())
        if blocked:
            wait = blocked.about("re-test waits")
            return Reading.waiting(wait, self._wait_requeue(), note=f"suspect; {wait.message}")
        suite = _covering_suite(self.policy, self.node.suspect_checks)
        checks = ", ".join(sorted(self.node.suspect_checks)) or "reported by a workload"
        return self._start(E.RETEST_DUE, f"re-testing ({checks})", suite=suite)

    def _retest_repair(self) -> Reading | None:
        if self.obs.ticket is None:
            return Reading(None, "verifying, but the ticket is gone", requeue=REQUEUE_WAITING)
        blocked = self.blocked(takes_node=False)
        if blocked:
            return Reading.waiting(blocked.about("verification waits"), self._wait_requeue())
        return self._start(E.RETEST_DUE, "verifying the repair again")

    def _wait_requeue(self) -> float:
        retry = self.node.retry_after
        if retry is not None and retry > self.now:
            return _until(retry, self.now)
        return REQUEUE_WAITING
