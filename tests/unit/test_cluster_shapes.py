"""Cluster shapes people run today: GPU pools tainted for accelerator pods only, probe
Pods that need a runtime class, pull secrets, a priority class, labels and annotations,
and MIG nodes (docs/guides/cluster-shapes.md)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from kubernetes import client
from pydantic import ValidationError

from sdcdev.sim.fleet import parse_fleet
from sdcdev.sim.nodes import node_manifest, node_status
from sdcguard.adapters.reconciler import Reconciler
from sdcguard.api import SDCPolicy, SDCPolicySpec, SDCTest, Toleration
from sdcguard.builders.probe_job import build_probe_job
from sdcguard.domain.decide import decide
from sdcguard.domain.observed import NodeFacts, NodeSnapshot, Observed, Taint
from sdcguard.domain.waits import WaitReason
from sdcguard.metrics import Metrics
from sdcguard.settings import Settings
from tests.unit.factories import HOUR, NOW, node, policy
from tests.unit.test_apply_order import _Recorder
from tests.unit.test_waits import _verifying

GKE_TAINT = Taint("nvidia.com/gpu", "NoSchedule", "present")

# ---------------------------------------------------------------- toleration matching


@pytest.mark.parametrize(
    ("toleration", "taint", "tolerated"),
    [
        # Exists: any value, the effect if one is named.
        ({"key": "nvidia.com/gpu", "operator": "Exists"}, GKE_TAINT, True),
        (
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            GKE_TAINT,
            True,
        ),
        (
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"},
            GKE_TAINT,
            False,
        ),
        ({"key": "google.com/tpu", "operator": "Exists"}, GKE_TAINT, False),
        # Equal (the default operator): the same value only.
        ({"key": "nvidia.com/gpu", "value": "present"}, GKE_TAINT, True),
        ({"key": "nvidia.com/gpu", "operator": "Equal", "value": "true"}, GKE_TAINT, False),
        ({"key": "nvidia.com/gpu", "operator": "Equal"}, GKE_TAINT, False),
        (
            {"key": "sku", "operator": "Equal", "value": "gpu"},
            Taint("sku", "NoSchedule", "gpu"),
            True,
        ),
        # A taint without a value: Equal with an empty value matches it.
        ({"key": "dedicated", "operator": "Equal"}, Taint("dedicated", "NoSchedule"), True),
        # An empty key with Exists tolerates every taint (the API refuses it for the probe).
        ({"operator": "Exists"}, GKE_TAINT, True),
        ({"operator": "Exists", "effect": "NoExecute"}, GKE_TAINT, False),
    ],
)
def test_toleration_matches_taints_as_kubernetes_does(
    toleration: dict[str, Any], taint: Taint, tolerated: bool
) -> None:
    tol = Toleration.model_validate(toleration)
    assert tol.tolerates(taint.key, taint.value, taint.effect) is tolerated


# ---------------------------------------------------------------- foreign taints


def _due(taints: tuple[Taint, ...], **spec: Any) -> tuple[WaitReason | None, bool, str]:
    """A repaired node whose verification is due, with ``taints``: the wait, if any,
    and whether the test starts."""
    d = decide(_verifying(taints=taints), policy(**spec), NOW)
    return (
        (d.wait.reason if d.wait else None),
        d.starts_test,
        (d.wait.message if d.wait else d.note),
    )


@pytest.mark.parametrize(
    ("taints", "spec", "waits_on"),
    [
        # GKE's GPU pools: tolerated by default.
        ((GKE_TAINT,), {}, None),
        ((Taint("aws.amazon.com/neuron", "NoSchedule", "true"),), {}, None),
        # The default replaced: the pool's taint keeps probes off.
        ((GKE_TAINT,), {"probe": {"tolerations": []}}, "nvidia.com/gpu=present:NoSchedule"),
        (
            (GKE_TAINT,),
            {"probe": {"tolerations": [{"key": "nvidia.com/gpu", "value": "true"}]}},
            "nvidia.com/gpu=present:NoSchedule",
        ),
        # An AKS-style pool taint, tolerated once the policy names it.
        ((Taint("sku", "NoSchedule", "gpu"),), {}, "sku=gpu:NoSchedule"),
        (
            (Taint("sku", "NoSchedule", "gpu"),),
            {"probe": {"tolerations": [{"key": "sku", "operator": "Equal", "value": "gpu"}]}},
            None,
        ),
        # Effects: PreferNoSchedule never keeps a probe off; a toleration for another
        # effect does not cover NoExecute.
        ((Taint("example.com/soon", "PreferNoSchedule"),), {}, None),
        (
            (Taint("example.com/drain", "NoExecute"),),
            {
                "probe": {
                    "tolerations": [
                        {"key": "example.com/drain", "operator": "Exists", "effect": "NoSchedule"}
                    ]
                }
            },
            "example.com/drain:NoExecute",
        ),
    ],
)
def test_a_foreign_taint_waits_unless_the_policy_tolerates_it(
    taints: tuple[Taint, ...], spec: dict[str, Any], waits_on: str | None
) -> None:
    reason, starts, message = _due(taints, **spec)
    if waits_on is None:
        assert reason is None and starts, message
    else:
        assert reason == WaitReason.FOREIGN_TAINT
        assert message.endswith(
            f"taint {waits_on} keeps probes off the node: tolerate it in spec.probe.tolerations"
        )


def test_the_default_tolerations_are_the_default_accelerators_and_can_be_replaced() -> None:
    spec = SDCPolicySpec()
    assert [t.key for t in spec.probe.tolerations] == list(spec.accelerators)
    assert all(t.operator == "Exists" and not t.effect for t in spec.probe.tolerations)
    assert policy(probe={"tolerations": []}).probe.tolerations == []


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (
            {"probe": {"tolerations": [{"key": "sdcguard.dev/quarantined", "operator": "Exists"}]}},
            "quarantine taint",
        ),
        ({"probe": {"tolerations": [{"operator": "Exists"}]}}, "an empty key"),
        (
            {
                "taints": {"quarantine": "example.com/q"},
                "probe": {"tolerations": [{"key": "example.com/q", "value": "x"}]},
            },
            "spec.taints.quarantine",
        ),
        ({"probe": {"labels": {"sdcguard.dev/node": "x"}}}, "spec.probe.labels"),
        (
            {"probe": {"annotations": {"karpenter.sh/do-not-disrupt": "false"}}},
            "spec.probe.annotations",
        ),
    ],
)
def test_the_model_refuses_what_would_send_probes_where_they_must_not_go(
    spec: dict[str, Any], words: str
) -> None:
    with pytest.raises(ValidationError, match=words):
        SDCPolicySpec.model_validate(spec)


# ---------------------------------------------------------------- MIG


def _snapshot(allocatable: dict[str, str]) -> NodeSnapshot:
    return NodeSnapshot.from_body(
        {
            "metadata": {"name": "gpu-1", "uid": "u", "resourceVersion": "5"},
            "spec": {"taints": []},
            "status": {
                "allocatable": {"cpu": "96", **allocatable},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    )


MIG_A100 = {"nvidia.com/mig-1g.10gb": "14", "nvidia.com/mig-3g.40gb": "4", "nvidia.com/gpu": "0"}


@pytest.mark.parametrize(
    ("allocatable", "accelerators", "devices", "mixed"),
    [
        ({"nvidia.com/gpu": "8"}, None, 8, ""),
        # Every GPU partitioned (mixed strategy): screened on every instance.
        (MIG_A100, None, 18, ""),
        # MIG resources count only where nvidia.com/gpu is listed.
        (MIG_A100, ["google.com/tpu"], 0, ""),
        # Whole GPUs and MIG instances at once: refused.
        (
            {"nvidia.com/gpu": "4", "nvidia.com/mig-1g.10gb": "14"},
            None,
            18,
            "nvidia.com/gpu: 4, nvidia.com/mig-1g.10gb: 14",
        ),
    ],
)
def test_mig_instances_are_the_nodes_devices(
    allocatable: dict[str, str], accelerators: list[str] | None, devices: int, mixed: str
) -> None:
    spec = SDCPolicySpec() if accelerators is None else policy(accelerators=accelerators)
    facts = NodeFacts.from_snapshot(_snapshot(allocatable), spec.accelerators)
    assert (facts.accelerators, facts.mixed_mig) == (devices, mixed)


def test_a_node_with_whole_gpus_and_mig_instances_waits_naming_mig() -> None:
    facts = NodeFacts.from_snapshot(
        _snapshot({"nvidia.com/gpu": "4", "nvidia.com/mig-1g.10gb": "14"}),
        SDCPolicySpec().accelerators,
    )
    observed = _verifying()
    n = dataclasses.replace(
        observed.node, accelerators=facts.accelerators, mixed_mig=facts.mixed_mig
    )
    d = decide(dataclasses.replace(observed, node=n), SDCPolicySpec(), NOW)
    assert d.wait is not None and d.wait.reason == WaitReason.MIXED_MIG
    assert "MIG" in d.wait.message and "nvidia.com/mig-1g.10gb: 14" in d.wait.message
    assert not d.starts_test


# ---------------------------------------------------------------- the probe Pod


def _pod(policy_spec: dict[str, Any], allocatable: dict[str, str], **settings: Any) -> Any:
    pol = SDCPolicy.model_validate({"metadata": {"name": "fleet"}, "spec": policy_spec})
    test = SDCTest.model_validate(
        {
            "metadata": {"name": "gpu-1-acceptance-1", "uid": "u"},
            "spec": {"nodeName": "gpu-1", "policyRef": "fleet", "suite": "acceptance"},
        }
    )
    metrics = Metrics()
    rec = Reconciler(
        writer=_Recorder(api=client.ApiClient(), metrics=metrics),
        settings=Settings(metrics_port=0, **settings),
        metrics=metrics,
    )
    body = _snapshot(allocatable)
    facts = NodeFacts.from_snapshot(body, pol.spec.accelerators)
    job = build_probe_job(rec.runner.probe_request(pol, test, facts, body))
    return job["spec"]["template"]


def test_a_mig_node_probe_requests_every_instance_of_every_profile() -> None:
    container = _pod({}, MIG_A100)["spec"]["containers"][0]
    requests = container["resources"]["requests"]
    assert requests["nvidia.com/mig-1g.10gb"] == "14"
    assert requests["nvidia.com/mig-3g.40gb"] == "4"
    assert "nvidia.com/gpu" not in requests  # none offered: nothing asked for
    assert container["resources"]["limits"]["nvidia.com/mig-3g.40gb"] == "4"


def test_every_accelerator_resource_the_node_offers_is_requested_in_full() -> None:
    requests = _pod(
        {"accelerators": ["nvidia.com/gpu", "example.com/fpga"]},
        {"nvidia.com/gpu": "8", "example.com/fpga": "2"},
    )["spec"]["containers"][0]["resources"]["requests"]
    assert (requests["nvidia.com/gpu"], requests["example.com/fpga"]) == ("8", "2")


def test_the_policys_placement_reaches_the_probe_pod() -> None:
    template = _pod(
        {
            "probe": {
                "tolerations": [
                    {"key": "nvidia.com/gpu", "operator": "Exists"},
                    {
                        "key": "example.com/maintenance",
                        "value": "soon",
                        "effect": "NoExecute",
                        "tolerationSeconds": 60,
                    },
                ],
                "imagePullSecrets": ["registry-creds"],
                "runtimeClassName": "nvidia",
                "priorityClassName": "gpu-screening",
                "labels": {"team": "infra", "app.kubernetes.io/part-of": "sdc"},
                "annotations": {"sidecar.istio.io/inject": "false"},
            }
        },
        {"nvidia.com/gpu": "8"},
        probe_priority_class="sdcguard-probe",
    )
    spec, meta = template["spec"], template["metadata"]
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["imagePullSecrets"] == [{"name": "registry-creds"}]
    assert spec["priorityClassName"] == "gpu-screening"  # the policy's wins
    assert {"key": "nvidia.com/gpu", "operator": "Exists"} in spec["tolerations"]
    assert {
        "key": "example.com/maintenance",
        "operator": "Equal",
        "value": "soon",
        "effect": "NoExecute",
        "tolerationSeconds": 60,
    } in spec["tolerations"]
    # sdcguard's own tolerations stay, and nothing tolerates everything.
    assert {"key": "sdcguard.dev/testing", "operator": "Exists"} in spec["tolerations"]
    assert all(t.get("key") for t in spec["tolerations"])
    assert meta["labels"]["team"] == "infra"
    assert meta["labels"]["app.kubernetes.io/component"] == "sdcprobe"
    assert meta["annotations"]["sidecar.istio.io/inject"] == "false"
    assert meta["annotations"]["karpenter.sh/do-not-disrupt"] == "true"


def test_without_the_policys_placement_the_operator_settings_apply() -> None:
    spec = _pod({}, {"nvidia.com/gpu": "8"}, probe_priority_class="sdcguard-probe")["spec"]
    assert spec["priorityClassName"] == "sdcguard-probe"
    assert "runtimeClassName" not in spec and "imagePullSecrets" not in spec
    assert {"key": "nvidia.com/gpu", "operator": "Exists"} in spec["tolerations"]


# ---------------------------------------------------------------- simulated shapes


def _simulated(entry: dict[str, Any]) -> NodeSnapshot:
    """The Node the simulator registers for a one-node fleet file ``entry``."""
    fleet = parse_fleet({"name": "shapes", "nodes": [entry]})
    cfg = fleet.nodes[0]
    body = node_manifest(cfg, NOW)
    body["status"] = node_status(cfg, NOW, NOW - HOUR)
    return NodeSnapshot.from_body(body)


def test_a_simulated_mig_node_is_screened_on_all_its_instances() -> None:
    snapshot = _simulated({"name": "mig-0", "instanceType": "p4de.24xlarge"})
    spec = SDCPolicySpec()
    facts = NodeFacts.from_snapshot(snapshot, spec.accelerators)
    # 8 A100s, all-balanced: 16 x 1g.10gb, 8 x 2g.20gb, 8 x 3g.40gb; no whole GPU.
    assert (facts.accelerators, facts.mixed_mig) == (32, "")
    assert snapshot.labels["nvidia.com/mig.strategy"] == "mixed"
    requests = _pod({}, dict(snapshot.allocatable))["spec"]["containers"][0]["resources"][
        "requests"
    ]
    assert {k: v for k, v in requests.items() if k.startswith("nvidia.com/")} == {
        "nvidia.com/mig-1g.10gb": "16",
        "nvidia.com/mig-2g.20gb": "8",
        "nvidia.com/mig-3g.40gb": "8",
    }


def test_a_simulated_gke_pool_taint_is_tolerated_by_default() -> None:
    snapshot = _simulated(
        {
            "name": "gke-0",
            "instanceType": "a3-highgpu-8g",
            "taints": ["nvidia.com/gpu=present:NoSchedule"],
        }
    )
    assert [(t.key, t.value, t.effect) for t in snapshot.taints] == [
        ("nvidia.com/gpu", "present", "NoSchedule")
    ]
    reason, starts, note = _due(snapshot.taints)
    assert reason is None and starts, note
    reason, _, message = _due(snapshot.taints, probe={"tolerations": []})
    assert reason == WaitReason.FOREIGN_TAINT and "spec.probe.tolerations" in message


# ---------------------------------------------------------------- new gated nodes


@pytest.mark.parametrize(
    ("taints", "ready", "written", "reason"),
    [
        # A wait only a person ends: the never-labelled node says it.
        ((GKE_TAINT,), True, True, WaitReason.FOREIGN_TAINT),
        # A wait that passes on its own: no write until the test starts.
        ((), False, False, None),
    ],
)
def test_a_new_gated_node_is_written_only_for_a_wait_a_person_must_end(
    taints: tuple[Taint, ...], ready: bool, written: bool, reason: WaitReason | None
) -> None:
    gate = Taint("sdcguard.dev/unqualified", "NoSchedule")
    n = dataclasses.replace(node(taints=(gate, *taints)), ready=ready)
    d = decide(Observed(node=n, idle_since=NOW - HOUR), policy(probe={"tolerations": []}), NOW)
    assert bool(d.actions) is written
    assert (d.wait.reason if d.wait else None) == reason
    if written:
        assert d.wait is not None and "spec.probe.tolerations" in d.wait.message


# ---------------------------------------------------------------- MIG pods


def expired_node(name: str, allocatable: dict[str, str]) -> NodeSnapshot:
    """A Ready node qualified long before the policy's maxQualificationAge of an hour."""
    return NodeSnapshot.from_body(
        {
            "metadata": {
                "name": name,
                "uid": f"{name}-uid",
                "resourceVersion": "3",
                "creationTimestamp": "2025-06-01T10:00:00Z",
                "labels": {"sdcguard.dev/state": "Qualified"},
                "annotations": {"sdcguard.dev/qualified-at": "2025-05-01T10:00:00Z"},
            },
            "spec": {"taints": []},
            "status": {
                "allocatable": allocatable,
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    )


def screenings_started(nodes: list[NodeSnapshot], pods: list[dict[str, Any]]) -> int:
    """SDCTests one pass creates for ``nodes`` (all due for re-qualification) with
    ``pods`` running on them or pending."""
    from sdcguard.adapters import observe
    from sdcguard.adapters.reconciler import FleetView

    pol = SDCPolicy.model_validate(
        {
            "metadata": {"name": "fleet", "generation": 1, "resourceVersion": "1"},
            "spec": {
                "triggers": {"maxQualificationAge": "1h"},
                "budgets": {"maxUnavailable": "100%"},
            },
        }
    )
    metrics = Metrics()
    writer = _Recorder(api=client.ApiClient(), metrics=metrics)
    rec = Reconciler(writer=writer, settings=Settings(metrics_port=0), metrics=metrics)
    view = FleetView(nodes={n.name: n for n in nodes}, policies={"fleet": {}})
    for pod in pods:
        if (use := observe.pod_use(pod)) is not None:
            view.busy.setdefault(use.node_name, []).append(use)
        if (demand := observe.pending_demand(pod)) is not None:
            view.pending.append(demand)
    rec.run_pass(pol, view, NOW)
    return sum(1 for kind, _ in writer.calls if kind == "sdctests-create")


def test_pods_on_mig_instances_make_the_node_busy_and_pending_ones_hold_it() -> None:
    """A policy listing nvidia.com/gpu: a Pod using one MIG instance keeps its node from
    a routine screening, and a pending Pod asking for a profile holds screening back."""
    from sdcguard.adapters import observe
    from tests.unit.test_apply_order import _pod as workload

    migs = {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "56"}
    nodes = [expired_node(n, migs) for n in ("mig-1", "mig-2")]

    def tests_started(pods: list[dict[str, Any]]) -> int:
        return screenings_started(nodes, pods)

    assert tests_started([]) == 2, "both expired qualifications are screened"
    assert tests_started([workload("mig-1", {"nvidia.com/mig-1g.10gb": "1"})]) == 1
    # A pod holding devices through a DRA ResourceClaim names no resource: its node is
    # busy all the same (the claim's devices may be the node's GPUs).
    claimed = workload("mig-2", {})
    claimed["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "all"}]
    assert tests_started([claimed]) == 1, "the claim-holding pod's node is busy"
    use = observe.pod_use(claimed)
    assert use is not None and use.node_name == "mig-2" and use.uses_any(["nvidia.com/gpu"])
    pending = workload(None, {"nvidia.com/mig-1g.10gb": "2"}, phase="Pending")
    assert tests_started([pending]) == 0, "a pending pod needs these nodes"
