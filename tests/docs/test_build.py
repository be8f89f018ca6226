"""`make docs`'s build: reference pages from the code, then MkDocs in strict mode.
Runs when the docs venv is installed (`make mkdocs`, which `make test` does)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.helpers import REPO, TOOLS, mkdocs_executable

REFERENCE_PAGES = ("lifecycle.md", "crds.md", "helm-values.md", "metrics.md", "cli.md")


def _generate(out: Path) -> None:
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'operator'}:{REPO / 'jobs'}:{REPO}"}
    subprocess.run(
        [sys.executable, str(TOOLS / "gen_reference.py"), "--out", str(out)],
        check=True,
        env=env,
        capture_output=True,
        text=True,
    )


def test_reference_pages_are_generated_from_the_code(tmp_path: Path) -> None:
    _generate(tmp_path)
    for name in REFERENCE_PAGES:
        assert (tmp_path / name).stat().st_size > 0, name
    assert (
        "<code>spec.<wbr>budgets.<wbr>maxUnavailable</code>" in (tmp_path / "crds.md").read_text()
    )
    metrics = (tmp_path / "metrics.md").read_text()
    assert "`sdcguard_quarantines_total`" in metrics
    assert "`SdcguardCircuitBreakerOpen`" in metrics
    assert "<code>policy.<wbr>mode</code>" in (tmp_path / "helm-values.md").read_text()
    assert "## `blast-radius`" in (tmp_path / "cli.md").read_text()
    assert "| Testing | TestFailed | Quarantined |" in (tmp_path / "lifecycle.md").read_text()


def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    mkdocs = mkdocs_executable()
    if mkdocs is None:
        pytest.skip("the docs venv is not installed: `make mkdocs` (part of `make test`)")
    generated = tmp_path / "generated"
    _generate(generated)
    result = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        env={**os.environ, "SDCGUARD_DOCS_GENERATED": str(generated)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert (tmp_path / "site" / "reference" / "crds" / "index.html").is_file()
    assert (tmp_path / "site" / "benchmarks" / "img" / "scale.png").is_file()
