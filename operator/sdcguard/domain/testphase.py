"""The SDCTest phases: events, actions, and the one table of allowed transitions.

::

    Pending ──NotReserved──▶ Reserving ──Reserved──▶ Running        (Job created)
    Pending ──Reserved──▶ Running
    Running ──ProbeRunning──▶ Running
    Running ──AwaitingBaseline──▶ Running      (digests recorded, waiting for a quorum)
    Running ──Passed──▶ Passed, ──SDCFound──▶ Failed
    Running ──NoEvidence──▶ Inconclusive                   (Job deleted)
    Pending, Reserving, Running ──NodeGone──▶ Inconclusive (Job deleted)
    Pending, Reserving, Running ──Cancelled──▶ Cancelled   (Job deleted; a person decided)
    Pending, Reserving, Running ──PolicyChanged──▶ Cancelled  (Job deleted; no result)

A test that ends without a verdict of its own probe (Inconclusive, Cancelled) deletes
its Job with propagation, so a Pod that may still hold every accelerator of the node
never outlives its test (a Passed or Failed probe has ended already; its Job stays for
``probe.ttlSecondsAfterFinished``, for its logs).

A finished test (Passed, Failed, Inconclusive, Cancelled) has no rows: it never moves
again. The adapter reads the observations, picks the event with :func:`phase_event`,
and executes the row's actions in order; the node lifecycle (``lifecycle``) then reads
the finished test.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from sdcguard.api import SDCTestPhase, Verdict

P = SDCTestPhase


class TestEvent(StrEnum):
    """What happened to an unfinished SDCTest, as the adapter observed it."""

    __test__ = False  # not a pytest test class

    NOT_RESERVED = "NotReserved"
    """The node does not carry the reservation yet (the node's decision adds it)."""
    RESERVED = "Reserved"
    """The node is reserved (testing or quarantine taint, or Observe mode): run the probe."""
    PROBE_RUNNING = "ProbeRunning"
    AWAITING_BASELINE = "AwaitingBaseline"
    """The probe ended, no baseline is trusted yet and the wait has not run out."""
    PASSED = "Passed"
    SDC_FOUND = "SDCFound"
    NO_EVIDENCE = "NoEvidence"
    """Crash, timeout, unreadable result, no baseline: no evidence either way."""
    NODE_GONE = "NodeGone"
    CANCELLED = "Cancelled"
    POLICY_CHANGED = "PolicyChanged"
    """The node is there but its policy no longer owns the test: the node left the policy
    (labels or selectors changed), or the policy was deleted. No result: Cancelled."""


@dataclass(frozen=True)
class CreateJob:
    """Create the probe Job (deterministic name: a repeat is a 409)."""


@dataclass(frozen=True)
class DeleteJob:
    """Delete the probe Job (and so its Pod)."""


@dataclass(frozen=True)
class WriteStatus:
    """Write the test's status for the row's target phase (start time and the JobCreated
    condition when it starts running; verdict, completion time and the Complete
    condition when it finishes)."""


@dataclass(frozen=True)
class MarkAwaitingBaseline:
    """Set the AwaitingBaseline condition (written once)."""


TestAction = CreateJob | DeleteJob | WriteStatus | MarkAwaitingBaseline


@dataclass(frozen=True)
class TestTransition:
    """One row of the table."""

    __test__ = False

    source: SDCTestPhase
    event: TestEvent
    target: SDCTestPhase
    actions: tuple[TestAction, ...]


class IllegalTestTransition(Exception):
    """``event`` is not allowed in ``phase`` (a finished test, or a bug)."""

    def __init__(self, phase: SDCTestPhase, event: TestEvent) -> None:
        super().__init__(f"no SDCTest transition from {phase} on {event}")
        self.phase = phase
        self.event = event


E = TestEvent
UNFINISHED = (P.PENDING, P.RESERVING, P.RUNNING)
START = (CreateJob(), WriteStatus())


def verdict_phase(verdict: Verdict) -> SDCTestPhase:
    """The one verdict → phase mapping: Failed means wrong answers were found; a crash or
    timeout is no evidence either way, so Inconclusive (the verdict still says which)."""
    if verdict == Verdict.PASS:
        return P.PASSED
    if verdict == Verdict.SDC:
        return P.FAILED
    return P.INCONCLUSIVE


def verdict_event(verdict: Verdict) -> TestEvent:
    """The event a judged probe result is."""
    return {P.PASSED: E.PASSED, P.FAILED: E.SDC_FOUND}.get(verdict_phase(verdict), E.NO_EVIDENCE)


TEST_TRANSITIONS: tuple[TestTransition, ...] = (
    TestTransition(P.PENDING, E.NOT_RESERVED, P.RESERVING, (WriteStatus(),)),
    TestTransition(P.RESERVING, E.NOT_RESERVED, P.RESERVING, ()),
    TestTransition(P.PENDING, E.RESERVED, P.RUNNING, START),
    TestTransition(P.RESERVING, E.RESERVED, P.RUNNING, START),
    TestTransition(P.RUNNING, E.PROBE_RUNNING, P.RUNNING, ()),
    TestTransition(P.RUNNING, E.AWAITING_BASELINE, P.RUNNING, (MarkAwaitingBaseline(),)),
    TestTransition(P.RUNNING, E.PASSED, P.PASSED, (WriteStatus(),)),
    TestTransition(P.RUNNING, E.SDC_FOUND, P.FAILED, (WriteStatus(),)),
    TestTransition(P.RUNNING, E.NO_EVIDENCE, P.INCONCLUSIVE, (WriteStatus(), DeleteJob())),
    *(
        TestTransition(p, E.NODE_GONE, P.INCONCLUSIVE, (WriteStatus(), DeleteJob()))
        for p in UNFINISHED
    ),
    *(
        TestTransition(p, E.CANCELLED, P.CANCELLED, (WriteStatus(), DeleteJob()))
        for p in UNFINISHED
    ),
    *(
        TestTransition(p, E.POLICY_CHANGED, P.CANCELLED, (WriteStatus(), DeleteJob()))
        for p in UNFINISHED
    ),
)


class PolicyChange(StrEnum):
    """Why a policy no longer owns a test (the ended test's ``status.reason``)."""

    NODE_LEFT_POLICY = "NodeLeftPolicy"
    POLICY_DELETED = "PolicyDeleted"


POLICY_CHANGE_REASONS = frozenset(PolicyChange)


def ended_by_policy_change(phase: SDCTestPhase, reason: str) -> bool:
    """A finished test ended by a policy change: Cancelled with one of those reasons, or
    (written by an operator before this rule) Inconclusive with reason NodeLeftPolicy.
    It says nothing about the node, so it counts as no result: no back-off."""
    return phase in (P.CANCELLED, P.INCONCLUSIVE) and reason in POLICY_CHANGE_REASONS


def policy_change_ending(node: str, policy: str, change: PolicyChange) -> tuple[str, str]:
    """The reason and message of a test a policy change ended (phase Cancelled)."""
    if change == PolicyChange.POLICY_DELETED:
        return change.value, f"policy {policy} was deleted: node {node} is released, no result"
    return change.value, (
        f"node {node} is no longer selected by policy {policy} (its labels or the policies' "
        "selectors changed): cancelled, no result; its new owner screens it"
    )


TEST_TABLE: Mapping[tuple[SDCTestPhase, TestEvent], TestTransition] = {
    (t.source, t.event): t for t in TEST_TRANSITIONS
}


def phase_transition(phase: SDCTestPhase, event: TestEvent) -> TestTransition:
    """The row for ``event`` in ``phase``; raises :class:`IllegalTestTransition` if none."""
    row = TEST_TABLE.get((phase, event))
    if row is None:
        raise IllegalTestTransition(phase, event)
    return row


def phase_event(
    phase: SDCTestPhase,
    *,
    node_exists: bool,
    reserved: bool,
    verdict: Verdict | None,
    awaiting_baseline: bool = False,
    owned: bool = True,
) -> TestEvent | None:
    """The event of one unfinished test, from what the adapter observed: whether its node
    exists and is reserved, and (once the probe ended and was judged) the verdict, and
    whether it should wait for a baseline's quorum instead. ``owned`` False: the node is
    there but the policy no longer selects it (or is being deleted). None: a finished test."""
    if phase.finished:
        return None
    if not node_exists:
        return E.NODE_GONE
    if not owned:
        return E.POLICY_CHANGED
    if phase in (P.PENDING, P.RESERVING):
        return E.RESERVED if reserved else E.NOT_RESERVED
    if verdict is None:
        return E.PROBE_RUNNING
    if awaiting_baseline:
        return E.AWAITING_BASELINE
    return verdict_event(verdict)
