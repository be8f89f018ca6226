"""How the demo shows itself: the live table, the summary, summary.json and the timeline PNG."""

from __future__ import annotations

import re
import shutil
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol, TextIO

from sdcdev.sim.demo_watch import (
    JOINING,
    PoolBudget,
    RecorderView,
    Reservation,
    waiting_on,
)

#: One colour per lifecycle state, for the picture (and ANSI codes for the terminal).
STATE_COLORS: Mapping[str, str] = {
    JOINING: "#e0e0e0",
    "Unqualified": "#bdbdbd",
    "Testing": "#6baed6",
    "Qualified": "#74c476",
    "Suspect": "#fd8d3c",
    "Quarantined": "#de2d26",
    "Repairing": "#9e9ac8",
    "Verifying": "#f1b6da",
    "Retired": "#252525",
    "Excluded": "#ffffff",
}
CUSTOMER_USE_COLOR = "#00441b"
_ANSI: Mapping[str, str] = {
    "Testing": "34",
    "Qualified": "32",
    "Suspect": "33",
    "Quarantined": "1;31",
    "Repairing": "35",
    "Verifying": "35",
    "Retired": "1;30",
}
_ANSI_CODE = re.compile(r"\x1b\[[0-9;]*m")
VERDICT_MARKERS: Mapping[str, tuple[str, str]] = {
    "Pass": ("o", "#006d2c"),
    "SDC": ("X", "#67000d"),
    "Timeout": ("s", "#525252"),
    "Crash": ("s", "#525252"),
    "Inconclusive": ("d", "#525252"),
}


def clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60:02d}:{seconds % 60:02d}"


def _paint(text: str, state: str, color: bool) -> str:
    code = _ANSI.get(state)
    return f"\x1b[{code}m{text}\x1b[0m" if color and code else text


def table_lines(
    view: RecorderView,
    *,
    title: str,
    quorum: int,
    repair_delay: float,
    pending: Sequence[str],
    color: bool = False,
    width: int = 200,
    recent: int = 6,
) -> list[str]:
    """The live table: header, one row per node, tickets, the latest transitions."""
    if view.baseline is None:
        baseline = "none yet"
    elif view.baseline.trusted:
        baseline = f"trusted ({view.baseline.agreeing} nodes agreed)"
    else:
        baseline = f"{view.baseline.agreeing}/{quorum} nodes agree"
    lines = [
        f"{title}  t={clock(view.t)}  probes: {view.probes_running} running, "
        f"{view.probes_queued} queued  baseline: {baseline}",
    ]
    waiting = "; ".join(pending[:3]) + (f" (+{len(pending) - 3} more)" if len(pending) > 3 else "")
    lines.append(f"waiting for: {waiting or 'nothing: done'}")
    lines.append("")
    header = f"{'NODE':<13} {'TYPE':<16} {'STATE':<12} {'TEST':<30} {'VERDICT':<16} WAITING ON"
    lines.append(header)
    for name, track in view.nodes.items():
        test = view.current_test(name)
        test_text = f"{test.reason} {test.phase}" if test else "-"
        last = view.last_verdict(name)
        verdict = "-"
        if last is not None:
            verdict = str(last.verdict or last.phase)
            if last.failed_checks:
                verdict += " " + ",".join(last.failed_checks)
        tag = " R" if track.real else " *" if track.faulty else ""
        row_state = f"{track.state:<12}"
        row = (
            f"{(name + tag):<13} {track.instance_type:<16} {_paint(row_state, track.state, color)} "
            f"{test_text[:30]:<30} {verdict[:16]:<16} "
            f"{waiting_on(view, name, quorum=quorum, repair_delay=repair_delay)}"
        )
        lines.append(row)
    if view.tickets:
        lines.append("")
        for ticket in sorted(view.tickets.values(), key=lambda r: r.opened):
            lines.append(
                f"ticket {ticket.name}: {ticket.node} {ticket.phase}, cycle {ticket.cycle}, "
                f"repair shop {ticket.external_id or '-'}, resolution {ticket.resolution or '-'}, "
                f"evidence {', '.join(ticket.evidence) or '-'}"
            )
    if view.transitions and recent:
        lines.append("")
        for tr in view.transitions[-recent:]:
            lines.append(f"  [{clock(tr.t)}] {tr.node}: {tr.old} -> {tr.new}")
    lines.append("")
    lines.append("* faulty in the fleet file (the operator does not know)")
    if any(t.real for t in view.nodes.values()):
        lines.append(
            "R real node (kubelet + containerd, probes in real containers; the demo injects "
            "a fault once it is Qualified)"
        )
    return [_fit(line, width) for line in lines]


