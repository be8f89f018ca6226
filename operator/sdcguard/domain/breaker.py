"""The circuit breaker: stop quarantining when too many screened nodes fail at once.

A storm of SDC verdicts is far more likely a bad probe image, driver or baseline than
a fleet going bad at once (about 1 device in 1,000 has SDC). The breaker counts nodes,
not screenings (as NVSentinel does): within a sliding ``window``, the distinct nodes
screened, and of those the nodes with a *confirmed* failure (an SDC verdict reproduced
by a re-run, or a single one when the policy confirms nothing, see
:func:`failures_to_confirm`). It trips when at least ``minSamples`` nodes were screened
and more than ``maxFailureFraction`` of them had confirmed failures (3 of 5 with 0.5
trips; 2 of 4 does not). Confirmation re-runs and re-tests of one node never count
twice, so a couple of bad nodes in a small pool cannot trip it on their own.

Devices are counted too, and told (``failed_devices``: the distinct devices the failed
screenings of the confirmed failing nodes named as the odd one out): two bad GPUs of one
node are one failing node and two failing devices, and a device named by every re-run is
one device. The trip stays on nodes: every failing device is on a failing node, so the
share of failing nodes is never below the share of failing devices, and a storm (a bad
image, driver or baseline) shows in nodes first. Whether the failures are single GPUs
(hardware, quarantine scope Device) or whole nodes (not pinned) is what the device count
tells a person looking at a tripped breaker.

While open, confirmed failures are held (the node stays Suspect and tainted, marked
``sdcguard.dev/held``, and is not re-tested until the breaker closes or a person asks)
instead of quarantined, and routine re-screening stops; releases, repair verification
and acceptance of new (gated) nodes continue. The breaker stays open until a person
resets it by annotating the policy ``sdcguard.dev/reset-breaker=<any new value>``;
samples from before the reset are then ignored.

The state is a pure function of (samples, config, now, reset time, time it tripped):
the operator keeps the samples and ``trippedAt`` in the policy status (:func:`prune`
keeps what the state needs), so a restart reconstructs the same state;
:func:`advance` does the whole step from one status to the next.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sdcguard.api import (
    BreakerSample,
    BreakerState,
    BreakerStatus,
    CircuitBreaker,
    Confirmation,
    parse_duration,
)
from sdcguard.domain.keys import RESET_BREAKER, format_time

MAX_SAMPLES = 500
MAX_SAMPLE_DEVICES = 16


@dataclass(frozen=True)
class Sample:
    """One finished screening."""

    at: dt.datetime
    failed: bool
    node: str = ""
    test: str = ""
    devices: tuple[str, ...] = ()
    """A failed screening: the devices it named as the odd one out (UUIDs, else indices)."""


def failures_to_confirm(confirmation: Confirmation) -> int:
    """SDC verdicts of one node that make its failure confirmed: the first and one that
    reproduced it, or the first alone when the policy re-runs nothing."""
    return 1 if confirmation.reruns == 0 else 2


@dataclass(frozen=True)
class BreakerView:
    """The breaker's state and the numbers behind it."""

    open: bool
    samples: int
    """Distinct nodes screened in the window that decided the state (the trip window
    while open)."""
    failures: int
    """Of those, nodes with a confirmed failure."""
    tripped_at: dt.datetime | None
    window: str
    min_samples: int
    max_failure_fraction: float
    failed_devices: int = 0
    """Distinct devices the confirmed failing nodes' failed screenings named."""

    def explain(self) -> str:
        """A sentence for the policy condition, e.g. "3 of 5 nodes screened had confirmed
        failures in the last 1h (limit 50%)"."""
        limit = f"{self.max_failure_fraction * 100:g}%"
        devices = f" ({self.failed_devices} device(s) named)" if self.failed_devices else ""
        counts = (
            f"{self.failures} of {self.samples} nodes screened had confirmed failures"
            f"{devices} in the last {self.window}"
        )
        if self.open:
            assert self.tripped_at is not None
            return (
                f"{counts} (limit {limit}); quarantines held since {format_time(self.tripped_at)}; "
                f"investigate, then annotate the policy {RESET_BREAKER}=<new value> to reset"
            )
        if self.samples < self.min_samples:
            return (
                f"{counts}; the breaker trips only with at least {self.min_samples} nodes screened"
            )
        return f"{counts} (limit {limit})"


def _key(sample: Sample) -> str:
    return sample.node or f"test:{sample.test}"


