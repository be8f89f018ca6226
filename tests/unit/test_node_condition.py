"""The SDCQualified Node condition: what each state says, and what it costs in writes.

A remediator (Karpenter's node repair, Medik8s NHC) reads the condition; a clean
re-qualification of a certified node must not write it, and its lastTransitionTime
moves only when its status flips.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import Counter
from typing import Any

import pytest
from kubernetes import client

from sdcguard.adapters.kube import KubeWriter
from sdcguard.adapters.node_writes import NodePatchStage
from sdcguard.api import Verdict
from sdcguard.domain import keys
from sdcguard.domain.budgets import PoolUsage
from sdcguard.domain.decide import Decision, decide
from sdcguard.domain.lifecycle import CreateTest, Event, NodeState, SetLabel
from sdcguard.domain.nodecondition import condition_for, condition_patch
from sdcguard.domain.observed import NodeFacts, NodeSnapshot, Observed
from sdcguard.metrics import Metrics
from tests.unit.factories import HOUR, NOW, applied, node, policy, sdctest

S = NodeState


class _Recorder(KubeWriter):
    def __post_init__(self) -> None:
        super().__post_init__()
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def patch_node(self, name: str, patch: dict[str, Any]) -> None:
        self.calls.append(("node", patch))

    def patch_node_status(self, name: str, patch: dict[str, Any]) -> None:
        self.calls.append(("status", patch))


@pytest.mark.parametrize(
    ("state", "certified", "status", "reason"),
    [
        (S.QUALIFIED, True, "True", "Certified"),
        (S.TESTING, True, "True", "Certified"),
        (S.TESTING, False, "Unknown", "NotYetCertified"),
        (S.UNQUALIFIED, False, "Unknown", "NotYetCertified"),
        (S.SUSPECT, True, "Unknown", "Suspected"),
        (S.QUARANTINED, False, "False", "Quarantined"),
        (S.REPAIRING, False, "False", "InRepair"),
        (S.VERIFYING, False, "False", "VerifyingRepair"),
        (S.RETIRED, False, "False", "Retired"),
        (S.EXCLUDED, False, "Unknown", "Excluded"),
    ],
)
def test_each_state_says_one_status_and_reason(
    state: NodeState, certified: bool, status: str, reason: str
) -> None:
    wanted = condition_for(state, certified=certified, enforce=True)
    assert (wanted.status, wanted.reason) == (status, reason)
    assert wanted.message


def test_observe_mode_never_says_false() -> None:
    for state in NodeState:
        wanted = condition_for(state, certified=False, enforce=False)
        assert (wanted.status, wanted.reason) == ("Unknown", "ObserveMode")


def test_the_transition_time_moves_only_when_the_status_flips() -> None:
    quarantined = condition_for(S.QUARANTINED, certified=False, enforce=True)
    first = condition_patch(("True", "Certified"), quarantined, NOW)
    assert first is not None
    (cond,) = first["status"]["conditions"]
    assert cond["type"] == keys.NODE_CONDITION == "SDCQualified"
    assert (cond["status"], cond["reason"]) == ("False", "Quarantined")
    assert cond["lastTransitionTime"] == keys.format_time(NOW)
    # Quarantined -> Repairing: the reason changes, the status does not.
    repairing = condition_for(S.REPAIRING, certified=False, enforce=True)
    later = condition_patch(("False", "Quarantined"), repairing, NOW + HOUR)
    assert later is not None
    (cond,) = later["status"]["conditions"]
    assert cond["reason"] == "InRepair" and "lastTransitionTime" not in cond
    # Nothing changes: nothing is written.
    assert condition_patch(("False", "InRepair"), repairing, NOW + 2 * HOUR) is None
    # A node without the condition is unknown already.
    assert (
        condition_patch(None, condition_for(S.TESTING, certified=False, enforce=True), NOW) is None
    )


def test_the_snapshot_reads_the_condition_beside_the_kubelets() -> None:
    body = {
        "metadata": {"name": "gpu-1"},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "SDCQualified", "status": "False", "reason": "Quarantined"},
            ]
        },
    }
    snap = NodeSnapshot.from_body(body)
    assert snap.ready and snap.condition == ("False", "Quarantined")
    assert NodeFacts.from_snapshot(snap, ["nvidia.com/gpu"]).condition == ("False", "Quarantined")
    assert NodeSnapshot.from_body({"metadata": {"name": "gpu-2"}}).condition is None


def _observe(n: NodeFacts, **kw: Any) -> Observed:
    kw.setdefault("idle_since", NOW - 2 * HOUR)
    kw.setdefault("usage", PoolUsage(nodes=100))
    return Observed(node=n, **kw)


def _step(
    stage: NodePatchStage, writer: _Recorder, n: NodeFacts, d: Decision, now: dt.datetime
) -> NodeFacts:
    """Apply ``d`` through the stage; the node as the API would then hold it."""
    stage.apply(n, d.plan.steps, "7", Counter(), now=now)
    after = applied(n, d)
    for kind, body in writer.calls:
        if kind == "status":
            (cond,) = body["status"]["conditions"]
            after = dataclasses.replace(after, condition=(cond["status"], cond["reason"]))
    return after


def _screen(
    stage: NodePatchStage, writer: _Recorder, n: NodeFacts, verdict: Verdict, now: dt.datetime
) -> tuple[NodeFacts, list[str]]:
    """One screening from reservation to outcome: the node after it, and its Node writes."""
    p = policy()
    writer.calls.clear()
    d = decide(_observe(n), p, now)
    assert d.state == S.TESTING, d
    (test,) = [a for a in d.actions if isinstance(a, CreateTest)]
    n = _step(stage, writer, n, d, now)
    assert test.suite is not None
    done = sdctest(test.name, suite=test.suite, reason=test.reason, verdict=verdict)
    d = decide(_observe(n, test=done), p, now + HOUR)
    n = _step(stage, writer, n, d, now + HOUR)
    return n, [kind for kind, _ in writer.calls]


def test_a_clean_requalification_writes_no_condition() -> None:
    """Join: the node patches, and the condition once (absent to True). A certified
    node's re-screening keeps it True: its two node patches and nothing more."""
    writer = _Recorder(api=client.ApiClient(), metrics=Metrics())
    stage = NodePatchStage(writer)
    n, kinds = _screen(stage, writer, node(), Verdict.PASS, NOW)
    assert kinds == ["node", "node", "status"]
    assert n.condition == ("True", "Certified") and n.state == S.QUALIFIED
    first = writer.calls[-1][1]["status"]["conditions"][0]
    assert first["lastTransitionTime"] == keys.format_time(NOW + HOUR)

    later = NOW + 30 * 24 * HOUR  # past maxQualificationAge: re-screened
    n, kinds = _screen(stage, writer, n, Verdict.PASS, later)
    assert kinds == ["node", "node"], "a clean re-qualification writes no condition"
    assert n.condition == ("True", "Certified")


