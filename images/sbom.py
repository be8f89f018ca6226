"""A CycloneDX SBOM of an image's file tree: its Python distributions and Debian packages.

    python3 images/sbom.py ROOT NAME VERSION > NAME.cdx.json

ROOT is the image's root filesystem, mounted (``buildah mount``): every
``site-packages`` or ``dist-packages`` folder under its usual prefixes is read with
``importlib.metadata`` (the dist-info records pip wrote), and ``var/lib/dpkg/status``
for the Debian packages of the base. Nothing runs inside the image, and the script
needs nothing but the standard library, so ``images/build.sh`` runs it with the
build machine's Python after each build. The output is deterministic for one tree
(sorted components, a serial number derived from them).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import json
import re
import sys
import uuid
from pathlib import Path
from typing import Any

PREFIXES = ("opt", "usr/lib", "usr/local/lib")
"""Where an image keeps Python packages (a venv in /opt, Debian's and pip's)."""


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def python_components(root: Path) -> list[dict[str, Any]]:
    """One component per installed Python distribution under ``root``."""
    folders = sorted(
        str(p)
        for prefix in PREFIXES
        if (root / prefix).is_dir()
        for pattern in ("**/site-packages", "**/dist-packages")
        for p in (root / prefix).glob(pattern)
        if p.is_dir()
    )
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for dist in md.distributions(path=folders):
        name, version = dist.metadata.get("Name"), dist.version
        if not name or not version:
            continue
        purl = f"pkg:pypi/{_normal(name)}@{version}"
        component: dict[str, Any] = {
            "type": "library",
            "bom-ref": purl,
            "name": name,
            "version": version,
            "purl": purl,
        }
        licence = dist.metadata.get("License-Expression") or dist.metadata.get("License")
        if licence and len(licence) <= 200 and "\n" not in licence:
            component["licenses"] = [{"license": {"name": licence}}]
        found[(_normal(name), version)] = component
    return [found[k] for k in sorted(found)]


def debian_components(root: Path) -> list[dict[str, Any]]:
    """One component per installed Debian package (``var/lib/dpkg/status``)."""
    status = root / "var" / "lib" / "dpkg" / "status"
    if not status.is_file():
        return []
    found: dict[str, dict[str, Any]] = {}
    for block in status.read_text(errors="replace").split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.splitlines() if ": " in line and line[0] != " "
        )
        if "installed" not in fields.get("Status", "") or not fields.get("Package"):
            continue
        name, version = fields["Package"], fields.get("Version", "")
        arch = fields.get("Architecture", "")
        purl = f"pkg:deb/debian/{name}@{version}" + (f"?arch={arch}" if arch else "")
        found[purl] = {
            "type": "library",
            "bom-ref": purl,
            "name": name,
            "version": version,
            "purl": purl,
        }
    return [found[k] for k in sorted(found)]


def sbom(root: Path, name: str, version: str) -> dict[str, Any]:
    """The CycloneDX 1.5 document for the image tree at ``root``."""
    components = python_components(root) + debian_components(root)
    digest = hashlib.sha256(
        json.dumps([name, version, components], sort_keys=True).encode()
    ).hexdigest()
    return {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": f"urn:uuid:{uuid.UUID(digest[:32])}",
        "version": 1,
        "metadata": {
            "component": {
                "type": "container",
                "bom-ref": f"{name}@{version}",
                "name": name,
                "version": version,
            },
            "tools": {"components": [{"type": "application", "name": "sdcguard images/sbom.py"}]},
        },
        "components": components,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("name")
    parser.add_argument("version")
    args = parser.parse_args(argv)
    if not args.root.is_dir():
        parser.error(f"{args.root} is not a folder")
    document = sbom(args.root, args.name, args.version)
    if not document["components"]:
        print(f"error: no Python or Debian packages found under {args.root}", file=sys.stderr)
        return 1
    json.dump(document, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
