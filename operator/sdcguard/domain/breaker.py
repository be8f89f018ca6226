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
:func:`advance` does the whole step from one status to the next. :class:`Sweep` gives
the same answers while screenings finish one by one, sweeping only the new samples: a
fleet's window holds every node screened in the last hour (up to the whole fleet), and
sweeping all of them again at each probe's end would delay the node's release or
quarantine.
"""

from __future__ import annotations

import bisect
import datetime as dt
import heapq
from collections import Counter, deque
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
            if after:
                self.sdc[key] = after
            else:
                self.sdc.pop(key, None)
            self.failed += (after >= self.confirm) - (before >= self.confirm)
            named = self.devices.setdefault(key, Counter())
            named.update({d.lower(): step for d in dict.fromkeys(sample.devices)})
            named += Counter()  # drops devices no sample in the window names any more
            if not named:
                del self.devices[key]

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
    return _tally_view(_tally(window, confirm), config, tripped_at)


def _tally_view(
    tally: _Tally, config: CircuitBreaker, tripped_at: dt.datetime | None
) -> BreakerView:
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


def status_samples(samples: Iterable[Sample]) -> list[BreakerSample]:
    """Samples as the policy status stores them."""
    return [
        BreakerSample(
            time=s.at,
            failed=s.failed,
            node_name=s.node,
            test_name=s.test,
            devices=list(s.devices[:MAX_SAMPLE_DEVICES]),
        )
        for s in samples
    ]


def breaker_status(view: BreakerView, samples: Iterable[Sample], reset: Reset) -> BreakerStatus:
    """The policy's status.breaker for ``view`` (samples already pruned)."""
    return BreakerStatus(
        state=BreakerState.OPEN if view.open else BreakerState.CLOSED,
        tripped_at=view.tripped_at,
        reason=view.explain(),
        samples=status_samples(samples),
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


@dataclass(frozen=True)
class _Basis:
    """What a sweep's windows and verdicts depend on besides the samples."""

    config: CircuitBreaker
    seconds: float
    reset_at: dt.datetime | None
    confirm: int


class Sweep:
    """:func:`evaluate` (and :func:`advance`, :func:`prune`) over one policy's samples,
    kept current as screenings finish, with the same answers.

    Samples are added and removed by key (their SDCTest's name). A look sweeps only
    the samples new since the last one: when they are all later than every sample
    swept before, and ``now`` has not gone back, the windows ending at earlier samples
    hold exactly what they held, so their verdicts stand, and the two running tallies
    (the window ending at the last sample, the window ending now) move forward. A
    sample that arrives late (no later than one already swept), a removal, a changed
    config, reset or confirmation count starts the sweep again from every sample; a
    look at an earlier time than the last is answered by :func:`evaluate` itself and
    leaves the sweep as it is.
    """

    def __init__(self) -> None:
        self._samples: dict[str, Sample] = {}
        self._basis: _Basis | None = None
        self._stale = True
        self._pending: list[tuple[dt.datetime, int, Sample]] = []
        """Samples not swept yet (a heap by time): later than the last look's ``now``."""
        self._pushed = 0
        self._ordered: list[Sample] = []
        """Swept samples, by time."""
        self._times: list[dt.datetime] = []
        self._low = 0
        self._tally = _Tally(1)
        """The window ending at the last swept sample: ``_ordered[_low:]``."""
        self._now_low = 0
        self._now_tally = _Tally(1)
        """The window ending at the last look's ``now``: ``_ordered[_now_low:]``."""
        self._now: dt.datetime | None = None
        self._trips: deque[BreakerView] = deque()
        """Windows ending at a swept sample that tripped, by time; those older than a
        window before ``now`` are dropped (``now`` only moves forward)."""
        self._rebuilds = 0
        self._at_trip: tuple[tuple[object, ...], BreakerView] | None = None

    def __len__(self) -> int:
        return len(self._samples)

    @property
    def rebuilds(self) -> int:
        """How often the sweep started again from every sample (for tests and logs)."""
        return self._rebuilds

    def add(self, key: str, sample: Sample) -> None:
        """A finished screening (or a changed one under the same key)."""
        old = self._samples.get(key)
        if old == sample:
            return
        self._samples[key] = sample
        basis = self._basis
        if old is not None or self._stale or basis is None:
            self._stale = True
            return
        if basis.reset_at is not None and sample.at <= basis.reset_at:
            return  # before the reset: it counts for nothing while the reset holds
        if self._times and sample.at <= self._times[-1]:
            self._stale = True  # an earlier window changes: sweep again
            return
        self._pushed += 1
        heapq.heappush(self._pending, (sample.at, self._pushed, sample))

    def remove(self, key: str) -> None:
        """A screening no longer counted (its SDCTest is gone)."""
        if self._samples.pop(key, None) is not None:
            self._stale = True

    def evaluate(
        self,
        config: CircuitBreaker,
        now: dt.datetime,
        reset_at: dt.datetime | None = None,
        tripped_at: dt.datetime | None = None,
        confirm: int = 1,
    ) -> BreakerView:
        """What :func:`evaluate` says of every sample added (and not removed)."""
        basis = _Basis(config, parse_duration(config.window), reset_at, confirm)
        if self._stale or basis != self._basis:
            self._rebuild(basis)
        elif self._now is not None and now < self._now:
            return evaluate(self._samples.values(), config, now, reset_at, tripped_at, confirm)
        self._sweep(basis, now)
        if tripped_at is not None and (reset_at is None or tripped_at > reset_at):
            return self._trip_window(basis, tripped_at)
        cut = now - dt.timedelta(seconds=basis.seconds)
        while (
            self._trips
            and self._trips[0].tripped_at is not None
            and self._trips[0].tripped_at <= cut
        ):
            self._trips.popleft()
        if self._trips:
            return self._trips[0]
        return _tally_view(self._now_tally, config, None)

    def kept(
        self,
        config: CircuitBreaker,
        now: dt.datetime,
        reset_at: dt.datetime | None = None,
        tripped_at: dt.datetime | None = None,
    ) -> list[Sample]:
        """What :func:`prune` keeps of the samples (call it after :meth:`evaluate` at the
        same ``now``)."""
        if self._stale or self._now != now or self._basis is None:
            return prune(self._samples.values(), config, now, reset_at, tripped_at)
        seconds = parse_duration(config.window)
        since = now - dt.timedelta(seconds=2 * seconds)
        if tripped_at is not None:
            since = min(since, tripped_at - dt.timedelta(seconds=seconds))
        first = bisect.bisect_right(self._times, since)
        return self._ordered[max(first, len(self._ordered) - MAX_SAMPLES) :]

    def advance(
        self,
        status: BreakerStatus | None,
        config: CircuitBreaker,
        now: dt.datetime,
        reset_annotation: str | None = None,
        confirm: int = 1,
    ) -> tuple[BreakerView, BreakerStatus, Reset]:
        """:func:`advance` over the samples added, except that the status comes without
        its samples (:meth:`kept` gives them, :func:`status_samples` in the status's
        form: made only for a status that is written); also returns the reset."""
        status = status or BreakerStatus()
        reset = observe_reset(reset_annotation, Reset(status.reset_marker, status.reset_at), now)
        tripped = status.tripped_at if status.state == BreakerState.OPEN else None
        view = self.evaluate(config, now, reset.at, tripped, confirm)
        return view, breaker_status(view, (), reset), reset

    # Internals ----------------------------------------------------------------

    def _rebuild(self, basis: _Basis) -> None:
        self._basis, self._stale = basis, False
        self._rebuilds += 1
        reset_at = basis.reset_at
        relevant = [s for s in self._samples.values() if reset_at is None or s.at > reset_at]
        relevant.sort(key=lambda s: s.at)
        self._pending = [(s.at, i, s) for i, s in enumerate(relevant)]  # sorted: a heap
        self._pushed = len(relevant)
        self._ordered, self._times = [], []
        self._low = self._now_low = 0
        self._tally, self._now_tally = _Tally(basis.confirm), _Tally(basis.confirm)
        self._now = None
        self._trips.clear()
        self._at_trip = None

    def _sweep(self, basis: _Basis, now: dt.datetime) -> None:
        """Sweep the pending samples up to ``now``, as :func:`evaluate`'s loop does."""
        span = dt.timedelta(seconds=basis.seconds)
        config, pending = basis.config, self._pending
        ordered, times, tally = self._ordered, self._times, self._tally
        while pending and pending[0][0] <= now:
            end = pending[0][0]
            while pending and pending[0][0] == end:  # equal times: one window for all
                sample = heapq.heappop(pending)[2]
                ordered.append(sample)
                times.append(sample.at)
                tally.add(sample)
                self._now_tally.add(sample)
            cut = end - span
            while times[self._low] <= cut:
                tally.add(ordered[self._low], -1)
                self._low += 1
            nodes, failed = tally.nodes, tally.failed
            if nodes >= config.min_samples and failed / nodes > config.max_failure_fraction:
                self._trips.append(_tally_view(tally, config, end))
        self._now = now
        cut = now - span
        while self._now_low < len(times) and times[self._now_low] <= cut:
            self._now_tally.add(ordered[self._now_low], -1)
            self._now_low += 1

    def _trip_window(self, basis: _Basis, tripped_at: dt.datetime) -> BreakerView:
        """The window that tripped the breaker, as stored (made once per change of it)."""
        low = bisect.bisect_right(self._times, tripped_at - dt.timedelta(seconds=basis.seconds))
        high = bisect.bisect_right(self._times, tripped_at)
        key = (tripped_at, self._rebuilds, low, high)
        if self._at_trip is None or self._at_trip[0] != key:
            window = self._ordered[low:high]
            self._at_trip = (key, _view(window, basis.config, tripped_at, basis.confirm))
        return self._at_trip[1]
