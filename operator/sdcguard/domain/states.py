"""The node lifecycle's vocabulary: a node's states and the events that move it (see
``lifecycle`` for the table that joins them)."""

from __future__ import annotations

from enum import StrEnum


class NodeState(StrEnum):
    """A node's place in the lifecycle; the value is the ``sdcguard.dev/state`` label."""

    UNQUALIFIED = "Unqualified"
    TESTING = "Testing"
    QUALIFIED = "Qualified"
    SUSPECT = "Suspect"
    QUARANTINED = "Quarantined"
    REPAIRING = "Repairing"
    VERIFYING = "Verifying"
    RETIRED = "Retired"
    EXCLUDED = "Excluded"


class Event(StrEnum):
    """What happened to a node, as ``decide`` reads it from the observations."""

    JOINED = "Joined"
    """A gated node can take its acceptance test now."""
    REJOINED = "Rejoined"
    """A gated node whose hardware failed before (under this or another Node name) can
    take its test: the repair-verification suite, not plain acceptance."""
    HARDWARE_RETIRED = "HardwareRetired"
    """A node joined with hardware that was retired before: retired at once."""
    ADMITTED = "Admitted"
    """A node is admitted without acceptance: triggers.onJoin is off, or it already ran
    workloads when sdcguard first saw it, or they were bound to it just before sdcguard
    gated it (its acceptance test yields). It is screened in its first idle window."""
    TEST_STARTED = "TestStarted"
    """Someone else started a test on the node (kubectl sdc test): adopt it."""
    TEST_PASSED = "TestPassed"
    TEST_FAILED = "TestFailed"
    """A confirmed SDC verdict (or the first one, when no re-runs are configured)."""
    TEST_FAILED_UNCONFIRMED = "TestFailedUnconfirmed"
    """An SDC verdict that a re-run must confirm before quarantine."""
    CONFIRMATION_PASSED = "ConfirmationPassed"
    """A confirmation re-run passed and more re-runs are configured."""
    FLAKY = "Flaky"
    """Every confirmation re-run passed after an SDC verdict: still suspect."""
    QUARANTINE_HELD = "QuarantineHeld"
    """A confirmed failure while the circuit breaker is open."""
    TEST_INCONCLUSIVE = "TestInconclusive"
    ACCEPTANCE_INCONCLUSIVE = "AcceptanceInconclusive"
    """A never-qualified node's test was inconclusive: back to the gate."""
    TEST_CANCELLED = "TestCancelled"
    """A policy change ended the node's test (it left the policy, the policy changed mode
    or was deleted): no result, so no back-off; the owner screens it when due."""
    ACCEPTANCE_CANCELLED = "AcceptanceCancelled"
    """A policy change ended a never-qualified node's test: back to Unqualified, screened
    again as soon as the budgets allow (no back-off)."""
    IDLE_DUE = "IdleDue"
    EXPIRY_DUE = "ExpiryDue"
    OVERDUE_HELD = "OverdueHeld"
    """triggers.overdue.action Drain: a busy node past maxQualificationAge takes no new
    work (the testing taint), so it is screened once its work ends."""
    OVERDUE_DRAIN_DUE = "OverdueDrainDue"
    """A held overdue node's work outlasted triggers.overdue.gracePeriod: drain it."""
    SUSPECTED = "Suspected"
    RETEST_DUE = "RetestDue"
    REPAIR_STARTED = "RepairStarted"
    REPLACE_DUE = "ReplaceDue"
    TICKET_RESOLVED = "TicketResolved"
    """The ticket's resolution is Repaired, Replaced or FalseAlarm."""
    TICKET_RETIRE = "TicketRetire"
    """The ticket's resolution is Retire."""
    VERIFICATION_PASSED = "VerificationPassed"
    VERIFICATION_FAILED = "VerificationFailed"
    DEVICES_RETURNED = "DevicesReturned"
    """Scope Device: the verification returned some of the node's quarantined devices
    (their tickets close, their rules go); others stay out (not yet repaired, or failed
    again: their tickets' cycle is raised)."""
    REPAIR_CYCLES_EXCEEDED = "RepairCyclesExceeded"
    """A confirmed failure (of a test or a repair's verification) found the hardware's
    repair cycles within the policy's window used up."""
    OPTED_OUT = "OptedOut"
    OPTED_IN = "OptedIn"
    MANUAL_QUARANTINE = "ManualQuarantine"
    MANUAL_RELEASE = "ManualRelease"
    OBSERVED_FAILURE = "ObservedFailure"
    """The policy is in Enforce mode and the node is Quarantined by a failure that Observe
    mode recorded, with no ticket: it becomes Suspect, held, and a re-test confirms the
    failure (then quarantine, ticket and repair cycle) or clears it."""
    DRAIN_DUE = "DrainDue"
    """A quarantine drain left pods that a PodDisruptionBudget kept: evict them again."""
    DRAIN_TIMED_OUT = "DrainTimedOut"
    """The drain's time (spec.quarantine.drainTimeoutSeconds) ran out with pods left."""
    DRAIN_DONE = "DrainDone"
    """The drain asked every pod it had left to leave: its deadline goes."""
