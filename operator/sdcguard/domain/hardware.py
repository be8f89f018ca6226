"""Hardware identity and history: which identifiers of a Node can be trusted to recognise
its hardware, and what the hardware's SDCHardware records say about it.

A Node offers up to three host identifiers (``spec.providerID``, ``status.nodeInfo``'s
``systemUUID`` and ``machineID``) and the probe may name device UUIDs. Each one that is
trusted keys one SDCHardware record. An identifier is *not* trusted when it is empty, a
well-known placeholder (all zeros, all Fs, "Not Settable", a vendor's default UUID), or
held by another Node at the same time (two Nodes with one providerID are two machines
that the provisioner named alike, not one): it keys nothing, so two Nodes' histories are
never merged on it, and the record (or the ticket) says why it was left out.

Repair cycles are counted per record, within the policy's ``repairCycleWindow``; a host
known by several identifiers counts the largest of its records' counts (the same
failures are written to each record, so they are never added twice).

Pure: time is passed in, nothing here reads the cluster.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from sdcguard.api import (
    HardwareFailure,
    HardwareHistory,
    HardwareIdentity,
    HardwareRecordSummary,
    IdentityKind,
    Retirement,
    SDCHardwareSpec,
    SDCHardwareStatus,
    SeenAs,
    UntrustedId,
    set_condition,
)
from sdcguard.api.hardware import MAX_FAILURES, MAX_NODES, MAX_UNTRUSTED
from sdcguard.api.ticket import MAX_HISTORY_RECORDS, MAX_LAST_FAILURES, MAX_LAST_NODES

PLACEHOLDERS: frozenset[str] = frozenset(
    {
        "00000000-0000-0000-0000-000000000000",
        "ffffffff-ffff-ffff-ffff-ffffffffffff",
        "03000200-0400-0500-0006-000700080009",  # a board vendor's default SMBIOS UUID
        "00020003-0004-0005-0006-000700080009",
        "12345678-1234-5678-90ab-cddeefaabbcc",
        "not settable",
        "not specified",
        "not available",
        "not present",
        "to be filled by o.e.m.",
        "default string",
        "none",
        "null",
        "unknown",
        "n/a",
        "0",
    }
)
"""Values firmware and images are known to leave in place of a real identifier
(compared lowercased, without surrounding space)."""

_PREFIX = {
    IdentityKind.PROVIDER_ID: "provider",
    IdentityKind.SYSTEM_UUID: "system",
    IdentityKind.MACHINE_ID: "machine",
    IdentityKind.DEVICE: "device",
}


def holder_key(kind: IdentityKind, value: str) -> str:
    """The key under which the Nodes holding an identifier are grouped (``kind/value``)."""
    return f"{kind.value}/{value.strip().lower()}"


def record_name(kind: IdentityKind, value: str) -> str:
    """The SDCHardware name for an identifier: its kind and a hash of the value (provider
    IDs hold slashes and colons, which names may not)."""
    digest = hashlib.sha256(f"{kind.value}:{value.strip().lower()}".encode()).hexdigest()
    return f"{_PREFIX[kind]}-{digest[:32]}"


def placeholder_reason(value: str) -> str | None:
    """Why a value cannot identify hardware on its own (None: it may)."""
    text = value.strip().lower()
    if not text:
        return "empty"
    if text in PLACEHOLDERS:
        return f"a well-known placeholder ({value.strip()!r})"
    if len(set(text.replace("-", ""))) == 1:
        return f"a placeholder: one repeated character ({value.strip()!r})"
    return None


@dataclass(frozen=True)
class HardwareId:
    """One trusted identifier of a Node's hardware."""

    kind: IdentityKind
    value: str

    @property
    def record(self) -> str:
        return record_name(self.kind, self.value)


@dataclass(frozen=True)
class Identity:
    """A Node's identifiers, sorted into trusted ones and the others with their reasons."""

    node: str
    trusted: tuple[HardwareId, ...] = ()
    untrusted: tuple[UntrustedId, ...] = ()

    @property
    def records(self) -> tuple[str, ...]:
        return tuple(i.record for i in self.trusted)


def candidates(
    provider_id: str, system_uuid: str, machine_id: str, devices: Sequence[str] = ()
) -> list[tuple[IdentityKind, str]]:
    """A Node's identifiers in order of strength (host first, then devices)."""
    found = [
        (IdentityKind.PROVIDER_ID, provider_id),
        (IdentityKind.SYSTEM_UUID, system_uuid),
        (IdentityKind.MACHINE_ID, machine_id),
    ]
    return found + [(IdentityKind.DEVICE, d) for d in dict.fromkeys(devices)]


