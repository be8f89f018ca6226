"""End-to-end runs of the simulated fleet with the real operator, on the session's control
plane. Each run installs the chart's CRDs and RBAC under its own release and namespace,
runs the operator as the chart's ServiceAccount, and removes everything it created."""

from __future__ import annotations

import sys
import uuid
from dataclasses import dataclass

import pytest

from sdcguard.sim.demo import DemoResult
from sdcguard.sim.demo_report import PlainDisplay


@dataclass(frozen=True)
class RunNames:
    release: str
    namespace: str
    policy: str


@pytest.fixture
def names() -> RunNames:
    suffix = uuid.uuid4().hex[:5]
    return RunNames(
        release=f"sdcguard-e2e-{suffix}",
        namespace=f"sdcguard-e2e-{suffix}",
        policy=f"e2e-{suffix}",
    )


def progress(title: str) -> PlainDisplay:
    """Transitions and a table every 30 s on stdout: pytest shows them when a test fails."""
    return PlainDisplay(title, quorum=3, repair_delay=0, stream=sys.stdout, every=30)


def explain(result: DemoResult) -> str:
    """Why a run did not finish: its outcome and the operator's last words."""
    tail = "\n".join(result.operator_log.read_text(errors="replace").splitlines()[-40:])
    return f"{result.outcome}\n--- operator log (tail) ---\n{tail}"
