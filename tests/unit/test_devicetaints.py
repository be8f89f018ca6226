"""Per-device quarantine decisions, row by row (domain/devicetaints.py)."""

from __future__ import annotations

import re

import pytest

from sdcguard.api import Finding, Quarantine, QuarantineScope
from sdcguard.domain.devicetaints import (
    NodeDevices,
    ScopeReason,
    SeenRule,
    SliceDevice,
    choose_scope,
    ownership,
    plan_rules,
    rule_name,
    wanted_rules,
)

DRIVER = "gpu.nvidia.com"


def _gpus(n: int, pool: str = "node-a") -> tuple[SliceDevice, ...]:
    return tuple(SliceDevice(DRIVER, pool, f"gpu-{i}", f"GPU-{i:04d}-uuid") for i in range(n))


def _finding(device: int | None, check: str = "compute") -> Finding:
    return Finding(test="node-a-3", check=check, odd_device=device)


DEVICE = Quarantine(scope=QuarantineScope.DEVICE)
EIGHT = NodeDevices(served=True, devices=_gpus(8))


def test_node_is_the_default_scope() -> None:
    assert Quarantine().scope == QuarantineScope.NODE
    choice = choose_scope(Quarantine(), [_finding(3)], EIGHT)
    assert (choice.scope, choice.reason) == (QuarantineScope.NODE, ScopeReason.POLICY_SCOPE_NODE)


@pytest.mark.parametrize(
    ("findings", "devices", "reason"),
    [
        ([_finding(3)], NodeDevices(served=False), ScopeReason.NOT_SERVED),
        ([_finding(None, "collective")], EIGHT, ScopeReason.NOT_PINNED),
        ([_finding(3), _finding(None, "memory")], EIGHT, ScopeReason.NOT_PINNED),
        ([], EIGHT, ScopeReason.NOT_PINNED),  # a manual quarantine names nothing
        ([_finding(3)], NodeDevices(served=True), ScopeReason.NO_SLICES),
        ([_finding(9)], EIGHT, ScopeReason.NOT_PUBLISHED),
        ([_finding(i) for i in range(5)], EIGHT, ScopeReason.TOO_MANY),
    ],
)
def test_fallbacks_to_the_whole_node(
    findings: list[Finding], devices: NodeDevices, reason: ScopeReason
) -> None:
    choice = choose_scope(DEVICE, findings, devices)
    assert choice.scope == QuarantineScope.NODE
    assert choice.reason == reason
    assert choice.devices == ()
    assert "whole node" in choice.message


def test_an_unknown_index_names_what_the_slices_publish() -> None:
    choice = choose_scope(DEVICE, [_finding(9)], EIGHT)
    assert "gpu-9" in choice.message and "gpu-0" in choice.message


def test_one_named_device_is_tainted_alone() -> None:
    choice = choose_scope(DEVICE, [_finding(3), _finding(3, "golden")], EIGHT)
    assert (choice.scope, choice.reason) == (QuarantineScope.DEVICE, ScopeReason.DEVICE_TAINTED)
    assert [(p.index, p.device.name, p.device.uuid) for p in choice.devices] == [
        (3, "gpu-3", "GPU-0003-uuid")
    ]


def test_up_to_the_policy_share_is_device_scope() -> None:
    four = [_finding(i) for i in (1, 2, 5, 6)]
    assert choose_scope(DEVICE, four, EIGHT).scope == QuarantineScope.DEVICE
    strict = Quarantine(scope=QuarantineScope.DEVICE, max_device_fraction=0.125)
    assert choose_scope(strict, four[:1], EIGHT).scope == QuarantineScope.DEVICE
    assert choose_scope(strict, four[:2], EIGHT).reason == ScopeReason.TOO_MANY


def test_an_ambiguous_device_name_is_not_guessed() -> None:
    two_pools = NodeDevices(served=True, devices=_gpus(2, "a") + _gpus(2, "b"))
    assert choose_scope(DEVICE, [_finding(1)], two_pools).reason == ScopeReason.NOT_PUBLISHED


def test_rule_names_are_deterministic_valid_and_bounded() -> None:
    dns = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    a = rule_name("node-a", "GPU-0003-uuid")
    assert a == rule_name("node-a", "GPU-0003-uuid")
    assert a != rule_name("node-b", "GPU-0003-uuid")
    assert a != rule_name("node-a", "GPU-0004-uuid")
    long = rule_name("n" * 253, "GPU-" + "f" * 100)
    for name in (a, long, rule_name("x", "!!!")):
        assert dns.match(name) and len(name) <= 253


def _seen(
    want_name: str,
    device: SliceDevice,
    *,
    owned: bool = True,
    node: str = "node-a",
    effect: str = "NoSchedule",
) -> SeenRule:
    return SeenRule(want_name, device.driver, device.pool, device.name, effect, owned, node)


def test_two_failures_naming_one_device_want_one_rule() -> None:
    gpu = EIGHT.devices[3]
    wanted = wanted_rules("node-a", "t-1", "compute", "NoSchedule", [gpu, gpu])
    assert len(wanted) == 1
    plan = plan_rules(wanted, [], "node-a", prune=False)
    assert [w.name for w in plan.create] == [wanted[0].name]
    again = plan_rules(wanted, [_seen(wanted[0].name, gpu)], "node-a", prune=False)
    assert again.empty


