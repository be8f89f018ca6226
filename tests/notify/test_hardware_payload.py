"""The hardware history in ticket events, against a real HTTP server on 127.0.0.1: the
repair cycles before the ticket and its SDCHardware records reach webhook and Jira
receivers in the documented shape, bounded, and with the same bytes on every attempt
of one event even while the records change."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from typing import Any

from kubernetes import client

from sdcguard.adapters import notify, ticket_sinks
from sdcguard.adapters.hardware import HardwareRecord
from sdcguard.adapters.kube import KubeWriter
from sdcguard.api import (
    FailureKind,
    HardwareFailure,
    HardwareIdentity,
    IdentityKind,
    RepairTicket,
    Retirement,
    SDCHardwareSpec,
    SDCHardwareStatus,
    SDCPolicy,
    SeenAs,
    TicketPhase,
    UntrustedId,
    to_body,
)
from sdcguard.api.ticket import MAX_HISTORY_RECORDS, MAX_LAST_FAILURES
from sdcguard.domain.hardware import record_name
from sdcguard.metrics import Metrics
from tests.notify.test_notify import LOOPBACK_RECEIVER, NOW, Receiver, Reply, Seen, make_ticket

PROVIDER = "aws:///us-east-1a/i-0abc"
GPU = "GPU-2222"
HOUR = dt.timedelta(hours=1)


class _Writer(KubeWriter):
    """Records the status patches instead of sending them."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.statuses: list[dict[str, Any]] = []

    def patch_custom_status(self, plural: str, name: str, status: dict[str, Any]) -> None:
        self.statuses.append(status)


def _policy(url: str, window: str = "720h") -> SDCPolicy:
    return SDCPolicy.model_validate(
        {
            "metadata": {"name": "default"},
            "spec": {
                "repair": {
                    "maxRepairCycles": 3,
                    "repairCycleWindow": window,
                    "ticketSinks": [{"type": "webhook", "url": url}],
                }
            },
        }
    )


def _failure(at: dt.datetime, node: str, ticket: str, kind: FailureKind) -> HardwareFailure:
    return HardwareFailure(time=at, kind=kind, node=node, ticket=ticket, test=f"{ticket}-t")


def _record(kind: IdentityKind, value: str, failures: list[HardwareFailure]) -> HardwareRecord:
    name = record_name(kind, value)
    seen = [
        SeenAs(node=f.node, first_seen=f.time, last_seen=f.time)
        for f in {f.node: f for f in failures}.values()
    ][-16:]
    status = SDCHardwareStatus(
        failures=failures, total_failures=len(failures), nodes=seen, last_node=seen[-1].node
    )
    return HardwareRecord(name, SDCHardwareSpec(kind=kind, id=value), status)


def _history_ticket(
    phase: TicketPhase = TicketPhase.OPEN, devices: tuple[str, ...] = ("GPU-1111", GPU)
) -> dict[str, Any]:
    """The second ticket of a host: its first failure under Node gpu-node-3, 40 days ago
    (outside the window), the second under gpu-node-5 ten days ago; this one opened now."""
    ticket = make_ticket(phase=phase, cycle=2)
    ticket.spec.hardware = HardwareIdentity(
        provider_id=PROVIDER,
        device_ids=list(devices),
        records=[record_name(IdentityKind.PROVIDER_ID, PROVIDER)],
        cycles_before=1,
        untrusted=[
            UntrustedId(kind=IdentityKind.MACHINE_ID, value="", reason="empty"),
        ],
    )
    return to_body(ticket)


def _records() -> dict[str, HardwareRecord]:
    host = [
        _failure(NOW - 40 * 24 * HOUR, "gpu-node-3", "gpu-node-3-1", FailureKind.QUARANTINED),
        _failure(NOW - 10 * 24 * HOUR, "gpu-node-5", "gpu-node-5-1", FailureKind.QUARANTINED),
        _failure(NOW, "gpu-node-7", "gpu-node-7-1", FailureKind.QUARANTINED),
    ]
    gpu = [_failure(NOW, "gpu-node-7", "gpu-node-7-1", FailureKind.QUARANTINED)]
    found = [
        _record(IdentityKind.PROVIDER_ID, PROVIDER, host),
        _record(IdentityKind.DEVICE, GPU, gpu),
    ]
    return {r.name: r for r in found}


