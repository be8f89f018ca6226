"""Every kind whose count grows with the fleet, listed (streamed, or page by page) and
then watched: the operator's copy of the fleet.

Kopf indexes every object of a kind it watches and, during its initial listing, wakes
every waiting worker as each object is indexed; its start-up costs time in the square
of the object count, and its initial list is one unpaginated request. Nodes, Pods,
probe Pods and Jobs, and our own SDCTests, RepairTickets and SDCHardware records grow
with the fleet (and its history), so they come through a :class:`Mirror` instead
(Kopf keeps the few policies and baselines, timers, daemons and the SDCReport events):

- **Streaming list** where the API server serves one (``sendInitialEvents``, served
  from its watch cache; on by default in current Kubernetes): one watch request sends
  every object as an ``ADDED`` event, then a bookmark that marks their end, and watches
  on from there in the same request. Memory peaks at one event, and there is no gap
  between list and watch: a paged list's resourceVersion is as old as its first page,
  and a list that takes minutes on a busy API server can end with a watch answered
  410 (the version has left the watch cache), so a standby would relist again and
  again. The objects replace the copy at the bookmark; a stream that ends before it
  keeps nothing and starts over. A server that refuses streaming
  lists (400, 422) gets paged lists from then on.
- **Paginated list** otherwise: ``limit``/``continue`` in pages of ``page_size``
  (1,000 objects: fewer round trips than 500 for a large list): the peak memory of a
  list is one page's raw JSON plus the slim snapshots kept so far. A continue token
  that expired (410) restarts the list from the beginning. The garbage collector is
  paused while a page is parsed and slimmed (:func:`_gc_paused`). Pages and events are
  parsed with orjson: on a large fleet the Pods' list is most of a start, and most of
  the operator's part of it is parsing.
- **Then one watch** from the list's resourceVersion (a paged list's; a streaming list
  watches on already), with bookmarks, so a quiet kind still moves its
  resourceVersion forward. When the server ends a watch (its timeout,
  a dropped connection), the next one starts from the last resourceVersion seen.
- **410 Gone** (that resourceVersion is too old) means a fresh list. The copy
  keeps serving the last complete state while it runs and is replaced at the end, with
  one change per object that differs, so deletions missed in the gap are seen.
- **429 and 5xx** answers are retried with backoff, honouring Retry-After (urllib3's
  ``Retry`` on the mirror's own API client), and any other failure is retried after a
  growing pause (0.5 s doubling to 30 s). A request cut after it delivered something
  (a page, an object of a stream, a watch event) was being served, so its retry starts
  again from the first pause: a list cut again and again would otherwise wait longer
  in pauses than in serving. The mirror never gives up; its counters say what happened.
- **Complete or nothing.** :attr:`Mirror.synced` is set once the first list is
  complete; nothing that reads a kind is decided before its copy is (the inventory
  says which decisions read which kinds), so a node missing from a partial copy is
  never treated as idle or new.

Each object is kept as ``slim(body)`` returns it (``None``: not kept at all), never the
whole body. Steady state costs one open watch per kind and no periodic LIST.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import orjson
import structlog
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

log = structlog.get_logger(__name__)

T = TypeVar("T")

# The API server's default watch timeout is 30-60 min; ask for 5 and read for longer.
WATCH_TIMEOUT_SECONDS = 300
RETRIED_STATUSES = (429, 500, 502, 503, 504)
PAGE_SIZE = 1000
"""Objects per list page (module docstring)."""
FIRST_PAUSE = 0.5
"""Seconds before retrying a failed request; doubled by each failure that delivered
nothing, up to MAX_PAUSE, and back to this after a request delivered anything."""
MAX_PAUSE = 30.0
NOT_SERVED_RETRY = 300.0
"""Seconds before an optional kind the server did not serve is asked for again."""
NOT_SERVED = (403, 404)


def parse(raw: bytes | str) -> Any:
    """A list page or a watch event as the API server sends it (JSON)."""
    return orjson.loads(raw)


def retrying_client(
    api: client.ApiClient,
    *,
    total: int = 8,
    backoff: float = 0.2,
    backoff_max: float = 5.0,
    methods: frozenset[str] = frozenset({"GET"}),
    retry_after: bool = True,
) -> client.ApiClient:
    """A copy of ``api``'s configuration whose requests (by default GETs) retry 429 and
    5xx answers and dropped connections with exponential backoff (by default 0.2 s
    doubling to 5 s), honouring Retry-After unless told not to."""
    config = client.Configuration()
    for name, value in vars(api.configuration).items():
        setattr(config, name, value)
    config.retries = urllib3.Retry(
        total=total,
        backoff_factor=backoff,
        backoff_max=backoff_max,
        status_forcelist=RETRIED_STATUSES,
        allowed_methods=methods,
        respect_retry_after_header=retry_after,
        raise_on_status=False,
    )
    return client.ApiClient(configuration=config)


class Gone(Exception):
    """The resourceVersion (or continue token) is too old: list again."""


class StreamEnded(Exception):
    """A streaming list ended before its initial events did: nothing of it is kept."""


INITIAL_EVENTS_END = "k8s.io/initial-events-end"
"""The annotation of the bookmark that closes a streaming list's initial events."""
STREAM_REFUSED = (400, 422)
"""A server that does not serve streaming lists refuses ``sendInitialEvents`` so."""
STREAM_TIMEOUT_SECONDS = 3600
"""A streaming list's whole request (initial events, then watching on): long enough for
the initial events of the biggest fleet on a busy API server."""

