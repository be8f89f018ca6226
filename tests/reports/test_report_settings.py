"""The report caps are operator settings: an operator started with
``SDCGUARD_REPORT_PER_JOB=1`` refuses a Job's second report, naming that limit."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sdcdev.cluster.localcluster import LocalCluster
from sdcdev.harness import OperatorProcess, delete_all, gpu_nodes, new_case, wait_for
from sdctrain.report import KubeReporter
from tests.reports.test_reports_operator import (
    _detection,
    _job_namespace,
    _phase,
    _report,
    _token,
    _training_pod,
)


@pytest.fixture(scope="module")
def operator(
    cluster: LocalCluster,
    crds: None,
    api_client: client.ApiClient,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    """This module's operator, with one report per Job an hour."""
    log = Path(tmp_path_factory.mktemp("operator")) / "operator.log"
    proc = OperatorProcess(cluster.kubeconfig, log, env={"SDCGUARD_REPORT_PER_JOB": "1"}).start()
    try:
        yield proc
    finally:
        proc.stop()
        delete_all(api_client)


def test_a_jobs_second_report_meets_the_configured_cap(
    api_client: client.ApiClient,
    operator: Any,
    cluster: LocalCluster,
    served: None,
    tmp_path: Path,
) -> None:
    case = new_case()
    node, ns, job = f"cap-{case}", f"cap-{case}", f"train-{case}"
    with gpu_nodes(api_client, [node], case=case):
        _job_namespace(api_client, ns)
        try:
            _training_pod(api_client, ns, "train-1", node, job)
            reporter = KubeReporter(
                cluster.server, _token(api_client, ns, tmp_path / "token"), cluster.ca_file
            )
            first = reporter.report(_detection(node, ns, job, step=5))
            assert first is not None
            wait_for(lambda: _phase(api_client, ns, first) == "Accepted", 30, "acceptance")
            second = reporter.report(_detection(node, ns, job, step=9))
            assert second is not None
            wait_for(lambda: _phase(api_client, ns, second) == "Refused", 30, "the refusal")
            status = _report(api_client, ns, second)["status"]
            assert status["reason"] == "JobRateLimited"
            assert "(limit 1)" in status["message"]
        finally:
            with contextlib.suppress(ApiException):
                client.CoreV1Api(api_client).delete_namespace(ns)
