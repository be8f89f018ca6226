"""The guard in real DDP trainings: gloo process groups of spawned CPU ranks, a small
MLP, faults injected on one rank by the probe's injector.

All scenarios of one world size run in one spawn (torch imports once per rank);
each test then asserts on its scenario's results.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from bench.training.harness import Trial, run_trials

FWD = {"site": "matmul", "rate": 0.01, "onset_step": 2, "seed": 3}
BWD = {"site": "grad.weight", "rate": 0.01, "onset_step": 2, "seed": 4}
AUDIT_EVERY_STEP = {"consensus_every": 4, "audit_every": 1}
CONSENSUS_ONLY = {"consensus_every": 2, "audit_every": 1000, "first_audit_step": 1000}


def one_shot(site: str, step: int = 3) -> dict[str, Any]:
    return {"site": site, "rate": 0.01, "onset_step": step, "end_step": step, "seed": 5}


THREE = [
    Trial("healthy", steps=10, config={"consensus_every": 3, "audit_every": 2}),
    Trial("forward", steps=14, fault=FWD, config=AUDIT_EVERY_STEP),
    Trial(
        "backward-transient",
        steps=14,
        fault=BWD,
        first_pass_only=True,
        baseline=True,
        config=AUDIT_EVERY_STEP,
    ),
    Trial("at-rest", steps=8, fault=one_shot("param"), config=CONSENSUS_ONLY),
    Trial("optimizer", steps=8, fault=one_shot("optimizer"), config=CONSENSUS_ONLY),
    Trial("receive", steps=8, fault=one_shot("allreduce"), config=CONSENSUS_ONLY, baseline=True),
    Trial(
        "nondeterministic",
        steps=6,
        deterministic=False,
        fault=one_shot("param", 2),
        config={"consensus_every": 3, "audit_every": 1},
    ),
    Trial(
        "mixed-versions",
        steps=6,
        fault=one_shot("param", 2),
        fingerprint_override={2: {"torch": "2.8.0"}},
        config={"consensus_every": 3},
    ),
    Trial("dropout", steps=8, dropout=0.2, config={"consensus_every": 4, "audit_every": 1}),
    Trial(
        "nodes",
        steps=10,
        fault=FWD,
        config=AUDIT_EVERY_STEP,
        env={
            0: {"NODE_NAME": "gpu-a", "POD_NAME": "train-0"},
            1: {"NODE_NAME": "gpu-b", "POD_NAME": "train-1", "SDCGUARD_GPU_UUID": "GPU-0000-bbbb"},
            2: {"NODE_NAME": "gpu-c", "POD_NAME": "train-2"},
        },
    ),
]
NODES = {
    0: {"NODE_NAME": "gpu-a", "POD_NAME": "train-0"},
    1: {"NODE_NAME": "gpu-b", "POD_NAME": "train-1", "SDCGUARD_GPU_UUID": "GPU-0000-bbbb"},
    2: {"NODE_NAME": "gpu-c", "POD_NAME": "train-2"},
}
THREE += [
    Trial(
        "head-set",
        steps=6,
        fault={**one_shot("param", 3), "rate": 0.2},
        head_replica_set=True,
        config={**CONSENSUS_ONLY, "repair_replicas": False},
    ),
    Trial("budget", steps=40, env=NODES, config={"audit_budget": 0.05}),
    Trial(
        "budget-watched",
        steps=40,
        env=NODES,
        config={"audit_budget": 0.05, "watch_nodes": ["gpu-b"]},
    ),
]
# Gradient accumulation: three micro-batches per optimizer step, the first two under
# DDP's no_sync, as a DDP loop accumulates.
THREE += [
    Trial("accumulate-healthy", steps=8, micro_batches=3, config=AUDIT_EVERY_STEP),
    Trial("accumulate-unguarded", steps=8, micro_batches=3, guard=False),
    Trial("accumulate-forward", steps=10, micro_batches=3, fault=FWD, config=AUDIT_EVERY_STEP),
    Trial(
        "accumulate-backward-transient",
        steps=10,
        micro_batches=3,
        fault=BWD,
        first_pass_only=True,
        config=AUDIT_EVERY_STEP,
    ),
    Trial(
        "accumulate-at-rest",
        steps=8,
        micro_batches=2,
        fault=one_shot("param"),
        config=CONSENSUS_ONLY,
    ),
    Trial("grads-held", steps=4, set_to_none=False, config=AUDIT_EVERY_STEP),
]
TWO = [
    Trial("forward", steps=14, fault=FWD, config=AUDIT_EVERY_STEP),
    Trial("at-rest", steps=8, fault=one_shot("param"), config=CONSENSUS_ONLY),
]


@pytest.fixture(scope="module")
def three() -> dict[str, list[dict[str, Any]]]:
    return {t.name: r for t, r in zip(THREE, run_trials(THREE, world=3), strict=True)}


@pytest.fixture(scope="module")
def two() -> dict[str, list[dict[str, Any]]]:
    return {t.name: r for t, r in zip(TWO, run_trials(TWO, world=2), strict=True)}


def same_on_every_rank(ranks: list[dict[str, Any]], key: str) -> Any:
    values = [json.dumps(r[key], sort_keys=True) for r in ranks]
    assert len(set(values)) == 1, f"ranks disagree on {key}: {values}"
    return ranks[0][key]


def test_healthy_training_raises_nothing_and_replicas_stay_identical(three) -> None:
    ranks = three["healthy"]
    assert same_on_every_rank(ranks, "detections") == []
    assert ranks[0]["refused"] == {}
    assert ranks[0]["audits"] >= 3
    same_on_every_rank(ranks, "final_digest")


def test_forward_fault_is_blamed_on_the_gpu_that_computed_it(three) -> None:
    ranks = three["forward"]
    found = same_on_every_rank(ranks, "detections")
    assert found, "no detection"
    assert {d["rank"] for d in found} == {1}
    assert found[0]["method"] == "ShadowAudit"
    assert found[0]["confirmation"] == "Persistent"  # its re-run was wrong again
    assert ranks[0]["stop_step"] == found[0]["step"]  # default on persistent: stop


def test_transient_backward_fault_skips_the_step_and_baseline_sees_nothing(three) -> None:
    ranks = three["backward-transient"]
    found = same_on_every_rank(ranks, "detections")
    assert found and {d["rank"] for d in found} == {1}
    assert {d["confirmation"] for d in found} == {"Transient"}
    assert ranks[0]["stop_step"] is None
    assert ranks[0]["skipped"] == len(found)
    # Every replica receives the same wrong sum: a digest after reduction is blind.
    assert ranks[0]["baseline"] == []
    same_on_every_rank(ranks, "final_digest")


@pytest.mark.parametrize("scenario", ["at-rest", "optimizer", "receive"])
def test_consensus_names_the_odd_replica_and_repairs_it(three, scenario: str) -> None:
    ranks = three[scenario]
    found = same_on_every_rank(ranks, "detections")
    assert [(d["step"], d["rank"], d["method"]) for d in found] == [(3, 1, "ReplicaConsensus")]
    assert "state diverged" in found[0]["detail"]
    same_on_every_rank(ranks, "final_digest")  # repaired from the majority


def test_receive_side_fault_is_also_seen_by_the_baseline(three) -> None:
    assert [b["rank"] for b in three["receive"][0]["baseline"]] == [1]


def test_nondeterministic_kernels_refuse_the_audit_and_say_why(three) -> None:
    ranks = three["nondeterministic"]
    assert "deterministic algorithms are off" in ranks[0]["refused"]["audit"]
    assert "consensus" not in ranks[0]["refused"]
    assert ranks[0]["audits"] == 0
    # Consensus still holds replicas to bitwise identity.
    assert [d["method"] for d in same_on_every_rank(ranks, "detections")] == ["ReplicaConsensus"]


def test_mixed_software_versions_refuse_every_judgement(three) -> None:
    ranks = three["mixed-versions"]
    assert "different torch (2.8.0, " in ranks[0]["refused"]["consensus"]
    assert "audit" in ranks[0]["refused"]
    assert same_on_every_rank(ranks, "detections") == []
    assert ranks[1]["fault_hits"] > 0  # there was something to find: it refused to judge


def test_dropout_is_replayed_with_the_targets_random_state(three) -> None:
    ranks = three["dropout"]
    assert ranks[0]["audits"] >= 5
    assert same_on_every_rank(ranks, "detections") == []


def test_detection_names_node_and_gpu_of_the_faulty_rank(three) -> None:
    found = same_on_every_rank(three["nodes"], "detections")
    assert found and found[0]["node"] == "gpu-b"
    assert "GPU-0000-bbbb" in found[0]["detail"]


def test_two_replicas_attribute_an_audit_by_self_inconsistency(two) -> None:
    found = same_on_every_rank(two["forward"], "detections")
    assert found and {d["rank"] for d in found} == {1}


def test_two_replicas_that_disagree_stop_without_blaming(two) -> None:
    ranks = two["at-rest"]
    assert same_on_every_rank(ranks, "detections") == []
    assert ranks[0]["stop_step"] == 3
    assert any("no strict majority" in n for n in ranks[0]["notes"])


def test_a_node_reported_before_is_audited_more_often(three) -> None:
    # The interval follows measured costs, which vary with the machine's load; the
    # planned share of step time is the rule itself: four times the budget.
    plain, watched = three["budget"][0], three["budget-watched"][0]
    assert plain["audit_share"] == 0.05
    assert watched["audit_share"] == 0.05 * 4
    assert plain["audits"] >= 1
    assert watched["audits"] > plain["audits"], (plain["audits"], watched["audits"])


def test_an_extra_replica_set_is_checked_in_its_own_group(three) -> None:
    found = same_on_every_rank(three["head-set"], "detections")
    # Not repaired, so both sets see rank 1's corrupted output layer.
    assert {(d["replica_set"], d["rank"]) for d in found} == {
        ("data-parallel", 1),
        ("head", 1),
    }


def test_accumulated_micro_batches_are_audited_without_false_alarms(three) -> None:
    ranks = three["accumulate-healthy"]
    assert same_on_every_rank(ranks, "detections") == []
    assert ranks[0]["refused"] == {} and ranks[0]["notes"] == []
    assert ranks[0]["audits"] == 7  # every step after the warm-up one
    # Audited steps train exactly as plain DDP accumulation does, bit for bit.
    assert same_on_every_rank(ranks, "final_digest") == same_on_every_rank(
        three["accumulate-unguarded"], "final_digest"
    )


def test_accumulation_blames_the_gpu_that_computed_a_wrong_micro_batch(three) -> None:
    ranks = three["accumulate-forward"]
    found = same_on_every_rank(ranks, "detections")
    assert found and {d["rank"] for d in found} == {1}
    assert found[0]["method"] == "ShadowAudit" and found[0]["confirmation"] == "Persistent"
    assert ranks[0]["stop_step"] == found[0]["step"]


def test_accumulation_skips_a_step_with_a_transient_wrong_gradient(three) -> None:
    ranks = three["accumulate-backward-transient"]
    found = same_on_every_rank(ranks, "detections")
    assert found and {d["rank"] for d in found} == {1}
    assert {d["confirmation"] for d in found} == {"Transient"}
    assert ranks[0]["skipped"] == len(found) and ranks[0]["stop_step"] is None
    same_on_every_rank(ranks, "final_digest")


def test_consensus_works_under_accumulation(three) -> None:
    found = same_on_every_rank(three["accumulate-at-rest"], "detections")
    assert [(d["step"], d["rank"], d["method"]) for d in found] == [(3, 1, "ReplicaConsensus")]
    same_on_every_rank(three["accumulate-at-rest"], "final_digest")


def test_gradients_held_from_before_the_step_skip_the_audit_and_say_why(three) -> None:
    ranks = three["grads-held"]
    assert ranks[0]["audits"] == 0
    assert same_on_every_rank(ranks, "detections") == []
    assert "call optimizer.zero_grad(set_to_none=True)" in ranks[0]["notes"][0]
