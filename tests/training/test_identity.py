"""Which GPU a rank names in its reports (sdctrain.identity.gpu_uuid), and whether its
kernels count as deterministic (sdctrain.identity.deterministic), on the CPU."""

from __future__ import annotations

import pytest
import torch

from sdctrain.identity import deterministic, gpu_uuid

CPU = torch.device("cpu")
PLUGIN = {"NVIDIA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb"}


def test_the_device_plugins_uuid_of_the_local_rank() -> None:
    assert gpu_uuid(CPU, PLUGIN) == "GPU-aaaa"
    assert gpu_uuid(CPU, {**PLUGIN, "LOCAL_RANK": "1"}) == "GPU-bbbb"
    assert gpu_uuid(CPU, {**PLUGIN, "LOCAL_RANK": "2"}) is None  # no such GPU: named none


def test_an_explicit_uuid_wins_and_indices_are_not_uuids() -> None:
    assert gpu_uuid(CPU, {**PLUGIN, "SDCGUARD_GPU_UUID": "GPU-cccc"}) == "GPU-cccc"
    assert gpu_uuid(CPU, {"NVIDIA_VISIBLE_DEVICES": "0,1"}) is None
    assert gpu_uuid(CPU, {"NVIDIA_VISIBLE_DEVICES": "all"}) is None


@pytest.fixture
def algorithms():
    saved = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark)
    yield
    torch.use_deterministic_algorithms(saved[0])
    torch.backends.cudnn.benchmark = saved[1]


def test_a_cuda_rank_as_the_readme_sets_it_up_is_deterministic(algorithms) -> None:
    """use_deterministic_algorithms(True), the cuBLAS workspace and no cuDNN benchmark
    suffice: the older cudnn.deterministic flag stays False (on an H200 the guard
    refused every audit while it was required)."""
    cuda, env = torch.device("cuda", 0), {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    assert not torch.backends.cudnn.deterministic
    assert deterministic(cuda, env)
    assert deterministic(cuda, {"CUBLAS_WORKSPACE_CONFIG": ":16:8"})
    assert not deterministic(cuda, {})  # cuBLAS may then split reductions differently
    torch.backends.cudnn.benchmark = True
    assert not deterministic(cuda, env)
    assert deterministic(CPU, {})  # the CPU needs neither
    torch.use_deterministic_algorithms(False)
    assert not deterministic(CPU, {})
