"""SDCHardware at its bounds: the API server takes a record at every list's limit (and
it stays far under the object size limit), and refuses one past a limit, naming it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from tests.unit.factories import HOUR, NOW

from sdcdev.harness import GROUP, VERSION, new_case
from sdcguard.api import (
    FailureKind,
    HardwareFailure,
    HardwareIdentity,
    IdentityKind,
    SDCHardwareSpec,
    SDCHardwareStatus,
    UntrustedId,
    to_body,
)
from sdcguard.api.hardware import MAX_FAILURES, MAX_NODES, MAX_UNTRUSTED
from sdcguard.api.ticket import MAX_HISTORY_RECORDS, MAX_LAST_FAILURES, MAX_LAST_NODES
from sdcguard.domain.hardware import hardware_history, record_name, updated

LONG = "x" * 253


def _full_status() -> SDCHardwareStatus:
    """What the operator's own updates make of a record hit by many failures under many
    Node names with the longest identifiers and reasons: bounded, oldest dropped."""
    notes = [
        UntrustedId(kind=IdentityKind.DEVICE, value=LONG, reason="r" * 256)
        for _ in range(MAX_UNTRUSTED)
    ]
    status: SDCHardwareStatus | None = None
    for i in range(3 * MAX_FAILURES):
        node = f"{i:03d}-" + "n" * 240
        status = updated(
            status,
            node=node,
            uid=f"{i:064d}",
            now=NOW + i * HOUR,
            untrusted=notes,
            failure=HardwareFailure(
                time=NOW + i * HOUR,
                kind=FailureKind.VERIFICATION_FAILED,
                node=node,
                ticket=LONG,
                test=LONG,
            ),
            retire="m" * 5000 if i == 3 * MAX_FAILURES - 1 else None,
        )
    assert status is not None
    return status


def _create(api: client.ApiClient, name: str, status: dict[str, Any]) -> None:
    custom = client.CustomObjectsApi(api)
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SDCHardware",
        "metadata": {"name": name},
        "spec": {"kind": "ProviderID", "id": LONG},
    }
    custom.create_cluster_custom_object(GROUP, VERSION, "sdchardwares", body)
    try:
        custom.patch_cluster_custom_object_status(
            GROUP, VERSION, "sdchardwares", name, {"status": status}
        )
    finally:
        custom.delete_cluster_custom_object(GROUP, VERSION, "sdchardwares", name)


def test_a_record_at_every_bound_is_accepted_and_small(api_client, crds) -> None:
    status = _full_status()
    assert len(status.failures) == MAX_FAILURES and len(status.nodes) == MAX_NODES
    assert status.total_failures == 3 * MAX_FAILURES
    body = to_body(status)
    size = len(json.dumps(body))
    assert size < 64 * 1024, f"{size} bytes: far under the API server's 1.5 MiB"
    _create(api_client, record_name(IdentityKind.PROVIDER_ID, new_case()), body)


def test_a_record_past_a_bound_is_refused_naming_it(api_client, crds) -> None:
    body = to_body(_full_status())
    body["failures"] = body["failures"] + body["failures"][:1]
    with pytest.raises(ApiException) as err:
        _create(api_client, record_name(IdentityKind.PROVIDER_ID, new_case()), body)
    assert err.value.status == 422
    assert "status.failures" in err.value.body and "32" in err.value.body


def _ticket_with_history(api: client.ApiClient, history: dict[str, Any]) -> dict[str, Any]:
    """A RepairTicket whose delivery status keeps ``history``, as the ticket announcer writes
    it; returns what the API server stored (the ticket is deleted afterwards)."""
    custom = client.CustomObjectsApi(api)
    name = f"bound-{new_case()}"
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "RepairTicket",
        "metadata": {"name": name},
        "spec": {"nodeName": name},
    }
    custom.create_cluster_custom_object(GROUP, VERSION, "repairtickets", body)
    try:
        custom.patch_cluster_custom_object_status(
            GROUP,
            VERSION,
            "repairtickets",
            name,
            {"status": {"notification": {"hardwareHistory": history}}},
        )
        stored: dict[str, Any] = custom.get_cluster_custom_object(
            GROUP, VERSION, "repairtickets", name
        )
        return stored
    finally:
        custom.delete_cluster_custom_object(GROUP, VERSION, "repairtickets", name)


def test_a_ticket_events_hardware_history_at_its_bounds_is_accepted_and_small(
    api_client, crds
) -> None:
    """A ticket of a host with 64 GPUs, every one with a full record at the longest
    strings: the history its events carry (and keep) stays bounded."""
    status = _full_status()
    devices = [f"GPU-{i:03d}-" + "d" * 240 for i in range(64)]
    hardware = HardwareIdentity(device_ids=devices, cycles_before=10)
    records = {
        record_name(IdentityKind.DEVICE, d): (
            SDCHardwareSpec(kind=IdentityKind.DEVICE, id=d),
            status,
        )
        for d in devices
    }
    history = hardware_history(
        hardware,
        records,
        at=NOW + 1000 * HOUR,
        window="0",
        window_seconds=0,
        max_cycles=10,
    )
    assert len(history.records) == MAX_HISTORY_RECORDS
    assert history.records_dropped == 64 - MAX_HISTORY_RECORDS
    assert all(len(r.last_failures) == MAX_LAST_FAILURES for r in history.records)
    assert all(len(r.nodes) == MAX_LAST_NODES for r in history.records)
    assert all(r.total_failures == 3 * MAX_FAILURES for r in history.records)
    body = to_body(history)
    stored = _ticket_with_history(api_client, body)
    kept = stored["status"]["notification"]["hardwareHistory"]
    assert kept == body
    size = len(json.dumps(stored))
    assert size < 64 * 1024, f"{size} bytes: far under the API server's 1.5 MiB"


def test_a_ticket_events_hardware_history_past_a_bound_is_refused_naming_it(
    api_client, crds
) -> None:
    one = {"name": "device-x", "kind": "Device", "id": "GPU-x"}
    body = {"records": [one] * (MAX_HISTORY_RECORDS + 1)}
    with pytest.raises(ApiException) as err:
        _ticket_with_history(api_client, body)
    assert err.value.status == 422
    assert (
        "hardwareHistory.records" in err.value.body and str(MAX_HISTORY_RECORDS) in err.value.body
    )
