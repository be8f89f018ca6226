"""decide(): whole node stories, and the safety rules that hold in every one of them."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any, TypeVar

import pytest

from sdcguard.api import (
    Resolution,
    ScreeningReason,
    SDCPolicySpec,
    SDCTestPhase,
    Suite,
    TicketPhase,
    Verdict,
)
from sdcguard.domain import keys
from sdcguard.domain.budgets import PoolUsage
from sdcguard.domain.decide import (
    Decision,
    closes_as_replaced,
    decide,
    node_gone_closing,
)
from sdcguard.domain.lifecycle import (
    NODE_MUTATIONS,
    TICKET_ACTIONS,
    AddTaint,
    Annotate,
    CloseTicket,
    Cordon,
    CreateTest,
    CreateTicket,
    DeleteNode,
    EmitEvent,
    Event,
    MarkQualified,
    NodeState,
    RaiseCycle,
    RecordHardware,
    RemoveTaint,
    Retire,
    SetAutoscalerAnnotations,
    SetLabel,
    SetTicketPhase,
    Uncordon,
)
from sdcguard.domain.observed import NodeFacts, Observed, Taint, TestFacts
from sdcguard.domain.waits import WaitReason
from tests.unit.factories import HOUR, NOW, applied, node, policy, sdctest, ticket

S, E = NodeState, Event
GATE = "sdcguard.dev/unqualified"
TESTING = "sdcguard.dev/testing"
QUARANTINE = "sdcguard.dev/quarantined"
ROOMY = PoolUsage(nodes=100)
A = TypeVar("A")


def only(decision: Decision, kind: type[A]) -> list[A]:
    return [a for a in decision.actions if isinstance(a, kind)]


def one(decision: Decision, kind: type[A]) -> A:
    found = only(decision, kind)
    assert len(found) == 1, (kind, decision.actions)
    return found[0]


def taint_keys(n: NodeFacts) -> set[str]:
    return {t.key for t in n.taints}


def observe(n: NodeFacts, **kw: Any) -> Observed:
    kw.setdefault("idle_since", NOW - 2 * HOUR)
    kw.setdefault("usage", ROOMY)
    return Observed(node=n, **kw)


def created_test(decision: Decision) -> CreateTest:
    return one(decision, CreateTest)


def finish(test: CreateTest, verdict: Verdict, failed: tuple[str, ...] = ()) -> TestFacts:
    """The SDCTest that ``test`` created, finished with ``verdict``."""
    assert test.suite is not None
    return sdctest(
        test.name,
        suite=test.suite,
        reason=test.reason,
        attempt=test.attempt,
        verdict=verdict,
        failed=failed,
    )


def test_join_gates_tests_and_qualifies_on_pass() -> None:
    p = policy()
    n = node()  # first sight: no label
    d = decide(observe(n), p, NOW)
    assert (d.previous, d.event, d.state) == (None, E.JOINED, S.TESTING)
    test = created_test(d)
    assert (test.suite, test.reason, test.attempt) == (Suite.ACCEPTANCE, ScreeningReason.JOIN, 1)
    assert test.name == "gpu-1-0a1b2-1"
    n = applied(n, d)
    assert taint_keys(n) == {GATE, TESTING}
    assert n.labels[keys.LABEL_STATE] == "Testing" and n.current_test == test.name

    running = decide(
        observe(n, test=sdctest(test.name, suite=Suite.ACCEPTANCE, reason=ScreeningReason.JOIN)),
        p,
        NOW,
    )
    assert running.event is None and running.actions == () and running.requeue_after == 60

    d = decide(observe(n, test=finish(test, Verdict.PASS)), p, NOW + HOUR)
    assert (d.event, d.state) == (E.TEST_PASSED, S.QUALIFIED)
    n = applied(n, d)
    assert taint_keys(n) == set() and n.owned_taints == frozenset()
    assert n.qualified_at == NOW + HOUR and n.annotations[keys.FINGERPRINT] == "f" * 64
    assert n.current_test is None
    assert "passed" in one(d, EmitEvent).message


def test_gate_applied_at_registration_is_adopted_and_removed_on_pass() -> None:
    p = policy()
    n = node(taints=(Taint(GATE, "NoSchedule"),))
    d = decide(observe(n), p, NOW)
    n = applied(n, d)
    assert GATE in n.owned_taints
    test = created_test(d)
    n = applied(n, decide(observe(n, test=finish(test, Verdict.PASS)), p, NOW))
    assert taint_keys(n) == set()


def test_new_node_waits_for_budget_but_is_gated_at_once() -> None:
    p = policy(budgets={"maxConcurrentTests": 1})
    n = node()
    d = decide(observe(n, usage=PoolUsage(nodes=10, tests=1)), p, NOW)
    assert d.event is None and d.state == S.UNQUALIFIED
    assert "maxConcurrentTests 1" in d.note
    n = applied(n, d)
    assert taint_keys(n) == {GATE} and n.labels[keys.LABEL_STATE] == "Unqualified"
    assert n.annotations[keys.WAITING].startswith("acceptance waits: ")
    assert d.requeue_after == 60, "back when the wait deserves an Event"


def test_busy_node_seen_for_the_first_time_is_admitted_not_gated() -> None:
    d = decide(observe(node(), idle_since=None), policy(), NOW)
    assert (d.event, d.state) == (E.ADMITTED, S.QUALIFIED)
    assert not only(d, AddTaint)
    assert "already running workloads when first seen" in d.note


def test_new_node_that_took_work_before_the_gate_is_admitted_and_says_so() -> None:
    """A NodePool without the gate in startupTaints: pods landed before sdcguard saw the
    node. It is admitted untested (screened when idle), and the Event says why."""
    d = decide(observe(node(), idle_since=None, joined_after_start=True), policy(), NOW)
    assert (d.event, d.state) == (E.ADMITTED, S.QUALIFIED)
    assert not only(d, AddTaint)
    assert f"joined without the gate taint {GATE}" in d.note
    assert "startupTaints" in d.note
    events = only(d, EmitEvent)
    assert events and "joined without the gate taint" in events[0].message.format(
        node="n", detail=d.note
    )


UNSCHEDULABLE = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."


def _gated_a_moment_late() -> tuple[NodeFacts, TestFacts]:
    """A new node sdcguard saw idle and gated for acceptance, with its test running."""
    first = node()
    d = decide(observe(first, joined_after_start=True), policy(), NOW)
    assert (d.event, d.state) == (E.JOINED, S.TESTING)
    test = created_test(d)
    assert test.suite is not None
    running = sdctest(test.name, suite=test.suite, reason=test.reason, attempt=test.attempt)
    return applied(first, d), running


def test_work_bound_just_before_the_gate_admits_the_node_and_ends_its_test() -> None:
    """The scheduler bound a Pod to a node registered without the gate a moment before
    sdcguard gated it (its copy had not seen the binding): the probe cannot start
    beside the work, and the node already serves untested. The acceptance test yields,
    the node is admitted, and the Event names the missing gate."""
    n, running = _gated_a_moment_late()
    d = decide(
        observe(
            n,
            test=running,
            idle_since=None,
            joined_after_start=True,
            probe_unschedulable=UNSCHEDULABLE,
        ),
        policy(),
        NOW,
    )
    assert (d.event, d.state) == (E.ADMITTED, S.QUALIFIED)
    assert f"joined without the gate taint {GATE}" in d.note and "startupTaints" in d.note
    from sdcguard.domain.lifecycle import CancelTest

    assert [c.name for c in only(d, CancelTest)] == [running.name]
    assert taint_keys(applied(n, d)) == set()


def test_a_probe_that_cannot_start_on_an_idle_or_qualified_node_waits() -> None:
    """The test yields only to work that runs on a never-qualified node in plain
    acceptance: an idle node whose probe cannot be scheduled, a qualified node's
    re-screening, or known hardware's repair verification waits."""
    n, running = _gated_a_moment_late()
    idle = decide(
        observe(n, test=running, joined_after_start=True, probe_unschedulable=UNSCHEDULABLE),
        policy(),
        NOW,
    )
    q = node(state=S.TESTING, qualified_at=NOW - 10 * HOUR)
    q = dataclasses.replace(q, annotations={**q.annotations, keys.CURRENT_TEST: running.name})
    rescreen = decide(
        observe(q, test=running, idle_since=None, probe_unschedulable=UNSCHEDULABLE),
        policy(),
        NOW,
    )
    # Known hardware joins through repair verification: that test does not yield.
    verifying = dataclasses.replace(running, suite=Suite.REPAIR_VERIFICATION)
    rejoined = decide(
        observe(
            n,
            test=verifying,
            idle_since=None,
            joined_after_start=True,
            probe_unschedulable=UNSCHEDULABLE,
        ),
        policy(),
        NOW,
    )
    for d in (idle, rescreen, rejoined):
        assert d.event is None and d.state == S.TESTING
        assert d.wait is not None and d.wait.reason == WaitReason.PROBE_UNSCHEDULABLE


