"""Rendering the chart with helm and picking objects out of the result."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml

from sdcdev import REPO as ROOT
from sdcdev.cluster.helm import CHART, run_helm

__all__ = ["CHART", "ROOT", "find", "find_all", "render", "render_error", "run_helm"]


def render(
    values: Any = None,
    *,
    release: str = "sdcguard",
    namespace: str = "sdcguard-system",
    extra: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """``helm template`` output as a list of objects."""
    proc = run_helm(
        "template", release, str(CHART), "--namespace", namespace, *extra, values=values
    )
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def render_error(values: Any, *, namespace: str = "sdcguard-system") -> str:
    """stderr of a ``helm template`` that must fail."""
    proc = run_helm(
        "template", "sdcguard", str(CHART), "--namespace", namespace, values=values, check=False
    )
    assert proc.returncode != 0, f"helm template accepted {values!r}"
    return proc.stderr


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def find_all(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]
