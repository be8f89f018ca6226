"""Where the suite's CPU goes: a command run under a sampler of every process.

    python -m bench.suite.cpu [--out bench/results] [--every 1.0] -- make test

The suite runs its test groups at once on a small machine, so its wall time is
bounded by its CPU: the machine's busy CPU-seconds divided by its cores. This runs a
command (the suite, or any part of it) and, every ``--every`` seconds, reads each
process's CPU time from ``/proc``. It adds each process's growth to the component its
command line names (real probe runs, the API server, the operator, pytest, ...) and
to the test group whose pytest started it, and compares the sum with the machine's
busy time from ``/proc/stat`` over the same span. What no sample saw (processes that
lived less than one interval, and the kernel's own threads) is reported as unseen.

Writes ``suite-cpu.json``, ``suite-cpu.md`` and ``suite-cpu.png`` to ``--out`` and
exits with the command's status. Every minute it prints how far the command is and
the largest components so far.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent.parent / "results"
TICKS = os.sysconf("SC_CLK_TCK")

#: (component, pattern in the command line), first match wins.
COMPONENTS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern))
    for name, pattern in (
        ("real probe runs", r"\bsdcprobe\b"),
        ("training runs", r"\bsdctrain\b|torchrun|bench\.training"),
        ("kube-apiserver", r"kube-apiserver"),
        ("etcd", r"^(\S*/)?etcd\s"),
        ("kube-controller-manager", r"kube-controller-manager"),
        ("kube-scheduler", r"kube-scheduler"),
        ("kubelet and containerd", r"^(\S*/)?(kubelet|containerd|containerd-shim\S*|runc)\b"),
        ("Karpenter", r"karpenter"),
        ("operator", r"-m sdcguard\b|sdcguard-operator|sdcguard\.__main__"),
        ("helm and kubectl", r"^(\S*/)?(helm|kubectl)\b"),
        ("lint, types, docs, build", r"mypy|ruff|lint-imports|mkdocs|checkov|buildah|^(\S*/)?go\s"),
        ("pytest (tests, simulator)", r"pytest"),
    )
)
OTHER = "other processes"
UNSEEN = "unseen (short-lived processes, kernel)"


def component_of(cmdline: str) -> str:
    """The component a process belongs to, by its command line."""
    for name, pattern in COMPONENTS:
        if pattern.search(cmdline):
            return name
    return OTHER


def group_of(pytest_cmdline: str, groups: dict[str, tuple[str, ...]]) -> str | None:
    """The test group a pytest command line runs (the first group whose directory it
    names), or None."""
    for group, dirs in groups.items():
        if any(re.search(rf"(^|\s){re.escape(d)}(\s|$)", pytest_cmdline) for d in dirs):
            return group
    return None


def suite_groups(script: Path) -> dict[str, tuple[str, ...]]:
    """The groups ``tests/run-suites.sh`` declares: ``[A]="dir dir ..."``."""
    found = re.findall(r'\[(\w)\]="([^"]+)"', script.read_text()) if script.exists() else []
    return {g: tuple(dirs.split()) for g, dirs in found}


@dataclass
class Proc:
    cmdline: str
    ppid: int
    cpu: float


def read_procs(root: Path = Path("/proc")) -> dict[tuple[int, str], Proc]:
    """Every process now: (pid, start time) -> its command line, parent and CPU seconds."""
    procs: dict[tuple[int, str], Proc] = {}
    for entry in root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # gone meanwhile
        fields = stat[stat.rfind(")") + 2 :].split()
        cpu = (int(fields[11]) + int(fields[12])) / TICKS
        cmd = raw.replace(b"\0", b" ").decode(errors="replace").strip()
        procs[(int(entry.name), fields[19])] = Proc(cmd, int(fields[1]), cpu)
    return procs


def busy_seconds(stat: Path = Path("/proc/stat")) -> float:
    """The machine's busy CPU-seconds since boot (all CPUs; idle and iowait excluded)."""
    values = [int(v) for v in stat.read_text().splitlines()[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values[:8]) - idle) / TICKS


@dataclass
class Tally:
    """CPU seconds by component and by test group, from successive samples. A process
    whose command line names no component (a probe's replica, a shell a test started)
    counts with its nearest ancestor that does."""

    groups: dict[str, tuple[str, ...]]
    root: int | None = None
    """The sampler's own process: only its descendants inherit a component."""
    by_component: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    by_group: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    _last: dict[tuple[int, str], float] = field(default_factory=dict)
    _where: dict[tuple[int, str], tuple[str, str]] = field(default_factory=dict)

    def sample(self, procs: dict[tuple[int, str], Proc], first: bool = False) -> None:
        """Add each process's growth since the last sample. On the first sample only
        the starting points are taken (what processes spent before does not count)."""
        by_pid = {key[0]: (key, proc) for key, proc in procs.items()}
        for key, proc in procs.items():
            grown = proc.cpu - self._last.get(key, proc.cpu if first else 0.0)
            if grown > 0:
                component, group = self._resolve(key, by_pid)
                self.by_component[component] += grown
                self.by_group[group] += grown
        self._last = {key: proc.cpu for key, proc in procs.items()}

    def _resolve(
        self, key: tuple[int, str], by_pid: dict[int, tuple[tuple[int, str], Proc]]
    ) -> tuple[str, str]:
        """(component, test group) of a process, worked out once per process. Only the
        measured command's own descendants inherit an ancestor's component."""
        if key in self._where:
            return self._where[key]
        own = component_of(by_pid[key[0]][1].cmdline)
        inherited, group, descendant = own, "outside the test groups", False
        pid, depth = key[0], 0
        while depth < 64:
            if pid == self.root:
                descendant = True
                break
            if pid not in by_pid:
                break
            _, proc = by_pid[pid]
            if inherited == OTHER:
                inherited = component_of(proc.cmdline)
            if group == "outside the test groups" and "pytest" in proc.cmdline:
                named = group_of(proc.cmdline, self.groups)
                if named is not None:
                    group = f"group {named}"
            pid, depth = proc.ppid, depth + 1
        self._where[key] = (inherited if descendant else own, group)
        return self._where[key]