def quarantined_story(p: SDCPolicySpec | None = None) -> tuple[NodeFacts, list[Decision]]:
    """Qualified node returns from use, fails, fails the re-run: quarantined."""
    p = p or policy()
    n = node(state=S.QUALIFIED, qualified_at=NOW - 10 * HOUR)
    decisions = []
    d = decide(observe(n, idle_since=NOW - HOUR), p, NOW)
    decisions.append(d)
    n = applied(n, d)
    first = created_test(d)
    d = decide(observe(n, test=finish(first, Verdict.SDC, failed=("golden",))), p, NOW)
    decisions.append(d)
    n = applied(n, d)
    rerun = created_test(d)
    d = decide(observe(n, test=finish(rerun, Verdict.SDC, failed=("golden",))), p, NOW)
    decisions.append(d)
    return applied(n, d), decisions


def test_failure_is_confirmed_then_quarantined_with_taint_cordon_label_and_ticket() -> None:
    n, (idle, first, confirmed) = quarantined_story()
    assert (idle.event, idle.state) == (E.IDLE_DUE, S.TESTING)
    assert created_test(idle).reason == ScreeningReason.RETURN_FROM_USE
    assert idle.takes_node

    assert (first.event, first.state) == (E.TEST_FAILED_UNCONFIRMED, S.SUSPECT)
    rerun = created_test(first)
    assert (rerun.suite, rerun.reason, rerun.attempt) == (
        Suite.REQUALIFICATION,
        ScreeningReason.CONFIRMATION,
        1,
    )
    assert not only(first, CreateTicket) and not only(first, Cordon)

    assert (confirmed.event, confirmed.state) == (E.TEST_FAILED, S.QUARANTINED)
    ticket_action = one(confirmed, CreateTicket)
    assert ticket_action.evidence == ("gpu-1-0a1b2-1", "gpu-1-0a1b2-2")
    assert ticket_action.name == "gpu-1-0a1b2-3"
    assert one(confirmed, SetAutoscalerAnnotations) == SetAutoscalerAnnotations(on=True)
    assert one(confirmed, EmitEvent).warning
    assert taint_keys(n) == {QUARANTINE}
    assert n.unschedulable and n.cordoned_by_us
    assert n.labels[keys.LABEL_STATE] == "Quarantined"
    assert n.annotations[keys.CA_SCALE_DOWN_DISABLED] == "true"
    assert n.annotations[keys.KARPENTER_DO_NOT_DISRUPT] == "true"
    assert n.qualified_at is None and n.suspect_checks == frozenset()


def test_no_reruns_quarantines_on_the_first_sdc() -> None:
    p = policy(confirmation={"reruns": 0})
    n = node(state=S.TESTING, annotations={keys.CURRENT_TEST: "t1"}, qualified_at=NOW - 5 * HOUR)
    d = decide(observe(n, test=sdctest("t1", verdict=Verdict.SDC, failed=("compute",))), p, NOW)
    assert (d.event, d.state) == (E.TEST_FAILED, S.QUARANTINED)


def test_repair_verification_returns_the_node_and_closes_the_ticket() -> None:
    p = policy()
    n, _ = quarantined_story()
    t = ticket(acknowledged=True)
    d = decide(observe(n, ticket=t), p, NOW)
    assert (d.event, d.state) == (E.REPAIR_STARTED, S.REPAIRING)
    assert one(d, SetTicketPhase) == SetTicketPhase(TicketPhase.IN_REPAIR, t.name, d.note)
    n = applied(n, d)

    t = ticket(resolution=Resolution.REPAIRED, acknowledged=True, phase=TicketPhase.IN_REPAIR)
    d = decide(observe(n, ticket=t), p, NOW)
    assert (d.event, d.state) == (E.TICKET_RESOLVED, S.VERIFYING)
    verify = created_test(d)
    assert (verify.suite, verify.reason, verify.ticket) == (
        Suite.REPAIR_VERIFICATION,
        ScreeningReason.REPAIR_VERIFICATION,
        t.name,
    )
    n = applied(n, d)
    assert taint_keys(n) == {QUARANTINE}, "verification runs under the quarantine taint"

    d = decide(observe(n, ticket=t, test=finish(verify, Verdict.PASS)), p, NOW + HOUR)
    assert (d.event, d.state) == (E.VERIFICATION_PASSED, S.QUALIFIED)
    assert one(d, CloseTicket) == CloseTicket(t.name, d.note)
    n = applied(n, d)
    assert taint_keys(n) == set() and not n.unschedulable and not n.cordoned_by_us
    assert keys.CA_SCALE_DOWN_DISABLED not in n.annotations
    assert n.qualified_at == NOW + HOUR


