"""The adopter's pure part: which simulated node an autoscaler's Node becomes."""

from __future__ import annotations

from sdcdev.sim.adopt import AdoptRule, adopted_config, adoption_fleet
from sdcdev.sim.fleet import FLEET_LABEL, FaultProfile

RULE = AdoptRule({"karpenter.sh/nodepool": "gpu"})


def karpenter_node(instance_type: str = "p5.48xlarge") -> dict[str, object]:
    return {
        "metadata": {
            "name": "kwok-gpu-abc",
            "labels": {
                "karpenter.sh/nodepool": "gpu",
                "node.kubernetes.io/instance-type": instance_type,
                "topology.kubernetes.io/zone": "test-zone-a",
            },
        },
        "spec": {"providerID": "kwok://kwok-gpu-abc"},
    }


def test_rule_matches_all_its_labels() -> None:
    assert RULE.matches({"karpenter.sh/nodepool": "gpu", "x": "y"})
    assert not RULE.matches({"karpenter.sh/nodepool": "cpu"})
    assert not RULE.matches({})


def test_catalogue_type_becomes_a_simulated_node_of_that_type() -> None:
    cfg = adopted_config(karpenter_node(), RULE, "karp")
    assert not isinstance(cfg, str)
    assert cfg.instance_type.name == "p5.48xlarge"
    assert cfg.instance_type.accelerator_resource == "nvidia.com/gpu"
    assert cfg.zone == "test-zone-a"
    assert cfg.provider_id == "kwok://kwok-gpu-abc"
    # The autoscaler's labels stay; device-plugin labels and the fleet label are added.
    assert cfg.labels["karpenter.sh/nodepool"] == "gpu"
    assert cfg.labels["nvidia.com/gpu.product"].startswith("NVIDIA-H100")
    assert cfg.labels[FLEET_LABEL] == "karp"
    assert cfg.taints == ()


def test_rule_fault_profile_is_carried() -> None:
    profile = FaultProfile(
        faults=[{"site": "matmul", "rate": 1.0e-3, "bits": "exp", "mode": "flip", "device": 1}]
    )
    cfg = adopted_config(karpenter_node(), AdoptRule(RULE.match_labels, profile), "karp")
    assert not isinstance(cfg, str)
    assert cfg.fault_profile == profile


def test_unknown_instance_type_is_refused_with_reason() -> None:
    why = adopted_config(karpenter_node("c-4x-amd64-linux"), RULE, "karp")
    assert isinstance(why, str)
    assert "'c-4x-amd64-linux'" in why and "p5.48xlarge" in why


def test_adoption_fleet_has_no_nodes_and_no_workloads() -> None:
    fleet = adoption_fleet("karp")
    assert fleet.nodes == ()
    assert not fleet.workloads.enabled
    assert not fleet.repair.enabled
