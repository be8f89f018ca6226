"""Megatron-Core rerun tracker files and exit codes 16/17 become reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from sdctrain.__main__ import main
from sdctrain.identity import RankInfo
from sdctrain.megatron import detections_from_tracker

ME = RankInfo(rank=0, node="gpu-3", pod="gpt-1", namespace="team-a", job="gpt")
TRACKER = """\
ts=2026-03-01 10:00:00.1 node=gpt-1 device=2 jobID=N/A rank=5 iteration=120 status=first_rerun_reproducible result=nan message='loss is NaN'
ts=2026-03-01 10:01:00.1 node=gpt-1 device=1 jobID=N/A rank=4 iteration=130 status=RerunValidationStatus.FIRST_RERUN_NOT_REPRODUCIBLE result=1e9 message='Spiky loss'
ts=2026-03-01 10:02:00.1 node=gpt-0 device=0 jobID=N/A rank=0 iteration=120 status=first_rerun_reproducible result=nan message='loss is NaN'
ts=2026-03-01 10:03:00.1 node=gpt-1 device=2 jobID=N/A rank=5 iteration=140 status=rerun_disabled result=nan message='loss is NaN'
ts=2026-03-01 10:04:00.1 node=gpt-1 device=2 jobID=N/A rank=5 iteration=150 status=second_rerun_reproducible result=nan message='x'
garbage line
"""  # noqa: E501


def test_exit_16_reports_this_pods_reproducible_and_transient_lines() -> None:
    found = detections_from_tracker(16, TRACKER, ME, hostname="gpt-1")
    got = {(d.rank, d.step, str(d.confirmation)) for d in found}
    assert got == {(5, 120, "Unconfirmed"), (4, 130, "Transient")}
    assert all(d.node == "gpu-3" and d.pod == "gpt-1" for d in found)
    assert all(str(d.method) == "MegatronRerun" for d in found)
    assert "loss is NaN" in next(d.detail for d in found if d.rank == 5)


def test_exit_17_reports_only_what_the_same_gpu_contradicted() -> None:
    found = detections_from_tracker(17, TRACKER, ME, hostname="gpt-1")
    assert [(d.rank, str(d.confirmation)) for d in found] == [(4, "Transient")]


@pytest.mark.parametrize("code", [0, 1, 137])
def test_other_exit_codes_report_nothing(code: int) -> None:
    assert detections_from_tracker(code, TRACKER, ME, hostname="gpt-1") == []


def test_cli_keeps_the_exit_code_and_prints_in_dry_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tracker = tmp_path / "tracker.log"
    tracker.write_text(TRACKER)
    for key, value in {
        "NODE_NAME": "gpu-3",
        "POD_NAME": "gpt-1",
        "POD_NAMESPACE": "team-a",
        "JOB_NAME": "gpt",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr("socket.gethostname", lambda: "gpt-1")
    code = main(["megatron-report", "--exit-code", "16", "--tracker", str(tracker), "--dry-run"])
    assert code == 16
    out = capsys.readouterr().out
    assert "'method': 'MegatronRerun'" in out and "'nodeName': 'gpu-3'" in out
