"""The runtime's guarantees (``operator/sdcguard/runtime/README.md``), one test each,
with no API server: the cluster tests named in the README hold the same guarantees
against a real one."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from sdcguard.adapters.kube import KubeWriter, NotLeading
from sdcguard.metrics import Metrics
from sdcguard.runtime.leader import LeaderElector
from sdcguard.runtime.mirror import NODES, Change, Gone, Mirror
from sdcguard.runtime.scheduling import PassScheduler


def _page(rv: str, *names: str, token: str = "") -> bytes:
    items = [{"metadata": {"name": n, "resourceVersion": rv}} for n in names]
    return json.dumps({"metadata": {"resourceVersion": rv, "continue": token}, "items": items})


def _names(body: Any) -> str | None:
    return str(body["metadata"]["name"])


def _paged_mirror(pages: Iterator[bytes | Exception], seen: list[Change[str]]) -> Mirror[str]:
    mirror: Mirror[str] = Mirror(
        client.ApiClient(client.Configuration()),
        NODES,
        _names,
        on_change=seen.extend,
        streaming=False,
    )

    def get_raw(**_: Any) -> bytes:
        page = next(pages)
        if isinstance(page, Exception):
            raise page
        return page

    mirror._get_raw = get_raw  # type: ignore[method-assign]
    return mirror


class _Passes:
    """A policy's passes whose copy becomes complete when the test says so."""

    name = "fleet"

    def __init__(self) -> None:
        self.probes_listed = False
        self.all_listed = False
        self.calls: list[tuple[str, Any]] = []

    def policy(self) -> str:
        return "policy"

    def probes_ready(self) -> bool:
        return self.probes_listed

    def ready(self) -> bool:
        return self.all_listed

    def copy_indexes(self) -> dict[str, Any]:
        return {}

    def view(self, copies: Any) -> str:
        return "full view"

    def urgent_view(self, nodes: frozenset[str], pods: Any, jobs: Any) -> str:
        return "urgent view"

    def mark(self) -> int:
        return 0

    def run_pass(self, policy: Any, view: Any, now: Any, dirty: Any, since: int) -> float:
        self.calls.append(("pass", dirty))
        return 60.0

    def offer(self, policy: Any, view: Any, nodes: frozenset[str], now: Any) -> None:
        self.calls.append(("offer", nodes))

    def serve_offered(self) -> None:
        self.calls.append(("serve", None))

    def requeue_unserved(self) -> set[str]:
        return set()

    def look_again(self, now: Any) -> set[str]:
        self.calls.append(("look again", None))
        return set()


def test_complete_copy_before_the_first_pass() -> None:
    """A paged list that fails part-way keeps nothing and is not synced; the scheduler
    decides nothing before the copy a decision reads is complete: no probe's end before
    every kind but the workload Pods has listed, no pass before they have, and the
    first pass then is a full one."""
    seen: list[Change[str]] = []
    mirror = _paged_mirror(iter([_page("5", "a", token="next"), RuntimeError("cut")]), seen)
    with pytest.raises(RuntimeError, match="cut"):
        mirror.relist(threading.Event())
    assert not mirror.synced.is_set() and mirror.items() == {} and not seen

    passes = _Passes()
    scheduler = PassScheduler(
        resync_seconds=60.0,
        debounce_seconds=0.0,
        metrics=Metrics(),
        clock=lambda: dt.datetime.now(dt.UTC),
    )
    stop = False

    async def until(what: str, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not any(call == what for call, _ in passes.calls):
            assert time.monotonic() < deadline, f"no {what}: {passes.calls}"
            await asyncio.sleep(0.01)

    async def main() -> None:
        loop = asyncio.ensure_future(scheduler.run(passes, lambda: stop))
        await asyncio.sleep(0.1)
        scheduler.poke(["gpu-1"], urgent=True)  # a probe ended
        await asyncio.sleep(0.3)
        assert passes.calls == [], "nothing before the probes' kinds have listed"
        passes.probes_listed = True
        await until("serve")
        assert ("offer", frozenset({"gpu-1"})) in passes.calls
        assert not any(call == "pass" for call, _ in passes.calls), "no pass yet"
        passes.all_listed = True
        await until("pass")
        assert next(dirty for call, dirty in passes.calls if call == "pass") is None, "full"
        nonlocal stop
        stop = True
        scheduler.poke()
        await asyncio.wait_for(loop, 5)

    asyncio.run(main())
    scheduler.executor.shutdown()
    scheduler.view_executor.shutdown()


def test_relist_on_410_gone() -> None:
    """A watch answered 410 Gone lists again; the fresh list replaces the copy with one
    change per object that differs, so an object deleted in the gap is seen to go."""
    seen: list[Change[str]] = []
    mirror = _paged_mirror(iter([_page("10", "a", "b"), _page("20", "a")]), seen)
    stop = threading.Event()
    watches: list[str] = []

    def watch_once(_: threading.Event) -> None:
        watches.append(mirror.resource_version)
        if len(watches) == 1:
            raise Gone()
        stop.set()

    mirror.watch_once = watch_once  # type: ignore[method-assign]
    mirror.run(stop)
    assert watches == ["10", "20"], "watched from each list's resourceVersion"
    assert mirror.stats.relists_gone == 1 and mirror.stats.lists == 2
    assert mirror.items() == {"a": "a"}
    assert seen == [Change("b", "b", None)], "only what the gap hid is reported"


def test_write_fence_by_lease_term() -> None:
    """A replica writes only while its last Lease renewal is younger than the renew
    deadline (which is shorter than the lease, so it stops before a standby may take
    over), and never again in a term it lost; the writer asks before every write, and a
    refused write is never sent."""
    elector = LeaderElector(
        client.ApiClient(),
        namespace="ns",
        name="lease",
        identity="me",
        lease_duration=8,
        renew_deadline=5,
        retry_period=1,
        on_lost=lambda: None,
    )
    writer = KubeWriter(api=client.ApiClient(), metrics=Metrics(), leading=elector.leading)
    elector.elected.set()
    elector._lock.renewed_at = time.monotonic()
    assert elector.leading()
    elector._lock.renewed_at = time.monotonic() - 5.1  # the renewals stalled
    assert not elector.leading()
    with pytest.raises(NotLeading):
        writer.patch_node("gpu-1", {"metadata": {"labels": {"a": "b"}}})
    elector._lock.renewed_at = time.monotonic()
    elector.abandon()  # the term was lost: a renewal that lands late fences nothing open
    assert not elector.leading()
    with pytest.raises(NotLeading):
        writer.create_custom("sdctests", {"metadata": {"name": "t"}})
    assert not writer.writes
