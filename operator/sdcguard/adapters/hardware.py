"""The hardware's history in the API: reading SDCHardware records into the pass's view,
identifying a Node's hardware, and writing what a decision's ``RecordHardware`` says.

Records exist only for hardware that failed (or was retired): a healthy fleet has none,
so a node with nothing to do costs no read or write here. Each trusted identifier of a
Node keys one record (``domain.hardware``); the same failure is written to each, once
(an entry for the same ticket and test is not added twice), so a decision repeated
after a crash adds nothing.
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from pydantic import ValidationError

from sdcguard.api import (
    PLURAL_HARDWARE,
    HardwareFailure,
    HardwareHistory,
    IdentityKind,
    ObjectMeta,
    Repair,
    RepairTicket,
    SDCHardware,
    SDCHardwareSpec,
    SDCHardwareStatus,
    parse_duration,
    to_body,
    to_patch,
)
from sdcguard.domain.hardware import (
    HardwareFacts,
    Identity,
    candidates,
    hardware_facts,
    hardware_history,
    holder_key,
    identify,
    record_name,
    seen_under,
    ticket_records,
    updated,
)
from sdcguard.domain.lifecycle import RecordHardware
from sdcguard.domain.observed import NodeSnapshot, TestFacts
from sdcguard.metrics import Metrics

log = structlog.get_logger("sdcguard.hardware")


@dataclass(frozen=True)
class HardwareRecord:
    """An SDCHardware as the index keeps it (``status`` None: not written yet)."""

    name: str
    spec: SDCHardwareSpec
    status: SDCHardwareStatus | None = None

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> HardwareRecord | None:
        """The record, or None for one that does not validate (logged; it counts nothing)."""
        try:
            parsed = SDCHardware.model_validate(dict(body))
        except ValidationError as exc:
            name = (body.get("metadata") or {}).get("name")
            log.warning("unreadable SDCHardware skipped", record=name, error=str(exc)[:300])
            return None
        return cls(parsed.metadata.name, parsed.spec, parsed.status)


def holder_keys(node: NodeSnapshot) -> tuple[str, ...]:
    """The identifier groups a Node belongs to in the fleet copy (non-empty host IDs)."""
    ids = candidates(node.provider_id, node.system_uuid, node.machine_id)
    return tuple(holder_key(kind, value) for kind, value in ids if value.strip())


def concerned(record: HardwareRecord, holders: Callable[[str], Iterable[str]]) -> set[str]:
    """The Nodes whose decisions read ``record``: those holding its host identifier now
    (``holders``: the Node names grouped under an identifier key) and those it was seen
    under (a device record names no host; its Nodes are in its status)."""
    names: set[str] = set()
    if record.spec.kind != IdentityKind.DEVICE:
        names.update(holders(holder_key(record.spec.kind, record.spec.id)))
    status = record.status
    if status is not None:
        names.update(seen.node for seen in status.nodes)
        if status.last_node:
            names.add(status.last_node)
    return names


def odd_devices(test: TestFacts) -> tuple[str, ...]:
    """The UUIDs or serials of the devices a failed test named as the odd one out."""
    ids = test.device_ids
    named = [
        ids[f.odd_device]
        for f in test.findings
        if f.odd_device is not None and f.odd_device < len(ids) and ids[f.odd_device]
    ]
    return tuple(dict.fromkeys(named))


def latest_devices(tests: Iterable[tuple[dt.datetime, TestFacts]]) -> tuple[str, ...]:
    """The device IDs the node's newest test that named any reported (non-empty ones)."""
    for _, test in sorted(tests, key=lambda t: t[0], reverse=True):
        if any(test.device_ids):
            return tuple(dict.fromkeys(d for d in test.device_ids if d))
    return ()


def node_identity(
    node: NodeSnapshot, holders: Mapping[str, Sequence[str]], devices: Sequence[str] = ()
) -> Identity:
    """The Node's identifiers, trusted or not (see ``domain.hardware.identify``)."""
    ids = candidates(node.provider_id, node.system_uuid, node.machine_id, devices)
    return identify(node.name, ids, holders)


def device_identity(node: str, uuid: str, holders: Mapping[str, Sequence[str]]) -> Identity:
    """One GPU's identifier alone (its record, without the host's)."""
    return identify(node, [(IdentityKind.DEVICE, uuid)], holders)


def facts(
    node: NodeSnapshot,
    holders: Callable[[NodeSnapshot], Mapping[str, Sequence[str]]],
    records: Mapping[str, HardwareRecord],
    window: str,
    now: dt.datetime,
    devices: Sequence[str] = (),
) -> HardwareFacts | None:
    """What the node's hardware records say (None without records: the common case,
    answered without identifying the node when no record exists at all). ``devices``:
    the device IDs its latest probe named (a GPU moved from a failing host brings its
    history along)."""
    if not records:
        return None
    ids = candidates(node.provider_id, node.system_uuid, node.machine_id, devices)
    if not any(record_name(kind, value) in records for kind, value in ids if value.strip()):
        return None  # no record could be this node's: no need to ask who else holds its IDs
    identity = node_identity(node, holders(node), devices)
    statuses = {n: r.status or SDCHardwareStatus() for n, r in records.items()}
    return hardware_facts(identity, statuses, now, parse_duration(window))


class Writer(Protocol):
    def create_custom(self, plural: str, body: dict[str, Any]) -> Any: ...

    def patch_custom_status(self, plural: str, name: str, status: dict[str, Any]) -> Any: ...


_RECORD_WRITERS = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="hardware")


