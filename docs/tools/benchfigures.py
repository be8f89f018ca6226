"""Figures quoted in the docs come from bench/results, never typed by hand.

A page quotes a measured figure as a placeholder that names the result file and the
path to the value inside it::

    {{ bench:blast:rows/0/writes_per_second }}           -> 1.55
    {{ bench:scale:runs/nodes=1000/register_s|.1f }}     -> a format spec after |
    {{ bench-table:probe:targets }}                      -> a list of objects as a table
    {{ bench-table:detection:profiles?kind=fault|profile=id,golden=detectors/golden/activated }}
                               -> only the items whose kind is fault; the columns named
                                  label=path (an underscore in a label is a space)
    {{ bench-table:scale:runs?last-per=nodes|nodes,... }}  -> the last item per nodes value

The path's parts are separated by ``/``; a number picks a list's item, and
``key=value`` picks the one item of a list whose ``key`` is ``value`` (more than one
is refused: say which by number). The site's hook fills the placeholders when the site
is built; a placeholder that names a missing file or key stops the build. Benchmark
pages may hold no figure outside a placeholder (``hand_typed_figures``), so a figure
in the docs cannot disagree with the results it quotes.

Standard library only: the docs venv (MkDocs) and the test venv both import it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"

PLACEHOLDER = re.compile(
    r"\{\{\s*(?P<kind>bench|bench-table):(?P<file>[A-Za-z0-9_-]+):"
    r"(?P<path>[^|}]+?)(?:\|(?P<fmt>[^}]+?))?\s*\}\}"
)


class FigureError(ValueError):
    """A placeholder that names no value of bench/results."""


@dataclass(frozen=True)
class Placeholder:
    kind: str
    file: str
    path: str
    fmt: str | None
    text: str


def placeholders(markdown: str) -> Iterator[Placeholder]:
    for match in PLACEHOLDER.finditer(markdown):
        yield Placeholder(
            kind=match["kind"],
            file=match["file"],
            path=match["path"].strip(),
            fmt=match["fmt"],
            text=match[0],
        )


class Results:
    """bench/results/*.json, each read once."""

    def __init__(self, folder: Path = RESULTS) -> None:
        self.folder = folder
        self._loaded: dict[str, Any] = {}

    def document(self, name: str) -> Any:
        if name not in self._loaded:
            path = self.folder / f"{name}.json"
            if not path.is_file():
                raise FigureError(f"no result file bench/results/{name}.json")
            self._loaded[name] = json.loads(path.read_text())
        return self._loaded[name]

    def value(self, name: str, path: str) -> Any:
        node = self.document(name)
        walked = []
        for part in path.split("/"):
            part = part.strip()
            walked.append(part)
            where = f"bench/results/{name}.json at {'/'.join(walked)}"
            if isinstance(node, list) and part.isdigit():
                index = int(part)
                if index >= len(node):
                    raise FigureError(f"{where}: the list has {len(node)} items")
                node = node[index]
            elif isinstance(node, list) and "=" in part:
                key, wanted = part.split("=", 1)
                found = [
                    item for item in node if isinstance(item, dict) and str(item.get(key)) == wanted
                ]
                if len(found) != 1:
                    raise FigureError(
                        f"{where}: {len(found)} items have {key}={wanted}; exactly one must"
                    )
                node = found[0]
            elif isinstance(node, dict) and part in node:
                node = node[part]
            else:
                raise FigureError(f"{where}: no such key or item")
        return node


def format_value(value: Any, fmt: str | None) -> str:
    if fmt:
        try:
            return format(value, fmt)
        except (TypeError, ValueError) as error:
            raise FigureError(f"format {fmt!r} does not fit {value!r}: {error}") from error
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    if value is None:
        return "none"
    if isinstance(value, dict) and {"k", "n"} <= value.keys():
        return f"{value['k']}/{value['n']}"
    if isinstance(value, list) and all(not isinstance(v, (dict, list)) for v in value):
        return ", ".join(format_value(v, None) for v in value) or "none"
    if isinstance(value, dict) and all(not isinstance(v, (dict, list)) for v in value.values()):
        return ", ".join(f"{key} {format_value(item, None)}" for key, item in value.items())
    return str(value)


def _table_cell(value: Any) -> str:
    nested = isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value)
    nested = nested or (
        isinstance(value, dict)
        and not {"k", "n"} <= value.keys()
        and any(isinstance(v, (dict, list)) for v in value.values())
    )
    if nested:
        value = json.dumps(value)
    return format_value(value, None).replace("|", "\\|").replace("\n", " ")


def _item_value(item: Any, path: str) -> Any:
    node = item
    for part in path.split("/"):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def format_table(value: Any, where: str, selection: str | None, columns: str | None) -> str:
    """A list of objects as a Markdown table: every key of its items, or the columns
    named ``label=path``; ``selection`` (``key=value``) keeps the matching items."""
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise FigureError(f"{where}: bench-table needs a list of objects")
    if selection and selection.startswith("last-per="):
        key = selection.removeprefix("last-per=")
        last: dict[str, Any] = {}
        for item in value:
            last[str(item.get(key))] = item
        value = list(last.values())
    elif selection:
        key, _, wanted = selection.partition("=")
        value = [item for item in value if str(item.get(key)) == wanted]
        if not value:
            raise FigureError(f"{where}: no item has {selection}")
    if columns:
        pairs = [column.partition("=") for column in columns.split(",")]
        spec = [(label.replace("_", " "), path or label) for label, _, path in pairs]
    else:
        keys: list[str] = []
        for item in value:
            keys.extend(key for key in item if key not in keys)
        spec = [(key, key) for key in keys]
    for label, path in spec:
        if all(_item_value(item, path) is None for item in value):
            raise FigureError(f"{where}: no item has a value at {path} (column {label!r})")
    lines = ["| " + " | ".join(label for label, _ in spec) + " |", "|" + "---|" * len(spec)]
    for item in value:
        cells = []
        for _, path in spec:
            found = _item_value(item, path)
            cells.append("-" if found is None else _table_cell(found))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n" + "\n".join(lines) + "\n"


def fill(markdown: str, results: Results) -> str:
    """The page with every placeholder replaced by its value; FigureError on any miss."""

    def replace(match: re.Match[str]) -> str:
        path, _, selection = match["path"].strip().partition("?")
        value = results.value(match["file"], path)
        if match["kind"] == "bench-table":
            where = f"bench/results/{match['file']}.json at {path}"
            return format_table(value, where, selection or None, match["fmt"])
        if selection:
            raise FigureError(f"{match[0]}: a selection (?) is for bench-table only")
        return format_value(value, match["fmt"])

    return PLACEHOLDER.sub(replace, markdown)


_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK_TARGET = re.compile(r"\]\([^)]*\)")
_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_LIST_MARKER = re.compile(r"^\s*\d+\.\s", re.MULTILINE)
# A number standing alone: not part of a name such as F1, p99, H200, bf16 or fp32.
_FIGURE = re.compile(r"(?<![\w.\-/^])\d+(?:[.,]\d+)*(?![\w])")


def hand_typed_figures(markdown: str) -> list[str]:
    """Numbers in a page's prose and tables that no placeholder produced."""
    text = PLACEHOLDER.sub(" ", markdown)
    for pattern in (_FENCE, _COMMENT, _CODE_SPAN, _LINK_TARGET, _LIST_MARKER):
        text = pattern.sub(" ", text)
    return _FIGURE.findall(text)
