"""The catch target, telemetry and MIG: what the plan promises, what a device reports,
and what is refused, each with the bad input the issue names."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from sdcprobe.config import catch_probability, rounds_for_target
from sdcprobe.devices import mig_instances, mig_refusal
from sdcprobe.result import ResultError, parse_result
from sdcprobe.runner import RunOptions, run_probe
from sdcprobe.telemetry import Sample, Telemetry, settled_after, summarise
from tests.probe.conftest import run_cli


def test_rounds_for_the_default_target() -> None:
    assert rounds_for_target(0.99, 0.05) == 90
    assert catch_probability(0.05, 90) >= 0.99 > catch_probability(0.05, 89)
    assert rounds_for_target(0.9, 0.1) == 22
    with pytest.raises(ValueError, match="must be in"):
        rounds_for_target(1.0, 0.05)


def test_an_unreachable_target_is_refused_before_the_checks(tmp_path: Path) -> None:
    run = run_cli(
        ["run", "--device", "cpu", "--budget", "6", "--checks", "compute",
         "--catch-target", "0.999999", "--catch-fraction", "0.001", "--catch-shortfall", "refuse"],
        tmp_path,
    )  # fmt: skip
    assert run.rc == 2, run.stderr[-2000:]
    plan = run.doc["plan"]
    assert plan["planned_target_met"] is False and plan["rounds_needed"] > 10_000
    assert plan["error"].startswith("refused: catch target 0.999999 for a fault in 0.1% of rounds")
    assert "would reach it" in run.doc["reason"] and run.doc["verdict"] == "inconclusive"
    assert "compute" not in run.doc["checks"] or run.doc["checks"]["compute"]["verdict"] != "pass"
    assert run.termination is not None
    squeezed = json.loads(run.termination)
    assert squeezed["plan"]["planned_target_met"] is False
    assert "sdcprobe: plan:" not in run.stderr or "refused" in run.stderr


def test_a_result_claiming_a_target_it_missed_is_malformed() -> None:
    plan: dict[str, object] = {"budget_s": 60, "startup_s": 1, "planned_s": 59}
    plan |= {"catch_target": 0.99, "catch_fraction": 0.05}
    plan |= {"catch_chance": {"compute": 0.9}, "target_met": True}
    doc: dict[str, object] = {"schema_version": 1, "kind": "sdcprobe.result"}
    doc["verdict"] = "inconclusive"
    doc["plan"] = plan
    with pytest.raises(ResultError, match="target_met is true but compute reached less"):
        parse_result(json.dumps(doc))
    plan |= {"catch_chance": {"compute": 1.5}, "target_met": False}
    with pytest.raises(ResultError, match="not a probability"):
        parse_result(json.dumps(doc))


def test_without_nvml_power_is_absent_not_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    gpu = Telemetry("cuda", 0)
    sample = gpu.read(0.0)
    assert gpu.source is None and sample.power_w is None and sample.power_limit_w is None
    metrics = summarise([sample, gpu.read(1.0)])
    assert metrics["power_w"] is None and metrics["power_ratio"] is None
    assert "power_w" in str(metrics["telemetry_absent"])
    assert metrics["settled_s"] is None


def test_nvml_figures_when_present(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: f"gpu{i}",
        nvmlDeviceGetHandleByUUID=lambda u: u,
        nvmlDeviceGetPowerUsage=lambda h: 650_000,
        nvmlDeviceGetEnforcedPowerLimit=lambda h: 700_000,
        nvmlDeviceGetTemperature=lambda h, kind: 71,
        nvmlDeviceGetClockInfo=lambda h, kind: 1755,
        nvmlDeviceGetMaxClockInfo=lambda h, kind: 1980,
        NVML_TEMPERATURE_GPU=0,
        NVML_CLOCK_SM=1,
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    gpu = Telemetry("cuda", 0, "GPU-1234")
    samples = [gpu.read(float(t)) for t in range(6)]
    metrics = summarise(samples)
    assert gpu.source == "nvml" and metrics["power_ratio"] == pytest.approx(650 / 700, abs=1e-3)
    assert metrics["temperature_c_max"] == 71 and metrics["clock_mhz_min"] == 1755
    assert metrics["telemetry_absent"] is None and metrics["settled_s"] == 0.0


def test_a_throttling_device_shows_in_its_clocks(tmp_path: Path) -> None:
    freq = tmp_path / "cpu0" / "cpufreq"
    freq.mkdir(parents=True)
    (freq / "cpuinfo_max_freq").write_text("3000000\n")
    cpu = Telemetry("cpu", 0, sysfs=tmp_path)
    readings = []
    for khz in (3_000_000, 2_900_000, 1_200_000):  # the device slows down mid-run
        (freq / "scaling_cur_freq").write_text(f"{khz}\n")
        readings.append(cpu.read(len(readings)))
    metrics = summarise(readings)
    assert cpu.source == "cpufreq"
    assert (metrics["clock_mhz_min"], metrics["clock_mhz_max"], metrics["max_clock_mhz"]) == (
        1200.0,
        3000.0,
        3000.0,
    )
    assert "power_w" in str(metrics["telemetry_absent"])  # no power on this path: null


def test_power_that_keeps_climbing_has_not_settled() -> None:
    rising = [Sample(at=float(t), power_w=300.0 + 40 * t, temperature_c=50) for t in range(6)]
    assert settled_after(rising) is None
    steady = [Sample(at=float(t), power_w=650.0, temperature_c=70.0 + 0.1 * t) for t in range(6)]
    assert settled_after(steady) == 0.0


def test_mig_instances_are_screened_one_by_one_or_refused_naming_mig() -> None:
    env = {"NVIDIA_VISIBLE_DEVICES": "MIG-aaaa,MIG-bbbb"}
    assert mig_instances(env) == ["MIG-aaaa", "MIG-bbbb"]
    assert mig_instances({"NVIDIA_VISIBLE_DEVICES": "GPU-1,GPU-2"}) == []
    assert mig_refusal(["compute", "memory", "golden"], ["MIG-aaaa"], []) is None
    why = mig_refusal(["compute", "collective"], ["MIG-aaaa"], [])
    assert why is not None and why.startswith("MIG:") and "--checks compute,memory,golden" in why
    hidden = mig_refusal(["compute"], [], [0, 3])
    assert hidden is not None and "MIG is enabled on GPU 0, 3" in hidden


def test_a_run_on_mig_with_the_collective_check_is_inconclusive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "MIG-aaaa,MIG-bbbb")
    run = run_probe(RunOptions(device="cuda", checks=["compute", "collective"], budget=10))
    assert run.result.verdict == "inconclusive" and "MIG" in run.result.reason
    assert run.result.exit_code() == 2 and not run.reports
