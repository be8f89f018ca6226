"""Where the operator's log lines go."""

from __future__ import annotations

import io
import logging
import sys
import threading
from collections.abc import Iterator

import pytest
import structlog

from sdcguard.logs import configure_logging


@pytest.fixture
def root_logging() -> Iterator[None]:
    """Restore the root logger and structlog after a test that configures them."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    config = structlog.get_config()
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.configure(**config)


def test_a_record_goes_to_the_stderr_of_its_moment_not_to_a_closed_one(
    root_logging: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    configure_logging("json", "info")
    structlog.get_logger("t").info("before", n=1)
    assert '"event": "before"' in first.getvalue()
    # The stream logging was configured with is closed and replaced, as a test
    # framework's capture is between tests; a thread that logs later must not fail.
    first.close()
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    errors: list[BaseException] = []
    monkeypatch.setattr(
        logging.Handler, "handleError", lambda self, record: errors.append(sys.exc_info()[1])
    )

    def later() -> None:
        structlog.get_logger("t").warning("from a thread", n=2)
        logging.getLogger("kopf.x").error("stdlib too")

    thread = threading.Thread(target=later)
    thread.start()
    thread.join()
    assert errors == []
    lines = second.getvalue().splitlines()
    assert len(lines) == 2
    assert '"event": "from a thread"' in lines[0] and '"n": 2' in lines[0]
    assert "stdlib too" in lines[1]


@pytest.mark.parametrize(("level", "shown"), [("info", False), ("debug", True)])
def test_health_checks_are_logged_at_debug(
    root_logging: None, monkeypatch: pytest.MonkeyPatch, level: str, shown: bool
) -> None:
    """Kopf's liveness endpoint answers through aiohttp, whose access log writes each
    probe at INFO; they are debug lines, shown only at level debug."""
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    configure_logging("json", level)
    logging.getLogger("aiohttp.access").info('127.0.0.1 "GET /healthz HTTP/1.1" 200 2')
    structlog.get_logger("t").info("reconciled")
    assert ("/healthz" in out.getvalue()) is shown
    assert '"event": "reconciled"' in out.getvalue()
    if shown:
        assert '"level": "debug"' in out.getvalue()
