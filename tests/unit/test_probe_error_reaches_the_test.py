"""#45 item 4, end to end without a cluster: the real probe CLI refuses a param, and
what it leaves for the kubelet (its result file, or its log's tail) judges to an
Inconclusive test whose message carries the probe's own words."""

from __future__ import annotations

from pathlib import Path

import pytest

from sdcguard.api import Verdict
from sdcguard.domain.judging import PodEnd, judge_result
from sdcprobe.cli import main


def test_the_probes_refusal_of_a_param_is_the_tests_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result_file = tmp_path / "termination-log"
    argv = ["run", "--checks", "compute", "--result-file", str(result_file), "--sizee", "5"]
    exit_code = main(argv)
    assert exit_code == 2
    end = PodEnd(message=result_file.read_text(), exit_code=exit_code)
    j = judge_result(end, ["compute"], {})
    assert (j.verdict, j.reason) == (Verdict.INCONCLUSIVE, "ProbeError")
    assert "unrecognized arguments: --sizee 5" in j.message
    # Had the probe written nothing, the kubelet's log tail says the same.
    tail = capsys.readouterr().err
    j = judge_result(PodEnd(message=tail, exit_code=exit_code), ["compute"], {})
    assert (j.verdict, j.reason) == (Verdict.INCONCLUSIVE, "ProbeError")
    assert "unrecognized arguments: --sizee 5" in j.message