def report(
    tally: Tally, busy: float, wall: float, cores: int, command: list[str], rc: int
) -> dict[str, Any]:
    seen = sum(tally.by_component.values())
    components = dict(tally.by_component)
    components[UNSEEN] = max(0.0, busy - seen)
    rows = [
        {"component": name, "cpu_s": round(s, 1), "share": round(s / busy, 3) if busy else None}
        for name, s in sorted(components.items(), key=lambda item: -item[1])
        if s >= 0.05
    ]
    groups = [
        {"group": name, "cpu_s": round(s, 1)}
        for name, s in sorted(tally.by_group.items(), key=lambda item: item[0])
    ]
    return {
        "command": " ".join(command),
        "exit_status": rc,
        "wall_s": round(wall, 1),
        "cores": cores,
        "busy_cpu_s": round(busy, 1),
        "cpu_floor_s": round(busy / cores, 1),
        "floor_share_of_wall": round(busy / cores / wall, 3) if wall else None,
        "components": rows,
        "groups": groups,
        "machine": {"python": platform.python_version(), "cores": cores},
    }


def markdown(doc: dict[str, Any]) -> str:
    lines = [
        "# Where the suite's CPU goes",
        "",
        f"`{doc['command']}` (exit status {doc['exit_status']}) took {doc['wall_s']:,.0f} s "
        f"on {doc['cores']} cores and kept them busy for {doc['busy_cpu_s']:,.0f} CPU-seconds: "
        f"on these cores it cannot take less than {doc['cpu_floor_s']:,.0f} s "
        f"({doc['floor_share_of_wall']:.0%} of the time it took).",
        "",
        "| component | CPU-seconds | share |",
        "|---|---:|---:|",
    ]
    for row in doc["components"]:
        share = f"{row['share']:.1%}" if row["share"] is not None else ""
        lines.append(f"| {row['component']} | {row['cpu_s']:,.0f} | {share} |")
    lines += ["", "| test group | CPU-seconds |", "|---|---:|"]
    lines += [f"| {g['group']} | {g['cpu_s']:,.0f} |" for g in doc["groups"]]
    return "\n".join(lines) + "\n"


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["components"]
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(rows) + 1.4))
    ax.barh([r["component"] for r in rows], [r["cpu_s"] for r in rows], color="#4a7")
    ax.invert_yaxis()
    ax.set_xlabel("CPU-seconds")
    ax.set_title(
        f"{doc['busy_cpu_s']:,.0f} CPU-s on {doc['cores']} cores: "
        f"at least {doc['cpu_floor_s'] / 60:.0f} min (it took {doc['wall_s'] / 60:.0f} min)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _largest(tally: Tally, n: int = 3) -> str:
    top = sorted(tally.by_component.items(), key=lambda item: -item[1])[:n]
    return ", ".join(f"{name} {s:,.0f} s" for name, s in top)


def run(
    command: list[str], every: float, groups: dict[str, tuple[str, ...]]
) -> tuple[Tally, float, float, int]:
    """Run ``command`` under the sampler: (tally, busy CPU-s, wall s, exit status)."""
    tally = Tally(groups, root=os.getpid())
    tally.sample(read_procs(), first=True)
    busy0, t0, said = busy_seconds(), time.monotonic(), 0.0
    child = subprocess.Popen(command)
    while child.poll() is None:
        time.sleep(every)
        tally.sample(read_procs())
        elapsed = time.monotonic() - t0
        if elapsed - said >= 60:
            said = elapsed
            print(
                f"[suite-cpu] {elapsed / 60:.0f} min, waiting for {command[0]} (pid "
                f"{child.pid}); largest so far: {_largest(tally)}",
                file=sys.stderr,
                flush=True,
            )
    tally.sample(read_procs())
    return tally, busy_seconds() - busy0, time.monotonic() - t0, child.returncode


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--every", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG ...]")
    args = parser.parse_args(list(argv) if argv is not None else None)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to measure after --, e.g. -- make test")
    groups = suite_groups(Path(__file__).resolve().parents[2] / "tests" / "run-suites.sh")
    tally, busy, wall, rc = run(command, args.every, groups)
    doc = report(tally, busy, wall, os.cpu_count() or 1, command, rc)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "suite-cpu.json").write_text(json.dumps(doc, indent=2) + "\n")
    (args.out / "suite-cpu.md").write_text(markdown(doc))
    plot(doc, args.out / "suite-cpu.png")
    print(markdown(doc))
    return rc


if __name__ == "__main__":
    sys.exit(main())
