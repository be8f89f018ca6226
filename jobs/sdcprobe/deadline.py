"""When a check stops starting rounds, so that a run never ends past its budget.

The parent plans rounds from measured costs, but a node's load can change
inside a check. So every check also gets a deadline (on ``time.monotonic()``,
which all processes of a host share): a round that its estimate says would end
past the deadline is not started. The rounds a baseline covers always run, so
a cut check is still complete for judging. What is left of an overrun is the
round in progress when the node slowed down, which is short by construction
(a round is one GEMM per dtype, one set of collectives, one memory pattern or
one training step). Torch-free.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class RoundClock:
    """One check's deadline and how it is applied."""

    #: ``time.monotonic()`` by which the check's last round must end; None: no limit.
    deadline: float | None
    #: Rounds that always run (a baseline covers them).
    minimum: int
    #: Safety share added to a round's estimated cost (from the measured variance).
    margin: float = 0.0
    #: The plan's estimate of one round, used until the check has timed its own.
    round_s: float = 0.0

    def allows(self, done: int, next_s: float | None = None) -> bool:
        """Whether another round may start after ``done`` rounds, if it costs ``next_s``
        seconds (default: the plan's estimate)."""
        if self.deadline is None or done < self.minimum:
            return True
        cost = self.round_s if next_s is None or next_s <= 0 else next_s
        return time.monotonic() + cost * (1.0 + self.margin) <= self.deadline


def round_spread(times: list[float]) -> float:
    """Coefficient of variation (standard deviation over mean) of a check's rounds after
    the first (which pays for lazy set-up); 0 with fewer than two of them."""
    later = times[1:]
    if len(later) < 2:
        return 0.0
    mean = sum(later) / len(later)
    if mean <= 0:
        return 0.0
    var = sum((t - mean) ** 2 for t in later) / (len(later) - 1)
    return math.sqrt(var) / mean


#: The safety margin is this many coefficients of variation of the round times...
MARGIN_Z = 1.5
#: ...but never below or above these shares of a round's cost. The cap is low because
#: the margin only keeps the checks balanced: the deadlines keep the run in its budget.
MIN_MARGIN, MAX_MARGIN = 0.02, 0.10


def safety_margin(spreads: list[float]) -> float:
    """Share by which planned round costs are stretched: ``MARGIN_Z`` times the pooled
    (root mean square) coefficient of variation of the rounds measured so far, within
    [``MIN_MARGIN``, ``MAX_MARGIN``]. A quiet node plans close to its budget; a node
    whose rounds scatter keeps more in hand."""
    if not spreads:
        return MIN_MARGIN
    pooled = math.sqrt(sum(s * s for s in spreads) / len(spreads))
    return min(max(MARGIN_Z * pooled, MIN_MARGIN), MAX_MARGIN)
