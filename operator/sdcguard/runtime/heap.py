"""The operator's heap and Python's cyclic garbage collector.

The fleet copy is long-lived: on a large fleet, hundreds of thousands of tracked
objects that change slowly (a Pod entry is replaced when its Pod changes, a node
snapshot when its node does). Every full pass allocates enough
survivors to start a full (generation 2) collection, and a full collection scans the
whole heap with the GIL held: every thread stops, the one that serves probe ends
included, once per full pass or more (``bench.scale.passcost`` measures it; the
operator's heap also holds Kopf, the API client and the probe Jobs and Pods).

After each full pass the live objects are frozen (``gc.freeze``): moved to the
permanent generation, which collections skip. Reference counting still frees every
frozen object whose last reference goes (a replaced Pod entry), so only cyclic garbage
that was alive-looking at a freeze escapes. To bound that, the heap is unfrozen,
collected once and frozen again when the frozen set has doubled since the last full
collection, or grown by a quarter and the last one is an hour old. A full collection of
a large operator's heap is a long pause, so growth alone (a fleet's qualification grows
the heap without making garbage) must not trigger one at every quarter.

Before any thread starts, glibc's malloc is held to two arenas
(:func:`fewer_malloc_arenas`, called first by ``python -m sdcguard``).

Pauses are recorded by a ``gc.callbacks`` hook into a lock-free deque (a metric's lock
or the logger could be held by the very thread the collector interrupted) and drained
into the ``sdcguard_gc_pause_seconds`` histogram when the heap is settled.
"""

from __future__ import annotations

import collections
import ctypes
import gc
import os
import threading
import time
from typing import Any

import structlog

from sdcguard.metrics import Metrics

log = structlog.get_logger("sdcguard.heap")

REFREEZE_GROWTH = 2.0
"""A full collection once the frozen set is this many times its size after the last one."""

REFREEZE_SLOW_GROWTH = 1.25
"""... or this many times, once :data:`REFREEZE_AFTER` has passed since the last one."""

REFREEZE_AFTER = 3600.0
"""Seconds between two full collections while the frozen set grows slowly."""

PAUSES_KEPT = 4096
"""Collections remembered between two drains (young ones are frequent and short)."""

M_ARENA_MAX = -8  # glibc's mallopt parameter number


def fewer_malloc_arenas(arenas: int = 2) -> None:
    """Cap glibc's malloc arenas before any thread starts.

    Kopf runs sync handlers in a thread pool and the reconcile passes run in a worker
    thread; by default glibc gives threads arenas of their own (up to 8 per core), and
    freed memory stays scattered over them, so RSS grows with the fleet well past what
    is live. Two arenas is the usual setting for threaded Python services (the same as
    MALLOC_ARENA_MAX=2). No-op on other C libraries.
    """
    if os.environ.get("MALLOC_ARENA_MAX"):
        return  # the environment already decided
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(M_ARENA_MAX, arenas)
    except (OSError, AttributeError):
        pass


class Heap:
    """Records the collector's pauses and freezes the long-lived fleet copy."""

    def __init__(self, metrics: Metrics | None = None, clock: Any = time.monotonic) -> None:
        self.metrics = metrics
        self.clock = clock
        self.collected_at: float | None = None
        """When the last full collection was made (the clock's seconds)."""
        self.pauses: collections.deque[tuple[int, float]] = collections.deque(maxlen=PAUSES_KEPT)
        self._started: dict[int, float] = {}
        self._lock = threading.Lock()
        self.baseline: int | None = None
        """Frozen objects after the last full collection (None: never settled)."""
        self.full_collections = 0
        """Full collections made here (not the collector's own)."""
        self.installed = False

    def install(self) -> None:
        """Start recording the collector's pauses (once)."""
        if not self.installed:
            gc.callbacks.append(self._callback)
            self.installed = True

    def uninstall(self) -> None:
        if self.installed:
            gc.callbacks.remove(self._callback)
            self.installed = False

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        # Runs inside the collector, in whatever thread it interrupted: no locks, no
        # logging; deque.append and dict stores are atomic under the GIL.
        ident = threading.get_ident()
        if phase == "start":
            self._started[ident] = time.perf_counter()
            return
        began = self._started.pop(ident, None)
        if began is not None:
            self.pauses.append((int(info.get("generation", -1)), time.perf_counter() - began))

    def drain(self) -> dict[int, list[float]]:
        """The pauses recorded since the last drain, by generation (observed into the
        histogram when there are metrics)."""
        out: dict[int, list[float]] = {}
        while True:
            try:
                generation, seconds = self.pauses.popleft()
            except IndexError:
                break
            out.setdefault(generation, []).append(seconds)
            if self.metrics is not None:
                self.metrics.gc_pause.labels(generation=str(generation)).observe(seconds)
        return out

    def settle(self) -> dict[str, Any]:
        """After a full pass (and every minute on a standby): freeze what is alive now,
        so no collection scans it again; collect once first when the frozen set has
        outgrown its bound (:meth:`_collect_now`). Returns what it did and the pauses
        since the last call (also logged)."""
        with self._lock:
            collected = None
            unreachable = None
            frozen = gc.get_freeze_count()
            if self._collect_now(frozen):
                began = time.perf_counter()
                gc.unfreeze()
                unreachable = gc.collect()
                collected = time.perf_counter() - began
                self.full_collections += 1
                self.collected_at = self.clock()
            gc.freeze()
            frozen = gc.get_freeze_count()
            if collected is not None:
                self.baseline = frozen
            if self.metrics is not None:
                self.metrics.gc_frozen.set(frozen)
        pauses = self.drain()
        summary: dict[str, Any] = {
            "frozen": frozen,
            "full_collection_s": None if collected is None else round(collected, 4),
            "unreachable": unreachable,
        }
        for generation, values in sorted(pauses.items()):
            summary[f"gen{generation}_collections"] = len(values)
            summary[f"gen{generation}_max_s"] = round(max(values), 4)
        log.info("heap settled", **summary)
        return summary

    def _collect_now(self, frozen: int) -> bool:
        """Whether the frozen set has outgrown its bound (see the module's docstring)."""
        if self.baseline is None or self.collected_at is None:
            return True
        base = max(self.baseline, 1)
        if frozen > REFREEZE_GROWTH * base:
            return True
        late = self.clock() - self.collected_at >= REFREEZE_AFTER
        return late and frozen > REFREEZE_SLOW_GROWTH * base
