"""The real node: a control plane with a containerd + kubelet node, started once per session.

Needs root, cgroups and the Debian packages ``tests/cluster/node/setup-host.sh``
installs (it installs them when missing). A host without them fails these tests
with a message saying what is missing; they are not skipped.

Only one real node runs per machine (the kubelet's device-plugin directory is
fixed), so these tests live in one test group and share one node.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sdcdev.cluster import realnode
from sdcdev.cluster.localcluster import LocalCluster


def leftovers(node_dir: Path, containerd_root: Path, record: dict[str, object]) -> list[str]:
    """What a stopped node left on the host: processes, mounts, namespaces, bridge, cgroups."""
    found = [f"process {pid}" for pid in realnode._pids_matching(str(node_dir))]
    found += [f"mount {m}" for m in realnode._mounts_under(node_dir, containerd_root)]
    found += [f"mount {m}" for m in realnode._mounts_under(realnode.DEVICE_PLUGIN_DIR.parent)]
    found += [f"netns {ns}" for ns in realnode._new_netns(record)]
    for link, key in (
        (realnode.BRIDGE, "bridge_created"),
        (realnode.NODE_LINK, "node_link_created"),
    ):
        if record.get(key) and Path(f"/sys/class/net/{link}").exists():
            found.append(f"link {link}")
    found += [f"cgroup {c}" for c in record.get("cgroups_created", []) if Path(str(c)).exists()]  # type: ignore[union-attr]
    shims = [
        pid
        for pid in realnode._pids_matching("containerd-shim")
        if str(node_dir) in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
        or "k8s.io" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    ]
    found += [f"shim {pid}" for pid in shims]
    return found


@pytest.fixture(scope="session")
def real_cluster() -> Iterator[LocalCluster]:
    """A control plane with one real node (``real-node-0``: containerd, 2 x nvidia.com/gpu)."""
    import json

    c = LocalCluster(real_node=True)
    with c:
        assert c.node is not None
        node_dir = c.node.node_dir
        record = json.loads((node_dir / "created.json").read_text())
        os.environ["SDCGUARD_REAL_NODE_KUBECONFIG"] = str(c.kubeconfig)
        yield c
    left = leftovers(node_dir, realnode.RealNode.containerd_root_dir(), record)
    assert not left, f"the real node left these behind after stop: {left}"


def kubectl(cluster: LocalCluster, *args: str) -> str:
    proc = subprocess.run(
        ["kubectl", *args], env=cluster.env(), capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, f"kubectl {' '.join(args)}: {proc.stderr}"
    return proc.stdout


def kubectl_items(cluster: LocalCluster, kind: str, *args: str) -> list[dict[str, Any]]:
    """``kubectl get KIND ARGS -o json``'s items."""
    items: list[dict[str, Any]] = json.loads(kubectl(cluster, "get", kind, *args, "-o", "json"))[
        "items"
    ]
    return items