def _fit(line: str, width: int) -> str:
    """Cut a line to the terminal width; ANSI colour codes take no room on screen."""
    hidden = sum(len(m) for m in _ANSI_CODE.findall(line))
    if len(line) - hidden <= width:
        return line
    return line[: width + hidden - 1] + "…"


class Display(Protocol):
    """Where the demo shows progress."""

    def update(self, view: RecorderView, pending: Sequence[str]) -> None: ...

    def note(self, text: str) -> None: ...

    def close(self) -> None: ...


class TerminalDisplay:
    """Redraws the table in place (a TTY)."""

    def __init__(
        self, title: str, quorum: int, repair_delay: float, stream: TextIO | None = None
    ) -> None:
        self.stream = stream or sys.stdout
        self.title = title
        self.quorum = quorum
        self.repair_delay = repair_delay
        self.notes: list[str] = []
        self.drawing = False

    def update(self, view: RecorderView, pending: Sequence[str]) -> None:
        size = shutil.get_terminal_size((160, 40))
        lines = table_lines(
            view,
            title=self.title,
            quorum=self.quorum,
            repair_delay=self.repair_delay,
            pending=pending,
            color=True,
            width=size.columns,
            recent=max(3, size.lines - len(view.nodes) - len(view.tickets) - 12),
        )
        lines += self.notes[-3:]
        if not self.drawing:
            self.drawing = True
            self.stream.write("\x1b[?25l")  # hide the cursor while redrawing
        self.stream.write("\x1b[H\x1b[J" + "\n".join(lines) + "\n")
        self.stream.flush()

    def note(self, text: str) -> None:
        if not self.drawing:  # set-up: plain lines until the table takes the screen
            self.stream.write(text + "\n")
            self.stream.flush()
        self.notes.append(text)

    def close(self) -> None:
        if self.drawing:
            self.stream.write("\x1b[?25h")
            self.stream.flush()


