"""The commit-msg hook: short subjects prefixed by a component; git's own messages pass."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.docs.helpers import REPO

HOOK = REPO / ".githooks" / "commit-msg"


def _check(tmp_path: Path, message: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "COMMIT_EDITMSG"
    path.write_text(message)
    return subprocess.run(
        ["bash", str(HOOK), str(path)], capture_output=True, text=True, check=False
    )


@pytest.mark.parametrize(
    "message",
    [
        "operator: hold quarantines while the breaker is open\n\nWhy, in the body.\n",
        "docs: a short README\n",
        "# a comment git adds\nprobe: plan rounds per check\n",
        "tests: " + "x" * 65 + "\n",
        "Merge branch 'h/docs'\n",
        "fixup! docs: a short README\n",
        "squash! chart: a PodDisruptionBudget\n",
        'Revert "docs: a short README"\n',
    ],
)
def test_good_messages_pass(tmp_path: Path, message: str) -> None:
    result = _check(tmp_path, message)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("message", "why"),
    [
        ("Docs: a short README\n", "not a component"),
        ("README: the suite's third green run\n", "not a component"),
        ("a short README\n", "no component prefix"),
        ("docs:a short README\n", "one space"),
        ("docs: " + "x" * 67 + "\n", "the limit is 72"),
        ("docs:\n", "one space"),
    ],
)
def test_bad_messages_are_refused_with_the_reason(tmp_path: Path, message: str, why: str) -> None:
    result = _check(tmp_path, message)
    assert result.returncode == 1
    assert why in result.stderr


def test_the_hook_is_executable() -> None:
    assert HOOK.stat().st_mode & 0o111, f"{HOOK} must be executable for git to run it"
