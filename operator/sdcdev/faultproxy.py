"""A fault-injecting HTTP proxy between the operator and the API server.

The operator's kubeconfig points at ``http://127.0.0.1:<port>``; the proxy forwards
each request to the real (https) API server, passing the client's bearer token
through (or adding the one it was given), and injects faults at configured rates:

- *drop*: the connection is closed before the request is forwarded;
- *500* / *429* (with ``Retry-After``) / *409* (writes only): answered by the proxy
  with a Kubernetes ``Status``, the request never reaches the server;
- *lost response* (writes only): forwarded and applied, then the connection is
  closed before the answer, the nastiest case for idempotency;
- *delay*: forwarded after a pause;
- watch streams are passed through chunk by chunk, and *cut* after a while at a
  rate, as an API server restart or a load balancer would; a streaming list (a watch
  with ``sendInitialEvents``) is a list's read too, dropped or answered 500 and 429
  like a list page;
- *gone* (reads only): a watch answered with the ``ERROR`` event of code 410 that an
  API server sends when the resourceVersion is too old, and a paginated list's
  ``continue`` page answered 410 Expired, as when the token has expired.

Decisions come from one ``random.Random(seed)``; with real time and concurrency the
order of requests varies between runs, so the seed fixes the rates and the draws,
not the interleaving.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import ssl
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web

HOP_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade"}
)
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


@dataclass
class FaultRates:
    """Per-request probabilities (each draw is independent)."""

    drop: float = 0.03
    error_500: float = 0.04
    error_429: float = 0.03
    conflict_409: float = 0.04
    lost_response: float = 0.03
    delay: float = 0.10
    max_delay_s: float = 1.5
    cut_watch: float = 0.15
    max_watch_s: float = 15.0
    gone: float = 0.0

    @classmethod
    def off(cls) -> FaultRates:
        return cls(0, 0, 0, 0, 0, 0, 0, 0, 0)


@dataclass
class FaultProxy:
    """``with FaultProxy(upstream, ca, token, seed) as proxy:`` serves on ``proxy.url``."""

    upstream: str
    ca_file: Path
    token: str
    seed: int
    rates: FaultRates = field(default_factory=FaultRates)
    injected: Counter[str] = field(default_factory=Counter)
    refused: list[str] = field(default_factory=list)
    """Requests the API server itself refused (method, path, status, content type)."""
    port: int = 0
    hold: Callable[[str, Mapping[str, str]], bool] | None = None
    """Requests (path, query) held unanswered until :meth:`release`: a list that takes
    long, as a big fleet's Pods do."""
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runner: web.AppRunner | None = None
    _session: aiohttp.ClientSession | None = None

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self._ready = threading.Event()
        self._released = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> FaultProxy:
        self._thread = threading.Thread(target=self._serve, name="chaos-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(15):
            raise RuntimeError("the fault proxy did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None:
            done = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
            with contextlib.suppress(TimeoutError):
                done.result(timeout=30)
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=15)

    def release(self) -> None:
        """Answer the held requests, and hold none from now on."""
        self._released.set()

    def calm(self) -> None:
        """Stop injecting faults (requests still pass through)."""
        self.rates = FaultRates.off()

    # -- serving --------------------------------------------------------------

    def _serve(self) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        self._ready.set()
        self._loop.run_forever()
        pending = asyncio.all_tasks(self._loop)
        for task in pending:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self._loop.close()

    async def _start(self) -> None:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=ctx, limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            auto_decompress=False,
        )
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        # The bound address: port 0 asks the kernel for a free one.
        self.port = self._runner.addresses[0][1]

    async def _shutdown(self) -> None:
        # Upstream first: that ends the watch streams still being relayed.
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    def _draw(self, rate: float) -> bool:
        return rate > 0 and self.rng.random() < rate

    @staticmethod
    def _status(code: int, reason: str, message: str) -> web.Response:
        body = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f"chaos proxy: {message}",
            "reason": reason,
            "code": code,
        }
        headers = {"Retry-After": "1"} if code == 429 else {}
        return web.Response(
            status=code, text=json.dumps(body), content_type="application/json", headers=headers
        )

    @staticmethod
    def _gone_event(request: web.Request) -> web.Response:
        version = request.query.get("resourceVersion", "")
        event = {
            "type": "ERROR",
            "object": {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": f"chaos proxy: too old resource version: {version}",
                "reason": "Expired",
                "code": 410,
            },
        }
        return web.Response(
            status=200, text=json.dumps(event) + "\n", content_type="application/json"
        )

    def _drop(self, request: web.Request) -> web.Response:
        if request.transport is not None:
            request.transport.close()
        return web.Response(status=500)  # never sent: the connection is gone

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if self.hold is not None and self.hold(request.path, request.query):
            if not self._released.is_set():
                self.injected["held"] += 1
            while not self._released.is_set():
                await asyncio.sleep(0.05)
        rates = self.rates
        watch = request.query.get("watch") in ("1", "true") or "/watch/" in request.path
        # A streaming list is a watch request but a list's read: it is answered 429, 500
        # or dropped like a list page (and cut like a watch).
        streaming_list = watch and request.query.get("sendInitialEvents") == "true"
        write = request.method in WRITE_METHODS
        if watch and self._draw(rates.gone):
            self.injected["watch-gone"] += 1
            return self._gone_event(request)
        if not watch and request.query.get("continue") and self._draw(rates.gone):
            self.injected["continue-gone"] += 1
            return self._status(410, "Expired", "injected: the continue token has expired")
        if not watch or streaming_list:
            if self._draw(rates.drop):
                self.injected["drop"] += 1
                return self._drop(request)
            if self._draw(rates.error_500):
                self.injected["500"] += 1
                return self._status(500, "InternalError", "injected internal error")
            if self._draw(rates.error_429):
                self.injected["429"] += 1
                return self._status(429, "TooManyRequests", "injected throttling")
            if write and self._draw(rates.conflict_409):
                self.injected["409"] += 1
                return self._status(409, "Conflict", "injected conflict")
            if self._draw(rates.delay):
                self.injected["delay"] += 1
                await asyncio.sleep(self.rng.uniform(0.05, rates.max_delay_s))
        lose = write and self._draw(rates.lost_response)
        cut_after = (
            self.rng.uniform(1.0, rates.max_watch_s) if self._draw(rates.cut_watch) else None
        )
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        if "Authorization" not in headers:
            headers["Authorization"] = f"Bearer {self.token}"
        assert self._session is not None
        try:
            upstream = await self._session.request(
                request.method,
                self.upstream + request.path_qs,
                headers=headers,
                data=body or None,
                allow_redirects=False,
                # Forward the client's headers as they are: aiohttp would otherwise label
                # a body without a Content-Type as application/octet-stream (415).
                skip_auto_headers=("Content-Type", "User-Agent", "Accept-Encoding"),
            )
        except aiohttp.ClientError:
            return self._drop(request)
        async with upstream:
            out_headers = {
                k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS
            }
            if upstream.status >= 400 and len(self.refused) < 200:
                self.refused.append(
                    f"{request.method} {request.path} {upstream.status} "
                    f"{request.headers.get('Content-Type', '')}"
                )
            if not watch:
                payload = await upstream.read()
                if lose:
                    self.injected["lost-response"] += 1
                    return self._drop(request)
                return web.Response(status=upstream.status, body=payload, headers=out_headers)
            response = web.StreamResponse(status=upstream.status, headers=out_headers)
            try:
                await response.prepare(request)
            except ConnectionError:  # the client went away before the stream began
                return response
            loop = asyncio.get_running_loop()
            deadline = loop.time() + cut_after if cut_after is not None else None
            try:
                while True:
                    timeout = None if deadline is None else max(0.0, deadline - loop.time())
                    try:
                        chunk = await asyncio.wait_for(upstream.content.readany(), timeout)
                    except TimeoutError:
                        self.injected["watch-cut"] += 1
                        if request.transport is not None:
                            request.transport.close()
                        return response
                    if not chunk:
                        break
                    await response.write(chunk)
            except (ConnectionError, aiohttp.ClientError):
                return response
            await response.write_eof()
            return response
