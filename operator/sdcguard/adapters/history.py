"""The hardware's history (SDCHardware records) a decision writes after its node patch,
and the history an interruption left unwritten (plan stage ``HISTORY``)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import Counter
from collections.abc import Iterable

import structlog

from sdcguard.adapters import hardware
from sdcguard.adapters.kube import KubeWriter
from sdcguard.adapters.pass_state import HISTORY_GRACE, Expectations, FleetView, KnownTests
from sdcguard.domain import keys
from sdcguard.domain.lifecycle import RecordHardware, parse_history_note
from sdcguard.domain.observed import NodeSnapshot
from sdcguard.domain.plan import Step
from sdcguard.metrics import Metrics

log = structlog.get_logger("sdcguard.reconcile")


class HardwareHistory:
    """Writes the hardware's history, and remembers per node which ``sdcguard.dev/history``
    note is settled (written, restored, or found written), which failed, and when a
    young note is old enough to tell."""

    def __init__(
        self,
        writer: KubeWriter,
        metrics: Metrics,
        known: KnownTests,
        expectations: Expectations,
    ) -> None:
        self._writer = writer
        self._metrics = metrics
        self._known = known
        self._expectations = expectations
        self.written: dict[str, str] = {}
        """Node name -> the history note whose records this process wrote (or restored,
        or found written): not looked at again."""
        self.failed: dict[str, str] = {}
        """Node name -> the history note whose writes failed after its node patch here."""
        self.due: dict[str, dt.datetime] = {}
        """Node name -> when its history note is old enough to tell whether it was written."""
        self.recognised: set[str] = set()
        """Nodes (uid, else name) already counted as recognised hardware: a record's
        status can lag behind the next pass, and one action writes the host's and its
        GPUs' records, while the metric counts a Node's recognition once."""

    def take_due(self, node: str) -> dt.datetime | None:
        """When the node's young history note is old enough to tell whether it was
        written (None: no note waits), forgotten as it is read: the node's memory asks
        to be decided again then."""
        return self.due.pop(node, None)

    def apply(
        self,
        view: FleetView,
        body: NodeSnapshot,
        steps: Iterable[Step],
        note: str | None,
        now: dt.datetime,
        counts: Counter[str],
    ) -> None:
        """The plan's history stage; ``note`` is the history annotation its node patch
        wrote (a failure leaves it for the next look at the node, without the grace)."""
        try:
            for step in steps:
                if isinstance(step, RecordHardware):
                    self.record(view, body, step, now, counts)
        except Exception:
            if note:
                # The node has entered its state, so the decision will not come again:
                # the next look at the node writes the history, without the grace.
                self.failed[body.name] = note
            raise
        if note:
            self.written[body.name] = note

    def record(
        self,
        view: FleetView,
        body: NodeSnapshot,
        action: RecordHardware,
        now: dt.datetime,
        counts: Counter[str],
    ) -> int:
        """The hardware's history: the host's records, and those of the devices the failed
        test named as the odd one out (their UUIDs from the probe). Returns how many
        records were written."""
        test = (
            self._known.judged(view, body.name, self._expectations).get(action.test)
            if action.test
            else None
        )
        named = hardware.odd_devices(test) if test is not None else ()
        own = {uuid.lower(): ticket for uuid, ticket in action.devices}
        # The host's records (and any odd device without a ticket of its own) name the
        # incident's first ticket; each quarantined GPU's record names its own ticket.
        shared = tuple(d for d in named if d.lower() not in own)
        holders = view.id_holders(body)
        identity = hardware.node_identity(body, holders, shared)
        written = hardware.record(
            self._writer,
            body,
            identity,
            view.hardware,
            action,
            now,
            counts,
            self._metrics,
            self.recognised,
        )
        for uuid, ticket in action.devices:
            device = hardware.device_identity(body.name, uuid, holders)
            mine = dataclasses.replace(action, ticket=ticket)
            written += hardware.record(
                self._writer,
                body,
                device,
                view.hardware,
                mine,
                now,
                counts,
                self._metrics,
                self.recognised,
            )
        return len(written)

    def restore(
        self, view: FleetView, body: NodeSnapshot, now: dt.datetime, counts: Counter[str]
    ) -> dt.datetime | None:
        """The hardware history the decision that put the node in its state wrote after
        the node patch (``sdcguard.dev/history``): written here if the operator stopped
        before it, once per annotation and process. The records say what is already
        there, so a history written before is not written twice (``hardware.record``
        writes only what changes). Returns when to look again while the note is too
        young to tell (the history's watch events may trail the node's); a note whose
        writes this process saw fail (a 429 after the node patch) is not waited for."""
        note = body.annotations.get(keys.HISTORY)
        if not note or self.written.get(body.name) == note:
            return None
        parsed = parse_history_note(note)
        if parsed is None or body.annotations.get(keys.STATE_SINCE) != parsed[0]:
            return None  # unreadable, or the node has moved on from that decision
        at = keys.parse_time(parsed[0])
        if at is None:
            return None
        if now - at < HISTORY_GRACE and self.failed.get(body.name) != note:
            self.due[body.name] = at + HISTORY_GRACE
            return at + HISTORY_GRACE
        self.failed.pop(body.name, None)
        self.written[body.name] = note
        identity = hardware.node_identity(body, view.id_holders(body), ())
        if not identity.trusted:
            return None  # the decision's own write logged and counted that once
        written = sum(self.record(view, body, r, at, counts) for r in parsed[1])
        if written:
            counts["hardware-history-restored"] += 1
            log.warning(
                "hardware history written after an interruption",
                node=body.name,
                records=written,
                state_since=parsed[0],
            )
        return None
