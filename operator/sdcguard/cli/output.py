"""Printing results as kubectl does: aligned tables, or JSON/YAML for programs."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import yaml

FORMATS = ("table", "json", "yaml")


@dataclass
class Table:
    """A titled table; ``rows`` hold already formatted cells."""

    headers: Sequence[str]
    rows: list[Sequence[str]] = field(default_factory=list)
    title: str = ""
    empty: str = ""
    """Printed instead of the table when it has no rows (nothing when empty)."""


@dataclass
class Result:
    """What a command produced: ``data`` for -o json|yaml, ``tables`` and ``lines`` for people."""

    data: Any
    tables: list[Table] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    """Text printed after the tables (hints, next steps)."""


def render_table(table: Table) -> str:
    """Columns padded to their widest cell, three spaces apart, like kubectl get."""
    if not table.rows:
        return table.empty
    headers = [h.upper() for h in table.headers]
    widths = [len(h) for h in headers]
    for row in table.rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = []
    for cells in [headers, *table.rows]:
        padded = [str(c).ljust(widths[i]) for i, c in enumerate(cells)]
        lines.append("   ".join(padded).rstrip())
    return "\n".join(([table.title] if table.title else []) + lines)


def without_managed_fields(data: Any) -> Any:
    """``data`` without ``metadata.managedFields`` at any depth: server-side apply's
    bookkeeping, which kubectl also leaves out of -o json|yaml by default."""
    if isinstance(data, list):
        return [without_managed_fields(item) for item in data]
    if not isinstance(data, dict):
        return data
    out = {k: without_managed_fields(v) for k, v in data.items()}
    meta = out.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        out["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    return out


def emit(result: Result, fmt: str, out: TextIO) -> None:
    """Write ``result`` in ``fmt`` (table, json or yaml)."""
    if fmt == "json":
        data = without_managed_fields(result.data)
        out.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
        return
    if fmt == "yaml":
        data = without_managed_fields(result.data)
        out.write(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))
        return
    blocks = [render_table(t) for t in result.tables]
    blocks = [b for b in blocks if b]
    text = "\n\n".join(blocks)
    if result.lines:
        text = (text + "\n\n" if text else "") + "\n".join(result.lines)
    if text:
        out.write(text + "\n")


def format_time(value: dt.datetime | None) -> str | None:
    """RFC 3339 in UTC, seconds precision."""
    if value is None:
        return None
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def age(since: dt.datetime | None, now: dt.datetime) -> str:
    """kubectl-style age: 45s, 12m, 5h, 3d; "<unknown>" without a time."""
    if since is None:
        return "<unknown>"
    seconds = max(0, int((now - since).total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 2 * 3600:
        return f"{seconds // 60}m"
    if seconds < 2 * 86400:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def cell(value: Any) -> str:
    """A table cell: "-" for nothing, lower-case booleans."""
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
