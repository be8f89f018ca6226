"""Urgent work: the nodes whose probe just ended, served between the steps of the
running pass so that a finished test never waits behind a long one."""

from __future__ import annotations

import queue
from collections.abc import Callable

import structlog

from sdcguard.adapters.pass_state import UrgentWork

log = structlog.get_logger("sdcguard.reconcile")

SERVED_KEPT = 10_000
"""Urgent passes whose nodes :meth:`Reconciler.served_since` can still name (hours of
probe ends; a view is copied in seconds)."""


def failures_first(work: UrgentWork) -> list[frozenset[str]]:
    """The urgent nodes in the passes that decide them, in order: each node whose probe
    Pod failed (SDC, a crash: a quarantine or its confirmation may follow) in a pass
    of its own, then the rest together (one pass costs less than one per node)."""
    failed = sorted(
        {
            pod.node_name
            for pods in work.view.probe_pods.values()
            for pod in pods
            if pod.phase == "Failed" and pod.node_name in work.nodes
        }
    )
    rest = work.nodes - set(failed)
    return [frozenset({node}) for node in failed] + ([rest] if rest else [])


class UrgentQueue:
    """Nodes whose probe just ended, offered from the event loop's thread and served
    between the steps of the running pass (``Reconciler._serve_urgent``), so a finished
    test never waits behind a long pass; and which nodes each served pass decided, so
    the longer pass leaves them to that fresher decision."""

    def __init__(self) -> None:
        self._offered: queue.SimpleQueue[UrgentWork] = queue.SimpleQueue()
        self.touched: set[str] = set()
        """Nodes urgent work decided during the running pass (or after its mark)."""
        self.depth = 0
        """Urgent passes running now (one at most: a served pass serves no other)."""
        self.served = 0
        """Urgent passes served so far: a view's mark (:meth:`Reconciler.mark`)."""
        self.served_at: dict[str, int] = {}
        """Node -> the urgent pass that last decided it (one entry a node at most)."""

    def mark(self) -> int:
        """Where urgent work stands now (see :meth:`served_since`)."""
        return self.served

    def begin_pass(self, since: int | None) -> None:
        """A pass begins: the nodes urgent work decided after its mark ``since`` (None:
        none) are left to that fresher decision, as are those it decides meanwhile."""
        self.touched = set() if since is None else self.served_since(since)

    def end_pass(self) -> None:
        self.touched = set()

    def offer(self, work: UrgentWork) -> None:
        self._offered.put(work)

    def waiting(self) -> bool:
        """Whether work was offered and not taken yet."""
        return not self._offered.empty()

    def take(self) -> list[UrgentWork]:
        left = []
        while True:
            try:
                left.append(self._offered.get_nowait())
            except queue.Empty:
                return left

    def served_since(self, mark: int) -> set[str]:
        return {node for node, at in self.served_at.items() if at > mark}

    def skip(self, node: str) -> bool:
        """Urgent work served during this pass decided the node from fresher facts."""
        return not self.depth and node in self.touched

    def serve(self, run: Callable[[UrgentWork, frozenset[str]], object]) -> None:
        """Serve the work offered so far with ``run`` (work offered while it runs waits
        for the next check, so the running pass moves on too); a pass inside a served
        one serves nothing.

        A node whose probe failed is decided first, in a pass of its own: probe ends
        decided together write every node's test status before any node patch, so a
        quarantine would wait behind the other nodes' writes, several times as long as
        its own patch under load."""
        if self.depth:
            return
        merged: dict[str, UrgentWork] = {}
        for work in self.take():
            key = work.policy.metadata.name
            earlier = merged.get(key)
            if earlier is not None:
                work = UrgentWork(
                    work.policy,
                    earlier.view.merged(work.view),
                    earlier.nodes | work.nodes,
                    max(earlier.now, work.now),
                )
            merged[key] = work
        for work in merged.values():
            for nodes in failures_first(work):
                self.depth += 1
                try:
                    run(work, nodes)
                except Exception:  # the loop's next pass decides again
                    log.exception("urgent pass failed", nodes=sorted(nodes)[:10])
                finally:
                    self.depth -= 1
                    self.touched |= nodes
                    self.served += 1
                    for node in nodes:
                        self.served_at[node] = self.served
                    if len(self.served_at) > SERVED_KEPT:
                        # A mark is minutes old at most; an older entry is never asked.
                        oldest = self.served - SERVED_KEPT
                        self.served_at = {n: a for n, a in self.served_at.items() if a > oldest}
