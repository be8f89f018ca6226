"""The memory check: patterns, read-back, flips located, and the ``memory`` fault site."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sdcprobe.backends import setup_backend
from sdcprobe.checks.memory import (
    _fill,
    _RowReader,
    along_row,
    pattern_values,
    plan_memory,
    run_memory,
)
from sdcprobe.config import MEMORY_PATTERNS, MemoryConfig, plan_config
from sdcprobe.faults import Injector
from sdcprobe.faultspec import FaultSpec, FaultSpecError, parse_fault_spec
from sdcprobe.instrument import Instrumentation
from sdcprobe.result import parse_result
from sdcprobe.trace import CheckTrace
from tests.probe.conftest import FAST, run_cli, write_faults

CPU = setup_backend("cpu", 0, 1)
#: Small and quick: 8 MiB in 2 MiB blocks, no dwell.
SMALL = MemoryConfig(mib=8, max_mib=64, block_mib=2, dwell_s=0.0)


def run(
    cfg: MemoryConfig = SMALL, fault: dict[str, object] | None = None, seed: int = 0
) -> tuple[CheckTrace, Injector]:
    spec = FaultSpec.model_validate({"faults": [fault]}) if fault else None
    injector = Injector(spec, 0)
    trace = run_memory(cfg, seed, Instrumentation(CPU, injector))
    return trace, injector


def as_unsigned(row: torch.Tensor) -> list[int]:
    return [v & 0xFFFFFFFF for v in row.tolist()]


def test_patterns_hold_what_they_promise() -> None:
    ones = as_unsigned(pattern_values("walking-ones", 0, 64))
    assert ones[:3] == [1, 2, 4] and ones[31] == 1 << 31 and ones[32] == 1
    assert as_unsigned(pattern_values("walking-ones", 0, 2, cycle=1)) == [2, 4]
    zeros = as_unsigned(pattern_values("walking-zeros", 0, 64))
    assert all(a ^ b == 0xFFFFFFFF for a, b in zip(ones, zeros, strict=True))
    board = as_unsigned(pattern_values("checkerboard", 0, 4))
    assert board == [0x55555555, 0xAAAAAAAA] * 2
    assert as_unsigned(pattern_values("checkerboard-inverse", 0, 4)) == [0xAAAAAAAA, 0x55555555] * 2
    rand = pattern_values("random", 0, 4096)
    assert torch.equal(rand, pattern_values("random", 0, 4096))
    assert not torch.equal(rand, pattern_values("random", 1, 4096))
    assert not torch.equal(rand, pattern_values("random", 0, 4096, cycle=1))
    assert rand.unique().numel() > 4090  # rows differ: an aliased row shows


def test_healthy_memory_passes_and_digest_is_stable() -> None:
    first, _ = run()
    again, _ = run()
    assert first.error is None and first.evidence == []
    assert first.digest == again.digest and first.steps == again.steps
    assert [next(iter(s)) for s in first.steps] == list(MEMORY_PATTERNS)
    assert first.metrics["bytes_tested"] == 8 << 20 and first.metrics["flips"] == 0
    # The digest follows the seed and the pattern set...
    other_seed, _ = run(seed=1)
    assert other_seed.digest != first.digest
    fewer = SMALL.model_copy(update={"patterns": ("random",)})
    assert run(fewer)[0].digest != first.digest
    # ...but not the bytes tested: a device with less free memory agrees with the others.
    smaller = SMALL.model_copy(update={"mib": 4})
    assert run(smaller)[0].digest == first.digest


def test_planned_sizes() -> None:
    cpu = plan_config(6, "cpu").memory
    assert cpu.mib == 64 and plan_memory(cpu, CPU).bytes == 64 << 20
    assert plan_config(6, "cpu", memory_mib=16).memory.mib == 16
    assert plan_config(6, "cpu").config_hash() != plan_config(6, "cpu", memory_mib=16).config_hash()
    gpu = plan_config(60, "cuda").memory
    assert gpu.mib is None and gpu.fraction == 0.8 and gpu.max_mib >= 100 * 1024
    assert plan_config(15, "cuda").memory.max_mib < gpu.max_mib  # short budgets test less
    assert plan_config(60, "cuda", memory_fraction=0.5).memory.fraction == 0.5
    # Where free memory cannot be read the fallback size is used, under the cap.
    no_stats = MemoryConfig(fraction=0.8, max_mib=64, fallback_mib=8, block_mib=2, dwell_s=0)
    plan = plan_memory(no_stats, CPU)
    assert plan.bytes == 8 << 20 and plan.free_bytes is None and plan.blocks == 4


def test_flips_are_counted_and_located_exactly() -> None:
    # One flip of bit 5 at word 1000 and word 1000 + 2^18 of every 2 MiB block
    # (4 blocks, so 8 flips per pattern), in every pattern.
    fault = {"site": "memory", "rate": 1.0, "bits": [5, 5], "lane_stride": 1 << 18,
             "lane_offset": 1000}  # fmt: skip
    trace, injector = run(fault=fault)
    patterns = len(MEMORY_PATTERNS)
    assert injector.by_site() == {"memory": 8 * patterns}
    assert trace.metrics["flips"] == 8 * patterns == trace.metrics["flipped_words"]
    assert trace.metrics["flip_bits"] == f"5:{8 * patterns}"
    block = 2 << 20
    expected = sorted(b * block + w * 4 for b in range(4) for w in (1000, 1000 + (1 << 18)))
    listed = str(trace.metrics["flip_offsets"]).split()
    assert listed[:8] == [f"walking-ones@0x{off:x}:5" for off in expected]
    assert len(listed) == SMALL.listed_flips
    assert [e.kind for e in trace.evidence] == ["memory"] * patterns
    assert [e.item for e in trace.evidence] == list(MEMORY_PATTERNS)
    first = trace.evidence[0].detail
    assert first.startswith("8 bit flip(s) in 8 word(s)")
    assert f"byte 0x{expected[0]:x} bit 5" in first
    healthy, _ = run()
    assert trace.digest != healthy.digest


@pytest.mark.parametrize("pattern", MEMORY_PATTERNS)
def test_the_read_back_finds_every_bad_row_chunked_or_whole(pattern: str) -> None:
    """Both read-backs (cache-sized chunks on a CPU; one aminmax per block elsewhere,
    and chunks for the random pattern's XOR everywhere) name the same rows: a flip in
    the sign bit, in the lowest bit, and in a row's first and last word."""
    rows, words = 64, 1024
    blocks = [torch.empty(rows, words, dtype=torch.int32) for _ in range(3)]
    row_words = pattern_values(pattern, 1, 3 * rows)
    along = along_row(pattern, 1, words, 0, torch.device("cpu"))
    for b, block in enumerate(blocks):
        _fill(block, row_words[b * rows : (b + 1) * rows], along)
    blocks[1][5, 7] ^= 1 << 31
    blocks[2][0, 0] ^= 1 << 4
    blocks[2][63, words - 1] ^= 1
    for whole in (False, True):
        reader = _RowReader(blocks, whole=whole)
        assert reader.bad_rows(row_words, along).tolist() == [0, 1, 2], f"whole={whole}"
    blocks[1][5, 7] ^= 1 << 31
    assert _RowReader(blocks, whole=True).bad_rows(row_words, along).tolist() == [0, 0, 2]


def test_memory_fault_rate_onset_and_modes() -> None:
    # Rate is the share of words hit; each pattern is one step.
    trace, injector = run(fault={"site": "memory", "rate": 1e-4, "onset_step": 3, "seed": 4})
    words = (8 << 20) // 4
    hits = injector.by_site()["memory"]
    assert 0.5 * 2 * words * 1e-4 < hits < 1.5 * 2 * words * 1e-4
    assert {e.step for e in trace.evidence} == {3, 4}
    assert trace.metrics["flips"] == hits
    # 'zero' clears words; a word that was already zero is not counted as changed.
    trace, injector = run(fault={"site": "memory", "rate": 1e-3, "mode": "zero"})
    assert trace.metrics["flipped_words"] == injector.by_site()["memory"] > 0
    with pytest.raises(FaultSpecError, match="does not apply to site 'memory'"):
        parse_fault_spec('{"faults": [{"site": "memory", "mode": "nan"}]}')


def test_large_buffers_draw_hits_without_a_number_per_word() -> None:
    words = torch.zeros(1 << 23, dtype=torch.int32)  # 32 MiB: the sampled path
    inj = Injector(FaultSpec.model_validate({"faults": [{"site": "memory", "rate": 1e-5}]}))
    inj.set_step(0)
    changed = inj.corrupt_words(words)
    assert changed == int((words != 0).sum()) and 40 < changed < 130
    assert inj.corrupt_words(torch.zeros(4, dtype=torch.int32), ("matmul",)) == 0


def test_memory_fault_on_one_device_fails_the_run_and_names_it(tmp_path: Path) -> None:
    spec = write_faults(tmp_path, {"site": "memory", "rate": 1e-6, "bits": "exp", "device": 1})
    args = ["run", "--device", "cpu", *FAST, "--checks", "memory", "--faults", spec]
    run = run_cli([*args, "--allow-fault-injection"], tmp_path)
    assert run.rc == 1, run.stderr[-3000:]
    memory = run.check("memory")
    assert memory["verdict"] == "fail" and memory["odd_device"] == 1
    metrics = memory["metrics"]
    assert metrics["flips"] == run.doc["injection"]["by_site"]["memory"] > 0
    assert metrics["bytes_tested"] == 64 << 20
    assert metrics["flip_offsets"].startswith("device 1: walking-ones@0x")
    assert metrics["flip_bits"].startswith("device 1: ")
    histogram = metrics["flip_bits"].removeprefix("device 1: ").split(",")
    bits = {int(entry.split(":")[0]) for entry in histogram}
    assert bits <= {23, 24, 25, 26}  # the 'exp' class
    assert memory["first_divergent_submodule"] == "walking-ones"
    assert "device 1: " in memory["reason"] and "bit flip(s)" in memory["reason"]
    assert run.termination is not None and parse_result(run.termination).verdict == "fail"
