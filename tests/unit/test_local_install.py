"""``make cluster-up`` prints the exact ``helm install`` for its own cluster: the values
it writes carry the images built here and the API server's port, no placeholders."""

from __future__ import annotations

import shlex
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import yaml

from sdcdev.cluster.localcluster import LocalCluster
from sdcdev.cluster.operator_pod import install_command


def test_the_printed_install_names_the_images_and_the_api_server(tmp_path: Path) -> None:
    node = SimpleNamespace(
        image_refs={
            "operator": "localhost/sdcguard-operator:0a1b2c",
            "probe": "localhost/sdcguard-probe:3d4e5f",
        }
    )
    cluster = cast(
        LocalCluster,
        SimpleNamespace(node=node, server="https://127.0.0.1:43210", state_dir=tmp_path),
    )
    words = shlex.split(install_command(cluster))
    assert words[:3] == ["helm", "install", "sdcguard"]
    assert words[words.index("-n") + 1] == "sdcguard-system"
    values = yaml.safe_load(Path(words[words.index("-f") + 1]).read_text())
    assert values["image"] == {
        "repository": "localhost/sdcguard-operator",
        "tag": "0a1b2c",
        "pullPolicy": "Never",
    }
    assert values["probe"]["image"] == {"repository": "localhost/sdcguard-probe", "tag": "3d4e5f"}
    env = values["operator"]["extraEnv"]
    assert env["KUBERNETES_SERVICE_PORT"] == {"value": "43210"}
    assert "HASH" not in str(values) and "API-SERVER-PORT" not in str(values)
