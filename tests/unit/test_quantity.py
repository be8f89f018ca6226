"""Extended-resource counts, read the same way from Node allocatable and Pod requests."""

from typing import Any

import pytest

from sdcguard.adapters.observe import pending_demand, pod_use
from sdcguard.domain.observed import NodeFacts
from sdcguard.domain.quantity import whole_quantity

GPU = "nvidia.com/gpu"


@pytest.mark.parametrize(
    ("value", "count"),
    [("8", 8), (8, 8), ("0", 0), ("-1", -1), ("1k", 0), ("0.5", 0), ("", 0), (None, 0)],
)
def test_whole_numbers_count_and_anything_else_is_none(value: object, count: int) -> None:
    assert whole_quantity(value) == count


def _pod(requests: dict[str, Any], limits: dict[str, Any] | None = None) -> dict[str, Any]:
    resources = {"requests": requests, "limits": limits or {}}
    return {
        "metadata": {"namespace": "ml", "name": "train"},
        "spec": {"containers": [{"name": "c", "resources": resources}]},
        "status": {"phase": "Pending"},
    }


def test_node_and_pod_read_a_count_alike() -> None:
    for value in ("4", "1k", "garbage"):
        node = NodeFacts.from_body({"status": {"allocatable": {GPU: value}}}, [GPU])
        demand = pending_demand(_pod({GPU: value}), [GPU])
        assert node.accelerators == whole_quantity(value)
        assert (demand.resources.get(GPU, 0) if demand else 0) == whole_quantity(value)


def test_a_pod_with_unreadable_requests_uses_no_accelerators() -> None:
    body = _pod({GPU: "1k"}, {GPU: "lots"})
    body["spec"]["nodeName"] = "n1"
    body["status"]["phase"] = "Running"
    assert pod_use(body, [GPU]) is None
    body["spec"]["containers"][0]["resources"]["limits"] = {GPU: "2"}
    assert pod_use(body, [GPU]) is not None