def verifying(cycle: int, max_cycles: int) -> Decision:
    p = policy(repair={"maxRepairCycles": max_cycles})
    n = node(state=S.VERIFYING, annotations={keys.CURRENT_TEST: "v1"}, unschedulable=True)
    t = ticket(resolution=Resolution.REPAIRED, cycle=cycle, phase=TicketPhase.VERIFYING)
    test = sdctest(
        "v1",
        suite=Suite.REPAIR_VERIFICATION,
        reason=ScreeningReason.REPAIR_VERIFICATION,
        verdict=Verdict.SDC,
        failed=("golden",),
    )
    return decide(observe(n, ticket=t, test=test), p, NOW)


def test_failed_verification_raises_the_cycle() -> None:
    d = verifying(cycle=1, max_cycles=2)
    assert (d.event, d.state) == (E.VERIFICATION_FAILED, S.QUARANTINED)
    assert one(d, RaiseCycle) == RaiseCycle("gpu-1-0a1b2-3", "v1")


def test_failing_past_max_repair_cycles_retires() -> None:
    d = verifying(cycle=2, max_cycles=2)
    assert (d.event, d.state) == (E.REPAIR_CYCLES_EXCEEDED, S.RETIRED)
    assert one(d, Retire) == Retire("gpu-1-0a1b2-3", delete_node=False)
    delete = policy(repair={"maxRepairCycles": 1, "retireAction": "Delete"})
    n = node(state=S.VERIFYING, annotations={keys.CURRENT_TEST: "v1"})
    test = sdctest(
        "v1",
        suite=Suite.REPAIR_VERIFICATION,
        reason=ScreeningReason.REPAIR_VERIFICATION,
        verdict=Verdict.SDC,
    )
    d = decide(observe(n, ticket=ticket(), test=test), delete, NOW)
    assert one(d, Retire) == Retire("gpu-1-0a1b2-3", delete_node=True)
    assert not only(d, Cordon), "retireAction Delete does not cordon"


def test_ticket_retire_resolution_retires() -> None:
    n = node(state=S.QUARANTINED, unschedulable=True)
    d = decide(observe(n, ticket=ticket(resolution=Resolution.RETIRE)), policy(), NOW)
    assert (d.event, d.state) == (E.TICKET_RETIRE, S.RETIRED)


def test_replace_strategy_deletes_the_node_once_acknowledged() -> None:
    p = policy(repair={"strategy": "Replace"})
    n, (_, _, confirmed) = quarantined_story(p)
    assert not only(confirmed, SetAutoscalerAnnotations), "replaced nodes need no protection"
    d = decide(observe(n, ticket=ticket(acknowledged=True)), p, NOW)
    assert (d.event, d.state) == (E.REPLACE_DUE, S.REPAIRING)
    assert only(d, DeleteNode)
    held = decide(observe(n, ticket=ticket(acknowledged=True), breaker_open=True), p, NOW)
    assert held.event is None and "breaker" in held.note


def test_idle_return_waits_for_idle_for() -> None:
    p = policy(triggers={"onReturnFromUse": {"idleFor": "30m"}, "maxQualificationAge": "0"})
    n = node(state=S.QUALIFIED, qualified_at=NOW - 10 * HOUR)
    early = decide(observe(n, idle_since=NOW - dt.timedelta(minutes=29)), p, NOW)
    assert early.event is None and early.requeue_after == pytest.approx(60)
    due = decide(observe(n, idle_since=NOW - dt.timedelta(minutes=31)), p, NOW)
    assert due.event == E.IDLE_DUE
    unused = decide(observe(n, idle_since=NOW - 11 * HOUR), p, NOW)
    assert unused.event is None, "idle since before its qualification: never used, no re-test"
    busy = decide(observe(n, idle_since=None), p, NOW)
    assert busy.event is None


def test_expiry_retests_in_the_next_idle_window() -> None:
    p = policy(triggers={"maxQualificationAge": "168h"})
    old = node(state=S.QUALIFIED, qualified_at=NOW - 169 * HOUR)
    d = decide(observe(old, idle_since=NOW - 200 * HOUR), p, NOW)
    assert d.event == E.EXPIRY_DUE
    assert created_test(d).reason == ScreeningReason.EXPIRY
    busy = decide(observe(old, idle_since=None), p, NOW)
    assert busy.event is None and "idle window" in busy.note
    fresh = node(state=S.QUALIFIED, qualified_at=NOW - 100 * HOUR)
    d = decide(observe(fresh, idle_since=NOW - 200 * HOUR), p, NOW)
    assert d.event is None and d.requeue_after == 3600


def test_screening_yields_to_pending_pods_and_budgets() -> None:
    p = policy(budgets={"maxUnavailable": 1})
    n = node(state=S.QUALIFIED, qualified_at=NOW - 200 * HOUR)
    assert decide(observe(n, pending_pod_needs_node=True), p, NOW).event is None
    full = PoolUsage(nodes=10, unavailable=1)
    d = decide(observe(n, usage=full), p, NOW)
    assert d.event is None and "maxUnavailable 1" in d.note
    assert decide(observe(n, usage=PoolUsage(nodes=10)), p, NOW).event == E.EXPIRY_DUE


def test_paused_policy_starts_no_tests_but_applies_results() -> None:
    p = policy(paused=True)
    assert decide(observe(node()), p, NOW).event is None
    n = node(state=S.TESTING, annotations={keys.CURRENT_TEST: "t1"}, qualified_at=NOW - HOUR)
    d = decide(observe(n, test=sdctest("t1", verdict=Verdict.PASS)), p, NOW)
    assert d.event == E.TEST_PASSED


