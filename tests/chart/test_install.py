"""The chart on the local control plane: install, RBAC as the operator sees it, upgrade,
refused values, uninstall. There is no kubelet, so the operator Pod never runs: these
tests check the objects, which is what helm and the API server decide."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from sdcdev.cluster.localcluster import LocalCluster, free_port, kubeconfig_text
from tests.chart.helm import CHART, ROOT, run_helm
from tests.e2e.helpers import refusals

pytestmark = pytest.mark.cluster


@dataclass
class Release:
    name: str
    namespace: str
    policy: str
    service_account: str
    env: dict[str, str]
    install_output: str
    cluster: LocalCluster

    @property
    def values(self) -> dict[str, Any]:
        return {"policy": {"name": self.policy}}


@pytest.fixture(scope="module")
def release(cluster: LocalCluster) -> Iterator[Release]:
    suffix = uuid.uuid4().hex[:6]
    rel = Release(
        name=f"sdcguard-{suffix}",
        namespace=f"sdc-chart-{suffix}",
        policy=f"chart-{suffix}",
        service_account=f"sdcguard-{suffix}",  # the release name holds the chart name
        env=cluster.env(),
        install_output="",
        cluster=cluster,
    )
    proc = run_helm(
        "install",
        rel.name,
        str(CHART),
        "--namespace",
        rel.namespace,
        "--create-namespace",
        env=rel.env,
        values=rel.values,
    )
    rel.install_output = proc.stdout
    yield rel
    # --no-hooks: with no kubelet the uninstall's cleanup Job could never run (the real
    # node's tests run it: tests/realnode/test_first_user.py).
    run_helm(
        "uninstall", rel.name, "--namespace", rel.namespace, "--no-hooks", env=rel.env, check=False
    )
    subprocess.run(
        ["kubectl", "delete", "namespace", rel.namespace, "--wait=false", "--ignore-not-found"],
        env=rel.env,
        capture_output=True,
        check=False,
    )


def _upgrade(release: Release, values: dict[str, Any]) -> None:
    run_helm(
        "upgrade",
        release.name,
        str(CHART),
        "--namespace",
        release.namespace,
        # An upgrade renders the CRDs, which the session (tests/conftest.py) applied.
        "--take-ownership",
        env=release.env,
        values=values,
    )


def _policy(api_client: client.ApiClient, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = client.CustomObjectsApi(api_client).get_cluster_custom_object(
        "sdcguard.dev", "v1alpha1", "sdcpolicies", name
    )
    return obj


def test_install_creates_the_operator_and_its_policy(
    release: Release, api_client: client.ApiClient
) -> None:
    apps = client.AppsV1Api(api_client)
    dep = apps.read_namespaced_deployment(release.name, release.namespace)
    assert dep.spec.replicas == 1 and dep.spec.strategy.type == "Recreate"
    core = client.CoreV1Api(api_client)
    core.read_namespaced_service_account(release.service_account, release.namespace)
    policy = _policy(api_client, release.policy)
    assert policy["spec"]["mode"] == "Enforce"
    assert [c["name"] for c in policy["spec"]["suites"]["acceptance"]] == [
        "compute",
        "collective",
        "golden",
        "memory",
    ]
    ext = client.ApiextensionsV1Api(api_client)
    for plural in ("sdcpolicies", "sdctests", "repairtickets", "sdcbaselines"):
        crd = ext.read_custom_resource_definition(f"{plural}.sdcguard.dev")
        established = {c.type: c.status for c in crd.status.conditions}
        assert established.get("Established") == "True"
    client.SchedulingV1Api(api_client).read_priority_class(f"{release.name}-probe")


def test_notes_say_what_to_do_next(release: Release) -> None:
    notes = release.install_output
    for hint in (
        "kubectl get sdcguard",
        "kubectl sdc status",
        "kubectl label node NODE sdcguard.dev/exclude=true",
        "--startup-taint=sdcguard.dev/unqualified",
        "https://github.com/sdcguard/sdcguard",
        f"helm test {release.name} -n {release.namespace}",
    ):
        assert hint in notes, f"NOTES.txt lacks {hint!r}:\n{notes}"


# (verb, resource, namespace or "*" for all namespaces or "" for cluster-scoped)
ALLOWED = [
    # A Pod's top owner, read one object at a time for the blast radius (get, never list).
    ("get", "jobs.batch", "default"),
    ("get", "statefulsets.apps", "team-a"),
    ("list", "nodes", ""),
    ("watch", "nodes", ""),
    ("patch", "nodes", ""),
    ("list", "pods", "*"),
    ("watch", "pods", "*"),
    ("create", "jobs.batch", "{ns}"),
    # The operator's mirror of its probe Jobs, in its own namespace only.
    ("watch", "jobs.batch", "{ns}"),
    ("list", "jobs.batch", "{ns}"),
    ("delete", "jobs.batch", "{ns}"),
    ("get", "secrets", "{ns}"),
    # One attestation Secret per screening, in its own namespace only.
    ("create", "secrets", "{ns}"),
    ("create", "events", "default"),
    ("create", "events", "{ns}"),
    ("get", "sdcpolicies.sdcguard.dev", ""),
    ("patch", "sdcpolicies.sdcguard.dev", ""),  # Kopf's finalizer
    ("create", "sdctests.sdcguard.dev", ""),
    ("patch", "sdctests.sdcguard.dev/status", ""),
    ("patch", "repairtickets.sdcguard.dev/status", ""),
    ("patch", "sdcpolicies.sdcguard.dev/status", ""),
    ("create", "sdcbaselines.sdcguard.dev", ""),
    ("create", "sdchardwares.sdcguard.dev", ""),
    ("patch", "sdchardwares.sdcguard.dev/status", ""),
    ("patch", "repairtickets.sdcguard.dev", ""),
    ("watch", "repairtickets.sdcguard.dev", ""),
    ("watch", "sdcreports.sdcguard.dev", "*"),
    ("patch", "sdcreports.sdcguard.dev/status", "team-a"),
    ("list", "customresourcedefinitions.apiextensions.k8s.io", ""),
    ("watch", "namespaces", ""),
    # Retention deletes history past its bounds (operator.retention).
    ("delete", "sdctests.sdcguard.dev", ""),
    ("delete", "repairtickets.sdcguard.dev", ""),
    ("delete", "sdcreports.sdcguard.dev", "team-a"),
]
DENIED = [
    ("get", "secrets", "*"),
    ("get", "secrets", "default"),
    ("get", "secrets", "kube-system"),
    ("list", "secrets", "{ns}"),
    ("watch", "secrets", "{ns}"),
    ("create", "secrets", "default"),
    ("create", "jobs.batch", "default"),
    # Jobs elsewhere are read one at a time (a workload's owner), never listed or watched.
    ("list", "jobs.batch", "*"),
    ("watch", "jobs.batch", "*"),
    ("list", "jobs.batch", "default"),
    ("watch", "jobs.batch", "team-a"),
    ("create", "jobs.batch", "*"),
    ("delete", "jobs.batch", "default"),
    ("patch", "statefulsets.apps", "*"),
    ("delete", "pods", "{ns}"),
    ("delete", "pods", "*"),
    ("create", "pods", "{ns}"),
    ("patch", "pods", "*"),
    # No policy of this release drains, so nothing may evict (the subresource form: the
    # plain "create pods/eviction" asks about a resource named so, not the subresource).
    ("create", "pods/eviction", "team-a"),
    ("create", "pods/eviction", "*"),
    ("delete", "nodes", ""),
    ("create", "nodes", ""),
    ("update", "nodes", ""),
    ("create", "sdcpolicies.sdcguard.dev", ""),
    ("delete", "sdcpolicies.sdcguard.dev", ""),
    ("update", "sdcpolicies.sdcguard.dev", ""),
    ("patch", "sdctests.sdcguard.dev", ""),
    ("update", "sdctests.sdcguard.dev/status", ""),
    ("patch", "events", "{ns}"),
    ("create", "events.events.k8s.io", "default"),
    ("create", "events", "kube-system"),
    ("patch", "deployments.apps", "{ns}"),
    ("update", "customresourcedefinitions.apiextensions.k8s.io", ""),
    ("get", "clusterkopfpeerings.kopf.dev", ""),
    ("patch", "kopfpeerings.kopf.dev", "{ns}"),
    ("create", "clusterroles.rbac.authorization.k8s.io", ""),
    ("impersonate", "serviceaccounts", "*"),
    ("create", "sdcreports.sdcguard.dev", "team-a"),
]


def _can_i(release: Release, verb: str, resource: str, namespace: str) -> bool:
    resource, _, sub = resource.partition("/")
    argv = ["kubectl", "auth", "can-i", verb, resource]
    if sub:
        argv.append(f"--subresource={sub}")
    if namespace == "*":
        argv.append("--all-namespaces")
    elif namespace:
        argv += ["--namespace", namespace.format(ns=release.namespace)]
    argv.append(f"--as=system:serviceaccount:{release.namespace}:{release.service_account}")
    proc = subprocess.run(argv, env=release.env, capture_output=True, text=True, check=False)
    assert proc.stdout.strip() in {"yes", "no"}, proc.stderr
    return proc.stdout.strip() == "yes"


def test_operator_can_do_what_it_needs(release: Release) -> None:
    refused = [rule for rule in ALLOWED if not _can_i(release, *rule)]
    assert not refused, f"the operator's ServiceAccount may not: {refused}"


def test_operator_cannot_do_more(release: Release) -> None:
    granted = [rule for rule in DENIED if _can_i(release, *rule)]
    assert not granted, f"the operator's ServiceAccount may, but should not: {granted}"


def test_eviction_is_granted_only_while_a_policy_drains(release: Release) -> None:
    """Asked with --subresource=eviction, as the API server authorizes an eviction."""
    assert not _can_i(release, "create", "pods/eviction", "team-a")
    values = release.values
    values["policy"]["quarantine"] = {"drain": True}
    _upgrade(release, values)
    try:
        assert _can_i(release, "create", "pods/eviction", "team-a")
        assert _can_i(release, "create", "pods/eviction", "*")
        # Evictions only: the grant is not one on Pods themselves.
        assert not _can_i(release, "create", "pods", "team-a")
        assert not _can_i(release, "delete", "pods", "team-a")
    finally:
        _upgrade(release, release.values)
    assert not _can_i(release, "create", "pods/eviction", "team-a")


def test_two_replicas_get_a_disruption_budget_the_api_server_accepts(
    release: Release, api_client: client.ApiClient
) -> None:
    """replicas: 2 adds a PodDisruptionBudget (its fields as the API server keeps them)
    and spreads the replicas; back to one replica, the budget goes, so it never blocks
    a drain of a lone operator's node."""
    policy = client.PolicyV1Api(api_client)
    apps = client.AppsV1Api(api_client)
    assert not policy.list_namespaced_pod_disruption_budget(release.namespace).items
    _upgrade(release, {**release.values, "replicas": 2})
    try:
        (pdb,) = policy.list_namespaced_pod_disruption_budget(release.namespace).items
        assert pdb.spec.max_unavailable == 1
        assert pdb.spec.unhealthy_pod_eviction_policy == "AlwaysAllow"
        dep = apps.read_namespaced_deployment(release.name, release.namespace)
        assert pdb.spec.selector.match_labels.items() <= dep.spec.template.metadata.labels.items()
        spread = dep.spec.template.spec.topology_spread_constraints
        assert [c.topology_key for c in spread] == [
            "kubernetes.io/hostname",
            "topology.kubernetes.io/zone",
        ]
        assert all(c.match_label_keys == ["pod-template-hash"] for c in spread)
    finally:
        _upgrade(release, release.values)
    assert not policy.list_namespaced_pod_disruption_budget(release.namespace).items


