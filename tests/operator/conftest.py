"""One operator process for the operator tests, against the session's control plane."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from sdcdev.cluster.localcluster import LocalCluster
from sdcdev.harness import OperatorProcess, delete_all

RESYNC_SECONDS = 2
"""The shared test operator's resync period (the harness's default is longer)."""


@pytest.fixture(scope="module")
def operator(
    cluster: LocalCluster,
    crds: None,
    api_client: client.ApiClient,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    log = Path(tmp_path_factory.mktemp("operator")) / "operator.log"
    # Full passes every RESYNC_SECONDS: a test that proves nothing happened waits for
    # the operator's passes (OperatorProcess.wait_passes), so they come often.
    env = {"SDCGUARD_RESYNC_SECONDS": str(RESYNC_SECONDS)}
    proc = OperatorProcess(cluster.kubeconfig, log, env=env).start()
    try:
        yield proc
    finally:
        proc.stop()
        delete_all(api_client)


@pytest.fixture(autouse=True)
def _show_operator_log(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed and "operator" in request.fixturenames:
        proc = request.getfixturevalue("operator")
        print("---- operator log (tail) ----\n" + proc.log_tail(80))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, f"rep_{report.when}", report)
