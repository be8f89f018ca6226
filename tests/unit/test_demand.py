"""Pending demand is judged with the scheduling predicates that decide whether a pending
Pod could run on a node (``domain.demand``): a Pod that fits no node holds nothing back."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from sdcguard.adapters import observe
from sdcguard.adapters.observations import needed
from sdcguard.adapters.pass_state import FleetView
from sdcguard.domain import keys
from sdcguard.domain.demand import (
    NodeSelectorTerm,
    PodPlacement,
    Requirement,
    Toleration,
    could_run_on,
)
from sdcguard.domain.observed import NodeSnapshot, Taint

GPU = "nvidia.com/gpu"
LABELS = {"pool": "a100", "zone": "z1", "gpus": "8"}
ALLOCATABLE = {GPU: "8", "cpu": "96", "memory": "1Ti"}


def term(*exprs: Requirement, fields: tuple[Requirement, ...] = ()) -> NodeSelectorTerm:
    return NodeSelectorTerm(match_expressions=exprs, match_fields=fields)


ROWS: list[tuple[str, PodPlacement, tuple[Taint, ...], bool]] = [
    ("no constraints", PodPlacement(), (), True),
    ("selector matches", PodPlacement(node_selector={"pool": "a100"}), (), True),
    ("selector misses", PodPlacement(node_selector={"pool": "h100"}), (), False),
    ("In", PodPlacement(required_terms=(term(Requirement("zone", "In", ("z1", "z2"))),)), (), True),
    (
        "In misses",
        PodPlacement(required_terms=(term(Requirement("zone", "In", ("z9",))),)),
        (),
        False,
    ),
    (
        "NotIn",
        PodPlacement(required_terms=(term(Requirement("zone", "NotIn", ("z1",))),)),
        (),
        False,
    ),
    (
        "NotIn absent",
        PodPlacement(required_terms=(term(Requirement("x", "NotIn", ("1",))),)),
        (),
        True,
    ),
    ("Exists", PodPlacement(required_terms=(term(Requirement("pool", "Exists")),)), (), True),
    (
        "DoesNotExist",
        PodPlacement(required_terms=(term(Requirement("pool", "DoesNotExist")),)),
        (),
        False,
    ),
    ("Gt", PodPlacement(required_terms=(term(Requirement("gpus", "Gt", ("4",))),)), (), True),
    ("Lt", PodPlacement(required_terms=(term(Requirement("gpus", "Lt", ("4",))),)), (), False),
    (
        "Gt not a number",
        PodPlacement(required_terms=(term(Requirement("zone", "Gt", ("4",))),)),
        (),
        False,
    ),
    (
        "terms are ORed",
        PodPlacement(
            required_terms=(
                term(Requirement("zone", "In", ("z9",))),
                term(Requirement("pool", "Exists")),
            )
        ),
        (),
        True,
    ),
    ("empty term selects nothing", PodPlacement(required_terms=(term(),)), (), False),
    (
        "matchFields metadata.name",
        PodPlacement(
            required_terms=(term(fields=(Requirement("metadata.name", "In", ("gpu-1",)),)),)
        ),
        (),
        True,
    ),
    (
        "matchFields another node",
        PodPlacement(
            required_terms=(term(fields=(Requirement("metadata.name", "In", ("gpu-2",)),)),)
        ),
        (),
        False,
    ),
    ("untolerated NoSchedule", PodPlacement(), (Taint("team", "NoSchedule", "x"),), False),
    ("untolerated NoExecute", PodPlacement(), (Taint("team", "NoExecute", "x"),), False),
    ("PreferNoSchedule only steers", PodPlacement(), (Taint("team", "PreferNoSchedule"),), True),
    (
        "tolerated Equal",
        PodPlacement(tolerations=(Toleration("team", "Equal", "x", "NoSchedule"),)),
        (Taint("team", "NoSchedule", "x"),),
        True,
    ),
    (
        "Equal with another value",
        PodPlacement(tolerations=(Toleration("team", "Equal", "y"),)),
        (Taint("team", "NoSchedule", "x"),),
        False,
    ),
    (
        "Exists on the key, any effect",
        PodPlacement(tolerations=(Toleration("team", "Exists"),)),
        (Taint("team", "NoExecute", "x"),),
        True,
    ),
    (
        "toleration of another effect",
        PodPlacement(tolerations=(Toleration("team", "Exists", effect="NoSchedule"),)),
        (Taint("team", "NoExecute"),),
        False,
    ),
    (
        "empty key Exists tolerates all",
        PodPlacement(tolerations=(Toleration("", "Exists"),)),
        (Taint("a", "NoSchedule"), Taint("b", "NoExecute")),
        True,
    ),
    (
        "sdcguard's testing taint is ours to lift",
        PodPlacement(),
        (Taint("sdcguard.dev/testing", "NoSchedule"),),
        True,
    ),
    ("8 GPUs fit", PodPlacement(requests={GPU: Decimal(8)}), (), True),
    ("16 GPUs do not fit 8", PodPlacement(requests={GPU: Decimal(16)}), (), False),
    ("a device the node lacks", PodPlacement(requests={"example.com/nic": Decimal(1)}), (), False),
    ("cpu over allocatable", PodPlacement(requests={"cpu": Decimal(200)}), (), False),
    ("memory fits", PodPlacement(requests={"memory": Decimal(2**39)}), (), True),
    (
        "unstated standard resource not judged",
        PodPlacement(requests={"ephemeral-storage": Decimal(10**15)}),
        (),
        True,
    ),
]


@pytest.mark.parametrize(
    ("pod", "taints", "expected"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS]
)
def test_predicate_rows(pod: PodPlacement, taints: tuple[Taint, ...], expected: bool) -> None:
    reserved = frozenset({"sdcguard.dev/testing"})
    assert could_run_on(pod, "gpu-1", LABELS, taints, ALLOCATABLE, reserved) is expected


def _pod(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ml", "name": "train"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {GPU: "8"}}}], **spec},
        "status": {"phase": "Pending"},
    }


def _view(pods: list[dict[str, Any]], **node: Any) -> FleetView:
    snapshot = NodeSnapshot(name="gpu-1", labels=LABELS, allocatable=ALLOCATABLE, **node)
    view = FleetView(nodes={"gpu-1": snapshot})
    view.pending = [d for p in pods if (d := observe.pending_demand(p)) is not None]
    return view


def test_a_16_gpu_pod_on_8_gpu_nodes_holds_nothing_back() -> None:
    """The issue's case: a pod that can never schedule is demand for no node."""
    big = _pod({"containers": [{"name": "c", "resources": {"limits": {GPU: "16"}}}]})
    assert not needed("gpu-1", [GPU], _view([big]))
    assert needed("gpu-1", [GPU], _view([_pod({})])), "an 8-GPU pod is demand"


