"""The chart README's default-suites table says what the chart renders: the checks each
suite runs and its budget, read from the SDCPolicy the default values render."""

from __future__ import annotations

import re

from sdcguard.api import SDCPolicySpec, Suite
from tests.chart.helm import CHART, find, render

CHECKS = ("compute", "collective", "golden", "memory")


def _table() -> dict[str, dict[str, str]]:
    text = (CHART / "README.md").read_text()
    start = text.index("Default suites:")
    rows: dict[str, dict[str, str]] = {}
    for line in text[start:].splitlines()[1:]:
        if not line.startswith("| `"):
            if rows:
                break
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        suite = re.match(r"`(\w+)`", cells[0])
        assert suite, line
        rows[suite.group(1)] = dict(zip((*CHECKS, "budget"), cells[1:], strict=True))
    return rows


def test_the_readme_suites_table_matches_the_rendered_policy() -> None:
    spec = SDCPolicySpec.model_validate(find(render({}), "SDCPolicy")["spec"])
    table = _table()
    assert set(table) == {s.value for s in Suite}
    for suite in Suite:
        row = table[suite.value]
        runs = {check.name for check in spec.suites.checks(suite)}
        for check in CHECKS:
            assert row[check] == ("on" if check in runs else "off"), (suite, check)
        assert int(row["budget"]) == spec.suite_budget(suite), suite
