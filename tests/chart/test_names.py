"""One probe image name and one install instruction for the plugin, everywhere a user reads
them: the chart's values, the operator's default, the README examples, the Dockerfiles'
build lines, NOTES.txt and the docs."""

from __future__ import annotations

import re
import subprocess

import yaml

from sdcguard.settings import Settings
from tests.chart.helm import CHART, ROOT

# An image reference naming sdcprobe: on a registry host (it has a dot), or with a tag
# ("sdcguard/sdcprobe-cuda:1", "sdcprobe:cuda"). Source paths (jobs/sdcprobe) are neither.
IMAGE_REF = re.compile(
    r"[a-z0-9-]+(?:\.[a-z0-9-]+)+(?::[0-9]+)?/(?:[a-z0-9._-]+/)*sdcprobe[a-z0-9_-]*"
    r"(?::[A-Za-z0-9._-]+)?"
    r"|(?<![\w/.-])(?:[a-z0-9_-]+/)*sdcprobe[a-z0-9-]*:[A-Za-z0-9][A-Za-z0-9._-]*"
)
PIP_INSTALL = re.compile(r"pip install [^`\n)]*")


def _user_facing_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [
        path
        for path in listed
        # The harness names a fake probe image for the operator tests' Pods.
        if not path.startswith(("tests/", "bench/results/", "operator/sdcdev/harness.py"))
        and (
            path.endswith((".md", ".txt", ".yaml", ".py", ".tpl", ".json")) or "Dockerfile" in path
        )
    ]


def _chart_probe_image() -> tuple[str, str]:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    return values["probe"]["image"]["repository"], version


def test_one_probe_image_name_everywhere() -> None:
    repository, version = _chart_probe_image()
    allowed = {f"{repository}:{version}{suffix}" for suffix in ("", "-tpu", "-neuron")}
    assert Settings.model_fields["default_probe_image"].default == f"{repository}:{version}"
    found: dict[str, list[str]] = {}
    for path in _user_facing_files():
        text = (ROOT / path).read_text(errors="replace")
        for ref in IMAGE_REF.findall(text):
            found.setdefault(ref, []).append(path)
    # The repository without a tag is the chart's value (and the README row that shows it).
    others = {ref: paths for ref, paths in found.items() if ref not in allowed | {repository}}
    assert not others, f"probe image named otherwise than {sorted(allowed)}: {others}"
    assert f"{repository}:{version}" in found  # the README example and the Dockerfile


def test_one_install_instruction_for_the_plugin() -> None:
    instructions: dict[str, list[str]] = {}
    for path in ("README.md", "charts/sdcguard/README.md", "charts/sdcguard/templates/NOTES.txt"):
        text = (ROOT / path).read_text()
        for found in PIP_INSTALL.findall(text):
            instructions.setdefault(found.strip(), []).append(path)
    # sdcguard requires sdcprobe, which no package index serves: both come from the checkout.
    assert set(instructions) == {"pip install ./jobs/sdcprobe ."}, instructions
    assert len({p for paths in instructions.values() for p in paths}) == 3
