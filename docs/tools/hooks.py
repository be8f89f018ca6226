"""MkDocs hooks: serve the generated reference pages and the benchmark plots, and fill
the pages' figures from bench/results.

- Reference pages come from ``docs/tools/gen_reference.py`` (run with the project's
  venv, before the build) in ``$SDCGUARD_DOCS_GENERATED`` (default
  ``.docs-generated``); they are served as ``reference/<name>``. Nothing generated
  is kept in git, so a page cannot drift from the code it documents.
- ``bench/results/*.png`` are served as ``benchmarks/img/<name>``: the plots the
  benchmarks drew, not copies that could go stale.
- ``{{ bench:FILE:PATH }}`` placeholders are filled from ``bench/results/FILE.json``
  (``benchfigures``); a placeholder naming no value stops the build.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchfigures

REPO = Path(__file__).resolve().parents[2]
REFERENCE_PAGES = ("lifecycle.md", "crds.md", "helm-values.md", "metrics.md", "cli.md")
_results = benchfigures.Results()


def _generated_folder() -> Path:
    return Path(os.environ.get("SDCGUARD_DOCS_GENERATED", REPO / ".docs-generated"))


def on_files(files: Files, config: Any, **_: Any) -> Files:
    folder = _generated_folder()
    missing = [name for name in REFERENCE_PAGES if not (folder / name).is_file()]
    if missing:
        raise PluginError(
            f"reference pages {', '.join(missing)} are not in {folder}: run "
            f"`python docs/tools/gen_reference.py --out {folder}` with the project's venv "
            "first (`make docs` does)"
        )
    for name in REFERENCE_PAGES:
        files.append(File.generated(config, f"reference/{name}", abs_src_path=str(folder / name)))
    for plot in sorted((REPO / "bench" / "results").glob("*.png")):
        files.append(File.generated(config, f"benchmarks/img/{plot.name}", abs_src_path=str(plot)))
    return files


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    try:
        return benchfigures.fill(markdown, _results)
    except benchfigures.FigureError as error:
        raise PluginError(f"{page.file.src_uri}: {error}") from error
