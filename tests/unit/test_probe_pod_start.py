"""A probe container the kubelet cannot start, or kills: read from the Pod status as the
kubelet writes it, judged Inconclusive with the kubelet's own reason, never Pass or SDC."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from kubernetes import client

from sdcguard.adapters import observe
from sdcguard.adapters.kube import KubeWriter
from sdcguard.adapters.observe import probe_pod
from sdcguard.adapters.pass_state import TestSnapshot
from sdcguard.adapters.reconciler import FleetView, Reconciler
from sdcguard.adapters.test_runner import TestRunner
from sdcguard.api import SDCTest, SDCTestPhase, Verdict
from sdcguard.domain.judging import PodEnd, judge_result
from sdcguard.metrics import Metrics
from sdcguard.settings import Settings
from tests.unit.factories import CHECKS, NOW

IMAGE = "localhost/sdcprobe:absent"
NEVER_PULL = f'Container image "{IMAGE}" is not present with pull policy of Never'


def pod(state: dict[str, Any], phase: str = "Pending") -> dict[str, Any]:
    """A probe Pod body as the kubelet reports it (one container, in ``state``)."""
    return {
        "metadata": {
            "name": "sdcprobe-t1-abcde",
            "labels": {"app.kubernetes.io/component": "sdcprobe", "sdcguard.dev/test": "t1"},
        },
        "spec": {"nodeName": "real-node-0"},
        "status": {
            "phase": phase,
            "startTime": "2026-12-01T13:00:00Z",
            "containerStatuses": [{"name": "sdcprobe", "state": state}],
        },
    }


def test_an_absent_image_ends_inconclusive_with_the_kubelets_reason_and_the_image() -> None:
    seen = probe_pod(pod({"waiting": {"reason": "ErrImageNeverPull", "message": NEVER_PULL}}))
    assert seen is not None
    assert seen.start_failure == f"ErrImageNeverPull: {NEVER_PULL}"
    j = judge_result(PodEnd(None, None, never_started=True, detail=seen.start_failure), CHECKS, {})
    assert (j.verdict, j.reason, j.phase) == (
        Verdict.INCONCLUSIVE,
        "ErrImageNeverPull",
        SDCTestPhase.INCONCLUSIVE,
    )
    assert IMAGE in j.message and not j.checks


@pytest.mark.parametrize(
    "reason", ["ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerError"]
)
def test_other_start_failures_are_read_as_such(reason: str) -> None:
    seen = probe_pod(pod({"waiting": {"reason": reason, "message": "boom"}}))
    assert seen is not None and seen.start_failure == f"{reason}: boom"


@pytest.mark.parametrize("reason", ["ContainerCreating", "PodInitializing", ""])
def test_a_container_still_starting_is_no_failure(reason: str) -> None:
    seen = probe_pod(pod({"waiting": {"reason": reason}}))
    assert seen is not None and seen.start_failure is None


def test_a_start_failure_after_the_pod_ended_is_not_read_as_one() -> None:
    seen = probe_pod(pod({"waiting": {"reason": "ErrImagePull"}}, phase="Failed"))
    assert seen is not None and seen.start_failure is None


def test_an_oom_killed_probe_is_a_crash_naming_oomkilled() -> None:
    seen = probe_pod(
        pod(
            {"terminated": {"exitCode": 137, "reason": "OOMKilled", "finishedAt": None}},
            phase="Failed",
        )
    )
    assert seen is not None and seen.terminated_reason == "OOMKilled"
    j = judge_result(
        PodEnd(None, seen.exit_code, crashed=True, detail=seen.terminated_reason), CHECKS, {}
    )
    assert (j.verdict, j.phase) == (Verdict.CRASH, SDCTestPhase.INCONCLUSIVE)
    assert "OOMKilled" in j.message


def test_a_reason_that_is_not_one_word_falls_back_to_notstarted() -> None:
    j = judge_result(PodEnd(None, None, never_started=True, detail="bad reason: x"), CHECKS, {})
    assert j.reason == "NotStarted" and "bad reason: x" in j.message


def _runner() -> TestRunner:
    metrics = Metrics()
    writer = KubeWriter(api=client.ApiClient(), metrics=metrics, dry_run=True)
    return Reconciler(writer=writer, settings=Settings(metrics_port=0), metrics=metrics).runner


def _running_test() -> SDCTest:
    return SDCTest.model_validate(
        {
            "metadata": {"name": "t1"},
            "spec": {
                "nodeName": "real-node-0",
                "policyRef": "p",
                "suite": "acceptance",
                "reason": "Join",
            },
            "status": {"phase": "Running", "startTime": "2026-12-01T13:00:00Z"},
        }
    )


def _job(failed: str | None) -> observe.ProbeJob:
    conditions = [{"type": "Failed", "status": "True", "reason": failed}] if failed else []
    job = observe.probe_job(
        {
            "metadata": {
                "name": "sdcprobe-t1",
                "labels": {"app.kubernetes.io/component": "sdcprobe", "sdcguard.dev/test": "t1"},
            },
            "status": {"conditions": conditions},
        }
    )
    assert job is not None
    return job


def test_the_runner_ends_a_test_whose_probe_pod_cannot_start() -> None:
    seen = probe_pod(pod({"waiting": {"reason": "ErrImageNeverPull", "message": NEVER_PULL}}))
    assert seen is not None
    view = FleetView(nodes={}, probe_pods={"t1": [seen]}, probe_jobs={"t1": _job(None)})
    end, _ = _runner().pod_end(_running_test(), view, NOW)
    assert end is not None and end.never_started and IMAGE in end.detail


def test_a_pod_the_jobs_deadline_killed_is_a_timeout_whatever_its_exit_status() -> None:
    # SIGTERM from the Job controller: the probe reports inconclusive and exits 2.
    seen = probe_pod(
        pod(
            {"terminated": {"exitCode": 2, "reason": "Error", "finishedAt": None}},
            phase="Failed",
        )
    )
    assert seen is not None
    view = FleetView(
        nodes={}, probe_pods={"t1": [seen]}, probe_jobs={"t1": _job("DeadlineExceeded")}
    )
    end, _ = _runner().pod_end(_running_test(), view, NOW)
    assert end is not None and end.timed_out
    j = judge_result(end, CHECKS, {})
    assert (j.verdict, j.reason) == (Verdict.TIMEOUT, "TimedOut")


def _finished_test(name: str, phase: str, verdict: str) -> TestSnapshot:
    return TestSnapshot.from_body(
        {
            "metadata": {"name": name, "creationTimestamp": "2026-12-01T12:00:00Z"},
            "spec": {"nodeName": "real-node-0", "policyRef": "p", "suite": "acceptance"},
            "status": {
                "phase": phase,
                "verdict": verdict,
                "startTime": "2026-12-01T12:00:00Z",
                "completionTime": "2026-12-01T12:01:00Z",
            },
        }
    )


def _old_job(test: str) -> observe.ProbeJob:
    job = observe.probe_job(
        {
            "metadata": {
                "name": f"sdcprobe-{test}",
                "labels": {"app.kubernetes.io/component": "sdcprobe", "sdcguard.dev/test": test},
            },
            "status": {},  # the Job controller has not marked it Failed yet
        }
    )
    assert job is not None
    return job


def _old_pod(test: str, phase: str, state: dict[str, Any]) -> observe.ProbePod:
    body = pod(state, phase=phase)
    body["metadata"]["labels"]["sdcguard.dev/test"] = test
    seen = probe_pod(body)
    assert seen is not None
    return seen


def test_a_new_tests_job_keeps_an_ended_probes_job_and_deletes_a_stuck_one() -> None:
    """A confirmation starts the moment the SDC test's Pod ends, before the Job
    controller marks its Job Failed: that Job (whose Pod holds nothing and carries the
    termination message the verdict came from) stays; a finished test's Job whose Pod
    is still Pending (it could still start and take the GPUs) goes."""
    ended = _old_pod(
        "sdc", "Failed", {"terminated": {"exitCode": 1, "reason": "Error", "finishedAt": None}}
    )
    stuck = _old_pod("stuck", "Pending", {"waiting": {"reason": "ImagePullBackOff"}})
    view = FleetView(
        nodes={},
        tests={
            "real-node-0": [
                _finished_test("sdc", "Failed", "SDC"),
                _finished_test("stuck", "Inconclusive", "Inconclusive"),
            ]
        },
        probe_pods={"sdc": [ended], "stuck": [stuck]},
        probe_jobs={"sdc": _old_job("sdc"), "stuck": _old_job("stuck")},
    )
    runner = _runner()
    deleted: list[str] = []
    runner.writer.delete_job = lambda _ns, name: deleted.append(name)  # type: ignore[method-assign]
    counts: Counter[str] = Counter()
    runner._end_predecessors(_running_test(), view, counts)
    assert deleted == ["sdcprobe-stuck"] and counts["jobs-deleted"] == 1


def test_a_probe_pod_deleted_by_a_drain_is_not_a_crash_even_once_it_is_gone() -> None:
    """An autoscaler's drain deletes the probe Pod; the kubelet kills the probe, the Pod
    goes, and the Job fails (BackoffLimitExceeded) with no Pod left to read. The runner
    remembers the deletion it saw: the test is Inconclusive (ProbePodDeleted)."""
    body = pod({"running": {"startedAt": "2026-12-01T13:00:01Z"}}, phase="Running")
    body["metadata"]["deletionTimestamp"] = "2026-12-01T13:00:30Z"
    seen = probe_pod(body)
    assert seen is not None and seen.deleted
    runner = _runner()
    view = FleetView(nodes={}, probe_pods={"t1": [seen]}, probe_jobs={"t1": _job(None)})
    assert runner.pod_end(_running_test(), view, NOW) == (None, None), "still running"
    gone = FleetView(nodes={}, probe_pods={}, probe_jobs={"t1": _job("BackoffLimitExceeded")})
    end, _ = runner.pod_end(_running_test(), gone, NOW)
    assert end is not None and end.deleted and not end.timed_out
    j = judge_result(end, CHECKS, {})
    assert (j.verdict, j.reason) == (Verdict.INCONCLUSIVE, "ProbePodDeleted")
    # A runner that never saw the deletion reads the same Job as the probe's crash.
    end, _ = _runner().pod_end(_running_test(), gone, NOW)
    assert end is not None and judge_result(end, CHECKS, {}).verdict == Verdict.CRASH