def test_observe_mode_emits_no_node_mutations_or_tickets() -> None:
    p = policy(mode="Observe")
    n = node()
    d = decide(observe(n), p, NOW)
    assert d.event == E.JOINED and only(d, CreateTest)
    assert only(d, SetLabel)
    assert {type(a) for a in d.suppressed} == {AddTaint}
    n = applied(n, d)
    assert taint_keys(n) == set()

    n, decisions = quarantined_story(p)
    for decision in decisions:
        assert not [a for a in decision.actions if isinstance(a, NODE_MUTATIONS + TICKET_ACTIONS)]
    assert decisions[-1].state == S.QUARANTINED
    assert {type(a) for a in decisions[-1].suppressed} >= {AddTaint, Cordon, CreateTicket}
    assert n.labels[keys.LABEL_STATE] == "Quarantined" and not n.unschedulable
    assert taint_keys(n) == set()
    held = decide(observe(n), p, NOW)
    assert held.actions == (), "no healing in Observe mode"


@pytest.mark.parametrize("budget", [1, 0], ids=["room", "no-room"])
def test_observe_mode_lets_a_node_that_registered_gated_in_at_once(budget: int) -> None:
    """Observe changes no scheduling, and that includes the gate: a node that arrives with
    the gate taint loses it at first sight, whether its acceptance test can start now
    or waits for budget, and whatever the test says later."""
    p = policy(mode="Observe", budgets={"maxConcurrentTests": 1})
    usage = PoolUsage(tests=1 - budget)
    n = node(taints=(Taint(GATE, "NoSchedule"),))
    d = decide(observe(n, usage=usage), p, NOW)
    assert d.starts_test == bool(budget)
    n = applied(n, d)
    assert taint_keys(n) == set() and not n.unschedulable
    assert n.labels[keys.LABEL_STATE] in ("Testing", "Unqualified")
    if budget:
        failed = decide(
            observe(n, test=sdctest(n.current_test or "", verdict=Verdict.INCONCLUSIVE)), p, NOW
        )
        assert taint_keys(applied(n, failed)) == set(), "never gated again in Observe mode"


def test_switching_to_enforce_confirms_what_observe_recorded_before_quarantine() -> None:
    """A failure Observe recorded (no ticket, no taint) is not quarantined on sight when
    the policy switches to Enforce: the node becomes Suspect, held, and is re-tested on
    its suspect checks; a failure then quarantines it with a ticket naming both tests
    and a repair cycle (hardware history); a pass clears it."""
    n, _ = quarantined_story(policy(mode="Observe"))
    assert n.state == S.QUARANTINED and not n.taints
    assert keys.OBSERVED_FAILURE in n.annotations
    p = policy()
    d = decide(observe(n), p, NOW + HOUR)
    assert (d.event, d.state) == (E.OBSERVED_FAILURE, S.SUSPECT)
    assert not only(d, CreateTicket) and not only(d, Cordon)
    n = applied(n, d)
    assert taint_keys(n) == {TESTING}  # held: no new work until the re-test decides
    assert keys.OBSERVED_FAILURE not in n.annotations
    assert n.suspect_checks == frozenset({"golden"}) and len(n.evidence) == 2
    retest = decide(observe(n), p, NOW + 2 * HOUR)
    assert retest.event == E.RETEST_DUE
    n = applied(n, retest)
    test = created_test(retest)
    assert test.reason == ScreeningReason.SUSPECT

    failed = decide(observe(n, test=finish(test, Verdict.SDC, failed=("golden",))), p, NOW)
    assert (failed.event, failed.state) == (E.TEST_FAILED, S.QUARANTINED)
    ticket_made = one(failed, CreateTicket)
    assert test.name in ticket_made.evidence and len(ticket_made.evidence) == 3
    assert only(failed, RecordHardware)
    assert taint_keys(applied(n, failed)) == {QUARANTINE}

    cleared = decide(observe(n, test=finish(test, Verdict.PASS)), p, NOW)
    assert (cleared.event, cleared.state) == (E.TEST_PASSED, S.QUALIFIED)
    assert not only(cleared, CreateTicket)


def test_a_quarantine_whose_ticket_enforce_lost_gets_it_again() -> None:
    """Without Observe's record, a Quarantined node with no ticket is an Enforce
    quarantine whose ticket was lost (deleted by hand): upkeep opens it again."""
    n, _ = quarantined_story(policy(mode="Observe"))
    n = dataclasses.replace(
        n, annotations={k: v for k, v in n.annotations.items() if k != keys.OBSERVED_FAILURE}
    )
    d = decide(observe(n), policy(), NOW)
    assert d.event is None
    n = applied(n, d)
    assert taint_keys(n) == {QUARANTINE} and n.unschedulable
    assert only(d, CreateTicket)


def test_observes_record_goes_when_the_node_leaves_the_quarantine() -> None:
    n, _ = quarantined_story(policy(mode="Observe"))
    n = dataclasses.replace(n, annotations={**n.annotations, keys.REQUEST_RELEASE: "fixed"})
    d = decide(observe(n), policy(mode="Observe"), NOW)
    assert d.state == S.QUALIFIED
    assert keys.OBSERVED_FAILURE not in applied(n, d).annotations


def test_breaker_open_holds_quarantine_and_routine_screening() -> None:
    p = policy()
    n = node(
        state=S.SUSPECT,
        annotations={keys.CURRENT_TEST: "c1", keys.SUSPECT_CHECKS: "golden", keys.EVIDENCE: "t1"},
        qualified_at=NOW - 5 * HOUR,
    )
    rerun = sdctest(
        "c1", reason=ScreeningReason.CONFIRMATION, verdict=Verdict.SDC, failed=("golden",)
    )
    d = decide(observe(n, test=rerun, breaker_open=True), p, NOW)
    assert (d.event, d.state) == (E.QUARANTINE_HELD, S.SUSPECT)
    assert not only(d, CreateTicket) and not only(d, Cordon)
    assert d.held and "re-tested when it closes" in d.note
    n = applied(n, d)
    assert n.evidence == ("t1", "c1") and keys.HELD in n.annotations
    # Held: not re-tested while the breaker stays open, however long it stays open (a
    # re-test loop fed the breaker new failures and kept it open), and says why.
    for hours in (0, 1, 24):
        waiting = decide(observe(n, breaker_open=True), p, NOW + hours * HOUR)
        assert waiting.event is None and waiting.held
        assert "quarantine held: circuit breaker open" in waiting.note
    expired = node(state=S.QUALIFIED, qualified_at=NOW - 500 * HOUR)
    held = decide(observe(expired, breaker_open=True), p, NOW)
    assert held.event is None and "circuit breaker open" in held.note
    # Once the breaker is reset, the next failure of the held node quarantines it.
    later = NOW + 2 * HOUR
    d = decide(observe(n), p, later)
    assert d.event == E.RETEST_DUE
    retest = created_test(d)
    n = applied(n, d)
    d = decide(observe(n, test=finish(retest, Verdict.SDC, failed=("golden",))), p, later)
    assert (d.event, d.state) == (E.TEST_FAILED, S.QUARANTINED)
    assert keys.HELD not in applied(n, d).annotations and not d.held