def _announce(
    url: str, body: dict[str, Any], records: dict[str, HardwareRecord], when: dt.datetime
) -> tuple[str, _Writer]:
    writer = _Writer(api=client.ApiClient(), metrics=Metrics())
    outcome = ticket_sinks.announce(
        RepairTicket.model_validate(body),
        _policy(url),
        writer,
        Metrics(),
        when,
        records=records.get,
        sleep=lambda _: None,
        addresses=LOOPBACK_RECEIVER,
    )
    return outcome, writer


def test_a_webhook_receives_the_cycles_before_and_the_records(
    receiver: Callable[[Callable[[Seen], Reply]], Receiver],
) -> None:
    rec = receiver(lambda _: (200, {}, b""))
    outcome, _ = _announce(rec.url + "/sdc", _history_ticket(), _records(), NOW)
    assert outcome == "delivered"
    sent = rec.seen[-1].json()["ticket"]
    assert sent["hardware"]["untrusted"] == [{"kind": "MachineID", "value": "", "reason": "empty"}]
    history = sent["hardwareHistory"]
    assert history["cyclesBefore"] == 1
    assert (history["repairCycleWindow"], history["maxRepairCycles"]) == ("720h", 3)
    assert history["recordsDropped"] == 0
    host, gpu = history["records"]
    assert host == {
        "name": record_name(IdentityKind.PROVIDER_ID, PROVIDER),
        "kind": "ProviderID",
        "id": PROVIDER,
        "totalFailures": 3,
        "failuresInWindow": 2,  # the one 40 days ago is outside 720h
        "lastFailures": [
            {
                "time": "2025-01-20T12:00:00Z",
                "kind": "Quarantined",
                "node": "gpu-node-3",
                "ticket": "gpu-node-3-1",
                "test": "gpu-node-3-1-t",
            },
            {
                "time": "2025-02-19T12:00:00Z",
                "kind": "Quarantined",
                "node": "gpu-node-5",
                "ticket": "gpu-node-5-1",
                "test": "gpu-node-5-1-t",
            },
            {
                "time": "2025-03-01T12:00:00Z",
                "kind": "Quarantined",
                "node": "gpu-node-7",
                "ticket": "gpu-node-7-1",
                "test": "gpu-node-7-1-t",
            },
        ],
        "nodes": ["gpu-node-3", "gpu-node-5", "gpu-node-7"],
        "retired": None,
    }
    # The GPU's record is found by the UUID the ticket lists; GPU-1111 has none.
    assert (gpu["kind"], gpu["id"], gpu["totalFailures"]) == ("Device", GPU, 1)


def test_every_attempt_of_one_event_sends_the_same_history_while_records_change(
    receiver: Callable[[Callable[[Seen], Reply]], Receiver],
) -> None:
    rec = receiver(lambda _: (503, {}, b""))
    url = rec.url + "/sdc"
    # First attempt: the host's record is not in the index yet (its write came later).
    records = _records()
    del records[record_name(IdentityKind.PROVIDER_ID, PROVIDER)]
    first, writer = _announce(url, _history_ticket(), records, NOW)
    assert first == "retry"
    note = writer.statuses[-1]["notification"]
    assert len(note["hardwareHistory"]["records"]) == 1
    # Then the record arrives, and a later failure and a retirement are recorded too.
    records = _records()
    later = records[record_name(IdentityKind.PROVIDER_ID, PROVIDER)]
    assert later.status is not None
    later.status.failures.append(
        _failure(NOW + HOUR, "gpu-node-7", "gpu-node-7-1", FailureKind.VERIFICATION_FAILED)
    )
    later.status.retired = Retirement(time=NOW + HOUR, node="gpu-node-7")
    body = _history_ticket()
    body["status"]["notification"] = note
    again, _ = _announce(url, body, records, NOW + 2 * HOUR)
    assert again == "retry"
    assert len(rec.seen) >= 2 and len({s.body for s in rec.seen}) == 1, "same bytes per key"
    # Without the kept history (an operator before this field), the same moment is
    # rebuilt from the records as they stood then: the later failure is not told.
    fresh, _ = _announce(url, _history_ticket(), records, NOW + 2 * HOUR)
    assert fresh == "retry"
    host = rec.seen[-1].json()["ticket"]["hardwareHistory"]["records"][0]
    assert host["totalFailures"] == 3 and host["retired"] is None
    assert [f["kind"] for f in host["lastFailures"]] == ["Quarantined"] * 3
    # The next event (the ticket closes, an hour later) is a new key: it tells the new state.
    closing = _history_ticket(phase=TicketPhase.CLOSED)
    closing["status"]["history"] = [
        {"time": "2025-03-01T14:00:00Z", "phase": "Closed", "message": "verified"}
    ]
    closing["status"]["notification"] = note
    closed, _ = _announce(url, closing, records, NOW + 3 * HOUR)
    assert closed == "retry"
    sent = rec.seen[-1].json()
    assert sent["event"] == "ticket.closed"
    host = sent["ticket"]["hardwareHistory"]["records"][0]
    assert host["totalFailures"] == 4 and host["retired"] == "2025-03-01T13:00:00Z"
    assert host["lastFailures"][-1]["kind"] == "VerificationFailed"


