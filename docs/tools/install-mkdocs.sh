#!/usr/bin/env bash
# A venv of its own for the docs site's builder (MkDocs and its Material theme),
# outside the checkout and keyed by their versions: they are a docs tool only and
# need none of the project's dependencies. Prints the path of its mkdocs executable.
set -euo pipefail
MKDOCS_VERSION="${MKDOCS_VERSION:-1.6.1}"
MATERIAL_VERSION="${MATERIAL_VERSION:-9.6.23}"
CACHE="${SDCGUARD_CACHE:-$HOME/.cache/sdcguard}"
VENV="$CACHE/docs-$MKDOCS_VERSION-material-$MATERIAL_VERSION"
PYTHON3="${PYTHON3:-python3}"
if [ ! -f "$VENV/.complete" ]; then
  echo "[docs] creating $VENV (mkdocs $MKDOCS_VERSION, mkdocs-material $MATERIAL_VERSION, first time on this machine)" >&2
  rm -rf "$VENV"
  "$PYTHON3" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
  "$VENV/bin/python" -m pip install --progress-bar off \
    "mkdocs==$MKDOCS_VERSION" "mkdocs-material==$MATERIAL_VERSION" >&2
  "$VENV/bin/mkdocs" --version >/dev/null
  touch "$VENV/.complete"
  echo "[docs] ready" >&2
fi
echo "$VENV/bin/mkdocs"
