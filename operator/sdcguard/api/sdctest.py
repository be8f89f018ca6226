"""SDCTest: one screening of one node (like a Job, for a node)."""

from __future__ import annotations

import datetime as dt
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, StringConstraints, model_validator

from sdcguard.api.common import (
    API_VERSION,
    CONDITIONS_LIST,
    HEX_DIGEST_PATTERN,
    ApiModel,
    ApiVersion,
    Condition,
    HexDigest,
    NodeName,
    ObjectMeta,
    cel,
    cel_rules,
)
from sdcguard.api.policy import Suite


class ScreeningReason(StrEnum):
    """Why a node is tested."""

    JOIN = "Join"
    RETURN_FROM_USE = "ReturnFromUse"
    EXPIRY = "Expiry"
    SUSPECT = "Suspect"
    MANUAL = "Manual"
    REPAIR_VERIFICATION = "RepairVerification"
    CONFIRMATION = "Confirmation"


class SDCTestPhase(StrEnum):
    """Where a test is: Pending -> Reserving -> Running -> Passed | Failed | Inconclusive,
    or Cancelled."""

    PENDING = "Pending"
    RESERVING = "Reserving"
    RUNNING = "Running"
    PASSED = "Passed"
    FAILED = "Failed"
    INCONCLUSIVE = "Inconclusive"
    CANCELLED = "Cancelled"

    @property
    def finished(self) -> bool:
        """Whether the test has ended."""
        return self in _FINISHED


_FINISHED = frozenset(
    {SDCTestPhase.PASSED, SDCTestPhase.FAILED, SDCTestPhase.INCONCLUSIVE, SDCTestPhase.CANCELLED}
)


class Verdict(StrEnum):
    """What a finished test found. Only SDC is evidence of wrong answers; Crash and Timeout
    are faults of another kind and never quarantine on their own."""

    PASS = "Pass"
    SDC = "SDC"
    CRASH = "Crash"
    TIMEOUT = "Timeout"
    INCONCLUSIVE = "Inconclusive"


class CheckVerdict(StrEnum):
    """What one check found."""

    PASS = "Pass"
    SDC = "SDC"
    INCONCLUSIVE = "Inconclusive"


BaselineComparison = Literal["match", "mismatch", "absent", "fingerprint-mismatch"]


class CheckStatus(ApiModel):
    """The result of one check, as judged by the operator."""

    name: Annotated[str, StringConstraints(max_length=64)]
    """The check (compute, collective, golden, memory)."""
    verdict: CheckVerdict
    """Pass, SDC or Inconclusive."""
    reason: Annotated[str, StringConstraints(max_length=1024)] = ""
    """Why, in words."""
    digest: Annotated[str, StringConstraints(pattern=HEX_DIGEST_PATTERN)] | None = None
    """sha256 of everything the check computed; compared with the baseline."""
    metrics: dict[
        Annotated[str, StringConstraints(max_length=64)],
        Annotated[str, StringConstraints(max_length=256)],
    ] = Field(default_factory=dict, max_length=64)
    """Measurements (mismatch counts, bandwidth, seconds), as strings."""
    odd_device: int | None = Field(default=None, ge=0)
    """The device index that disagreed with the others, if one could be named."""
    first_divergent_step: int | None = Field(default=None, ge=0)
    """golden: the first training step whose values differ."""
    first_divergent_submodule: Annotated[str, StringConstraints(max_length=256)] | None = None
    """golden: the first submodule whose outputs differ at that step."""
    baseline: BaselineComparison | None = None
    """Comparison with the trusted baseline: match, mismatch, absent or fingerprint-mismatch."""
    catch_chance: float | None = Field(default=None, ge=0.0, le=1.0)
    """The chance this check's rounds had of catching a fault active in
    status.catchFraction of them (1 - (1 - fraction)^rounds run). Null: the probe did not
    say (an older probe, or no plan ran)."""


