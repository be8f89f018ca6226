"""Baselines: consensus of K agreeing nodes, recorded reference nodes, comparison."""

from __future__ import annotations

from sdcguard.api import (
    BaselineMode,
    BaselineSettings,
    FingerprintSpec,
    SDCBaselineSpec,
    SDCBaselineStatus,
)
from sdcguard.domain.baselines import (
    BaselineUpdate,
    compare,
    fingerprint_spec,
    record_candidate,
)
from tests.unit.factories import CHECKS, NOW, digest, fingerprint

FP = FingerprintSpec(hash=fingerprint()["hash"], device_model="NVIDIA H100 80GB HBM3")
GOOD = {c: digest("good") for c in CHECKS}
ODD = {**GOOD, "golden": digest("odd")}
CONSENSUS = BaselineSettings(mode=BaselineMode.CONSENSUS, quorum=3)


def record(
    spec: SDCBaselineSpec | None,
    status: SDCBaselineStatus | None,
    node: str,
    digests: dict[str, str],
    settings: BaselineSettings = CONSENSUS,
) -> BaselineUpdate:
    return record_candidate(
        spec,
        status,
        fingerprint=FP,
        node=node,
        test=f"{node}-t",
        digests=digests,
        settings=settings,
        now=NOW,
    )


def test_consensus_of_quorum_nodes_becomes_trusted_and_the_minority_suspect() -> None:
    update = record(None, None, "n1", GOOD)
    assert not update.spec.trusted and update.spec.fingerprint == FP
    assert "1 of 3 nodes agree" in update.message
    update = record(update.spec, update.status, "n2", ODD)
    update = record(update.spec, update.status, "n3", GOOD)
    assert not update.became_trusted
    assert update.status.conditions[0].reason == "AwaitingQuorum"
    update = record(update.spec, update.status, "n4", GOOD)
    assert update.became_trusted and update.spec.trusted
    assert update.spec.digests == GOOD and update.spec.recorded_from == ["n1", "n3", "n4"]
    assert update.suspects == ("n2",)
    assert update.status.agreeing_nodes == ["n1", "n3", "n4"]
    assert update.status.disagreeing_nodes == ["n2"] and update.status.candidates == []
    assert update.status.conditions[0].status == "True"


def test_a_node_reporting_again_replaces_its_candidate() -> None:
    update = record(None, None, "n1", ODD)
    update = record(update.spec, update.status, "n1", GOOD)
    assert [c.node_name for c in update.status.candidates] == ["n1"]
    assert update.status.candidates[0].digests == GOOD


def test_equal_groups_are_contested() -> None:
    two = BaselineSettings(mode=BaselineMode.CONSENSUS, quorum=2)
    update = record(None, None, "n1", GOOD, two)
    update = record(update.spec, update.status, "n2", ODD, two)
    update = record(update.spec, update.status, "n3", GOOD, two)
    assert update.became_trusted, "2 beat 1"
    # Two groups of two, then the quorum is lowered to two: neither group wins.
    update = record(None, None, "n1", GOOD)
    for name, digests in (("n2", ODD), ("n3", GOOD), ("n4", ODD)):
        update = record(update.spec, update.status, name, digests)
    update = record(update.spec, update.status, "n3", GOOD, two)
    assert not update.spec.trusted and update.status.conditions[0].reason == "Contested"
    assert "contested" in update.message


def test_trusted_baselines_compare_and_never_move() -> None:
    spec = SDCBaselineSpec(fingerprint=FP, digests=GOOD, trusted=True)
    assert compare(ODD, spec) == {"compute": "match", "collective": "match", "golden": "mismatch"}
    assert compare(GOOD, None) == {c: "absent" for c in CHECKS}
    update = record(spec, None, "n9", ODD)
    assert update.spec == spec and update.suspects == ("n9",)
    assert update.status.disagreeing_nodes == ["n9"]
    update = record(spec, update.status, "n9", GOOD)
    assert update.suspects == () and update.status.agreeing_nodes == ["n9"]
    assert update.status.disagreeing_nodes == []


def test_a_check_added_later_joins_a_trusted_baseline_by_consensus() -> None:
    """Repair verification runs memory, which acceptance did not: its digest is gathered
    from agreeing nodes and added; the digests already trusted never move."""
    spec = SDCBaselineSpec(fingerprint=FP, digests=GOOD, trusted=True)
    with_memory = {**GOOD, "memory": digest("mem")}
    update = record(spec, None, "n1", with_memory)
    assert not update.became_trusted and "memory: 1 of 3 nodes agree" in update.message
    update = record(update.spec, update.status, "n2", with_memory)
    update = record(update.spec, update.status, "n3", ODD | {"memory": digest("mem")})
    assert not update.became_trusted and update.suspects == ("n3",), (
        "a disagreeing node adds nothing"
    )
    update = record(update.spec, update.status, "n4", with_memory)
    assert update.became_trusted and update.spec.digests == with_memory
    assert update.status.candidates == []


def test_recorded_mode_trusts_the_named_reference_nodes() -> None:
    recorded = BaselineSettings(mode=BaselineMode.RECORDED, quorum=1)
    update = record(None, None, "n1", GOOD, recorded)
    assert "name reference nodes" in update.message
    spec = update.spec.model_copy(update={"recorded_from": ["ref1", "ref2"]})
    update = record(spec, update.status, "ref1", GOOD, recorded)
    assert "1 of 2 reference nodes reported" in update.message
    update = record(update.spec, update.status, "ref2", GOOD, recorded)
    assert update.became_trusted and update.spec.source == "Recorded"
    assert update.suspects == () and update.status.agreeing_nodes == ["n1", "ref1", "ref2"]
    spec = update.spec.model_copy(update={"trusted": False, "digests": {}})
    update = record(spec, None, "ref1", GOOD, recorded)
    update = record(update.spec, update.status, "ref2", ODD, recorded)
    assert not update.became_trusted and "they disagree" in update.message


def test_fingerprint_spec_from_a_probe_fingerprint() -> None:
    from sdcprobe.result import Fingerprint

    probe = Fingerprint.model_validate(fingerprint())
    spec = fingerprint_spec(probe)
    assert spec.hash == probe.hash and spec.short_hash == probe.hash[:12]
    assert spec.device_model == "NVIDIA H100 80GB HBM3" and spec.threads == 4
