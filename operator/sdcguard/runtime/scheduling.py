"""When a policy's reconcile passes run, on which threads, and how a probe's end reaches
a pass that is already running: the runtime's pass scheduling.

Every change the fleet's copy sees marks the nodes it is about (:meth:`PassScheduler.poke`);
one loop per policy (:meth:`PassScheduler.run`, a Kopf daemon's body) then runs a pass
over them, debounced, and a full pass over every node at least every resync period,
spaced out on a fleet whose full pass is dear (:meth:`PassScheduler.full_pass_interval`).
A node whose probe ended is urgent: decided at once, with a fresh view of that node,
between the steps of a pass already running, or in the pass's thread while a pass's
view is still being copied.

- **Complete copy first.** Nothing is decided before the copy a decision reads is
  complete: probe ends wait for every kind but the workload Pods, and passes (idle
  windows, reservations) for the Pods too (:meth:`PolicyPasses.probes_ready`,
  :meth:`PolicyPasses.ready`).
- **Two threads.** Every pass runs in one worker thread (passes are serialized anyway:
  one malloc arena); each pass's view of the fleet is copied in a second one, so
  neither the event loop nor a probe's end waits for an O(fleet) copy.

The scheduler knows nothing of what a pass decides: :class:`PolicyPasses` is what it
drives (``adapters/pass_view.py`` implements it over the reconciler).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime as dt
import time
from collections.abc import Callable, Iterable
from typing import Any, Generic, Protocol, TypeVar

import structlog

from sdcguard.metrics import Metrics
from sdcguard.runtime.heap import Heap

log = structlog.get_logger("sdcguard")

P = TypeVar("P")
"""A policy, as its pass reads it."""
V = TypeVar("V")
"""A view of the fleet, as a pass reads it."""
T = TypeVar("T")

FULL_PASS_SPACING = 4.0
"""A full pass waits at least this many times the last one's duration after it: the
safety net takes at most a fifth of the operator's time, however big the fleet."""

FAILED_PASS_RETRY = 2.0
"""Seconds before a pass that raised is tried again (as a full pass)."""


class Ended(Protocol):
    """A probe Pod or Job that ended, named by its test."""

    @property
    def test_name(self) -> str: ...


class Wake:
    """What one policy loop has to look at: nodes whose observations changed (``dirty``),
    nodes whose probe just ended (``urgent``: decided at once, no debounce) and
    whether everything should be looked at (``full``)."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.urgent_event = asyncio.Event()
        self.dirty: set[str] = set()
        self.urgent: set[str] = set()
        self.full = True
        # The ended probe Pods and Jobs themselves: the copy may not hold them yet when
        # the loop wakes.
        self.ended_pods: dict[str, Any] = {}
        self.ended_jobs: dict[str, Any] = {}

    def take_urgent(self) -> tuple[frozenset[str], dict[str, Any], dict[str, Any]]:
        taken = (frozenset(self.urgent), self.ended_pods, self.ended_jobs)
        self.urgent, self.ended_pods, self.ended_jobs = set(), {}, {}
        return taken


class PolicyPasses(Protocol, Generic[P, V]):
    """What the scheduler drives for one policy: its views and its passes."""

    @property
    def name(self) -> str: ...

    def policy(self) -> P | None:
        """The policy as last parsed; None while its body is unreadable."""

    def probes_ready(self) -> bool:
        """The copy is complete enough to judge a probe's end."""

    def ready(self) -> bool:
        """The copy is complete: passes may run."""

    def copy_indexes(self) -> Any:
        """Copies of what the event loop changes (Kopf's indexes), for :meth:`view`."""

    def view(self, copies: Any) -> V:
        """The view of a pass (O(fleet); called in the view thread)."""

    def urgent_view(self, nodes: frozenset[str], pods: dict[str, Any], jobs: dict[str, Any]) -> V:
        """The view of ``nodes`` alone, with the ended Pods and Jobs as their events said."""

    def mark(self) -> int:
        """Where urgent work stands: taken before a pass's view is copied."""

    def run_pass(
        self, policy: P, view: V, now: dt.datetime, dirty: frozenset[str] | None, since: int
    ) -> float:
        """One pass (``dirty`` None: full); seconds until the next look."""

    def offer(self, policy: P, view: V, nodes: frozenset[str], now: dt.datetime) -> None:
        """Hand urgent nodes to the running pass (thread-safe)."""

    def serve_offered(self) -> None:
        """Serve what was offered, with no pass around it (the pass's thread)."""

    def requeue_unserved(self) -> set[str]:
        """Offer again what the last pass did not get to; returns its nodes."""

    def look_again(self, now: dt.datetime) -> set[str]:
        """Before the copy is complete: the nodes to look at again anyway (the pass's
        thread)."""


