"""The circuit breaker: stop quarantining when too many screenings fail at once.

A storm of SDC verdicts is far more likely a bad probe image, driver or baseline than
a fleet going bad at once (about 1 device in 1,000 has SDC). The breaker records one
sample per finished screening (found SDC or not) and trips when, within a sliding
``window``, at least ``minSamples`` screenings ran and more than
``maxFailureFraction`` of them found SDC (3 of 5 with 0.5 trips; 2 of 4 does not).

While open, confirmed failures are held (the node stays Suspect and tainted) instead
of quarantined, and routine re-screening stops; releases, repair verification and
acceptance of new (gated) nodes continue. The breaker stays open until a person
resets it by annotating the policy ``sdcguard.dev/reset-breaker=<any new value>``;
samples from before the reset are then ignored.

The state is a pure function of (samples, config, now, reset time, time it tripped):
the operator keeps the samples and ``trippedAt`` in the policy status (:func:`prune`
keeps what the state needs), so a restart reconstructs the same state;
:func:`advance` does the whole step from one status to the next.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sdcguard.api import BreakerSample, BreakerState, BreakerStatus, CircuitBreaker, parse_duration
from sdcguard.domain.keys import RESET_BREAKER, format_time

MAX_SAMPLES = 500


@dataclass(frozen=True)
class Sample:
    """One finished screening."""

    at: dt.datetime
    failed: bool
    node: str = ""
    test: str = ""


@dataclass(frozen=True)
class BreakerView:
    """The breaker's state and the numbers behind it."""

    open: bool
    samples: int
    """Screenings in the window that decided the state (the trip window while open)."""
    failures: int
    tripped_at: dt.datetime | None
    window: str
    min_samples: int
    max_failure_fraction: float

    def explain(self) -> str:
        """A sentence for the policy condition, e.g.
        "3 of 5 screenings failed in the last 1h (limit 50%)"."""
        limit = f"{self.max_failure_fraction * 100:g}%"
        counts = f"{self.failures} of {self.samples} screenings failed in the last {self.window}"
        if self.open:
            assert self.tripped_at is not None
            return (
                f"{counts} (limit {limit}); quarantines held since {format_time(self.tripped_at)}; "
                f"investigate, then annotate the policy {RESET_BREAKER}=<new value> to reset"
            )
        if self.samples < self.min_samples:
            return f"{counts}; the breaker trips only with at least {self.min_samples} screenings"
        return f"{counts} (limit {limit})"


def _window(samples: Sequence[Sample], end: dt.datetime, seconds: float) -> list[Sample]:
    start = end - dt.timedelta(seconds=seconds)
    return [s for s in samples if start < s.at <= end]


def _relevant(
    samples: Iterable[Sample], now: dt.datetime, reset_at: dt.datetime | None
) -> list[Sample]:
    return sorted(
        (s for s in samples if s.at <= now and (reset_at is None or s.at > reset_at)),
        key=lambda s: s.at,
    )


def _view(
    window: Sequence[Sample], config: CircuitBreaker, tripped_at: dt.datetime | None
) -> BreakerView:
    return BreakerView(
        open=tripped_at is not None,
        samples=len(window),
        failures=sum(1 for s in window if s.failed),
        tripped_at=tripped_at,
        window=config.window,
        min_samples=config.min_samples,
        max_failure_fraction=config.max_failure_fraction,
    )


