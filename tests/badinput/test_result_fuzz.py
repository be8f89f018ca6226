"""Property-based fuzzing of probe results through ``judge_result``.

tests/unit/test_judging.py already covers arbitrary text, arbitrary JSON and cut or
damaged copies of one good document. This file aims at results that are *almost*
right, the ones a parser is tempted to accept: a good document with one field made
wrong (schema version, digest shape, a pass without digests, any leaf replaced by
other JSON), oversized documents, and every way a Pod can end. The oracle is the
operator's promise: garbage is Inconclusive (or Crash/Timeout by how the Pod ended)
with a reason, never Pass, never an exception; and nothing passes unless every
expected check's digest equals the trusted baseline's.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from tests.unit.factories import CHECKS, check, digest, fingerprint, result, text

from sdcguard.api import SDCBaselineSpec, Verdict
from sdcguard.domain.judging import PodEnd, judge_result
from sdcprobe.result import TERMINATION_LIMIT

FP = fingerprint()
GOOD = digest("good")
BASELINES = {
    FP["hash"]: SDCBaselineSpec.model_validate(
        {
            "fingerprint": {"hash": FP["hash"]},
            "digests": dict.fromkeys(CHECKS, GOOD),
            "trusted": True,
        }
    )
}
EXIT_CODES = st.one_of(st.none(), st.sampled_from([0, 1, 2]), st.integers(-255, 512))
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
FUZZ = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def good_doc() -> dict[str, Any]:
    return result("pass", {c: check() for c in CHECKS})


def judged(message: str | None, exit_code: int | None, **end: Any) -> Any:
    """Judge, and hold every judgement to the promises that do not depend on input."""
    j = judge_result(PodEnd(message, exit_code, **end), CHECKS, BASELINES)
    assert j.reason and j.message, "every verdict says why"
    assert j.verdict in set(Verdict)
    return j


def passed_honestly(doc: Any) -> bool:
    """What a Pass requires of the document: every expected check digested as trusted."""
    if not isinstance(doc, dict) or not isinstance(doc.get("checks"), dict):
        return False
    checks = doc["checks"]
    return all(isinstance(checks.get(c), dict) and checks[c].get("digest") == GOOD for c in CHECKS)


# Almost-right documents --------------------------------------------------------------


@FUZZ
@given(
    version=st.one_of(
        st.integers().filter(lambda v: v != 1),
        st.text(max_size=5),
        st.floats().filter(lambda v: v != 1),
        st.none(),
        st.lists(st.integers(), max_size=2),
    ),
    exit_code=EXIT_CODES,
)
def test_wrong_schema_version_is_never_a_pass(version: Any, exit_code: int | None) -> None:
    doc = good_doc() | {"schema_version": version}
    j = judged(text(doc), exit_code)
    assert j.verdict != Verdict.PASS
    if exit_code in (None, 0, 1, 2):
        assert (j.verdict, j.reason) == (Verdict.INCONCLUSIVE, "UnknownSchema")


@pytest.mark.parametrize("version", [True, 1.0])
def test_schema_version_must_be_the_integer_1(version: Any) -> None:
    j = judged(text(good_doc() | {"schema_version": version}), 0)
    assert (j.verdict, j.reason) == (Verdict.INCONCLUSIVE, "UnknownSchema")


@FUZZ
@given(
    missing=st.sets(st.sampled_from(CHECKS), min_size=1),
    top=st.sampled_from(["pass", "inconclusive"]),
    exit_code=EXIT_CODES,
)
def test_a_pass_without_digests_is_inconclusive(
    missing: set[str], top: str, exit_code: int | None
) -> None:
    checks = {c: check(digest_value=None) if c in missing else check() for c in CHECKS}
    j = judged(text(result(top, checks)), exit_code)
    assert j.verdict in (Verdict.INCONCLUSIVE, Verdict.CRASH)
    if exit_code in (None, 2) and top == "inconclusive":
        assert j.reason == "NoDigest"


HEX = "0123456789abcdef"
BAD_DIGESTS = st.one_of(
    st.text(alphabet=HEX, max_size=130).filter(lambda s: len(s) != 64),
    st.text(alphabet=HEX.upper(), min_size=64, max_size=64).filter(lambda s: s != s.lower()),
    st.text(min_size=64, max_size=64).filter(lambda s: not set(s) <= set(HEX)),
    st.integers(),
    st.lists(st.text(alphabet=HEX, max_size=8), max_size=3),
)


@FUZZ
@given(which=st.sampled_from(CHECKS), bad=BAD_DIGESTS, exit_code=EXIT_CODES)
def test_malformed_digests_are_inconclusive(which: str, bad: Any, exit_code: int | None) -> None:
    doc = good_doc()
    doc["checks"][which]["digest"] = bad
    j = judged(text(doc), exit_code)
    assert j.verdict in (Verdict.INCONCLUSIVE, Verdict.CRASH)
    if exit_code in (None, 0, 1, 2):
        assert j.reason == "InvalidResult" and "digest" in j.message


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every location in a JSON document (the root excluded)."""
    out: list[tuple[Any, ...]] = []
    items = (
        node.items()
        if isinstance(node, dict)
        else enumerate(node)
        if isinstance(node, list)
        else ()
    )
    for key, value in items:
        out.append((*prefix, key))
        out += _paths(value, (*prefix, key))
    return out