def test_operator_starts_under_the_chart_rbac(
    release: Release, api_client: client.ApiClient, tmp_path: Path
) -> None:
    """The real operator (Kopf and all its watches) with the ServiceAccount's token, in dry-run
    so it writes nothing but Kopf's own finalizers: no permission error in its log."""
    token = subprocess.run(
        ["kubectl", "create", "token", release.service_account, "-n", release.namespace],
        env=release.env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    kubeconfig = tmp_path / "operator-kubeconfig"
    kubeconfig.write_text(
        kubeconfig_text(release.cluster.server, release.cluster.ca_file, token, user="operator")
    )
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(str(ROOT / p) for p in ("operator", "jobs", ".")),
        "SDCGUARD_NAMESPACE": release.namespace,
        "SDCGUARD_DRY_RUN": "true",
        "SDCGUARD_METRICS_PORT": "0",
        "SDCGUARD_LOG_FORMAT": "console",
    }
    log_path = tmp_path / "operator.log"
    before = {
        p["metadata"]["name"]
        for p in client.CustomObjectsApi(api_client).list_cluster_custom_object(
            "sdcguard.dev", "v1alpha1", "sdcpolicies"
        )["items"]
        if "kopf.zalando.org/KopfFinalizerMarker" in (p["metadata"].get("finalizers") or [])
    }
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sdcguard",
                "--kubeconfig",
                str(kubeconfig),
                "--liveness",
                f"http://127.0.0.1:{port}/healthz",
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 90
            alive = False
            while time.monotonic() < deadline and proc.poll() is None and not alive:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                        alive = True
                except OSError:
                    time.sleep(0.5)
            time.sleep(5)  # let every watch list its resources once
            exited = proc.poll()
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            _drop_kopf_finalizers(api_client, keep=before)
    text = log_path.read_text(errors="replace")
    assert exited is None, f"the operator exited early ({exited}):\n{text[-3000:]}"
    assert alive, f"the liveness endpoint never answered:\n{text[-3000:]}"
    problems = refusals(text.splitlines())
    assert not problems, "permission errors under the chart's RBAC:\n" + "\n".join(problems[:20])


