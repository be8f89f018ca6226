"""Which probe may pass a screening: the nonce and key of one SDCTest.

Both are derived from the operator's attestation key (a Secret the chart makes) and the
test's uid, so the operator needs no store for them and can check a result after a
restart: ``nonce = HMAC(key, "nonce/" + uid)`` cut to 32 hex characters, ``key =
HMAC(key, "key/" + uid)``. When it creates the test's Job it writes them into a Secret
in its namespace that only that Job's Pod mounts; the probe seals its result with
them (``sdcprobe.attest``). Nobody else can compute them without the operator's key.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from sdcprobe import attest

#: The per-test Secret's data keys (the files the probe reads).
NONCE_FILE, KEY_FILE = "nonce", "key"


@dataclass(frozen=True)
class Attestation:
    """The nonce and key one screening's result must be sealed with."""

    nonce: str
    key: bytes

    @classmethod
    def derive(cls, operator_key: bytes, test_uid: str) -> Attestation:
        def part(label: str) -> bytes:
            return hmac.new(operator_key, f"{label}/{test_uid}".encode(), hashlib.sha256).digest()

        return cls(nonce=part("nonce").hex()[: attest.NONCE_CHARS], key=part("key"))

    def secret_data(self) -> dict[str, str]:
        """The per-test Secret's ``stringData``."""
        return {NONCE_FILE: self.nonce, KEY_FILE: self.key.hex()}

    def open(self, message: str) -> tuple[str | None, str]:
        """The result document sealed in ``message`` for this screening, or (None, why)."""
        return attest.unseal(message, self.key, self.nonce)
