"""Seeds per screening: the operator's choice, a person's pin, and where they show."""

from __future__ import annotations

import datetime as dt

import pytest
from pydantic import ValidationError

from sdcguard.api.sdctest import SDCTestSpec
from sdcguard.builders.probe_job import ProbeJobRequest, probe_args
from sdcguard.cli.commands import history_entries, seeds_passed
from sdcguard.domain.seeds import MAX_SEED, daily_seed, screening_seed

DAY = dt.datetime(2026, 3, 4, 0, 0, 1, tzinfo=dt.UTC)


def test_one_seed_per_utc_day_and_a_new_one_every_day() -> None:
    late = DAY + dt.timedelta(hours=23, minutes=59)
    assert daily_seed(DAY) == daily_seed(late)  # the day's quorum shares one baseline
    days = {daily_seed(DAY + dt.timedelta(days=d)) for d in range(30)}
    assert len(days) == 30 and all(0 <= s <= MAX_SEED for s in days)
    assert daily_seed(DAY.replace(tzinfo=None)) == daily_seed(DAY)  # naive means UTC


def test_pinned_seed_wins_and_the_choice_is_repeatable() -> None:
    assert screening_seed(7, DAY, "n1-1") == 7
    assert screening_seed(None, DAY, "n1-1") == daily_seed(DAY)
    # No creation time known: derived from the name, so a rebuilt Job gets the same seed.
    assert screening_seed(None, None, "n1-1") == screening_seed(None, None, "n1-1")
    assert screening_seed(None, None, "n1-1") != screening_seed(None, None, "n1-2")


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
        accelerator_resource=None,
        accelerator_count=0,
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
        "spec": {"nodeName": "n1", "suite": "requalification", "reason": "Expiry"},
        "status": status,
    }


def test_history_shows_seeds_and_the_seeds_passed() -> None:
    tests = [
        _test("n1-3", "Pass", 30, "2026-03-06T00:00:00Z"),
        _test("n1-1", "Pass", 10, "2026-03-04T00:00:00Z"),
        _test("n1-2", "SDC", 20, "2026-03-05T00:00:00Z"),
        _test("n1-4", "Pass", 10, "2026-03-07T00:00:00Z"),
        _test("n1-5", "Pass", None, "2026-03-08T00:00:00Z"),
    ]
    assert seeds_passed(tests) == [10, 30]
    entries = history_entries(tests, [], [])
    assert [e["seed"] for e in entries] == [10, 20, 30, 10, None]
    assert "seed 20" in entries[1]["detail"]


def test_the_day_scheme_gives_a_quorum_a_shared_seed_and_a_node_new_data_each_day() -> None:
    """What the scheme is chosen for (domain/seeds.py): every screening of the fleet on
    one day shares the seed (so `quorum` nodes can agree on a baseline for it, and a
    same-day confirmation repeats the failing data), and a node screened on n days has
    been checked on n different seeds (a rotating set would stop growing)."""
    created = [DAY + dt.timedelta(minutes=7 * i) for i in range(200)]  # one day of a fleet
    fleet_day = {screening_seed(None, t, f"n{i}-1") for i, t in enumerate(created)}
    assert len(fleet_day) == 1
    failed, confirm = DAY + dt.timedelta(hours=3), DAY + dt.timedelta(hours=3, minutes=20)
    assert screening_seed(None, failed, "n1-4") == screening_seed(None, confirm, "n1-5")
    weekly = [screening_seed(None, DAY + dt.timedelta(days=7 * w), "n1-x") for w in range(104)]
    assert len(set(weekly)) == 104  # two years of weekly screenings: 104 data sets
    # The limit, as documented: a confirmation created after midnight draws the next seed.
    late = DAY + dt.timedelta(hours=23, minutes=59)
    assert screening_seed(None, late, "n1-6") != screening_seed(
        None, late + dt.timedelta(minutes=2), "n1-7"
    )
