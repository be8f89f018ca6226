"""A pass's copy of the fleet is made in a thread of its own, neither in the event loop
nor in the pass's thread: at 10,000 nodes the copy took 2.3 s (2.7 s at 20,000), and
neither the loop that hands probes' ends on nor the thread that serves them may wait
for it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from sdcguard import handlers


class _Reconciler:
    def __init__(self) -> None:
        self.views: list[Any] = []
        self.since: list[int | None] = []
        self.offered: list[Any] = []
        self.served: list[tuple[float, list[str]]] = []

    def mark(self) -> int:
        return 7

    def run_pass(self, policy: Any, view: Any, now: Any, dirty: Any, since: Any = None) -> float:
        self.views.append(view)
        self.since.append(since)
        return 1.0

    def offer_urgent(self, work: Any) -> None:
        self.offered.append(work)

    def serve_offered(self) -> None:
        nodes = sorted(n for work in self.offered for n in work.nodes)
        self.offered = []
        self.served.append((time.monotonic(), nodes))

    def take_unserved(self) -> list[Any]:
        return []


def _runtime(reconciler: _Reconciler) -> SimpleNamespace:
    return SimpleNamespace(
        executor=concurrent.futures.ThreadPoolExecutor(1),
        view_executor=concurrent.futures.ThreadPoolExecutor(1),
        reconciler=reconciler,
        settings=SimpleNamespace(resync_seconds=10.0),
    )


def test_the_view_is_built_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    built_in: list[threading.Thread] = []
    seen_indexes: list[Any] = []

    def slow_view(rt: Any, indexes: Any, only: Any = None) -> str:
        built_in.append(threading.current_thread())
        seen_indexes.append(indexes)
        time.sleep(0.5)  # an O(fleet) copy
        return "view"

    monkeypatch.setattr(handlers, "_view", slow_view)
    reconciler = _Reconciler()
    rt = _runtime(reconciler)
    indexes = {"baselines_index": {"b": ["baseline"]}, "policies_index": {"p": ["selector"]}}

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
        wake_in = await handlers._pass(rt, Any, indexes, None, handlers.Wake())  # type: ignore[arg-type]
        done.set()
        await tick
        return wake_in, max(gaps)

    wake_in, longest_gap = asyncio.run(main())
    rt.executor.shutdown()
    rt.view_executor.shutdown()
    assert wake_in == 1.0 and reconciler.views == ["view"] and reconciler.since == [7]
    assert built_in and built_in[0] is not threading.main_thread()
    # The loop kept running while the view was made (0.5 s).
    assert longest_gap < 0.25, longest_gap
    # Kopf's indexes reach the thread as copies, not the live stores.
    assert seen_indexes[0] == indexes and seen_indexes[0] is not indexes
    assert seen_indexes[0]["policies_index"]["p"] is not indexes["policies_index"]["p"]


def test_a_probe_end_during_the_copy_is_served_before_the_copy_is_done(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    copied: list[float] = []

    def slow_view(rt: Any, indexes: Any, only: Any = None) -> str:
        time.sleep(0.6)  # an O(fleet) copy
        copied.append(time.monotonic())
        return "view"

    monkeypatch.setattr(handlers, "_view", slow_view)
    monkeypatch.setattr(handlers, "_urgent_view", lambda rt, indexes, *a: "urgent view")
    reconciler = _Reconciler()
    rt = _runtime(reconciler)
    wake = handlers.Wake()
    indexes: dict[str, Any] = {"baselines_index": {}, "policies_index": {}}

    async def main() -> float:
        async def probe_ends() -> None:
            await asyncio.sleep(0.1)
            wake.urgent.add("gpu-7")
            wake.urgent_event.set()

        ends = asyncio.ensure_future(probe_ends())
        wake_in = await handlers._pass(rt, Any, indexes, None, wake)  # type: ignore[arg-type]
        await ends
        return wake_in

    assert asyncio.run(main()) == 1.0
    rt.executor.shutdown()
    rt.view_executor.shutdown()
    assert [nodes for _, nodes in reconciler.served] == [["gpu-7"]]
    served_at = reconciler.served[0][0]
    assert served_at < copied[0] - 0.3, "served while the copy was still being made"
    assert reconciler.since == [7], "the pass leaves what was served since its mark"


def test_full_passes_are_spaced_to_a_fifth_of_the_time_at_most() -> None:
    """resyncSeconds on a fleet whose full pass is cheap; four times the pass where it
    is dear, told by the gauge (and the histogram keeps every duration)."""
    from sdcguard.metrics import Metrics

    rt: Any = SimpleNamespace(metrics=Metrics())
    assert handlers.full_pass_interval(rt, "fleet", 30.0, 0.4) == 30.0
    assert rt.metrics.full_pass_interval._value.get() == 30.0
    assert handlers.full_pass_interval(rt, "fleet", 10.0, 4.5) == 18.0
    assert rt.metrics.full_pass_interval._value.get() == 18.0
    assert rt.metrics.registry.get_sample_value("sdcguard_full_pass_seconds_count") == 2
