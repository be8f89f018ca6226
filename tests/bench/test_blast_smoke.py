"""The workload record's benchmark measures what it says, at a size that runs in seconds.

Marked ``cluster`` (it starts no control plane): owners are read over HTTP from the
benchmark's local fake API server, which the unit tests' guard would refuse."""

from __future__ import annotations

import pytest
from bench.scale.blast import measure

pytestmark = pytest.mark.cluster


def test_a_small_churning_fleet_writes_only_changed_records_within_the_bound() -> None:
    row = measure(100, 3)
    assert row["writes"] > 0
    assert row["writes_to_nodes_without_change"] == 0
    assert row["idle_nodes_written"] == 0
    assert row["max_writes_one_node_one_period"] <= 2  # a first record: create + status
    assert row["hot_node_entries"] == 1  # 180 short Pods of one Job: one entry
    assert row["hot_node_pod_count"] == 180
    assert row["largest_record_bytes"] < 4096
