"""The chart rendered offline: lint, schema, security settings, RBAC, map-to-list values,
and agreement with the API models, the generated CRDs and the operator's metrics."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from sdcguard.api import RESOURCES, SDCPolicy, SDCPolicySpec
from sdcguard.api.crdgen import crd_manifest
from sdcguard.metrics import Metrics
from tests.chart.helm import CHART, ROOT, find, find_all, render, render_error, run_helm

NS = "sdcguard-system"


@pytest.fixture(scope="module")
def docs() -> list[dict[str, Any]]:
    return render(
        {"metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}}
    )


def policy_spec(values: Any) -> dict[str, Any]:
    spec: dict[str, Any] = find(render(values), "SDCPolicy")["spec"]
    return spec


# ---------------------------------------------------------------- lint, CRDs


def test_helm_lint_is_clean() -> None:
    proc = run_helm("lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in proc.stdout


def test_chart_crds_are_the_generated_ones() -> None:
    chart_crds = sorted(p.name for p in (CHART / "crds").glob("*.yaml"))
    assert chart_crds == sorted(p.name for p in (ROOT / "crds").glob("*.yaml"))
    assert chart_crds == sorted(f"{r.crd_name}.yaml" for r in RESOURCES)
    for name in chart_crds:
        chart_copy = (CHART / "crds" / name).read_text()
        assert chart_copy == (ROOT / "crds" / name).read_text(), (
            f"charts/sdcguard/crds/{name} differs from crds/{name}; regenerate both "
            "with `python -m sdcguard.api.crdgen --out crds --chart charts/sdcguard`"
        )


def test_crds_are_upgraded_kept_and_optional(docs: list[dict[str, Any]]) -> None:
    """An install takes the CRDs from crds/ (Helm puts them in first); an upgrade renders
    them as templates, so it upgrades them. Kept on uninstall, storing v1beta1 and still
    serving v1alpha1 with the same schema."""
    assert not [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    crds = [d for d in render(extra=("--is-upgrade",)) if d["kind"] == "CustomResourceDefinition"]
    assert sorted(c["metadata"]["name"] for c in crds) == sorted(r.crd_name for r in RESOURCES)
    for crd in crds:
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        versions = {v["name"]: v for v in crd["spec"]["versions"]}
        assert [n for n, v in versions.items() if v["storage"]] == ["v1beta1"]
        assert versions["v1alpha1"]["served"] and versions["v1beta1"]["served"]
        assert versions["v1alpha1"]["schema"] == versions["v1beta1"]["schema"]
        assert "conversion" not in crd["spec"]  # strategy None: no webhook
    off = render(values={"crds": {"manage": False}}, extra=("--is-upgrade",))
    assert not [d for d in off if d["kind"] == "CustomResourceDefinition"]


# ---------------------------------------------------------------- deployment


def test_deployment_runs_one_hardened_replica(docs: list[dict[str, Any]]) -> None:
    dep = find(docs, "Deployment")
    assert dep["metadata"]["namespace"] == NS
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["resources"]["requests"] and container["resources"]["limits"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 8080, "health": 8081}
    assert "--liveness=http://0.0.0.0:8081/healthz" in container["args"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["SDCGUARD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["SDCGUARD_METRICS_PORT"] == "8080"
    assert env["SDCGUARD_DEFAULT_PROBE_IMAGE"] == "ghcr.io/sdcguard/sdcprobe:0.1.0"
    assert env["SDCGUARD_PROBE_PRIORITY_CLASS"] == find(docs, "PriorityClass")["metadata"]["name"]
    assert pod["serviceAccountName"] == find(docs, "ServiceAccount")["metadata"]["name"]


def test_two_replicas_elect_a_leader_on_a_lease() -> None:
    """replicas: 2 turns leader election on (each Pod named in the Lease by its own
    name), rolls without a gap, grants the Lease and nothing more; the settings accept
    the rendered timings."""
    from sdcguard.settings import Settings

    docs = render({"replicas": 2, "leaderElection": {"leaseDurationSeconds": 10}})
    dep = find(docs, "Deployment")
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["SDCGUARD_LEADER_ELECTION"] == "true"
    assert env["SDCGUARD_LEADER_IDENTITY"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    lease_rules = [r for _, r in _rules(docs, "Role") if "leases" in r["resources"]]
    assert lease_rules == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "create", "update"],
        }
    ]
    plain = {k: v for k, v in env.items() if isinstance(v, str)}
    settings = Settings(**{k.removeprefix("SDCGUARD_").lower(): v for k, v in plain.items()})
    assert settings.leader_election and settings.lease_duration_seconds == 10
    # One replica: no election, no Lease rule.
    single = render({})
    (one,) = find(single, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "SDCGUARD_LEADER_ELECTION" not in {e["name"] for e in one["env"]}
    assert not [r for _, r in _rules(single, "Role") if "leases" in r["resources"]]


def _operator_pod_labels(docs: list[dict[str, Any]]) -> dict[str, str]:
    labels: dict[str, str] = find(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    return labels


def test_two_replicas_get_a_disruption_budget_and_spread() -> None:
    docs = render({"replicas": 2})
    pdb = find(docs, "PodDisruptionBudget")["spec"]
    assert pdb["maxUnavailable"] == 1
    assert pdb["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert pdb["selector"]["matchLabels"].items() <= _operator_pod_labels(docs).items()
    pod = find(docs, "Deployment")["spec"]["template"]["spec"]
    spread = pod["topologySpreadConstraints"]
    assert [c["topologyKey"] for c in spread] == [
        "kubernetes.io/hostname",
        "topology.kubernetes.io/zone",
    ]
    for constraint in spread:
        assert constraint["whenUnsatisfiable"] == "ScheduleAnyway"  # a one-node cluster runs
        assert constraint["labelSelector"]["matchLabels"].items() <= (
            _operator_pod_labels(docs).items()
        )
        assert constraint["matchLabelKeys"] == ["pod-template-hash"]
    strict = render(
        {
            "replicas": 3,
            "podDisruptionBudget": {"maxUnavailable": "50%"},
            "topologySpread": {
                "whenUnsatisfiable": "DoNotSchedule",
                "topologyKeys": ["topology.kubernetes.io/zone"],
            },
        }
    )
    assert find(strict, "PodDisruptionBudget")["spec"]["maxUnavailable"] == "50%"
    (zone,) = find(strict, "Deployment")["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert zone["whenUnsatisfiable"] == "DoNotSchedule"
    off = render(
        {
            "replicas": 2,
            "podDisruptionBudget": {"enabled": False},
            "topologySpread": {"enabled": False},
        }
    )
    assert not find_all(off, "PodDisruptionBudget")
    assert "topologySpreadConstraints" not in find(off, "Deployment")["spec"]["template"]["spec"]


def test_one_replica_gets_no_budget_that_would_block_drains(docs: list[dict[str, Any]]) -> None:
    assert not find_all(docs, "PodDisruptionBudget")
    assert "topologySpreadConstraints" not in find(docs, "Deployment")["spec"]["template"]["spec"]


_FORMULA = re.compile(r"peak RSS = (\d+) MB \+ (\d+) KB x nodes")


def test_memory_defaults_follow_the_measured_peak() -> None:
    """The formula in values.yaml predicts the scale benchmark's peaks, and the default
    limit covers the largest fleet measured with headroom."""
    from sdcguard.domain.quantity import parse_quantity

    comments = (CHART / "values.yaml").read_text()
    match = _FORMULA.search(comments)
    assert match, "values.yaml lost the memory formula above resources"
    base, per_node = int(match[1]) * 1e6, int(match[2]) * 1e3
    runs = json.loads((ROOT / "bench" / "results" / "scale.json").read_text())["runs"]
    for run in runs:
        if run["nodes"] < 1000:
            continue  # below that the interpreter and libraries are the peak
        measured = run["operator"]["peak_rss_mb"] * 1e6
        predicted = base + per_node * run["nodes"]
        assert abs(predicted - measured) < 0.1 * measured, (run["nodes"], measured, predicted)
    largest = max(runs, key=lambda r: r["nodes"])
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    limit = parse_quantity(values["resources"]["limits"]["memory"])
    assert limit >= 1.5 * largest["operator"]["peak_rss_mb"] * 1e6
    request = parse_quantity(values["resources"]["requests"]["memory"])
    assert request >= base + per_node * 5000  # the fleet size values.yaml says it covers


# ---------------------------------------------------------------- helm test


def _test_job(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (job,) = [d for d in docs if d["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]
    assert job["kind"] == "Job"
    return job


def _test_pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    template: dict[str, Any] = _test_job(docs)["spec"]["template"]
    return template


def test_helm_test_reads_metrics_through_the_service(docs: list[dict[str, Any]]) -> None:
    job = _test_job(docs)
    assert job["metadata"]["name"] == "sdcguard-test"
    assert "before-hook-creation" in job["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == 120
    pod = _test_pod(docs)
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never" and spec["automountServiceAccountToken"] is False
    (container,) = spec["containers"]
    (operator,) = find(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["image"] == operator["image"]  # nothing new to pull
    assert container["securityContext"] == operator["securityContext"]
    assert container["command"][:2] == ["python3", "-c"]
    url = container["command"][3]
    svc = find(docs, "Service")
    assert url == f"http://{svc['metadata']['name']}.{NS}.svc:8080/metrics"
    # Not an endpoint of the Service, nor counted by a budget.
    assert not svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    # Its NetworkPolicy lets it reach the operator's metrics port (and DNS), nothing else.
    policy = find(docs, "NetworkPolicy", "sdcguard-test")["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert policy["policyTypes"] == ["Ingress", "Egress"] and "ingress" not in policy
    to_operator, dns = policy["egress"]
    assert to_operator["ports"] == [{"port": 8080, "protocol": "TCP"}]
    assert to_operator["to"][0]["podSelector"]["matchLabels"].items() <= (
        _operator_pod_labels(docs).items()
    )
    assert sorted(p["port"] for p in dns["ports"]) == [53, 53]


def test_helm_test_on_the_host_network_reads_the_operators_node() -> None:
    docs = render({"hostNetwork": True, "operator": {"metricsPort": 18080}})
    spec = _test_pod(docs)["spec"]
    assert spec["hostNetwork"] is True
    assert spec["containers"][0]["command"][3] == "http://127.0.0.1:18080/metrics"
    (term,) = spec["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= _operator_pod_labels(docs).items()


def test_helm_test_without_a_way_to_reach_the_operator_is_refused() -> None:
    err = render_error({"metrics": {"service": {"enabled": False}}})
    assert "helmTest.enabled needs metrics.service.enabled" in err
    assert not _hooked(render({"helmTest": {"enabled": False}}), "test")


def test_helm_tests_script_passes_on_an_answering_operator_and_fails_on_none(
    docs: list[dict[str, Any]],
) -> None:
    """The test Pod's script itself, run here against a real /metrics endpoint."""
    import socket
    import subprocess
    import sys

    command = _test_pod(docs)["spec"]["containers"][0]["command"]
    script = command[2]

    def port() -> int:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            number: int = sock.getsockname()[1]
            return number

    def run(url: str, wait: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", script, url, wait],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    standby = port()
    metrics = Metrics(registry=CollectorRegistry())
    metrics.serve(standby)
    metrics.stand_by()
    answered = run(f"http://127.0.0.1:{standby}/metrics", "10")
    assert answered.returncode == 0, answered.stderr
    assert "sdcguard_leader 0.0" in answered.stdout
    silent = run(f"http://127.0.0.1:{port()}/metrics", "0")
    assert silent.returncode != 0
    assert "the operator did not answer" in silent.stderr


def test_operator_settings_accept_the_rendered_environment(docs: list[dict[str, Any]]) -> None:
    from sdcguard.settings import Settings

    (container,) = find(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    fields = {f"SDCGUARD_{name.upper()}" for name in Settings.model_fields}
    assert set(env) <= fields, f"unknown settings: {set(env) - fields}"
    settings = Settings(**{k.removeprefix("SDCGUARD_").lower(): v for k, v in env.items()})
    assert settings.metrics_port == 8080 and settings.log_format == "json"


def test_report_caps_are_values_that_reach_the_operator_settings() -> None:
    import datetime as dt

    from sdcguard.domain.reports import ReportLimits
    from sdcguard.settings import Settings

    def limits(values: dict[str, Any]) -> ReportLimits:
        (container,) = find(render(values), "Deployment")["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        return Settings(
            **{k.removeprefix("SDCGUARD_").lower(): v for k, v in env.items()}
        ).report_limits()

    assert limits({}) == ReportLimits()  # the chart's defaults are the operator's
    changed = {"windowSeconds": 7200, "perJob": 1, "maxNodesPerJob": 4, "perNamespace": 20}
    assert limits({"operator": {"reports": {**changed, "nodeWindowSeconds": 60}}}) == ReportLimits(
        window=dt.timedelta(hours=2),
        per_job=1,
        max_nodes_per_job=4,
        per_namespace=20,
        node_window=dt.timedelta(minutes=1),
    )
    err = render_error({"operator": {"reports": {"perJob": 0}}})
    assert "perJob" in err


def test_probe_priority_class_never_preempts(docs: list[dict[str, Any]]) -> None:
    pc = find(docs, "PriorityClass")
    assert pc["preemptionPolicy"] == "Never" and pc["globalDefault"] is False


OWN_TAINTS = ("quarantined", "testing", "unqualified")  # sdcguard's own, always tolerated


def test_image_digest_and_extra_env_and_tolerations_maps() -> None:
    docs = render(
        {
            "image": {"digest": "sha256:" + "a" * 64},
            "operator": {
                "extraEnv": {
                    "HTTPS_PROXY": {"value": "http://proxy:3128"},
                    "TOKEN": {"valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                    "DROPPED": {"value": "x", "enabled": False},
                }
            },
            "tolerations": {
                "CriticalAddonsOnly": {"operator": "Exists"},
                "dedicated": {"operator": "Equal", "value": "infra", "effect": "NoSchedule"},
                "gone": {"operator": "Exists", "enabled": False},
            },
            "imagePullSecrets": {"regcred": {}},
        }
    )
    pod = find(docs, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "ghcr.io/sdcguard/sdcguard@sha256:" + "a" * 64
    env = {e["name"]: e for e in container["env"]}
    assert env["HTTPS_PROXY"]["value"] == "http://proxy:3128"
    assert env["TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "s", "key": "k"}}
    assert "DROPPED" not in env
    assert pod["tolerations"] == [
        {"key": "CriticalAddonsOnly", "operator": "Exists"},
        {"effect": "NoSchedule", "key": "dedicated", "operator": "Equal", "value": "infra"},
        *({"key": f"sdcguard.dev/{k}", "operator": "Exists"} for k in OWN_TAINTS),
    ]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]


# ---------------------------------------------------------------- RBAC


def _rules(docs: list[dict[str, Any]], kind: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        (d["metadata"].get("namespace", ""), rule)
        for d in find_all(docs, kind)
        for rule in d.get("rules", [])
    ]


def test_rbac_has_no_wildcards_and_no_cluster_wide_secrets(docs: list[dict[str, Any]]) -> None:
    for kind in ("ClusterRole", "Role"):
        for _, rule in _rules(docs, kind):
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[key], f"wildcard in {kind} rule {rule}"
    for _, rule in _rules(docs, "ClusterRole"):
        assert "secrets" not in rule["resources"], "ClusterRole grants Secrets"
        assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])
    secret_rules = [(ns, r) for ns, r in _rules(docs, "Role") if "secrets" in r["resources"]]
    # Read: the sink Secrets; create (never read back): one attestation Secret per test.
    assert secret_rules == [
        (NS, {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}),
        (NS, {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}),
    ]
    job_rules = [(ns, r) for ns, r in _rules(docs, "Role") if "jobs" in r["resources"]]
    assert [ns for ns, _ in job_rules] == [NS]
    # The probe Jobs are written, listed and watched in the release namespace only.
    assert job_rules[0][1]["verbs"] == ["create", "delete", "list", "watch"]
    # Cluster-wide, a Job is only read by name (a workload's owner for the workload
    # record): never listed or watched.
    cluster_jobs = [
        r
        for _, r in _rules(docs, "ClusterRole")
        if "jobs" in r["resources"] and r["apiGroups"] == ["batch"]
    ]
    assert [r["verbs"] for r in cluster_jobs] == [["get"]]
    # No peering (standalone operator), no pod deletion.
    for _, rule in _rules(docs, "ClusterRole") + _rules(docs, "Role"):
        assert "kopf.dev" not in rule["apiGroups"]
        if "pods" in rule["resources"]:
            assert rule["verbs"] == ["list", "watch"]


def test_every_rbac_rule_is_commented() -> None:
    lines = (CHART / "templates" / "rbac.yaml").read_text().splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("- apiGroups:"):
            previous = next(
                text.strip() for text in reversed(lines[:i]) if text.strip() and "{{" not in text
            )
            preceding = "\n".join(lines[max(0, i - 12) : i])
            assert previous.startswith("#") or re.search(r"^#", preceding, re.M), (
                f"rbac.yaml:{i + 1}: explain the rule in a comment (framework or application)"
            )
            assert "framework" in preceding or "application" in preceding, (
                f"rbac.yaml:{i + 1}: say whether the rule is for the framework or the application"
            )


def test_events_roles_cover_default_and_own_namespace(docs: list[dict[str, Any]]) -> None:
    event_rules = [(ns, r) for ns, r in _rules(docs, "Role") if "events" in r["resources"]]
    assert sorted(ns for ns, _ in event_rules) == ["default", NS]
    for _, rule in event_rules:
        # core/v1 Events, each one new (KubeWriter.event); Kopf's own posting is off.
        assert rule["apiGroups"] == [""] and rule["verbs"] == ["create"]
    bindings = find_all(docs, "RoleBinding")
    assert {b["metadata"]["namespace"] for b in bindings} == {"default", NS}
    for b in bindings + find_all(docs, "ClusterRoleBinding"):
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": "sdcguard", "namespace": NS}]


def test_node_delete_only_when_needed(docs: list[dict[str, Any]]) -> None:
    def node_verbs(d: list[dict[str, Any]]) -> set[str]:
        return {
            v for _, r in _rules(d, "ClusterRole") if "nodes" in r["resources"] for v in r["verbs"]
        }

    assert "delete" not in node_verbs(docs)
    assert "delete" in node_verbs(render({"policy": {"repair": {"strategy": "Replace"}}}))
    assert "delete" in node_verbs(render({"policy": {"repair": {"retireAction": "Delete"}}}))
    assert "delete" in node_verbs(render({"rbac": {"allowNodeDelete": True}}))


def test_eviction_only_when_a_policy_drains(docs: list[dict[str, Any]]) -> None:
    def evicts(d: list[dict[str, Any]]) -> bool:
        return any("pods/eviction" in r["resources"] for _, r in _rules(d, "ClusterRole"))

    assert not evicts(docs)
    assert evicts(render({"policy": {"quarantine": {"drain": True}}}))
    assert evicts(render({"rbac": {"allowEviction": True}}))
    assert not evicts(render({"policy": {"create": False, "quarantine": {"drain": True}}}))


def test_device_taint_rights_only_for_device_scope_slices_always_read(
    docs: list[dict[str, Any]],
) -> None:
    """Reading ResourceSlices is always granted (DRA-only nodes, spec.dra); writing
    DeviceTaintRules only for device-scope quarantine."""

    def dra_verbs(d: list[dict[str, Any]]) -> dict[str, set[str]]:
        verbs: dict[str, set[str]] = {}
        for _, rule in _rules(d, "ClusterRole"):
            if "resource.k8s.io" in rule["apiGroups"]:
                for resource in rule["resources"]:
                    verbs.setdefault(resource, set()).update(rule["verbs"])
        return verbs

    read = {"resourceslices": {"list", "watch"}}
    assert dra_verbs(docs) == read
    device = dra_verbs(render({"policy": {"quarantine": {"scope": "Device"}}}))
    assert device == {**read, "devicetaintrules": {"get", "list", "create", "patch", "delete"}}
    assert dra_verbs(render({"rbac": {"allowDeviceTaints": True}})) == device
    off = render({"policy": {"create": False, "quarantine": {"scope": "Device"}}})
    assert dra_verbs(off) == read
    rendered = policy_spec({"policy": {"quarantine": {"scope": "Device"}}})
    assert rendered["quarantine"]["scope"] == "Device"
    SDCPolicySpec.model_validate(rendered)


def test_policies_are_read_not_written_by_the_operator(docs: list[dict[str, Any]]) -> None:
    verbs: dict[str, set[str]] = {}
    for _, rule in _rules(docs, "ClusterRole"):
        if "sdcguard.dev" in rule["apiGroups"]:
            for resource in rule["resources"]:
                verbs.setdefault(resource, set()).update(rule["verbs"])
    assert verbs["sdcpolicies"] == {"get", "list", "watch", "patch"}
    assert verbs["sdctests"] == {"list", "watch", "create", "delete"}  # retention
    assert all(v == {"patch"} for r, v in verbs.items() if r.endswith("/status"))
    assert not any("update" in v for v in verbs.values())
    # Deleted: a deleted Node's WorkloadRecord, and the history retention prunes; never
    # a policy or the hardware history.
    assert {r for r, v in verbs.items() if "delete" in v} == {
        "sdctests",
        "repairtickets",
        "sdcbaselines",
        "workloadrecords",
        "sdcreports",
    }


def test_rbac_can_be_left_to_the_user() -> None:
    docs = render({"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "mine"}})
    assert not find_all(docs, "ClusterRole") and not find_all(docs, "Role")
    assert not find_all(docs, "ServiceAccount")
    pod = find(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "mine"


# ---------------------------------------------------------------- the default SDCPolicy


def test_default_policy_equals_the_api_defaults(docs: list[dict[str, Any]]) -> None:
    policy = SDCPolicy.model_validate(find(docs, "SDCPolicy"))
    assert policy.metadata.name == "default"
    # values.yaml mirrors the API's defaults: installing the chart changes nothing
    # compared with `kubectl create` of an empty SDCPolicy.
    # accelerators is a set (x-kubernetes-list-type: set); the chart lists it sorted.
    defaults = SDCPolicySpec()
    assert policy.spec.model_copy(update={"accelerators": sorted(defaults.accelerators)}) == (
        defaults.model_copy(update={"accelerators": sorted(defaults.accelerators)})
    )


def test_checks_map_becomes_a_list_and_one_override_keeps_the_rest() -> None:
    spec = policy_spec(
        {
            "policy": {
                "suites": {
                    "acceptance": {
                        "checks": {
                            "golden": {"enabled": False},
                            "memory": {"enabled": True, "params": {"memory-mib": 256}},
                            "compute": {"params": {}},
                        }
                    }
                }
            }
        }
    )
    assert spec["suites"]["acceptance"] == [
        {"name": "compute"},
        {"name": "collective"},
        {"name": "memory", "params": {"memory-mib": 256}},
    ]
    assert [c["name"] for c in spec["suites"]["requalification"]] == [
        "compute",
        "collective",
        "golden",
    ]
    SDCPolicySpec.model_validate(spec)


def test_a_suite_without_checks_is_refused() -> None:
    off = {"enabled": False}
    err = render_error(
        {
            "policy": {
                "suites": {
                    "requalification": {
                        "checks": {"compute": off, "collective": off, "golden": off, "memory": off}
                    }
                }
            }
        }
    )
    assert "policy.suites.requalification.checks: every check is disabled" in err


def test_ticket_sinks_map_becomes_a_list() -> None:
    spec = policy_spec(
        {
            "policy": {
                "repair": {
                    "ticketSinks": {
                        "ops-webhook": {
                            "type": "webhook",
                            "url": "https://hooks.example/sdc",
                            "secretRef": {"name": "sdcguard-webhook", "key": "hmac"},
                        },
                        "jira": {
                            "type": "jira",
                            "url": "https://example.atlassian.net/?project=OPS",
                            "secretRef": {"name": "jira"},
                        },
                        "old": {"type": "webhook", "url": "https://old", "enabled": False},
                    }
                }
            }
        }
    )
    assert spec["repair"]["ticketSinks"] == [
        {
            "secretRef": {"key": "token", "name": "jira", "namespace": NS},
            "type": "jira",
            "url": "https://example.atlassian.net/?project=OPS",
        },
        {
            "secretRef": {"key": "hmac", "name": "sdcguard-webhook", "namespace": NS},
            "type": "webhook",
            "url": "https://hooks.example/sdc",
        },
    ]
    SDCPolicySpec.model_validate(spec)


def test_ticket_sink_secret_outside_the_release_namespace_is_refused() -> None:
    err = render_error(
        {
            "policy": {
                "repair": {
                    "ticketSinks": {
                        "hook": {
                            "type": "webhook",
                            "url": "https://hooks.example",
                            "secretRef": {"name": "s", "namespace": "kube-system"},
                        }
                    }
                }
            }
        }
    )
    assert "may read Secrets only in its own namespace" in err
    err = render_error(
        {"policy": {"repair": {"ticketSinks": {"j": {"type": "jira", "url": "https://x"}}}}}
    )
    assert "policy.repair.ticketSinks.j.secretRef: required for type jira" in err


def test_accelerators_map_and_other_overrides() -> None:
    spec = policy_spec(
        {
            "policy": {
                "mode": "Observe",
                "accelerators": {"amd.com/gpu": False, "example.com/npu": True},
                "nodeSelector": {
                    "matchLabels": {"pool": "training"},
                    "matchExpressions": {
                        "node.kubernetes.io/instance-type": {
                            "operator": "In",
                            "values": ["p5.48xlarge", "p4d.24xlarge"],
                        },
                        "sdcguard.dev/skip": {"operator": "DoesNotExist"},
                        "off": {"enabled": False, "operator": "Exists"},
                    },
                },
                "budgets": {"maxUnavailable": 3, "poolLabel": "node.kubernetes.io/instance-type"},
                "probe": {"resources": {"requests": {"cpu": "4", "memory": "16Gi"}}},
            }
        }
    )
    assert spec["mode"] == "Observe"
    assert spec["accelerators"] == [
        "aws.amazon.com/neuron",
        "example.com/npu",
        "google.com/tpu",
        "nvidia.com/gpu",
    ]
    assert spec["nodeSelector"] == {
        "matchLabels": {"pool": "training"},
        "matchExpressions": [
            {
                "key": "node.kubernetes.io/instance-type",
                "operator": "In",
                "values": ["p5.48xlarge", "p4d.24xlarge"],
            },
            {"key": "sdcguard.dev/skip", "operator": "DoesNotExist"},
        ],
    }
    assert spec["budgets"]["maxUnavailable"] == 3
    assert spec["budgets"]["poolLabel"] == "node.kubernetes.io/instance-type"
    assert spec["probe"]["resources"]["requests"] == {"cpu": "4", "memory": "16Gi"}
    SDCPolicySpec.model_validate(spec)


def test_policy_survives_uninstall_unless_asked(docs: list[dict[str, Any]]) -> None:
    annotations = find(docs, "SDCPolicy")["metadata"]["annotations"]
    assert annotations == {"helm.sh/resource-policy": "keep"}
    mine = find(
        render({"policy": {"keepOnUninstall": False, "annotations": {"team": "ml"}}}), "SDCPolicy"
    )
    assert mine["metadata"]["annotations"] == {"team": "ml"}


def test_policy_can_be_left_out() -> None:
    assert not find_all(render({"policy": {"create": False}}), "SDCPolicy")


# ---------------------------------------------------------------- values schema


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"replicas": 0}, "at '/replicas': minimum: got 0, want 1"),
        ({"leaderElection": {"leaseSeconds": 9}}, "additional properties 'leaseSeconds'"),
        ({"policy": {"mdoe": "Observe"}}, "at '/policy': additional properties 'mdoe' not allowed"),
        (
            {"policy": {"suites": {"acceptance": {"checks": {"gpu-burn": {}}}}}},
            "additional properties 'gpu-burn' not allowed",
        ),
        (
            {"policy": {"repair": {"ticketSinks": {"x": {"type": "email", "url": "https://x"}}}}},
            "at '/policy/repair/ticketSinks/x/type'",
        ),
        ({"policy": {"mode": "Audit"}}, "at '/policy/mode': value must be one of 'Observe'"),
        (
            {"policy": {"budgets": {"maxUnavailable": "110%"}}},
            "at '/policy/budgets/maxUnavailable'",
        ),
        ({"policy": {"triggers": {"onReturnFromUse": {"idleFor": "30 min"}}}}, "idleFor"),
        ({"operator": {"logLevel": "trace"}}, "at '/operator/logLevel'"),
        ({"tolerations": {"x": {"operator": "Exists", "effect": "Never"}}}, "effect"),
    ],
)
def test_schema_rejects_bad_values(values: dict[str, Any], message: str) -> None:
    err = render_error(values)
    assert "values don't meet the specifications of the schema" in err
    assert message in err


def _objects(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = []
    if node.get("type") == "object" and "properties" in node:
        found.append((path, node))
    for name, sub in node.get("properties", {}).items():
        found += _objects(sub, f"{path}.{name}")
    if isinstance(node.get("additionalProperties"), dict):
        found += _objects(node["additionalProperties"], f"{path}.*")
    return found


def test_schema_closes_every_object() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["additionalProperties"] is False
    for path, node in _objects(schema):
        assert node.get("additionalProperties") is False, f"{path or '.'} accepts unknown keys"


def test_values_file_and_schema_agree() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(value: Any, node: dict[str, Any], path: str) -> None:
        if isinstance(value, dict) and "properties" in node:
            for key, sub in value.items():
                assert key in node["properties"], f"values.yaml {path}.{key} is not in the schema"
                walk(sub, node["properties"][key], f"{path}.{key}")

    walk(values, schema, "")


def _crd_spec() -> dict[str, Any]:
    crd = crd_manifest(next(r for r in RESOURCES if r.kind == "SDCPolicy"))
    spec: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
        "spec"
    ]
    return spec


def test_policy_values_cover_every_policy_field() -> None:
    """A new SDCPolicy field fails here until the chart exposes it (or lists it as API-only)."""
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["policy"]
    # Fields whose values layout differs from the API (lists as maps).
    as_map = {"suites", "accelerators", "dra", "repair.ticketSinks"}

    def walk(crd: dict[str, Any], values: dict[str, Any], path: str) -> None:
        for name, sub in crd.get("properties", {}).items():
            dotted = f"{path}{name}"
            assert name in values.get("properties", {}), (
                f"SDCPolicy spec.{dotted} has no chart value policy.{dotted}"
            )
            vsub = values["properties"][name]
            if dotted in as_map:
                continue
            if "enum" in sub:
                assert vsub.get("enum") == sub["enum"], f"policy.{dotted}: enum differs from API"
            for bound in ("minimum", "maximum"):
                if bound in sub:
                    assert vsub.get(bound) == sub[bound], f"policy.{dotted}: {bound} differs"
            if sub.get("type") == "object" and "properties" in sub:
                walk(sub, vsub, dotted + ".")

    walk(_crd_spec(), schema, "")
    check = _crd_spec()["properties"]["suites"]["properties"]["acceptance"]["items"]
    vcheck = schema["properties"]["suites"]["properties"]["acceptance"]["properties"]["checks"]
    assert set(vcheck["properties"]) == set(check["properties"]["name"]["enum"])
    assert "params" in vcheck["properties"]["compute"]["properties"]
    assert "timeoutSeconds" not in vcheck["properties"]["compute"]["properties"]


# ---------------------------------------------------------------- monitoring


def _metric_names() -> set[str]:
    registry = CollectorRegistry()
    Metrics(registry=registry)
    names: set[str] = set()
    for family in registry.collect():
        names.add(family.name)
        for sample in family.samples:
            names.add(sample.name)
    # Histograms export _bucket/_sum/_count; counters _total even before any sample.
    for family in registry.collect():
        if family.type == "histogram":
            names |= {f"{family.name}_{s}" for s in ("bucket", "sum", "count")}
        if family.type == "counter":
            names.add(f"{family.name}_total")
    return names


def _referenced(text: str) -> set[str]:
    return set(re.findall(r"\bsdcguard_[a-z_]+\b", text))


def test_alerts_use_real_metrics(docs: list[dict[str, Any]]) -> None:
    rule = find(docs, "PrometheusRule")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert {
        "SdcguardCircuitBreakerOpen",
        "SdcguardNodesQuarantined",
        "SdcguardTestsInconclusive",
        "SdcguardRepairTicketOverSLA",
    } <= set(alerts)
    names = _metric_names()
    for name, alert in alerts.items():
        used = _referenced(alert["expr"])
        assert used and used <= names, f"{name} uses unknown metrics {used - names}"
        assert alert["labels"]["severity"] in {"warning", "critical"}
        assert alert["annotations"]["summary"]
    assert "> 259200" in alerts["SdcguardRepairTicketOverSLA"]["expr"]  # 72h default SLA
    sla = find(
        render({"metrics": {"prometheusRule": {"enabled": True, "ticketSlaHours": 24}}}),
        "PrometheusRule",
    )
    assert "> 86400" in json.dumps(sla)


def test_service_monitor_scrapes_the_metrics_service(docs: list[dict[str, Any]]) -> None:
    sm = find(docs, "ServiceMonitor")
    svc = find(docs, "Service")
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert svc["spec"]["selector"].items() <= (
        find(docs, "Deployment")["spec"]["template"]["metadata"]["labels"].items()
    )
    assert not find_all(render(), "ServiceMonitor") and not find_all(render(), "PrometheusRule")


def test_dashboard_configmap(docs: list[dict[str, Any]]) -> None:
    cm = find(docs, "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(cm["data"]["sdcguard.json"])
    assert dashboard["uid"] == "sdcguard-overview" and dashboard["panels"]
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p.get("targets", []))
    used = _referenced(exprs)
    assert used <= _metric_names(), f"dashboard uses unknown metrics {used - _metric_names()}"
    # Every family the operator exports is on the dashboard somewhere (the process's
    # own, from prometheus_client: its memory and CPU).
    families = {f.name for f in _families() if f.name.startswith("sdcguard_")}
    assert {"process_resident_memory_bytes", "process_cpu_seconds_total"} <= set(
        re.findall(r"\bprocess_[a-z_]+\b", exprs)
    )
    assert all(any(u.startswith(f) for u in used) for f in families), families - {
        f for f in families if any(u.startswith(f) for u in used)
    }


def _families() -> list[Any]:
    registry = CollectorRegistry()
    Metrics(registry=registry)
    return list(registry.collect())


def test_readme_documents_every_value() -> None:
    readme = (CHART / "README.md").read_text()
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def leaves(value: Any, path: str) -> list[str]:
        if (
            isinstance(value, dict)
            and value
            and not path.endswith(("accelerators", "dra", "requests", "limits"))
        ):
            return [p for k, v in value.items() for p in leaves(v, f"{path}.{k}" if path else k)]
        return [path]

    missing = [
        p
        for p in leaves(values, "")
        if f"`{p}`" not in readme and not p.startswith("policy.suites.")
    ]
    assert not missing, f"charts/sdcguard/README.md lacks rows for {missing}"


def test_readme_alert_and_metric_tables_match_the_chart(docs: list[dict[str, Any]]) -> None:
    readme = (CHART / "README.md").read_text()
    rule = find(docs, "PrometheusRule")
    for alert in (r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]):
        assert f"`{alert}`" in readme, f"README lacks alert {alert}"
    for family in _families():
        assert f"`{family.name}" in readme, f"README lacks metric {family.name}"


