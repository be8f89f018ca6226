"""Smoke test of the repeated-screenings benchmark: real checks, a handful of rounds."""

from __future__ import annotations

from pathlib import Path

from bench.detection.screenings import (
    Bench,
    Mode,
    data_dependent,
    intermittent,
    run_screenings,
    todays_rounds,
    write,
)

ROUNDS = {"compute": 3, "collective": 3, "memory": 5, "golden": 3}


def test_faults_active_in_every_round_are_caught_and_absent_ones_never() -> None:
    mode = Mode(budget=8, nodes=2, screenings=2)
    bench = Bench(mode, {"sdcguard": ROUNDS, "today": ROUNDS})
    try:
        for check in ("compute", "collective", "memory", "golden"):
            assert intermittent(bench, check, 1.0, "sdcguard") == [[True, True]] * 2, check
            assert intermittent(bench, check, 0.0, "today") == [[False, False]] * 2, check
        data = data_dependent(bench, "memory")
        # The fixed-seed probe feeds the same data every time: one outcome per node.
        assert all(len(set(c)) == 1 for c in data["today"]["caught"])
        assert 0.0 <= data["sdcguard"]["trigger_rate"] <= 1.0
    finally:
        bench.close()


def test_document_tables_and_plot(tmp_path: Path) -> None:
    assert todays_rounds(60) == {"compute": 388, "collective": 5, "memory": 5, "golden": 570}
    doc = run_screenings(
        Mode(budget=8, nodes=2, screenings=3), lambda _: None, ROUNDS, checks=("collective",)
    )
    kinds = [(r["check"], r["kind"]) for r in doc["profiles"]]
    assert kinds == [("collective", "intermittent")] * 3 + [("collective", "data-dependent")]
    for row in doc["profiles"]:
        for variant in ("sdcguard", "today"):
            det = row[variant]["detection"]
            assert det["1"] <= det["3"] <= det["10"]
    paths = write(doc, tmp_path)
    assert "| collective | intermittent p=0.1 |" in paths[1].read_text()
    assert paths[2].read_bytes()[:4] == b"\x89PNG"