def evaluate(
    samples: Iterable[Sample],
    config: CircuitBreaker,
    now: dt.datetime,
    reset_at: dt.datetime | None = None,
    tripped_at: dt.datetime | None = None,
) -> BreakerView:
    """The breaker at ``now``.

    Open if it tripped before (``tripped_at``, from the status) and was not reset since,
    or if a window ending at a screening within the last ``window`` trips now. A pass
    can trip it too: it may bring the window up to ``minSamples`` while the failed share
    is already over the limit (3 failures, then 2 passes, with minSamples 5). Windows
    ending earlier are not re-checked: pruned samples could not answer for them.
    """
    seconds = parse_duration(config.window)
    ordered = _relevant(samples, now, reset_at)
    if tripped_at is not None and (reset_at is None or tripped_at > reset_at):
        return _view(_window(ordered, tripped_at, seconds), config, tripped_at)
    # Every window ending at a recent screening, in one sweep: both window edges only
    # move forward, and a running count of failures gives each window's share.
    span = dt.timedelta(seconds=seconds)
    recent = now - span
    failed_before = [0]
    for sample in ordered:
        failed_before.append(failed_before[-1] + (1 if sample.failed else 0))
    low = high = 0
    for sample in ordered:
        if sample.at <= recent:
            continue
        end = sample.at
        while high < len(ordered) and ordered[high].at <= end:
            high += 1
        while low < high and ordered[low].at <= end - span:
            low += 1
        count, failures = high - low, failed_before[high] - failed_before[low]
        if count >= config.min_samples and failures / count > config.max_failure_fraction:
            return _view(ordered[low:high], config, tripped_at=end)
    return _view(_window(ordered, now, seconds), config, tripped_at=None)


def prune(
    samples: Iterable[Sample],
    config: CircuitBreaker,
    now: dt.datetime,
    reset_at: dt.datetime | None = None,
    tripped_at: dt.datetime | None = None,
) -> list[Sample]:
    """The samples worth keeping: two windows back (every window :func:`evaluate` checks
    ends within the last one), and while open the window that tripped it.

    ``evaluate`` of the result equals ``evaluate`` of the input, as long as no more than
    MAX_SAMPLES samples are needed (then the newest are kept).
    """
    seconds = parse_duration(config.window)
    since = now - dt.timedelta(seconds=2 * seconds)
    if tripped_at is not None:
        since = min(since, tripped_at - dt.timedelta(seconds=seconds))
    kept = [s for s in _relevant(samples, now, reset_at) if s.at > since]
    return kept[-MAX_SAMPLES:]


@dataclass(frozen=True)
class Reset:
    """The reset marker as last acted on."""

    marker: str | None
    at: dt.datetime | None


def observe_reset(annotation: str | None, last: Reset, now: dt.datetime) -> Reset:
    """A new ``sdcguard.dev/reset-breaker`` value resets the breaker at ``now``."""
    if annotation and annotation != last.marker:
        return Reset(marker=annotation, at=now)
    return last


def samples_from_status(status: BreakerStatus) -> list[Sample]:
    """Samples stored in the policy status."""
    return [Sample(s.time, s.failed, s.node_name, s.test_name) for s in status.samples]


def breaker_status(view: BreakerView, samples: Iterable[Sample], reset: Reset) -> BreakerStatus:
    """The policy's status.breaker for ``view`` (samples already pruned)."""
    return BreakerStatus(
        state=BreakerState.OPEN if view.open else BreakerState.CLOSED,
        tripped_at=view.tripped_at,
        reason=view.explain(),
        samples=[
            BreakerSample(time=s.at, failed=s.failed, node_name=s.node, test_name=s.test)
            for s in samples
        ],
        window_samples=view.samples,
        window_failures=view.failures,
        reset_marker=reset.marker,
        reset_at=reset.at,
    )


def advance(
    status: BreakerStatus | None,
    config: CircuitBreaker,
    now: dt.datetime,
    reset_annotation: str | None = None,
    new_samples: Iterable[Sample] = (),
) -> tuple[BreakerView, BreakerStatus]:
    """One step: the stored breaker plus new samples and the policy's reset annotation
    give the breaker now and the status to store."""
    status = status or BreakerStatus()
    reset = observe_reset(reset_annotation, Reset(status.reset_marker, status.reset_at), now)
    samples = [*samples_from_status(status), *new_samples]
    tripped = status.tripped_at if status.state == BreakerState.OPEN else None
    view = evaluate(samples, config, now, reset.at, tripped)
    kept = prune(samples, config, now, reset.at, view.tripped_at)
    return view, breaker_status(view, kept, reset)
