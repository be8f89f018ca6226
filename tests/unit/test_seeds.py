"""Seeds per screening: the operator's choice, a person's pin, and where they show."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest
from pydantic import ValidationError

from sdcguard.adapters.pass_state import FleetView, TestSnapshot
from sdcguard.adapters.test_runner import _data_seed_of, _seed_of
from sdcguard.api.sdctest import SDCTest, SDCTestSpec
from sdcguard.builders.probe_job import ProbeJobRequest, probe_args
from sdcguard.cli.commands import history_entries, node_seeds_passed, seeds_passed
from sdcguard.domain import keys
from sdcguard.domain.actions import MarkQualified
from sdcguard.domain.nodepatch import plan_node_patch
from sdcguard.domain.observed import NodeFacts
from sdcguard.domain.retention import History, RetentionLimits, TestRecord, plan_retention
from sdcguard.domain.seeds import BASELINE_SEED, MAX_SEED, data_seed, screening_seed

DAY = dt.datetime(2026, 3, 4, 0, 0, 1, tzinfo=dt.UTC)


def test_one_fixed_baseline_seed_unless_pinned() -> None:
    assert 0 <= BASELINE_SEED <= MAX_SEED
    assert screening_seed(None) == BASELINE_SEED
    assert screening_seed(7) == 7


def test_spec_seed_is_bounded() -> None:
    base = {"nodeName": "n1", "policyRef": "p"}
    assert SDCTestSpec.model_validate({**base, "seed": 12}).seed == 12
    for bad in (-1, MAX_SEED + 1, "x"):
        with pytest.raises(ValidationError):
            SDCTestSpec.model_validate({**base, "seed": bad})


def test_job_args_carry_the_seed_and_the_deadline() -> None:
    req = ProbeJobRequest(
        test_name="n1-3",
        test_uid="u",
        node_name="n1",
        namespace="sdcguard-system",
        image="img",
        checks=("compute", "golden"),
        budget_seconds=60,
        active_deadline_seconds=600,
        ttl_seconds_after_finished=60,
        accelerators=(),
        tolerated_taint_keys=(),
        seed=12345,
    )
    args = probe_args(req)
    assert args[args.index("--seed") + 1] == "12345"
    assert args[args.index("--deadline") + 1] == "600"
    assert args[args.index("--budget") + 1] == "60"


def _test(name: str, verdict: str | None, seed: int | None, done: str) -> dict[str, object]:
    status: dict[str, object] = {"phase": "Passed" if verdict == "Pass" else "Failed",
                                 "completionTime": done}  # fmt: skip
    if verdict:
        status["verdict"] = verdict
    if seed is not None:
        status["seed"] = seed
    return {
        "metadata": {"name": name, "creationTimestamp": done},
        "spec": {
            "nodeName": "n1",
            "policyRef": "p",
            "suite": "requalification",
            "reason": "Expiry",
        },
        "status": status,
    }


def _decoded(tests: list[dict[str, object]]) -> list[SDCTest]:
    return [SDCTest.model_validate(t) for t in tests]  # as the CLI decodes what it reads


def test_history_shows_seeds_and_the_seeds_passed() -> None:
    tests = [
        _test("n1-3", "Pass", 30, "2026-03-06T00:00:00Z"),
        _test("n1-1", "Pass", 10, "2026-03-04T00:00:00Z"),
        _test("n1-2", "SDC", 20, "2026-03-05T00:00:00Z"),
        _test("n1-4", "Pass", 10, "2026-03-07T00:00:00Z"),
        _test("n1-5", "Pass", None, "2026-03-08T00:00:00Z"),
    ]
    assert seeds_passed(_decoded(tests)) == [10, 30]
    entries = history_entries(_decoded(tests), [], [])
    assert [e["seed"] for e in entries] == [10, 20, 30, 10, None]
    assert "seed 20" in entries[1]["detail"]


def test_the_baseline_seed_is_shared_and_data_seeds_grow_per_screening() -> None:
    """What the scheme is chosen for (domain/seeds.py): every screening of the fleet,
    on any day, shares the baseline seed (so a fingerprint's baseline, once
    established, stays comparable), and a node screened n times has been checked on n
    data seeds (its own rounds; a confirmation repeats the failing one)."""
    created = [DAY + dt.timedelta(days=7 * w) for w in range(104)]  # two years, weekly
    tests = [
        SDCTest.model_validate(
            {
                "metadata": {"name": f"n1-{w}", "uid": f"uid-{w}", "creationTimestamp": t},
                "spec": {"nodeName": "n1", "policyRef": "p", "reason": "Expiry"},
            }
        )
        for w, t in enumerate(created)
    ]
    assert {_seed_of(t) for t in tests} == {BASELINE_SEED}
    view = FleetView(nodes={}, tests={})
    assert len({_data_seed_of(t, view) for t in tests}) == 104  # 104 data sets


def test_a_new_data_seed_per_screening_unless_pinned_or_confirming() -> None:
    fleet_day = {data_seed(None, None, f"uid-{i}", f"n{i}-1") for i in range(200)}
    assert len(fleet_day) == 200 and all(0 <= s <= MAX_SEED for s in fleet_day)
    # The same test (a rebuilt Job) gets the same data seed; another test of the node a new one.
    assert data_seed(None, None, "u1", "n1-4") == data_seed(None, None, "u1", "n1-4")
    assert data_seed(None, None, "u1", "n1-4") != data_seed(None, None, "u2", "n1-5")
    assert data_seed(None, None, "u1", "n1-4", confirmed=77) == 77  # a confirmation repeats it
    assert data_seed(5, 3, "u1", "n1-4", confirmed=77) == 5  # a pinned data seed wins
    assert data_seed(None, 3, "u1", "n1-4", confirmed=77) == 3  # a pinned seed pins all data


def test_spec_data_seed_is_bounded_and_reaches_the_job() -> None:
    base = {"nodeName": "n1", "policyRef": "p"}
    assert SDCTestSpec.model_validate({**base, "dataSeed": 12}).data_seed == 12
    for bad in (-1, MAX_SEED + 1, "x"):
        with pytest.raises(ValidationError):
            SDCTestSpec.model_validate({**base, "dataSeed": bad})
    req = ProbeJobRequest(
        test_name="n1-3",
        test_uid="u",
        node_name="n1",
        namespace="sdcguard-system",
        image="img",
        checks=("compute",),
        budget_seconds=60,
        active_deadline_seconds=600,
        ttl_seconds_after_finished=60,
        accelerators=(),
        tolerated_taint_keys=(),
        seed=1,
        data_seed=999,
    )
    args = probe_args(req)
    assert args[args.index("--seed") + 1] == "1"
    assert args[args.index("--data-seed") + 1] == "999"


def _snapshot(name: str, verdict: str, data: int, created: str, node: str = "n1") -> TestSnapshot:
    return TestSnapshot.from_body(
        {
            "metadata": {"name": name, "uid": f"uid-{name}", "creationTimestamp": created},
            "spec": {"nodeName": node, "policyRef": "p", "reason": "Expiry"},
            "status": {
                "phase": "Failed" if verdict == "SDC" else "Passed",
                "verdict": verdict,
                "seed": 1,
                "dataSeed": data,
                "completionTime": created,
            },
        }
    )


def test_a_confirmation_repeats_the_failed_screenings_data() -> None:
    """The operator's choice (adapters.test_runner): a Confirmation test's data seed is
    that of the node's newest earlier test; any other test gets its own."""
    view = FleetView(
        nodes={},
        tests={
            "n1": [
                _snapshot("n1-1", "SDC", 111, "2026-03-04T01:00:00Z"),
                _snapshot("n1-2", "Pass", 222, "2026-03-04T02:00:00Z"),
                _snapshot("n1-3", "SDC", 333, "2026-03-04T03:00:00Z"),
            ]
        },
    )

    def test(name: str, reason: str, created: dt.datetime) -> SDCTest:
        return SDCTest.model_validate(
            {
                "metadata": {"name": name, "uid": f"uid-{name}", "creationTimestamp": created},
                "spec": {"nodeName": "n1", "policyRef": "p", "reason": reason},
            }
        )

    later = DAY + dt.timedelta(hours=4)
    assert _data_seed_of(test("n1-4", "Confirmation", later), view) == 333
    before = DAY + dt.timedelta(hours=2, minutes=30)  # n1-3 came later: the newest is n1-2
    assert _data_seed_of(test("n1-4", "Confirmation", before), view) == 222
    # The view may predate the verdict of the test confirmed (one pass judges it and
    # starts the confirmation): still running there, its data seed is repeated.
    running = _snapshot("n1-5", "SDC", 555, "2026-03-04T05:00:00Z")
    body = running.known
    assert body is not None
    still = TestSnapshot(
        running.name,
        known=body.__class__(
            name=body.name,
            policy=body.policy,
            created=body.created,
            facts=dataclasses.replace(body.facts, verdict=None),
            running=None,
        ),
    )
    stale = FleetView(nodes={}, tests={"n1": [*view.tests["n1"], still]})
    assert _data_seed_of(test("n1-6", "Confirmation", DAY + dt.timedelta(hours=6)), stale) == 555
    own = _data_seed_of(test("n1-4", "Expiry", later), view)
    assert own == data_seed(None, None, "uid-n1-4", "n1-4") and own not in (111, 222, 333)