def test_flaky_node_stays_suspect_and_held_until_a_later_pass() -> None:
    p = policy(confirmation={"reruns": 1})
    n = node(
        state=S.TESTING,
        annotations={keys.CURRENT_TEST: "t1"},
        qualified_at=NOW - 5 * HOUR,
        taints=(Taint(TESTING, "NoSchedule"),),
    )
    n = dataclasses.replace(n, annotations={**n.annotations, keys.OWNED_TAINTS: TESTING})
    d = decide(observe(n, test=sdctest("t1", verdict=Verdict.SDC, failed=("golden",))), p, NOW)
    n = applied(n, d)
    rerun = created_test(d)
    d = decide(observe(n, test=finish(rerun, Verdict.PASS)), p, NOW)
    assert (d.event, d.state) == (E.FLAKY, S.SUSPECT)
    n = applied(n, d)
    assert taint_keys(n) == {TESTING}, "held"
    assert n.suspect_checks == frozenset({"golden"})
    assert decide(observe(n), p, NOW).event is None, "backs off first"
    later = n.retry_after
    assert later is not None
    d = decide(observe(n), p, later)
    assert d.event == E.RETEST_DUE and not only(d, AddTaint), "already held: no new taint"
    retest = created_test(d)
    assert retest.reason == ScreeningReason.SUSPECT
    n = applied(n, d)
    d = decide(observe(n, test=finish(retest, Verdict.PASS)), p, later)
    assert (d.event, d.state) == (E.TEST_PASSED, S.QUALIFIED)
    assert taint_keys(applied(n, d)) == set()


def test_a_different_check_failing_does_not_confirm_when_the_same_check_is_required() -> None:
    p = policy(confirmation={"reruns": 2, "requireSameCheck": True})
    n = node(
        state=S.SUSPECT,
        annotations={keys.CURRENT_TEST: "c1", keys.SUSPECT_CHECKS: "golden"},
        qualified_at=NOW - HOUR,
    )
    rerun = sdctest(
        "c1", reason=ScreeningReason.CONFIRMATION, verdict=Verdict.SDC, failed=("compute",)
    )
    d = decide(observe(n, test=rerun), p, NOW)
    assert (d.event, d.state) == (E.TEST_FAILED_UNCONFIRMED, S.SUSPECT)
    assert created_test(d).attempt == 2
    assert applied(n, d).suspect_checks == frozenset({"golden", "compute"})
    any_check = policy(confirmation={"reruns": 2, "requireSameCheck": False})
    assert decide(observe(n, test=rerun), any_check, NOW).event == E.TEST_FAILED


def test_a_lighter_pass_does_not_clear_a_deeper_failure() -> None:
    n = node(
        state=S.SUSPECT,
        annotations={keys.CURRENT_TEST: "m1", keys.SUSPECT_CHECKS: "golden"},
        qualified_at=NOW - HOUR,
    )
    manual = sdctest("m1", reason=ScreeningReason.MANUAL, verdict=Verdict.PASS, passed=("compute",))
    d = decide(observe(n, test=manual), policy(), NOW)
    assert (d.event, d.state) == (E.TEST_INCONCLUSIVE, S.SUSPECT)
    assert "did not run the suspected golden" in d.note


@pytest.mark.parametrize("verdict", [Verdict.CRASH, Verdict.TIMEOUT, Verdict.INCONCLUSIVE])
def test_crash_timeout_and_inconclusive_never_quarantine_and_back_off(verdict: Verdict) -> None:
    p = policy(triggers={"inconclusiveBackoff": "10m"})
    gated = node(state=S.TESTING, annotations={keys.CURRENT_TEST: "t1"})
    d = decide(
        observe(
            gated,
            test=sdctest(
                "t1", suite=Suite.ACCEPTANCE, reason=ScreeningReason.JOIN, verdict=verdict
            ),
        ),
        p,
        NOW,
    )
    assert (d.event, d.state) == (E.ACCEPTANCE_INCONCLUSIVE, S.UNQUALIFIED)
    gated = applied(gated, d)
    assert gated.inconclusive_count == 1 and gated.retry_after == NOW + dt.timedelta(minutes=10)
    assert decide(observe(gated), p, NOW).event is None
    again = decide(observe(gated), p, NOW + HOUR)
    assert again.event == E.JOINED and created_test(again).attempt == 2

    qualified = node(
        state=S.TESTING,
        annotations={keys.CURRENT_TEST: "t1", keys.INCONCLUSIVE: "2"},
        qualified_at=NOW - HOUR,
    )
    d = decide(observe(qualified, test=sdctest("t1", verdict=verdict)), p, NOW)
    assert (d.event, d.state) == (E.TEST_INCONCLUSIVE, S.QUALIFIED)
    assert applied(qualified, d).retry_after == NOW + dt.timedelta(minutes=40)


def test_a_vanished_test_is_inconclusive() -> None:
    n = node(state=S.TESTING, annotations={keys.CURRENT_TEST: "gone"}, qualified_at=NOW - HOUR)
    d = decide(observe(n), policy(), NOW)
    assert d.event == E.TEST_INCONCLUSIVE and "gone" in d.note


def test_manual_test_is_adopted() -> None:
    n = node(state=S.QUALIFIED, qualified_at=NOW - HOUR)
    d = decide(observe(n, test=sdctest("manual-1", reason=ScreeningReason.MANUAL)), policy(), NOW)
    assert (d.event, d.state) == (E.TEST_STARTED, S.TESTING)
    assert applied(n, d).current_test == "manual-1"
    assert not only(d, CreateTest)


