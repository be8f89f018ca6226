"""The three distributions build as wheels holding their own packages only, and
sdctrain's installs and works where torch (with what torch itself requires) is all
there is.

The wheels are built from a copy of the sources, as `pip wheel --no-deps` does for a
user: pip sets up the build backend (setuptools, from the package index or pip's
cache) in an isolated environment. The copy keeps build/ and *.egg-info out of the
checkout.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import sdcprobe
import sdctrain
from tests import venv_requirements

REPO = Path(__file__).resolve().parents[2]
#: distribution -> the folder its pyproject.toml is in, relative to the checkout
PROJECTS = {"sdcguard": ".", "sdcprobe": "jobs/sdcprobe", "sdctrain": "jobs/sdctrain"}
#: What a build needs from the checkout (the root project reads README.md).
SOURCES = ("pyproject.toml", "README.md", "operator/sdcguard", "jobs/sdcprobe", "jobs/sdctrain")
OPERATOR_AND_PROBE = ("pydantic", "kopf", "kubernetes", "yaml", "sdcguard", "sdcprobe", "sdcdev")


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    src = tmp_path_factory.mktemp("src")
    out = tmp_path_factory.mktemp("wheels")
    skip = shutil.ignore_patterns("__pycache__", "build", "*.egg-info")
    for rel in SOURCES:
        if (REPO / rel).is_dir():
            shutil.copytree(REPO / rel, src / rel, ignore=skip)
        else:
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel)
    built = {}
    for name, folder in PROJECTS.items():
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), folder],
            cwd=src,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert proc.returncode == 0, f"pip wheel {folder} failed:\n{proc.stderr[-3000:]}"
        (built[name],) = out.glob(f"{name}-*.whl")
    return built


def _top_level(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return {n.split("/")[0] for n in z.namelist()}


def _metadata(wheel: Path) -> tuple[list[str], str]:
    """(Requires-Dist lines, entry_points.txt) of a wheel."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        points = next(n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))
        message = Parser().parsestr(z.read(meta).decode())
        return message.get_all("Requires-Dist") or [], z.read(points).decode()


def test_each_wheel_holds_its_own_package_and_nothing_else(wheels: dict[str, Path]) -> None:
    for name, wheel in wheels.items():
        version = wheel.name.split("-")[1]
        assert _top_level(wheel) == {name, f"{name}-{version}.dist-info"}, wheel.name
    with zipfile.ZipFile(wheels["sdcguard"]) as z:
        assert not [n for n in z.namelist() if "/sim/" in n or "sdcdev" in n]
    for name, scripts in {
        "sdcguard": ("sdcguard-operator = sdcguard.__main__:main", "kubectl-sdc = "),
        "sdcprobe": ("sdcprobe = sdcprobe.__main__:main",),
        "sdctrain": ("sdctrain = sdctrain.__main__:main",),
    }.items():
        _, points = _metadata(wheels[name])
        for script in scripts:
            assert script in points, f"{name}: no {script!r} in\n{points}"


def test_sdctrain_requires_torch_alone_and_the_operator_pins_its_probe(
    wheels: dict[str, Path],
) -> None:
    assert _metadata(wheels["sdctrain"])[0] == ["torch>=2.9"]
    probe_base = [r for r in _metadata(wheels["sdcprobe"])[0] if "extra ==" not in r]
    assert [Requirement(r).name for r in probe_base] == ["pydantic"]
    operator = [Requirement(r) for r in _metadata(wheels["sdcguard"])[0]]
    pins = {str(r.specifier) for r in operator if r.name == "sdcprobe"}
    assert pins == {f"=={sdcprobe.__version__}"}
    assert wheels["sdcprobe"].name.startswith(f"sdcprobe-{sdcprobe.__version__}-")
    assert wheels["sdctrain"].name.startswith(f"sdctrain-{sdctrain.__version__}-")


def test_the_dev_venv_satisfies_every_distributions_requirements(
    wheels: dict[str, Path],
) -> None:
    """The venv installs each project once (tests/venv_requirements.py skips a name seen
    before): the version it holds must fall in every distribution's range."""
    wanted = [
        Requirement(r)
        for name in PROJECTS
        for r in _metadata(wheels[name])[0]
        if Requirement(r).marker is None or Requirement(r).marker.evaluate({"extra": "xla"})
    ]
    unmet = []
    for req in wanted:
        if canonicalize_name(req.name) in venv_requirements.OWN:
            continue
        have = importlib.metadata.version(req.name)
        if not req.specifier.contains(have, prereleases=True):
            unmet.append(f"{req} (the venv has {have})")
    assert not unmet
    listed = {
        venv_requirements.project_name(r) for g in venv_requirements.requirement_lists() for r in g
    }
    assert {canonicalize_name(r.name) for r in wanted} - venv_requirements.OWN <= listed


def _torch_closure() -> list[importlib.metadata.Distribution]:
    """torch's distribution and everything it requires on this platform, from this venv."""
    seen: dict[str, importlib.metadata.Distribution] = {}
    todo = ["torch"]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        dist = importlib.metadata.distribution(name)
        seen[name] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


def _torch_only_dir(into: Path) -> Path:
    """A folder of links to torch's closure in this venv (its packages and dist-infos),
    so a clean venv sees torch without the 4 GB copy and without anything else here."""
    site = Path(sysconfig.get_paths()["purelib"])
    into.mkdir()
    for dist in _torch_closure():
        for entry in {Path(str(f)).parts[0] for f in dist.files or []}:
            if entry in ("..", "__pycache__") or not (site / entry).exists():
                continue
            if not (into / entry).exists():
                (into / entry).symlink_to(site / entry)
    return into


def test_sdctrain_installs_and_runs_with_torch_alone(
    wheels: dict[str, Path], tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PIP_NO_INDEX": "1"}
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q"]
    install = subprocess.run(
        [*pip, str(wheels["sdctrain"])],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert install.returncode == 0, install.stderr
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout.strip()
    Path(purelib, "torch-only.pth").write_text(f"{_torch_only_dir(tmp_path / 'torch')}\n")
    check = textwrap.dedent(
        f"""
        import importlib, importlib.metadata, importlib.util, pkgutil, sys
        import torch
        import sdctrain
        from sdctrain.digest import tensor_digest

        assert sdctrain.__file__.startswith({purelib!r}), sdctrain.__file__
        for mod in pkgutil.iter_modules(sdctrain.__path__, "sdctrain."):
            importlib.import_module(mod.name)
        present = [m for m in {OPERATOR_AND_PROBE!r} if importlib.util.find_spec(m)]
        assert not present, f"the clean venv can import {{present}}"
        assert importlib.metadata.requires("sdctrain") == ["torch>=2.9"]
        a = tensor_digest(torch.arange(16, dtype=torch.float32)).tolist()
        assert a == tensor_digest(torch.arange(16, dtype=torch.float32)).tolist(), a
        assert a != tensor_digest(torch.arange(1, 17, dtype=torch.float32)).tolist()
        print("ok", torch.__version__)
        """
    )
    proc = subprocess.run(
        [python, "-c", check], capture_output=True, text=True, env=env, cwd=tmp_path, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("ok 2.9")
    cli = subprocess.run(
        [str(venv / "bin" / "sdctrain"), "--help"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert cli.returncode == 0, cli.stderr[-3000:]
