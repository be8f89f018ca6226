"""Node manifests, fault draws, repairs and customer pods (pure parts)."""

from __future__ import annotations

import random
from datetime import UTC, datetime

from sdcdev.sim.fleet import Fleet, parse_fleet
from sdcdev.sim.nodes import node_manifest
from sdcdev.sim.repair import resolution_patch, ticket_view
from sdcdev.sim.state import FleetState
from sdcdev.sim.workloads import accelerator_types, next_workload, workload_pod

NOW = datetime(2026, 1, 1, tzinfo=UTC)
FAULT = {"site": "matmul", "rate": 1e-3, "bits": "exp"}


def fleet() -> Fleet:
    return parse_fleet(
        {
            "name": "unit",
            "seed": 5,
            "defaults": {"taints": ["sdcguard.dev/unqualified:NoSchedule"]},
            "nodes": [
                {"name": "h100", "instanceType": "p5.48xlarge"},
                {"name": "trn", "instanceType": "trn1.32xlarge"},
                {"name": "tpu", "instanceType": "ct5lp-hightpu-4t"},
                {"name": "cpu", "instanceType": "m7i.8xlarge"},
                {
                    "name": "flaky",
                    "instanceType": "trn1.32xlarge",
                    "faultProfile": {"intermittent": 0.3, "faults": [FAULT], "repairsNeeded": 2},
                },
            ],
        }
    )


def test_node_manifest_has_extended_resources_labels_and_gate_taint() -> None:
    f = fleet()
    h100 = node_manifest(f.node("h100"), NOW)
    assert h100["status"]["capacity"]["nvidia.com/gpu"] == "8"
    assert h100["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert h100["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert h100["spec"]["taints"] == [
        {"key": "sdcguard.dev/unqualified", "value": "", "effect": "NoSchedule"}
    ]
    assert h100["spec"]["providerID"].startswith("aws:///us-east-2a/i-0")
    ready = next(c for c in h100["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"
    trn = node_manifest(f.node("trn"), NOW)["status"]["capacity"]
    assert trn["aws.amazon.com/neuron"] == "16" and trn["aws.amazon.com/neuroncore"] == "32"
    tpu = node_manifest(f.node("tpu"), NOW)
    assert tpu["status"]["capacity"]["google.com/tpu"] == "4"
    assert tpu["spec"]["providerID"].startswith("gce://")
    cpu = node_manifest(f.node("cpu"), NOW)["status"]["capacity"]
    assert not any("/" in k and k.endswith(("gpu", "tpu", "neuron")) for k in cpu)


def test_intermittent_faults_follow_the_seeded_stream() -> None:
    state_a, state_b = FleetState(fleet(), 2), FleetState(fleet(), 2)
    a = [state_a.draw_faults("flaky") is not None for _ in range(200)]
    b = [state_b.draw_faults("flaky") is not None for _ in range(200)]
    assert a == b
    assert 30 <= sum(a) <= 90  # about 30% of 200
    assert all(state_a.draw_faults("h100") is None for _ in range(10))


def test_repeat_offender_needs_two_repairs() -> None:
    state = FleetState(fleet(), 2)
    assert state.repair("flaky") is False
    assert state.snapshot().node("flaky").faulty
    assert state.repair("flaky") is True
    snap = state.snapshot().node("flaky")
    assert not snap.faulty and snap.repairs == 2
    assert state.draw_faults("flaky") is None


def test_customer_pods_ask_for_accelerators_of_one_type() -> None:
    f = fleet()
    types = accelerator_types(f)
    assert {t.name for t, _ in types} == {"p5.48xlarge", "trn1.32xlarge", "ct5lp-hightpu-4t"}
    rng = random.Random(1)
    reqs = [next_workload(rng, types, f.workloads) for _ in range(50)]
    assert all(r is not None for r in reqs)
    counts = {r.count for r in reqs if r}
    assert 1 in counts and len(counts) > 1
    req = reqs[0]
    assert req is not None
    pod = workload_pod(f, req, f.workloads)
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {req.resource: str(req.count)}
    assert pod["metadata"]["annotations"]["sim.sdcguard.dev/run-seconds"] == str(req.run_seconds)
    assert "tolerations" not in pod["spec"]  # customers respect the operator's taints


def test_ticket_resolution() -> None:
    t = ticket_view({"metadata": {"name": "rt-1"}, "spec": {"nodeName": "h100"}})
    assert t.open
    closed = ticket_view({"metadata": {"name": "rt-2"}, "status": {"phase": "Closed"}})
    assert not closed.open
    f = fleet()
    body = resolution_patch(f.repair, "rt-1", "h100", True, 1)["spec"]
    assert body["resolution"] == "Repaired"
    assert body["external"]["system"] == "sim" and body["external"]["id"].startswith("SIM-")
    assert "h100" in body["resolutionNote"]
