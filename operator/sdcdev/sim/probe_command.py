"""Turning a probe container's command into a local CPU run (pure functions).

A probe Pod's container runs ``python -m sdcprobe run ...`` (or the
``sdcprobe`` console script, or either behind ``sh -c``). The simulator runs
the same command on this machine, changed only where a real node and this one
differ:

- the interpreter becomes this process's ``sys.executable``;
- ``--device`` is forced to ``cpu`` (the node's accelerators are simulated);
- ``--cpu-devices`` comes from the node's config unless the Pod set it;
- ``--result-file`` points at a local file that becomes the termination message;
- on a node with an active fault profile, ``--allow-fault-injection`` is added
  and ``SDCPROBE_FAULTS`` carries the node's faults (any ``--faults`` file of
  the Pod's is dropped, so the node's defect is the only one). A healthy node
  gets neither: the Job's own manifest never contains fault injection.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

FAULTS_ENV = "SDCPROBE_FAULTS"
ALLOW_FAULTS_FLAG = "--allow-fault-injection"
PROBE_MODULE = "sdcprobe"
_SHELLS = frozenset({"sh", "bash", "dash", "ash", "zsh"})
_SHELL_META = set(";|&<>$`(){}*?!\n")
#: Environment of the simulator that must never leak into a probe run.
_SCRUBBED_ENV = (FAULTS_ENV, "KUBECONFIG")


class UnsupportedProbeCommand(ValueError):
    """The container mentions the probe, but not in a form the simulator can run."""


@dataclass(frozen=True)
class ProbeInvocation:
    """A probe run, ready for ``subprocess.Popen(argv, env=env)``."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    faults_injected: bool


def mentions_probe(command: Sequence[str], args: Sequence[str]) -> bool:
    """Whether a container runs the probe (its command or args name ``sdcprobe``)."""
    return any(PROBE_MODULE in part for part in (*command, *args))


def _basename(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def _split_shell(argv: list[str]) -> list[str]:
    """``sh -c 'python -m sdcprobe run ...'`` -> the inner argv, when it is a plain command."""
    if len(argv) >= 3 and _basename(argv[0]) in _SHELLS and argv[1] in ("-c", "-ec", "-ce"):
        script = argv[2].strip()
        if script.startswith("exec "):
            script = script[5:]
        if _SHELL_META & set(script):
            raise UnsupportedProbeCommand(
                "the probe runs inside a shell script with pipes, variables or several "
                "commands; the simulator runs only a plain probe command"
            )
        return shlex.split(script)
    return argv


def _probe_args(argv: list[str]) -> list[str]:
    """The probe's own arguments (after ``-m sdcprobe`` or the ``sdcprobe`` script)."""
    for i, part in enumerate(argv):
        if part == "-m" and i + 1 < len(argv) and argv[i + 1] == PROBE_MODULE:
            return argv[i + 2 :]
        if part.startswith("-m") and part[2:] == PROBE_MODULE:
            return argv[i + 1 :]
        if _basename(part) == PROBE_MODULE:
            return argv[i + 1 :]
    raise UnsupportedProbeCommand(
        f"cannot find 'python -m {PROBE_MODULE}' or the '{PROBE_MODULE}' script in "
        f"{shlex.join(argv)!r}"
    )


def has_option(args: Sequence[str], name: str) -> bool:
    return any(a == name or a.startswith(name + "=") for a in args)


def without_option(args: Sequence[str], name: str, *, takes_value: bool = True) -> list[str]:
    """``args`` with every ``name VALUE`` / ``name=VALUE`` (or bare flag) removed."""
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a == name:
            skip = takes_value
            continue
        if takes_value and a.startswith(name + "="):
            continue
        out.append(a)
    return out


def probe_invocation(
    command: Sequence[str],
    args: Sequence[str],
    pod_env: Mapping[str, str],
    *,
    python: str,
    result_file: str,
    cpu_devices: int,
    faults_env: str | None,
    base_env: Mapping[str, str],
) -> ProbeInvocation:
    """The local command for a probe container.

    ``faults_env`` is the node's ``SDCPROBE_FAULTS`` value when its fault
    profile is active on this run, else None. ``base_env`` is the environment
    the run starts from (PATH, PYTHONPATH, ...); the Pod's env goes on top.
    """
    argv = _split_shell([*command, *args])
    probe_args = _probe_args(argv)
    if probe_args[:1] == ["run"]:
        probe_args = without_option(probe_args, "--device")
        probe_args += ["--device", "cpu"]
        if not has_option(probe_args, "--cpu-devices"):
            probe_args += ["--cpu-devices", str(cpu_devices)]
        probe_args = without_option(probe_args, "--result-file")
        probe_args += ["--result-file", result_file]
        if faults_env is not None:
            probe_args = without_option(probe_args, "--faults")
            probe_args = without_option(probe_args, ALLOW_FAULTS_FLAG, takes_value=False)
            probe_args.append(ALLOW_FAULTS_FLAG)
    env = {k: v for k, v in base_env.items() if k not in _SCRUBBED_ENV}
    env.update(pod_env)
    if faults_env is not None:
        env[FAULTS_ENV] = faults_env
    return ProbeInvocation(
        argv=(python, "-m", PROBE_MODULE, *probe_args),
        env=env,
        faults_injected=faults_env is not None,
    )