class SDCTestSpec(ApiModel):
    """What to screen, why, and with which suite. Immutable."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel("self == oldSelf", "spec: an SDCTest's spec is immutable; create a new SDCTest"),
            cel(
                "self.reason != 'RepairVerification' "
                "|| (has(self.ticketRef) && has(self.suite) && self.suite == 'repairVerification')",
                "spec.ticketRef: reason RepairVerification needs ticketRef and "
                "suite: repairVerification",
            ),
        )
    )

    node_name: NodeName
    """The node to screen."""
    policy_ref: NodeName
    """The SDCPolicy whose suites, probe and budgets apply."""
    suite: Suite | None = None
    """acceptance, requalification or repairVerification. Unset: the operator picks when
    it starts the test, as it would for its own tests: acceptance on a node that never
    qualified, requalification otherwise (status.suite says which ran)."""
    reason: ScreeningReason = ScreeningReason.MANUAL
    """Why: Join, ReturnFromUse, Expiry, Suspect, Manual, RepairVerification, Confirmation."""
    attempt: int = Field(default=1, ge=1, le=100)
    """1 for a first screening; counts re-runs (confirmations, retries after inconclusive)."""
    ticket_ref: NodeName | None = None
    """The RepairTicket a repairVerification test verifies."""
    seed: int | None = Field(default=None, ge=0, le=2147483647)
    """Pins the seed of the probe's rounds that a baseline covers (e.g. to repeat a
    failing screening's data; also pins dataSeed unless that is given). Unset: the
    operator's fixed baseline seed, the same for every screening (so a fingerprint's
    baseline lasts until the fingerprint changes), recorded in status.seed."""
    data_seed: int | None = Field(default=None, ge=0, le=2147483647)
    """Pins the seed of every later round (the screening's own data, judged without a
    baseline). Unset: spec.seed if pinned, the failed test's for a confirmation, else a
    new one for this test; recorded in status.dataSeed."""

    @model_validator(mode="after")
    def _verification_has_ticket(self) -> SDCTestSpec:
        if self.reason == ScreeningReason.REPAIR_VERIFICATION and (
            self.ticket_ref is None or self.suite != Suite.REPAIR_VERIFICATION
        ):
            raise ValueError(
                "spec.ticketRef: reason RepairVerification needs ticketRef and "
                "suite: repairVerification"
            )
        return self


class SDCTestStatus(ApiModel):
    """Progress and result of the screening."""

    phase: SDCTestPhase = SDCTestPhase.PENDING
    """Pending, Reserving, Running, Passed, Failed, Inconclusive or Cancelled."""
    verdict: Verdict | None = None
    """Pass, SDC, Crash, Timeout or Inconclusive, once finished."""
    reason: Annotated[str, StringConstraints(max_length=64)] = ""
    """One CamelCase word, e.g. DigestMismatch, ResultTruncated."""
    message: Annotated[str, StringConstraints(max_length=4096)] = ""
    """What was found and what to do, for people."""
    conditions: list[Condition] = Field(
        default_factory=list, max_length=16, json_schema_extra=CONDITIONS_LIST
    )
    """JobCreated, AwaitingBaseline, Complete, and Waiting: True while the operator holds
    the test back, with a one-word reason (NodeNotReady, ForeignTaint, NoAccelerators,
    AnotherTest, ProbeUnschedulable, AwaitingBaseline) and why."""
    checks: list[CheckStatus] = Field(default_factory=list, max_length=16)
    """Per-check results."""
    job_name: Annotated[str, StringConstraints(max_length=253)] | None = None
    """The probe Job."""
    fingerprint_hash: HexDigest | None = None
    """Fingerprint of the hardware and software that ran the probe."""
    device_ids: list[Annotated[str, StringConstraints(max_length=96)]] = Field(
        default_factory=list, alias="deviceIDs", max_length=64
    )
    """Each device's UUID or serial by device index, as the probe named them ("" for a
    device it could not name; empty when it named none)."""
    suite: Suite | None = None
    """The suite that runs: spec.suite, or the operator's pick when spec.suite is unset."""
    seed: int | None = Field(default=None, ge=0, le=2147483647)
    """The seed the probe Job was given (spec.seed if pinned, else the fixed baseline seed)."""
    data_seed: int | None = Field(default=None, ge=0, le=2147483647)
    """The data seed the probe Job was given (the rounds a baseline does not cover)."""
    start_time: dt.datetime | None = None
    """When the probe started."""
    budget_seconds: int | None = Field(default=None, ge=0)
    """Seconds the probe plans this screening for: the suite's budget
    (spec.suites.budgetSeconds, else spec.probe.budgetSeconds)."""
    expected_end: dt.datetime | None = None
    """When the screening should end: the Job's start, plus the budget, plus an
    allowance for the Pod's start and the result (never past the Job's deadline)."""
    catch_target: float | None = Field(default=None, ge=0.0, le=1.0)
    """The catch chance every check was to reach (spec.probe.catchTarget.chance, as the
    probe reported it). Null: the probe did not say."""
    catch_fraction: float | None = Field(default=None, ge=0.0, le=1.0)
    """The share of rounds the target's fault is active in."""
    catch_target_met: bool | None = None
    """Whether every check reached catchTarget with the rounds it ran (see
    checks[].catchChance). Null: the probe did not say (an older probe, or no plan ran);
    False also sets the condition CatchTargetMet False (reason CatchShortfall)."""
    catch_shortfall: Annotated[str, StringConstraints(max_length=1024)] = ""
    """Which checks fell short of the target and the budget that would reach it."""
    completion_time: dt.datetime | None = None
    """When the test finished."""


class SDCTest(ApiModel):
    """SDCTest: one screening of one node for silent data corruption."""

    api_version: ApiVersion = API_VERSION
    kind: Literal["SDCTest"] = "SDCTest"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: SDCTestSpec
    status: SDCTestStatus | None = None


def unnamed_suite(qualified_before: bool) -> Suite:
    """The suite of a test that names none: acceptance on a node that never qualified
    (as the operator's own gate would run), requalification on any other."""
    return Suite.REQUALIFICATION if qualified_before else Suite.ACCEPTANCE


def suite_of(test: SDCTest) -> Suite:
    """The suite a test runs: the one the operator recorded when it started the test,
    else spec.suite, else requalification (a test not started yet that names none)."""
    recorded = test.status.suite if test.status else None
    return recorded or test.spec.suite or Suite.REQUALIFICATION


def check_test_update(old: SDCTestSpec, new: SDCTestSpec) -> None:
    """Python twin of the ``self == oldSelf`` rule on SDCTest.spec; raises ValueError."""
    if old != new:
        raise ValueError("spec: an SDCTest's spec is immutable; create a new SDCTest")
