"""The in-process API that benchmarks use: one trial, every signal."""

from __future__ import annotations

from sdcprobe.checks.golden import run_golden
from sdcprobe.config import GoldenConfig
from sdcprobe.faultspec import FaultSpec

CFG = GoldenConfig(steps=12)


def test_healthy_runs_are_bitwise_identical_and_learn() -> None:
    a = run_golden(CFG, None, "cpu")
    b = run_golden(CFG, None, "cpu")
    assert a.digest == b.digest and a.first_divergence(b) is None
    assert a.losses[-1] < a.losses[0] - 0.5  # the model is learning, not idling
    assert len(a.step_digests()) == CFG.steps and all(len(d) == 16 for d in a.step_digests())
    first = list(a.steps[0].digests)
    assert first[:3] == ["embedding", "layers.0.norm1", "layers.0.attention.qkv"]
    assert {"loss", "grad_norm", "grad.lm_head", "optimizer.lm_head", "param.lm_head"} <= set(first)


def test_one_trial_gives_divergence_abft_and_curves() -> None:
    healthy = run_golden(CFG, None, "cpu")
    spec = FaultSpec.model_validate(
        {
            "faults": [
                {"site": "ffn.down", "rate": 1e-3, "bits": "exp-hi", "onset_step": 4, "seed": 3}
            ]
        }
    )
    faulty = run_golden(CFG, spec, "cpu", abft=True)
    assert faulty.injections["ffn.down"] > 0
    assert healthy.first_divergence(faulty) == (4, "layers.0.ffn.down")
    assert healthy.losses[:4] == faulty.losses[:4]
    assert len(faulty.grad_norms) == CFG.steps
    # Every GEMM of every step is checksummed; the hit ones stand out.
    gemms_per_step = 1 + CFG.n_layers * 6
    assert len(faulty.residuals) == CFG.steps * gemms_per_step
    hit = [r for r in faulty.residuals if r.label.endswith("ffn.down") and r.step >= 4]
    clean = [r for r in faulty.residuals if r.step < 4]
    assert max(r.ratio for r in clean) < 1
    assert max(r.fp32_units for r in hit) > 1e3


def test_optimizer_and_param_sites_are_located() -> None:
    healthy = run_golden(CFG, None, "cpu")
    for site, first_item in [
        ("optimizer", "optimizer."),
        ("param", "param."),
        ("grad.weight", "grad."),
    ]:
        spec = FaultSpec.model_validate({"faults": [{"site": site, "rate": 1e-2, "onset_step": 2}]})
        div = healthy.first_divergence(run_golden(CFG, spec, "cpu"))
        assert div is not None and div[0] == 2 and (div[1] or "").startswith(first_item), (
            site,
            div,
        )
