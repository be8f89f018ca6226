"""Pure parts of sdctrain: digests, consensus, attribution, refusals, report bodies."""

from __future__ import annotations

import datetime as dt

import pytest
import torch

from sdctrain.detection import Detection
from sdctrain.digest import differing_rows, digest_all, tensor_digest
from sdctrain.report import KubeReporter, report_body, report_name
from sdctrain.verdicts import (
    Confirmation,
    Method,
    attribute_recompute,
    confirm_divergence,
    refusals,
    replica_consensus,
)

P, T, U = Confirmation.PERSISTENT, Confirmation.TRANSIENT, Confirmation.UNCONFIRMED


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_every_single_bit_flip_changes_the_digest(dtype: torch.dtype) -> None:
    t = torch.randn(257, generator=torch.Generator().manual_seed(0)).to(dtype)
    clean = tensor_digest(t)
    ints = t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    for bit in range(t.element_size() * 8):
        bad = ints.clone()
        bad[100] ^= (1 << bit) if bit < t.element_size() * 8 - 1 else -(1 << bit)
        assert not torch.equal(tensor_digest(bad.view(dtype)), clean), bit


def test_digest_sees_swapped_words_and_is_chunk_independent() -> None:
    t = torch.arange(10, dtype=torch.float32)
    swapped = t.clone()
    swapped[[2, 7]] = swapped[[7, 2]]
    assert not torch.equal(tensor_digest(t), tensor_digest(swapped))
    assert torch.equal(tensor_digest(t, chunk=3), tensor_digest(t))


def test_differing_rows_names_tensors() -> None:
    a = digest_all([torch.zeros(3), torch.ones(3)])
    b = digest_all([torch.zeros(3), torch.ones(3) * 2])
    assert differing_rows(a, b) == [1]


def test_consensus_majority_and_split() -> None:
    assert replica_consensus({0: "x", 1: "x", 2: "x"}).agree
    odd = replica_consensus({0: "x", 1: "y", 2: "x", 3: "x"})
    assert odd.odd_ranks == (1,) and odd.majority_ranks == (0, 2, 3)
    split = replica_consensus({0: "x", 1: "y"})
    assert not split.agree and not split.attributed and "no strict majority" in split.reason
    assert not replica_consensus({0: "x", 1: "x", 2: "y", 3: "y"}).attributed


@pytest.mark.parametrize(
    ("opinions", "faulty", "known"),
    [
        ({1: ["o", "o"], 0: ["a", "a"], 2: ["a"]}, {1: P}, True),  # target reproducible
        ({1: ["o", "a"], 0: ["a", "a"], 2: ["a"]}, {1: T}, True),  # target transient
        ({1: ["o", "o2"], 0: ["a", "a"], 2: ["a"]}, {1: P}, True),  # wrong twice, differently
        ({1: ["o", "o"], 0: ["a", "a"], 2: ["o"]}, {0: P}, True),  # the auditor was wrong
        ({1: ["o", "o2"], 0: ["a", "a"]}, {1: P}, True),  # two ranks: self-inconsistent one
        ({1: ["o", "a"], 0: ["a", "a"]}, {1: T}, True),
        ({1: ["o", "o"], 0: ["a", "a"]}, {}, False),  # two consistent ranks disagree
        ({1: ["a", "a"], 0: ["a", "a"], 2: ["a"]}, {}, True),
        ({1: ["o", "o"], 0: ["a", "a"], 2: ["c"]}, {}, False),
    ],
)
def test_attribution(opinions, faulty, known) -> None:
    verdict = attribute_recompute(opinions)
    assert dict(verdict.faulty) == faulty
    assert verdict.truth_known is known


def test_a_single_wrong_result_is_unconfirmed() -> None:
    verdict = attribute_recompute({1: ["a", "a"], 0: ["a", "a"], 2: ["x"]})
    assert dict(verdict.faulty) == {2: U}


def test_confirm_divergence_kinds() -> None:
    assert confirm_divergence("o", "o2", "o")[0] == "transient-digest"
    assert confirm_divergence("o", "o", "o")[0] == "state"
    assert confirm_divergence("o", "o", "m")[0] == "digest"


def test_refusals_name_the_reason() -> None:
    fp = {"torch": "2.9.0", "device": "cpu-AVX2", "threads": "1"}
    assert refusals([fp, fp], [True, True]) == {}
    mixed = refusals([fp, {**fp, "torch": "2.8.0"}], [True, True])
    assert mixed["consensus"] == mixed["audit"] == "ranks run different torch (2.8.0, 2.9.0)"
    threads = refusals([fp, {**fp, "threads": "4"}], [True, True])
    assert "threads" in threads["audit"]
    nondet = refusals([fp, fp], [True, False])
    assert set(nondet) == {"audit"} and "rank(s) 1" in nondet["audit"]
    assert "single replica" in refusals([fp], [True])["audit"]


def _detection(**over: object) -> Detection:
    base: dict[str, object] = {
        "method": Method.SHADOW_AUDIT,
        "step": 120,
        "rank": 3,
        "confirmation": Confirmation.PERSISTENT,
        "detail": "x" * 5000,
        "node": "gpu-7",
        "pod": "llm-7b-3",
        "namespace": "team-a",
        "job": "llm-7b",
        "gpu_uuid": "GPU-1234",
        "evidence": tuple((f"k{i}", "v" * 400) for i in range(30)),
    }
    base.update(over)
    return Detection(**base)  # type: ignore[arg-type]


def test_report_body_is_capped_and_named_deterministically() -> None:
    now = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    body = report_body(_detection(), now)
    spec = body["spec"]
    assert body["metadata"] == {"name": report_name(_detection()), "namespace": "team-a"}
    assert spec["nodeName"] == "gpu-7" and spec["podName"] == "llm-7b-3"
    assert spec["method"] == "ShadowAudit" and spec["confirmation"] == "Persistent"
    assert len(spec["detail"]) == 1024 and len(spec["evidence"]) == 16
    assert all(len(e["value"]) == 256 for e in spec["evidence"])
    assert spec["observedAt"] == "2026-01-02T03:04:05Z"
    assert report_name(_detection()) != report_name(_detection(step=121))


def test_report_without_a_node_is_refused_by_the_library() -> None:
    with pytest.raises(ValueError, match="NODE_NAME"):
        report_body(_detection(node=None))


def test_reporter_only_in_a_pod_with_a_token(tmp_path) -> None:
    assert KubeReporter.from_environment({}) is None
    token = tmp_path / "token"
    token.write_text("abc")
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "SDCGUARD_TOKEN_FILE": str(token)}
    reporter = KubeReporter.from_environment(env)
    assert reporter is not None and reporter.server == "https://10.0.0.1:443"
