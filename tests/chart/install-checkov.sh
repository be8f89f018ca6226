#!/usr/bin/env bash
# A venv of its own for the manifest scanner (checkov), outside the checkout and
# keyed by its version: its pins would clash with the project's venv, and it is a
# test tool only. Prints the path of its checkov executable.
set -euo pipefail
CHECKOV_VERSION="${CHECKOV_VERSION:-3.3.30}"
CACHE="${SDCGUARD_CACHE:-$HOME/.cache/sdcguard}"
VENV="$CACHE/checkov-$CHECKOV_VERSION"
PYTHON3="${PYTHON3:-python3}"
if [ ! -f "$VENV/.complete" ]; then
  echo "[checkov] creating $VENV (checkov $CHECKOV_VERSION, first time on this machine)" >&2
  rm -rf "$VENV"
  "$PYTHON3" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
  "$VENV/bin/python" -m pip install --progress-bar on "checkov==$CHECKOV_VERSION" >&2
  "$VENV/bin/checkov" --version >/dev/null
  touch "$VENV/.complete"
  echo "[checkov] ready" >&2
fi
echo "$VENV/bin/checkov"
