"""judge_result(): what a probe Pod's end means; assess(): what a verdict means for a node."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdcguard.api import (
    CheckVerdict,
    Confirmation,
    ScreeningReason,
    SDCBaselineSpec,
    SDCTestPhase,
    SDCTestStatus,
    Verdict,
    find_condition,
)
from sdcguard.domain.judging import (
    CATCH_CONDITION,
    Outcome,
    PodEnd,
    assess,
    backoff_seconds,
    clears,
    depth,
    judge_result,
    probe_error_line,
    record_catch,
)
from tests.unit.factories import CHECKS, check, digest, fingerprint, result, sdctest, text

FP = fingerprint()
NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


def trusted(**digests: str) -> dict[str, SDCBaselineSpec]:
    values = digests or {c: digest("good") for c in CHECKS}
    spec = SDCBaselineSpec.model_validate(
        {"fingerprint": {"hash": FP["hash"]}, "digests": values, "trusted": True}
    )
    return {FP["hash"]: spec}


def judge(doc: dict[str, Any] | str | None, exit_code: int | None = None, **kw: Any) -> Any:
    message = text(doc) if isinstance(doc, dict) else doc
    if exit_code is None and isinstance(doc, dict):
        exit_code = {"pass": 0, "fail": 1, "inconclusive": 2}[doc["verdict"]]
    baselines = kw.pop("baselines", trusted())
    return judge_result(PodEnd(message, exit_code, **kw), CHECKS, baselines)


def test_pass_against_a_trusted_baseline() -> None:
    j = judge(result("pass", {c: check(baseline="match") for c in CHECKS}))
    assert (j.verdict, j.reason, j.phase) == (Verdict.PASS, "Passed", SDCTestPhase.PASSED)
    assert j.passed_checks == frozenset(CHECKS)
    assert [s.baseline for s in j.check_statuses()] == ["match"] * 3


def test_probe_inconclusive_only_for_lack_of_a_baseline_passes_when_ours_matches() -> None:
    j = judge(result("inconclusive", {c: check("inconclusive") for c in CHECKS}))
    assert j.verdict == Verdict.PASS


def test_without_a_trusted_baseline_nothing_passes_and_nothing_is_sdc() -> None:
    doc = result("pass", {c: check() for c in CHECKS})
    j = judge(doc, baselines={})
    assert (j.verdict, j.reason) == (Verdict.INCONCLUSIVE, "BaselineAbsent")
    assert j.digests == {c: digest("good") for c in CHECKS}, "recorded as a candidate"
    untrusted = trusted()
    untrusted[FP["hash"]] = untrusted[FP["hash"]].model_copy(update={"trusted": False})
    assert judge(doc, baselines=untrusted).verdict == Verdict.INCONCLUSIVE


def test_digest_mismatch_against_the_trusted_baseline_is_sdc() -> None:
    checks = {c: check() for c in CHECKS} | {"golden": check(value="bad")}
    j = judge(result("pass", checks))
    assert (j.verdict, j.reason, j.phase) == (Verdict.SDC, "DigestMismatch", SDCTestPhase.FAILED)
    assert j.failed_checks == frozenset({"golden"})
    golden = next(s for s in j.check_statuses() if s.name == "golden")
    assert (golden.verdict, golden.baseline) == (CheckVerdict.SDC, "mismatch")
    assert "golden" not in j.digests


def test_probe_found_sdc_names_the_device_and_step() -> None:
    bad = check(
        "fail",
        value="bad",
        odd_device=3,
        first_divergent_step=450,
        first_divergent_submodule="layers.0.attn",
        reason="device 3 differs from 0,1,2",
        metrics={"mismatch_fraction": 0.0289, "steps": 500},
    )
    j = judge(result("fail", {"compute": check(), "collective": check(), "golden": bad}))
    assert (j.verdict, j.reason) == (Verdict.SDC, "SDCDetected")
    assert "device 3" in j.message and "step 450" in j.message
    golden = next(s for s in j.check_statuses() if s.name == "golden")
    assert golden.odd_device == 3 and golden.first_divergent_submodule == "layers.0.attn"
    assert golden.metrics == {"mismatch_fraction": "0.0289", "steps": "500"}


def test_fingerprint_mismatch_is_never_sdc() -> None:
    doc = result("fail", {c: check("fail", baseline="fingerprint-mismatch") for c in CHECKS})
    j = judge(doc)
    assert (j.verdict, j.reason) == (Verdict.INCONCLUSIVE, "FingerprintMismatch")


def test_a_baseline_of_another_fingerprint_is_not_used() -> None:
    other = fingerprint(driver="560.0")
    doc = result("pass", {c: check(value="different") for c in CHECKS}, fingerprint=other)
    j = judge(doc)
    assert j.verdict == Verdict.INCONCLUSIVE and j.reason == "BaselineAbsent"


def test_deeper_failure_wins_over_lighter_passes() -> None:
    j = judge(result("fail", {"compute": check(), "collective": check(), "golden": check("fail")}))
    assert j.verdict == Verdict.SDC
    assert depth("compute") < depth("collective") < depth("memory") < depth("golden")
    assert not clears({"golden"}, {"compute", "collective"})
    assert clears({"golden"}, {"golden", "compute"})


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (None, "ResultMissing"),
        ("", "ResultMissing"),
        ("   \n", "ResultMissing"),
        ('{"schema_version":1,"kind":"sdcprobe.result","verdict":"pa', "ResultTruncated"),
        (text({**result("pass"), "schema_version": 2}), "UnknownSchema"),
        ("[1, 2, 3]", "InvalidResult"),
        (text({**result("pass"), "kind": "something.else"}), "InvalidResult"),
        ("1" * 5000, "ResultOversized"),
        ("[" * 100000, "ResultOversized"),
    ],
)
def test_unusable_results_are_inconclusive(message: str | None, reason: str) -> None:
    for exit_code in (None, 0, 1, 2):
        j = judge(message, exit_code)
        assert (j.verdict, j.reason) == (Verdict.INCONCLUSIVE, reason), exit_code


def test_text_that_is_no_result_is_the_probes_own_error_when_it_exited_with_one() -> None:
    # An exit status of 1 or 2 with text that is no result: the kubelet kept the log's
    # tail (FallbackToLogsOnError), and its error line is what the user needs to see.
    for exit_code in (None, 0):
        j = judge("not json at all", exit_code)
        assert (j.verdict, j.reason) == (Verdict.INCONCLUSIVE, "InvalidResult")
    for exit_code in (1, 2):
        j = judge("not json at all", exit_code)
        assert (j.verdict, j.reason) == (Verdict.INCONCLUSIVE, "ProbeError")
        assert j.message == "the probe stopped with an error: not json at all"


ARGPARSE_TAIL = (
    "usage: sdcprobe run [-h] [--device {auto,cpu,cuda,xla}] [--budget BUDGET]\n"
    "sdcprobe run: error: unrecognized arguments: --sizee 5\n"
)


def test_an_unknown_param_reaches_the_message_from_the_log_tail() -> None:
    """#45: a probe that refuses a flag (a suite param the API did not catch, or a probe
    image older than the operator) names it on the SDCTest, not "no result for compute"."""
    j = judge(ARGPARSE_TAIL, 2)
    assert (j.verdict, j.reason) == (Verdict.INCONCLUSIVE, "ProbeError")
    assert "unrecognized arguments: --sizee 5" in j.message
    assert "usage:" not in j.message


def test_an_unknown_param_reaches_the_message_from_the_result() -> None:
    # What the probe writes itself for bad arguments: an inconclusive result, no check,
    # its reason the parser's words. Terminal escapes and newlines do not reach status.
    said = "bad arguments: sdcprobe run: unrecognized arguments: --sizee 5\x1b[31m\n\x00"
    doc = result("inconclusive", {}, reason=said, fingerprint=None)
    j = judge(doc, 2)
    assert (j.verdict, j.reason) == (Verdict.INCONCLUSIVE, "ProbeError")
    assert j.message == (
        "the probe ran no check: bad arguments: sdcprobe run: unrecognized arguments: "
        "--sizee 5 [31m"
    )


def test_a_long_probe_error_is_bounded_and_on_one_line() -> None:
    j = judge("Traceback\n" + "ValueError: " + "x" * 3000 + "\n", 1)
    assert j.reason == "ProbeError" and len(j.message) <= 400 and "\n" not in j.message
    assert "cut" in j.message
    assert probe_error_line("") == ""
    assert probe_error_line("first\n\nlast line\n") == "last line"


def test_pass_without_digests_is_inconclusive() -> None:
    doc = result("pass", {c: check(digest_value=None) for c in CHECKS})
    j = judge(doc, 0)
    assert j.verdict == Verdict.INCONCLUSIVE and "no digest" in j.message
    doc = result("inconclusive", {c: check("inconclusive", digest_value=None) for c in CHECKS})
    assert judge(doc).reason == "NoDigest"


def test_a_probe_that_made_no_plan_says_why() -> None:
    # What a probe writes when its budget does not fit the smallest plan: every
    # device's every check has no result, and the plan carries the reason.
    why = (
        "budget 5s is too small: one round of every check (compute 322ms, collective "
        "457ms, golden 259ms) and the minimum a baseline covers need 5.7s of work alone"
    )
    no_result = "device 0: no result; device 1: no result"
    plan = {"budget_s": 5.0, "startup_s": 7.9, "planned_s": 7.9, "error": why}
    checks = {c: check("inconclusive", reason=no_result, digest_value=None) for c in CHECKS}
    j = judge(result("inconclusive", checks, reason=why, plan=plan))
    assert (j.verdict, j.reason) == (Verdict.INCONCLUSIVE, "NoPlan")
    assert j.message == f"the probe ran no check: {why}"
    # A plan that was made leaves the checks' own reasons in charge.
    plan.pop("error")
    assert judge(result("inconclusive", checks, plan=plan)).reason == "NoDigest"


def test_missing_expected_check_is_inconclusive() -> None:
    doc = result("pass", {"compute": check(), "golden": check()}, truncated=True)
    j = judge(doc)
    assert (j.verdict, j.reason) == (Verdict.INCONCLUSIVE, "CheckMissing")
    assert "collective" in j.message and "truncated" in j.message


def test_crash_timeout_and_mismatch_are_different_verdicts() -> None:
    good = result("pass", {c: check() for c in CHECKS})
    assert judge(None, 137, crashed=True, detail="OOMKilled").verdict == Verdict.CRASH
    assert judge(None, 139).verdict == Verdict.CRASH
    assert judge(None, None, timed_out=True).verdict == Verdict.TIMEOUT
    assert judge(good, 0, timed_out=True).verdict == Verdict.TIMEOUT
    bad = result("fail", {"compute": check(), "collective": check(), "golden": check("fail")})
    for kw in ({"crashed": True}, {"timed_out": True}):
        j = judge(bad, 1, **kw)
        assert j.verdict == Verdict.SDC, "wrong answers stay wrong answers"
        assert "then the Pod" in j.message


def test_a_probe_pod_deleted_mid_run_is_inconclusive_not_a_crash() -> None:
    """A drain (an autoscaler removing the node) deletes the probe Pod and the kubelet
    kills the probe: neither a crash of the probe nor evidence about the hardware."""
    j = judge(None, 143, deleted=True, detail="Error")
    assert (j.verdict, j.reason) == (Verdict.INCONCLUSIVE, "ProbePodDeleted")
    assert "deleted before the probe finished" in j.message
    assert judge(None, 137, crashed=True, deleted=True).reason == "ProbePodDeleted"
    # What the probe did say still counts: a finished pass, wrong answers, a deadline.
    good = result("pass", {c: check() for c in CHECKS})
    assert judge(good, 0, deleted=True).verdict == Verdict.PASS
    bad = result("fail", {"compute": check(), "collective": check(), "golden": check("fail")})
    assert judge(bad, 1, deleted=True, crashed=True).verdict == Verdict.SDC
    assert judge(None, 143, deleted=True, timed_out=True).verdict == Verdict.TIMEOUT
    # Not deleted: the same end is the probe's crash.
    assert judge(None, 143, detail="Error").verdict == Verdict.CRASH


def test_exit_status_contradicting_the_result_is_inconclusive() -> None:
    good = result("pass", {c: check() for c in CHECKS})
    j = judge(good, 1)
    assert (j.verdict, j.reason) == (Verdict.INCONCLUSIVE, "Inconsistent")


def test_fault_injection_is_noted() -> None:
    doc = result(
        "fail",
        {"compute": check(), "collective": check(), "golden": check("fail")},
        injection={"enabled": True, "count": 12, "by_site": {"matmul": 12}},
    )
    j = judge(doc)
    assert j.injected and "fault injection" in j.message


# Garbage never passes and never raises -------------------------------------------

EXIT_CODES = st.sampled_from([None, 0, 1, 2])


@settings(max_examples=300, deadline=None)
@given(message=st.text(max_size=5000), exit_code=EXIT_CODES)
def test_garbage_text_is_always_inconclusive(message: str, exit_code: int | None) -> None:
    j = judge_result(PodEnd(message, exit_code), CHECKS, trusted())
    assert j.verdict == Verdict.INCONCLUSIVE


@settings(max_examples=300, deadline=None)
@given(data=st.data(), exit_code=EXIT_CODES)
def test_cut_or_damaged_results_never_pass(data: st.DataObject, exit_code: int | None) -> None:
    good = text(result("pass", {c: check() for c in CHECKS}))
    cut = data.draw(st.integers(min_value=0, max_value=len(good) - 1))
    damaged = good[:cut]
    if data.draw(st.booleans()):
        at = data.draw(st.integers(min_value=0, max_value=len(good) - 1))
        damaged = good[:at] + data.draw(st.characters()) + good[at + 1 :]
    j = judge_result(PodEnd(damaged, exit_code), CHECKS, trusted())
    if j.verdict != Verdict.PASS or damaged == good:
        return
    # A change that leaves a valid document with the same evidence is no damage to it:
    # a digit of the run's duration, or whitespace between tokens ("duration_s":\n2.5).
    # Anything that passes must carry the good result's verdict, fingerprint and checks.
    passed, original = json.loads(damaged), json.loads(good)
    for key in ("verdict", "fingerprint", "checks", "schema_version", "kind", "truncated"):
        assert passed[key] == original[key], key


@settings(max_examples=200, deadline=None)
@given(
    doc=st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=6)
        ),
        max_leaves=30,
    ),
    exit_code=EXIT_CODES,
)
def test_arbitrary_json_is_inconclusive(doc: object, exit_code: int | None) -> None:
    j = judge_result(PodEnd(json.dumps(doc), exit_code), CHECKS, trusted())
    assert j.verdict == Verdict.INCONCLUSIVE


# Confirmation ---------------------------------------------------------------------

ONE_RERUN = Confirmation(reruns=1, require_same_check=True)


def test_first_sdc_needs_a_rerun_unless_none_are_configured() -> None:
    first = sdctest("t1", verdict=Verdict.SDC, failed=("golden",))
    found = assess(first, frozenset(), ONE_RERUN)
    assert found.outcome == Outcome.NEEDS_RERUN and found.suspect_checks == {"golden"}
    assert assess(first, frozenset(), Confirmation(reruns=0)).outcome == Outcome.CONFIRMED


def test_rerun_outcomes() -> None:
    suspect = frozenset({"golden"})
    fail = sdctest(
        "c1", reason=ScreeningReason.CONFIRMATION, verdict=Verdict.SDC, failed=("golden",)
    )
    assert assess(fail, suspect, ONE_RERUN).outcome == Outcome.CONFIRMED
    other = sdctest(
        "c1", reason=ScreeningReason.CONFIRMATION, verdict=Verdict.SDC, failed=("compute",)
    )
    assert assess(other, suspect, ONE_RERUN).outcome == Outcome.FLAKY
    assert assess(other, suspect, Confirmation(reruns=1, require_same_check=False)).outcome == (
        Outcome.CONFIRMED
    )
    passed = sdctest("c1", reason=ScreeningReason.CONFIRMATION, verdict=Verdict.PASS)
    assert assess(passed, suspect, ONE_RERUN).outcome == Outcome.FLAKY
    assert assess(passed, suspect, Confirmation(reruns=2)).outcome == Outcome.NEEDS_RERUN
    later = sdctest("s1", reason=ScreeningReason.SUSPECT, verdict=Verdict.PASS)
    assert assess(later, suspect, ONE_RERUN).outcome == Outcome.CLEARED
    crash = sdctest("c1", reason=ScreeningReason.CONFIRMATION, verdict=Verdict.CRASH)
    assert assess(crash, suspect, ONE_RERUN).outcome == Outcome.INCONCLUSIVE


def test_backoff_doubles_up_to_sixteen_times() -> None:
    assert [backoff_seconds(600, n) for n in (1, 2, 3, 5, 9)] == [600, 1200, 2400, 9600, 9600]


# Catch target (#38 item 6) --------------------------------------------------------


def _catch_plan(chances: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "budget_s": 900.0,
        "startup_s": 9.0,
        "planned_s": 880.0,
        "catch_target": 0.99,
        "catch_fraction": 0.05,
        "rounds_needed": 90,
        "planned_target_met": True,
        "catch_chance": chances,
        "target_met": True,
        "shortfall": None,
        **extra,
    }


def test_the_catch_chance_each_check_reached_is_recorded() -> None:
    chances = {"compute": 0.9952, "collective": 0.9913, "golden": 0.9999}
    j = judge(result("pass", plan=_catch_plan(chances)))
    assert j.verdict == Verdict.PASS and "catch target" not in j.message
    assert (j.catch.target, j.catch.fraction, j.catch.met) == (0.99, 0.05, True)
    assert {c.name: c.catch_chance for c in j.check_statuses()} == chances
    status = record_catch(SDCTestStatus(), j, NOW)
    assert (status.catch_target, status.catch_target_met, status.catch_shortfall) == (
        0.99,
        True,
        "",
    )
    met = find_condition(status.conditions, CATCH_CONDITION)
    assert met is not None and (met.status, met.reason) == ("True", "CatchTargetMet")
    assert met.message == "every check reached 0.99 for a fault in 5% of rounds"


def test_a_screening_that_fell_short_says_so_and_is_flagged() -> None:
    said = "catch target 0.99 at 5% not reached by compute (0.951, 59 rounds)"
    chances = {"compute": 0.951, "collective": 0.9913, "golden": 0.9999}
    plan = _catch_plan(chances, target_met=False, shortfall=said, planned_target_met=False)
    j = judge(result("pass", plan=plan))
    # Flag: the verdict stands (the digests matched), and the shortfall is in its words.
    assert j.verdict == Verdict.PASS
    assert j.message.endswith(f"; catch target missed: {said}")
    status = record_catch(SDCTestStatus(), j, NOW)
    assert status.catch_target_met is False and status.catch_shortfall == said
    short = find_condition(status.conditions, CATCH_CONDITION)
    assert short is not None and (short.status, short.reason) == ("False", "CatchShortfall")
    assert short.message == said


def test_a_probe_that_claims_the_target_against_its_own_chances_is_unusable() -> None:
    """target_met True while compute's chance is below the target: the probe's result
    model refuses a claim its own figures contradict, so the screening is Inconclusive
    (never a Pass on the probe's word)."""
    chances = {"compute": 0.9, "collective": 0.9913}
    j = judge(result("pass", plan=_catch_plan(chances)))
    assert j.verdict == Verdict.INCONCLUSIVE and j.reason == "InvalidResult"
    assert j.catch.met is None


def test_a_shortfall_the_probe_reports_is_recorded() -> None:
    chances = {"compute": 0.9, "collective": 0.9913, "golden": 0.999}
    shortfall = "compute reached 0.900 of 0.99; a budget of 1400s would reach it"
    j = judge(result("pass", plan=_catch_plan(chances, target_met=False, shortfall=shortfall)))
    assert j.verdict == Verdict.PASS
    assert j.catch.met is False
    assert "compute" in j.catch.shortfall


@pytest.mark.parametrize(
    "chances",
    [
        {"compute": 1.5, "collective": 0.999, "golden": 0.999},
        {"compute": -0.1, "collective": 0.999, "golden": 0.999},
    ],
)
def test_malformed_catch_figures_are_never_a_pass(chances: dict[str, Any]) -> None:
    """Chances outside [0, 1] make the result unusable: Inconclusive, no catch outcome
    recorded, never a Pass."""
    j = judge(result("pass", plan=_catch_plan(chances)))
    assert j.verdict == Verdict.INCONCLUSIVE
    assert all(c.catch_chance is None for c in j.check_statuses())
    nan = text(result("pass", plan=_catch_plan({})))
    nan = nan.replace('"catch_target":0.99', '"catch_target":NaN')
    j = judge(nan)
    assert j.verdict != Verdict.PASS or (j.catch.target is None and j.catch.met is None)


def test_results_of_older_probes_record_no_catch_outcome() -> None:
    plan = {"budget_s": 900.0, "startup_s": 9.0, "planned_s": 880.0}
    for doc in (result("pass"), result("pass", plan=plan)):
        j = judge(doc)
        assert j.verdict == Verdict.PASS
        assert (j.catch.target, j.catch.met, j.catch.shortfall) == (None, None, "")
        assert all(c.catch_chance is None for c in j.check_statuses())
        status = record_catch(SDCTestStatus(), j, NOW)
        assert status.catch_target_met is None
        assert find_condition(status.conditions, CATCH_CONDITION) is None


def test_a_target_the_policy_refuses_to_miss_ends_inconclusive_with_the_reason() -> None:
    said = (
        "catch target 0.99 for a fault in 5% of rounds needs 90 rounds per check; budget "
        "120s plans compute 40 (reaching 0.871); a budget of about 260s would reach it"
    )
    no_result = "device 0: no result"
    checks = {c: check("inconclusive", reason=no_result, digest_value=None) for c in CHECKS}
    plan = _catch_plan({}, error=f"refused: {said}", target_met=None, planned_target_met=False)
    plan["shortfall"] = said
    j = judge(result("inconclusive", checks, reason=said, plan=plan))
    assert (j.verdict, j.reason) == (Verdict.INCONCLUSIVE, "CatchShortfall")
    assert j.message == f"the probe ran no check: refused: {said}"
    assert record_catch(SDCTestStatus(), j, NOW).catch_target_met is False


def test_a_shortfall_is_in_the_words_of_the_nodes_event() -> None:
    """The node's transition Event repeats the test's message, so a screening that
    passed short of its target never qualifies a node silently."""
    said = "catch target 0.99 at 5% not reached by compute (0.951, 59 rounds)"
    plan = _catch_plan({"compute": 0.951}, target_met=False, shortfall=said)
    j = judge(result("pass", plan=plan))
    facts = replace(sdctest("t1", verdict=Verdict.PASS), message=j.message)
    found = assess(facts, frozenset(), ONE_RERUN)
    assert found.outcome == Outcome.CLEARED and said in found.message