def test_a_failure_turns_the_condition_false_in_the_quarantines_decision() -> None:
    writer = _Recorder(api=client.ApiClient(), metrics=Metrics())
    stage = NodePatchStage(writer)
    n, _ = _screen(stage, writer, node(), Verdict.PASS, NOW)
    p = policy(confirmation={"reruns": 0})
    writer.calls.clear()
    later = NOW + 30 * 24 * HOUR
    d = decide(_observe(n), p, later)
    (test,) = [a for a in d.actions if isinstance(a, CreateTest)]
    n = _step(stage, writer, n, d, later)
    assert test.suite is not None
    failed = sdctest(
        test.name, suite=test.suite, reason=test.reason, verdict=Verdict.SDC, failed=("golden",)
    )
    d = decide(_observe(n, test=failed), p, later + HOUR)
    assert (d.event, d.state) == (Event.TEST_FAILED, S.QUARANTINED)
    writer.calls.clear()
    n = _step(stage, writer, n, d, later + HOUR)
    assert [k for k, _ in writer.calls] == ["node", "status"]
    (cond,) = writer.calls[1][1]["status"]["conditions"]
    assert (cond["status"], cond["reason"]) == ("False", "Quarantined")
    assert cond["lastTransitionTime"] == keys.format_time(later + HOUR)


def test_without_a_clock_the_stage_writes_no_condition() -> None:
    """Callers that write only bookkeeping (no decision) leave the condition alone."""
    writer = _Recorder(api=client.ApiClient(), metrics=Metrics())
    stage = NodePatchStage(writer)
    n = node(state=S.QUALIFIED)
    stage.apply(n, (SetLabel(S.QUARANTINED),), "7", Counter())
    assert [k for k, _ in writer.calls] == ["node"]


def test_a_decision_from_a_snapshot_older_than_the_condition_does_not_write_it_again() -> None:
    """The status write follows the node patch; a decision made before the watch brings
    the condition back must not write it again, nor move its lastTransitionTime."""
    writer = _Recorder(api=client.ApiClient(), metrics=Metrics())
    stage = NodePatchStage(writer)
    certified = node(state=S.QUALIFIED, qualified_at=NOW)
    certified = dataclasses.replace(certified, condition=("True", "Certified"))
    stage.apply(certified, (SetLabel(S.QUARANTINED),), "7", Counter(), now=NOW)
    assert [k for k, _ in writer.calls] == ["node", "status"]
    # Later, from a snapshot that still shows True: Quarantined -> Repairing.
    writer.calls.clear()
    stale = node(state=S.QUARANTINED)
    stale = dataclasses.replace(stale, condition=("True", "Certified"))
    stage.apply(stale, (SetLabel(S.REPAIRING),), "8", Counter(), now=NOW + HOUR)
    (cond,) = writer.calls[-1][1]["status"]["conditions"]
    assert cond["reason"] == "InRepair" and "lastTransitionTime" not in cond
