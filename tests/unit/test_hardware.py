"""Hardware identity and history (domain.hardware) and the decisions that read it."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
from typing import TypeVar

import pytest

from sdcguard.api import (
    FailureKind,
    HardwareFailure,
    HardwareIdentity,
    IdentityKind,
    ScreeningReason,
    SDCHardwareSpec,
    SDCHardwareStatus,
    Suite,
    Verdict,
    parse_duration,
)
from sdcguard.api.hardware import MAX_FAILURES, MAX_NODES
from sdcguard.domain import keys
from sdcguard.domain.budgets import PoolUsage
from sdcguard.domain.decide import Decision, decide
from sdcguard.domain.hardware import (
    HardwareFacts,
    candidates,
    counted,
    hardware_facts,
    hardware_history,
    holder_key,
    identify,
    placeholder_reason,
    record_name,
    record_summary,
    seen_under,
    ticket_records,
    updated,
)
from sdcguard.domain.lifecycle import (
    AddTaint,
    CreateTest,
    CreateTicket,
    Event,
    NodeState,
    RecordHardware,
    Retire,
    TaintRole,
)
from sdcguard.domain.plan import OpenTicketStatus
from tests.unit.factories import HOUR, NOW, node, policy, sdctest, ticket
from tests.unit.test_decide import observe, one, only

S, E = NodeState, Event
A = TypeVar("A")
DAY = dt.timedelta(days=1)
ROOMY = PoolUsage(nodes=100)
NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def failure(at: dt.datetime, ticket_name: str = "t1", kind: FailureKind = FailureKind.QUARANTINED):
    return HardwareFailure(time=at, kind=kind, node="gpu-1", ticket=ticket_name, test="s1")


# Identity -------------------------------------------------------------------------


def test_trusted_identifiers_key_records_with_valid_stable_names() -> None:
    ids = candidates("aws:///us-east-1a/i-0abc", "EC2A-1234-5678", "f00dfeed", ["GPU-1", "GPU-1"])
    identity = identify("gpu-1", ids, {})
    assert [i.kind for i in identity.trusted] == [
        IdentityKind.PROVIDER_ID,
        IdentityKind.SYSTEM_UUID,
        IdentityKind.MACHINE_ID,
        IdentityKind.DEVICE,
    ], "a device named twice is one identifier"
    assert identity.untrusted == ()
    for name in identity.records:
        assert NAME.match(name) and len(name) <= 63
    # The same hardware read with other case or spaces is the same record.
    assert record_name(IdentityKind.SYSTEM_UUID, " ec2a-1234-5678 ") == identity.records[1]
    assert record_name(IdentityKind.MACHINE_ID, "EC2A-1234-5678") != identity.records[1]


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("00000000-0000-0000-0000-000000000000", "placeholder"),
        ("FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF", "placeholder"),
        ("Not Settable", "placeholder"),
        ("To Be Filled By O.E.M.", "placeholder"),
        ("03000200-0400-0500-0006-000700080009", "placeholder"),
        ("11111111111111111111111111111111", "placeholder"),
    ],
)
def test_empty_and_placeholder_ids_are_never_trusted(value: str, why: str) -> None:
    reason = placeholder_reason(value)
    assert reason is not None and why in reason
    identity = identify("gpu-1", [(IdentityKind.SYSTEM_UUID, value)], {})
    assert identity.trusted == ()
    assert identity.untrusted[0].kind == IdentityKind.SYSTEM_UUID
    assert why in identity.untrusted[0].reason


def test_an_id_two_nodes_hold_is_not_trusted_and_names_the_other_node() -> None:
    shared = "aws:///us-east-1a/i-0dup"
    holders = {
        holder_key(IdentityKind.PROVIDER_ID, shared): ("gpu-1", "gpu-2"),
        holder_key(IdentityKind.SYSTEM_UUID, "uuid-1"): ("gpu-1",),
    }
    one_ = identify("gpu-1", candidates(shared, "uuid-1", ""), holders)
    two = identify("gpu-2", candidates(shared, "uuid-2", ""), holders)
    assert [i.value for i in one_.trusted] == ["uuid-1"]
    assert [i.value for i in two.trusted] == ["uuid-2"]
    assert set(one_.records).isdisjoint(two.records), "never one record for two nodes"
    (note,) = [u for u in one_.untrusted if u.kind == IdentityKind.PROVIDER_ID]
    assert "shared with Node gpu-2" in note.reason
    many = {holder_key(IdentityKind.PROVIDER_ID, shared): tuple(f"n{i}" for i in range(9))}
    (note,) = [u for u in identify("n0", [(IdentityKind.PROVIDER_ID, shared)], many).untrusted]
    assert "n1, n2, n3 and 5 more" in note.reason and len(note.reason) <= 256


def test_a_node_with_no_trusted_id_keys_nothing() -> None:
    identity = identify("gpu-1", candidates("", "Not Settable", ""), {})
    assert identity.trusted == () and identity.records == ()
    reasons = [u.reason for u in identity.untrusted]
    assert reasons[0] == reasons[2] == "empty" and "placeholder" in reasons[1]
    assert hardware_facts(identity, {}, NOW, 0) is None


# History --------------------------------------------------------------------------


def test_a_failure_is_recorded_once_and_a_known_sighting_writes_nothing() -> None:
    first = updated(None, node="gpu-1", uid="u1", now=NOW, failure=failure(NOW))
    assert first is not None and first.total_failures == 1 and first.last_node == "gpu-1"
    again = updated(first, node="gpu-1", uid="u1", now=NOW + HOUR, failure=failure(NOW))
    assert again is None, "the same decision repeated after a crash adds nothing"
    assert updated(first, node="gpu-1", uid="u1", now=NOW + HOUR) is None
    renamed = updated(first, node="gpu-9", uid="u9", now=NOW + HOUR)
    assert renamed is not None
    assert [s.node for s in renamed.nodes] == ["gpu-1", "gpu-9"]
    assert renamed.last_node == "gpu-9" and renamed.total_failures == 1


def _history_of(failures: int, *, retire_last: bool = True) -> SDCHardwareStatus:
    """A record with ``failures`` failures an hour apart, each under a new Node gpu-<i>
    (ticket t<i>), retired at the last one unless told not to."""
    status: SDCHardwareStatus | None = None
    for i in range(failures):
        status = updated(
            status,
            node=f"gpu-{i}",
            uid=f"u{i}",
            now=NOW + i * HOUR,
            failure=failure(NOW + i * HOUR, ticket_name=f"t{i}"),
            retire="out of cycles" if retire_last and i == failures - 1 else None,
        )
    assert status is not None
    return status


def test_history_is_bounded_and_keeps_counting() -> None:
    status = _history_of(MAX_FAILURES + 10, retire_last=False)
    assert len(status.failures) == MAX_FAILURES and status.total_failures == MAX_FAILURES + 10
    assert status.failures[0].ticket == "t10", "the oldest failures go first"
    assert len(status.nodes) == MAX_NODES and status.nodes[-1].node == f"gpu-{MAX_FAILURES + 9}"
    # Well under the API server's object limit (1.5 MiB) at the bound.
    size = len(json.dumps(status.model_dump(mode="json", by_alias=True)))
    assert size < 16_000, size
    SDCHardwareStatus.model_validate(status.model_dump(mode="json", by_alias=True))


def test_cycles_count_within_the_window_and_the_largest_record_wins() -> None:
    window = parse_duration("720h")
    old = failure(NOW - 40 * DAY, "t0")
    recent = [failure(NOW - 3 * DAY, "t1"), failure(NOW - DAY, "t2")]
    host = SDCHardwareStatus(failures=[old, *recent], total_failures=3)
    assert counted(host, NOW, window) == 2
    assert counted(host, NOW, 0) == 3, "window 0: forever"
    identity = identify("gpu-1", candidates("p-1", "s-1", ""), {})
    provider, system = identity.records
    # The same failures on both records: counted once, not twice.
    facts = hardware_facts(identity, {provider: host, system: host}, NOW, window)
    assert facts is not None and (facts.cycles, facts.failures) == (2, 3)
    partial = SDCHardwareStatus(failures=recent[:1], total_failures=1)
    facts = hardware_facts(identity, {provider: partial, system: host}, NOW, window)
    assert facts is not None and facts.cycles == 2


def test_retirement_is_kept_with_a_condition() -> None:
    status = updated(
        None,
        node="gpu-1",
        uid="u1",
        now=NOW,
        failure=failure(NOW, kind=FailureKind.RETIRED),
        retire="out of repair cycles",
    )
    assert status is not None and status.retired is not None
    assert status.retired.message == "out of repair cycles"
    (cond,) = status.conditions
    assert (cond.type, cond.status, cond.reason) == ("Retired", "True", "OutOfRepairCycles")
    identity = identify("gpu-2", candidates("p-1", "", ""), {})
    facts = hardware_facts(identity, {identity.records[0]: status}, NOW, 0)
    assert facts is not None and facts.retired and "gpu-1" in facts.retired
    assert facts.known_as == ("gpu-1",)


# Decisions --------------------------------------------------------------------------

KNOWN = HardwareFacts(records=("provider-x",), cycles=1, failures=1, known_as=("old-1",))


def test_recognised_hardware_joins_through_repair_verification() -> None:
    d = decide(observe(node("new-1"), hardware=KNOWN), policy(), NOW)
    assert (d.event, d.state) == (E.REJOINED, S.TESTING)
    test = one(d, CreateTest)
    assert (test.suite, test.reason) == (Suite.REPAIR_VERIFICATION, ScreeningReason.JOIN)
    assert {a.role for a in only(d, AddTaint)} == {TaintRole.GATE, TaintRole.TESTING}
    assert one(d, RecordHardware).failure is None, "a sighting under the new name"
    assert "seen as old-1" in d.note


def test_unknown_hardware_joins_through_acceptance() -> None:
    d = decide(observe(node("new-1")), policy(), NOW)
    assert one(d, CreateTest).suite == Suite.ACCEPTANCE
    assert not only(d, RecordHardware), "a healthy node writes no history"


def test_retired_hardware_is_retired_again_at_once() -> None:
    gone = HardwareFacts(records=("provider-x",), failures=3, retired="retired as old-1: done")
    d = decide(observe(node("new-1"), hardware=gone), policy(), NOW)
    assert (d.event, d.state) == (E.HARDWARE_RETIRED, S.RETIRED)
    assert not only(d, CreateTest)
    assert {a.role for a in only(d, AddTaint)} == {TaintRole.QUARANTINE}
    # even a busy node seen for the first time: it must not take more work
    d = decide(observe(node("new-2"), hardware=gone, idle_since=None), policy(), NOW)
    assert d.state == S.RETIRED


def failing(hardware: HardwareFacts | None, max_cycles: int = 2) -> Decision:
    p = policy(repair={"maxRepairCycles": max_cycles}, confirmation={"reruns": 0})
    n = node(state=S.TESTING, annotations={keys.CURRENT_TEST: "s1"}, qualified_at=NOW - DAY)
    test = sdctest("s1", verdict=Verdict.SDC, failed=("golden",))
    return decide(observe(n, test=test, hardware=hardware), p, NOW)


def test_a_failure_within_the_cycles_quarantines_and_counts_on() -> None:
    d = failing(KNOWN)
    assert (d.event, d.state) == (E.TEST_FAILED, S.QUARANTINED)
    created = one(d, CreateTicket)
    assert (created.cycle, created.retired) == (2, False), "cycle 2: the host's second"
    rec = one(d, RecordHardware)
    assert (rec.failure, rec.test, rec.ticket) == (FailureKind.QUARANTINED, "s1", created.name)
    d = failing(None)
    assert one(d, CreateTicket).cycle == 1


def test_a_failure_past_the_cycles_retires_with_a_ticket_born_retired() -> None:
    used = HardwareFacts(records=("provider-x",), cycles=2, failures=2, known_as=("old-1",))
    d = failing(used, max_cycles=2)
    assert (d.event, d.state) == (E.REPAIR_CYCLES_EXCEEDED, S.RETIRED)
    created = one(d, CreateTicket)
    assert (created.cycle, created.retired) == (3, True)
    rec = one(d, RecordHardware)
    assert (rec.failure, rec.retire, rec.ticket) == (FailureKind.RETIRED, True, created.name)
    assert one(d, Retire).name == "", "the ticket is born Retired; nothing to move"
    (opened,) = [s for s in d.plan.steps if isinstance(s, OpenTicketStatus)]
    assert (opened.cycle, opened.retired) == (3, True)
    assert "used 2 of 2 repair cycles within 720h" in d.note


def test_verification_counts_the_cycles_of_earlier_tickets() -> None:
    p = policy(repair={"maxRepairCycles": 2})
    n = node(state=S.VERIFYING, annotations={keys.CURRENT_TEST: "v1"})
    test = sdctest(
        "v1",
        suite=Suite.REPAIR_VERIFICATION,
        reason=ScreeningReason.REPAIR_VERIFICATION,
        verdict=Verdict.SDC,
    )
    fresh = decide(observe(n, ticket=ticket(cycle=1), test=test), p, NOW)
    assert fresh.event == E.VERIFICATION_FAILED
    assert one(fresh, RecordHardware).failure == FailureKind.VERIFICATION_FAILED
    used = HardwareFacts(records=("provider-x",), cycles=2, failures=2)
    d = decide(observe(n, ticket=ticket(cycle=1), test=test, hardware=used), p, NOW)
    assert (d.event, d.state) == (E.REPAIR_CYCLES_EXCEEDED, S.RETIRED)
    assert one(d, RecordHardware).retire


def test_observe_mode_writes_no_history() -> None:
    p = policy(mode="Observe")
    d = decide(observe(node("new-1"), hardware=KNOWN), p, NOW)
    assert d.event == E.REJOINED
    assert not only(d, RecordHardware) and any(isinstance(a, RecordHardware) for a in d.suppressed)


# Devices ----------------------------------------------------------------------------


def test_the_failed_tests_odd_device_is_named_by_its_uuid() -> None:
    from sdcguard.adapters.hardware import latest_devices, odd_devices
    from sdcguard.api import Finding
    from sdcguard.domain.observed import TestFacts

    ids = ("GPU-a", "", "GPU-c")
    test = TestFacts(
        name="s1",
        suite=Suite.REQUALIFICATION,
        reason=ScreeningReason.RETURN_FROM_USE,
        device_ids=ids,
        findings=(
            Finding(test="s1", check="golden", odd_device=2),
            Finding(test="s1", check="compute", odd_device=2),
            Finding(test="s1", check="memory", odd_device=1),  # unnamed: no record
            Finding(test="s1", check="collective", odd_device=7),  # out of range
            Finding(test="s1", check="collective"),
        ),
    )
    assert odd_devices(test) == ("GPU-c",)
    older = dataclasses.replace(test, name="s0", device_ids=("GPU-old",))
    plain = dataclasses.replace(test, name="s2", device_ids=())
    assert latest_devices([(NOW - HOUR, older), (NOW, test), (NOW + HOUR, plain)]) == (
        "GPU-a",
        "GPU-c",
    )


def test_a_gpu_brings_its_history_into_another_host() -> None:
    window = parse_duration("720h")
    gpu = record_name(IdentityKind.DEVICE, "GPU-c")
    moved = SDCHardwareStatus(failures=[failure(NOW - DAY)], total_failures=1)
    new_host = identify("host-2", candidates("p-2", "s-2", "", ["GPU-x", "GPU-c"]), {})
    facts = hardware_facts(new_host, {gpu: moved}, NOW, window)
    assert facts is not None and facts.cycles == 1 and facts.records == (gpu,)
    host_only = identify("host-2", candidates("p-2", "s-2", ""), {})
    assert hardware_facts(host_only, {gpu: moved}, NOW, window) is None


def test_a_persons_quarantine_begins_no_cycle_but_the_ticket_knows_the_history() -> None:
    n = node(state=S.QUALIFIED, annotations={keys.REQUEST_QUARANTINE: "XID storm"})
    d = decide(observe(n, hardware=KNOWN), policy(), NOW)
    assert d.event == E.MANUAL_QUARANTINE
    created = one(d, CreateTicket)
    assert (created.cycle, created.before) == (1, 1), "cycle 1 used; this one begins none"
    assert not only(d, RecordHardware)
    used = HardwareFacts(records=("provider-x",), cycles=2, failures=2)
    d = decide(observe(n, hardware=used), policy(), NOW)
    assert (one(d, CreateTicket).cycle, one(d, CreateTicket).before) == (2, 2)


def test_a_ticket_event_tells_the_history_as_of_its_time() -> None:
    status = _history_of(MAX_FAILURES + 8)  # the first 8 dropped from the list
    spec = SDCHardwareSpec(kind=IdentityKind.SYSTEM_UUID, id="4c4c4544-0042")
    last = NOW + (MAX_FAILURES + 7) * HOUR
    now = record_summary("system-x", spec, status, last, 0)
    assert now.total_failures == MAX_FAILURES + 8 and now.retired == last
    assert [f.ticket for f in now.last_failures] == [f"t{i}" for i in range(36, 40)]
    assert now.nodes == [f"gpu-{i}" for i in range(36, 40)]
    # Two hours before the last failure: the two newest failures, the Node names first
    # seen since and the retirement are not told (so a later build for that moment,
    # after more failures, tells the same).
    earlier = record_summary("system-x", spec, status, last - 2 * HOUR, 0)
    assert earlier.total_failures == MAX_FAILURES + 6 and earlier.retired is None
    assert [f.ticket for f in earlier.last_failures] == [f"t{i}" for i in range(34, 38)]
    assert earlier.nodes[-1] == "gpu-37"
    # A 3-hour window counts the failures of the last 3 hours up to that moment.
    assert record_summary("system-x", spec, status, last, 3 * 3600).failures_in_window == 4


def test_a_ticket_names_its_host_records_then_its_devices_once() -> None:
    host = record_name(IdentityKind.PROVIDER_ID, "aws:///i-1")
    hw = HardwareIdentity(records=[host], device_ids=["GPU-1", "GPU-1", " ", "GPU-2"])
    assert ticket_records(hw) == [
        host,
        record_name(IdentityKind.DEVICE, "GPU-1"),
        record_name(IdentityKind.DEVICE, "GPU-2"),
    ]
    gpu2 = record_name(IdentityKind.DEVICE, "GPU-2")
    spec = SDCHardwareSpec(kind=IdentityKind.DEVICE, id="GPU-2")
    history = hardware_history(
        hw.model_copy(update={"cycles_before": 1}),
        {gpu2: (spec, _history_of(1))},
        at=NOW,
        window="720h",
        window_seconds=parse_duration("720h"),
        max_cycles=2,
    )
    assert [r.name for r in history.records] == [gpu2], "only records that exist"
    assert (history.cycles_before, history.records_dropped) == (1, 0)


def test_a_node_is_seen_again_only_under_a_new_name_or_uid() -> None:
    status = _history_of(1)
    assert seen_under(status, "gpu-0", "u0") and seen_under(status, "gpu-0", "")
    assert not seen_under(status, "gpu-0", "u-recreated"), "same name, a new Node"
    assert not seen_under(status, "gpu-9", "u0")