def test_a_renamed_device_keeps_its_rule_with_a_new_selector() -> None:
    gpu = EIGHT.devices[3]
    wanted = wanted_rules("node-a", "t-1", "compute", "NoSchedule", [gpu])
    # the driver restarted: the same GPU (same UUID) is now gpu-7 in a new pool
    moved = SliceDevice(DRIVER, "node-a-gen2", "gpu-7", gpu.uuid)
    published = NodeDevices(served=True, devices=(moved,))
    rewanted = wanted_rules("node-a", "t-1", "compute", "NoSchedule", [gpu], published)
    assert rewanted[0].name == wanted[0].name
    plan = plan_rules(rewanted, [_seen(wanted[0].name, gpu)], "node-a", prune=False)
    assert plan.create == () and [u.device for u in plan.update] == [moved]


def test_a_device_no_longer_published_keeps_its_rule() -> None:
    gpu = EIGHT.devices[3]
    gone = NodeDevices(served=True, devices=())
    wanted = wanted_rules("node-a", "t-1", "compute", "NoSchedule", [gpu], gone)
    plan = plan_rules(wanted, [_seen(wanted[0].name, gpu)], "node-a", prune=True)
    assert plan.empty  # kept: removing it would return a bad GPU when its driver comes back


def test_a_changed_effect_updates_our_rule() -> None:
    gpu = EIGHT.devices[3]
    wanted = wanted_rules("node-a", "t-1", "compute", "NoExecute", [gpu])
    plan = plan_rules(wanted, [_seen(wanted[0].name, gpu)], "node-a", prune=False)
    assert [u.effect for u in plan.update] == ["NoExecute"]


def test_someone_elses_rules_are_never_written() -> None:
    gpu = EIGHT.devices[3]
    wanted = wanted_rules("node-a", "t-1", "compute", "NoSchedule", [gpu])
    theirs_same_device = _seen("ops-gpu3", gpu, owned=False)
    theirs_same_name = _seen(wanted[0].name, gpu, owned=False)
    plan = plan_rules(wanted, [theirs_same_device], "node-a", prune=True)
    assert [w.name for w in plan.create] == [wanted[0].name]
    assert plan.delete == () and plan.foreign == ("ops-gpu3",)
    clash = plan_rules(wanted, [theirs_same_name], "node-a", prune=True)
    assert clash.create == () and clash.update == () and clash.delete == ()
    assert clash.conflicts == (wanted[0].name,)


def test_release_deletes_only_this_nodes_rules_of_ours() -> None:
    gpu = EIGHT.devices[3]
    ours = _seen("sdcguard-node-a-x", gpu)
    other_node = _seen("sdcguard-node-b-x", gpu, node="node-b")
    theirs = _seen("ops-gpu3", gpu, owned=False)
    plan = plan_rules([], [ours, other_node, theirs], "node-a", prune=True)
    assert plan.delete == ("sdcguard-node-a-x",)
    assert plan_rules([], [ours], "node-a", prune=False).empty


def test_ownership_marks_name_the_ticket_and_the_reason() -> None:
    gpu = EIGHT.devices[3]
    (rule,) = wanted_rules("node-a", "node-a-1f2e3-4", "compute on gpu-3", "NoSchedule", [gpu])
    marks = ownership(rule)
    assert marks.labels == {
        "app.kubernetes.io/managed-by": "sdcguard",
        "sdcguard.dev/node": "node-a",
    }
    assert marks.annotations["sdcguard.dev/ticket"] == "node-a-1f2e3-4"
    assert marks.annotations["sdcguard.dev/reason"] == "compute on gpu-3"
    assert marks.annotations["sdcguard.dev/device-uuid"] == gpu.uuid


def test_the_probes_uuids_match_devices_whatever_their_names() -> None:
    # The probe's device 0 is the GPU the driver names gpu-5 (container order is not
    # minor order): its reported UUID decides, not the name.
    uuids = tuple(f"gpu-{i:04d}-UUID" for i in (5, 1, 2, 3, 4, 0, 6, 7))  # any case
    choice = choose_scope(DEVICE, [_finding(0)], EIGHT, uuids)
    assert choice.scope == QuarantineScope.DEVICE
    assert [(p.index, p.device.name) for p in choice.devices] == [(0, "gpu-5")]


def test_an_unknown_or_missing_uuid_is_not_guessed_from_the_name() -> None:
    unknown = choose_scope(DEVICE, [_finding(1)], EIGHT, ("GPU-0000-uuid", "GPU-dead"))
    assert unknown.reason == ScopeReason.NOT_PUBLISHED and "GPU-dead" in unknown.message
    missing = choose_scope(DEVICE, [_finding(1)], EIGHT, ("GPU-0000-uuid", ""))
    assert missing.reason == ScopeReason.NOT_PUBLISHED and "no UUID reported" in missing.message
    beyond = choose_scope(DEVICE, [_finding(3)], EIGHT, ("GPU-0000-uuid",))
    assert beyond.reason == ScopeReason.NOT_PUBLISHED
