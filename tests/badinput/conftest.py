"""Fixtures for the bad-input tests: the operator tests' operator process and hook."""

from __future__ import annotations

from tests.operator.conftest import (  # noqa: F401  (fixtures and hook, shared)
    _show_operator_log,
    operator,
    pytest_runtest_makereport,
)
