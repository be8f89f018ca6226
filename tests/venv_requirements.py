"""The development venv's requirements, and the key the Makefile names the venv by.

    python3 tests/venv_requirements.py          # one requirement a line, for pip install -r
    python3 tests/venv_requirements.py --key    # 12 hex digits

The venv holds the third-party requirements of the three distributions and the dev
group: sdcguard's, then sdcprobe's with its ``xla`` extra, then sdctrain's, each
skipped when its project is already named (the venv pins torch for the probe and
torch-xla; ``tests/packaging`` checks that the pinned versions satisfy every
distribution's own range). The project's own distributions are never installed: the
checkout is on ``PYTHONPATH``.

The key hashes those lists in the shape they had when one pyproject.toml held them all
(``(dependencies, {"probe": ..., "dev": ...})``), so the same packages keep the same
key and the ~7 GB venv is not rebuilt for a change that installs nothing new.

Runs on the Python that creates the venv (the standard library only: no ``packaging``).
"""

from __future__ import annotations

import hashlib
import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OWN = {"sdcguard", "sdcprobe", "sdctrain"}


def project_name(requirement: str) -> str:
    """The normalised project name a requirement string starts with (PEP 503)."""
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip())
    if match is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def requirement_lists() -> tuple[list[str], list[str], list[str]]:
    """(operator, probe and training, dev): the venv's requirements in install order."""
    root = tomllib.loads((REPO / "pyproject.toml").read_text())
    probe = tomllib.loads((REPO / "jobs" / "sdcprobe" / "pyproject.toml").read_text())["project"]
    train = tomllib.loads((REPO / "jobs" / "sdctrain" / "pyproject.toml").read_text())["project"]
    named = set(OWN)

    def new(requirements: list[str]) -> list[str]:
        kept = []
        for requirement in requirements:
            name = project_name(requirement)
            if name not in named:
                named.add(name)
                kept.append(requirement)
        return kept

    operator = new(root["project"]["dependencies"])
    jobs = new(probe["dependencies"] + probe["optional-dependencies"]["xla"])
    jobs += new(train["dependencies"])
    return operator, jobs, list(root["dependency-groups"]["dev"])


def venv_key() -> str:
    operator, jobs, dev = requirement_lists()
    shape = (operator, {"probe": jobs, "dev": dev})
    return hashlib.sha256(repr(shape).encode()).hexdigest()[:12]


def main(argv: list[str]) -> int:
    if argv == ["--key"]:
        print(venv_key())
    elif not argv:
        print("\n".join(r for group in requirement_lists() for r in group))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
