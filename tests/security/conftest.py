"""Attack tests for the trust model in docs/security.md, one file per actor. Unit-level
tests here may reach the scripted loopback receivers of tests/notify (and nothing
else); the others use the real local control plane (the ``cluster`` fixture)."""

from __future__ import annotations

from tests.notify.conftest import _no_api_calls_in_unit_tests, receiver

__all__ = ["_no_api_calls_in_unit_tests", "receiver"]
