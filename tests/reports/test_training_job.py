"""A training Job on the cluster with a fault on one rank, through to quarantine.

An Indexed batch/v1 Job of three Pods, each asking for a node's 8 GPUs, is created
in the job owner's namespace; the real scheduler places one Pod on each simulated
GPU node, and the simulated kubelet runs each Pod's own command
(``python -m bench.training.job``) as a process, with the Pod's environment
(downward API, the Job controller's completion index), its GPUs' UUIDs and a token
of the Pod's ServiceAccount bound to that Pod. The three ranks train with the guard
over gloo; the rank of completion index 1 computes its forward pass wrongly. The
guard's audit names it, rank 0 reports it with the Job's own token, the operator
checks that the Pod runs on that node and belongs to that Job, marks the node
Suspect, and the real probe (``python -m sdcprobe``, run by the simulated kubelet
on the CPU with the node's fault profile, as it runs every probe Pod of the
simulated fleet) finds SDC in the suspicion screening and again in its
confirmation re-run; the node is quarantined, and the owner sees Events on the
report in the Job's namespace. The three nodes' baseline is their own consensus
from their acceptance runs; the fault on the reported node (exponent flips in its
device 1's GEMMs) is switched on once the scheduler has placed the ranks, as a GPU
that degrades in use would be. Each verdict is the probe's result from the Pod's
termination message.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from bench.training.harness import Trial, free_port
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sdcdev.harness import (
    REPO,
    create_policy,
    gpu_fleet,
    gpu_nodes,
    list_custom,
    new_case,
    node_state,
    wait_for,
)
from sdcdev.sim.commands import RUN_COMMAND_ANNOTATION, gpu_uuids
from sdcdev.sim.fleet import FaultProfile
from sdcdev.sim.kube import Kube
from sdcdev.sim.kubelet import SimKubelet
from sdcdev.sim.state import FleetState
from sdcdev.sim.timers import Timers
from tests.reports.test_reports_operator import _job_namespace, _phase, _report, report_events

JOB_LABEL = "batch.kubernetes.io/job-name"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"


def _field(path: str) -> client.V1EnvVarSource:
    return client.V1EnvVarSource(field_ref=client.V1ObjectFieldSelector(field_path=path))


def _training_job(name: str, case: str, world: int, trial: Trial) -> client.V1Job:
    """An Indexed Job, one Pod per rank, each Pod on a node of its own (8 GPUs)."""
    env = [
        client.V1EnvVar(name="NODE_NAME", value_from=_field("spec.nodeName")),
        client.V1EnvVar(name="POD_NAME", value_from=_field("metadata.name")),
        client.V1EnvVar(name="POD_NAMESPACE", value_from=_field("metadata.namespace")),
        client.V1EnvVar(name="JOB_NAME", value_from=_field(f"metadata.labels['{JOB_LABEL}']")),
        client.V1EnvVar(name="WORLD_SIZE", value=str(world)),
        client.V1EnvVar(name="MASTER_ADDR", value="127.0.0.1"),
        client.V1EnvVar(name="MASTER_PORT", value=str(free_port())),
        client.V1EnvVar(name="SDCTRAIN_TRIAL", value=json.dumps(asdict(trial))),
    ]
    container = client.V1Container(
        name="train",
        image="example.invalid/train:1",
        command=["python", "-m", "bench.training.job"],
        env=env,
        resources=client.V1ResourceRequirements(limits={"nvidia.com/gpu": "8"}),
    )
    return client.V1Job(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1JobSpec(
            completion_mode="Indexed",
            completions=world,
            parallelism=world,
            backoff_limit=0,
            active_deadline_seconds=300,
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(annotations={RUN_COMMAND_ANNOTATION: "true"}),
                spec=client.V1PodSpec(
                    restart_policy="Never",
                    service_account_name="trainer",
                    node_selector={"sdcguard.test/case": case},
                    containers=[container],
                ),
            ),
        ),
    )


def _pods_by_index(api: client.ApiClient, ns: str, job: str) -> dict[int, client.V1Pod]:
    pods = client.CoreV1Api(api).list_namespaced_pod(ns, label_selector=f"{JOB_LABEL}={job}")
    return {int(p.metadata.annotations[INDEX_ANNOTATION]): p for p in pods.items}


# Six real probe runs and a training Job: past the default 600 s on a slow, loaded machine.
@pytest.mark.timeout(900)
def test_a_fault_on_one_rank_of_a_job_quarantines_its_node(
    api_client: client.ApiClient,
    operator: Any,
    served: None,
    tmp_path: Path,
) -> None:
    case = new_case()
    nodes = [f"train-{case}-{r}" for r in range(3)]
    ns, job = f"job-{case}", f"llm-{case}"
    fleet = gpu_fleet(nodes, case=case)
    state = FleetState(fleet, 2)
    timers = Timers()
    base_env = dict(os.environ)
    base_env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), str(REPO / "operator"), str(REPO / "jobs"), base_env.get("PYTHONPATH", "")]
    )
    # Probe Pods run the real probe, the Job's Pods their own command, both as processes.
    kubelet = SimKubelet(
        Kube(api_client),
        state,
        timers,
        max_parallel=2,
        workdir=tmp_path / "pods",
        base_env=base_env,
    )
    with gpu_nodes(api_client, nodes, case=case):
        timers.start()
        kubelet.start()
        create_policy(
            api_client,
            case,
            # GEMMs and collectives: the fault (exponent flips in one device's GEMMs)
            # shows in both; 10 s leaves each check rounds on a loaded machine.
            probe={"budgetSeconds": 10},
            suites={
                suite: [{"name": "compute"}, {"name": "collective"}]
                for suite in ("acceptance", "requalification", "repairVerification")
            },
        )
        for n in nodes:
            wait_for(lambda n=n: node_state(api_client, n) == "Qualified", 240, f"{n} qualified")
        _job_namespace(api_client, ns)
        try:
            trial = Trial(
                "job",
                steps=12,
                fault={"site": "matmul", "rate": 0.01, "onset_step": 2, "seed": 3},
                report=True,
                config={"audit_every": 1, "consensus_every": 4},
            )
            client.BatchV1Api(api_client).create_namespaced_job(
                ns, _training_job(job, case, 3, trial)
            )
            wait_for(
                lambda: (
                    len(_pods_by_index(api_client, ns, job)) == 3
                    and all(p.spec.node_name for p in _pods_by_index(api_client, ns, job).values())
                ),
                60,
                "the scheduler to place the Job's Pods",
            )
            pods = _pods_by_index(api_client, ns, job)
            placed = {i: p.spec.node_name for i, p in pods.items()}
            assert sorted(placed.values()) == sorted(nodes), placed  # one rank per node
            faulty_node, faulty_pod = placed[1], pods[1].metadata.name
            # What the probe will find on that GPU's node: its device 1 computes wrongly.
            state.set_fault_profile(
                faulty_node,
                FaultProfile(faults=[{"site": "matmul", "rate": 0.01, "bits": "exp", "device": 1}]),
            )

            def reports() -> list[dict[str, Any]]:
                return client.CustomObjectsApi(api_client).list_namespaced_custom_object(
                    "sdcguard.dev", "v1alpha1", ns, "sdcreports"
                )["items"]

            wait_for(lambda: len(reports()) >= 1, 180, "the Job's report")
            (made,) = reports()
            name, spec = made["metadata"]["name"], made["spec"]
            assert (spec["nodeName"], spec["podName"], spec["jobName"]) == (
                faulty_node,
                faulty_pod,
                job,
            )
            # The device plugin's UUID of the rank's first GPU, as the simulated kubelet
            # handed it to that Pod.
            assert spec["gpuUUID"] == gpu_uuids(faulty_node, 1)[0]
            assert (spec["method"], spec["confirmation"]) == ("ShadowAudit", "Persistent")
            assert spec["rank"] == 1

            # The ranks stop at the detection (persistent fault): the Job completes.
            wait_for(
                lambda: (
                    (
                        client.BatchV1Api(api_client).read_namespaced_job_status(job, ns).status
                    ).succeeded
                    == 3
                ),
                120,
                "the Job to complete",
            )
            wait_for(lambda: _phase(api_client, ns, name) == "Accepted", 30, "acceptance")
            assert _report(api_client, ns, name)["status"]["reason"] == "Accepted"
            # Two real probe runs, a suspicion screening and its confirmation: 85 s on one
            # CI machine, more than 180 s on a slower one loaded by the other groups.
            wait_for(
                lambda: node_state(api_client, faulty_node) == "Quarantined", 480, "quarantine"
            )
            # Both verdicts are the real probe's: the suspicion screening and its
            # confirmation re-run found SDC with fault injection on (the probe says so in
            # its result), after a consensus baseline of the three nodes' own runs.
            tests = sorted(
                list_custom(api_client, "sdctests", faulty_node),
                key=lambda t: t["metadata"]["creationTimestamp"],
            )
            judged = [(t["spec"]["reason"], (t.get("status") or {}).get("verdict")) for t in tests]
            assert judged[-2:] == [("Suspect", "SDC"), ("Confirmation", "SDC")], judged
            for test in tests[-2:]:
                assert "fault injection on" in test["status"]["message"], test["status"]
                assert any(c["verdict"] == "SDC" for c in test["status"]["checks"]), test
            last = state.snapshot().node(faulty_node).last_probe
            assert last is not None and last.outcome == "sdc" and last.faults_injected, last
            baselines = list_custom(api_client, "sdcbaselines")
            assert any(
                b["spec"].get("trusted") and b["spec"].get("source") == "Consensus"
                for b in baselines
            ), [b["spec"] for b in baselines]
            wait_for(
                lambda: "SDCReportConfirmed" in report_events(api_client, ns, name),
                30,
                "the owner's Event",
            )
            told = report_events(api_client, ns, name)
            assert f"node {faulty_node} marked suspect" in told["SDCReportAccepted"]
            assert f"node {faulty_node} is Quarantined" in told["SDCReportConfirmed"]
            assert _report(api_client, ns, name)["status"]["outcome"] == "Confirmed"
            tickets = client.CustomObjectsApi(api_client).list_cluster_custom_object(
                "sdcguard.dev", "v1alpha1", "repairtickets"
            )["items"]
            (ticket,) = [t for t in tickets if t["spec"]["nodeName"] in nodes]
            assert ticket["spec"]["nodeName"] == faulty_node
            # The report is the ticket's first evidence, before the probe's failed tests.
            assert ticket["spec"]["evidence"][0] == f"SDCReport {ns}/{name}"
            assert len(ticket["spec"]["evidence"]) >= 2
            for other in set(nodes) - {faulty_node}:
                assert node_state(api_client, other) in ("Qualified", "Testing"), other
            # The reporting rank's only credential: its Pod's own ServiceAccount token.
            reporter = pods[0]
            token = (
                tmp_path
                / "pods"
                / f"{ns}_{reporter.metadata.name}_{reporter.metadata.uid[:8]}"
                / "serviceaccount"
                / "token"
            ).read_text()
            review = client.AuthenticationV1Api(api_client).create_token_review(
                client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token))
            )
            assert review.status.authenticated
            assert review.status.user.username == f"system:serviceaccount:{ns}:trainer"
            extra = review.status.user.extra or {}
            assert extra.get("authentication.kubernetes.io/pod-name") == [reporter.metadata.name]
        finally:
            kubelet.stop()
            timers.stop()
            with contextlib.suppress(ApiException):
                client.CoreV1Api(api_client).delete_namespace(ns)
