"""A create refused with 409 is "already there" only when the API server says so."""

from __future__ import annotations

import json

from kubernetes.client.exceptions import ApiException

from sdcguard.adapters.kube import already_exists


def _refusal(status: int, reason: str | None, body: str | None = "") -> ApiException:
    exc = ApiException(status=status, reason="Conflict")
    exc.body = (
        json.dumps({"kind": "Status", "status": "Failure", "reason": reason, "code": status})
        if body == ""
        else body
    )
    return exc


def test_a_name_taken_is_already_there() -> None:
    assert already_exists(_refusal(409, "AlreadyExists"))


def test_any_other_conflict_created_nothing() -> None:
    """A proxy's or a webhook's 409 (reason Conflict), a 409 without a readable Status,
    or another code: nothing was created, so the next pass must try again."""
    assert not already_exists(_refusal(409, "Conflict"))
    assert not already_exists(_refusal(409, None, body=None))
    assert not already_exists(_refusal(409, None, body="<html>bad gateway</html>"))
    assert not already_exists(_refusal(500, "AlreadyExists"))
