"""The result protocol: what the operator reads from a probe Pod's termination message."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sdcprobe.result import (
    Fingerprint,
    ProbeResult,
    ResultError,
    encode_for_termination,
    parse_result,
)
from tests.probe.conftest import probe_env

HEX = "0123456789abcdef"
digests = st.text(alphabet=HEX, min_size=64, max_size=64)
ascii_text = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=128)
check_names = st.from_regex(r"[a-z0-9][a-z0-9_.-]{0,63}", fullmatch=True)
any_text = st.text(max_size=400)  # reasons may hold anything, including non-ASCII
metric_values = st.one_of(
    st.none(),
    st.integers(-(10**9), 10**9),
    st.floats(allow_nan=False, allow_infinity=False),
    any_text,
)


def _fingerprint(**overrides: Any) -> Fingerprint:
    fields: dict[str, Any] = {
        "backend": "cpu",
        "device_model": "cpu: test",
        "device_count": 2,
        "driver": None,
        "runtime": None,
        "torch": "2.9.0",
        "torch_xla": None,
        "cpu_isa": "x86_64-AVX512",
        "threads": 1,
        "config_hash": "0123456789abcdef",
    }
    fields.update(overrides)
    return Fingerprint.build(**fields)


@st.composite
def fingerprints(draw: st.DrawFn) -> Fingerprint:
    return _fingerprint(
        device_model=draw(ascii_text),
        driver=draw(st.none() | ascii_text),
        runtime=draw(st.none() | ascii_text),
        torch=draw(ascii_text),
        torch_xla=draw(st.none() | ascii_text),
        cpu_isa=draw(ascii_text),
        config_hash=draw(ascii_text),
        device_count=draw(st.integers(0, 64)),
        threads=draw(st.integers(0, 256)),
    )


@st.composite
def check_results(draw: st.DrawFn, verdict: str | None = None) -> dict[str, Any]:
    return {
        "verdict": verdict or draw(st.sampled_from(["pass", "fail", "inconclusive"])),
        "reason": draw(any_text),
        "digest": draw(digests),
        "metrics": draw(st.dictionaries(st.text(max_size=40), metric_values, max_size=30)),
        "odd_device": draw(st.none() | st.integers(0, 63)),
        "first_divergent_step": draw(st.none() | st.integers(0, 10**6)),
        "first_divergent_submodule": draw(st.none() | any_text),
        "baseline": draw(st.sampled_from(["match", "mismatch", "absent", "fingerprint-mismatch"])),
    }


@st.composite
def results(draw: st.DrawFn, max_checks: int = 300) -> ProbeResult:
    verdict = draw(st.sampled_from(["pass", "fail", "inconclusive"]))
    names = draw(st.lists(check_names, min_size=1, max_size=max_checks, unique=True))
    checks = {n: draw(check_results("pass" if verdict == "pass" else None)) for n in names}
    return ProbeResult.model_validate(
        {
            "verdict": verdict,
            "reason": draw(any_text),
            "fingerprint": draw(fingerprints()).model_dump(),
            "checks": checks,
            "injection": {
                "enabled": draw(st.booleans()),
                "count": draw(st.integers(0, 10**9)),
                "by_site": draw(
                    st.dictionaries(st.text(max_size=60), st.integers(0, 10**6), max_size=40)
                ),
            },
            "duration_s": draw(st.floats(0, 1e6)),
        }
    )


def _valid_doc() -> dict[str, Any]:
    return {
        "schema_version": 1,
        "kind": "sdcprobe.result",
        "verdict": "pass",
        "reason": "all checks pass",
        "fingerprint": _fingerprint().model_dump(),
        "checks": {
            "golden": {
                "verdict": "pass",
                "reason": "",
                "digest": "a" * 64,
                "metrics": {"steps": 30, "loss_last": 1.25, "dtypes": "float32"},
                "odd_device": None,
                "first_divergent_step": None,
                "first_divergent_submodule": None,
                "baseline": "absent",
            }
        },
        "injection": {"enabled": False, "count": 0, "by_site": {}},
        "duration_s": 4.2,
        "truncated": False,
    }


def test_result_and_package_root_import_neither_torch_nor_numpy() -> None:
    code = (
        "import sys, sdcprobe, sdcprobe.result; "
        "bad = [m for m in ('torch', 'numpy') if m in sys.modules]; "
        "assert not bad, bad"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=probe_env(), capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr


def test_valid_document_round_trips() -> None:
    text = json.dumps(_valid_doc())
    result = parse_result(text)
    assert result.verdict == "pass" and result.exit_code() == 0
    assert result.checks["golden"].metrics["steps"] == 30
    assert parse_result(encode_for_termination(result)) == result


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(results())
def test_termination_message_always_fits_and_keeps_what_matters(result: ProbeResult) -> None:
    encoded = encode_for_termination(result)
    assert len(encoded.encode("utf-8")) <= 4096
    back = parse_result(encoded)
    assert back.verdict == result.verdict
    assert back.fingerprint is not None and result.fingerprint is not None
    assert back.fingerprint.hash == result.fingerprint.hash
    if not back.truncated:
        assert back == result
    for name, check in back.checks.items():
        assert check.verdict == result.checks[name].verdict
        assert check.digest == result.checks[name].digest
    if len(result.checks) <= 8:  # a real run has three checks: all survive
        assert set(back.checks) == set(result.checks)
    if result.verdict == "fail":  # whatever is dropped, a failing check explains the verdict
        assert any(c.verdict == "fail" for c in back.checks.values()) or not any(
            c.verdict == "fail" for c in result.checks.values()
        )


def test_hundreds_of_mismatches_squeeze_into_4096_bytes() -> None:
    doc = _valid_doc()
    doc["verdict"] = "fail"
    doc["reason"] = "; ".join(f"device {i % 8}: element {i} differs" for i in range(500))
    doc["checks"]["golden"]["verdict"] = "fail"
    doc["checks"]["golden"]["metrics"] = {f"mismatch_{i}": i * 1.5 for i in range(500)}
    doc["checks"]["golden"]["reason"] = doc["reason"]
    result = ProbeResult.model_validate(doc)
    encoded = encode_for_termination(result)
    assert len(encoded.encode()) <= 4096
    back = parse_result(encoded)
    assert back.truncated and back.verdict == "fail"
    assert back.checks["golden"].digest == "a" * 64


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_garbage_is_rejected_with_a_reason(text: str) -> None:
    with pytest.raises(ResultError) as err:
        parse_result(text)
    assert err.value.reason


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_truncated_messages_are_rejected(data: st.DataObject) -> None:
    text = json.dumps(_valid_doc())
    cut = data.draw(st.integers(1, len(text) - 1))
    with pytest.raises(ResultError) as err:
        parse_result(text[:cut])
    assert "truncated" in err.value.reason or "not JSON" in err.value.reason


@settings(max_examples=50, deadline=None)
@given(st.one_of(st.integers().filter(lambda v: v != 1), st.text(max_size=5), st.none()))
def test_unknown_schema_version_is_rejected(version: object) -> None:
    doc = _valid_doc()
    doc["schema_version"] = version
    with pytest.raises(ResultError, match="schema_version"):
        parse_result(json.dumps(doc))


def test_missing_schema_version_is_rejected() -> None:
    doc = _valid_doc()
    del doc["schema_version"]
    with pytest.raises(ResultError, match="schema_version"):
        parse_result(json.dumps(doc))


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: d["checks"]["golden"].update(digest=None), "no digest"),
        (lambda d: d.update(checks={}), "without any check"),
        (lambda d: d["checks"]["golden"].update(digest="abc123"), "64 lowercase hex"),
        (lambda d: d["checks"]["golden"].update(digest="A" * 64), "64 lowercase hex"),
        (lambda d: d["checks"]["golden"].update(verdict="fail"), "is 'fail'"),
        (lambda d: d.update(fingerprint=None), "without a fingerprint"),
        (lambda d: d["fingerprint"].update(threads=7), "fingerprint hash"),
        (lambda d: d.update(kind="something.else"), "not an sdcprobe result"),
        (lambda d: d.update(extra_field=1), "extra_field"),
        (lambda d: d.update(verdict="maybe"), "verdict"),
    ],
)
def test_invalid_documents_name_the_problem(mutate: Any, needle: str) -> None:
    doc = _valid_doc()
    mutate(doc)
    with pytest.raises(ResultError) as err:
        parse_result(json.dumps(doc))
    assert needle in err.value.reason


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 63).flatmap(lambda n: st.text(alphabet=HEX + "xyzABC", min_size=n, max_size=n))
)
def test_digest_of_wrong_length_is_rejected(digest: str) -> None:
    doc = _valid_doc()
    doc["checks"]["golden"]["digest"] = digest
    with pytest.raises(ResultError, match="digest"):
        parse_result(json.dumps(doc))


def test_empty_message_explains_itself() -> None:
    with pytest.raises(ResultError, match="wrote no result"):
        parse_result("  \n")


def test_fingerprint_hash_covers_every_field() -> None:
    base = _fingerprint()
    for field, value in [
        ("threads", 2),
        ("torch_xla", "2.9.0"),
        ("config_hash", "x"),
        ("device_count", 3),
    ]:
        assert _fingerprint(**{field: value}).hash != base.hash, field
    assert base.hash == base.expected_hash() and len(base.hash) == 64


@pytest.mark.parametrize("verdict", ["pass", "fail"])
def test_hundreds_of_checks_still_fit_and_parse(verdict: str) -> None:
    doc = _valid_doc()
    doc["verdict"] = verdict
    template = doc["checks"].pop("golden")
    for i in range(300):
        failing = verdict == "fail" and i % 50 == 7
        doc["checks"][f"check-{i:03d}"] = {
            **template,
            "verdict": "fail" if failing else "pass",
            "reason": "x" * 300,
            "digest": f"{i:064x}",
        }
    result = ProbeResult.model_validate(doc)
    encoded = encode_for_termination(result)
    assert len(encoded.encode()) <= 4096
    back = parse_result(encoded)
    assert back.truncated and back.verdict == verdict and "omitted" in back.reason
    assert back.checks, "as many checks as fit are kept"
    for name, check in back.checks.items():
        assert check.digest == result.checks[name].digest
    if verdict == "fail":  # the failing checks are kept first
        assert {n for n, c in back.checks.items() if c.verdict == "fail"} == {
            n for n, c in result.checks.items() if c.verdict == "fail"
        }


def test_device_ids_survive_the_termination_message_and_are_bounded() -> None:
    doc = _valid_doc()
    doc["devices"] = [f"GPU-{i:08d}-0000-0000-0000-000000000000" for i in range(8)]
    result = parse_result(json.dumps(doc))
    assert parse_result(encode_for_termination(result)).devices == doc["devices"]
    doc["devices"] = ["GPU 1 with spaces"]
    with pytest.raises(ResultError):
        parse_result(json.dumps(doc))
