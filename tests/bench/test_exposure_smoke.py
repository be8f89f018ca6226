"""The exposure benchmark runs end to end on a tiny fleet in seconds and reports what
it says: per policy, exposure, faults never caught, screening node-hours and false
quarantines, from the operator's own budgets and order."""

from __future__ import annotations

import json
from pathlib import Path

from bench.exposure import run
from bench.exposure.sim import Model, Policy, simulate

from sdcguard.api import SDCPolicySpec

TINY = Model(nodes=120, days=20)


def test_a_tiny_run_writes_its_tables_and_plot(tmp_path: Path) -> None:
    assert run.main(["--nodes", "120", "--days", "20", "--quick", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "exposure.json").read_text())
    names = [row["policy"] for row in doc["policies"]]
    assert names == ["defaults", "defaults, risk order"]
    for row in doc["policies"]:
        assert row["faults"] >= row["never_caught"] >= 0
        assert 0 <= row["exposure_p50_h"] <= row["exposure_p95_h"]
        assert row["screening_node_hours"] > 0 and row["false_quarantines"] >= 0
    assert set(doc["risk_vs_today"]) >= {"mean_ratio", "p95_ratio", "node_hours_ratio", "met"}
    assert (tmp_path / "exposure.png").stat().st_size > 0
    assert "| defaults |" in (tmp_path / "exposure.md").read_text()


def test_the_budget_caps_screening_and_a_wider_one_screens_more() -> None:
    spec = SDCPolicySpec()
    narrow = simulate(TINY, Policy("narrow", spec), 3)
    wide_spec = spec.model_copy(
        update={"budgets": spec.budgets.model_copy(update={"max_concurrent_tests": 8})}
    )
    wide = simulate(TINY, Policy("wide", wide_spec), 3)
    # maxConcurrentTests 2 at the probe's budget caps screenings per hour.
    screen_h = (spec.probe.budget_seconds + TINY.screen_overhead_s) / 3600
    assert narrow.screening_hours <= 2 * TINY.days * 24 + screen_h * 2
    assert wide.screenings > narrow.screenings


def test_without_return_from_use_or_expiry_nothing_routine_is_screened() -> None:
    spec = SDCPolicySpec()
    off = spec.model_copy(
        update={
            "triggers": spec.triggers.model_copy(
                update={
                    "max_qualification_age": "0",
                    "on_return_from_use": spec.triggers.on_return_from_use.model_copy(
                        update={"enabled": False}
                    ),
                }
            )
        }
    )
    outcome = simulate(TINY, Policy("off", off, library=False), 5)
    # Only verifications of repairs (after quarantines) remain: none without a catch.
    assert outcome.quarantines == 0 and outcome.screenings == 0
    assert all(e.quarantined is None for e in outcome.episodes)
