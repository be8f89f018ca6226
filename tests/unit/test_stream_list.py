"""A streaming list's rules that a real API server will not break on demand: nothing of
a stream is kept before the bookmark that ends its initial events, and a 410 in the
middle of it means listing again (the cluster tests cover the real server's streams)."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from kubernetes import client

from sdcguard.domain.observed import NodeSnapshot
from sdcguard.runtime.mirror import (
    INITIAL_EVENTS_END,
    NODES,
    Change,
    Gone,
    Mirror,
    StreamEnded,
)


class Events:
    """A streaming list's response, one chunk a watch event."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.chunks = [json.dumps(e).encode() + b"\n" for e in events]
        self.released = False

    def stream(self, amt: Any = None, decode_content: bool = False) -> Any:
        return iter(self.chunks)

    def release_conn(self) -> None:
        self.released = True


def _node(name: str, rv: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv, "labels": labels}}


def _end(rv: str) -> dict[str, Any]:
    meta = {"resourceVersion": rv, "annotations": {INITIAL_EVENTS_END: "true"}}
    return {"type": "BOOKMARK", "object": {"metadata": meta}}


def _mirror(seen: list[Change[NodeSnapshot]]) -> Mirror[NodeSnapshot]:
    return Mirror(
        client.ApiClient(client.Configuration()),
        NODES,
        NodeSnapshot.from_body,
        on_change=seen.extend,
    )


def _serve(mirror: Mirror[NodeSnapshot], events: list[dict[str, Any]]) -> Events:
    response = Events(events)
    mirror._stream_request = lambda: response  # type: ignore[method-assign]
    return response


def test_the_initial_events_replace_the_copy_at_their_end_and_the_stream_watches_on() -> None:
    seen: list[Change[NodeSnapshot]] = []
    mirror = _mirror(seen)
    synced: list[int] = []
    response = _serve(
        mirror,
        [
            {"type": "ADDED", "object": _node("a", "5")},
            {"type": "ADDED", "object": _node("b", "6")},
            {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "6"}}},
            _end("7"),
            {"type": "MODIFIED", "object": _node("a", "8", pool="x")},
            {"type": "DELETED", "object": _node("b", "9")},
        ],
    )
    mirror.stream_list(threading.Event(), lambda: synced.append(len(mirror)))
    assert synced == [2], "synced once, with both initial objects"
    assert set(mirror.items()) == {"a"} and mirror.items()["a"].labels == {"pool": "x"}
    assert mirror.resource_version == "9", "the watch went on from the bookmark"
    # The initial objects are the first sync (no change reported); the watch's are.
    assert [(c.key, c.old is None, c.new is None) for c in seen] == [
        ("a", False, False),
        ("b", False, True),
    ]
    assert mirror.stats.initial_events == 2 and mirror.stats.events == 2
    assert response.released


def test_a_stream_that_ends_before_its_initial_events_keeps_nothing() -> None:
    seen: list[Change[NodeSnapshot]] = []
    mirror = _mirror(seen)
    response = _serve(mirror, [{"type": "ADDED", "object": _node("a", "5")}])
    with pytest.raises(StreamEnded, match="no end bookmark"):
        mirror.stream_list(threading.Event(), lambda: pytest.fail("synced from a partial list"))
    assert not mirror.synced.is_set()
    assert mirror.items() == {} and mirror.resource_version == ""
    assert response.released


def test_a_later_streaming_list_reports_what_changed_since_the_copy() -> None:
    """After a 410, the new list's objects replace the copy: what went meanwhile is
    reported as deleted, and the copy is served unchanged until the list is complete."""
    seen: list[Change[NodeSnapshot]] = []
    mirror = _mirror(seen)
    _serve(mirror, [{"type": "ADDED", "object": _node(n, "5")} for n in "abc"] + [_end("5")])
    mirror.stream_list(threading.Event(), lambda: None)
    mirror.resource_version = ""  # a 410: list again
    copy_during: list[set[str]] = []
    slim = mirror.slim

    def slim_and_look(body: Any) -> Any:
        copy_during.append(set(mirror.items()))
        return slim(body)

    mirror.slim = slim_and_look
    _serve(mirror, [{"type": "ADDED", "object": _node(n, "9")} for n in "ab"] + [_end("9")])
    mirror.stream_list(threading.Event(), lambda: None)
    assert copy_during == [{"a", "b", "c"}] * 2, "the old copy serves while the list runs"
    assert set(mirror.items()) == {"a", "b"}
    assert [(c.key, c.new is None) for c in seen if c.new is None] == [("c", True)]


def test_a_410_in_the_initial_events_means_listing_again() -> None:
    mirror = _mirror([])
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}}
    _serve(mirror, [{"type": "ADDED", "object": _node("a", "5")}, gone])
    with pytest.raises(Gone):
        mirror.stream_list(threading.Event(), lambda: pytest.fail("synced"))
    assert not mirror.synced.is_set() and mirror.items() == {}


def test_a_mirror_waits_for_what_it_lists_after_and_a_stop_ends_the_wait() -> None:
    before = threading.Event()
    mirror = _mirror([])
    mirror.after = (before,)
    requested = threading.Event()
    stop = threading.Event()
    response = Events([{"type": "ADDED", "object": _node("a", "5")}, _end("6")])
    chunks = response.chunks

    def held(amt: Any = None, decode_content: bool = False) -> Any:
        yield from chunks
        stop.wait(10)  # the stream stays open, as a watch does, until the test ends

    response.stream = held  # type: ignore[method-assign]

    def request() -> Events:
        requested.set()
        return response

    mirror._stream_request = request  # type: ignore[method-assign]
    thread = mirror.start(stop)
    try:
        assert not requested.wait(1.5), "no request before the other kind has listed"
        assert not mirror.synced.is_set()
        before.set()
        assert mirror.synced.wait(5) and set(mirror.items()) == {"a"}
    finally:
        stop.set()
        thread.join(5)
    assert not thread.is_alive()

    waiting = _mirror([])
    waiting.after = (threading.Event(),)  # never set
    stop = threading.Event()
    thread = waiting.start(stop)
    stop.set()
    thread.join(2)
    assert not thread.is_alive(), "a stop ends the wait"


class Pauses(threading.Event):
    """A stop whose waits return at once and are recorded; set after ``count`` waits."""

    def __init__(self, count: int) -> None:
        super().__init__()
        self.count = count
        self.pauses: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.pauses.append(float(timeout or 0))
        if len(self.pauses) >= self.count:
            self.set()
        return self.is_set()


def test_a_request_cut_after_it_delivered_is_retried_after_the_first_pause() -> None:
    """Refusals double the pause; a stream cut after some of its objects came was
    being served, so its retry starts from the first pause again."""
    mirror = _mirror([])
    cut = [{"type": "ADDED", "object": _node("a", "5")}]  # no end bookmark: cut
    answers: list[Any] = [
        client.ApiException(status=500),
        client.ApiException(status=503),
        Events(cut),
        client.ApiException(status=500),
        Events(cut),
        Events(cut),
    ]

    def request() -> Any:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    mirror._stream_request = request  # type: ignore[method-assign]
    stop = Pauses(6)
    mirror.run(stop)
    assert stop.pauses == [0.5, 1.0, 0.5, 1.0, 0.5, 0.5]
    assert mirror.stats.errors == 6 and not mirror.synced.is_set() and not answers
    assert mirror.delivered() == 3  # the three cut streams' one object each
