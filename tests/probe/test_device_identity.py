"""Device identities in the fingerprint: probe device index -> the GPU's UUID."""

from __future__ import annotations

import json

import pytest
import torch
from pydantic import ValidationError

from sdcprobe.backends import Backend
from sdcprobe.config import plan_config
from sdcprobe.fingerprint import device_uuid, visible_device_uuids
from sdcprobe.judge import build_fingerprint, judge
from sdcprobe.result import MAX_DEVICE_UUIDS, Fingerprint, parse_result
from sdcprobe.trace import CheckTrace, DeviceFacts, WorkerReport, trace_digest

CONFIG = plan_config(6, "cpu")
A, B = "GPU-0b1c2d3e-0000-1111-2222-333333333333", "GPU-9f8e7d6c-4444-5555-6666-777777777777"


def facts(uuid: str | None) -> DeviceFacts:
    return DeviceFacts(
        backend="cpu", device_model="cpu: t", torch="2.9.0", cpu_isa="x", threads=1, uuid=uuid
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
    named = build_fingerprint([facts(A)], 2, CONFIG, [A, B])
    assert plain.device_uuids == [] and named.device_uuids == [A, B]
    assert plain.hash == named.hash == named.expected_hash()
    # A fingerprint written before the field existed parses and checks out.
    old = plain.model_dump(mode="json")
    del old["device_uuids"]
    assert Fingerprint.model_validate(old).expected_hash() == plain.hash


def test_judge_maps_each_rank_to_its_workers_uuid_and_none_for_a_dead_worker() -> None:
    steps = [{"x": "1"}]
    trace = CheckTrace(digest=trace_digest(steps), steps=steps)
    reports: dict[int, WorkerReport | None] = {
        0: WorkerReport(rank=0, facts=facts(A), checks={"compute": trace}),
        1: None,
        2: WorkerReport(rank=2, facts=facts(B), checks={"compute": trace}),
    }
    result = judge(["compute"], reports, CONFIG, None, False, 1.0)
    assert result.fingerprint is not None
    assert result.fingerprint.device_uuids == [A, None, B]
    again = parse_result(result.model_dump_json())
    assert again.fingerprint is not None and again.fingerprint.device_uuids == [A, None, B]


def test_no_known_uuid_or_too_many_devices_gives_an_empty_list() -> None:
    assert build_fingerprint([facts(None)], 2, CONFIG, [None, None]).device_uuids == []
    many = [f"GPU-{i}" for i in range(MAX_DEVICE_UUIDS + 1)]
    assert build_fingerprint([facts(None)], len(many), CONFIG, many).device_uuids == []


def test_malformed_uuids_are_refused() -> None:
    doc = build_fingerprint([facts(A)], 1, CONFIG, [A]).model_dump(mode="json")
    for bad in ("", "GPU 1", "x" * 65, 7):
        doc["device_uuids"] = [bad]
        with pytest.raises(ValidationError):
            Fingerprint.model_validate(doc)
    assert json.dumps(doc)  # the document itself stays serialisable
