"""Global flags of kubectl sdc (--kubeconfig, --context, -o) before and after the command,
against the local control plane: every command must use the kubeconfig and context it was
given, wherever on the line they stand, and never fall back to the default one.

Each command runs with the default (``$KUBECONFIG`` or the kubeconfig's current context)
pointing at a dead address and the flag naming the live cluster, which must work; and the
other way round, which must fail naming the dead address. Either alone could pass with a
flag that is ignored; together they prove the named one is used."""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from sdcdev.cluster.localcluster import LocalCluster, free_port
from sdcguard.cli import main

GROUP, VERSION = "sdcguard.dev", "v1alpha1"
pytestmark = pytest.mark.cluster


@dataclass
class Setup:
    live: Path
    """kubeconfig of the local cluster (current context: live)."""
    dead: Path
    """the same credentials, server at a closed port."""
    contexts_dead_current: Path
    """contexts live and dead, current-context dead."""
    contexts_live_current: Path
    """contexts live and dead, current-context live."""
    dead_server: str
    node: str
    ticket: str
    api: client.ApiClient


def _kubeconfig(live_server: str, dead_server: str, ca: Path, token: str, current: str) -> str:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "live", "cluster": {"server": live_server, "certificate-authority": str(ca)}},
            {"name": "dead", "cluster": {"server": dead_server, "certificate-authority": str(ca)}},
        ],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [
            {"name": "live", "context": {"cluster": "live", "user": "admin"}},
            {"name": "dead", "context": {"cluster": "dead", "user": "admin"}},
        ],
        "current-context": current,
    }
    return yaml.safe_dump(doc)


@pytest.fixture(scope="module")
def setup(
    cluster: LocalCluster,
    crds: None,
    api_client: client.ApiClient,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Setup]:
    folder = tmp_path_factory.mktemp("kubeconfigs")
    dead_server = f"https://127.0.0.1:{free_port()}"
    files = {}
    for name, live, current in (
        ("live", cluster.server, "live"),
        ("dead", dead_server, "live"),
        ("contexts-dead-current", cluster.server, "dead"),
        ("contexts-live-current", cluster.server, "live"),
    ):
        path = folder / name
        path.write_text(_kubeconfig(live, dead_server, cluster.ca_file, cluster.token, current))
        files[name] = path
    s = uuid.uuid4().hex[:6]
    node, policy, ticket = f"flags-{s}-gpu-1", f"flags-{s}", f"flags-{s}-gpu-1-1"
    core = client.CoreV1Api(api_client)
    custom = client.CustomObjectsApi(api_client)
    custom.create_cluster_custom_object(
        GROUP,
        VERSION,
        "sdcpolicies",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SDCPolicy",
            "metadata": {"name": policy},
            "spec": {"nodeSelector": {"matchLabels": {"flags-test.sdcguard.dev/run": s}}},
        },
    )
    core.create_node(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": node,
                # Quarantined, so that a release request is one the operator would act on.
                "labels": {"flags-test.sdcguard.dev/run": s, "sdcguard.dev/state": "Quarantined"},
            },
        }
    )
    core.patch_node_status(
        node,
        {"status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"}}},
        _content_type="application/merge-patch+json",
    )
    custom.create_cluster_custom_object(
        GROUP,
        VERSION,
        "repairtickets",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "RepairTicket",
            "metadata": {"name": ticket},
            "spec": {"nodeName": node, "policyRef": policy},
        },
    )
    yield Setup(
        live=files["live"],
        dead=files["dead"],
        contexts_dead_current=files["contexts-dead-current"],
        contexts_live_current=files["contexts-live-current"],
        dead_server=dead_server,
        node=node,
        ticket=ticket,
        api=api_client,
    )
    _delete_tests(api_client, node)
    custom.delete_cluster_custom_object(GROUP, VERSION, "repairtickets", ticket)
    custom.delete_cluster_custom_object(GROUP, VERSION, "sdcpolicies", policy)
    core.delete_node(node)


def _delete_tests(api: client.ApiClient, node: str) -> None:
    custom = client.CustomObjectsApi(api)
    for item in custom.list_cluster_custom_object(GROUP, VERSION, "sdctests")["items"]:
        if item["spec"]["nodeName"] == node:
            custom.delete_cluster_custom_object(
                GROUP, VERSION, "sdctests", item["metadata"]["name"]
            )


def _verbs(setup: Setup) -> dict[str, list[str]]:
    return {
        "status": ["status"],
        "test": ["test", setup.node],
        "quarantine": ["quarantine", setup.node, "--reason", "flags test"],
        "release": ["release", setup.node, "--reason", "flags test"],
        "repaired": ["repaired", setup.ticket, "--note", "flags test"],
        "history": ["history", setup.node],
        "baselines": ["baselines"],
    }


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def _place(verb: list[str], flags: list[str], where: str) -> list[str]:
    if where == "before":
        return [*flags, *verb]
    if where == "after":
        return [*verb, *flags]
    # split: the connection flags before the command, the output flag after it
    return [*flags[:-2], *verb, *flags[-2:]]


VERBS = ["status", "test", "quarantine", "release", "repaired", "history", "baselines"]
PLACES = ["before", "after", "split"]


@pytest.mark.parametrize("where", PLACES)
@pytest.mark.parametrize("verb", VERBS)
def test_named_kubeconfig_is_used(
    setup: Setup, verb: str, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = _verbs(setup)[verb]
    monkeypatch.setenv("KUBECONFIG", str(setup.dead))
    code, out, err = _run(_place(argv, ["--kubeconfig", str(setup.live), "-o", "json"], where))
    assert code == 0, f"kubectl sdc {' '.join(argv)} with --kubeconfig {where}: {err}"
    json.loads(out)  # -o json was honoured wherever it stood
    _delete_tests(setup.api, setup.node)

    monkeypatch.setenv("KUBECONFIG", str(setup.live))
    code, out, err = _run(_place(argv, ["--kubeconfig", str(setup.dead), "-o", "json"], where))
    assert code == 1 and out == ""
    assert f"cannot reach the API server at {setup.dead_server}" in err


@pytest.mark.parametrize("where", PLACES)
@pytest.mark.parametrize("verb", VERBS)
def test_named_context_is_used(
    setup: Setup, verb: str, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = _verbs(setup)[verb]
    monkeypatch.delenv("KUBECONFIG", raising=False)
    flags = ["--kubeconfig", str(setup.contexts_dead_current), "--context", "live", "-o", "yaml"]
    code, out, err = _run(_place(argv, flags, where))
    assert code == 0, f"kubectl sdc {' '.join(argv)} with --context {where}: {err}"
    assert yaml.safe_load(out) is not None and not out.lstrip().startswith("{")
    _delete_tests(setup.api, setup.node)

    # $KUBECONFIG alone, its current context live: --context dead must still win.
    monkeypatch.setenv("KUBECONFIG", str(setup.contexts_live_current))
    code, out, err = _run(_place(argv, ["--context", "dead", "-o", "yaml"], where))
    assert code == 1 and out == ""
    assert f"cannot reach the API server at {setup.dead_server}" in err


def test_table_is_the_default_output(setup: Setup) -> None:
    code, out, err = _run(["--kubeconfig", str(setup.live), "baselines"])
    assert code == 0, err
    with pytest.raises(json.JSONDecodeError):
        json.loads(out)
