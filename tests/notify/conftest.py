"""The scripted HTTP receiver of test_notify, shared with the other ticket-sink tests,
and the unit-test network guard narrowed to it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import urllib3.connectionpool

from tests.notify.test_notify import receiver

__all__ = ["receiver"]

LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


@pytest.fixture(autouse=True)
def _no_api_calls_in_unit_tests() -> Iterator[None]:
    """The suite's guard (tests/conftest.py) refuses every urllib3 request; the ticket
    sinks send through urllib3 to receivers these tests start on loopback. Those go
    through; any other host is still refused."""
    pool = urllib3.connectionpool.HTTPConnectionPool
    send = pool.urlopen

    def loopback_only(self: urllib3.connectionpool.HTTPConnectionPool, *a: Any, **kw: Any) -> Any:
        if self.host not in LOOPBACK:
            raise AssertionError(
                f"unit test tried to reach {self.host}; ticket-sink tests use the loopback "
                "receiver fixture"
            )
        return send(self, *a, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pool, "urlopen", loopback_only)
        yield
