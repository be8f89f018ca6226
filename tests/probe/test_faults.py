"""Fault injection building blocks: the spec, the bit mapping, the injector, ABFT."""

from __future__ import annotations

import math

import pytest
import torch

from sdcprobe.abft import abft_residual
from sdcprobe.backends import setup_backend
from sdcprobe.faults import Injector, map_bit, target_bits
from sdcprobe.faultspec import Fault, FaultSpec, FaultSpecError, parse_fault_spec
from sdcprobe.instrument import Instrumentation


def spec(**fault: object) -> FaultSpec:
    return FaultSpec.model_validate({"faults": [fault]})


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('{"faults": [{"site": "gpu.fan"}]}', "faults.0.site"),
        ('{"faults": [{"site": "matmul", "colour": "red"}]}', "colour"),
        ('{"faults": [{"site": "matmul", "bits": [30, 2]}]}', "lo <= hi"),
        ('{"faults": [{"site": "matmul", "rate": 2}]}', "rate"),
        ('{"faults": [{"site": "matmul", "lane_stride": 4, "lane_offset": 4}]}', "lane_offset"),
        ('{"faults": [{"site": "matmul", "onset_step": 5, "end_step": 2}]}', "end_step"),
        ('{"faults": [{"site": "matmul", "operand_mask": {"bits": 2, "value": 4}}]}', "fit"),
        ('{"faults": []}', "faults"),
        ('{"faults": [{"site": "matmul"}', "not JSON"),
    ],
)
def test_bad_specs_are_refused_with_the_field_named(text: str, needle: str) -> None:
    with pytest.raises(FaultSpecError) as err:
        parse_fault_spec(text)
    assert needle in str(err.value)


def test_every_documented_site_and_bit_class_is_accepted() -> None:
    sites = [
        "matmul", "attention.qkv", "attention.scores", "attention.softmax", "attention.output",
        "ffn.up", "ffn.down", "grad.weight", "allreduce", "norm", "optimizer", "param",
        "activation", "embedding", "memory", "*",
    ]  # fmt: skip
    for site in sites:
        for bits in ["lo-mant", "hi-mant", "exp", "exp-hi", "sign", [26, 27]]:
            Fault.model_validate({"site": site, "bits": bits})


def test_fp32_bits_map_onto_other_formats_by_class() -> None:
    for b in range(32):
        assert map_bit(b, torch.float32) == b
    assert map_bit(31, torch.bfloat16) == 15 and map_bit(31, torch.float16) == 15
    assert map_bit(31, torch.float64) == 63
    assert (
        map_bit(30, torch.bfloat16) == 14 and map_bit(30, torch.float16) == 14
    )  # top exponent bit
    assert (
        map_bit(23, torch.bfloat16) == 7 and map_bit(23, torch.float16) == 10
    )  # lowest exponent bit
    assert map_bit(22, torch.bfloat16) == 6 and map_bit(22, torch.float64) == 51  # top mantissa bit
    lo = Fault.model_validate({"site": "matmul", "bits": "lo-mant"})
    assert max(target_bits(lo, torch.bfloat16)) < 7  # stays in the mantissa
    exp = Fault.model_validate({"site": "matmul", "bits": "exp-hi"})
    assert all(10 <= b <= 14 for b in target_bits(exp, torch.float16))


def test_flip_changes_exactly_the_chosen_bit_class() -> None:
    x = torch.randn(1000, generator=torch.Generator().manual_seed(1))
    inj = Injector(spec(site="matmul", rate=1.0, bits="sign", mode="flip"))
    inj.set_step(0)
    out = inj.corrupt(x, ("matmul",))
    assert torch.equal(out, -x) and inj.counts["matmul"] == 1000
    inj = Injector(spec(site="matmul", rate=1.0, bits=[27, 27], mode="flip"))
    inj.set_step(0)
    flipped = inj.corrupt(x, ("matmul",)).view(torch.int32) ^ x.view(torch.int32)
    assert bool((flipped == (1 << 27)).all())


@pytest.mark.parametrize("mode", ["zero", "nan", "inf", "scale"])
def test_modes(mode: str) -> None:
    x = torch.ones(4096)
    inj = Injector(spec(site="norm", rate=0.01, mode=mode, scale=[0.5, 0.5]))
    inj.set_step(0)
    out = inj.corrupt(x, ("norm",))
    hit = out != x
    n = int(hit.sum())
    assert 10 < n < 100 and inj.counts["norm"] == n
    values = {"zero": 0.0, "inf": math.inf}
    if mode == "nan":
        assert bool(out[hit].isnan().all())
    elif mode == "scale":
        assert set(out[hit].tolist()) <= {0.5, 1.5}
    else:
        assert bool((out[hit] == values[mode]).all())