def identify(
    node: str,
    ids: Iterable[tuple[IdentityKind, str]],
    holders: Mapping[str, Sequence[str]],
) -> Identity:
    """Sort a Node's identifiers: trusted, or not and why.

    ``holders``: for each identifier's :func:`holder_key`, the Nodes that hold it now
    (this one included); an identifier another Node holds too is not trusted.
    """
    trusted: list[HardwareId] = []
    untrusted: list[UntrustedId] = []
    for kind, raw in ids:
        value = raw.strip()
        why = placeholder_reason(value)
        if why is None:
            others = sorted(n for n in holders.get(holder_key(kind, value), ()) if n != node)
            if others:
                shown = ", ".join(others[:3]) + (
                    f" and {len(others) - 3} more" if len(others) > 3 else ""
                )
                why = f"shared with Node {shown}: not unique, so not this hardware's own"
        if why is None:
            trusted.append(HardwareId(kind, value))
        else:
            untrusted.append(UntrustedId(kind=kind, value=value[:253], reason=why[:256]))
    return Identity(node, tuple(trusted), tuple(untrusted[:MAX_UNTRUSTED]))


@dataclass(frozen=True)
class HardwareFacts:
    """What the hardware's records say, for ``decide``."""

    records: tuple[str, ...] = ()
    """The SDCHardware records of the node's trusted identifiers that exist."""
    cycles: int = 0
    """Repair cycles used within the window: the largest count of any record."""
    failures: int = 0
    """Failures ever recorded (the largest total of any record)."""
    retired: str | None = None
    """Why the hardware was retired, if a record says it was."""
    known_as: tuple[str, ...] = ()
    """Other Node names the hardware was seen under."""
    device_cycles: Mapping[str, int] = field(default_factory=dict)
    """Repair cycles within the window of each GPU (by UUID, lowercased) that has a
    record: a device ticket begins its GPU's next cycle, not its host's."""

    @property
    def known(self) -> bool:
        """The hardware failed before (under this Node name or another)."""
        return self.failures > 0 or self.retired is not None

    def describe(self) -> str:
        """One line for Events and tickets."""
        parts = [f"{self.failures} failure(s) recorded, {self.cycles} repair cycle(s) in window"]
        if self.known_as:
            parts.append("seen as " + ", ".join(self.known_as[:3]))
        return f"hardware known ({'; '.join(parts)}; SDCHardware {self.records[0]})"


def counted(status: SDCHardwareStatus, now: dt.datetime, window_seconds: float) -> int:
    """Failures of one record within the window (``window_seconds`` 0: all of them)."""
    if window_seconds <= 0:
        return len(status.failures)
    since = now - dt.timedelta(seconds=window_seconds)
    return sum(1 for f in status.failures if f.time >= since)


def hardware_facts(
    identity: Identity,
    records: Mapping[str, SDCHardwareStatus],
    now: dt.datetime,
    window_seconds: float,
) -> HardwareFacts | None:
    """The facts of a node's hardware from its records (None: no record exists, the
    hardware has no history)."""
    found = [(name, records[name]) for name in identity.records if name in records]
    if not found:
        return None
    retired = next(
        (
            f"retired {s.retired.time.isoformat()} as {s.retired.node}: {s.retired.message}"
            for _, s in found
            if s.retired is not None
        ),
        None,
    )
    others = dict.fromkeys(
        seen.node for _, s in found for seen in s.nodes if seen.node != identity.node
    )
    devices = {
        hw.value.lower(): counted(records[hw.record], now, window_seconds)
        for hw in identity.trusted
        if hw.kind == IdentityKind.DEVICE and hw.record in records
    }
    return HardwareFacts(
        records=tuple(name for name, _ in found),
        cycles=max(counted(s, now, window_seconds) for _, s in found),
        failures=max(max(s.total_failures, len(s.failures)) for _, s in found),
        retired=retired,
        known_as=tuple(others),
        device_cycles=devices,
    )


def seen_under(status: SDCHardwareStatus, node: str, uid: str) -> bool:
    """Whether the record already knows the hardware under this Node (its name, and its
    uid when both are known: a Node re-created under the same name is a new sighting)."""
    return any(s.node == node and (s.uid == uid or not uid) for s in status.nodes)


def _seen(status: SDCHardwareStatus, node: str, uid: str, now: dt.datetime) -> list[SeenAs]:
    nodes = list(status.nodes)
    for i, seen in enumerate(nodes):
        if seen.node == node and (seen.uid == uid or not uid):
            nodes[i] = seen.model_copy(update={"last_seen": now})
            break
    else:
        nodes.append(SeenAs(node=node, uid=uid[:64], first_seen=now, last_seen=now))
    nodes.sort(key=lambda s: s.last_seen)
    return nodes[-MAX_NODES:]


