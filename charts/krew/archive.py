#!/usr/bin/env python3
"""Build the krew archive of the sdc plugin: the same bytes on every machine.

krew checks an archive against the sha256 in the manifest (sdc.yaml), also when it is
given with --archive. So the archive is a zip of stored (uncompressed) entries with fixed
times and modes: no compressor version can change its bytes, and the sha256 in the
manifest is the sha256 of what this script builds from the launcher scripts beside it.

    python3 charts/krew/archive.py sdc.zip        # build it (prints its sha256)
    python3 charts/krew/archive.py --check        # does sdc.yaml name this archive?
    python3 charts/krew/archive.py --update       # write the sha256 into sdc.yaml
"""

from __future__ import annotations

import argparse
import hashlib
import io
import re
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "sdc.yaml"
FILES = ("kubectl-sdc", "kubectl_complete-sdc")
"""What the archive holds: the plugin's launcher and its kubectl completion hook."""
FIXED_TIME = (1980, 1, 1, 0, 0, 0)
SHA_LINE = re.compile(r"^(\s*sha256:\s*)([0-9a-f]{64})\s*$", re.MULTILINE)


def build() -> bytes:
    """The archive's bytes."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as archive:
        for name in FILES:
            info = zipfile.ZipInfo(name, date_time=FIXED_TIME)
            info.create_system = 3  # unix, so that the mode below is honoured
            info.external_attr = (0o100755 & 0xFFFF) << 16
            archive.writestr(info, (HERE / name).read_bytes())
    return out.getvalue()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest_sha256(text: str) -> list[str]:
    """The sha256 values the manifest names (one per platform)."""
    return [m.group(2) for m in SHA_LINE.finditer(text)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", nargs="?", help="where to write the archive")
    parser.add_argument("--check", action="store_true", help="compare with sdc.yaml")
    parser.add_argument("--update", action="store_true", help="write the sha256 into sdc.yaml")
    args = parser.parse_args(argv)
    data = build()
    digest = sha256(data)
    if args.output:
        Path(args.output).write_bytes(data)
    if args.update:
        text = MANIFEST.read_text()
        MANIFEST.write_text(SHA_LINE.sub(lambda m: m.group(1) + digest, text))
    if args.check:
        named = manifest_sha256(MANIFEST.read_text())
        if not named or any(n != digest for n in named):
            print(
                f"sdc.yaml names sha256 {', '.join(named) or 'none'}, the archive is {digest}: "
                "run python3 charts/krew/archive.py --update",
                file=sys.stderr,
            )
            return 1
    print(digest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
