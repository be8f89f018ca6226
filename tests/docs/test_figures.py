"""Figures in the docs come from bench/results: each placeholder names a value that
exists, benchmark pages hold no figure typed by hand, and no user page carries a
run's date or a commit hash (those stay in bench/results)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.docs.helpers import DOCS, REPO, load_tool, site_pages

benchfigures = load_tool("benchfigures")
BENCHMARK_PAGES = sorted((DOCS / "benchmarks").glob("*.md"))
_DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
_HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")


def _name(path: Path) -> str:
    return str(path.relative_to(REPO))


def test_there_are_benchmark_pages_with_figures() -> None:
    assert BENCHMARK_PAGES, "docs/benchmarks/ has no page"
    quoted = [p for page in BENCHMARK_PAGES for p in benchfigures.placeholders(page.read_text())]
    assert len(quoted) > 20, "benchmark pages should quote their figures from bench/results"


@pytest.mark.parametrize("page", site_pages(), ids=_name)
def test_every_placeholder_names_a_value_of_bench_results(page: Path) -> None:
    benchfigures.fill(page.read_text(), benchfigures.Results())


@pytest.mark.parametrize("page", BENCHMARK_PAGES, ids=_name)
def test_benchmark_pages_hold_no_hand_typed_figure(page: Path) -> None:
    typed = benchfigures.hand_typed_figures(page.read_text())
    assert typed == [], (
        f"{_name(page)} types figures by hand: {typed}; quote them from bench/results "
        "with {{ bench:FILE:PATH }} (see docs/tools/benchfigures.py), or write words"
    )


@pytest.mark.parametrize("page", site_pages(), ids=_name)
def test_user_docs_hold_no_run_dates_or_commit_hashes(page: Path) -> None:
    text = page.read_text()
    assert _DATE.findall(text) == [], f"{_name(page)} holds dates; they stay in bench/results"
    assert _HASH.findall(text) == [], f"{_name(page)} holds commit hashes"


def test_a_filled_figure_is_the_value_in_the_json(tmp_path: Path) -> None:
    (tmp_path / "demo.json").write_text(
        json.dumps(
            {
                "rows": [{"nodes": 1000, "p99": 0.2211}, {"nodes": 5000, "p99": 0.5}],
                "verdicts": {"pass": 100},
                "recall": {"k": 9, "n": 10},
            }
        )
    )
    results = benchfigures.Results(tmp_path)
    page = (
        "{{ bench:demo:rows/nodes=5000/p99 }} {{ bench:demo:rows/0/nodes }} "
        "{{ bench:demo:rows/0/p99|.2f }} {{ bench:demo:verdicts }} {{ bench:demo:recall }}"
    )
    assert benchfigures.fill(page, results) == "0.5 1,000 0.22 pass 100 9/10"
    table = benchfigures.fill("{{ bench-table:demo:rows?last-per=nodes|nodes,p_99=p99 }}", results)
    assert "| nodes | p 99 |" in table
    assert "| 5,000 | 0.5 |" in table


@pytest.mark.parametrize(
    "placeholder",
    [
        "{{ bench:missing:rows }}",
        "{{ bench:demo:rows/7/nodes }}",
        "{{ bench:demo:rows/nodes=1/p99 }}",
        "{{ bench:demo:nowhere }}",
        "{{ bench-table:demo:rows|nodes,absent_column=absent }}",
    ],
)
def test_a_placeholder_that_names_nothing_fails(tmp_path: Path, placeholder: str) -> None:
    (tmp_path / "demo.json").write_text(json.dumps({"rows": [{"nodes": 1000, "p99": 0.2}]}))
    with pytest.raises(benchfigures.FigureError):
        benchfigures.fill(placeholder, benchfigures.Results(tmp_path))


def test_hand_typed_figures_are_found_and_names_with_digits_are_not() -> None:
    text = (
        "F6 on an H200 in bf16 with p99 under `30 s`; but 2-core machines took 12.5 s and "
        "1,000 nodes. {{ bench:demo:rows/0/p99 }}\n\n```text\n99 in a block\n```\n"
    )
    assert benchfigures.hand_typed_figures(text) == ["2", "12.5", "1,000"]
