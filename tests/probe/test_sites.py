"""Every issue-9 fault site injects, and small errors there are caught and located.

"Small" means below bf16 resolution: relative errors of 1e-5 to 1e-3, or flips
of low mantissa bits, in an fp32 model. Each golden site is run through the
golden check three ways: against a healthy baseline (what a node with a
recorded baseline sees), against a healthy trace item by item (what names the
site), and with the check's own replay (what the probe reports without a
baseline). ``allreduce`` is the collective check's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sdcprobe.backends import setup_backend
from sdcprobe.checks.golden import GoldenTrace, golden_check, run_golden
from sdcprobe.config import GoldenConfig, plan_config
from sdcprobe.faults import Injector
from sdcprobe.faultspec import FaultSpec
from sdcprobe.judge import judge_check
from sdcprobe.result import Baseline, Fingerprint
from sdcprobe.trace import CheckTrace, site_of_item
from tests.probe.conftest import FAST, run_cli, write_faults

CFG = GoldenConfig(steps=6)
ONSET = 2
CPU = setup_backend("cpu", 0, 1)
GOLDEN_SITES = ["attention.softmax", "norm", "optimizer", "param", "activation", "embedding"]
SMALL_ERRORS: dict[str, dict[str, Any]] = {
    "scale": {"mode": "scale", "scale": [1e-5, 1e-3]},
    "lo-mant": {"mode": "flip", "bits": "lo-mant"},
}
FINGERPRINT = Fingerprint.build(
    backend="cpu",
    device_model="cpu: test",
    device_count=2,
    driver=None,
    runtime=None,
    torch="2.9.0",
    torch_xla=None,
    cpu_isa="x86_64-AVX512",
    threads=1,
    config_hash=plan_config(6, "cpu").config_hash(),
)


@pytest.fixture(scope="module")
def healthy() -> GoldenTrace:
    return run_golden(CFG, None, CPU)


@pytest.fixture(scope="module")
def baseline(healthy: GoldenTrace) -> Baseline:
    return Baseline(
        fingerprint=FINGERPRINT,
        digests={"golden": healthy.digest},
        step_digests={"golden": healthy.step_digests()},
    )


@pytest.mark.parametrize("error", list(SMALL_ERRORS))
@pytest.mark.parametrize("site", GOLDEN_SITES)
def test_small_errors_at_each_golden_site_are_caught_and_located(
    site: str, error: str, healthy: GoldenTrace, baseline: Baseline
) -> None:
    fault = {"site": site, "rate": 1e-3, "onset_step": ONSET, **SMALL_ERRORS[error]}
    spec = FaultSpec.model_validate({"faults": [fault]})

    # Against the baseline: the same fault on both devices, so only the baseline sees it.
    trial = run_golden(CFG, spec, CPU)
    assert trial.injections.get(site, 0) > 0, "the fault must actually fire"
    seen = CheckTrace(digest=trial.digest, steps=trial.items)
    result = judge_check("golden", {0: seen, 1: seen}, baseline, FINGERPRINT)
    assert result.verdict == "fail" and result.baseline == "mismatch"
    assert result.first_divergent_step == ONSET

    # Item by item against a healthy trace: the first divergent item is the site's.
    step, item = healthy.first_divergence(trial) or (None, None)
    assert step == ONSET and site_of_item("golden", item) == site, item

    # The probe's own golden check (run + replay) names the site in its result.
    injector = Injector(spec, 1)
    checked = golden_check(CFG, CPU, injector)
    clean = CheckTrace(digest=healthy.digest, steps=healthy.items)
    result = judge_check("golden", {0: clean, 1: checked}, None, FINGERPRINT)
    assert result.verdict == "fail" and result.odd_device == 1
    assert result.first_divergent_step == ONSET
    assert result.metrics["first_divergent_site"] == site, result.first_divergent_submodule


def test_trace_items_map_to_the_sites_that_make_them() -> None:
    cases = {
        "embedding": "embedding",
        "layers.0.norm1": "norm",
        "layers.1.norm2": "norm",
        "final_norm": "norm",
        "layers.0.attention.qkv": "attention.qkv",
        "layers.1.attention.softmax": "attention.softmax",
        "layers.0.attention.context": "matmul",
        "layers.0.ffn.activation": "activation",
        "lm_head": "matmul",
        "grad.embedding": "grad.weight",
        "optimizer.layers.0.norm1": "optimizer",
        "param.embedding": "param",
        "loss": None,
        "grad_norm": None,
    }
    for item, site in cases.items():
        assert site_of_item("golden", item) == site, item
    assert site_of_item("compute", "bfloat16") == "matmul"
    assert site_of_item("collective", "allreduce") == "allreduce"
    assert site_of_item("collective", "allgather") is None
    assert site_of_item("memory", "random") == "memory"
    assert site_of_item("golden", None) is None


def test_small_allreduce_errors_on_one_device_are_caught(tmp_path: Path) -> None:
    fault = {"site": "allreduce", "rate": 1e-4, "device": 1, **SMALL_ERRORS["scale"]}
    spec = write_faults(tmp_path, fault)
    args = ["run", "--device", "cpu", *FAST, "--checks", "collective", "--faults", spec]
    run = run_cli([*args, "--allow-fault-injection"], tmp_path)
    assert run.doc["injection"]["by_site"].get("allreduce", 0) > 0
    assert run.rc == 1, run.stderr[-3000:]
    collective = run.check("collective")
    assert collective["verdict"] == "fail" and collective["odd_device"] == 1
    assert collective["first_divergent_submodule"] == "allreduce"
    assert "all-reduce result wrong" in collective["reason"]


def test_localisation_benchmark_writes_its_results(tmp_path: Path) -> None:
    from bench.localisation.run import main

    rc = main(["--trials", "2", "--steps", "4", "--sites", "norm", "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "localisation.json").read_text())
    norm = doc["sites"]["norm"]
    assert rc == 0 and norm["detected"] == norm["site_named"] == norm["probe_site_named"] == 2
    assert "| `norm` | 2/2 | 2/2 (100%)" in (tmp_path / "localisation.md").read_text()
