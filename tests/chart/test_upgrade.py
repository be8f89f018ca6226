"""An upgrade on a real control plane keeps the data and the lifecycle goes on.

The chart and operator as released before v1beta1 (``RELEASED``, taken from this
repository's history) are installed on a fresh control plane of their own (the CRDs
are cluster-wide, and the shared session's already store v1beta1). The released
operator makes live state: a quarantined node with an open ticket and its hardware
history, a trusted baseline, a suspect held while its re-test runs. Then `helm
upgrade` to this tree's chart (``--take-ownership``: the released chart installed its
CRDs from crds/, outside the release), `kubectl sdc migrate-storage`, and this tree's
operator: nothing is lost, the quarantined node is repaired, verified and returned,
the suspect is cleared. A downgrade of the CRDs is refused by the API server."""

from __future__ import annotations

import io
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from sdcdev.cluster.localcluster import LocalCluster
from sdcdev.harness import (
    NS,
    QUARANTINE,
    TESTING,
    OperatorProcess,
    ProbeKubelet,
    annotate,
    create_policy,
    gpu_nodes,
    list_custom,
    new_case,
    node_state,
    taint_keys,
    ticket_in_phase,
    trusted_baseline,
    wait_for,
)
from sdcguard.cli.main import main as kubectl_sdc
from tests.chart.helm import CHART, ROOT, run_helm

pytestmark = pytest.mark.cluster

RELEASED = "2d26c86"
"""The last commit whose chart stored v1alpha1 and shipped its CRDs in crds/."""
KINDS = ("sdcpolicies", "sdctests", "repairtickets", "sdcbaselines", "sdchardwares")
GROUP = "sdcguard.dev"


def _released_tree(dest: Path) -> Path:
    """The chart, operator and probe packages of ``RELEASED``, unpacked under ``dest``."""
    proc = subprocess.run(
        ["git", "-C", str(ROOT), "archive", RELEASED, "charts/sdcguard", "operator", "jobs"],
        capture_output=True,
        check=False,
    )
    assert proc.returncode == 0, (
        f"git archive {RELEASED} failed (a checkout without that history cannot run the "
        f"upgrade test): {proc.stderr.decode(errors='replace')}"
    )
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return dest


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[tuple[LocalCluster, client.ApiClient]]:
    with LocalCluster() as cluster:
        yield cluster, config.new_client_from_config(str(cluster.kubeconfig))


def _counts(api: client.ApiClient, version: str) -> dict[str, int]:
    custom = client.CustomObjectsApi(api)
    return {k: len(custom.list_cluster_custom_object(GROUP, version, k)["items"]) for k in KINDS}


def _stored(api: client.ApiClient, plural: str) -> list[str]:
    crd = client.ApiextensionsV1Api(api).read_custom_resource_definition(f"{plural}.{GROUP}")
    return list(crd.status.stored_versions or [])


def _operator(cluster: LocalCluster, log: Path, tree: Path | None) -> OperatorProcess:
    env = {}
    if tree is not None:
        env["PYTHONPATH"] = f"{tree / 'operator'}:{tree / 'jobs'}"
    return OperatorProcess(cluster.kubeconfig, log, env).start()


