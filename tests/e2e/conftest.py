"""End-to-end runs of the simulated fleet with the real operator, on the session's control
plane. Each run installs the chart's CRDs and RBAC under its own release and namespace,
runs the operator as the chart's ServiceAccount, and removes everything it created."""

from __future__ import annotations

import uuid

import pytest

from tests.e2e.helpers import RunNames


@pytest.fixture
def names() -> RunNames:
    suffix = uuid.uuid4().hex[:5]
    return RunNames(
        release=f"sdcguard-e2e-{suffix}",
        namespace=f"sdcguard-e2e-{suffix}",
        policy=f"e2e-{suffix}",
    )
