"""Quantities read by the Kubernetes grammar, and extended-resource counts read the same
way from Node allocatable and Pod requests."""

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.utils import parse_quantity as client_parse_quantity

from sdcguard.adapters.observe import pending_demand, pod_use
from sdcguard.domain.observed import NodeFacts
from sdcguard.domain.quantity import parse_quantity, whole_quantity

GPU = "nvidia.com/gpu"


@pytest.mark.parametrize(
    ("value", "count"),
    [
        ("8", 8),
        (8, 8),
        ("0", 0),
        ("-1", -1),
        ("1k", 1000),
        ("2Ki", 2048),
        ("1e3", 1000),
        ("1.5k", 1500),
        ("8000m", 8),
        ("0.5", 0),
        ("500m", 0),
        ("", 0),
        (None, 0),
        (True, 0),
        ("lots", 0),
    ],
)
def test_whole_numbers_count_and_anything_else_is_none(value: object, count: int) -> None:
    assert whole_quantity(value) == count


_DIGITS = st.text("0123456789", min_size=1, max_size=12)
_NUMBERS = st.one_of(
    _DIGITS,
    st.builds("{}.{}".format, _DIGITS, _DIGITS),
    st.builds("{}.".format, _DIGITS),
    st.builds(".{}".format, _DIGITS),
)
_SUFFIXES = st.one_of(
    st.sampled_from(["", "n", "u", "m", "k", "M", "G", "T", "P", "E"]),
    st.sampled_from(["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]),
    st.builds(
        "{}{}{}".format,
        st.sampled_from("eE"),
        st.sampled_from(["", "+", "-"]),
        st.integers(0, 40).map(str),
    ),
)
QUANTITIES = st.builds("{}{}{}".format, st.sampled_from(["", "+", "-"]), _NUMBERS, _SUFFIXES)
"""Every form of apimachinery's quantity grammar."""


@given(QUANTITIES)
def test_every_grammatical_quantity_reads_as_the_kubernetes_client_reads_it(text: str) -> None:
    assert parse_quantity(text) == client_parse_quantity(text)


@pytest.mark.parametrize(
    "text",
    ["", "k", "1x", "1ki", "1Ki2", "1e", "1e1.5", "1..2", "--1", "Mi", "0x10", "1KiB", "e3"],
)
def test_what_neither_reads_is_refused_by_both(text: str) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        parse_quantity(text)
    with pytest.raises(ValueError):
        client_parse_quantity(text)


@pytest.mark.parametrize("text", [" 1", "1 ", "1_000", "NaN", "Infinity", "1e3k", "1 k"])
def test_what_only_the_laxer_client_reads_is_refused_as_the_api_server_refuses_it(
    text: str,
) -> None:
    client_parse_quantity(text)  # the client hands these to Decimal, which takes them
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        parse_quantity(text)


def test_suffixes_scale_by_their_powers() -> None:
    assert parse_quantity("1k") == 1000
    assert parse_quantity("1Ki") == 1024
    assert parse_quantity("3Gi") == 3 * 1024**3
    assert parse_quantity("250m") == Decimal("0.25")
    assert parse_quantity("1E") == 10**18
    assert parse_quantity("1e-3") == Decimal("0.001")


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
