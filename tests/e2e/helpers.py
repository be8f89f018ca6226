"""Shared pieces of the end-to-end tests."""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from sdcdev.sim.demo import DemoResult
from sdcdev.sim.demo_report import PlainDisplay

PERMISSION_ERRORS = re.compile(r"Forbidden|forbidden|Not enough permissions|(?<![\w.])403(?![\w.])")
"""What a refusal by RBAC looks like in a log line; 403 only as a number of its own (a
probe's message may count, say, 403383 corruptions)."""


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


def refusals(lines: Sequence[str]) -> list[str]:
    """The log lines that say RBAC refused something."""
    return [line for line in lines if PERMISSION_ERRORS.search(line)]


def permission_errors(result: DemoResult) -> list[str]:
    """Operator log lines that say the chart's RBAC refused something."""
    return refusals(result.operator_log.read_text(errors="replace").splitlines())


def in_order(wanted: Sequence[object], seen: Sequence[object]) -> bool:
    """``wanted`` occurs in ``seen`` in this order (other items may come between)."""
    it = iter(seen)
    return all(any(s == w for s in it) for w in wanted)