class PlainDisplay:
    """Plain lines (a pipe, a log, CI): transitions as they happen, the table now and then."""

    def __init__(
        self,
        title: str,
        quorum: int,
        repair_delay: float,
        stream: TextIO | None = None,
        every: float = 20.0,
    ) -> None:
        self.stream = stream or sys.stdout
        self.title = title
        self.quorum = quorum
        self.repair_delay = repair_delay
        self.every = every
        self._printed = 0
        self._last_table: float | None = None

    def update(self, view: RecorderView, pending: Sequence[str]) -> None:
        for tr in view.transitions[self._printed :]:
            self.stream.write(f"[{clock(tr.t)}] {tr.node}: {tr.old} -> {tr.new}\n")
        self._printed = len(view.transitions)
        if self._last_table is None or view.t - self._last_table >= self.every:
            self._last_table = view.t
            lines = table_lines(
                view,
                title=self.title,
                quorum=self.quorum,
                repair_delay=self.repair_delay,
                pending=pending,
                recent=0,
            )
            self.stream.write("\n".join(lines) + "\n")
        self.stream.flush()

    def note(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        self.stream.flush()


class NullDisplay:
    def update(self, view: RecorderView, pending: Sequence[str]) -> None:
        del view, pending

    def note(self, text: str) -> None:
        del text

    def close(self) -> None:
        pass


# Summary --------------------------------------------------------------------------------


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def build_summary(
    view: RecorderView,
    *,
    outcome: str,
    ok: bool,
    fleet: str,
    policy: str,
    timings: Mapping[str, float],
    settings: Mapping[str, Any],
    events: Sequence[Mapping[str, Any]],
    budgets: Mapping[str, PoolBudget],
    reservations: Sequence[Reservation],
) -> dict[str, Any]:
    """Everything the run showed, as a JSON-ready dict (summary.json; the picture reads it)."""
    nodes = []
    for name, track in view.nodes.items():
        tests = view.tests_of(name)
        sdc = [t.completed for t in tests if t.verdict == "SDC" and t.completed is not None]
        joined = track.states[0][0] if track.states else None
        quarantined = track.first("Quarantined")
        nodes.append(
            {
                "name": name,
                "instanceType": track.instance_type,
                "pool": track.pool,
                "faulty": track.faulty,
                "intermittent": track.intermittent,
                "real": track.real,
                "finalState": track.state,
                "path": track.path(),
                "states": [[_r(t), s] for t, s in track.states],
                "readiness": [[_r(t), r] for t, r in track.readiness],
                "customerUse": [[_r(a), _r(b if b is not None else view.t)] for a, b in track.busy],
                "joinedAt": _r(joined),
                "firstSdcVerdictAt": _r(min(sdc)) if sdc else None,
                "quarantinedAt": _r(quarantined),
                "timeToQuarantineSeconds": _r(quarantined - joined)
                if quarantined is not None and joined is not None
                else None,
                "tests": [t.name for t in tests],
                "tickets": [t.name for t in view.tickets_of(name)],
                "events": [e["reason"] for e in events if e.get("node") == name],
            }
        )
    seconds = sorted(p.seconds for p in view.probes if p.outcome in ("pass", "sdc"))
    return {
        "ok": ok,
        "outcome": outcome,
        "fleet": fleet,
        "policy": policy,
        "timings": {k: round(v, 1) for k, v in timings.items()},
        "settings": dict(settings),
        "nodes": nodes,
        "tests": [
            {
                "name": t.name,
                "node": t.node,
                "reason": t.reason,
                "suite": t.suite,
                "attempt": t.attempt,
                "phase": t.phase,
                "verdict": t.verdict,
                "why": t.why,
                "failedChecks": list(t.failed_checks),
                "created": _r(t.created),
                "started": _r(t.started),
                "completed": _r(t.completed),
            }
            for t in sorted(view.tests.values(), key=lambda r: (r.created, r.name))
        ],
        "tickets": [
            {
                "name": k.name,
                "node": k.node,
                "phase": k.phase,
                "cycle": k.cycle,
                "resolution": k.resolution,
                "externalId": k.external_id,
                "evidence": list(k.evidence),
                "opened": _r(k.opened),
                "closed": _r(k.closed),
                "history": [[_r(t), p] for t, p in k.history],
            }
            for k in sorted(view.tickets.values(), key=lambda r: (r.opened, r.name))
        ],
        "events": [dict(e) for e in events],
        "baseline": asdict(view.baseline) if view.baseline else None,
        "probes": {
            "runs": len(view.probes),
            "judged": len(seconds),
            "medianSeconds": _r(statistics.median(seconds)) if seconds else None,
            "minSeconds": _r(seconds[0]) if seconds else None,
            "maxSeconds": _r(seconds[-1]) if seconds else None,
            "runsList": [asdict(p) for p in sorted(view.probes, key=lambda p: p.finished)],
        },
        "budgets": {
            "pools": [
                {
                    "pool": b.pool,
                    "nodes": b.nodes,
                    "maxConcurrentTests": b.max_tests,
                    "maxUnavailableNodes": b.max_unavailable,
                    "peakTests": b.peak_tests,
                    "peakHeld": b.peak_held,
                    "peakScreeningHeld": b.peak_screening_held,
                    "samples": b.samples,
                    "testViolations": b.test_violations,
                    "screeningViolations": b.screening_violations,
                }
                for b in budgets.values()
            ],
            "reservations": [{**asdict(r), "withinBudget": r.within_budget} for r in reservations],
        },
    }


def summary_lines(summary: Mapping[str, Any]) -> list[str]:
    """The end-of-run summary for people."""
    t = summary["timings"]
    setup, plane = t.get("setupSeconds", 0.0), t.get("controlPlaneSeconds", 0.0)
    verb = "finished" if summary["ok"] else "did NOT finish"
    lines = [
        "",
        f"sdcguard demo {verb}: {summary['outcome']}",
        f"set-up {setup:.0f}s (control plane {plane:.0f}s), "
        f"lifecycle {t.get('lifecycleSeconds', 0.0):.0f}s",
        "",
        f"{'NODE':<13} {'FINAL':<10} {'QUARANTINED':<15} {'TICKET':<36} STATES PASSED THROUGH",
    ]
    tickets = {k["name"]: k for k in summary["tickets"]}
    for node in summary["nodes"]:
        q = node["timeToQuarantineSeconds"]
        quarantined = f"{q:.0f}s after join" if q is not None else "-"
        ticket_text = "-"
        if node["tickets"]:
            k = tickets[node["tickets"][-1]]
            ticket_text = f"{k['name']} {k['phase']}, cycle {k['cycle']}"
        tag = " R" if node.get("real") else " *" if node["faulty"] else ""
        lines.append(
            f"{(node['name'] + tag):<13} {node['finalState']:<10} {quarantined:<15} "
            f"{ticket_text:<36} {' > '.join(node['path'])}"
        )
    probes = summary["probes"]
    verdicts: dict[str, int] = {}
    for test in summary["tests"]:
        key = str(test["verdict"] or test["phase"])
        verdicts[key] = verdicts.get(key, 0) + 1
    lines.append("")
    if probes["judged"]:
        lines.append(
            f"probes: {probes['runs']} run for real, {probes['medianSeconds']:.1f}s median "
            f"({probes['minSeconds']:.1f}-{probes['maxSeconds']:.1f}s); tests: "
            + ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items()))
        )
    reservations = summary["budgets"]["reservations"]
    broken = [r for r in reservations if not r["withinBudget"]]
    test_over = sum(len(p["testViolations"]) for p in summary["budgets"]["pools"])
    lines.append(
        f"budgets: {len(reservations)} serving nodes taken for re-screening, "
        f"{len(broken)} over maxUnavailable; {test_over} samples over maxConcurrentTests"
    )
    lines.append("* faulty in the fleet file")
    if any(n.get("real") for n in summary["nodes"]):
        lines.append("R real node: probes in real containers, a fault injected by the demo")
    return lines


