"""One operator process for the operator tests, against the session's control plane."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from sdcdev.cluster.localcluster import LocalCluster
from sdcdev.harness import OperatorProcess, delete_all


@pytest.fixture(scope="module")
def operator(
    cluster: LocalCluster,
    crds: None,
    api_client: client.ApiClient,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    log = Path(tmp_path_factory.mktemp("operator")) / "operator.log"
    proc = OperatorProcess(cluster.kubeconfig, log).start()
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
