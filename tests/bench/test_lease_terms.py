"""The standby check's terms come from the audit log's Lease writes, so a leader that
steps down on its own (its renewals timed out) and the standby that takes over before
any kill are told apart from a write made outside its writer's term."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from bench.scale import audit
from bench.scale.restart import LEASE, lease_terms, outside_terms

A, B = audit.OPERATOR_USER, audit.STANDBY_USER
T0 = 1_800_000_000.0


def _event(n: int, user: str, at: float, verb: str, resource: str, name: str, code: int) -> str:
    stamp = dt.datetime.fromtimestamp(T0 + at, dt.UTC).isoformat().replace("+00:00", "Z")
    return json.dumps(
        {
            "auditID": f"id-{n}",
            "user": {"username": user},
            "verb": verb,
            "objectRef": {"resource": resource, "name": name},
            "requestReceivedTimestamp": stamp,
            "stageTimestamp": stamp,
            "responseStatus": {"code": code},
        }
    )


def test_a_takeover_without_a_kill_starts_a_term_and_a_stale_write_is_caught(
    tmp_path: Path,
) -> None:
    events = [
        (A, 1.0, "update", "leases", LEASE, 200),  # A renews
        (A, 2.0, "patch", "workloadrecords", "gpu-00001", 200),  # in A's term
        (B, 4.0, "update", "leases", LEASE, 409),  # B's refused try starts nothing
        (B, 10.0, "update", "leases", LEASE, 200),  # A stepped down: B takes over
        (A, 10.5, "update", "leases", LEASE, 409),  # A's stale renewal is refused
        (B, 12.0, "patch", "workloadrecords", "gpu-00002", 200),  # B in its own term
        (A, 13.0, "patch", "nodes", "gpu-00003", 200),  # A writes in B's term: caught
        (A, 28.0, "update", "leases", LEASE, 200),  # B killed at 20: A takes over
        (A, 29.0, "create", "sdctests", "gpu-00004-x", 201),
    ]
    log = tmp_path / "audit.log"
    # Lines in the order requests completed, not received: terms sort by receipt.
    lines = [_event(n, *e) for n, e in enumerate(events)]
    log.write_text("\n".join([lines[1], lines[0], *lines[2:]]) + "\n")
    auditlog = audit.AuditLog(log)

    terms = lease_terms(auditlog, A, T0, T0 + 60)
    assert terms == [(A, 0.0), (B, T0 + 10.0), (A, T0 + 28.0)]

    writes = [r for r in auditlog.between(T0, T0 + 60) if r.write and r.code < 400]
    outside = outside_terms(writes, terms)
    assert [(o["user"], o["name"]) for o in outside] == [(A, "gpu-00003")]