def _drop_kopf_finalizers(api_client: client.ApiClient, keep: set[str]) -> None:
    """Remove the finalizer the test's operator added, so other tests can delete policies."""
    custom = client.CustomObjectsApi(api_client)
    marker = "kopf.zalando.org/KopfFinalizerMarker"
    for p in custom.list_cluster_custom_object("sdcguard.dev", "v1alpha1", "sdcpolicies")["items"]:
        finalizers = p["metadata"].get("finalizers") or []
        if marker in finalizers and p["metadata"]["name"] not in keep:
            custom.patch_cluster_custom_object(
                "sdcguard.dev",
                "v1alpha1",
                "sdcpolicies",
                p["metadata"]["name"],
                {"metadata": {"finalizers": [f for f in finalizers if f != marker] or None}},
            )


def test_invalid_values_fail_install_with_the_schema_message(release: Release) -> None:
    name = f"bad-{uuid.uuid4().hex[:6]}"
    proc = run_helm(
        "install",
        name,
        str(CHART),
        "--namespace",
        release.namespace,
        env=release.env,
        values={"policy": {"mode": "Audit", "name": name}},
        check=False,
    )
    assert proc.returncode != 0
    assert "values don't meet the specifications of the schema" in proc.stderr
    assert "at '/policy/mode': value must be one of 'Observe', 'Enforce'" in proc.stderr
    listed = run_helm("list", "--namespace", release.namespace, "-q", env=release.env)
    assert name not in listed.stdout.split()


