"""``kubectl sdc blast-radius NODE|TICKET``: which workloads a failing node touched."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sdcguard.api import PLURAL_TICKETS, WORKLOADS, RepairTicket, Workload, WorkloadRecord
from sdcguard.cli.kube import CliError, Connection, get_typed, list_typed
from sdcguard.cli.objects import wire, wire_time
from sdcguard.cli.output import Result, Table, cell, format_time


@dataclass(frozen=True)
class Radius:
    """What one blast radius shows: a ticket's record, or a node's workload record."""

    node: str
    ticket: str | None
    window_start: dt.datetime | None
    window_end: dt.datetime | None
    workloads: Sequence[Workload]
    dropped: int = 0
    advice: str = ""

    def data(self) -> dict[str, Any]:
        """The -o json|yaml form."""
        return {
            "node": self.node,
            "ticket": self.ticket,
            "windowStart": wire_time(self.window_start),
            "windowEnd": wire_time(self.window_end),
            "workloads": [wire(w) for w in self.workloads],
            "dropped": self.dropped,
            "advice": self.advice,
        }


def _newest_ticket(tickets: list[RepairTicket], node: str) -> RepairTicket | None:
    mine = [t for t in tickets if t.spec.node_name == node]
    if not mine:
        return None
    return max(mine, key=lambda t: wire_time(t.metadata.creation_timestamp) or "")


def _record(conn: Connection, node: str) -> WorkloadRecord | None:
    try:
        return get_typed(conn, WorkloadRecord, WORKLOADS.plural, node)
    except CliError as exc:
        if "not found" in str(exc):
            return None
        raise


def blast_radius(conn: Connection, name: str) -> Result:
    """A ticket's blast radius; for a node, its newest ticket's, or (no ticket yet) what
    its workload record holds since its last passing screening."""
    listed = list_typed(conn, RepairTicket, PLURAL_TICKETS)
    tickets = listed.items
    ticket = next((t for t in tickets if t.metadata.name == name), None)
    node = ticket.spec.node_name if ticket else name
    if ticket is None:
        ticket = _newest_ticket(tickets, name)
    if ticket is not None and ticket.spec.blast_radius is not None:
        radius = ticket.spec.blast_radius
        shown = Radius(
            node=node,
            ticket=ticket.metadata.name,
            window_start=radius.window_start,
            window_end=radius.window_end,
            workloads=radius.workloads,
            dropped=radius.dropped,
            advice=radius.advice,
        )
    else:
        record = _record(conn, node)
        if record is None and ticket is None:
            raise CliError(
                f"no RepairTicket and no WorkloadRecord named {name}: give a ticket "
                "(kubectl get rt) or a node whose workloads sdcguard records (kubectl get sdcw)"
            )
        status = record.status if record else None
        shown = Radius(
            node=node,
            ticket=ticket.metadata.name if ticket else None,
            window_start=status.since if status else None,
            window_end=None,
            workloads=status.workloads if status else [],
            dropped=status.dropped if status else 0,
        )
    return Result(
        data=shown.data(), tables=[_table(shown)], lines=[*listed.warnings, *_lines(shown)]
    )


def _when(value: dt.datetime | None) -> str:
    return format_time(value) or "-"


def _table(radius: Radius) -> Table:
    rows: list[Sequence[str]] = [
        [
            cell(w.namespace),
            f"{w.kind}/{w.name}",
            str(w.accelerators),
            str(w.pod_count),
            _when(w.first_seen),
            _when(w.last_seen) if w.last_seen else "running",
            cell(w.note),
            w.api_version,
            cell(",".join(w.running)),
        ]
        for w in radius.workloads
    ]
    start = _when(radius.window_start) if radius.window_start else "first recorded use"
    end = _when(radius.window_end) if radius.window_end else "now (no failing screening)"
    ticket = f", ticket {radius.ticket}" if radius.ticket else ""
    return Table(
        [
            "namespace",
            "workload",
            "accelerators",
            "pods",
            "first seen",
            "last seen",
            "note",
            "api version",
            "running pods",
        ],
        rows,
        wide=["api version", "running pods"],
        title=f"Node {radius.node}{ticket}: window {start} .. {end}",
        empty=f"Node {radius.node}{ticket}: no workload used it in the window {start} .. {end}.",
    )


def _lines(radius: Radius) -> list[str]:
    lines = []
    if radius.dropped:
        lines.append(f"{radius.dropped} older workloads were left out of the bounded record.")
    if radius.advice:
        lines.append(f"What to do: {radius.advice}")
    return lines