class PassScheduler:
    """Runs every policy's passes (module docstring): one per Kopf term."""

    def __init__(
        self,
        *,
        resync_seconds: float,
        debounce_seconds: float,
        metrics: Metrics,
        clock: Callable[[], dt.datetime],
        heap: Heap | None = None,
    ) -> None:
        self.resync_seconds = resync_seconds
        self.debounce_seconds = debounce_seconds
        self.metrics = metrics
        self.clock = clock
        self.heap = heap
        """Freezes the long-lived heap after each full pass (None: the collector is left
        as it is)."""
        self.wakes: list[Wake] = []
        # One worker thread runs every pass (they are serialized anyway): one malloc arena.
        self.executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sdcguard-pass")
        self.view_executor = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="sdcguard-view"
        )
        """Copies each pass's view of the fleet while the pass's thread serves probe
        ends (:meth:`pass_once`)."""

    def poke(
        self,
        nodes: Iterable[str] | None = None,
        *,
        urgent: bool = False,
        pod: Ended | None = None,
        job: Ended | None = None,
    ) -> None:
        """Wake every policy loop: these nodes' observations changed (None: anything may
        have; look at every node). Runs in the event loop."""
        for wake in self.wakes:
            if pod is not None:
                wake.ended_pods[pod.test_name] = pod
            if job is not None:
                wake.ended_jobs[job.test_name] = job
            if nodes is None:
                wake.full = True
            elif urgent:
                wake.urgent.update(nodes)
                wake.urgent_event.set()
            else:
                wake.dirty.update(nodes)
            wake.event.set()

    async def run(self, passes: PolicyPasses[P, V], stopped: Callable[[], bool]) -> None:
        """Reconcile the policy's nodes as their observations change, urgently when a
        probe ended, and all of them every resync period, until ``stopped()``."""
        wake = Wake()
        self.wakes.append(wake)
        next_full = next_look = 0.0
        # Nothing is decided from a partial copy of the fleet: a node not yet listed must
        # never look idle or new. Probe ends need every kind but the workload Pods, which
        # outnumber the Nodes ten to one: they are served once the rest has listed, and
        # passes (reservations, idle windows) wait for the Pods too.
        while not passes.probes_ready():
            if stopped():
                self.wakes.remove(wake)
                return
            await asyncio.sleep(0.05)
        try:
            loop = asyncio.get_running_loop()
            again_at = 0.0
            while not stopped() and not passes.ready():
                again: set[str] = set()
                if time.monotonic() >= again_at:  # at once (probes that ended while no
                    # operator ran came with the first list, which tells no change), then
                    # every second
                    now = self.clock()
                    again = await loop.run_in_executor(self.executor, passes.look_again, now)
                    again_at = time.monotonic() + 1.0
                await self._probe_ends_only(passes, wake, again)
            while not stopped():
                try:
                    timeout = max(0.0, min(next_full, next_look) - time.monotonic())
                    await asyncio.wait_for(wake.event.wait(), timeout=timeout)
                except TimeoutError:
                    pass
                if stopped():
                    break
                if not wake.urgent:
                    # Batch a burst of events, but never hold back a probe's end.
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(
                            wake.urgent_event.wait(), timeout=self.debounce_seconds
                        )
                wake.event.clear()
                wake.urgent_event.clear()
                policy = passes.policy()
                if policy is None:  # waits for a readable body; its change wakes the loop
                    next_look = time.monotonic() + 60.0
                    continue
                full = wake.full or time.monotonic() >= next_full
                urgent, pods, jobs = wake.take_urgent()
                if urgent:  # decided first, from a view of just these nodes
                    view = passes.urgent_view(urgent, pods, jobs)
                    passes.offer(policy, view, urgent, self.clock())
                dirty = None if full else frozenset(wake.dirty)
                wake.dirty, wake.full = set(), False
                began = time.monotonic()
                wake_in = await self.pass_once(passes, policy, dirty, wake)
                if full:
                    next_full = time.monotonic() + self.full_pass_interval(
                        passes.name, time.monotonic() - began
                    )
                    if self.heap is not None:
                        # What the pass left alive is the fleet copy and the policy's
                        # memory: no collection scans it again (a full collection over a
                        # large fleet copy stops every thread, probe ends included).
                        self.heap.settle()
                next_look = time.monotonic() + wake_in
        finally:
            self.wakes.remove(wake)

    async def pass_once(
        self,
        passes: PolicyPasses[P, V],
        policy: P,
        dirty: frozenset[str] | None,
        wake: Wake,
    ) -> float:
        """One reconcile pass (``dirty`` None: full); returns seconds until the next look.

        While it runs, nodes whose probe ends are handed to it with a fresh view and
        served between its steps; what it did not get to is marked urgent again.
        """
        loop = asyncio.get_running_loop()
        # The pass's copy of the fleet is made in a thread of its own, not the pass's: it
        # costs O(fleet), and made in the event loop or before the pass in the pass's
        # thread, it would hold back every probe's end that arrived meanwhile. Those are
        # served in the pass's thread while the copy is made, and the pass leaves the
        # nodes they decided to them (``since``). What the event loop changes (Kopf's
        # indexes: a few policies and baselines) is copied here, in the loop.
        copies = passes.copy_indexes()
        mark = passes.mark()
        copying = loop.run_in_executor(self.view_executor, passes.view, copies)
        try:
            fleet = await self._handing_on(passes, policy, wake, copying, serve=True)
        except Exception:  # retried like a failed pass
            log.exception("reconcile pass failed", policy=passes.name)
            wake.full = True
            return FAILED_PASS_RETRY

        def run() -> float:
            return passes.run_pass(policy, fleet, self.clock(), dirty, mark)

        future = loop.run_in_executor(self.executor, run)
        try:
            wake_in = await self._handing_on(passes, policy, wake, future, serve=False)
        except Exception:  # a failed pass is retried; level-triggered, nothing is lost
            log.exception("reconcile pass failed", policy=passes.name)
            wake.full = True
            return FAILED_PASS_RETRY
        finally:
            # Work offered as the pass ended: served first by the next pass, which runs now.
            left = passes.requeue_unserved()
            if left:
                wake.urgent.update(left)
                wake.event.set()
        return min(self.resync_seconds, max(0.05, wake_in))

    async def _handing_on(
        self,
        passes: PolicyPasses[P, V],
        policy: P,
        wake: Wake,
        work: asyncio.Future[T],
        *,
        serve: bool,
    ) -> T:
        """Wait for ``work`` (a pass, or its copy of the fleet), handing every probe end
        that arrives meanwhile to the pass with a fresh view of its nodes: served by the
        running pass between its steps, or (``serve``: no pass runs yet, the copy is
        being made) at once in the pass's thread."""
        loop = asyncio.get_running_loop()
        while not work.done():
            urgent: asyncio.Future[Any] = asyncio.ensure_future(wake.urgent_event.wait())
            await asyncio.wait({work, urgent}, return_when=asyncio.FIRST_COMPLETED)
            urgent.cancel()
            if wake.urgent_event.is_set() and not work.done():
                wake.urgent_event.clear()
                nodes, pods, jobs = wake.take_urgent()
                if nodes:
                    view = passes.urgent_view(nodes, pods, jobs)
                    passes.offer(policy, view, nodes, self.clock())
                    if serve:
                        await loop.run_in_executor(self.executor, passes.serve_offered)
        return await work

    async def _probe_ends_only(
        self, passes: PolicyPasses[P, V], wake: Wake, again: set[str]
    ) -> None:
        """Before the workload Pods have listed: serve the nodes whose probe ended or
        that changed, and ``again``, with views that say the Pods are not known (so only
        finished tests are decided, and tests in flight advanced); every policy's first
        pass after the copy is complete is a full one."""
        policy = passes.policy()
        if policy is None:  # unreadable (logged): its change wakes nothing here, so look again
            await asyncio.sleep(0.5)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.event.wait(), timeout=0.2)
        wake.event.clear()
        wake.urgent_event.clear()
        urgent, pods, jobs = wake.take_urgent()
        nodes = frozenset(urgent | wake.dirty | again)
        wake.dirty = set()
        if not nodes:
            return
        view = passes.urgent_view(nodes, pods, jobs)
        passes.offer(policy, view, nodes, self.clock())
        await asyncio.get_running_loop().run_in_executor(self.executor, passes.serve_offered)

    def full_pass_interval(self, policy: str, took: float) -> float:
        """Seconds from the end of a full pass to the next one: ``resyncSeconds``, or
        longer on a fleet whose full pass is dear (a large fleet, or a loaded machine),
        so probe ends, joins and changed nodes keep the operator's time.
        Time-driven work (idle windows, expiry, back-off) asks for its own look and does
        not wait for it."""
        resync = self.resync_seconds
        interval = max(resync, FULL_PASS_SPACING * took)
        self.metrics.full_pass_seconds.observe(took)
        self.metrics.full_pass_interval.set(interval)
        if interval > resync:
            log.info(
                "full passes spaced out",
                policy=policy,
                took=round(took, 3),
                next_in=round(interval, 1),
                resync=resync,
            )
        return interval