class _Tally:
    """Nodes in a window: screenings and SDC verdicts of each, as samples come and go."""

    def __init__(self, confirm: int) -> None:
        self.confirm = confirm
        self.screened: dict[str, int] = {}
        self.sdc: dict[str, int] = {}
        self.failed = 0
        self.devices: dict[str, Counter[str]] = {}
        """Per node, the devices its failed samples in the window named (and how often)."""

    def add(self, sample: Sample, step: int = 1) -> None:
        key = _key(sample)
        count = self.screened.get(key, 0) + step
        if count:
            self.screened[key] = count
        else:
            self.screened.pop(key, None)
        if sample.failed:
            before = self.sdc.get(key, 0)
            after = before + step
            self.sdc[key] = after
            self.failed += (after >= self.confirm) - (before >= self.confirm)
            named = self.devices.setdefault(key, Counter())
            named.update({d.lower(): step for d in dict.fromkeys(sample.devices)})
            named += Counter()  # drops devices no sample in the window names any more

    @property
    def nodes(self) -> int:
        return len(self.screened)

    @property
    def failed_devices(self) -> int:
        """Distinct devices named by the nodes whose failure is confirmed."""
        return sum(
            len(named)
            for key, named in self.devices.items()
            if self.sdc.get(key, 0) >= self.confirm
        )


def _tally(window: Iterable[Sample], confirm: int) -> _Tally:
    tally = _Tally(confirm)
    for sample in window:
        tally.add(sample)
    return tally


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
    window: Sequence[Sample],
    config: CircuitBreaker,
    tripped_at: dt.datetime | None,
    confirm: int,
) -> BreakerView:
    tally = _tally(window, confirm)
    return BreakerView(
        open=tripped_at is not None,
        samples=tally.nodes,
        failures=tally.failed,
        tripped_at=tripped_at,
        window=config.window,
        min_samples=config.min_samples,
        max_failure_fraction=config.max_failure_fraction,
        failed_devices=tally.failed_devices,
    )


def evaluate(
    samples: Iterable[Sample],
    config: CircuitBreaker,
    now: dt.datetime,
    reset_at: dt.datetime | None = None,
    tripped_at: dt.datetime | None = None,
    confirm: int = 1,
) -> BreakerView:
    """The breaker at ``now``; ``confirm``: SDC verdicts that confirm one node's failure
    (:func:`failures_to_confirm`).

    Open if it tripped before (``tripped_at``, from the status) and was not reset since,
    or if a window ending at a screening within the last ``window`` trips now. A pass
    can trip it too: it may bring the window up to ``minSamples`` nodes while the failed
    share is already over the limit (3 failed nodes, then 2 healthy ones, with
    minSamples 5). Windows ending earlier are not re-checked: pruned samples could not
    answer for them.
    """
    seconds = parse_duration(config.window)
    ordered = _relevant(samples, now, reset_at)
    if tripped_at is not None and (reset_at is None or tripped_at > reset_at):
        return _view(_window(ordered, tripped_at, seconds), config, tripped_at, confirm)
    # Every window ending at a recent screening, in one sweep: both window edges only
    # move forward, and a running tally per node gives each window's counts.
    span = dt.timedelta(seconds=seconds)
    recent = now - span
    tally = _Tally(confirm)
    low = high = 0
    for sample in ordered:
        end = sample.at
        while high < len(ordered) and ordered[high].at <= end:
            tally.add(ordered[high])
            high += 1
        while low < high and ordered[low].at <= end - span:
            tally.add(ordered[low], -1)
            low += 1
        if end <= recent:
            continue
        nodes, failed = tally.nodes, tally.failed
        if nodes >= config.min_samples and failed / nodes > config.max_failure_fraction:
            return _view(ordered[low:high], config, end, confirm)
    return _view(_window(ordered, now, seconds), config, None, confirm)


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
    return [
        Sample(s.time, s.failed, s.node_name, s.test_name, tuple(s.devices)) for s in status.samples
    ]


def breaker_status(view: BreakerView, samples: Iterable[Sample], reset: Reset) -> BreakerStatus:
    """The policy's status.breaker for ``view`` (samples already pruned)."""
    return BreakerStatus(
        state=BreakerState.OPEN if view.open else BreakerState.CLOSED,
        tripped_at=view.tripped_at,
        reason=view.explain(),
        samples=[
            BreakerSample(
                time=s.at,
                failed=s.failed,
                node_name=s.node,
                test_name=s.test,
                devices=list(s.devices[:MAX_SAMPLE_DEVICES]),
            )
            for s in samples
        ],
        window_samples=view.samples,
        window_failures=view.failures,
        window_failed_devices=view.failed_devices,
        reset_marker=reset.marker,
        reset_at=reset.at,
    )


def advance(
    status: BreakerStatus | None,
    config: CircuitBreaker,
    now: dt.datetime,
    reset_annotation: str | None = None,
    new_samples: Iterable[Sample] = (),
    confirm: int = 1,
) -> tuple[BreakerView, BreakerStatus]:
    """One step: the stored breaker plus new samples and the policy's reset annotation
    give the breaker now and the status to store."""
    status = status or BreakerStatus()
    reset = observe_reset(reset_annotation, Reset(status.reset_marker, status.reset_at), now)
    samples = [*samples_from_status(status), *new_samples]
    tripped = status.tripped_at if status.state == BreakerState.OPEN else None
    view = evaluate(samples, config, now, reset.at, tripped, confirm)
    kept = prune(samples, config, now, reset.at, view.tripped_at)
    return view, breaker_status(view, kept, reset)
