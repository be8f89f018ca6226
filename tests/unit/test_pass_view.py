"""A pass's copy of the fleet is made in a thread of its own, neither in the event loop
nor in the pass's thread: at 10,000 nodes the copy took 2.3 s (2.7 s at 20,000), and
neither the loop that hands probes' ends on nor the thread that serves them may wait
for it (``runtime/scheduling.py``)."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
from typing import Any

from sdcguard.adapters.pass_view import ReconcilerPasses
from sdcguard.metrics import Metrics
from sdcguard.runtime.scheduling import PassScheduler, Wake


class _Passes:
    """A policy's passes as the scheduler drives them, recording what it was asked."""

    name = "fleet"

    def __init__(self, view: Any = None) -> None:
        self.indexes = {"baselines_index": {"b": ["baseline"]}, "policies_index": {"p": ["sel"]}}
        self.views: list[Any] = []
        self.since: list[int] = []
        self.offered: list[frozenset[str]] = []
        self.served: list[tuple[float, list[str]]] = []
        self.seen_copies: list[Any] = []
        self.built_in: list[threading.Thread] = []
        self.copied: list[float] = []
        self.copy_seconds = 0.5

    def policy(self) -> str:
        return "policy"

    def probes_ready(self) -> bool:
        return True

    def ready(self) -> bool:
        return True

    # The operator's own: Kopf's live indexes copied in the event loop.
    copy_indexes = ReconcilerPasses.copy_indexes

    def view(self, copies: Any) -> str:
        self.built_in.append(threading.current_thread())
        self.seen_copies.append(copies)
        time.sleep(self.copy_seconds)  # an O(fleet) copy
        self.copied.append(time.monotonic())
        return "view"

    def urgent_view(self, nodes: Any, pods: Any, jobs: Any) -> str:
        return "urgent view"

    def mark(self) -> int:
        return 7

    def run_pass(self, policy: Any, view: Any, now: Any, dirty: Any, since: int) -> float:
        self.views.append(view)
        self.since.append(since)
        return 1.0

    def offer(self, policy: Any, view: Any, nodes: frozenset[str], now: Any) -> None:
        self.offered.append(nodes)

    def serve_offered(self) -> None:
        nodes = sorted(n for work in self.offered for n in work)
        self.offered = []
        self.served.append((time.monotonic(), nodes))

    def requeue_unserved(self) -> set[str]:
        return set()

    def look_again(self, now: Any) -> set[str]:
        return set()


def _scheduler(resync: float = 10.0) -> PassScheduler:
    return PassScheduler(
        resync_seconds=resync,
        debounce_seconds=0.0,
        metrics=Metrics(),
        clock=lambda: dt.datetime.now(dt.UTC),
    )


def test_the_view_is_built_off_the_event_loop() -> None:
    passes = _Passes()
    scheduler = _scheduler()

    async def main() -> tuple[float, float]:
        gaps: list[float] = []
        done = asyncio.Event()

        async def ticker() -> None:
            last = time.monotonic()
            while not done.is_set():
                await asyncio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        tick = asyncio.ensure_future(ticker())
        wake_in = await scheduler.pass_once(passes, "policy", None, Wake())
        done.set()
        await tick
        return wake_in, max(gaps)

    wake_in, longest_gap = asyncio.run(main())
    scheduler.executor.shutdown()
    scheduler.view_executor.shutdown()
    assert wake_in == 1.0 and passes.views == ["view"] and passes.since == [7]
    assert passes.built_in and passes.built_in[0] is not threading.main_thread()
    # The loop kept running while the view was made (0.5 s).
    assert longest_gap < 0.25, longest_gap
    # Kopf's indexes reach the thread as copies, not the live stores.
    seen = passes.seen_copies[0]
    assert seen == passes.indexes and seen is not passes.indexes
    assert seen["policies_index"]["p"] is not passes.indexes["policies_index"]["p"]


def test_a_probe_end_during_the_copy_is_served_before_the_copy_is_done() -> None:
    passes = _Passes()
    passes.copy_seconds = 0.6
    scheduler = _scheduler()
    wake = Wake()

    async def main() -> float:
        async def probe_ends() -> None:
            await asyncio.sleep(0.1)
            wake.urgent.add("gpu-7")
            wake.urgent_event.set()

        ends = asyncio.ensure_future(probe_ends())
        wake_in = await scheduler.pass_once(passes, "policy", None, wake)
        await ends
        return wake_in

    assert asyncio.run(main()) == 1.0
    scheduler.executor.shutdown()
    scheduler.view_executor.shutdown()
    assert [nodes for _, nodes in passes.served] == [["gpu-7"]]
    served_at = passes.served[0][0]
    assert served_at < passes.copied[0] - 0.3, "served while the copy was still being made"
    assert passes.since == [7], "the pass leaves what was served since its mark"


def test_full_passes_are_spaced_to_a_fifth_of_the_time_at_most() -> None:
    """resyncSeconds on a fleet whose full pass is cheap; four times the pass where it
    is dear, told by the gauge (and the histogram keeps every duration)."""
    cheap, dear = _scheduler(30.0), _scheduler(10.0)
    dear.metrics = cheap.metrics
    assert cheap.full_pass_interval("fleet", 0.4) == 30.0
    assert cheap.metrics.full_pass_interval._value.get() == 30.0
    assert dear.full_pass_interval("fleet", 4.5) == 18.0
    assert cheap.metrics.full_pass_interval._value.get() == 18.0
    assert cheap.metrics.registry.get_sample_value("sdcguard_full_pass_seconds_count") == 2