_gc_lock = threading.Lock()
_gc_pauses = 0
_gc_was_enabled = False


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No automatic garbage collection while a list page is parsed and slimmed.

    A page of 1,000 Pods is some 150,000 small objects alive at once; they survive the
    young collections and make the collector scan the whole heap (the fleet copy) again
    and again, which multiplies the list's CPU (``bench.scale.inventory`` measures it
    with and without the pause). JSON holds no reference cycles, so reference counting
    frees the page when it is dropped. Nested and concurrent pauses (one per mirror
    thread) count: the collector runs again when the last one ends, if it ran before
    the first.
    """
    global _gc_pauses, _gc_was_enabled
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_enabled:
                gc.enable()


@dataclass(frozen=True, slots=True)
class Change(Generic[T]):
    """One object that changed: ``old`` None when it is new, ``new`` None when it went."""

    key: str
    old: T | None
    new: T | None


@dataclass
class MirrorStats:
    """What the mirror did, for logs, metrics and tests."""

    lists: int = 0
    """Lists started: paged or streaming."""
    pages: int = 0
    streams: int = 0
    """Of the lists, streaming ones (initial events, then the same request watches)."""
    initial_events: int = 0
    watches: int = 0
    events: int = 0
    bookmarks: int = 0
    relists_gone: int = 0
    not_served: int = 0
    """Lists of an optional kind answered 404 or 403 (``Kind.optional``)."""
    errors: int = 0
    last_error: str = ""
    first_sync_seconds: float | None = None
    unreadable: dict[str, str] = field(default_factory=dict)
    """Objects whose ``slim`` raised, by key, with the error: left out of the copy (one
    object the operator cannot read must not fail the whole list, again and again),
    named here and in a warning; an object leaves when a later version reads, or when
    it is deleted."""


@dataclass(frozen=True, slots=True)
class Kind:
    """How to list and watch one kind: ``lister`` is a list method of the client's
    ``api`` class, called with ``args`` first (a custom resource's group, version and
    plural); ``namespace``: that namespace only; selectors apply on the server."""

    name: str
    lister: str
    api: str = "CoreV1Api"
    namespace: str | None = None
    label_selector: str | None = None
    field_selector: str | None = None
    args: tuple[str, ...] = ()
    path: str = ""
    """The collection's URL path (``{namespace}`` filled in): a streaming list is a
    request the generated client cannot make for every kind, so it is built here.
    Empty: paged lists only."""
    optional: bool = False
    """A kind the server may not serve (an API group a cluster may lack, such as DRA's
    resource.k8s.io/v1): a list answered 404 (not served) or 403 (not granted) leaves
    the copy empty but synced, so nothing waits on it, and the mirror asks again every
    NOT_SERVED_RETRY seconds."""


NODES = Kind("nodes", "list_node", path="/api/v1/nodes")
PODS = Kind("pods", "list_pod_for_all_namespaces", path="/api/v1/pods")


def cluster_custom(group: str, version: str, plural: str) -> Kind:
    """A cluster-scoped custom resource (our SDCTests, RepairTickets, SDCHardware)."""
    return Kind(
        plural,
        "list_cluster_custom_object",
        api="CustomObjectsApi",
        args=(group, version, plural),
        path=f"/apis/{group}/{version}/{plural}",
    )


def object_key(body: Mapping[str, Any]) -> str:
    """``namespace/name`` for namespaced objects, ``name`` for cluster-scoped ones."""
    meta = body.get("metadata") or {}
    name = str(meta.get("name", ""))
    namespace = meta.get("namespace")
    return f"{namespace}/{name}" if namespace else name


@dataclass
class Mirror(Generic[T]):
    """A list-then-watch copy of one kind, kept as slim snapshots (module docstring).

    ``groups`` names the groups an object belongs to (for Pods: the node it uses), kept
    up to date with every change so a caller reads one group without a scan.
    ``on_change`` is called from the mirror's thread with every batch of changes after
    the first sync (one per watch event; all of a relist's differences at once).
    """

    api: client.ApiClient
    kind: Kind
    slim: Callable[[Mapping[str, Any]], T | None]
    groups: Callable[[T], Iterable[str]] = lambda _: ()
    on_change: Callable[[list[Change[T]]], None] | None = None
    page_size: int = PAGE_SIZE
    watch_timeout: int = WATCH_TIMEOUT_SECONDS
    streaming: bool = True
    """List with a streaming list where the kind has a ``path`` and the server serves
    them (it turns off when the server refuses one); else, and then, paged lists."""
    stats: MirrorStats = field(default_factory=MirrorStats)
    after: tuple[threading.Event, ...] = ()
    """Events to wait for before the first list (other mirrors' :attr:`synced`): a big
    kind nothing urgent needs lists after the kinds that serve urgent work, so that at
    start-up it does not share the API server and the CPU with them."""

    def __post_init__(self) -> None:
        self.synced = threading.Event()
        self.resource_version = ""
        self._items: dict[str, T] = {}
        self._groups: dict[str, dict[str, T]] = {}
        self._lock = threading.Lock()
        self._response: Any = None

    @functools.cached_property
    def _client(self) -> Any:
        """The kind's generated API class (``CoreV1Api``...), for paged lists and plain
        watches. Made when first used: the generated classes import every model of the
        client (a third of a second), and a streaming list needs none of them, so a
        process's copy starts listing without waiting for that import."""
        return getattr(client, self.kind.api)(self.api)

    # Reading ------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: str) -> T | None:
        return self._items.get(key)

    def items(self) -> dict[str, T]:
        """A copy of every kept object by key."""
        with self._lock:
            return dict(self._items)

    def group(self, name: str) -> list[T]:
        with self._lock:
            return list(self._groups.get(name, {}).values())

    def grouped(self, names: Iterable[str] | None = None) -> dict[str, list[T]]:
        """A copy of the groups (``names`` None: all of them)."""
        with self._lock:
            if names is None:
                return {k: list(v.values()) for k, v in self._groups.items() if v}
            return {k: list(self._groups[k].values()) for k in names if self._groups.get(k)}

    # Running ------------------------------------------------------------------

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(
            target=self.run, args=(stop,), name=f"mirror-{self.kind.name}", daemon=True
        )
        thread.start()
        return thread

    def delivered(self) -> int:
        """Pages, objects of streams, watch events and bookmarks received so far."""
        s = self.stats
        return s.pages + s.initial_events + s.events + s.bookmarks

    def run(self, stop: threading.Event) -> None:
        """List, then watch, until ``stop`` is set; relist on 410; never raises."""
        pause = FIRST_PAUSE
        started = time.monotonic()
        for event in self.after:
            while not event.wait(0.5):
                if stop.is_set():
                    return
        if self.after:
            log.info(
                "mirror lists",
                kind=self.kind.name,
                waited=round(time.monotonic() - started, 3),
            )
        while not stop.is_set():
            delivered = self.delivered()
            try:
                if not self.resource_version:
                    if self.streaming and self.kind.path:
                        # Synced at the end of the initial events; the same request
                        # then watches on until the server ends it.
                        self.stream_list(stop, lambda: self._note_synced(started))
                        pause = FIRST_PAUSE
                        continue
                    self.relist(stop)
                    self._note_synced(started)
                self.watch_once(stop)
                pause = FIRST_PAUSE
            except Gone:
                self.stats.relists_gone += 1
                log.info("mirror relists", kind=self.kind.name, why="410 Gone")
                self.resource_version = ""
            except Exception as exc:  # the API server or the network; try again
                if stop.is_set():  # stop_watch() cut the stream
                    return
                if self._not_served(exc, started):
                    stop.wait(NOT_SERVED_RETRY)
                    continue
                self.stats.errors += 1
                self.stats.last_error = repr(exc)[:300]
                if self.delivered() > delivered:  # served, then cut: not a refusal
                    pause = FIRST_PAUSE
                log.warning(
                    "mirror request failed",
                    kind=self.kind.name,
                    error=self.stats.last_error,
                    retry_in=pause,
                    exc_info=not isinstance(
                        exc, ApiException | urllib3.exceptions.HTTPError | StreamEnded
                    ),
                )
                stop.wait(pause)
                pause = min(pause * 2, MAX_PAUSE)

    def _not_served(self, exc: Exception, started: float) -> bool:
        """An optional kind the server does not serve (or lets us read): an empty,
        synced copy (what was kept goes, as changes); True when so."""
        if not (self.kind.optional and isinstance(exc, ApiException) and exc.status in NOT_SERVED):
            return False
        self.stats.not_served += 1
        if self.stats.not_served == 1 or self._items:
            log.info(
                "optional kind not served; an empty copy",
                kind=self.kind.name,
                status=exc.status,
                retry_in=NOT_SERVED_RETRY,
            )
        self._install({}, "")
        self._note_synced(started)
        return True

    def _note_synced(self, started: float) -> None:
        if self.stats.first_sync_seconds is None and self.synced.is_set():
            self.stats.first_sync_seconds = time.monotonic() - started
            log.info(
                "mirror synced",
                kind=self.kind.name,
                objects=len(self._items),
                pages=self.stats.pages,
                streamed=self.stats.streams > 0,
                seconds=round(self.stats.first_sync_seconds, 3),
            )

    def stop_watch(self) -> None:
        """End the open watch now (the thread's ``stop`` ends the loop)."""
        response = self._response
        if response is None:
            return
        # Closing the file does not wake a read blocked in another thread; shutting the
        # socket down does.
        sock = getattr(getattr(response, "connection", None), "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(Exception):  # already closed
            response.close()

    def relist(self, stop: threading.Event) -> None:
        """A complete paginated list; replaces the copy at the end (changes reported)."""
        fresh: dict[str, T] = {}
        token: str | None = None
        version = ""
        self.stats.lists += 1
        while not stop.is_set():
            raw = self._get_raw(limit=self.page_size, _continue=token)
            self.stats.pages += 1
            with _gc_paused():
                page = parse(raw)
                del raw
                for body in page.get("items") or []:
                    kept = self._slim(body)
                    if kept is not None:
                        fresh[object_key(body)] = kept
                meta = page.get("metadata") or {}
                del page
            version = str(meta.get("resourceVersion") or "")
            token = meta.get("continue") or None
            if not token:
                break
        if stop.is_set():
            return
        self._install(fresh, version)

    def _install(self, fresh: dict[str, T], version: str) -> None:
        """A complete list's objects replace the copy (changes reported after the first)."""
        changes = self._replace(fresh)
        self.resource_version = version
        first = not self.synced.is_set()
        self.synced.set()
        if changes and not first and self.on_change is not None:
            self.on_change(changes)

    def stream_list(self, stop: threading.Event, on_synced: Callable[[], None]) -> None:
        """A streaming list: one watch request that first sends every object as an
        ``ADDED`` event and then a bookmark marked as their end, and watches on from
        there (``sendInitialEvents``; the API server serves it from its watch cache).

        Nothing of it is kept until that bookmark: the objects replace the copy then, as
        a paged list's do at its end, and ``on_synced`` is called. Unlike a paged list,
        whose resourceVersion is as old as its first page and may be gone from the
        server's watch cache by the time a long list ends (410, a relist, and the same
        again on a busy server), the watch goes on from where the list ended, in the
        same request. A stream that ends before its initial events did raises
        :class:`StreamEnded`; a server that refuses it turns streaming off (paged lists
        from then on).
        """
        self.stats.lists += 1
        self.stats.streams += 1
        try:
            response = self._stream_request()
        except ApiException as exc:
            if exc.status not in STREAM_REFUSED:
                raise
            self.streaming = False
            log.info(
                "streaming lists not served; paged lists",
                kind=self.kind.name,
                status=exc.status,
                reason=str(exc.reason or "")[:200],
            )
            return
        self._response = response
        fresh: dict[str, T] | None = {}
        try:
            for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
                if stop.is_set():
                    return
                if not line:
                    continue
                event = parse(line)
                if fresh is None:  # the initial events are in: watching
                    self._event(event)
                    continue
                kind = event.get("type")
                body = event.get("object") or {}
                meta = body.get("metadata") or {}
                if kind == "ADDED":
                    self.stats.initial_events += 1
                    kept = self._slim(body)
                    if kept is not None:
                        fresh[object_key(body)] = kept
                elif kind == "BOOKMARK":
                    if (meta.get("annotations") or {}).get(INITIAL_EVENTS_END) == "true":
                        self._install(fresh, str(meta.get("resourceVersion") or ""))
                        fresh = None
                        on_synced()
                elif kind == "ERROR":
                    self._event(event)  # raises
            if fresh is not None and not stop.is_set():
                raise StreamEnded(f"{self.kind.name}: {len(fresh)} objects, no end bookmark")
        finally:
            self._response = None
            response.release_conn()

    def _stream_request(self) -> Any:
        """The streaming list's request (raises ApiException on a refusal)."""
        query: list[tuple[str, Any]] = [
            ("watch", "true"),
            ("sendInitialEvents", "true"),
            ("resourceVersionMatch", "NotOlderThan"),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", STREAM_TIMEOUT_SECONDS),
        ]
        if self.kind.label_selector:
            query.append(("labelSelector", self.kind.label_selector))
        if self.kind.field_selector:
            query.append(("fieldSelector", self.kind.field_selector))
        path = self.kind.path.replace("{namespace}", self.kind.namespace or "")
        request = self.api.param_serialize(
            method="GET",
            resource_path=path,
            query_params=query,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(*request, _request_timeout=(10, self.watch_timeout + 30))
        if not 200 <= response.status <= 299:
            response.read()  # type: ignore[no-untyped-call]
            raise ApiException(status=response.status, reason=response.reason, http_resp=response)
        return response.response

    def fetch(self, field_selector: str) -> list[T]:
        """The objects of this kind that ``field_selector`` also selects, listed now (all
        pages) and slimmed like the copy's, but not kept: a read of a few objects while
        the copy is still listing (one node's Pods). Raises what the list raises."""
        kept: list[T] = []
        token: str | None = None
        if self.kind.field_selector:
            field_selector = f"{self.kind.field_selector},{field_selector}"
        while True:
            page = self._get(limit=self.page_size, _continue=token, field_selector=field_selector)
            kept.extend(
                k for body in page.get("items") or [] if (k := self._slim(body)) is not None
            )
            token = (page.get("metadata") or {}).get("continue") or None
            if not token:
                return kept

    def watch_once(self, stop: threading.Event) -> None:
        """One watch from the current resourceVersion until the server ends it."""
        self.stats.watches += 1
        response = self._call(
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=self.resource_version,
            timeout_seconds=self.watch_timeout,
            _preload_content=False,
            _request_timeout=(10, self.watch_timeout + 30),
        )
        self._response = response
        try:
            for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
                if stop.is_set():
                    return
                if line:
                    self._event(parse(line))
        finally:
            self._response = None
            response.release_conn()

    # Internals ----------------------------------------------------------------

    def _call(self, **kwargs: Any) -> Any:
        if self.kind.namespace:
            kwargs["namespace"] = self.kind.namespace
        if self.kind.label_selector:
            kwargs["label_selector"] = self.kind.label_selector
        if self.kind.field_selector:
            kwargs.setdefault("field_selector", self.kind.field_selector)
        try:
            return getattr(self._client, self.kind.lister)(*self.kind.args, **kwargs)
        except ApiException as exc:
            if exc.status == 410:
                raise Gone() from exc
            raise

    def _get(self, **kwargs: Any) -> dict[str, Any]:
        page: dict[str, Any] = parse(self._get_raw(**kwargs))
        return page

    def _get_raw(self, **kwargs: Any) -> bytes:
        """One list page as the server sent it (JSON bytes)."""
        response = self._call(_preload_content=False, _request_timeout=(10, 120), **kwargs)
        try:
            if response.status == 410:
                raise Gone()
            if response.status >= 400:
                raise ApiException(status=response.status, reason=response.reason)
            raw: bytes = response.data
            return raw
        finally:
            response.release_conn()

    def _event(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        body = event.get("object") or {}
        meta = body.get("metadata") or {}
        if kind == "ERROR":
            if body.get("code") == 410:
                raise Gone()
            raise ApiException(status=body.get("code"), reason=str(body.get("message", "")))
        version = str(meta.get("resourceVersion") or "")
        if kind == "BOOKMARK":
            self.stats.bookmarks += 1
            if version:
                self.resource_version = version
            return
        self.stats.events += 1
        key = object_key(body)
        if kind == "DELETED":
            self.stats.unreadable.pop(key, None)
        new = None if kind == "DELETED" else self._slim(body)
        with self._lock:
            old = self._put(key, new)
        if version:
            self.resource_version = version
        if (old is not None or new is not None) and old != new and self.on_change is not None:
            self.on_change([Change(key, old, new)])

    def _slim(self, body: Mapping[str, Any]) -> T | None:
        """``slim(body)``, or None (the object left out, named in the stats and the log)
        when it raises: a body an older or newer release wrote that this one cannot
        read."""
        key = object_key(body)
        try:
            kept = self.slim(body)
        except Exception as exc:
            error = repr(exc)[:300]
            if self.stats.unreadable.get(key) != error:
                log.warning("unreadable object skipped", kind=self.kind.name, key=key, error=error)
            self.stats.unreadable[key] = error
            return None
        self.stats.unreadable.pop(key, None)
        return kept

    def _put(self, key: str, new: T | None) -> T | None:
        """Store (or drop) one object and keep its groups right; caller holds the lock."""
        old = self._items.pop(key, None)
        if old is not None:
            for name in self.groups(old):
                members = self._groups.get(name)
                if members is not None:
                    members.pop(key, None)
                    if not members:
                        del self._groups[name]
        if new is not None:
            self._items[key] = new
            for name in self.groups(new):
                self._groups.setdefault(name, {})[key] = new
        return old

    def _replace(self, fresh: dict[str, T]) -> list[Change[T]]:
        changes: list[Change[T]] = []
        with self._lock:
            for key in [k for k in self._items if k not in fresh]:
                changes.append(Change(key, self._put(key, None), None))
            for key, new in fresh.items():
                old = self._put(key, new)
                if old != new:
                    changes.append(Change(key, old, new))
        return changes
