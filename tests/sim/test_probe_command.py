"""Rewriting a probe container's command for a local CPU run (pure)."""

from __future__ import annotations

import json

import pytest

from sdcdev.sim.probe_command import (
    ALLOW_FAULTS_FLAG,
    FAULTS_ENV,
    UnsupportedProbeCommand,
    mentions_probe,
    probe_invocation,
    without_option,
)

# What the operator's Job builder puts in the container.
JOB_COMMAND = ["python", "-m", "sdcprobe"]
JOB_ARGS = [
    "run", "--checks", "compute,collective,golden", "--device", "auto", "--budget", "120",
    "--result-file", "/dev/termination-log",
]  # fmt: skip
FAULTS = json.dumps({"faults": [{"site": "attention.output", "rate": 4.78e-3, "bits": [0, 22]}]})
BASE_ENV = {"PATH": "/usr/bin", "PYTHONPATH": "/src/jobs", FAULTS_ENV: "leaked", "KUBECONFIG": "k"}


def invoke(
    command: list[str] = JOB_COMMAND,
    args: list[str] = JOB_ARGS,
    *,
    faults: str | None = None,
    pod_env: dict[str, str] | None = None,
    cpu_devices: int = 4,
) -> tuple[list[str], dict[str, str]]:
    inv = probe_invocation(
        command,
        args,
        pod_env or {},
        python="/venv/bin/python3",
        result_file="/tmp/pod/termination-log",
        cpu_devices=cpu_devices,
        faults_env=faults,
        base_env=BASE_ENV,
    )
    assert inv.faults_injected == (faults is not None)
    return list(inv.argv), dict(inv.env)


def test_healthy_node_gets_cpu_run_and_never_fault_injection() -> None:
    argv, env = invoke(pod_env={"SDCPROBE_SEED": "7"})
    assert argv[:4] == ["/venv/bin/python3", "-m", "sdcprobe", "run"]
    assert ALLOW_FAULTS_FLAG not in argv
    assert FAULTS_ENV not in env  # the simulator's own environment does not leak in
    assert "KUBECONFIG" not in env
    assert env["SDCPROBE_SEED"] == "7" and env["PYTHONPATH"] == "/src/jobs"
    assert argv.count("--device") == 1 and argv[argv.index("--device") + 1] == "cpu"
    assert argv[argv.index("--cpu-devices") + 1] == "4"
    assert argv[argv.index("--result-file") + 1] == "/tmp/pod/termination-log"
    assert "/dev/termination-log" not in argv
    assert argv[argv.index("--checks") + 1] == "compute,collective,golden"
    assert argv[argv.index("--budget") + 1] == "120"


def test_faulty_node_adds_the_flag_once_and_its_spec_replaces_the_pods() -> None:
    args = [*JOB_ARGS, "--faults=/etc/pod-faults.json", ALLOW_FAULTS_FLAG]
    argv, env = invoke(args=args, faults=FAULTS, pod_env={FAULTS_ENV: "from-pod"})
    assert argv.count(ALLOW_FAULTS_FLAG) == 1
    assert not any(a.startswith("--faults") for a in argv)
    assert env[FAULTS_ENV] == FAULTS


def test_pod_choices_win_where_the_node_only_supplies_defaults() -> None:
    argv, _ = invoke(args=["run", "--cpu-devices=2", "--device=xla", "--checks", "compute"])
    assert "--cpu-devices=2" in argv and "--cpu-devices" not in argv
    assert "--device=xla" not in argv and argv[argv.index("--device") + 1] == "cpu"


@pytest.mark.parametrize(
    ("command", "args"),
    [
        (["sdcprobe"], ["run", "--checks", "compute"]),
        (["/usr/local/bin/sdcprobe", "run"], ["--checks", "compute"]),
        (["python3", "-u", "-m", "sdcprobe", "run", "--checks", "compute"], []),
        (["/bin/sh", "-c", "exec python -m sdcprobe run --checks compute"], []),
    ],
    ids=["script", "script-path", "python-flags", "shell"],
)
def test_command_forms(command: list[str], args: list[str]) -> None:
    assert mentions_probe(command, args)
    argv, _ = invoke(command, args)
    assert argv[:4] == ["/venv/bin/python3", "-m", "sdcprobe", "run"]
    assert argv[argv.index("--checks") + 1] == "compute"


def test_shell_scripts_with_pipes_are_refused_with_a_reason() -> None:
    with pytest.raises(UnsupportedProbeCommand, match="shell script"):
        invoke(["sh", "-c", "python -m sdcprobe run | tee /tmp/log"], [])


def test_other_subcommands_pass_through_untouched() -> None:
    argv, _ = invoke(args=["baseline", "--out", "x.json"], faults=FAULTS)
    assert argv == ["/venv/bin/python3", "-m", "sdcprobe", "baseline", "--out", "x.json"]


def test_not_a_probe() -> None:
    assert not mentions_probe(["python", "train.py"], ["--epochs", "3"])


def test_without_option_handles_both_spellings() -> None:
    assert without_option(["a", "--x", "1", "--x=2", "b"], "--x") == ["a", "b"]
    assert without_option(["--flag", "--x", "1"], "--flag", takes_value=False) == ["--x", "1"]