def test_the_pod_is_decoded_with_affinity_tolerations_and_requests() -> None:
    body = _pod(
        {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "zone", "operator": "In", "values": ["z2"]}
                                ]
                            }
                        ]
                    }
                }
            },
            "tolerations": [{"key": "team", "operator": "Exists"}],
            "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "4"}}}],
        }
    )
    demand = observe.pending_demand(body)
    assert demand is not None
    assert demand.placement.required_terms == (term(Requirement("zone", "In", ("z2",))),)
    assert demand.placement.tolerations == (Toleration("team", "Exists"),)
    assert demand.placement.requests == {GPU: Decimal(8), "cpu": Decimal(4)}
    assert not needed("gpu-1", [GPU], _view([body])), "affinity selects another zone"


def test_taints_sdcguard_placed_do_not_hide_demand_but_others_do() -> None:
    ours = (Taint("sdcguard.dev/quarantine", "NoSchedule"),)
    owned = {keys.OWNED_TAINTS: "sdcguard.dev/quarantine"}
    assert needed("gpu-1", [GPU], _view([_pod({})], taints=ours, annotations=owned))
    testing = (Taint("sdcguard.dev/testing", "NoSchedule"),)
    assert needed("gpu-1", [GPU], _view([_pod({})], taints=testing), "sdcguard.dev/testing")
    foreign = (Taint("maintenance", "NoExecute"),)
    assert not needed("gpu-1", [GPU], _view([_pod({})], taints=foreign))
