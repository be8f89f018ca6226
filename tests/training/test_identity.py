"""Which GPU a rank names in its reports (sdctrain.identity.gpu_uuid), on the CPU."""

from __future__ import annotations

import torch

from sdctrain.identity import gpu_uuid

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