def test_the_history_is_bounded_at_its_limits(
    receiver: Callable[[Callable[[Seen], Reply]], Receiver],
) -> None:
    rec = receiver(lambda _: (200, {}, b""))
    devices = [f"GPU-{i:04d}-{'x' * 240}" for i in range(64)]
    long_name = "n" * 240
    many = [
        _failure(
            NOW - i * HOUR, f"{i:03d}-{long_name}", f"t{i:03d}-{'k' * 240}", FailureKind.QUARANTINED
        )
        for i in range(32, 0, -1)
    ]
    records = {
        r.name: r
        for r in (
            _record(IdentityKind.PROVIDER_ID, PROVIDER, many),
            *(_record(IdentityKind.DEVICE, d, many) for d in devices),
        )
    }
    body = _history_ticket(devices=tuple(devices))
    outcome, writer = _announce(rec.url + "/sdc", body, records, NOW)
    assert outcome == "delivered"
    history = rec.seen[-1].json()["ticket"]["hardwareHistory"]
    assert len(history["records"]) == MAX_HISTORY_RECORDS
    assert history["recordsDropped"] == 65 - MAX_HISTORY_RECORDS
    assert history["records"][0]["kind"] == "ProviderID", "host records first"
    assert all(len(r["lastFailures"]) == MAX_LAST_FAILURES for r in history["records"])
    assert all(r["totalFailures"] == 32 for r in history["records"])
    # Every field at its longest: the kept history stays a small part of the ticket.
    kept = json.dumps(writer.statuses[-1]["notification"]["hardwareHistory"])
    assert len(kept) < 48 * 1024
    assert len(rec.seen[-1].body) < 512 * 1024


def test_a_jira_issue_tells_the_hardware_history() -> None:
    records = _records()
    ticket = make_ticket(cycle=2)
    ticket.spec.hardware = HardwareIdentity.model_validate(_history_ticket()["spec"]["hardware"])
    from sdcguard.adapters.hardware import ticket_history

    policy = _policy("http://127.0.0.1:1/unused")
    history = ticket_history(ticket, policy.spec.repair, records.get, NOW)
    payload = notify.build_payload(ticket, api_server="https://kube:6443", now=NOW, history=history)
    text = json.dumps(notify.adf_document(payload))
    assert "1 repair cycle(s) before this ticket within 720h (maxRepairCycles 3)" in text
    assert f"ProviderID {PROVIDER}: 3 failure(s), 2 in the window" in text
    assert "seen as gpu-node-3, gpu-node-5, gpu-node-7" in text
    assert f"Device {GPU}: 1 failure(s)" in text
    assert "MachineID '': empty" in text
    # Without a history (no records known) the ticket's own count is still told.
    plain = notify.build_payload(ticket, api_server="https://kube:6443", now=NOW)
    assert plain["ticket"]["hardwareHistory"] == {
        "cyclesBefore": 1,
        "repairCycleWindow": "",
        "maxRepairCycles": 0,
        "records": [],
        "recordsDropped": 0,
    }
