"""A multi-rank training run with a fault on one rank, through to quarantine.

Three gloo ranks (spawned processes standing in for the Pods of a training Job,
each bound to its own node) train with the guard; rank 1's GPU computes its
forward pass wrongly. The guard's audit names rank 1, rank 0 reports it with
the job's own ServiceAccount token, the operator marks rank 1's node Suspect,
the probe (the test's kubelet) finds SDC, and the node is quarantined; the
other nodes stay in service.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from bench.training.harness import Trial, run_trials
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.cluster.localcluster import LocalCluster
from tests.operator.harness import (
    ProbeKubelet,
    create_policy,
    gpu_nodes,
    new_case,
    node_state,
    trusted_baseline,
    wait_for,
)
from tests.reports.test_reports_operator import (
    _job_namespace,
    _phase,
    _report,
    _token,
    _training_pod,
)


def test_a_fault_on_one_rank_quarantines_its_node(
    api_client: client.ApiClient,
    operator: Any,
    cluster: LocalCluster,
    served: None,
    tmp_path: Path,
) -> None:
    case = new_case()
    nodes = [f"train-{case}-{r}" for r in range(3)]
    ns, job = f"job-{case}", f"llm-{case}"
    trusted_baseline(api_client)
    outcomes = dict.fromkeys(nodes, "pass")
    with gpu_nodes(api_client, nodes, case=case), ProbeKubelet(api_client, outcomes):
        create_policy(api_client, case)
        for n in nodes:
            wait_for(lambda n=n: node_state(api_client, n) == "Qualified", 90, f"{n} qualified")
        _job_namespace(api_client, ns)
        try:
            for rank, node in enumerate(nodes):
                _training_pod(api_client, ns, f"{job}-{rank}", node, job)
            token = _token(api_client, ns, tmp_path / "token")
            outcomes[nodes[1]] = "sdc"  # what the probe will find on the faulty GPU's node
            env = {
                rank: {
                    "NODE_NAME": node,
                    "POD_NAME": f"{job}-{rank}",
                    "POD_NAMESPACE": ns,
                    "JOB_NAME": job,
                    "SDCGUARD_GPU_UUID": f"GPU-{case}-{rank}",
                    "SDCGUARD_API_SERVER": cluster.server,
                    "SDCGUARD_TOKEN_FILE": str(token),
                    "SDCGUARD_CA_FILE": str(cluster.ca_file),
                }
                for rank, node in enumerate(nodes)
            }
            fault = {"site": "matmul", "rate": 0.01, "onset_step": 2, "seed": 3}
            trial = Trial(
                "e2e",
                steps=12,
                fault=fault,
                report=True,
                env=env,
                config={"audit_every": 1, "consensus_every": 4},
            )
            (ranks,) = run_trials([trial], world=3)
            found = ranks[0]["detections"]
            assert found and found[0]["rank"] == 1 and found[0]["node"] == nodes[1]
            assert ranks[0]["stop_step"] == found[0]["step"]  # persistent: the job stops

            reports = client.CustomObjectsApi(api_client).list_namespaced_custom_object(
                "sdcguard.dev", "v1alpha1", ns, "sdcreports"
            )["items"]
            assert len(reports) == 1
            name = reports[0]["metadata"]["name"]
            spec = reports[0]["spec"]
            assert (spec["nodeName"], spec["podName"], spec["gpuUUID"]) == (
                nodes[1],
                f"{job}-1",
                f"GPU-{case}-1",
            )
            assert (spec["method"], spec["confirmation"]) == ("ShadowAudit", "Persistent")
            wait_for(lambda: _phase(api_client, ns, name) == "Accepted", 30, "acceptance")
            assert _report(api_client, ns, name)["status"]["reason"] == "Accepted"
            wait_for(lambda: node_state(api_client, nodes[1]) == "Quarantined", 120, "quarantine")
            assert [node_state(api_client, n) for n in (nodes[0], nodes[2])] == [
                "Qualified",
                "Qualified",
            ]
        finally:
            with contextlib.suppress(ApiException):
                client.CoreV1Api(api_client).delete_namespace(ns)
