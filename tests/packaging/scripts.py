"""The build scripts under ``images/`` (not a package), loaded as modules for tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load(name: str) -> ModuleType:
    """``images/NAME.py`` as a module named ``images_NAME``."""
    spec = importlib.util.spec_from_file_location(f"images_{name}", ROOT / "images" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
