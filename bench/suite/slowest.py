"""The suite's slowest tests, from pytest's own ``--durations`` report.

    python -m bench.suite.slowest --label after --note "..." LOG [LOG ...]

Reads the ``--durations`` lines of one or more pytest logs (``tests/run-suites.sh``
prints each group's, or runs of single directories), adds each test's setup, call
and teardown (a module or session fixture's set-up counts against the first test
that uses it, as pytest reports it), and records the twenty slowest under
``--label`` in ``bench/results/suite.json`` (other labels stay), with a note of how
they were measured. ``bench/results/suite.md`` shows every label's table;
docs/development.md quotes them with ``bench-table`` placeholders.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent.parent / "results" / "suite.json"
TOP = 20
_LINE = re.compile(r"^\s*(?P<s>\d+(?:\.\d+)?)s (?P<phase>setup|call|teardown)\s+(?P<test>\S+::\S+)")


def durations(lines: Iterable[str]) -> dict[str, float]:
    """Seconds per test id (setup + call + teardown) in pytest ``--durations`` lines."""
    total: dict[str, float] = defaultdict(float)
    for line in lines:
        match = _LINE.match(line)
        if match:
            total[match["test"]] += float(match["s"])
    return dict(total)


_SUMMARY = re.compile(r"^=*\s*(?P<counts>\d+ \w+.*?) in (?P<s>\d+(?:\.\d+)?)s\b")


def summary(lines: Iterable[str]) -> dict[str, Any] | None:
    """pytest's last line: what it counted and its wall time (None: no such line)."""
    found = None
    for line in lines:
        match = _SUMMARY.match(line.strip())
        if match:
            found = {"outcome": match["counts"].strip(), "seconds": float(match["s"])}
    return found


def slowest(per_test: dict[str, float], top: int = TOP) -> list[dict[str, Any]]:
    ranked = sorted(per_test.items(), key=lambda item: (-item[1], item[0]))[:top]
    return [
        {
            "rank": i,
            "test": test,
            "directory": test.split("::", 1)[0].rsplit("/", 1)[0],
            "seconds": round(seconds, 1),
        }
        for i, (test, seconds) in enumerate(ranked, 1)
    ]


def markdown(doc: dict[str, Any]) -> str:
    out = ["# The suite's slowest tests", ""]
    for label, run in doc["runs"].items():
        out += [f"## {label}", "", run["note"], "", "| log | outcome | seconds |", "|---|---|---|"]
        out += [
            f"| {g['log']} | {g['outcome']} | {g.get('seconds', '')} |" for g in run.get("logs", [])
        ]
        out += ["", "| # | test | seconds |", "|---|---|---|"]
        out += [f"| {r['rank']} | `{r['test']}` | {r['seconds']} |" for r in run["slowest"]]
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+", type=Path, help="pytest logs with --durations")
    parser.add_argument("--label", required=True, help="e.g. before, after")
    parser.add_argument("--note", required=True, help="how and where it was measured")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    per_test: dict[str, float] = {}
    logs: list[dict[str, Any]] = []
    for log in args.logs:
        lines = log.read_text(errors="replace").splitlines()
        for test, seconds in durations(lines).items():
            per_test[test] = per_test.get(test, 0.0) + seconds
        logs.append({"log": log.stem, **(summary(lines) or {"outcome": "unfinished"})})
    if not per_test:
        print("no --durations lines in the logs", file=sys.stderr)
        return 2
    doc: dict[str, Any] = (
        json.loads(args.results.read_text()) if args.results.exists() else {"runs": {}}
    )
    doc["runs"][args.label] = {
        "note": args.note,
        "host": {"cpus": _cpus(), "python": platform.python_version()},
        "logs": logs,
        "slowest": slowest(per_test),
    }
    args.results.write_text(json.dumps(doc, indent=2) + "\n")
    args.results.with_suffix(".md").write_text(markdown(doc))
    print(f"wrote {args.results} ({args.label}: {len(per_test)} tests in the reports)")
    return 0


def _cpus() -> int:
    import os

    return os.cpu_count() or 0


if __name__ == "__main__":
    raise SystemExit(main())
