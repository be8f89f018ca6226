"""Hash-locked requirements for an image: pip resolves, this writes what it chose.

    python images/lock.py write IMAGE --wheels DIR [--constraints FILE]
    python images/lock.py check [IMAGE...]

IMAGE is ``operator`` (its inputs: the dependencies of ``pyproject.toml`` and
``jobs/sdcprobe/pyproject.toml``; lock ``images/operator/requirements.txt``),
``probe`` (inputs ``jobs/images/probe-requirements.in``; lock
``jobs/images/probe-requirements.txt``), ``xla`` (the TPU image: inputs
``jobs/images/xla-requirements.in``; lock ``jobs/images/xla-requirements.txt``) or
``neuron`` (the Neuron image: inputs ``jobs/images/neuron-requirements.in``; lock
``jobs/images/neuron-requirements.txt``). AWS publishes the Neuron packages only in
its own pip repository, so the Neuron lock is written where that repository is
reachable, with ``--extra-index-url`` naming it beside the default index; the image
then installs that lock alone, every hash checked, from the wheelhouse the lock was
written from (or one mirror that serves both): no second index at build time. It is
not in the tree (this project's machines cannot reach AWS's repository), so
``check`` without arguments skips it while it is absent.

Writing: pip downloads the requirements' wheels (this machine's Python is the image's,
3.11 on Linux x86_64) into DIR, resolves them from DIR alone with ``pip install
--dry-run --report``, and LOCK gets one ``name==version --hash=sha256:...`` line per
distribution of the closure, the hash being that of the wheel pip chose. An image
installs LOCK with ``pip install --require-hashes``: a wheel whose bytes differ from
the locked one (a mirror serving another file, an index that answers first) fails
the build. ``--constraints`` narrows the choice (the operator image takes the
versions the test venv runs).

The lock's header records a digest of its inputs (the requirement strings). Checking
(``--check``, also run by ``tests/packaging``) fails when the inputs changed since the
lock was written, or a requirement is not met by the version locked: the lock is
stale and ``bash images/build.sh --lock`` writes it again.

Standard library and pip's own ``packaging`` only; runs on the venv's Python.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import tomllib
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
INPUTS = "# inputs-sha256: "
"""The header line with the digest of the lock's inputs."""
OWN = {"sdcguard", "sdcprobe", "sdctrain"}


def operator_inputs() -> list[str]:
    """The third-party dependencies of the two distributions the operator image holds."""
    found = []
    for path in (REPO / "pyproject.toml", REPO / "jobs" / "sdcprobe" / "pyproject.toml"):
        for text in tomllib.loads(path.read_text())["project"]["dependencies"]:
            if canonicalize_name(Requirement(text).name) not in OWN and text not in found:
                found.append(text)
    return found


def _inputs_file(name: str) -> Callable[[], list[str]]:
    """The pins of ``jobs/images/<name>-requirements.in``, one per line."""

    def read() -> list[str]:
        text = (REPO / "jobs" / "images" / f"{name}-requirements.in").read_text()
        return [line.strip() for line in text.splitlines() if line.strip() and line[0] != "#"]

    return read


probe_inputs = _inputs_file("probe")
"""The probe image's own pins (torch, numpy, pydantic)."""

IMAGES: dict[str, tuple[Callable[[], list[str]], Path]] = {
    "operator": (operator_inputs, REPO / "images" / "operator" / "requirements.txt"),
    "probe": (probe_inputs, REPO / "jobs" / "images" / "probe-requirements.txt"),
    "xla": (_inputs_file("xla"), REPO / "jobs" / "images" / "xla-requirements.txt"),
    "neuron": (_inputs_file("neuron"), REPO / "jobs" / "images" / "neuron-requirements.txt"),
}
"""Image -> (its inputs, its lock file)."""
WRITTEN_ELSEWHERE = {"neuron"}
"""Locks written on a machine that reaches their index; ``check`` without arguments
skips them while they are absent (named, they must be there)."""


def inputs_digest(requirements: list[str]) -> str:
    """The digest of the requirement strings, order and spacing aside."""
    canonical = sorted(str(Requirement(r)) for r in requirements)
    return hashlib.sha256("\n".join(canonical).encode()).hexdigest()


def read_lock(path: Path) -> tuple[str, dict[str, tuple[str, list[str]]]]:
    """(the inputs digest, canonical name -> (version, hashes)) of a lock file."""
    digest = ""
    pins: dict[str, tuple[str, list[str]]] = {}
    for line in path.read_text().splitlines():
        if line.startswith(INPUTS):
            digest = line[len(INPUTS) :].strip()
            continue
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        spec, *options = line.split()
        name, _, version = spec.partition("==")
        hashes = [o.removeprefix("--hash=") for o in options if o.startswith("--hash=")]
        pins[canonicalize_name(name)] = (version, hashes)
    return digest, pins


