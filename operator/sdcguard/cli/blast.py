"""``kubectl sdc blast-radius NODE|TICKET``: which workloads a failing node touched."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sdcguard.api import PLURAL_TICKETS, WORKLOADS
from sdcguard.cli.kube import CliError, Connection, get_custom, list_custom
from sdcguard.cli.output import Result, Table, cell, format_time, parse_time


def _newest_ticket(tickets: list[dict[str, Any]], node: str) -> dict[str, Any] | None:
    mine = [t for t in tickets if (t.get("spec") or {}).get("nodeName") == node]
    if not mine:
        return None
    return max(mine, key=lambda t: str((t.get("metadata") or {}).get("creationTimestamp") or ""))


def _record(conn: Connection, node: str) -> dict[str, Any] | None:
    try:
        return get_custom(conn, WORKLOADS.plural, node)
    except CliError as exc:
        if "not found" in str(exc):
            return None
        raise


def blast_radius(conn: Connection, name: str) -> Result:
    """A ticket's blast radius; for a node, its newest ticket's, or (no ticket yet) what
    its workload record holds since its last passing screening."""
    tickets = list_custom(conn, PLURAL_TICKETS)
    ticket = next((t for t in tickets if (t.get("metadata") or {}).get("name") == name), None)
    node = str((ticket.get("spec") or {}).get("nodeName")) if ticket else name
    if ticket is None:
        ticket = _newest_ticket(tickets, name)
    if ticket is not None and (ticket.get("spec") or {}).get("blastRadius"):
        spec = ticket["spec"]
        radius: Mapping[str, Any] = spec["blastRadius"]
        data = {
            "node": node,
            "ticket": ticket["metadata"]["name"],
            "windowStart": radius.get("windowStart"),
            "windowEnd": radius.get("windowEnd"),
            "workloads": list(radius.get("workloads") or []),
            "dropped": int(radius.get("dropped") or 0),
            "advice": radius.get("advice") or "",
        }
    else:
        record = _record(conn, node)
        if record is None and ticket is None:
            raise CliError(
                f"no RepairTicket and no WorkloadRecord named {name}: give a ticket "
                "(kubectl get rt) or a node whose workloads sdcguard records (kubectl get sdcw)"
            )
        status = (record or {}).get("status") or {}
        data = {
            "node": node,
            "ticket": ticket["metadata"]["name"] if ticket else None,
            "windowStart": status.get("since"),
            "windowEnd": None,
            "workloads": list(status.get("workloads") or []),
            "dropped": int(status.get("dropped") or 0),
            "advice": "",
        }
    return Result(data=data, tables=[_table(data)], lines=_lines(data))


def _when(value: Any) -> str:
    return format_time(parse_time(value)) or "-"


def _table(data: Mapping[str, Any]) -> Table:
    rows: list[Sequence[str]] = [
        [
            cell(w.get("namespace")),
            f"{w.get('kind')}/{w.get('name')}",
            str(w.get("accelerators", 0)),
            str(w.get("podCount", 0)),
            _when(w.get("firstSeen")),
            _when(w.get("lastSeen")) if w.get("lastSeen") else "running",
            cell(w.get("note")),
        ]
        for w in data["workloads"]
    ]
    start = _when(data["windowStart"]) if data["windowStart"] else "first recorded use"
    end = _when(data["windowEnd"]) if data["windowEnd"] else "now (no failing screening)"
    ticket = f", ticket {data['ticket']}" if data["ticket"] else ""
    return Table(
        ["namespace", "workload", "accelerators", "pods", "first seen", "last seen", "note"],
        rows,
        title=f"Node {data['node']}{ticket}: window {start} .. {end}",
        empty=f"Node {data['node']}{ticket}: no workload used it in the window {start} .. {end}.",
    )


def _lines(data: Mapping[str, Any]) -> list[str]:
    lines = []
    if data["dropped"]:
        lines.append(f"{data['dropped']} older workloads were left out of the bounded record.")
    if data["advice"]:
        lines.append(f"What to do: {data['advice']}")
    return lines
