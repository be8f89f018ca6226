"""Paths of the docs site and its tools, and the tools loaded from their files (docs/
is no package: the site's hook and these tests load them the same way)."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
TOOLS = DOCS / "tools"
INSTALL_SCRIPT = TOOLS / "install-mkdocs.sh"


def load_tool(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"docs_tools_{name}", TOOLS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def site_pages() -> list[Path]:
    """The Markdown sources of the site, without its tools."""
    return sorted(p for p in DOCS.rglob("*.md") if TOOLS not in p.parents)


def mkdocs_executable() -> Path | None:
    """The docs venv's mkdocs when `make mkdocs` has installed it, else None. The
    venv's path is the install script's: the cache folder and the pinned versions."""
    text = INSTALL_SCRIPT.read_text()
    versions = {
        key: re.search(rf'{key}="\$\{{{key}:-([^}}]+)\}}"', text)
        for key in ("MKDOCS_VERSION", "MATERIAL_VERSION")
    }
    if not all(versions.values()):
        raise AssertionError(f"cannot read the pinned versions from {INSTALL_SCRIPT}")
    mkdocs = versions["MKDOCS_VERSION"]
    material = versions["MATERIAL_VERSION"]
    assert mkdocs is not None and material is not None
    cache = Path(os.environ.get("SDCGUARD_CACHE", Path.home() / ".cache" / "sdcguard"))
    venv = cache / f"docs-{mkdocs.group(1)}-material-{material.group(1)}"
    if not (venv / ".complete").is_file():
        return None
    return venv / "bin" / "mkdocs"
