"""The end-to-end tests' check for RBAC refusals in an operator log: a refusal is found
in every form the client libraries write it, and a number that only contains 403 (a
probe's count of corruptions) is not one."""

from __future__ import annotations

from tests.e2e.helpers import refusals


def test_refusals_are_found_and_numbers_that_contain_403_are_not() -> None:
    refused = [
        "(403)\nReason: Forbidden",
        'APIForbiddenError("pods is forbidden")',
        "Not enough permissions to watch for resources",
        "HTTP 403 from the API server",
        "status=403,",
    ]
    fine = [
        "SDC in compute (detection on: 403383 corruptions)",
        "resourceVersion 1403",
        "took 0.403 s",
    ]
    assert refusals(refused + fine) == refused
