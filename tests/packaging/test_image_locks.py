"""Each image installs hash-locked requirements (trust model row "the supply chain"):
the locks in the tree are current for their inputs, every line carries an exact
version and a sha256, and a lock goes stale, loudly, when its inputs change.
``make images`` runs the same check before it builds, and pip refuses a wheel whose
bytes differ from the locked hash (``--require-hashes`` in every Dockerfile)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.packaging.scripts import load

ROOT = Path(__file__).resolve().parents[2]


lock = load("lock")


@pytest.mark.parametrize("image", ["operator", "probe", "xla"])
def test_the_images_lock_is_current_and_hashed(image: str) -> None:
    inputs, path = lock.IMAGES[image]
    assert lock.check(path, inputs()) == []
    digest, pins = lock.read_lock(path)
    assert digest and pins
    for text in inputs():
        name = lock.canonicalize_name(lock.Requirement(text).name)
        assert name in pins, f"{text} is not in {path.name}"
    assert all(hashes and hashes[0].startswith("sha256:") for _, hashes in pins.values())


def test_both_dockerfiles_install_only_what_is_locked() -> None:
    for dockerfile, lockfile in (
        ("images/operator/Dockerfile", "images/operator/requirements.txt"),
        ("jobs/images/Dockerfile.probe", "jobs/images/probe-requirements.txt"),
    ):
        text = (ROOT / dockerfile).read_text()
        assert f"COPY {lockfile} /tmp/requirements.txt" in text, dockerfile
        installs = [
            line for line in text.splitlines() if "pip install" in line and "--no-deps" not in line
        ]
        assert installs and all("--require-hashes" in line for line in installs), installs


def test_the_xla_image_installs_a_lock_per_accelerator_from_one_index() -> None:
    """TPU and Neuron builds install their hash-locked requirements and nothing else; no
    extra index at build time (the Neuron lock is written where AWS's repository is
    reachable, and a build without it stops and says how to write it)."""
    text = (ROOT / "jobs" / "images" / "Dockerfile.xla").read_text()
    assert "COPY jobs/images/*-requirements.txt /tmp/locks/" in text
    installs = [line for line in text.splitlines() if "pip install" in line]
    assert installs and all("--require-hashes" in line for line in installs), installs
    assert not any("index" in line for line in installs), installs
    assert "NEURON_PIP_INDEX" not in text
    assert "tpu) lock=/tmp/locks/xla-requirements.txt" in text
    assert "neuron) lock=/tmp/locks/neuron-requirements.txt" in text
    assert "python images/lock.py write neuron" in text


def test_the_neuron_lock_is_skipped_until_written_and_checked_when_named() -> None:
    inputs, path = lock.IMAGES["neuron"]
    assert not path.exists(), "the Neuron lock needs AWS's repository; not written here"
    assert any("torch-neuronx" in r for r in inputs())
    skipped = subprocess.run(
        [sys.executable, str(ROOT / "images" / "lock.py"), "check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert skipped.returncode == 0 and "neuron: not written here" in skipped.stderr
    named = subprocess.run(
        [sys.executable, str(ROOT / "images" / "lock.py"), "check", "neuron"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert named.returncode == 1 and "does not exist" in named.stderr


def test_a_changed_input_makes_the_lock_stale(tmp_path: Path) -> None:
    inputs, path = lock.IMAGES["probe"]
    copy = tmp_path / "probe-requirements.txt"
    copy.write_text(path.read_text())
    changed = [r if not r.startswith("numpy") else "numpy==9.9.9" for r in inputs()]
    problems = lock.check(copy, changed)
    assert any("inputs changed" in p for p in problems), problems
    assert any("numpy==2.2.6 does not meet numpy==9.9.9" in p for p in problems), problems
    # A line without its hash is refused too.
    lines = [line.split(" --hash")[0] for line in path.read_text().splitlines()]
    copy.write_text("\n".join(lines) + "\n")
    assert any("no exact version or sha256" in p for p in lock.check(copy, inputs()))


def test_the_check_command_fails_a_stale_lock_with_the_fix() -> None:
    ok = subprocess.run(
        [sys.executable, str(ROOT / "images" / "lock.py"), "check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run(
        [sys.executable, str(ROOT / "images" / "lock.py"), "check", "nonesuch"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and "unknown image nonesuch" in bad.stderr


DOCKERFILES = (
    "images/operator/Dockerfile",
    "jobs/images/Dockerfile.probe",
    "jobs/images/Dockerfile.xla",
)


def _base_check(dockerfile: str) -> str:
    """The RUN of ``dockerfile`` that refuses a base named without a digest, as sh runs it."""
    lines = (ROOT / dockerfile).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('RUN case "${BASE_IMAGE}"'))
    command = []
    for line in lines[start:]:
        command.append(line.removeprefix("RUN ").rstrip("\\"))
        if not line.endswith("\\"):
            break
    return "\n".join(command)


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_every_dockerfile_refuses_a_base_named_by_a_tag(dockerfile: str) -> None:
    check = _base_check(dockerfile)

    def run(base: str, allow: str = "false") -> subprocess.CompletedProcess[str]:
        env = {"BASE_IMAGE": base, "ALLOW_UNPINNED_BASE": allow, "PATH": "/usr/bin:/bin"}
        return subprocess.run(["sh", "-c", check], env=env, capture_output=True, text=True)

    digest = "sha256:" + "0123456789abcdef" * 4
    assert run(f"mirror.example/python:3.11-slim@{digest}").returncode == 0
    refused = run("python:3.11-slim-bookworm")
    assert refused.returncode == 1
    assert "is not pinned by digest" in refused.stderr and "ALLOW_UNPINNED_BASE" in refused.stderr
    assert run("python:3.11-slim@sha256:short").returncode == 1
    assert run("python:3.11-slim-bookworm", allow="true").returncode == 0


def test_make_images_names_its_own_base_by_digest() -> None:
    script = (ROOT / "images" / "build.sh").read_text()
    assert 'BASE_REF="localhost/sdcguard-base@$(' in script
    assert "{{.FromImageDigest}}" in script
    assert '--build-arg "BASE_IMAGE=$BASE_REF"' in script
