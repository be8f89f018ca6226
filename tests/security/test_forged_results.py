"""A node that writes its own probe result (trust model row "the same node, through
its probe Pod's result"): the fingerprint a result declares is the node's word, so
the judge checks it against what the operator knows, and never lets the probe judge
itself where the hardware has a trusted baseline; and a second SDCBaseline cannot
shadow the one named for its fingerprint.

The result reaches the judge as a termination message, text the node controls: these
tests call the judge (``sdcguard.domain.judging.judge_result``) with the forged text,
as the operator does once it read the Pod's status."""

from __future__ import annotations

from typing import Any

from sdcguard.api import SDCBaselineSpec, Verdict, baseline_name
from sdcguard.domain.baselines import bound_baselines
from sdcguard.domain.judging import NodeExpectation, PodEnd, judge_result
from tests.unit.factories import CHECKS, check, digest, fingerprint, result, text

REAL = fingerprint()
LABELS = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"}


def _trusted(fp: dict[str, Any], value: str = "good") -> SDCBaselineSpec:
    return SDCBaselineSpec.model_validate(
        {
            "fingerprint": {
                "hash": fp["hash"],
                "backend": fp["backend"],
                "deviceModel": fp["device_model"],
                "deviceCount": fp["device_count"],
            },
            "digests": {c: digest(value) for c in CHECKS},
            "trusted": True,
            "source": "Approved",
        }
    )


def _self_judged(fp: dict[str, Any], value: str = "anything") -> str:
    """A result that says every check matched the probe's own baseline."""
    checks = {c: check(value=value, baseline="match") for c in CHECKS}
    return text(result("pass", checks, fingerprint=fp))


def test_a_changed_fingerprint_field_does_not_make_the_probe_its_own_judge() -> None:
    """The attack: the node's hardware has an approved baseline; the forged result
    changes one field of the fingerprint (and recomputes its hash), so the operator
    has no baseline for it, and says its checks matched its own baseline."""
    forged = fingerprint(driver="999.0")
    baselines = {REAL["hash"]: _trusted(REAL)}
    node = NodeExpectation.of(LABELS, [REAL["hash"]])
    j = judge_result(PodEnd(_self_judged(forged), 0), CHECKS, baselines, node)
    assert (j.verdict, j.reason) == (Verdict.INCONCLUSIVE, "SelfJudged")
    assert REAL["hash"][:12] in j.message
    # Without the node's history the same hardware's baseline still forbids it.
    j = judge_result(PodEnd(_self_judged(forged), 0), CHECKS, baselines)
    assert (j.verdict, j.reason) == (Verdict.INCONCLUSIVE, "SelfJudged")
    # A new kind of hardware with no trusted baseline anywhere: the probe's own
    # baseline (given to it on purpose) still counts.
    fresh = fingerprint(device_model="NVIDIA B200", device_count=8)
    labels = {**LABELS, "nvidia.com/gpu.product": "NVIDIA-B200"}
    j = judge_result(
        PodEnd(_self_judged(fresh), 0), CHECKS, baselines, NodeExpectation.of(labels, [])
    )
    assert j.verdict == Verdict.PASS


def test_a_fingerprint_the_nodes_labels_contradict_is_not_a_pass() -> None:
    """The attack: the forged result also changes the device model (or count), so no
    baseline of the node's hardware applies; the node's labels say otherwise."""
    node = NodeExpectation.of(LABELS, [])
    for forged in (
        fingerprint(device_model="Imaginary GPU"),
        fingerprint(device_count=4),
    ):
        baselines = {forged["hash"]: _trusted(forged, "anything")}  # even a trusted one
        j = judge_result(PodEnd(_self_judged(forged), 0), CHECKS, baselines, node)
        assert (j.verdict, j.reason) == (Verdict.INCONCLUSIVE, "FingerprintUnexpected"), j
    # The node's own fingerprint, against its trusted baseline: a pass.
    good = {c: check(value="good", baseline="match") for c in CHECKS}
    j = judge_result(
        PodEnd(text(result("pass", good, fingerprint=REAL)), 0),
        CHECKS,
        {REAL["hash"]: _trusted(REAL)},
        node,
    )
    assert j.verdict == Verdict.PASS


def test_a_second_baseline_cannot_shadow_the_one_named_for_its_hash() -> None:
    """The attack: an SDCBaseline under another name declares the real fingerprint's
    hash with the digests a broken node computes, trusted."""
    real, shadow = _trusted(REAL, "good"), _trusted(REAL, "broken")
    objects = {baseline_name(REAL["hash"]): real, "zz-shadow": shadow}
    bound = bound_baselines(objects)
    assert bound == {REAL["hash"]: real}
    broken = {c: check(value="broken") for c in CHECKS}
    j = judge_result(PodEnd(text(result("pass", broken, fingerprint=REAL)), 0), CHECKS, bound, None)
    assert j.verdict == Verdict.SDC
    # Alone, under a name not its hash's, it counts for nothing.
    assert bound_baselines({"zz-shadow": shadow}) == {}
