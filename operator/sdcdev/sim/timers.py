"""One thread that runs short callbacks at their due time, in order."""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

log = structlog.get_logger("sdcdev.sim")


@dataclass(order=True)
class TimerHandle:
    due: float
    seq: int
    fn: Callable[[], None] = field(compare=False)
    what: str = field(compare=False, default="")
    cancelled: bool = field(compare=False, default=False)

    def cancel(self) -> None:
        self.cancelled = True


class Timers:
    """``call_later(delay, fn)``; callbacks run one at a time on the timer thread."""

    def __init__(self, name: str = "sim-timers") -> None:
        self._heap: list[TimerHandle] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)

    def call_later(self, delay: float, fn: Callable[[], None], what: str = "") -> TimerHandle:
        handle = TimerHandle(time.monotonic() + max(0.0, delay), next(self._seq), fn, what)
        with self._cond:
            heapq.heappush(self._heap, handle)
            self._cond.notify_all()
        return handle

    def call_soon(self, fn: Callable[[], None], what: str = "") -> TimerHandle:
        return self.call_later(0.0, fn, what)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopped:
                    if self._heap and self._heap[0].due <= time.monotonic():
                        break
                    timeout = self._heap[0].due - time.monotonic() if self._heap else None
                    self._cond.wait(timeout)
                if self._stopped:
                    return
                handle = heapq.heappop(self._heap)
            if handle.cancelled:
                continue
            try:
                handle.fn()
            except Exception as exc:
                log.exception("sim.timer.failed", what=handle.what, error=repr(exc)[:300])