def test_suspect_annotation_is_honoured_and_consumed() -> None:
    n = node(
        state=S.QUALIFIED,
        qualified_at=NOW - HOUR,
        annotations={keys.REQUEST_SUSPECT: "loss spike in job 42"},
    )
    d = decide(observe(n, idle_since=None), policy(), NOW)
    assert (d.event, d.state) == (E.SUSPECTED, S.SUSPECT)
    n = applied(n, d)
    assert keys.REQUEST_SUSPECT not in n.annotations
    # Held at once: no new work lands (running work finishes), so it is re-screened
    # before it takes more work, and a pending pod does not hold the re-test back.
    assert TESTING in taint_keys(n)
    busy = decide(observe(n, idle_since=None), policy(), NOW)
    assert busy.event is None and "held; waiting for running work" in busy.note
    d = decide(observe(n, pending_pod_needs_node=True), policy(), NOW)
    assert d.event == E.RETEST_DUE and d.starts_test and not d.takes_node
    # triggers.holdSuspects off: schedulable, re-screened in an idle window, after pods.
    unheld = policy(triggers={"holdSuspects": False})
    n = node(state=S.QUALIFIED, qualified_at=NOW - HOUR, annotations={keys.REQUEST_SUSPECT: "x"})
    d = decide(observe(n, idle_since=None), unheld, NOW)
    n = applied(n, d)
    assert d.state == S.SUSPECT and taint_keys(n) == set()
    assert "idle window" in decide(observe(n, idle_since=None), unheld, NOW).note
    waits = decide(observe(n, pending_pod_needs_node=True), unheld, NOW)
    assert waits.event is None and "pending pod" in waits.note
    d = decide(observe(n), unheld, NOW)
    assert d.event == E.RETEST_DUE and only(d, AddTaint)
    off = decide(
        observe(node(state=S.QUALIFIED, annotations={keys.REQUEST_SUSPECT: "x"})),
        policy(triggers={"onSuspect": False}),
        NOW,
    )
    assert off.event is None and "onSuspect is off" in off.note
    assert one(off, Annotate) == Annotate(((keys.REQUEST_SUSPECT, None),))


def test_a_training_jobs_report_is_evidence_on_the_ticket_once_the_probe_confirms() -> None:
    suspicion = "SDCReport team-a/llm-s7-r1-abc: ShadowAudit at step 7 (persistent)"
    n = node(
        state=S.QUALIFIED, qualified_at=NOW - HOUR, annotations={keys.REQUEST_SUSPECT: suspicion}
    )
    d = decide(observe(n, idle_since=None), policy(), NOW)
    assert d.event == E.SUSPECTED
    n = applied(n, d)
    assert n.evidence == ("SDCReport team-a/llm-s7-r1-abc",)
    tickets, test = [], None
    for _ in range(4):  # the re-test, its confirmation: quarantined with both as evidence
        d = decide(observe(n, test=test), policy(), NOW)
        n = applied(n, d)
        tickets += only(d, CreateTicket)
        test = finish(created_test(d), Verdict.SDC) if d.starts_test else None
        if d.state == S.QUARANTINED:
            break
    (ticket,) = tickets
    assert ticket.evidence[0] == "SDCReport team-a/llm-s7-r1-abc"
    assert len(ticket.evidence) >= 2  # and the probe's failed SDCTests
    # A request made by a person names no report: nothing is added.
    by_hand = node(state=S.QUALIFIED, annotations={keys.REQUEST_SUSPECT: "SDCReport by hand"})
    assert applied(by_hand, decide(observe(by_hand), policy(), NOW)).evidence == ()


def test_manual_quarantine_and_release() -> None:
    n = node(
        state=S.QUALIFIED,
        qualified_at=NOW - HOUR,
        annotations={keys.REQUEST_QUARANTINE: "ECC storm"},
    )
    d = decide(observe(n), policy(), NOW)
    assert (d.event, d.state) == (E.MANUAL_QUARANTINE, S.QUARANTINED)
    assert "ECC storm" in one(d, CreateTicket).message
    n = applied(n, d)
    assert keys.REQUEST_QUARANTINE not in n.annotations and n.unschedulable

    n = dataclasses.replace(n, annotations={**n.annotations, keys.REQUEST_RELEASE: "false alarm"})
    d = decide(observe(n, ticket=ticket()), policy(), NOW)
    assert (d.event, d.state) == (E.MANUAL_RELEASE, S.QUALIFIED)
    assert only(d, CloseTicket)
    assert only(d, Uncordon)
    n = applied(n, d)
    assert taint_keys(n) == set() and not n.unschedulable
    assert n.qualified_at is None, "a released node is screened again in its next idle window"
    ignored = dataclasses.replace(n, annotations={**n.annotations, keys.REQUEST_RELEASE: "again"})
    d = decide(observe(ignored, idle_since=None), policy(), NOW)
    assert d.event is None and "ignored" in d.note


def test_never_uncordon_a_node_someone_else_cordoned() -> None:
    n = node(
        state=S.QUALIFIED,
        qualified_at=NOW - HOUR,
        unschedulable=True,
        annotations={keys.REQUEST_QUARANTINE: "x"},
    )
    d = decide(observe(n), policy(), NOW)
    assert not only(d, Cordon), "already cordoned by someone else: not ours"
    n = applied(n, d)
    assert not n.cordoned_by_us
    n = dataclasses.replace(n, annotations={**n.annotations, keys.REQUEST_RELEASE: "ok"})
    d = decide(observe(n), policy(), NOW)
    assert d.state == S.QUALIFIED and not only(d, Uncordon)
    assert applied(n, d).unschedulable


def test_opt_out_removes_only_our_taints_and_then_touches_nothing() -> None:
    foreign = Taint("nvidia.com/gpu-maintenance", "NoSchedule")
    n, _ = quarantined_story()
    n = dataclasses.replace(
        n, taints=(*n.taints, foreign), labels={**n.labels, keys.LABEL_EXCLUDE: "true"}
    )
    d = decide(observe(n, ticket=ticket()), policy(), NOW)
    assert (d.event, d.state) == (E.OPTED_OUT, S.EXCLUDED)
    assert {a.key for a in only(d, RemoveTaint)} == {QUARANTINE}
    assert not only(d, CloseTicket)
    n = applied(n, d)
    assert n.taints == (foreign,) and not n.unschedulable
    assert keys.KARPENTER_DO_NOT_DISRUPT not in n.annotations
    again = decide(observe(n), policy(), NOW)
    assert again.event is None and again.actions == () and again.requeue_after is None
    back = dataclasses.replace(
        n, labels={k: v for k, v in n.labels.items() if k != keys.LABEL_EXCLUDE}
    )
    d = decide(observe(back), policy(), NOW)
    assert (d.event, d.state) == (E.OPTED_IN, S.UNQUALIFIED)


