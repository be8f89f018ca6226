"""How one RecordHardware reaches the API: a host's records are written side by side
(after the quarantine's node patch, before the next decision), and a refused write still
lets the other records be written before the error is raised."""

from __future__ import annotations

import datetime as dt
import threading
from collections import Counter
from typing import Any

import pytest

from sdcguard.adapters import hardware
from sdcguard.api import FailureKind
from sdcguard.domain.lifecycle import RecordHardware
from sdcguard.domain.observed import NodeSnapshot
from tests.unit.factories import NOW


def _host() -> NodeSnapshot:
    return NodeSnapshot.from_body(
        {
            "metadata": {"name": "gpu-1", "uid": "u-1", "resourceVersion": "1"},
            "spec": {"providerID": "aws:///us-east-1a/i-0abc123"},
            "status": {
                "nodeInfo": {
                    "systemUUID": "ec2a1b2c-3d4e-5f60-7182-93a4b5c6d7e8",
                    "machineID": "9f8e7d6c5b4a39281706f5e4d3c2b1a0",
                }
            },
        }
    )


class _Writer:
    """Each create waits for the others: only writes made side by side get through."""

    def __init__(self, parties: int, refuse: str = "") -> None:
        self.barrier = threading.Barrier(parties, timeout=10)
        self.refuse = refuse
        self.lock = threading.Lock()
        self.created: list[str] = []
        self.patched: list[str] = []

    def create_custom(self, plural: str, body: dict[str, Any]) -> Any:
        self.barrier.wait()
        with self.lock:
            self.created.append(body["metadata"]["name"])
        return body

    def patch_custom_status(self, plural: str, name: str, status: dict[str, Any]) -> Any:
        if name.startswith(self.refuse) and self.refuse:
            raise RuntimeError(f"{name}: refused")
        with self.lock:
            self.patched.append(name)
        return status


def _identity() -> hardware.Identity:
    identity = hardware.node_identity(_host(), {})
    assert len(identity.trusted) == 3, "provider ID, system UUID and machine ID"
    return identity


ACTION = RecordHardware(FailureKind.QUARANTINED, test="gpu-1-abcde-2", ticket="gpu-1-abcde-1")


def test_a_hosts_records_are_written_side_by_side() -> None:
    writer = _Writer(parties=3)
    counts: Counter[str] = Counter()
    written = hardware.record(writer, _host(), _identity(), {}, ACTION, NOW, counts)
    assert sorted(writer.created) == sorted(written) and len(written) == 3
    assert sorted(writer.patched) == sorted(written), "each record's status after its create"
    assert counts["hardware-records-written"] == 3


def test_a_refused_write_raises_after_the_other_records_are_written() -> None:
    writer = _Writer(parties=3, refuse="system-")
    with pytest.raises(RuntimeError, match="refused"):
        hardware.record(writer, _host(), _identity(), {}, ACTION, NOW, Counter())
    assert len(writer.created) == 3
    assert sorted(n.split("-")[0] for n in writer.patched) == ["machine", "provider"]


def test_a_records_change_concerns_its_holders_and_the_nodes_it_was_seen_under() -> None:
    """Which nodes a pass decides again when an SDCHardware changes (not every node)."""
    from sdcguard.adapters.hardware import HardwareRecord, concerned
    from sdcguard.api import IdentityKind, SDCHardwareSpec, SDCHardwareStatus
    from sdcguard.api.hardware import SeenAs
    from sdcguard.domain.hardware import holder_key

    at = dt.datetime(2025, 6, 1, tzinfo=dt.UTC)
    groups = {holder_key(IdentityKind.PROVIDER_ID, "aws:///zone/i-0abc"): ["gpu-7"]}

    def holders(key: str) -> list[str]:
        return groups.get(key, [])

    host = HardwareRecord(
        "provider-x",
        SDCHardwareSpec(kind=IdentityKind.PROVIDER_ID, id="aws:///zone/i-0ABC"),
        SDCHardwareStatus(
            nodes=[SeenAs(node="gpu-old", first_seen=at, last_seen=at)], last_node="gpu-old"
        ),
    )
    assert concerned(host, holders) == {"gpu-7", "gpu-old"}
    device = HardwareRecord(
        "device-x",
        SDCHardwareSpec(kind=IdentityKind.DEVICE, id="GPU-1234"),
        SDCHardwareStatus(
            nodes=[SeenAs(node="gpu-3", first_seen=at, last_seen=at)], last_node="gpu-9"
        ),
    )
    assert concerned(device, holders) == {"gpu-3", "gpu-9"}
    unwritten = HardwareRecord("device-y", SDCHardwareSpec(kind=IdentityKind.DEVICE, id="G"))
    assert concerned(unwritten, holders) == set(), "no status yet: no node it was seen under"


def test_hardware_recognised_under_a_new_node_is_counted_once_whatever_the_writes_do() -> None:
    """A write that fails is retried by a later pass, whose records may already name the
    new Node: the recognition is counted when it is made, once per Node."""
    from prometheus_client import CollectorRegistry

    from sdcguard.adapters.hardware import HardwareRecord
    from sdcguard.api import SDCHardwareSpec, SDCHardwareStatus
    from sdcguard.api.hardware import SeenAs
    from sdcguard.metrics import Metrics

    at = dt.datetime(2025, 6, 1, tzinfo=dt.UTC)
    identity = _identity()
    records = {
        hw.record: HardwareRecord(
            hw.record,
            SDCHardwareSpec(kind=hw.kind, id=hw.value),
            SDCHardwareStatus(
                nodes=[SeenAs(node="gpu-old", first_seen=at, last_seen=at)], last_node="gpu-old"
            ),
        )
        for hw in identity.trusted
    }
    metrics = Metrics(registry=CollectorRegistry())
    counted: set[str] = set()

    def recognised() -> float:
        value = metrics.registry.get_sample_value(
            "sdcguard_hardware_recognised_total", {"kind": "ProviderID", "retired": "false"}
        )
        return value or 0.0

    refused = _Writer(parties=1, refuse="provider-")
    with pytest.raises(RuntimeError, match="refused"):
        hardware.record(
            refused, _host(), identity, records, ACTION, NOW, Counter(), metrics, counted
        )
    assert recognised() == 1, "counted although a record's write failed"
    counts: Counter[str] = Counter()
    hardware.record(
        _Writer(parties=1), _host(), identity, records, ACTION, NOW, counts, metrics, counted
    )
    assert recognised() == 1 and counts["hardware-recognised"] == 0, "the retry counts nothing"
