"""The probe RuntimeClass check: a class the API server says does not exist makes
nodes wait unreserved; any other failure to read blocks nothing; answers are kept."""

from __future__ import annotations

import datetime as dt
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sdcguard.adapters.runtime_class import RECHECK, RuntimeClasses
from tests.unit.factories import NOW


class _NodeApi:
    def __init__(self, answer: Exception | None) -> None:
        self.answer = answer
        self.reads = 0

    def read_runtime_class(self, name: str) -> Any:
        self.reads += 1
        if self.answer is not None:
            raise self.answer
        return {"metadata": {"name": name}, "handler": "nvidia"}


def _classes(answer: Exception | None) -> tuple[RuntimeClasses, _NodeApi]:
    classes = RuntimeClasses(client.ApiClient())
    api = _NodeApi(answer)
    classes._node = api  # type: ignore[assignment]
    return classes, api


def test_a_class_that_does_not_exist_is_missing_and_asked_once_a_minute() -> None:
    classes, api = _classes(ApiException(status=404, reason="Not Found"))
    assert classes.missing("nvidia", NOW)
    assert classes.missing("nvidia", NOW + dt.timedelta(seconds=30))
    assert api.reads == 1
    api.answer = None  # someone created it
    assert not classes.missing("nvidia", NOW + RECHECK)
    assert api.reads == 2


def test_no_class_named_is_never_read() -> None:
    classes, api = _classes(None)
    assert not classes.missing(None, NOW) and not classes.missing("", NOW)
    assert api.reads == 0


def test_a_read_that_fails_otherwise_blocks_nothing() -> None:
    classes, _ = _classes(ApiException(status=403, reason="Forbidden"))
    assert not classes.missing("nvidia", NOW)
    classes, _ = _classes(OSError("connection refused"))
    assert not classes.missing("nvidia", NOW)