def test_autoscaler_annotations_set_by_someone_else_are_kept() -> None:
    mine = {keys.KARPENTER_DO_NOT_DISRUPT: "true"}
    n = node(
        state=S.TESTING, annotations={keys.CURRENT_TEST: "t1", **mine}, qualified_at=NOW - HOUR
    )
    p = policy(confirmation={"reruns": 0})
    n = applied(n, decide(observe(n, test=sdctest("t1", verdict=Verdict.SDC)), p, NOW))
    assert n.owned_annotations == frozenset({keys.CA_SCALE_DOWN_DISABLED})
    n = dataclasses.replace(n, annotations={**n.annotations, keys.REQUEST_RELEASE: "ok"})
    n = applied(n, decide(observe(n), p, NOW))
    assert n.annotations.get(keys.KARPENTER_DO_NOT_DISRUPT) == "true"
    assert keys.CA_SCALE_DOWN_DISABLED not in n.annotations


def test_verification_waits_while_paused() -> None:
    n = node(state=S.QUARANTINED)
    d = decide(
        observe(n, ticket=ticket(resolution=Resolution.FALSE_ALARM)), policy(paused=True), NOW
    )
    assert d.event is None and "paused" in d.note


def test_repeating_a_decision_creates_the_same_names() -> None:
    n = node()
    first = decide(observe(n), policy(), NOW)
    second = decide(observe(n), policy(), NOW + HOUR)
    assert created_test(first).name == created_test(second).name


def test_mark_qualified_records_time_and_fingerprint() -> None:
    n = node(state=S.TESTING, annotations={keys.CURRENT_TEST: "t1"})
    d = decide(observe(n, test=sdctest("t1", verdict=Verdict.PASS)), policy(), NOW)
    assert one(d, MarkQualified) == MarkQualified(NOW, "f" * 64, "t1")


def test_node_without_accelerators_or_not_ready_waits() -> None:
    assert (
        "no allocatable accelerators" in decide(observe(node(accelerators=0)), policy(), NOW).note
    )
    assert "not Ready" in decide(observe(node(ready=False)), policy(), NOW).note


def test_a_manual_release_cancels_the_running_test() -> None:
    """A release during a test ends the test (it would otherwise be adopted again and the
    release undone); with no test running there is nothing to cancel."""
    from sdcguard.api import SDCTestPhase
    from sdcguard.domain.lifecycle import CancelTest

    n = node(
        state=S.TESTING,
        annotations={keys.CURRENT_TEST: "t1", keys.REQUEST_RELEASE: "needed for a demo"},
        taints=(Taint(TESTING, "NoSchedule"),),
    )
    d = decide(observe(n, test=sdctest("t1")), policy(), NOW)
    assert d.event == E.MANUAL_RELEASE and d.state == S.QUALIFIED
    (cancel,) = only(d, CancelTest)
    assert cancel.name == "t1" and "needed for a demo" in cancel.message
    after = applied(n, d)
    assert after.current_test is None
    # The next look, with the test cancelled, neither adopts nor judges it.
    done = sdctest("t1", phase=SDCTestPhase.CANCELLED)
    again = decide(observe(after, test=done, idle_since=None), policy(), NOW)
    assert again.event is None and again.state == S.QUALIFIED

    finished = decide(observe(n, test=sdctest("t1", verdict=Verdict.PASS)), policy(), NOW)
    assert not only(finished, CancelTest)


@pytest.mark.parametrize("label", ["Qualified", "Nonsense"])
def test_a_hand_written_state_label_is_not_believed(label: str) -> None:
    """The label is output: on a gated node waiting for its test, ``Qualified`` or a
    word that names no state is corrected from the records, and an Event says so."""
    p = policy(budgets={"maxConcurrentTests": 1})
    n = node(labels={keys.LABEL_STATE: label}, taints=(Taint(GATE, "NoSchedule"),))
    d = decide(observe(n, usage=PoolUsage(nodes=10, tests=1)), p, NOW)
    assert d.state == S.UNQUALIFIED
    assert not [a for a in only(d, RemoveTaint) if a.key == GATE]
    assert SetLabel(S.UNQUALIFIED) in d.actions
    event = one(d, EmitEvent)
    assert event.reason == "StateLabelCorrected" and event.warning
    assert f"={label}" in event.message and "Unqualified" in event.message
    n = applied(n, d)
    assert n.labels[keys.LABEL_STATE] == "Unqualified" and GATE in taint_keys(n)
    # Once corrected, nothing more to say.
    again = decide(observe(n, usage=PoolUsage(nodes=10, tests=1)), p, NOW)
    assert not only(again, EmitEvent) and not only(again, SetLabel)


def test_a_qualified_label_on_a_quarantined_node_keeps_it_quarantined() -> None:
    p = policy()
    n = node(
        state=S.QUALIFIED,
        taints=(Taint(QUARANTINE, "NoSchedule"),),
        annotations={keys.OWNED_TAINTS: QUARANTINE},
        unschedulable=True,
    )
    d = decide(observe(n, ticket=ticket("t-1")), p, NOW)
    assert d.state == S.QUARANTINED
    assert not [a for a in only(d, RemoveTaint) if a.key == QUARANTINE]
    assert one(d, EmitEvent).reason == "StateLabelCorrected"


def test_a_repaired_node_that_is_not_ready_says_why_it_waits() -> None:
    """Repairing, resolved, node not Ready: the wait is recorded on the node at once,
    told in one Event once it lasts, and cleared when verification starts."""
    p = policy()
    n, _ = quarantined_story()
    n = applied(n, decide(observe(n, ticket=ticket(acknowledged=True)), p, NOW))
    t = ticket(resolution=Resolution.REPAIRED, acknowledged=True, phase=TicketPhase.IN_REPAIR)
    n = dataclasses.replace(n, ready=False)
    d = decide(observe(n, ticket=t), p, NOW)
    assert (d.event, d.state) == (None, S.REPAIRING)
    n = applied(n, d)
    assert n.annotations[keys.WAITING] == "verification waits: node not Ready"
    assert not only(d, EmitEvent) and d.requeue_after is not None and d.requeue_after <= 60

    later = decide(observe(n, ticket=t), p, NOW + dt.timedelta(seconds=61))
    event = one(later, EmitEvent)
    assert (event.reason, event.warning) == ("Waiting", True)
    assert "node not Ready" in event.message and "61s" in event.message
    n = applied(n, later)
    quiet = decide(observe(n, ticket=t), p, NOW + dt.timedelta(seconds=200))
    assert not only(quiet, EmitEvent) and not quiet.actions, "told once, written once"

    n = dataclasses.replace(n, ready=True)
    d = decide(observe(n, ticket=t), p, NOW + dt.timedelta(seconds=230))
    assert (d.event, d.state) == (E.TICKET_RESOLVED, S.VERIFYING)
    n = applied(n, d)
    assert not {keys.WAITING, keys.WAITING_SINCE, keys.WAITING_TOLD} & set(n.annotations)


