"""Which tests spend the suite's CPU, test by test.

    python -m bench.suite.testcpu [--out bench/results] [--top 25] LOG [LOG ...]

``tests/run-suites.sh``, run with ``SUITE_LOG_DIR``, leaves one ``<group>-cpu.jsonl``
per test group: a line per test with its wall time, its pytest process's CPU during
it (the test and the simulator's threads) and the CPU of the child processes that
ended within it (real probe runs, operators, tools). This ranks the tests by their
CPU, sums it by directory, and writes ``suite-testcpu.json``, ``suite-testcpu.md``
and ``suite-testcpu.png`` to ``--out``.

What a test's line cannot hold: the shared control plane's CPU (its processes end
with the session, and a session fixture's teardown is the last test's), and child
processes a test leaves running. ``bench.suite.cpu`` accounts for those by component;
the two together say where a change to the suite would save time.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent.parent / "results"
TOP = 25


@dataclass(frozen=True)
class TestCpu:
    test: str
    group: str
    wall_s: float
    self_cpu_s: float
    children_cpu_s: float

    @property
    def cpu_s(self) -> float:
        return self.self_cpu_s + self.children_cpu_s

    @property
    def directory(self) -> str:
        return self.test.split("::", 1)[0].rsplit("/", 1)[0]


def read(paths: Iterable[Path]) -> list[TestCpu]:
    """Every test line of the logs; the group is the log's name before ``-cpu``. A line
    that does not parse is skipped (a group cut short mid-write)."""
    out = []
    for path in paths:
        group = path.name.split("-cpu", 1)[0]
        for line in path.read_text(errors="replace").splitlines():
            try:
                doc = json.loads(line)
                out.append(
                    TestCpu(
                        str(doc["test"]),
                        group,
                        float(doc["wall_s"]),
                        float(doc["self_cpu_s"]),
                        float(doc["children_cpu_s"]),
                    )
                )
            except (ValueError, KeyError, TypeError):
                continue
    return out


def report(tests: list[TestCpu], top: int = TOP) -> dict[str, Any]:
    by_dir: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    by_group: dict[str, float] = defaultdict(float)
    for t in tests:
        row = by_dir[t.directory]
        row[0] += 1
        row[1] += t.cpu_s
        row[2] += t.children_cpu_s
        by_group[t.group] += t.cpu_s
    # The session's teardown (a group's control plane, reaped) counts by directory, not
    # among the tests.
    ranked = sorted((t for t in tests if "::" in t.test), key=lambda t: (-t.cpu_s, t.test))[:top]
    total = sum(t.cpu_s for t in tests)
    return {
        "tests": len(tests),
        "cpu_s": round(total, 1),
        "machine": {"python": platform.python_version()},
        "groups": {g: round(s, 1) for g, s in sorted(by_group.items())},
        "directories": [
            {
                "directory": d,
                "tests": int(n),
                "cpu_s": round(cpu, 1),
                "children_cpu_s": round(kids, 1),
                "share": round(cpu / total, 3) if total else 0.0,
            }
            for d, (n, cpu, kids) in sorted(by_dir.items(), key=lambda kv: -kv[1][1])
        ],
        "top": [
            {
                "rank": i,
                "test": t.test,
                "group": t.group,
                "cpu_s": round(t.cpu_s, 1),
                "children_cpu_s": round(t.children_cpu_s, 1),
                "wall_s": round(t.wall_s, 1),
            }
            for i, t in enumerate(ranked, 1)
        ],
    }


def markdown(doc: dict[str, Any]) -> str:
    out = [
        "# The suite's CPU, test by test",
        "",
        f"{doc['tests']:,} tests spent {doc['cpu_s']:,.0f} CPU-seconds in their own pytest "
        "processes and the child processes that ended within them (the shared control "
        "plane is not in these figures: see suite-cpu.md).",
        "",
        "| directory | tests | CPU-seconds | of which child processes | share |",
        "|---|---:|---:|---:|---:|",
    ]
    out += [
        f"| {d['directory']} | {d['tests']} | {d['cpu_s']:,.0f} | "
        f"{d['children_cpu_s']:,.0f} | {d['share']:.1%} |"
        for d in doc["directories"]
    ]
    out += [
        "",
        "| # | test | group | CPU-seconds | child processes | wall seconds |",
        "|---:|---|---|---:|---:|---:|",
    ]
    out += [
        f"| {r['rank']} | `{r['test']}` | {r['group']} | {r['cpu_s']:,.1f} | "
        f"{r['children_cpu_s']:,.1f} | {r['wall_s']:,.1f} |"
        for r in doc["top"]
    ]
    return "\n".join(out) + "\n"


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dirs = list(reversed(doc["directories"]))
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(dirs) + 1.2))
    own = [d["cpu_s"] - d["children_cpu_s"] for d in dirs]
    kids = [d["children_cpu_s"] for d in dirs]
    names = [d["directory"] for d in dirs]
    ax.barh(names, own, label="pytest process (tests, simulator)")
    ax.barh(names, kids, left=own, label="child processes (probes, operators, tools)")
    ax.set_xlabel("CPU-seconds")
    ax.set_title("The suite's CPU by test directory")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+", type=Path, help="<group>-cpu.jsonl files")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--top", type=int, default=TOP)
    args = parser.parse_args(list(argv) if argv is not None else None)
    tests = read(args.logs)
    if not tests:
        print("no test lines in the logs", file=sys.stderr)
        return 2
    doc = report(tests, args.top)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "suite-testcpu.json").write_text(json.dumps(doc, indent=2) + "\n")
    (args.out / "suite-testcpu.md").write_text(markdown(doc))
    plot(doc, args.out / "suite-testcpu.png")
    print(f"wrote suite-testcpu.* to {args.out} ({len(tests)} tests, {doc['cpu_s']:,.0f} CPU-s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
