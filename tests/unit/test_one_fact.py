"""Facts stated once: the time parser and the API group live in ``sdcguard.api.common``;
everything else in the operator, its CLI and its simulator imports them, so a second
copy (one that reads a fraction or an offset differently, or a group that drifts) fails
here rather than in a cluster."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

from sdcguard.api.common import API_VERSION, GROUP, parse_time
from sdcguard.domain import keys

OPERATOR = Path(__file__).resolve().parents[2] / "operator" / "sdcguard"
HOME = OPERATOR / "api" / "common.py"


def _sources() -> list[Path]:
    return sorted(p for p in OPERATOR.rglob("*.py") if p != HOME)


def test_one_time_parser() -> None:
    parsers = re.compile(r"\b(fromisoformat|strptime|isoparse)\(")
    found = [
        f"{path.relative_to(OPERATOR)}:{n}"
        for path in _sources()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if parsers.search(line)
    ]
    assert found == [], f"parse times with sdcguard.api.common.parse_time: {found}"
    assert keys.parse_time is parse_time


def test_one_api_group_constant() -> None:
    # The API models' apiVersion is a Literal type (its value must be spelled there).
    copies = re.compile(r"""["']sdcguard\.dev["']|["']sdcguard\.dev/v1(alpha|beta)1["']""")
    found = [
        f"{path.relative_to(OPERATOR)}:{n}"
        for path in _sources()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if copies.search(line) and "Literal[" not in line
    ]
    assert found == [], f"use sdcguard.api.common.GROUP / API_VERSION: {found}"
    assert f"{GROUP}/" == keys.PREFIX and f"{GROUP}/v1beta1" == API_VERSION


def test_the_time_parser_reads_what_kubernetes_writes() -> None:
    utc = dt.UTC
    assert parse_time("2026-12-06T01:02:03Z") == dt.datetime(2026, 12, 6, 1, 2, 3, tzinfo=utc)
    assert parse_time("2026-12-06T01:02:03.250000Z") == dt.datetime(
        2026, 12, 6, 1, 2, 3, 250000, tzinfo=utc
    )
    assert parse_time("2026-12-06T02:02:03+01:00") == dt.datetime(2026, 12, 6, 1, 2, 3, tzinfo=utc)
    assert parse_time("2026-12-06T01:02:03") == dt.datetime(2026, 12, 6, 1, 2, 3, tzinfo=utc)
    naive = dt.datetime(2026, 12, 6, 1, 2, 3)
    assert parse_time(naive) == naive.replace(tzinfo=utc)
    assert parse_time("yesterday") is None and parse_time("") is None and parse_time(None) is None