def test_a_manual_test_on_a_node_that_is_not_ready_waits_and_says_so_on_the_test() -> None:
    """A person's test is not adopted while its probe could not run: the decision names
    the test that waits and why (its Waiting condition), the node records it, and once
    the node is Ready the test is adopted and the record cleared."""
    p = policy()
    manual = sdctest("gpu-1-manual-1", reason=ScreeningReason.MANUAL, phase=SDCTestPhase.PENDING)
    n = dataclasses.replace(node(state=S.QUALIFIED, qualified_at=NOW - HOUR), ready=False)
    d = decide(observe(n, test=manual), p, NOW)
    assert (d.event, d.state) == (None, S.QUALIFIED)
    assert d.waiting == "test gpu-1-manual-1 waits: node not Ready"
    assert d.waiting_test == "gpu-1-manual-1"
    assert d.wait is not None and d.wait.reason == WaitReason.NODE_NOT_READY
    n = applied(n, d)
    assert n.annotations[keys.WAITING] == d.waiting
    later = decide(observe(n, test=manual), p, NOW + dt.timedelta(seconds=61))
    assert one(later, EmitEvent).reason == "Waiting"
    n = applied(dataclasses.replace(n, ready=True), later)
    d = decide(observe(n, test=manual), p, NOW + dt.timedelta(seconds=90))
    assert (d.event, d.state) == (E.TEST_STARTED, S.TESTING)
    assert d.waiting is None and d.waiting_test is None
    assert keys.WAITING not in applied(n, d).annotations


def test_a_manual_test_on_a_never_labelled_gated_node_is_not_silent() -> None:
    """The zero-write rule for gated nodes waiting for budget does not hide a person's test."""
    gated = dataclasses.replace(node(taints=(Taint(GATE, "NoSchedule"),)), ready=False)
    manual = sdctest("gpu-1-manual-1", reason=ScreeningReason.MANUAL, phase=SDCTestPhase.PENDING)
    d = decide(observe(gated, test=manual), policy(), NOW)
    assert d.waiting_test == "gpu-1-manual-1" and d.waiting is not None
    assert applied(gated, d).annotations[keys.WAITING] == d.waiting


def test_a_second_test_waits_for_the_running_one_and_the_node_says_so() -> None:
    n = node(state=S.TESTING, annotations={keys.CURRENT_TEST: "t1"}, qualified_at=NOW - HOUR)
    d = decide(observe(n, test=sdctest("t1"), queued=("gpu-1-manual-1",)), policy(), NOW)
    assert d.event is None and d.waiting_test == "gpu-1-manual-1"
    assert d.waiting == "test gpu-1-manual-1 waits: test t1 still running"
    assert d.wait is not None and d.wait.reason == WaitReason.ANOTHER_TEST


def test_a_test_held_for_a_baseline_quorum_waits_and_says_so() -> None:
    n = node(state=S.TESTING, annotations={keys.CURRENT_TEST: "t1"})
    held = dataclasses.replace(sdctest("t1"), awaiting_baseline=True)
    d = decide(observe(n, test=held), policy(), NOW)
    assert d.event is None and d.waiting_test == "t1"
    assert d.wait is not None and d.wait.reason == WaitReason.AWAITING_BASELINE
    assert applied(n, d).annotations[keys.WAITING] == d.waiting


def test_a_running_test_whose_probe_pod_cannot_be_scheduled_says_so() -> None:
    n = node(state=S.TESTING, annotations={keys.CURRENT_TEST: "t1"}, qualified_at=NOW - HOUR)
    message = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    d = decide(observe(n, test=sdctest("t1"), probe_unschedulable=message), policy(), NOW)
    assert d.event is None and d.waiting_test == "t1"
    assert d.waiting == f"test t1 waits: its probe Pod cannot be scheduled: {message}"
    assert d.wait is not None and d.wait.reason == WaitReason.PROBE_UNSCHEDULABLE
    n = applied(n, d)
    assert n.annotations[keys.WAITING] == d.waiting
    scheduled = decide(observe(n, test=sdctest("t1")), policy(), NOW + dt.timedelta(seconds=5))
    assert scheduled.waiting is None
    assert keys.WAITING not in applied(n, scheduled).annotations


@pytest.mark.parametrize(
    ("strategy", "phase", "closing"),
    [
        ("Replace", TicketPhase.IN_REPAIR, "deleted for replacement"),
        ("Replace", TicketPhase.OPEN, "was deleted while its ticket was Open, not by sdcguard"),
        ("InPlace", TicketPhase.OPEN, "was deleted while its ticket was Open, not by sdcguard"),
        ("InPlace", TicketPhase.IN_REPAIR, "while its ticket was InRepair, not by sdcguard"),
        ("InPlace", TicketPhase.VERIFYING, "while its ticket was Verifying, not by sdcguard"),
        ("InPlace", TicketPhase.CLOSED, None),
        ("Replace", TicketPhase.RETIRED, None),
    ],
)
def test_a_deleted_nodes_unfinished_ticket_closes_with_a_true_reason(
    strategy: str, phase: TicketPhase, closing: str | None
) -> None:
    """An autoscaler's expiry or repair (or a person) deletes a quarantined node: its
    ticket closes rather than staying open for hardware that left the cluster."""
    facts = ticket(phase=phase)
    message = node_gone_closing(facts, policy(repair={"strategy": strategy}), "n1")
    if closing is None:
        assert message is None
    else:
        assert message is not None and closing in message and "node n1" in message
    assert closes_as_replaced(facts, policy(repair={"strategy": strategy}), False) == (
        strategy == "Replace" and phase == TicketPhase.IN_REPAIR
    )