def test_upgrade_changes_the_policy(release: Release, api_client: client.ApiClient) -> None:
    values = release.values
    values["policy"].update(
        {
            "mode": "Observe",
            "suites": {"acceptance": {"checks": {"golden": {"enabled": False}}}},
            "budgets": {"maxUnavailable": 2},
        }
    )
    _upgrade(release, values)
    spec = _policy(api_client, release.policy)["spec"]
    assert spec["mode"] == "Observe"
    assert [c["name"] for c in spec["suites"]["acceptance"]] == ["compute", "collective", "memory"]
    assert spec["budgets"]["maxUnavailable"] == 2


def test_uninstall_removes_the_operator_and_keeps_policy_and_crds(
    release: Release, api_client: client.ApiClient
) -> None:
    # --no-hooks: with no kubelet the cleanup Job could never run (see the fixture).
    run_helm(
        "uninstall", release.name, "--namespace", release.namespace, "--no-hooks", env=release.env
    )
    rbac = client.RbacAuthorizationV1Api(api_client)
    with pytest.raises(ApiException):
        rbac.read_cluster_role(f"{release.name}-operator")
    with pytest.raises(ApiException):
        rbac.read_namespaced_role(f"{release.name}-events", "default")
    with pytest.raises(ApiException):
        client.AppsV1Api(api_client).read_namespaced_deployment(release.name, release.namespace)
    assert not _can_i(release, "patch", "nodes", "")
    # The policy is kept (helm.sh/resource-policy: keep): the operator's finalizer would
    # leave it stuck Terminating once the operator is gone. CRDs stay too.
    policy = _policy(api_client, release.policy)
    assert policy["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    client.ApiextensionsV1Api(api_client).read_custom_resource_definition(
        "sdcpolicies.sdcguard.dev"
    )
    client.CustomObjectsApi(api_client).delete_cluster_custom_object(
        "sdcguard.dev", "v1alpha1", "sdcpolicies", release.policy
    )
    with pytest.raises(ApiException) as gone:
        _policy(api_client, release.policy)
    assert gone.value.status == 404
