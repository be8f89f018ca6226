"""The heap keeper: what it freezes is skipped by collections, cyclic garbage frozen by
mistake is freed once the frozen set outgrows its bound, and pauses are recorded."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from sdcguard.metrics import Metrics
from sdcguard.runtime import heap as heap_module
from sdcguard.runtime.heap import REFREEZE_AFTER, REFREEZE_GROWTH, REFREEZE_SLOW_GROWTH, Heap


class Cyclic:
    """An object in a reference cycle with itself: only the collector frees it."""

    def __init__(self) -> None:
        self.me = self


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def heap() -> Iterator[Heap]:
    keeper = Heap(Metrics(), clock=Clock())
    keeper.install()
    try:
        yield keeper
    finally:
        keeper.uninstall()
        gc.unfreeze()  # the test process's collector as it was
        gc.collect()


def test_first_settle_collects_then_freezes(heap: Heap) -> None:
    done = heap.settle()
    assert done["full_collection_s"] is not None
    assert heap.full_collections == 1
    # Frozen objects still die by reference count (the freeze's own locals did).
    assert 0.99 * done["frozen"] <= gc.get_freeze_count() <= done["frozen"]
    assert heap.baseline == done["frozen"]
    # Nothing grew: the next settle only freezes what is new.
    again = heap.settle()
    assert again["full_collection_s"] is None
    assert heap.full_collections == 1


def test_frozen_objects_are_skipped_and_new_ones_are_not(heap: Heap) -> None:
    heap.settle()
    frozen_cycle = Cyclic()
    heap.settle()  # frozen_cycle is alive now: frozen with the rest
    ref = weakref.ref(frozen_cycle)
    del frozen_cycle
    gc.collect()
    assert ref() is not None, "a frozen cycle is not the collector's any more"

    young = Cyclic()
    young_ref = weakref.ref(young)
    del young
    gc.collect()
    assert young_ref() is None, "an object made after the freeze is collected as usual"


def test_growth_past_the_bound_collects_the_frozen_garbage(heap: Heap) -> None:
    heap.settle()
    leaked = Cyclic()
    ref = weakref.ref(leaked)
    heap.settle()
    del leaked
    assert heap.baseline is not None
    # Grow the frozen set past its bound: the next settle unfreezes and collects.
    grown = [[i] for i in range(int(heap.baseline * (REFREEZE_GROWTH - 1)) + 1000)]
    heap.settle()
    assert heap.full_collections == 1  # frozen, not yet over the bound at that call
    more = [[i] for i in range(len(grown))]
    done = heap.settle()
    assert done["full_collection_s"] is not None
    assert heap.full_collections == 2
    assert ref() is None, "the cycle frozen while alive is freed by the bounded collection"
    assert done["unreachable"] >= 1
    assert len(more) == len(grown)


def test_slow_growth_is_collected_only_once_an_hour(heap: Heap) -> None:
    """Growth of a quarter (a fleet qualifying: live objects, not garbage) waits for the
    hour; a doubling does not."""
    heap.settle()
    assert heap.baseline is not None
    some = [[i] for i in range(int(heap.baseline * (REFREEZE_SLOW_GROWTH - 1)) + 1000)]
    heap.settle()
    assert heap.settle()["full_collection_s"] is None, "grown by a quarter, within the hour"
    clock = heap.clock
    assert isinstance(clock, Clock)
    clock.now += REFREEZE_AFTER
    assert heap.settle()["full_collection_s"] is not None, "grown by a quarter, an hour on"
    assert heap.full_collections == 2
    assert len(some) > 0


def test_pauses_are_recorded_and_observed(heap: Heap) -> None:
    heap.drain()
    gc.collect()
    pauses = heap.drain()
    assert 2 in pauses and all(s >= 0 for s in pauses[2])
    assert heap.metrics is not None
    count = heap.metrics.registry.get_sample_value(
        "sdcguard_gc_pause_seconds_count", {"generation": "2"}
    )
    assert count is not None and count >= 1
    summary = heap.settle()
    assert summary["gen2_collections"] >= 1  # the settle's own full collection
    assert (
        heap.metrics.registry.get_sample_value("sdcguard_gc_frozen_objects") == (summary["frozen"])
    )


def test_the_callback_takes_no_lock(heap: Heap, monkeypatch: pytest.MonkeyPatch) -> None:
    """The collector may interrupt a thread that holds a metric's or the logger's lock:
    the callback only appends to a deque."""
    monkeypatch.setattr(heap_module, "log", None)  # any logging in it would fail
    heap.metrics = None
    gc.collect(0)
    gc.collect(1)
    assert {g for g, _ in heap.pauses} >= {0, 1}