def plot_timeline(summary: Mapping[str, Any], path: Path) -> Path:
    """One row per node coloured by state over time, with a marker per test verdict."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    nodes = summary["nodes"]
    end = max(
        [float(summary["timings"].get("lifecycleSeconds", 0.0))]
        + [float(s[0]) for n in nodes for s in n["states"]]
        + [float(t["completed"]) for t in summary["tests"] if t["completed"] is not None]
    )
    height = 1.2 + 0.42 * len(nodes)
    fig, ax = plt.subplots(figsize=(12, height), dpi=110)
    rows = {n["name"]: i for i, n in enumerate(reversed(nodes))}
    seen_states: list[str] = []
    for node in nodes:
        y = rows[node["name"]]
        states = node["states"]
        for i, (start, state) in enumerate(states):
            stop = states[i + 1][0] if i + 1 < len(states) else end
            ax.broken_barh(
                [(start, max(0.0, stop - start))],
                (y - 0.35, 0.7),
                facecolors=STATE_COLORS.get(state, "#969696"),
                edgecolor="none",
            )
            if state not in seen_states:
                seen_states.append(state)
        use = [(a, b - a) for a, b in node.get("customerUse") or [] if b is not None]
        if use:
            ax.broken_barh(use, (y - 0.1, 0.2), facecolors=CUSTOMER_USE_COLOR, edgecolor="none")
        readiness = node.get("readiness") or []
        for i, (start, ready) in enumerate(readiness):
            if ready:
                continue
            stop = readiness[i + 1][0] if i + 1 < len(readiness) else end
            ax.broken_barh(
                [(start, stop - start)],
                (y - 0.35, 0.7),
                facecolors="none",
                edgecolor="#000000",
                hatch="///",
                linewidth=0,
            )
    for test in summary["tests"]:
        if test["completed"] is None or test["node"] not in rows:
            continue
        marker, color = VERDICT_MARKERS.get(str(test["verdict"]), ("d", "#525252"))
        ax.plot(
            test["completed"],
            rows[test["node"]],
            marker=marker,
            color=color,
            markersize=7,
            markeredgecolor="white",
            markeredgewidth=0.6,
            linestyle="none",
        )
    labels = []
    for node in reversed(nodes):
        tag = ""
        if node["faulty"]:
            tag = (
                " (real, fault injected)"
                if node.get("real")
                else " (intermittent)"
                if node["intermittent"]
                else " (faulty)"
            )
        labels.append(f"{node['name']}{tag}")
    ax.set_yticks(range(len(nodes)))
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_xlim(0, end * 1.01 if end else 1)
    ax.set_ylim(-0.6, len(nodes) - 0.4)
    ax.set_xlabel("seconds since the fleet joined")
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
    ax.set_title(
        f"sdcguard demo: fleet '{summary['fleet']}', {len(nodes)} nodes — {summary['outcome']}",
        fontsize=10,
    )
    handles: list[Any] = [
        Patch(facecolor=STATE_COLORS.get(s, "#969696"), label=s) for s in seen_states
    ]
    verdicts = {str(t["verdict"]) for t in summary["tests"] if t["completed"] is not None}
    for verdict in ("Pass", "SDC", "Timeout", "Inconclusive", "Crash"):
        if verdict in verdicts:
            marker, color = VERDICT_MARKERS[verdict]
            handles.append(
                Line2D(
                    [], [], marker=marker, color=color, linestyle="none", label=f"test: {verdict}"
                )
            )
    if any(n.get("customerUse") for n in nodes):
        handles.append(Patch(facecolor=CUSTOMER_USE_COLOR, label="in customer use"))
    if any(not r for n in nodes for _, r in n.get("readiness") or []):
        handles.append(Patch(facecolor="none", hatch="///", label="NotReady"))
    ax.legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=8,
        frameon=False,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
