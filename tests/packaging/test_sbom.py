"""images/sbom.py: the CycloneDX SBOM ``make images`` writes beside each image archive,
read from the image's file tree (here a tree that holds this venv's packages and a
Debian status file, as a mounted image does)."""

from __future__ import annotations

import importlib.metadata as md
import json
import site
from pathlib import Path
from types import ModuleType

import pytest

from tests.packaging.scripts import load

ROOT = Path(__file__).resolve().parents[2]

DPKG_STATUS = """Package: python3.11
Status: install ok installed
Architecture: amd64
Version: 3.11.2-6+deb12u6
Description: Interactive high-level object-oriented language
 (version 3.11)

Package: removed-thing
Status: deinstall ok config-files
Version: 1.0

Package: libstdc++6
Status: install ok installed
Architecture: amd64
Version: 12.2.0-14
"""


def _sbom_module() -> ModuleType:
    return load("sbom")


@pytest.fixture
def image_tree(tmp_path: Path) -> Path:
    venv = Path(site.getsitepackages()[0])
    target = tmp_path / "opt" / "venv" / "lib" / "python3.11" / "site-packages"
    target.parent.mkdir(parents=True)
    target.symlink_to(venv, target_is_directory=True)
    status = tmp_path / "var" / "lib" / "dpkg" / "status"
    status.parent.mkdir(parents=True)
    status.write_text(DPKG_STATUS)
    return tmp_path


def test_the_sbom_lists_the_images_python_and_debian_packages(
    image_tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sbom = _sbom_module()
    assert sbom.main([str(image_tree), "sdcguard-operator", "abc123"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["bomFormat"], doc["specVersion"]) == ("CycloneDX", "1.5")
    assert doc["metadata"]["component"] == {
        "type": "container",
        "bom-ref": "sdcguard-operator@abc123",
        "name": "sdcguard-operator",
        "version": "abc123",
    }
    purls = {c["purl"] for c in doc["components"]}
    assert f"pkg:pypi/pydantic@{md.version('pydantic')}" in purls
    assert f"pkg:pypi/kubernetes@{md.version('kubernetes')}" in purls
    assert "pkg:deb/debian/python3.11@3.11.2-6+deb12u6?arch=amd64" in purls
    assert not any("removed-thing" in p for p in purls)  # not installed
    # The same tree gives the same document.
    assert sbom.sbom(image_tree, "sdcguard-operator", "abc123") == doc


def test_a_tree_without_packages_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _sbom_module().main([str(tmp_path), "x", "1"]) == 1
    assert "no Python or Debian packages" in capsys.readouterr().err