GOOD_PATHS = _paths(good_doc())


@FUZZ
@given(path=st.sampled_from(GOOD_PATHS), value=JSON, exit_code=EXIT_CODES)
def test_one_field_replaced_never_passes_a_wrong_digest(
    path: tuple[Any, ...], value: Any, exit_code: int | None
) -> None:
    doc = copy.deepcopy(good_doc())
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    j = judged(json.dumps(doc), exit_code)
    if j.verdict == Verdict.PASS:
        assert exit_code in (None, 0)
        assert passed_honestly(doc), f"passed with {path}={value!r}"


@FUZZ
@given(
    extra=st.dictionaries(
        st.text(min_size=1, max_size=12).filter(lambda k: k not in good_doc()), JSON, min_size=1
    ),
    where=st.sampled_from(["top", "check", "fingerprint"]),
)
def test_unknown_fields_are_refused(extra: dict[str, Any], where: str) -> None:
    """Schema version 1 is closed: a newer probe's field never passes silently."""
    doc = good_doc()
    target = {"top": doc, "check": doc["checks"]["golden"], "fingerprint": doc["fingerprint"]}
    added = {k: v for k, v in extra.items() if k not in target[where]}
    # A key the target already has (a fingerprint's "driver") would only change a known
    # value, which other tests judge: only examples that add a field count here.
    assume(added)
    target[where].update(added)
    j = judged(text(doc), 0)
    assert j.verdict == Verdict.INCONCLUSIVE


@FUZZ
@given(size=st.integers(TERMINATION_LIMIT + 1, 64 * 1024), exit_code=EXIT_CODES)
def test_oversized_garbage_is_inconclusive(size: int, exit_code: int | None) -> None:
    doc = text(good_doc())
    padded = doc[:-1] + "," + '"' + "x" * size + '":1}'
    j = judged(padded, exit_code)
    assert j.verdict in (Verdict.INCONCLUSIVE, Verdict.CRASH)


def test_an_oversized_result_never_passes() -> None:
    doc = good_doc() | {"reason": "x" * (2 * TERMINATION_LIMIT)}
    j = judged(text(doc), 0)
    assert j.verdict == Verdict.INCONCLUSIVE


# How the Pod ended -----------------------------------------------------------------------


MESSAGES = st.one_of(
    st.none(),
    st.text(max_size=300),
    st.just(text(good_doc())),
    st.just(text(result("fail", {c: check("fail" if c == "golden" else "pass") for c in CHECKS}))),
    JSON.map(json.dumps),
)


@FUZZ
@given(
    message=MESSAGES,
    exit_code=EXIT_CODES,
    timed_out=st.booleans(),
    crashed=st.booleans(),
    detail=st.text(max_size=40),
)
def test_every_pod_end_has_a_verdict_and_a_reason(
    message: str | None, exit_code: int | None, timed_out: bool, crashed: bool, detail: str
) -> None:
    j = judged(message, exit_code, timed_out=timed_out, crashed=crashed, detail=detail)
    sdc = j.verdict == Verdict.SDC
    if timed_out and not sdc:
        assert (j.verdict, j.reason) == (Verdict.TIMEOUT, "TimedOut")
    elif (crashed or exit_code not in (None, 0, 1, 2)) and not sdc:
        assert (j.verdict, j.reason) == (Verdict.CRASH, "Crashed")
    if j.verdict == Verdict.PASS:
        assert exit_code in (None, 0) and not timed_out and not crashed
        assert passed_honestly(json.loads(message or "null"))
