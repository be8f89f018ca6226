"""Reports whose screening ended while the operator was down still reach the job's owner.

Two nodes are reported by a training job and taken for their suspicion screening; the
operator is SIGKILLed while both probes run; with no operator, one probe finds SDC and
the other passes (``reruns: 0``: that screening is the confirming one). A new operator
process starts against the same API server: it reads the probes' results, quarantines
one node and returns the other, and each report gets its outcome (Confirmed, Cleared)
in its status and an Event in the job's namespace, as if no restart had happened.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sdcdev.cluster.localcluster import LocalCluster
from sdcdev.harness import (
    OperatorProcess,
    ProbeKubelet,
    create_policy,
    delete_all,
    gpu_nodes,
    list_custom,
    new_case,
    node_state,
    trusted_baseline,
    wait_for,
)
from sdctrain.report import KubeReporter
from tests.reports.test_reports_operator import (
    _detection,
    _end_training_pod,
    _job_namespace,
    _phase,
    _report,
    _token,
    _training_pod,
    report_events,
)


@pytest.fixture
def operators(
    cluster: LocalCluster, crds: None, api_client: client.ApiClient, tmp_path: Path
) -> Iterator[list[OperatorProcess]]:
    """Operator processes this test starts (one at a time); all stopped at the end."""
    started: list[OperatorProcess] = []
    yield started
    for proc in started:
        proc.stop()
    for proc in started:
        print(f"---- operator log {proc.log_path.name} (tail) ----\n{proc.log_tail(40)}")
    delete_all(api_client)


def _probe_pod_running(api: client.ApiClient, node: str) -> bool:
    """The node's unfinished SDCTest of reason Suspect has its probe Pod on the node."""
    tests = [
        t
        for t in list_custom(api, "sdctests", node)
        if t["spec"].get("reason") == "Suspect"
        and not (t.get("status") or {}).get("completionTime")
    ]
    if not tests:
        return False
    pods = client.CoreV1Api(api).list_namespaced_pod(
        "sdcguard-system", label_selector=f"sdcguard.dev/test={tests[0]['metadata']['name']}"
    )
    return any(p.spec.node_name == node for p in pods.items)


def test_outcomes_reached_while_the_operator_was_down_reach_the_owner_after_a_restart(
    api_client: client.ApiClient,
    cluster: LocalCluster,
    served: None,
    operators: list[OperatorProcess],
    tmp_path: Path,
) -> None:
    case = new_case()
    sick, fine = f"rst-{case}", f"rst-ok-{case}"
    ns = f"rst-{case}"
    trusted_baseline(api_client)
    outcomes = {sick: "pass", fine: "pass"}
    # Both nodes of this two-node pool are reported at once: reports may hold all of it.
    env = {"SDCGUARD_REPORT_POOL_SHARE": "1"}
    first = OperatorProcess(cluster.kubeconfig, tmp_path / "operator-1.log", env=env).start()
    operators.append(first)
    with (
        gpu_nodes(api_client, [sick, fine], case=case),
        ProbeKubelet(api_client, outcomes) as kubelet,
    ):
        create_policy(api_client, case, confirmation={"reruns": 0})
        for n in (sick, fine):
            wait_for(lambda n=n: node_state(api_client, n) == "Qualified", 90, f"{n} qualified")
        _job_namespace(api_client, ns)
        try:
            reporter = KubeReporter(
                cluster.server, _token(api_client, ns, tmp_path / "token"), cluster.ca_file
            )
            # The probes of the suspicion screenings run until the operator is gone.
            outcomes[sick] = outcomes[fine] = "never"
            names: dict[str, str] = {}
            for node, job in ((sick, f"a-{case}"), (fine, f"b-{case}")):
                _training_pod(api_client, ns, f"train-{node}", node, job)
                made = reporter.report(
                    dataclasses.replace(_detection(node, ns, job, step=7), pod=f"train-{node}")
                )
                assert made is not None
                names[node] = made
            for node, name in names.items():
                wait_for(lambda name=name: _phase(api_client, ns, name) == "Accepted", 30, name)
                _end_training_pod(api_client, ns, f"train-{node}")
                wait_for(
                    lambda node=node: _probe_pod_running(api_client, node),
                    90,
                    f"{node}'s suspicion screening to run its probe",
                )
            first.kill()

            # No operator: one probe finds SDC, the other passes.
            done_before = len(kubelet.completed)
            outcomes[sick], outcomes[fine] = "sdc", "pass"
            wait_for(
                lambda: len(kubelet.completed) >= done_before + 2,
                30,
                "both probes to end while no operator runs",
            )
            for name in names.values():
                assert not (_report(api_client, ns, name)["status"]).get("outcome")

            second = OperatorProcess(
                cluster.kubeconfig, tmp_path / "operator-2.log", env=env
            ).start()
            operators.append(second)
            wait_for(lambda: node_state(api_client, sick) == "Quarantined", 90, "quarantine")
            wait_for(lambda: node_state(api_client, fine) == "Qualified", 90, "the release")
            for node, want in ((sick, "Confirmed"), (fine, "Cleared")):
                name = names[node]
                wait_for(
                    lambda name=name, want=want: (
                        f"SDCReport{want}" in report_events(api_client, ns, name)
                    ),
                    60,
                    f"the {want} Event on {name}",
                )
                status: dict[str, Any] = _report(api_client, ns, name)["status"]
                assert status["outcome"] == want and status["concludedAt"], status
                told = report_events(api_client, ns, name)
                assert f"node {node}" in told[f"SDCReport{want}"], told
                # One outcome each: the other never came.
                other = "Cleared" if want == "Confirmed" else "Confirmed"
                assert f"SDCReport{other}" not in told, told
        finally:
            with contextlib.suppress(ApiException):
                client.CoreV1Api(api_client).delete_namespace(ns)
