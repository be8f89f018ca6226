"""When a screening should end, from its budget: what the SDCTest shows while it runs.

The probe plans its rounds to fill the suite's budget, counted from the probe's own
start. Before that the Pod is scheduled, its image pulled (cached on a node that was
screened before) and its container started; after it the operator reads the result
within a pass. ``START_ALLOWANCE`` covers both. The Job's activeDeadlineSeconds ends the
screening in any case, so the expected end is never later than that.
"""

from __future__ import annotations

import datetime as dt

from sdcguard.api import SDCPolicySpec, Suite

START_ALLOWANCE = dt.timedelta(seconds=120)
"""Pod start (scheduling, a cached image, container start) and reading the result."""


def expected_end(
    start: dt.datetime, budget_seconds: int, active_deadline_seconds: int
) -> dt.datetime:
    """The Job's ``start`` plus the budget plus ``START_ALLOWANCE``, at most the Job's
    deadline."""
    planned = dt.timedelta(seconds=budget_seconds) + START_ALLOWANCE
    return start + min(planned, dt.timedelta(seconds=active_deadline_seconds))


def running_fields(spec: SDCPolicySpec, suite: Suite, start: dt.datetime) -> dict[str, object]:
    """The SDCTest status fields a screening of ``suite`` gets when its Job starts at
    ``start``: ``budget_seconds`` and ``expected_end``."""
    budget = spec.suite_budget(suite)
    return {
        "budget_seconds": budget,
        "expected_end": expected_end(start, budget, spec.probe.active_deadline_seconds),
    }