def test_history_lists_the_data_seeds_passed() -> None:
    tests = [_test("n1-1", "Pass", 10, "2026-03-04T00:00:00Z"),
             _test("n1-2", "Pass", 10, "2026-03-05T00:00:00Z")]  # fmt: skip
    tests[0]["status"]["dataSeed"] = 501  # type: ignore[index]
    tests[1]["status"]["dataSeed"] = 502  # type: ignore[index]
    assert seeds_passed(_decoded(tests)) == [10]
    assert seeds_passed(_decoded(tests), "dataSeed") == [501, 502]
    entries = history_entries(_decoded(tests), [], [])
    assert [e["dataSeed"] for e in entries] == [501, 502]
    assert "seed 10, data seed 501" in entries[0]["detail"]


def test_the_seeds_passed_outlive_the_tests_retention_deletes() -> None:
    """Forty weekly passes: the operator's node patch keeps their seeds on the Node;
    retention then deletes all but the newest tests, and `kubectl sdc history` still
    counts every pass and lists the seeds (the newest data seeds past the bound)."""
    node = NodeFacts("n1")
    tests: list[dict[str, Any]] = []
    for w in range(40):
        done = DAY + dt.timedelta(days=7 * w)
        body = _test(f"n1-{w}", "Pass", BASELINE_SEED, keys.format_time(done))
        body["status"]["dataSeed"] = 5000 + w  # type: ignore[index]
        tests.append(body)
        mark = MarkQualified(done, "ab" * 32, f"n1-{w}", BASELINE_SEED, 5000 + w)
        patch = plan_node_patch(node, [mark])
        merged = {**node.annotations, **patch.annotations}
        node = NodeFacts("n1", annotations={k: v for k, v in merged.items() if v is not None})
    records = tuple(
        TestRecord(t["metadata"]["name"], "n1", DAY + dt.timedelta(days=7 * w), passed=True)
        for w, t in enumerate(tests)
    )
    limits = RetentionLimits(tests_per_node=3, tests_age=dt.timedelta(days=1))
    history = History(tests=records, nodes={"n1": "ab" * 32})
    plan = plan_retention(history, limits, DAY + dt.timedelta(days=7 * 40))
    gone = {d.name for d in plan.deletions}
    kept = [t for t in tests if t["metadata"]["name"] not in gone]
    assert len(kept) == 3  # the prune happened
    passed, data, count = node_seeds_passed(_decoded(kept), node.annotations)
    assert count == 40 and passed == [BASELINE_SEED]
    assert data == list(range(5008, 5040))  # the newest 32, though 29 of their tests are gone
    # Without the record, only the kept tests would speak.
    assert node_seeds_passed(_decoded(kept), {})[2] == 3
