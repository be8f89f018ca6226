"""The scale benchmark's restarts: several restarts combine into one result whose
timings are the median and the maximum, and whose checks hold over every restart."""

from __future__ import annotations

from typing import Any

import pytest
from bench.scale.report import _spread
from bench.scale.restart import combine_rounds
from bench.scale.run import _restart_targets


def _round(
    first: float | None,
    *,
    lost: list[str] | None = None,
    other: int = 0,
    copy_off: bool = False,
    faults: dict[str, int] | None = None,
) -> dict[str, Any]:
    return {
        "joiners": 20,
        "sdc_joiners": 5,
        "reserved_before_kill": 20,
        "faults_injected": faults or {"500": 10, "watch-cut": 4},
        "settled": not lost,
        "lost_reservations": lost or [],
        "resume_s": 2.0,
        "first_fleet_write_s": 10.0,
        "mirrors_synced_s": 12.0,
        "probes_synced_s": 11.0,
        "writes_before_probe_copy": 0,
        "writes_before_pod_copy": {
            "in_flight": 3,
            "other_nodes": other,
            "other_node_names": [f"gpu-{i}" for i in range(other)],
            "unattributed": {"create sdchardwares": 1},
        },
        "copy_against_list": {
            "nodes": {"mirror": 5000, "list": 5001 if copy_off else 5000, "mirror_at_sync": 5000},
        },
        "process_restarts": [],
        "first_quarantine_after_restart_s": first,
        "sdctests_created_per_joiner": {"clean_max": 1, "sdc_max": 2},
        "writes_per_clean_joiner_max": 6,
        "refused_creates_after_restart": 1,
    }


def test_timings_are_the_median_and_the_maximum_and_the_checks_hold_over_all() -> None:
    rounds = [_round(16.0), _round(12.5), _round(13.1, faults={"429": 3, "watch-cut": 9})]
    out = combine_rounds(rounds)
    assert out["restarts"] == 3 and len(out["rounds"]) == 3
    assert out["first_quarantine_after_restart_s"] == 13.1
    assert out["first_quarantine_after_restart_s_max"] == 16.0
    assert out["mirrors_synced_s"] == 12.0 and out["mirrors_synced_s_max"] == 12.0
    assert out["faults_injected"] == {"500": 20, "watch-cut": 17, "429": 3}
    assert out["joiners"] == 60 and out["reserved_before_kill"] == 60
    assert out["writes_before_pod_copy"]["in_flight"] == 9
    assert out["writes_before_pod_copy"]["unattributed"] == {"create sdchardwares": 3}
    assert out["refused_creates_after_restart"] == 3 and out["settled"]
    targets = _restart_targets({"restart": out})
    assert targets["restart_first_quarantine_under_60s"] == {"value": 16.0, "met": True}
    assert all(t["met"] for t in targets.values()), targets
    assert _spread(out, "first_quarantine_after_restart_s") == "13.1 s (max 16.0 s, n=3)"


@pytest.mark.parametrize(
    ("bad", "target"),
    [
        (_round(None), "restart_first_quarantine_under_60s"),
        (_round(61.0), "restart_first_quarantine_under_60s"),
        (_round(9.0, lost=["gpu-7"]), "restart_no_lost_reservation"),
        (_round(9.0, other=2), "restart_no_action_on_a_partial_copy"),
        (_round(9.0, copy_off=True), "restart_copy_matches_a_list"),
    ],
)
def test_one_bad_restart_among_good_ones_fails_its_target(bad: dict[str, Any], target: str) -> None:
    out = combine_rounds([_round(10.0), bad, _round(11.0)])
    met = _restart_targets({"restart": out})[target]
    assert met["met"] is False, met


def test_one_restart_reads_as_before() -> None:
    out = combine_rounds([_round(7.5)])
    assert out["first_quarantine_after_restart_s"] == 7.5
    assert _spread(out, "first_quarantine_after_restart_s") == "7.500 s"
    # A run from before the restarts were repeated has no "restarts" and no maxima.
    old = {k: v for k, v in _round(7.5).items()}
    assert _spread(old, "first_quarantine_after_restart_s") == "7.500 s"
    assert _restart_targets({"restart": old})["restart_first_quarantine_under_60s"]["met"]


def test_no_restarts_is_an_error() -> None:
    with pytest.raises(ValueError):
        combine_rounds([])
