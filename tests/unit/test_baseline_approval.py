"""A person approves candidate digests: how a pool smaller than the quorum qualifies, and
the wait that says so."""

from __future__ import annotations

import dataclasses

import pytest

from sdcguard.api import BaselineSource, SDCBaselineSpec, SDCBaselineStatus
from sdcguard.domain.baselines import ApprovalRefused, approve, unreachable_quorum
from sdcguard.domain.budgets import PoolUsage
from sdcguard.domain.decide import decide
from sdcguard.domain.waits import WaitReason
from tests.unit.factories import NOW, policy
from tests.unit.test_baselines import GOOD, ODD, record
from tests.unit.test_waits import _awaiting_baseline


def _candidates(
    *pairs: tuple[str, dict[str, str]],
) -> tuple[SDCBaselineSpec, SDCBaselineStatus | None]:
    update = None
    for node, digests in pairs:
        update = record(
            update.spec if update else None, update.status if update else None, node, digests
        )
    assert update is not None
    return update.spec, update.status


def test_one_node_s_digests_are_approved_with_who_and_when() -> None:
    spec, status = _candidates(("gpu-1", GOOD))
    approval = approve(spec, status, node=None, by="alice@example.com", now=NOW)
    assert approval.spec.trusted and approval.spec.digests == GOOD
    assert approval.spec.source == BaselineSource.APPROVED
    assert approval.spec.approved_by == "alice@example.com" and approval.spec.approved_at == NOW
    assert approval.spec.recorded_from == ["gpu-1"]
    assert [c.test_name for c in approval.producers] == ["gpu-1-t"]
    assert approval.disagreeing == ()


def test_disagreeing_candidates_need_a_node_to_pick() -> None:
    spec, status = _candidates(("gpu-1", GOOD), ("gpu-2", ODD))
    with pytest.raises(ApprovalRefused, match="--node"):
        approve(spec, status, node=None, by="a", now=NOW)
    approval = approve(spec, status, node="gpu-2", by="a", now=NOW)
    assert approval.spec.digests == ODD
    assert [c.node_name for c in approval.disagreeing] == ["gpu-1"]


@pytest.mark.parametrize(
    ("case", "match"),
    [
        ("trusted", "already trusted"),
        ("no candidates", "no candidate digests"),
        ("unknown node", "node gpu-9 has no candidate"),
    ],
)
def test_refusals_say_what_to_do(case: str, match: str) -> None:
    spec, status = _candidates(("gpu-1", GOOD))
    node = None
    if case == "trusted":
        spec = spec.model_copy(update={"trusted": True, "digests": GOOD})
    elif case == "no candidates":
        status = None
    else:
        node = "gpu-9"
    with pytest.raises(ApprovalRefused, match=match):
        approve(spec, status, node=node, by="a", now=NOW)


@pytest.mark.parametrize(
    ("pool_nodes", "quorum", "unreachable"),
    [(0, 3, False), (1, 3, True), (2, 3, True), (3, 3, False), (5, 2, False)],
)
def test_unreachable_quorum(pool_nodes: int, quorum: int, unreachable: bool) -> None:
    assert unreachable_quorum(pool_nodes, quorum) is unreachable


@pytest.mark.parametrize(
    ("pool_nodes", "names_the_command"), [(1, True), (2, True), (3, False), (100, False)]
)
def test_the_baseline_wait_names_the_approve_command_when_the_pool_is_too_small(
    pool_nodes: int, names_the_command: bool
) -> None:
    observed = dataclasses.replace(_awaiting_baseline(), usage=PoolUsage(nodes=pool_nodes))
    decision = decide(observed, policy(baseline={"mode": "Consensus", "quorum": 3}), NOW)
    assert decision.wait is not None and decision.wait.reason == WaitReason.AWAITING_BASELINE
    assert "3 nodes must agree" in decision.wait.message
    approve_hint = "kubectl sdc baselines approve --node gpu-1"
    assert (approve_hint in decision.wait.message) is names_the_command
    if names_the_command:
        assert f"only {pool_nodes} node" in decision.wait.message
