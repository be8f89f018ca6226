"""The fleet copy's benchmark measures what it says, at a size that runs in seconds."""

from __future__ import annotations

from bench.scale.inventory import linear_fit, measure, pod_body


def test_a_small_run_keeps_exactly_the_pods_that_use_or_wait_for_gpus() -> None:
    nodes, per_node = 60, 20
    row = measure(nodes, per_node)
    pods = nodes * per_node
    expected = sum(
        1
        for i in range(pods)
        if "nvidia.com/gpu" in pod_body(i, nodes)["spec"]["containers"][0]["resources"]["requests"]
    )
    assert row["pods"] == pods
    assert row["pods_kept"] == expected == row["pods_grouped"]
    assert 0 < expected < pods
    assert row["bytes_per_node"] > 0 and row["bytes_per_pod_listed"] > 0
    assert row["list_seconds"] > 0


def test_the_fit_recovers_a_line() -> None:
    a, b, r2 = linear_fit([1.0, 2.0, 3.0, 4.0], [2.5, 4.5, 6.5, 8.5])
    assert abs(a - 0.5) < 1e-9 and abs(b - 2.0) < 1e-9 and abs(r2 - 1.0) < 1e-9