def check(path: Path, requirements: list[str]) -> list[str]:
    """What makes the lock stale for these requirements (empty: it is current)."""
    if not path.is_file():
        return [f"{path} does not exist"]
    digest, pins = read_lock(path)
    problems = []
    if digest != inputs_digest(requirements):
        problems.append(f"{path}: its inputs changed since it was written")
    for text in requirements:
        req = Requirement(text)
        pinned = pins.get(canonicalize_name(req.name))
        if pinned is None:
            problems.append(f"{path}: {req.name} is not locked")
        elif not req.specifier.contains(pinned[0], prereleases=True):
            problems.append(f"{path}: {req.name}=={pinned[0]} does not meet {text}")
    for name, (version, hashes) in sorted(pins.items()):
        if not version or not hashes or not all(h.startswith("sha256:") for h in hashes):
            problems.append(f"{path}: {name} has no exact version or sha256 hash")
    return problems


def _wheel_sha256(url: str) -> str:
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme != "file":
        raise SystemExit(f"lock: pip chose {url}, not a wheel of the wheelhouse")
    path = Path(urllib.request.url2pathname(parsed.path))
    with path.open("rb") as wheel:  # streamed: torch's CUDA wheels are GBs
        return hashlib.file_digest(wheel, "sha256").hexdigest()


def write(
    out: Path,
    wheels: Path,
    requirements: list[str],
    constraints: Path | None,
    extra_index_url: str | None = None,
) -> None:
    pip = [sys.executable, "-m", "pip"]
    narrow = ["-c", str(constraints)] if constraints else []
    index = ["--extra-index-url", extra_index_url] if extra_index_url else []
    wheels.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            *pip,
            *("download", "--quiet", "--progress-bar", "off", "--only-binary=:all:"),
            *("-d", str(wheels), *index, *narrow, *requirements),
        ],
        check=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        report_path = Path(tmp) / "report.json"
        subprocess.run(
            [
                *pip,
                *("install", "--quiet", "--dry-run", "--ignore-installed"),
                *("--only-binary=:all:", "--no-index", "--find-links", str(wheels)),
                *("--report", str(report_path), *narrow, *requirements),
            ],
            check=True,
        )
        report = json.loads(report_path.read_text())
    lines = []
    for item in report["install"]:
        meta = item["metadata"]
        sha = _wheel_sha256(item["download_info"]["url"])
        lines.append(f"{meta['name']}=={meta['version']} --hash=sha256:{sha}")
    header = [
        f"# Written by images/lock.py from: {', '.join(requirements)}",
        "# Regenerate with: bash images/build.sh --lock   (do not edit by hand)",
        f"{INPUTS}{inputs_digest(requirements)}",
    ]
    out.write_text("\n".join(header + sorted(lines, key=str.lower)) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    writing = sub.add_parser("write", help="resolve and write an image's lock")
    writing.add_argument("image", choices=sorted(IMAGES))
    writing.add_argument("--wheels", type=Path, required=True, help="the wheelhouse")
    writing.add_argument("--constraints", type=Path, help="a pip constraints file")
    writing.add_argument(
        "--extra-index-url",
        help="a second index for the lock step only (neuron: AWS's Neuron repository)",
    )
    checking = sub.add_parser("check", help="fail when a lock is stale")
    checking.add_argument("images", nargs="*", help=f"of {', '.join(sorted(IMAGES))} (all)")
    args = parser.parse_args(argv)
    if args.command == "write":
        inputs, out = IMAGES[args.image]
        write(out, args.wheels, inputs(), args.constraints, args.extra_index_url)
        print(f"lock: wrote {out.relative_to(REPO)}", file=sys.stderr)
        return 0
    unknown = sorted(set(args.images) - set(IMAGES))
    if unknown:
        parser.error(f"unknown image {', '.join(unknown)} (of {', '.join(sorted(IMAGES))})")
    problems = []
    for image in args.images or sorted(IMAGES):
        inputs, lock = IMAGES[image]
        if not args.images and image in WRITTEN_ELSEWHERE and not lock.exists():
            print(f"lock: {image}: not written here ({lock.name}); skipped", file=sys.stderr)
            continue
        problems += check(lock, inputs())
    for problem in problems:
        print(f"lock: {problem}; run: bash images/build.sh --lock", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
