"""Device identities: probe device index -> the GPU's UUID (what a DRA driver
publishes as the device's ``uuid``), reported beside the fingerprint, never in it."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from sdcprobe.backends import Backend
from sdcprobe.config import plan_config
from sdcprobe.fingerprint import device_uuid, visible_device_uuids
from sdcprobe.judge import build_fingerprint, judge
from sdcprobe.result import ProbeResult, parse_result
from sdcprobe.trace import CheckTrace, DeviceFacts, WorkerReport, trace_digest

CONFIG = plan_config(6, "cpu")
A, B = "GPU-0b1c2d3e-0000-1111-2222-333333333333", "GPU-9f8e7d6c-4444-5555-6666-777777777777"


def facts(uuid: str | None) -> DeviceFacts:
    return DeviceFacts(
        backend="cpu", device_model="cpu: t", torch="2.9.0", cpu_isa="x", threads=1, device_id=uuid
    )


def cpu(index: int) -> Backend:
    return Backend(name="cpu", index=index, device=torch.device("cpu"), threads=1)


def test_visible_devices_lists_uuids_only() -> None:
    assert visible_device_uuids(f"{A},{B}") == [A, B]
    assert visible_device_uuids(f" {A} , MIG-1 ") == [A, "MIG-1"]
    for value in (None, "", "all", "none", "void", "0,1", f"{A},1"):
        assert visible_device_uuids(value) == []


def test_cpu_device_i_is_entry_i_of_the_visible_devices() -> None:
    assert device_uuid(cpu(0), f"{A},{B}") == A
    assert device_uuid(cpu(1), f"{A},{B}") == B
    assert device_uuid(cpu(2), f"{A},{B}") is None
    assert device_uuid(cpu(0), "all") is None


def test_uuids_do_not_change_the_hash_so_baselines_still_apply() -> None:
    plain = build_fingerprint([facts(None)], 2, CONFIG)
    named = build_fingerprint([facts(A), facts(B)], 2, CONFIG)
    assert plain.hash == named.hash == named.expected_hash()


def test_judge_maps_each_rank_to_its_workers_uuid_and_blank_for_a_dead_worker() -> None:
    steps = [{"x": "1"}]
    trace = CheckTrace(digest=trace_digest(steps), steps=steps)
    reports: dict[int, WorkerReport | None] = {
        0: WorkerReport(rank=0, facts=facts(A), checks={"compute": trace}),
        1: None,
        2: WorkerReport(rank=2, facts=facts(B), checks={"compute": trace}),
    }
    result = judge(["compute"], reports, CONFIG, None, False, 1.0)
    assert result.devices == [A, "", B]
    assert parse_result(result.model_dump_json()).devices == [A, "", B]
    unnamed = {0: WorkerReport(rank=0, facts=facts(None), checks={"compute": trace})}
    assert judge(["compute"], unnamed, CONFIG, None, False, 1.0).devices == []


def test_malformed_ids_are_refused() -> None:
    doc = judge(
        ["compute"],
        {
            0: WorkerReport(
                rank=0,
                facts=facts(A),
                checks={"compute": CheckTrace(digest=trace_digest([]), steps=[])},
            )
        },
        CONFIG,
        None,
        False,
        1.0,
    ).model_dump(mode="json")
    for bad in ("GPU 1", "x" * 97, 7):
        doc["devices"] = [bad]
        with pytest.raises(ValidationError):
            ProbeResult.model_validate(doc)