def _write_records(
    writer: Writer, writes: Sequence[tuple[str, dict[str, Any] | None, dict[str, Any]]]
) -> None:
    """Each record's create (None: it exists) and status patch, the records side by side:
    one after the other a host's three records cost six round trips instead of two (they
    follow the quarantine's node patch, and the next node's decision waits for them)."""

    def one(name: str, body: dict[str, Any] | None, status: dict[str, Any]) -> None:
        if body is not None:
            writer.create_custom(PLURAL_HARDWARE, body)  # None: it exists (a repeat)
        writer.patch_custom_status(PLURAL_HARDWARE, name, status)

    if len(writes) <= 1:
        for name, body, status in writes:
            one(name, body, status)
        return
    futures = [_RECORD_WRITERS.submit(one, *w) for w in writes]
    concurrent.futures.wait(futures)
    for future in futures:
        future.result()  # the first error, as a sequential write would have raised it


def record(
    writer: Writer,
    node: NodeSnapshot,
    identity: Identity,
    records: Mapping[str, HardwareRecord],
    action: RecordHardware,
    now: dt.datetime,
    counts: Counter[str],
    metrics: Metrics | None = None,
    recognised_before: set[str] | None = None,
) -> list[str]:
    """Apply one RecordHardware: each trusted identifier's record, created if missing,
    its status updated only where something changed. Returns the records written.

    ``metrics``: counts hardware recognised under a new Node (once per Node, by its
    strongest identifier with a record), retired, and failures that keep no history.
    ``recognised_before``: the Nodes (uid, else name) already counted, kept by the
    caller across passes and updated here."""
    at = now.astimezone(dt.UTC).replace(microsecond=0)
    if not identity.trusted:
        counts["hardware-untrusted"] += 1
        if metrics is not None and action.failure is not None:
            metrics.hardware_untracked.inc()
        log.warning(
            "hardware history not kept: no identifier of the node can be trusted",
            node=node.name,
            untrusted=[f"{u.kind.value}: {u.reason}" for u in identity.untrusted],
        )
        return []
    failure = (
        HardwareFailure(
            time=at, kind=action.failure, node=node.name, ticket=action.ticket, test=action.test
        )
        if action.failure is not None
        else None
    )
    written: list[str] = []
    writes: list[tuple[str, dict[str, Any] | None, dict[str, Any]]] = []
    recognised: tuple[str, bool] | None = None
    retired = False
    for hw in identity.trusted:
        name = hw.record
        known = records.get(name)
        old = known.status if known is not None else None
        status = updated(
            known.status if known is not None else None,
            node=node.name,
            uid=node.uid,
            now=at,
            untrusted=identity.untrusted,
            failure=failure,
            retire=action.message or "retired" if action.retire else None,
        )
        if status is None:
            continue
        if old is not None and recognised is None and not seen_under(old, node.name, node.uid):
            key = node.uid or node.name
            if recognised_before is None or key not in recognised_before:
                recognised = (hw.kind.value, old.retired is not None)
                # Counted now, with the Node noted as counted: the recognition happened
                # whatever the writes below do, and a write that fails is retried by a
                # later pass, which must neither count it again nor miss it (its records
                # may already name this Node then).
                if recognised_before is not None:
                    recognised_before.add(key)
                if metrics is not None:
                    kind, was_retired = recognised
                    metrics.hardware_recognised.labels(
                        kind=kind, retired=str(was_retired).lower()
                    ).inc()
                    counts["hardware-recognised"] += 1
        retired = retired or (status.retired is not None and (old is None or not old.retired))
        body = None
        if known is None:
            body = to_body(
                SDCHardware(
                    metadata=ObjectMeta(name=name),
                    spec=SDCHardwareSpec(kind=hw.kind, id=hw.value[:253]),
                )
            )
        fields = ("failures", "total_failures", "nodes", "last_node", "retired", "untrusted")
        writes.append((name, body, to_patch(status, *fields, "conditions")))
        counts["hardware-records-written"] += 1
        written.append(name)
    _write_records(writer, writes)
    if metrics is not None and retired:
        why = "OutOfRepairCycles" if action.failure is not None else "RetiredByRequest"
        metrics.hardware_retired.labels(reason=why).inc()
    if written:
        log.info(
            "hardware history recorded",
            node=node.name,
            records=written,
            failure=action.failure.value if action.failure else None,
            retired=action.retire,
        )
    return written


def id_holders(
    nodes: Iterable[NodeSnapshot], group: Callable[[str], Sequence[str]]
) -> dict[str, tuple[str, ...]]:
    """For each host identifier of ``nodes``, the Nodes of the fleet that hold it
    (``group``: the fleet copy's names under one identifier group)."""
    holders: dict[str, tuple[str, ...]] = {}
    for node in nodes:
        for key in holder_keys(node):
            if key not in holders:
                holders[key] = tuple(group(key))
    return holders


def ticket_history(
    ticket: RepairTicket,
    repair: Repair,
    lookup: Callable[[str], HardwareRecord | None],
    at: dt.datetime,
) -> HardwareHistory:
    """The hardware history a ticket event tells its sinks, as of ``at`` (the event's
    time): the ticket's records that exist (``lookup``: a record by name, from the
    index), counted with the policy's window."""
    found = {
        name: (r.spec, r.status)
        for name in ticket_records(ticket.spec.hardware)
        if (r := lookup(name)) is not None
    }
    window = repair.repair_cycle_window
    return hardware_history(
        ticket.spec.hardware,
        found,
        at=at,
        window=window,
        window_seconds=parse_duration(window),
        max_cycles=repair.max_repair_cycles,
    )
