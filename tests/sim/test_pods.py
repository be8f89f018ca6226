"""Pod status as a kubelet writes it, env and termination messages (pure)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sdcdev.sim.pods import (
    TERMINATION_MESSAGE_LIMIT,
    container_env,
    expand,
    parse_pod,
    running_status,
    terminated_status,
    termination_message,
)

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
T1 = datetime(2026, 1, 2, 3, 5, 0, tzinfo=UTC)


def probe_pod(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "sdcprobe-x-abcde",
            "namespace": "sdcguard",
            "uid": "0123456789abcdef",
            "labels": {"sdcguard.dev/test": "t1"},
        },
        "spec": {
            "nodeName": "gpu-00",
            "containers": [
                {
                    "name": "sdcprobe",
                    "image": "probe:1",
                    "command": ["python", "-m", "sdcprobe"],
                    "args": ["run", "--seed", "$(SEED)", "--node", "$(NODE)", "$$(NODE)"],
                    "env": [
                        {"name": "SEED", "value": "42"},
                        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                        {
                            "name": "TEST",
                            "valueFrom": {
                                "fieldRef": {"fieldPath": "metadata.labels['sdcguard.dev/test']"}
                            },
                        },
                        {
                            "name": "SECRET",
                            "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}},
                        },
                    ],
                },
                {"name": "sidecar", "image": "side:1"},
            ],
            **spec,
        },
    }


def test_pod_kind_and_env() -> None:
    pod = parse_pod(probe_pod())
    assert pod.kind == "probe"
    container = pod.probe_container()
    assert container is not None
    env = container_env(pod, container, "10.1.2.3")
    assert env == {"SEED": "42", "NODE": "gpu-00", "TEST": "t1", "SECRET": ""}
    assert [expand(a, env) for a in container.args][2:] == ["42", "--node", "gpu-00", "$(NODE)"]


def test_running_status() -> None:
    pod = parse_pod(probe_pod())
    status = running_status(pod, host_ip="10.1.2.3", started=T0)["status"]
    assert status["phase"] == "Running"
    assert status["startTime"] == "2026-01-02T03:04:05Z"
    assert status["hostIP"] == "10.1.2.3" and status["podIPs"][0]["ip"] == status["podIP"]
    assert [c["state"] for c in status["containerStatuses"]] == [
        {"running": {"startedAt": "2026-01-02T03:04:05Z"}}
    ] * 2


def test_failed_probe_status_carries_exit_code_and_message_on_the_probe_container() -> None:
    pod = parse_pod(probe_pod())
    status = terminated_status(
        pod, host_ip="10.1.2.3", started=T0, finished=T1, exit_code=1, message='{"verdict":"fail"}',
        main_container="sdcprobe",
    )["status"]  # fmt: skip
    assert status["phase"] == "Failed"
    probe, sidecar = status["containerStatuses"]
    term = probe["state"]["terminated"]
    assert term["exitCode"] == 1 and term["reason"] == "Error"
    assert term["message"] == '{"verdict":"fail"}'
    assert term["finishedAt"] == "2026-01-02T03:05:00Z"
    assert sidecar["state"]["terminated"]["exitCode"] == 0
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "PodCompleted"


def test_success_and_deadline() -> None:
    pod = parse_pod(probe_pod(activeDeadlineSeconds=5))
    ok = terminated_status(pod, host_ip="10.0.0.1", started=T0, finished=T1, exit_code=0)
    assert ok["status"]["phase"] == "Succeeded"
    assert ok["status"]["containerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"
    late = terminated_status(
        pod, host_ip="10.0.0.1", started=T0, finished=T1, exit_code=137,
        pod_reason="DeadlineExceeded", pod_message="too long",
    )["status"]  # fmt: skip
    assert late["phase"] == "Failed" and late["reason"] == "DeadlineExceeded"


def test_termination_message_limit_and_log_fallback() -> None:
    assert len(termination_message(b"x" * 5000, b"", 0, "File")) == TERMINATION_MESSAGE_LIMIT
    assert termination_message(b"", b"boom", 2, "FallbackToLogsOnError") == "boom"
    assert termination_message(b"", b"boom", 0, "FallbackToLogsOnError") == ""
    assert termination_message(b"", b"boom", 2, "File") == ""


# ---------------------------------------------------------------- command Pods


def command_pod(annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "llm-1-x",
            "namespace": "team",
            "uid": "u1",
            "annotations": annotations,
        },
        "spec": {
            "nodeName": "gpu-00",
            "containers": [
                {
                    "name": "train",
                    "command": ["python3", "-m", "train"],
                    "resources": {"limits": {"nvidia.com/gpu": "8"}},
                    "env": [
                        {
                            "name": "JOB_COMPLETION_INDEX",
                            "valueFrom": {
                                "fieldRef": {
                                    "fieldPath": "metadata.annotations"
                                    "['batch.kubernetes.io/job-completion-index']"
                                }
                            },
                        }
                    ],
                }
            ],
        },
    }


def test_only_pods_that_ask_have_their_command_run() -> None:
    from sdcdev.sim.commands import RUN_COMMAND_ANNOTATION

    assert parse_pod(command_pod({RUN_COMMAND_ANNOTATION: "true"})).kind == "command"
    assert parse_pod(command_pod({})).kind == "workload"
    assert parse_pod(probe_pod()).kind == "probe"


def test_a_command_pod_runs_with_its_env_identity_and_gpus() -> None:
    from sdcdev.sim.commands import command_env, gpu_uuids, local_argv, service_env

    annotations = {"batch.kubernetes.io/job-completion-index": "1"}
    pod = parse_pod(command_pod(annotations))
    (container,) = pod.spec.containers
    assert container.resources.limits == {"nvidia.com/gpu": "8"}
    pod_env = container_env(pod, container, "10.0.0.1")
    assert pod_env == {"JOB_COMPLETION_INDEX": "1"}
    assert local_argv(container.command, "/venv/bin/python") == ["/venv/bin/python", "-m", "train"]
    assert local_argv(["/bin/sh", "-c", "true"], "/venv/bin/python") == ["/bin/sh", "-c", "true"]
    assert service_env("https://127.0.0.1:6443") == {
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": "6443",
    }
    env = command_env({"PATH": "/bin", "KUBECONFIG": "/admin"}, pod_env, {"A": "1"})
    assert env == {"PATH": "/bin", "A": "1", "JOB_COMPLETION_INDEX": "1"}  # no admin kubeconfig
    uuids = gpu_uuids("gpu-00", 8)
    assert len(set(uuids)) == 8 and all(u.startswith("GPU-") for u in uuids)
    assert gpu_uuids("gpu-00", 1, 3) == uuids[3:4]  # stable per node and index
    assert gpu_uuids("gpu-01", 1) != uuids[:1]
