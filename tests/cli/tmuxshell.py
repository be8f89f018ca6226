"""A real interactive shell in tmux, for tests of shell completion: type keys, read the
screen. Each shell gets a tmux server of its own (a private socket, no user config), so
tests never touch a person's sessions."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE_PATH = ":".join(str(ROOT / p) for p in ("operator", "jobs", "."))
BASH_COMPLETION = Path("/usr/share/bash-completion/bash_completion")
"""The bash-completion package, which kubectl's bash completion script needs."""


def need(program: str) -> str:
    """The path of ``program``, or skip the test saying what is missing."""
    found = shutil.which(program)
    if found is None:
        pytest.skip(
            f"{program} is not installed: shell completion is tested in a real {program} "
            f"(apt-get install -y {program})"
            if program != "tmux"
            else "tmux is not installed: shell completion is tested in a real shell driven "
            "through tmux (apt-get install -y tmux)"
        )
    return found


def plugin_bin(folder: Path) -> Path:
    """``folder`` holding ``kubectl-sdc`` (this checkout's plugin, run by this Python) and
    the checkout's ``kubectl_complete-sdc``, as a user's PATH would."""
    folder.mkdir(parents=True, exist_ok=True)
    launcher = folder / "kubectl-sdc"
    launcher.write_text(
        f'#!/bin/sh\nPYTHONPATH="{SOURCE_PATH}" exec "{sys.executable}" -m sdcguard.cli "$@"\n'
    )
    launcher.chmod(0o755)
    hook = folder / "kubectl_complete-sdc"
    shutil.copy(ROOT / "charts" / "krew" / "kubectl_complete-sdc", hook)
    hook.chmod(0o755)
    return folder


class Shell:
    """One interactive shell in a tmux window of 200 columns."""

    def __init__(self, socket: Path, name: str) -> None:
        self.socket, self.name = socket, name

    def _tmux(self, *args: str) -> str:
        proc = subprocess.run(
            ["tmux", "-S", str(self.socket), *args],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
        return proc.stdout

    def screen(self) -> str:
        """The visible text, trailing blanks removed."""
        lines = self._tmux("capture-pane", "-p", "-t", self.name).splitlines()
        return "\n".join(line.rstrip() for line in lines).strip()

    def type(self, *keys: str) -> None:
        """Send keys as tmux names them (text, "Tab", "Enter", "C-u")."""
        self._tmux("send-keys", "-t", self.name, *keys)

    def wait_for(self, wanted: str, timeout: float = 30.0) -> str:
        """The screen once it shows ``wanted``; fails with the screen when it never does.
        Completion starts a Python process per TAB, so this polls instead of sleeping."""
        deadline = time.monotonic() + timeout
        while True:
            shown = self.screen()
            if wanted in shown:
                return shown
            if time.monotonic() > deadline:
                raise AssertionError(f"{wanted!r} never appeared; the screen:\n{shown}")
            time.sleep(0.2)

    def complete(self, line: str, wanted: str, tabs: int = 1) -> str:
        """Clear the line, type ``line``, press TAB ``tabs`` times, and wait for ``wanted``."""
        self.type("C-u")
        self.type("-l", line)
        for _ in range(tabs):
            self.type("Tab")
            time.sleep(0.3)
        return self.wait_for(wanted)


@contextmanager
def shell(argv: list[str], env: Mapping[str, str], folder: Path, prompt: str) -> Iterator[Shell]:
    """Start ``argv`` (an interactive shell) in tmux and wait for its ``prompt``."""
    need("tmux")
    socket = folder / "tmux.sock"
    start = ["new-session", "-d", "-s", "t", "-x", "200", "-y", "50", " ".join(argv)]
    subprocess.run(
        ["tmux", "-S", str(socket), "-f", "/dev/null", *start],
        env=dict(env),
        check=True,
        timeout=30,
    )
    session = Shell(socket, "t")
    try:
        session.wait_for(prompt)
        yield session
    finally:
        subprocess.run(["tmux", "-S", str(socket), "kill-server"], check=False, timeout=30)
