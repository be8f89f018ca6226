"""Device-resident rounds, proved on the CPU: one round of every check under an
operation-level watch (``tests/probe/hostguard.py``) sends the host only small
summaries, through ``Backend.to_host``, with no more host syncs than the plan allows.

A watch that could not see a large copy would prove nothing, so the last tests plant
one (a whole GEMM output sent to the host, and a stray ``.tolist()``) and require the
watch to fail naming the check and the tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import sdcprobe.checks.compute as compute
from sdcprobe.backends import Backend, setup_backend
from sdcprobe.checks.collective import init_group, run_collective
from sdcprobe.checks.golden import golden_check
from sdcprobe.checks.memory import run_memory
from sdcprobe.config import HOST_BYTES_PER_CROSSING, HOST_SYNCS_PER_ROUND, plan_config, with_rounds
from sdcprobe.faults import Injector
from sdcprobe.instrument import Instrumentation
from sdcprobe.trace import CheckTrace
from tests.probe.hostguard import HostGuard, host_guard

CONFIG = with_rounds(
    plan_config(60, "cpu"), {"compute": 1, "collective": 1, "memory": 1, "golden": 1}
)


def _one_round(check: str, backend: Backend, tmp_path: Path) -> Callable[[], CheckTrace]:
    cfg = CONFIG
    if check == "compute":
        return lambda: compute.run_compute(cfg.compute, 0, Instrumentation(backend))
    if check == "memory":
        small = cfg.memory.model_copy(update={"mib": 16, "dwell_s": 0.0})
        return lambda: run_memory(small, 0, Instrumentation(backend))
    if check == "golden":
        return lambda: golden_check(
            cfg.golden.model_copy(update={"steps": 1}), backend, Injector(None)
        )
    return lambda: run_collective(cfg.collective, 0, Instrumentation(backend), 0, 1)


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Backend:
    be = setup_backend("cpu", 0, 1)
    init_group("gloo", 0, 1, str(tmp_path_factory.mktemp("group") / "store"))
    yield be
    dist.destroy_process_group()


@pytest.mark.parametrize("check", ["compute", "collective", "memory", "golden"])
def test_a_round_sends_only_small_summaries(check: str, backend: Backend, tmp_path: Path) -> None:
    run = _one_round(check, backend, tmp_path)
    run()  # warm: lazy set-up (kernels, caches) is not what a round costs
    with host_guard(check, HOST_BYTES_PER_CROSSING) as guard:
        trace = run()
    assert trace.error is None and not trace.evidence
    assert not guard.violations, "\n".join(guard.violations)
    assert guard.crossings, f"{check}: nothing reached the host at all"
    assert guard.syncs <= HOST_SYNCS_PER_ROUND[check], _detail(guard)
    assert trace.metrics["host_syncs_per_round"] == len(guard.crossings)
    assert trace.metrics["host_bytes_per_round"] == sum(c.nbytes for c in guard.crossings)


def _detail(guard: HostGuard) -> str:
    return f"{guard.check}: {guard.syncs} syncs: " + "; ".join(
        f"{c.what} {c.nbytes}B at {c.where}" for c in guard.crossings
    )


def test_the_watch_catches_an_output_sent_to_the_host(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def leaky_digest(tensor: torch.Tensor) -> torch.Tensor:  # the old way: hash on the host
        host = backend.to_host(tensor, what="GEMM output")
        return torch.tensor([int(host.view(torch.int32).sum())])

    monkeypatch.setattr(compute, "word_digest", leaky_digest)
    with host_guard("compute") as guard:
        _one_round("compute", backend, tmp_path)()
    assert any(
        v.startswith("compute: GEMM output ((512, 512) torch.float32, 1048576 bytes)")
        for v in guard.violations
    ), guard.violations


def test_the_watch_catches_a_stray_host_read(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = compute.word_digest

    def peeking_digest(tensor: torch.Tensor) -> torch.Tensor:
        tensor.tolist()  # a read that bypasses to_host
        return real(tensor)

    monkeypatch.setattr(compute, "word_digest", peeking_digest)
    with host_guard("compute") as guard:
        _one_round("compute", backend, tmp_path)()
    assert guard.violations and guard.violations[0].startswith(
        "compute: .tolist() on a (512, 512) torch.float32 device tensor (1048576 bytes) at "
        "test_host_traffic.py"
    ), guard.violations