# ---------------------------------------------------------------- network policies


def test_network_policies_for_the_operator_and_the_probes(docs: list[dict[str, Any]]) -> None:
    operator = find(docs, "NetworkPolicy", "sdcguard-operator")["spec"]
    pod_labels = find(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert operator["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert operator["policyTypes"] == ["Ingress", "Egress"]
    (ingress,) = operator["ingress"]
    assert ingress == {"ports": [{"port": 8080, "protocol": "TCP"}]}
    ports = [sorted(p["port"] for p in rule["ports"]) for rule in operator["egress"]]
    assert ports == [[443, 6443], [443], [53, 53]]
    assert all("to" not in rule for rule in operator["egress"])  # any address by default
    probe = find(docs, "NetworkPolicy", "sdcguard-probe")["spec"]
    assert probe["policyTypes"] == ["Ingress", "Egress"]
    assert "ingress" not in probe and "egress" not in probe  # nothing in, nothing out
    assert probe["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/component": "sdcprobe",
        "app.kubernetes.io/managed-by": "sdcguard",
    }


def test_network_policy_values_narrow_it_or_turn_it_off() -> None:
    docs = render(
        {
            "networkPolicy": {
                "apiServer": {"cidrs": ["10.0.0.1/32"], "ports": [6443]},
                "ticketSinks": {"cidrs": ["203.0.113.0/24"], "ports": []},
                "dns": False,
                "metricsFrom": {
                    "prometheus": {
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}
                        }
                    },
                    "off": {"enabled": False, "podSelector": {}},
                },
            }
        }
    )
    spec = find(docs, "NetworkPolicy", "sdcguard-operator")["spec"]
    assert spec["egress"] == [
        {"ports": [{"port": 6443, "protocol": "TCP"}], "to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}]}
    ]
    assert spec["ingress"][0]["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}},
        # `helm test`'s Pod reads /metrics too.
        {
            "podSelector": {
                "matchLabels": {
                    "app.kubernetes.io/name": "sdcguard",
                    "app.kubernetes.io/instance": "sdcguard",
                    "app.kubernetes.io/component": "helm-test",
                }
            }
        },
    ]
    assert not find_all(render({"networkPolicy": {"enabled": False}}), "NetworkPolicy")


def _hooked(docs: list[dict[str, Any]], hook: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["metadata"].get("annotations", {}).get("helm.sh/hook") == hook]


def test_uninstall_runs_the_cleanup_before_anything_is_deleted(
    docs: list[dict[str, Any]],
) -> None:
    """helm uninstall's pre-delete hook: the operator's image and ServiceAccount run
    kubectl sdc cleanup, which stops this release's operator first; the only rights it
    adds, while it runs, are get on Nodes and patch on this Deployment's scale."""
    hooked = _hooked(docs, "pre-delete")
    assert sorted(d["kind"] for d in hooked) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "Job",
        "Role",
        "RoleBinding",
    ]
    for d in hooked:
        policy = d["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
        assert policy == "before-hook-creation,hook-succeeded"
    job = next(d for d in hooked if d["kind"] == "Job")
    pod = job["spec"]["template"]["spec"]
    deployment = find(docs, "Deployment")
    operator = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == operator["serviceAccountName"]
    (container,) = pod["containers"]
    assert container["image"] == operator["containers"][0]["image"]
    assert container["command"] == [
        "kubectl-sdc",
        "cleanup",
        "--yes",
        "--stop-operator",
        f"{NS}/{deployment['metadata']['name']}",
        "--jobs-namespace",
        NS,
    ]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # Like the operator, it runs on a node sdcguard left tainted.
    assert {t["key"] for t in pod["tolerations"]} >= {
        "sdcguard.dev/unqualified",
        "sdcguard.dev/testing",
        "sdcguard.dev/quarantined",
    }
    rules = {d["kind"]: d["rules"] for d in hooked if d["kind"] in ("ClusterRole", "Role")}
    assert rules["ClusterRole"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
    assert rules["Role"] == [
        {
            "apiGroups": ["apps"],
            "resources": ["deployments/scale"],
            "resourceNames": [deployment["metadata"]["name"]],
            "verbs": ["patch"],
        }
    ]
    # Without the chart's RBAC, only the Job (its rights are the user's to grant).
    bare = _hooked(
        render({"rbac": {"create": False}, "serviceAccount": {"name": "x"}}), "pre-delete"
    )
    assert [d["kind"] for d in bare] == ["Job"]
