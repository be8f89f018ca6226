"""The probe end to end, as a Pod runs it: CPU replicas in separate processes.

Every run here uses a small budget (FAST, 8 s; a run fills its budget, so the
whole file takes about three minutes on two cores); the timing of full-size runs
lives in bench/probe.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from sdcprobe.result import parse_result
from tests.probe.conftest import FAST, CliRun, run_cli, write_faults

RUN = ["run", "--device", "cpu", *FAST]


def test_healthy_run_passes_reproducibly_and_replicas_agree(
    tmp_path: Path, matched_run: CliRun
) -> None:
    first = run_cli(RUN, tmp_path)
    # The second run is the shared one against a baseline a third process recorded:
    # the same digests, and every check matches that baseline.
    second = matched_run
    for run in (first, second):
        assert run.rc == 0, run.stderr[-3000:]
        doc = run.doc
        assert doc["verdict"] == "pass" and doc["fingerprint"]["device_count"] == 2
        for name in ("compute", "collective", "memory", "golden"):
            check = run.check(name)
            assert check["verdict"] == "pass" and "2 devices agree" in check["reason"]
            assert check["baseline"] == ("absent" if run is first else "match")
        assert run.termination is not None and len(run.termination.encode()) <= 4096
        assert parse_result(run.termination).verdict == "pass"
        assert doc["injection"] == {"enabled": False, "count": 0, "by_site": {}}
    assert "no baseline" in first.check("golden")["reason"]
    digests = [{n: c["digest"] for n, c in r.doc["checks"].items()} for r in (first, second)]
    assert digests[0] == digests[1]
    assert first.doc["fingerprint"] == second.doc["fingerprint"]
    # The CPU run measures something real: ABFT residuals of healthy GEMMs are reported.
    assert 0 < first.check("compute")["metrics"]["abft_ratio_float32"] < 1
    memory = first.check("memory")["metrics"]
    assert memory["bytes_tested"] == 64 << 20 and memory["flips"] == 0


def test_baseline_document_and_matching_run(
    tmp_path: Path, healthy_baseline: Path, matched_run: CliRun
) -> None:
    baseline = json.loads(healthy_baseline.read_text())
    assert baseline["kind"] == "sdcprobe.baseline" and baseline["schema_version"] == 1
    assert set(baseline["digests"]) == {"compute", "collective", "memory", "golden"}
    assert len(baseline["step_digests"]["golden"]) == 16  # the rounds every plan runs
    fp = run_cli(["fingerprint", "--device", "cpu", *FAST], tmp_path)
    assert fp.rc == 0 and json.loads(fp.stdout) == baseline["fingerprint"]
    assert matched_run.rc == 0, matched_run.stderr[-3000:]
    assert matched_run.check("golden")["baseline"] == "match"


def test_fault_spec_without_permission_is_refused(tmp_path: Path) -> None:
    spec = write_faults(tmp_path, {"site": "matmul", "rate": 1e-3})
    run = run_cli([*RUN, "--faults", spec], tmp_path)
    assert run.rc == 2
    assert "--allow-fault-injection" in run.stderr
    assert run.doc["verdict"] == "inconclusive" and "allow-fault-injection" in run.doc["reason"]
    assert run.termination is not None and "allow-fault-injection" in run.termination
    via_env = run_cli(RUN, tmp_path, env={"SDCPROBE_FAULTS": '{"faults": [{"site": "param"}]}'})
    assert via_env.rc == 2 and "SDCPROBE_FAULTS" in via_env.stderr


def test_invalid_fault_spec_and_bad_arguments_exit_2(tmp_path: Path) -> None:
    spec = write_faults(tmp_path, {"site": "attention.everything", "rate": 1e-3})
    run = run_cli([*RUN, "--faults", spec, "--allow-fault-injection"], tmp_path)
    assert run.rc == 2 and "faults.0.site" in run.stderr
    assert run_cli([*RUN, "--checks", "compute,vibes"], tmp_path).rc == 2
    assert run_cli([*RUN, "--budget", "-3"], tmp_path).rc == 2
    assert run_cli([*RUN, "--memory-fraction", "1.5"], tmp_path).rc == 2
    bad_baseline = tmp_path / "bad.json"
    bad_baseline.write_text('{"kind": "sdcprobe.baseline"')
    run = run_cli([*RUN, "--baseline", str(bad_baseline)], tmp_path)
    assert run.rc == 2 and "baseline" in run.doc["reason"]


def test_attention_output_mismatches_at_the_observed_rate(
    tmp_path: Path, healthy_baseline: Path
) -> None:
    # The worst node of the study: 2.89e-2 of attention output elements differ.
    spec = write_faults(
        tmp_path, {"site": "attention.output", "rate": 2.89e-2, "bits": "lo-mant", "mode": "flip"}
    )
    args = [*RUN, "--faults", spec, "--allow-fault-injection", "--baseline", str(healthy_baseline)]
    run = run_cli(args, tmp_path)
    assert run.rc == 1, run.stderr[-3000:]
    golden = run.check("golden")
    assert golden["verdict"] == "fail" and golden["baseline"] == "mismatch"
    assert golden["first_divergent_step"] == 0
    assert golden["first_divergent_submodule"] == "layers.0.attention.output"
    assert (
        run.doc["injection"]["enabled"] and run.doc["injection"]["by_site"]["attention.output"] > 0
    )
    assert run.check("compute")["verdict"] == "pass"  # the compute check has no attention


def test_rare_exponent_flips_in_ffn_down_are_caught(tmp_path: Path) -> None:
    spec = write_faults(
        tmp_path, {"site": "ffn.down", "rate": 1e-5, "bits": [26, 27], "mode": "flip"}
    )
    run = run_cli(
        [*RUN, "--checks", "golden", "--faults", spec, "--allow-fault-injection"], tmp_path
    )
    assert run.doc["injection"]["count"] > 0, "the fault must actually fire for this proof"
    assert run.rc == 1, run.stderr[-3000:]
    golden = run.check("golden")
    assert golden["verdict"] == "fail" and golden["first_divergent_submodule"].endswith("ffn.down")


def test_small_relative_errors_in_matmul_are_caught(tmp_path: Path) -> None:
    spec = write_faults(
        tmp_path, {"site": "matmul", "rate": 1e-3, "mode": "scale", "scale": [1e-5, 1e-3]}
    )
    run = run_cli([*RUN, "--faults", spec, "--allow-fault-injection"], tmp_path)
    assert run.rc == 1, run.stderr[-3000:]
    assert run.check("compute")["verdict"] == "fail"  # replay differs: the error is transient
    assert run.check("golden")["verdict"] == "fail"  # every GEMM of the model is hooked too
    assert run.check("collective")["verdict"] == "pass"
    assert "replay" in run.check("compute")["reason"]


def test_late_onset_is_located(tmp_path: Path) -> None:
    # Some nodes in the study were clean until late in training.
    steps = 24
    onset = steps * 3 // 4
    spec = write_faults(tmp_path, {"site": "ffn.up", "rate": 1e-2, "onset_step": onset})
    args = [
        *RUN,
        "--checks",
        "golden",
        "--steps",
        str(steps),
        "--faults",
        spec,
        "--allow-fault-injection",
    ]
    run = run_cli(args, tmp_path)
    assert run.rc == 1, run.stderr[-3000:]
    golden = run.check("golden")
    assert golden["first_divergent_step"] == onset
    assert golden["first_divergent_submodule"] == "layers.0.ffn.up"


def test_fault_on_one_device_names_it(tmp_path: Path) -> None:
    # The GPUs this container may use, by UUID, as the NVIDIA toolkit sets it.
    uuids = ["GPU-11111111-2222-3333-4444-555555555555", "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"]
    spec = write_faults(tmp_path, {"site": "*", "rate": 1e-3, "bits": "hi-mant", "device": 1})
    run = run_cli(
        [*RUN, "--faults", spec, "--allow-fault-injection"],
        tmp_path,
        env={"NVIDIA_VISIBLE_DEVICES": ",".join(uuids)},
    )
    assert run.rc == 1, run.stderr[-3000:]
    for name in ("compute", "memory", "golden"):
        check = run.check(name)
        assert check["verdict"] == "fail" and check["odd_device"] == 1, check
    assert run.check("collective")["odd_device"] == 1
    # The odd device's identity, the name a DRA driver publishes it under.
    assert run.doc["devices"] == uuids
    assert json.loads(run.termination or "{}")["devices"][1] == uuids[1]


def test_deterministic_defect_on_every_device_needs_the_baseline(
    tmp_path: Path, healthy_baseline: Path
) -> None:
    # Data-triggered and repeatable: same bits on every device and on replay.
    fault = {
        "site": "ffn.down",
        "rate": 1.0,
        "operand_mask": {"bits": 6, "value": 9},
        "bits": [20, 20],
    }
    spec = write_faults(tmp_path, fault)
    args = [*RUN, "--checks", "golden", "--faults", spec, "--allow-fault-injection"]
    blind = run_cli(args, tmp_path)
    assert blind.doc["injection"]["count"] > 0
    assert blind.rc == 0 and blind.check("golden")["baseline"] == "absent"
    seen = run_cli([*args, "--baseline", str(healthy_baseline)], tmp_path)
    assert seen.rc == 1, seen.stderr[-3000:]
    golden = seen.check("golden")
    assert golden["baseline"] == "mismatch" and golden["first_divergent_step"] == 0
    assert golden["odd_device"] is None  # every device is wrong alike


def test_baseline_under_another_fingerprint_is_inconclusive(
    tmp_path: Path, healthy_baseline: Path
) -> None:
    # Recorded with two threads per device, run with one: same node, other bits.
    # Golden alone with its steps pinned has nothing to fill a budget with: a generous
    # one only keeps a loaded machine (two threads per device on two busy cores) from
    # finding even those six steps too long for it.
    small = ["--device", "cpu", "--budget", "30", "--steps", "6", "--checks", "golden"]
    recorded = run_cli(["baseline", *small, "--threads", "2"], tmp_path)
    assert recorded.rc == 0, recorded.stderr[-3000:]
    other = tmp_path / "other-threads.json"
    other.write_text(recorded.stdout)
    spec = write_faults(tmp_path, {"site": "attention.output", "rate": 1e-2})
    args = ["run", *small, "--baseline", str(other), "--faults", spec, "--allow-fault-injection"]
    run = run_cli(args, tmp_path)
    # The fault is found (devices replay differently), yet a wrong baseline makes
    # the whole run inconclusive: never an SDC verdict from incomparable digests.
    assert run.rc == 2, run.stderr[-3000:]
    assert run.doc["verdict"] == "inconclusive"
    assert "threads: 2 in baseline, 1 here" in run.doc["reason"]
    assert run.check("golden")["baseline"] == "fingerprint-mismatch"
    # The baseline can also come from the environment, as the operator passes it.
    env = {"SDCPROBE_BASELINE": healthy_baseline.read_text()}
    again = run_cli(["run", *small], tmp_path, env=env)
    assert again.rc == 2 and "config_hash" in again.doc["reason"]


def test_result_reports_the_plan_and_fills_the_budget(tmp_path: Path) -> None:
    budget = 12.0
    run = run_cli(["run", "--device", "cpu", "--budget", str(budget), "--seed", "7"], tmp_path)
    assert run.rc == 0, run.stderr[-3000:]
    doc = run.doc
    plan = doc["plan"]
    assert doc["seed"] == 7 and plan["budget_s"] == budget and plan["error"] is None
    minimum = {"compute": 2, "collective": 2, "memory": 5, "golden": 16}
    # The plan never exceeds the budget, unless start-up on a busy machine left less
    # than the smallest complete plan: that one runs, and the plan shows the overrun.
    assert plan["planned_s"] <= budget or plan["rounds"] == minimum, plan
    assert doc["duration_s"] >= 0.8 * budget  # it fills the budget
    # ...and does not end past it, unless the rounds that always run no longer fitted
    # (then the last check ran just its minimum).
    assert doc["duration_s"] <= budget or plan["run"]["golden"] <= minimum["golden"], plan
    # A check whose next round would have ended past its deadline stopped there; the
    # last one runs on until its deadline (it fills the budget).
    assert all(
        plan["run"][c] == plan["rounds"][c] or (c in plan["cut"] and plan["run"][c] >= minimum[c])
        for c in ("compute", "collective", "memory")
    ), plan
    assert plan["run"]["golden"] >= plan["rounds"]["golden"] or "golden" in plan["cut"], plan
    counts = list(plan["rounds"].values())
    assert min(counts) >= 2 and plan["rounds"]["memory"] >= 5
    for check, chances in plan["catch"].items():
        n = plan["run"][check]
        assert chances == [round(1 - (1 - p) ** n, 4) for p in plan["catch_p"]]
    compute = run.check("compute")["metrics"]
    assert compute["peak_ratio_min"] > 0 and "float32:" in compute["peak_gflops"]
    assert run.check("collective")["metrics"]["busbw_ratio"] > 0
    assert run.check("memory")["metrics"]["copy_gbps"] > 0
    assert run.termination is not None and len(run.termination.encode()) <= 4096
    # Another seed computes other data: other digests, same verdict.
    other = run_cli([*RUN, "--seed", "8", "--checks", "compute,golden"], tmp_path)
    assert other.rc == 0, other.stderr[-3000:]
    assert other.check("golden")["digest"] != run.check("golden")["digest"]
    assert other.doc["fingerprint"]["config_hash"] != doc["fingerprint"]["config_hash"]


def test_bad_seeds_budgets_and_deadlines_are_inconclusive_with_a_reason(tmp_path: Path) -> None:
    for seed in ("abc", "1.5", "-1", str(1 << 31)):
        run = run_cli([*RUN, "--seed", seed], tmp_path)
        assert run.rc == 2 and "--seed" in run.doc["reason"], run.doc["reason"]
    tiny = run_cli([*RUN, "--budget", "2"], tmp_path)
    assert tiny.rc == 2 and "too small" in tiny.doc["reason"]
    late = run_cli([*RUN, "--budget", "60", "--deadline", "30"], tmp_path)
    assert late.rc == 2 and "deadline" in late.doc["reason"]
    # The smallest complete plan (here 100,000 pinned golden steps, 1,900-5,300 s of work
    # at the 19-53 ms a step that idle CPUs measured) cannot end before the workers' hard
    # limit: no partial plan, no check. The limit (120 s) leaves a loaded machine's
    # start-up room to reach the plan.
    steps = ["--steps", "100000", "--timeout", "120"]
    short = run_cli(["run", "--device", "cpu", "--budget", "4", *steps], tmp_path)
    assert short.rc == 2, short.stderr[-3000:]
    assert "too small" in short.doc["reason"] and "hard limit of 120s" in short.doc["reason"]
    assert short.doc["plan"]["error"]
    assert all(c["verdict"] == "inconclusive" for c in short.doc["checks"].values())


def test_a_budget_that_does_not_hold_the_smallest_plan_runs_it_over_budget(
    tmp_path: Path,
) -> None:
    """Pinned golden steps that are more work than a 4 s budget holds (a loaded node's
    rounds are dear in the same way): the run still does them, passes, and says it
    overran and why. 100 steps are that much work on a slow or loaded machine; where
    the plan still fits them in the budget, the steps are raised to about twice the
    budget's work at the round cost that run measured."""
    budget = 4

    def run(steps: int) -> CliRun:
        argv = ["--budget", str(budget), "--steps", str(steps), "--checks", "golden"]
        return run_cli(["run", "--device", "cpu", *argv], tmp_path)

    steps = 100
    over = run(steps)
    assert over.rc == 0, over.stderr[-3000:]
    if over.doc["plan"]["planned_s"] <= budget:
        steps = max(steps, math.ceil(2000 * budget / over.doc["plan"]["round_ms"]["golden"]))
        over = run(steps)
        assert over.rc == 0, over.stderr[-3000:]
    plan = over.doc["plan"]
    assert plan["error"] is None and plan["run"]["golden"] == steps
    assert over.doc["duration_s"] > budget and plan["planned_s"] > budget, json.dumps(plan)
    assert "over budget" in plan["overrun"] and "of work at the round costs" in plan["overrun"]
    assert plan["overrun"] in over.doc["reason"]
