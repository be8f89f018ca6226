"""Running helm against the chart, with or without the local control plane."""

from __future__ import annotations

import functools
import os
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.localcluster import binary_path, find_binary

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "sdcguard"


@functools.cache
def helm_binary() -> str:
    return find_binary("helm", binary_path())


def run_helm(
    *args: str, env: Mapping[str, str] | None = None, check: bool = True, values: Any = None
) -> subprocess.CompletedProcess[str]:
    """Run helm; ``values`` (a dict) is passed as a values file."""
    argv = [helm_binary(), *args]
    with tempfile.TemporaryDirectory() as tmp:
        if values is not None:
            path = Path(tmp) / "values.yaml"
            path.write_text(yaml.safe_dump(values))
            argv += ["-f", str(path)]
        # helm keeps caches and a registry config under $HOME; keep them out of the way.
        base_env = dict(env if env is not None else os.environ)
        base_env.setdefault("HELM_CACHE_HOME", str(Path(tmp) / "cache"))
        base_env.setdefault("HELM_CONFIG_HOME", str(Path(tmp) / "config"))
        base_env.setdefault("HELM_DATA_HOME", str(Path(tmp) / "data"))
        proc = subprocess.run(
            argv, capture_output=True, text=True, env=base_env, check=False, timeout=180
        )
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


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
