"""Sealing the result to its screening: a nonce and an HMAC-SHA256 after the document.

The operator gives each screening's probe Pod, and that Pod alone, a Secret with a
``nonce`` and a ``key`` (hex), mounted at ``$SDCPROBE_ATTEST_DIR``. The probe writes
its termination message as the result document, a newline, and the trailer

    sdcprobe-mac v1 <nonce> <hex HMAC-SHA256(key, nonce + "\\n" + document bytes)>

The operator recomputes the MAC with the key it derived for that screening: a
result written by anyone without the key (another Pod, a ``pods/status`` write), or
sealed for another screening, does not verify and is never a pass.

Standard library only: the operator imports this module to open sealed results.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping
from pathlib import Path

ENV = "SDCPROBE_ATTEST_DIR"
"""Environment variable naming the folder of the mounted Secret (files nonce, key)."""
PREFIX = "sdcprobe-mac v1 "
NONCE_CHARS = 32
"""Hex characters of a nonce."""
OVERHEAD = 1 + len(PREFIX) + NONCE_CHARS + 1 + 64
"""Bytes the trailer adds to the document (the newline included)."""


def mac(key: bytes, nonce: str, document: str) -> str:
    """Hex HMAC-SHA256 of ``nonce``, a newline and ``document`` (UTF-8) under ``key``."""
    message = nonce.encode() + b"\n" + document.encode("utf-8")
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def load(env: Mapping[str, str] | None = None) -> tuple[bytes, str] | None:
    """(key, nonce) from the mounted Secret, None when no Secret is mounted.

    Raises ValueError for a folder that is there but unreadable or malformed: a
    screening meant to be sealed must not write an unsealed result silently."""
    folder = (env if env is not None else os.environ).get(ENV, "")
    if not folder:
        return None
    try:
        key_hex = (Path(folder) / "key").read_text().strip()
        nonce = (Path(folder) / "nonce").read_text().strip()
        key = bytes.fromhex(key_hex)
    except (OSError, ValueError) as exc:
        raise ValueError(f"attestation secret in {folder} unreadable: {exc}") from exc
    if len(key) < 16 or len(nonce) != NONCE_CHARS:
        raise ValueError(f"attestation secret in {folder} malformed")
    return key, nonce


def seal(document: str, key: bytes, nonce: str) -> str:
    """``document`` followed by its trailer."""
    return f"{document}\n{PREFIX}{nonce} {mac(key, nonce, document)}"


def unseal(message: str, key: bytes, nonce: str) -> tuple[str | None, str]:
    """(the document, "") when ``message`` is sealed with ``key`` for ``nonce``; else
    (None, why not)."""
    document, newline, trailer = message.rstrip("\n").rpartition("\n")
    if not newline or not trailer.startswith(PREFIX):
        return None, "the result carries no MAC (not sealed by the screening's probe)"
    parts = trailer[len(PREFIX) :].split(" ")
    if len(parts) != 2:
        return None, "the result's MAC trailer is malformed"
    their_nonce, their_mac = parts
    if not hmac.compare_digest(their_nonce, nonce):
        return None, "the result is sealed for another screening (its nonce is not this test's)"
    if not hmac.compare_digest(their_mac, mac(key, nonce, document)):
        return None, "the result's MAC does not verify (written without this test's key)"
    return document, ""