def test_injector_never_touches_the_workload_rng() -> None:
    torch.manual_seed(123)
    expected = torch.rand(5)
    torch.manual_seed(123)
    inj = Injector(spec(site="*", rate=0.5, step_probability=0.5))
    for step in range(5):
        inj.set_step(step)
        inj.corrupt(torch.ones(100), ("matmul",))
    assert torch.equal(torch.rand(5), expected)


def test_same_seed_same_hits_on_every_device_unless_restricted() -> None:
    x = torch.randn(5000)
    outs = []
    for device in (0, 1):
        inj = Injector(spec(site="ffn.down", rate=0.01), device_index=device)
        inj.set_step(0)
        outs.append(inj.corrupt(x, ("ffn.down", "matmul")))
    assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], x)
    only_one = Injector(spec(site="ffn.down", rate=0.01, device=1), device_index=0)
    only_one.set_step(0)
    assert only_one.corrupt(x, ("ffn.down",)) is x


def test_onset_end_and_step_probability() -> None:
    inj = Injector(spec(site="matmul", rate=1.0, onset_step=3, end_step=5))
    hit_steps = []
    for step in range(8):
        inj.set_step(step)
        if not torch.equal(inj.corrupt(torch.ones(4), ("matmul",)), torch.ones(4)):
            hit_steps.append(step)
    assert hit_steps == [3, 4, 5]
    inj = Injector(spec(site="matmul", rate=1.0, step_probability=0.3, seed=9))
    active = 0
    for step in range(1000):
        inj.set_step(step)
        active += inj.wants(("matmul",))
    assert 200 < active < 400


def test_lanes_and_operand_mask_select_elements() -> None:
    x = torch.ones(64, 16)
    inj = Injector(spec(site="matmul", rate=1.0, lane_stride=4, lane_offset=1, mode="zero"))
    inj.set_step(0)
    out = inj.corrupt(x, ("matmul",))
    assert bool((out[:, 1::4] == 0).all()) and int((out == 0).sum()) == 64 * 4
    operand = torch.arange(1024, dtype=torch.int32).view(torch.float32).reshape(64, 16)
    inj = Injector(spec(site="matmul", rate=1.0, operand_mask={"bits": 3, "value": 5}, mode="zero"))
    inj.set_step(0)
    out = inj.corrupt(x, ("matmul",), operand=operand)
    low = operand.view(torch.int32) & 7
    assert torch.equal(out == 0, low == 5)


def test_gradients_flow_through_a_corrupted_output() -> None:
    w = torch.ones(8, requires_grad=True)
    inj = Injector(spec(site="activation", rate=1.0, mode="zero"))
    inj.set_step(0)
    out = inj.corrupt(w * 2, ("activation",))
    assert bool((out == 0).all())
    out.sum().backward()
    assert w.grad is not None and bool((w.grad == 2).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_abft_tolerates_healthy_gemms_and_catches_big_errors(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(96, 200, generator=gen).to(dtype)
    b = torch.randn(200, 80, generator=gen).to(dtype)
    c = a @ b
    healthy = abft_residual(a, b, c)
    assert healthy.ratio < 1.0 and not healthy.detected
    bad = c.clone()
    bad[7, 9] += 1000.0
    caught = abft_residual(a, b, bad)
    assert caught.detected and caught.bf16_units > 1
    nan = c.clone()
    nan[0, 0] = math.nan
    assert abft_residual(a, b, nan).ratio == math.inf


def test_instrumentation_counts_matmul_hits_by_hook_label() -> None:
    backend = setup_backend("cpu", 0, 1)
    ins = Instrumentation(backend, Injector(spec(site="matmul", rate=0.05)), abft=True)
    ins.set_step(0)
    a, b = torch.randn(32, 32), torch.randn(32, 32)
    ins.matmul(a, b, "attention.scores")
    ins.linear(a, b, "lm_head")
    assert ins.injector is not None
    assert set(ins.injector.counts) == {"attention.scores", "lm_head"}
    assert len(ins.residuals) == 2
