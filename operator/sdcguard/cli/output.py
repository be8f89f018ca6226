"""Printing results as kubectl does: aligned tables, or JSON/YAML for programs."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import yaml

from sdcguard.domain.text import printable

FORMATS = ("table", "wide", "json", "yaml")
"""-o choices: table (the default), wide (the table with its extra columns, as kubectl get -o
wide), json and yaml (the data, for programs)."""


@dataclass
class Table:
    """A titled table; ``rows`` hold already formatted cells."""

    headers: Sequence[str]
    rows: list[Sequence[str]] = field(default_factory=list)
    title: str = ""
    empty: str = ""
    """Printed instead of the table when it has no rows (nothing when empty)."""
    wide: Sequence[str] = ()
    """Headers of the columns shown only with -o wide (every row carries their cells)."""


@dataclass
class Result:
    """What a command produced: ``data`` for -o json|yaml, ``tables`` and ``lines`` for people."""

    data: Any
    tables: list[Table] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    """Text printed after the tables (hints, next steps)."""


def render_table(table: Table, *, wide: bool = False, headers: bool = True) -> str:
    """Columns padded to their widest cell, three spaces apart, like kubectl get.

    ``wide`` adds the table's wide columns; ``headers=False`` (--no-headers) leaves out the
    title, the header row and the text of an empty table, so only rows remain for scripts.
    """
    if not table.rows:
        return table.empty if headers else ""
    unknown = set(table.wide) - set(table.headers)
    if unknown:
        raise ValueError(f"wide columns {sorted(unknown)} are not headers of the table")
    shown = [i for i, h in enumerate(table.headers) if wide or h not in table.wide]
    grid = [[table.headers[i].upper() for i in shown]] if headers else []
    # Cells may hold text workloads wrote (an SDCReport's gpuUUID): never a control
    # character or an escape sequence reaches the terminal.
    grid += [[printable(row[i]) for i in shown] for row in table.rows]
    widths = [max(len(cells[col]) for cells in grid) for col in range(len(shown))]
    lines = ["   ".join(c.ljust(widths[i]) for i, c in enumerate(cells)).rstrip() for cells in grid]
    return "\n".join(([table.title] if table.title and headers else []) + lines)


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


def emit(result: Result, fmt: str, out: TextIO, *, headers: bool = True) -> None:
    """Write ``result`` in ``fmt`` (table, wide, json or yaml); ``headers=False`` is
    --no-headers, which only tables heed (as in kubectl)."""
    if fmt == "json":
        data = without_managed_fields(result.data)
        out.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
        return
    if fmt == "yaml":
        data = without_managed_fields(result.data)
        out.write(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))
        return
    blocks = [render_table(t, wide=fmt == "wide", headers=headers) for t in result.tables]
    blocks = [b for b in blocks if b]
    text = "\n\n".join(blocks)
    if result.lines:
        text = (text + "\n\n" if text else "") + "\n".join(
            printable(line, keep_newlines=True) for line in result.lines
        )
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
