"""DRA-only nodes (spec.dra): GPUs published only through ResourceSlices, no device
plugin. The node's device count comes from its slices, the probe claims every device
through a ResourceClaimTemplate, pods holding or waiting for claims keep it from
screening, and a cluster without DRA leaves nothing waiting (the cluster test in
tests/dra/test_dra_only.py runs it on the real scheduler)."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from sdcguard.adapters import observe
from sdcguard.adapters.reconciler import Reconciler
from sdcguard.api import SDCPolicy, SDCPolicySpec, SDCTest
from sdcguard.builders.probe_job import build_claim_template, build_probe_job, claim_template_name
from sdcguard.domain.dra import SliceSnapshot, device_counts
from sdcguard.domain.observed import NodeFacts, NodeSnapshot, dra_claims
from sdcguard.metrics import Metrics
from sdcguard.runtime.mirror import Kind, Mirror
from sdcguard.settings import Settings
from tests.unit.test_apply_order import _pod as workload
from tests.unit.test_apply_order import _Recorder
from tests.unit.test_cluster_shapes import expired_node, screenings_started

GPU = "gpu.nvidia.com"


def _slice(node: str, devices: int, *, pool: str = "", generation: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{node}-{pool or node}-{generation}"},
        "spec": {
            "driver": GPU,
            "nodeName": node,
            "pool": {"name": pool or node, "generation": generation, "resourceSliceCount": 1},
            "devices": [{"name": f"gpu-{i}"} for i in range(devices)],
        },
    }


def _snapshots(*bodies: dict[str, Any]) -> list[SliceSnapshot]:
    return [s for b in bodies if (s := SliceSnapshot.from_body(b)) is not None]


def test_a_nodes_devices_are_its_newest_slices_per_driver() -> None:
    assert device_counts(_snapshots(_slice("n", 8))) == ((GPU, 8),)
    # A driver restart: generation 2 is published before generation 1 goes.
    assert device_counts(_snapshots(_slice("n", 8), _slice("n", 7, generation=2))) == ((GPU, 7),)
    # Two pools of one driver add up.
    assert device_counts(_snapshots(_slice("n", 4, pool="a"), _slice("n", 4, pool="b"))) == (
        (GPU, 8),
    )
    assert device_counts(_snapshots(_slice("n", 0))) == ()


def test_a_slice_for_no_single_node_is_not_kept() -> None:
    shared = _slice("n", 8)
    del shared["spec"]["nodeName"]
    shared["spec"]["allNodes"] = True
    assert SliceSnapshot.from_body(shared) is None
    assert SliceSnapshot.from_body({"metadata": {"name": "x"}}) is None


def test_the_probe_claims_the_classes_whose_drivers_publish_devices_here() -> None:
    classes = [(GPU, GPU), ("gpu-all.example.com", GPU), ("fpga.example.com", "fpga.example")]
    # One driver named by two classes is claimed once; a driver with none here not at all.
    assert dra_claims(((GPU, 8),), classes) == ((GPU, 8),)
    assert dra_claims((("fpga.example", 2), (GPU, 8)), classes) == (
        (GPU, 8),
        ("fpga.example.com", 2),
    )
    assert dra_claims((), classes) == ()


def _node(allocatable: dict[str, str], dra: tuple[tuple[str, int], ...]) -> NodeSnapshot:
    return NodeSnapshot(
        name="gpu-1",
        uid="u1",
        resource_version="3",
        ready=True,
        allocatable=allocatable,
        dra_devices=dra,
    )


def test_a_dra_only_node_counts_its_published_devices() -> None:
    spec = SDCPolicySpec()
    facts = NodeFacts.from_snapshot(
        _node({"cpu": "96"}, ((GPU, 8),)), spec.accelerators, None, spec.dra_classes
    )
    assert (facts.accelerators, facts.dra_claims) == (8, ((GPU, 8),))
    # A node that advertises the extended resource is screened through it.
    both = NodeFacts.from_snapshot(
        _node({"nvidia.com/gpu": "8"}, ((GPU, 8),)), spec.accelerators, None, spec.dra_classes
    )
    assert (both.accelerators, both.dra_claims) == (8, ())
    # spec.dra: [] turns DRA-only screening off.
    off = SDCPolicySpec(dra=[])
    facts = NodeFacts.from_snapshot(
        _node({"cpu": "96"}, ((GPU, 8),)), off.accelerators, None, off.dra_classes
    )
    assert facts.accelerators == 0


def test_spec_dra_defaults_to_nvidias_class_and_refuses_a_class_twice() -> None:
    assert SDCPolicySpec().dra_classes == ((GPU, GPU),)
    twice = [{"deviceClassName": GPU, "driver": GPU}] * 2
    with pytest.raises(ValidationError, match=r"spec\.dra: list each deviceClassName once"):
        SDCPolicySpec.model_validate({"dra": twice})
    schema = SDCPolicySpec.model_json_schema(by_alias=True)
    assert "dra" in schema["properties"]


def _pod_template(snapshot: NodeSnapshot) -> dict[str, Any]:
    pol = SDCPolicy.model_validate({"metadata": {"name": "fleet"}, "spec": {}})
    test = SDCTest.model_validate(
        {
            "metadata": {"name": "gpu-1-acceptance-1", "uid": "u"},
            "spec": {"nodeName": "gpu-1", "policyRef": "fleet", "suite": "acceptance"},
        }
    )
    metrics = Metrics()
    rec = Reconciler(
        writer=_Recorder(api=client.ApiClient(), metrics=metrics),
        settings=Settings(metrics_port=0),
        metrics=metrics,
    )
    spec = pol.spec
    facts = NodeFacts.from_snapshot(snapshot, spec.accelerators, None, spec.dra_classes)
    request = rec.runner.probe_request(pol, test, facts, snapshot)
    job = build_probe_job(request)
    template: dict[str, Any] = job["spec"]["template"]
    return template


def test_a_dra_only_nodes_probe_claims_every_device_through_a_template() -> None:
    template = _pod_template(_node({"cpu": "96"}, ((GPU, 8),)))
    spec = template["spec"]
    assert spec["resourceClaims"] == [
        {"name": "dra-0", "resourceClaimTemplateName": claim_template_name(GPU)}
    ]
    container = spec["containers"][0]
    assert container["resources"]["claims"] == [{"name": "dra-0"}]
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    claim = build_claim_template("sdcguard-system", GPU)
    (request,) = claim["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"] == {
        "deviceClassName": GPU,
        "allocationMode": "All",
        # A verification claims the GPU sdcguard's own device taint took out, too.
        "tolerations": [{"key": "sdcguard.dev/sdc", "operator": "Exists"}],
    }
    assert claim["metadata"]["name"] == "sdcprobe-gpu.nvidia.com"


def test_a_node_with_the_extended_resource_makes_no_claim() -> None:
    spec = _pod_template(_node({"nvidia.com/gpu": "8"}, ((GPU, 8),)))["spec"]
    assert "resourceClaims" not in spec
    assert spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"


def test_claims_held_or_pending_keep_dra_only_nodes_from_screening() -> None:
    nodes = [
        dataclasses.replace(expired_node(n, {"cpu": "96"}), dra_devices=((GPU, 8),))
        for n in ("dra-1", "dra-2")
    ]

    def tests_started(pods: list[dict[str, Any]]) -> int:
        return screenings_started(nodes, pods)

    assert tests_started([]) == 2, "both expired qualifications are screened"
    claimed = workload("dra-1", {})
    claimed["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "all"}]
    assert tests_started([claimed]) == 1, "the claim-holding pod's node is busy"
    pending = workload(None, {}, phase="Pending")
    pending["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "all"}]
    demand = observe.pending_demand(pending)
    assert demand is not None and observe.CLAIMED_DEVICES in demand.resources
    assert tests_started([pending]) == 0, "a pending claim is demand for these nodes"


class _NotServed:
    """A client whose list answers what a cluster without resource.k8s.io/v1 does."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.calls = 0

    def list_cluster_custom_object(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        raise ApiException(status=self.status, reason="NotFound")


@pytest.mark.parametrize("status", [404, 403])
def test_an_optional_kind_the_server_does_not_serve_is_an_empty_synced_copy(
    status: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    kind = Kind(
        "resourceslices",
        "list_cluster_custom_object",
        api="CustomObjectsApi",
        args=("resource.k8s.io", "v1", "resourceslices"),
        optional=True,
    )
    mirror: Mirror[SliceSnapshot] = Mirror(
        client.ApiClient(client.Configuration()), kind, SliceSnapshot.from_body
    )
    fake = _NotServed(status)
    mirror._client = fake
    stop = threading.Event()
    waits: list[float] = []

    def wait(seconds: float) -> bool:
        waits.append(seconds)
        stop.set()
        return True

    monkeypatch.setattr(stop, "wait", wait)
    mirror.run(stop)
    assert mirror.synced.is_set() and len(mirror) == 0
    assert mirror.stats.not_served == 1 and waits == [300.0]
    # A kind that must be served keeps retrying and never syncs on a 404.
    required: Mirror[SliceSnapshot] = Mirror(
        client.ApiClient(client.Configuration()),
        dataclasses.replace(kind, optional=False),
        SliceSnapshot.from_body,
    )
    required._client = _NotServed(status)
    stop2 = threading.Event()
    monkeypatch.setattr(stop2, "wait", lambda s: stop2.set())
    required.run(stop2)
    assert not required.synced.is_set() and required.stats.errors == 1