def _same(a: HardwareFailure, b: HardwareFailure) -> bool:
    return (a.kind, a.ticket, a.test, a.node) == (b.kind, b.ticket, b.test, b.node)


def updated(
    status: SDCHardwareStatus | None,
    *,
    node: str,
    uid: str,
    now: dt.datetime,
    untrusted: Sequence[UntrustedId] = (),
    failure: HardwareFailure | None = None,
    retire: str | None = None,
) -> SDCHardwareStatus | None:
    """The record after the hardware was seen under ``node`` (and failed, or was retired);
    None when that changes nothing (a sighting already recorded, a failure already
    written by an earlier try of the same decision): no write is needed.

    Bounded: at most MAX_FAILURES failures (the oldest dropped first, ``totalFailures``
    keeps counting), MAX_NODES Node names (the least recently seen dropped first)."""
    old = status or SDCHardwareStatus()
    known = seen_under(old, node, uid)
    failures = list(old.failures)
    total = max(old.total_failures, len(failures))
    if failure is not None:
        again = any(
            (f.kind, f.ticket, f.test, f.node)
            == (failure.kind, failure.ticket, failure.test, failure.node)
            for f in failures
        )
        if not again:
            failures.append(failure)
            total += 1
            failure_added = True
        else:
            failure_added = False
    else:
        failure_added = False
    retiring = retire is not None and old.retired is None
    conditions = old.conditions
    if retiring:
        reason = "OutOfRepairCycles" if failure is not None else "RetiredByRequest"
        conditions = set_condition(
            conditions, "Retired", "True", reason, (retire or "")[:1024], now
        )
    if status is not None and known and not failure_added and not retiring:
        return None
    return SDCHardwareStatus(
        failures=failures[-MAX_FAILURES:],
        total_failures=total,
        nodes=_seen(old, node, uid, now),
        last_node=node,
        retired=(
            Retirement(time=now, node=node, message=(retire or "")[:1024])
            if retiring
            else old.retired
        ),
        untrusted=list(untrusted)[:MAX_UNTRUSTED],
        conditions=conditions,
    )


def ticket_records(hardware: HardwareIdentity) -> list[str]:
    """The SDCHardware names a ticket's hardware may have: its host records (as the
    ticket names them), then one per device it lists."""
    devices = [record_name(IdentityKind.DEVICE, d) for d in hardware.device_ids if d.strip()]
    return list(dict.fromkeys([*hardware.records, *devices]))


def record_summary(
    name: str,
    spec: SDCHardwareSpec,
    status: SDCHardwareStatus | None,
    at: dt.datetime,
    window_seconds: float,
) -> HardwareRecordSummary:
    """One record as of ``at``: failures recorded later are not counted or shown, so a
    summary built again for the same moment says the same (while they stay listed)."""
    st = status or SDCHardwareStatus()
    later = sum(1 for f in st.failures if f.time > at)
    upto = [f for f in st.failures if f.time <= at]
    total = max(st.total_failures, len(st.failures)) - later
    seen = [s for s in st.nodes if s.first_seen <= at]
    return HardwareRecordSummary(
        name=name,
        kind=spec.kind,
        id=spec.id,
        total_failures=max(total, len(upto)),
        failures_in_window=counted(SDCHardwareStatus(failures=upto), at, window_seconds),
        last_failures=upto[-MAX_LAST_FAILURES:],
        nodes=[s.node for s in sorted(seen, key=lambda s: s.first_seen)][-MAX_LAST_NODES:],
        retired=st.retired.time if st.retired is not None and st.retired.time <= at else None,
    )


def hardware_history(
    hardware: HardwareIdentity,
    records: Mapping[str, tuple[SDCHardwareSpec, SDCHardwareStatus | None]],
    *,
    at: dt.datetime,
    window: str,
    window_seconds: float,
    max_cycles: int,
) -> HardwareHistory:
    """What a ticket event tells its sinks about the hardware's history: the cycles used
    before the ticket and the ticket's records that exist (``records``: every SDCHardware
    by name), as of the event's time ``at``; bounded to MAX_HISTORY_RECORDS records."""
    found = [n for n in ticket_records(hardware) if n in records]
    shown = found[:MAX_HISTORY_RECORDS]
    return HardwareHistory(
        cycles_before=hardware.cycles_before,
        repair_cycle_window=window,
        max_repair_cycles=max_cycles,
        records=[record_summary(n, *records[n], at, window_seconds) for n in shown],
        records_dropped=len(found) - len(shown),
    )