def test_helm_upgrade_keeps_the_data_and_the_lifecycle_goes_on(
    fresh: tuple[LocalCluster, client.ApiClient], tmp_path: Path
) -> None:
    cluster, api = fresh
    old = _released_tree(tmp_path / "released")
    # No policy of the chart's (the test's own selects its nodes), and the operator Pod
    # (no kubelet runs it) kept off the nodes, where it would count as their work.
    values: dict[str, Any] = {
        "policy": {"create": False},
        "nodeSelector": {"sdcguard.test/operator-pod": "nowhere"},
    }
    run_helm("install", "sdcguard", str(old / "charts" / "sdcguard"), "--namespace", NS,
             "--create-namespace", env=cluster.env(), values=values)  # fmt: skip
    assert _stored(api, "sdctests") == ["v1alpha1"]

    case = new_case()
    bad, held, good = (f"up-{case}-{i}" for i in range(3))
    outcomes = {bad: "sdc", held: "pass", good: "pass"}
    custom = client.CustomObjectsApi(api)
    released = _operator(cluster, tmp_path / "released.log", old)
    try:
        with gpu_nodes(api, [bad, held, good], case=case), ProbeKubelet(api, outcomes):
            trusted_baseline(api)
            create_policy(api, case)
            ticket = wait_for(lambda: ticket_in_phase(api, bad, "Open"), 120, "the quarantine")
            for n in (held, good):
                wait_for(lambda n=n: node_state(api, n) == "Qualified", 90, f"{n} qualified")
            outcomes[held] = "never"  # its re-test runs on through the upgrade
            annotate(api, held, {"sdcguard.dev/suspect": "reported by a training job"})
            wait_for(
                lambda: node_state(api, held) == "Suspect" and TESTING in taint_keys(api, held),
                60,
                "the held suspect",
            )
            wait_for(lambda: list_custom(api, "sdchardwares"), 30, "the hardware history")
            released.stop()  # the chart's Deployment is Recreate: the old one stops first

            before = _counts(api, "v1alpha1")
            assert all(before.values()), before
            run_helm("upgrade", "sdcguard", str(CHART), "--namespace", NS, "--take-ownership",
                     env=cluster.env(), values=values)  # fmt: skip
            crd = client.ApiextensionsV1Api(api).read_custom_resource_definition(
                f"sdctests.{GROUP}"
            )
            assert {v.name: v.storage for v in crd.spec.versions} == {
                "v1beta1": True,
                "v1alpha1": False,
            }
            assert crd.metadata.annotations["helm.sh/resource-policy"] == "keep"
            assert _counts(api, "v1beta1") == before == _counts(api, "v1alpha1")

            rc = kubectl_sdc(["--kubeconfig", str(cluster.kubeconfig), "migrate-storage"])
            assert rc == 0
            assert all(_stored(api, k) == ["v1beta1"] for k in KINDS)
            assert _counts(api, "v1beta1") == before
            assert node_state(api, bad) == "Quarantined" and QUARANTINE in taint_keys(api, bad)
            assert node_state(api, held) == "Suspect" and TESTING in taint_keys(api, held)

            current = _operator(cluster, tmp_path / "current.log", None)
            try:
                outcomes[bad] = outcomes[held] = "pass"
                custom.patch_cluster_custom_object(
                    GROUP, "v1beta1", "repairtickets", ticket["metadata"]["name"],
                    {"spec": {"resolution": "Repaired", "resolutionNote": "GPU reseated"}},
                )  # fmt: skip
                wait_for(lambda: node_state(api, bad) == "Qualified", 120, "the repaired node")
                closed = ticket_in_phase(api, bad, "Closed")
                assert (
                    closed is not None and closed["metadata"]["name"] == ticket["metadata"]["name"]
                )
                # The uncordon is sdcguard's; the node controller drops its own
                # node.kubernetes.io/unschedulable taint a moment later.
                wait_for(lambda: not taint_keys(api, bad), 30, "the repaired node untainted")
                wait_for(lambda: node_state(api, held) == "Qualified", 120, "the cleared suspect")
                assert list_custom(api, "sdchardwares")  # history kept
            except BaseException:
                print(current.log_tail())
                raise
            finally:
                current.stop()
    finally:
        released.stop()

    # Downgrade: the released CRDs know only v1alpha1, and v1beta1 is stored now.
    old_crd = yaml.safe_load(
        (old / "charts" / "sdcguard" / "crds" / f"sdctests.{GROUP}.yaml").read_text()
    )
    ext = client.ApiextensionsV1Api(api)
    old_crd["metadata"]["resourceVersion"] = ext.read_custom_resource_definition(
        f"sdctests.{GROUP}"
    ).metadata.resource_version
    with pytest.raises(ApiException) as refused:
        ext.replace_custom_resource_definition(f"sdctests.{GROUP}", old_crd)
    assert refused.value.status == 422 and "storedVersions" in str(refused.value.body)
