"""Fixtures for the bad-input tests: the operator tests' CRDs and operator process."""

from __future__ import annotations

from tests.operator.conftest import (  # noqa: F401  (fixtures and hook, shared)
    _show_operator_log,
    crds,
    operator,
    pytest_runtest_makereport,
)
