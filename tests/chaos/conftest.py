"""Fixtures for the chaos tests: the operator tests' CRDs on the session's control plane."""

from __future__ import annotations

from tests.operator.conftest import crds  # noqa: F401  (the session fixture, shared)
