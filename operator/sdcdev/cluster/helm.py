"""Running the helm binary that ``tests/cluster/build-binaries.sh`` builds, against the chart."""

from __future__ import annotations

import functools
import os
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from sdcdev import REPO
from sdcdev.cluster.localcluster import binary_path, find_binary

CHART = REPO / "charts" / "sdcguard"


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
