"""What the probe container needs that a real container runtime exposes (checked on the
local cluster's containerd node, tests/realnode): a writable HOME with a read-only root
filesystem, and a /dev/shm larger than the runtime's 64 MiB default."""

from __future__ import annotations

from sdcguard.builders.probe_job import ProbeJobRequest, build_probe_job


def _job(env: tuple[tuple[str, str], ...] = ()) -> dict:  # type: ignore[type-arg]
    return build_probe_job(
        ProbeJobRequest(
            test_name="t",
            test_uid="u",
            node_name="n",
            namespace="ns",
            image="img",
            checks=("compute",),
            budget_seconds=10,
            active_deadline_seconds=60,
            ttl_seconds_after_finished=60,
            accelerators=(("nvidia.com/gpu", 8),),
            tolerated_taint_keys=(),
            env=env,
        )
    )


def test_dev_shm_is_a_memory_backed_volume() -> None:
    pod = _job()["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"] == {"medium": "Memory"}
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True


def test_home_is_on_the_writable_tmp_volume_and_policy_env_still_applies() -> None:
    container = _job(env=(("HOME", "/scratch"), ("X", "1")))["spec"]["template"]["spec"][
        "containers"
    ][0]
    names = [e["name"] for e in container["env"]]
    assert names[0] == "HOME" and container["env"][0]["value"] == "/tmp"
    assert "/tmp" in {m["mountPath"] for m in container["volumeMounts"]}
    # A later entry of the same name wins in Kubernetes: an explicit env overrides HOME.
    assert container["env"][-2:] == [
        {"name": "HOME", "value": "/scratch"},
        {"name": "X", "value": "1"},
    ]


def test_a_probe_that_dies_before_its_result_leaves_its_log_tail() -> None:
    """#45: the kubelet keeps the log's tail as the termination message when the probe
    exits with an error and wrote no result, so its own error line reaches the SDCTest
    after the Job is deleted."""
    container = _job()["spec"]["template"]["spec"]["containers"][0]
    assert container["terminationMessagePath"] == "/dev/termination-log"
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
