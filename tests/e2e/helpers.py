"""Shared pieces of the end-to-end tests."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

from sdcguard.sim.demo import DemoResult
from sdcguard.sim.demo_report import PlainDisplay

PERMISSION_ERRORS = ("Forbidden", "forbidden", "Not enough permissions", " 403")


@dataclass(frozen=True)
class RunNames:
    """A run's own Helm release, namespace and policy, so runs never share objects."""

    release: str
    namespace: str
    policy: str


def progress(title: str) -> PlainDisplay:
    """Transitions and a table every 30 s on stdout: pytest shows them when a test fails."""
    return PlainDisplay(title, quorum=3, repair_delay=0, stream=sys.stdout, every=30)


def explain(result: DemoResult) -> str:
    """Why a run did not finish: its outcome and the operator's last words."""
    tail = "\n".join(result.operator_log.read_text(errors="replace").splitlines()[-40:])
    return f"{result.outcome}\n--- operator log (tail) ---\n{tail}"


def permission_errors(result: DemoResult) -> list[str]:
    """Operator log lines that say the chart's RBAC refused something."""
    text = result.operator_log.read_text(errors="replace")
    return [line for line in text.splitlines() if any(e in line for e in PERMISSION_ERRORS)]


def in_order(wanted: Sequence[object], seen: Sequence[object]) -> bool:
    """``wanted`` occurs in ``seen`` in this order (other items may come between)."""
    it = iter(seen)
    return all(any(s == w for s in it) for w in wanted)
