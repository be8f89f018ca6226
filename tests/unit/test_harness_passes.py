"""The harness's proof of absence: waiting on the operator's own pass counter
(``sdcguard_reconcile_passes_total``) instead of sleeping. A stalled operator must fail
the wait, and a pass of another policy or kind must not count."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from sdcdev.harness import reconcile_passes, wait_passes
from sdcguard.metrics import Metrics


class _Operator:
    """An operator's /metrics, served from a real Metrics registry the test advances."""

    def __init__(self) -> None:
        self.metrics = Metrics(CollectorRegistry())
        registry = self.metrics.registry

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = generate_latest(registry)
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def pass_(self, policy: str, kind: str = "full") -> None:
        self.metrics.reconcile_passes.labels(policy=policy, kind=kind).inc()


@pytest.fixture
def op() -> Iterator[_Operator]:
    served = _Operator()
    yield served
    served.server.shutdown()
    served.server.server_close()


def test_passes_are_read_per_policy_and_kind(op: _Operator) -> None:
    assert reconcile_passes(op.url, "a") == 0
    op.pass_("a")
    op.pass_("a", "targeted")
    op.pass_("b")
    assert reconcile_passes(op.url, "a") == 1
    assert reconcile_passes(op.url, "a", "targeted") == 1
    assert reconcile_passes(op.url, "c") == 0


def test_no_answer_is_none() -> None:
    assert reconcile_passes("http://127.0.0.1:9/metrics", "a") is None


def test_the_wait_returns_once_enough_passes_of_the_policy_are_done(op: _Operator) -> None:
    op.pass_("a")

    def passes() -> None:
        for _ in range(2):
            op.pass_("b")  # another policy's passes do not count
            op.pass_("a", "urgent")  # nor do passes of another kind
        op.pass_("a")
        op.pass_("a")

    timer = threading.Timer(0.5, passes)
    timer.start()
    try:
        assert wait_passes(op.url, "a", 2, timeout=20) == 3
    finally:
        timer.cancel()


def test_a_stalled_operator_fails_the_wait(op: _Operator) -> None:
    op.pass_("a")
    op.pass_("b")
    threading.Timer(0.2, op.pass_, ("a",)).start()  # one pass, then nothing
    with pytest.raises(AssertionError, match="has the operator stalled"):
        wait_passes(op.url, "a", 2, timeout=2)


def test_a_page_read_another_way_counts_the_same() -> None:
    """An operator reached through the API server's Pod proxy: the harness takes a
    function that returns the page (None while it does not answer)."""
    metrics = Metrics(CollectorRegistry())
    answers: list[str | None] = [None]

    def page() -> str | None:
        return answers[-1]

    assert reconcile_passes(page, "a") is None
    answers.append(generate_latest(metrics.registry).decode())
    assert reconcile_passes(page, "a") == 0

    def passes() -> None:
        for _ in range(2):
            metrics.reconcile_passes.labels(policy="a", kind="full").inc()
            answers.append(generate_latest(metrics.registry).decode())

    timer = threading.Timer(0.3, passes)
    timer.start()
    try:
        assert wait_passes(page, "a", 2, timeout=20) == 2
    finally:
        timer.cancel()
