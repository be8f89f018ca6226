"""A host that cannot run a real node gets a message saying what is missing."""

from __future__ import annotations

import pytest

from sdcdev.cluster import realnode


def test_without_root_the_real_node_refuses_with_a_clear_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(realnode.os, "geteuid", lambda: 1000)
    with pytest.raises(realnode.ClusterError, match="a real node needs root"):
        realnode.check_host()


def test_without_cgroups_the_real_node_refuses_with_a_clear_message(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.setattr(realnode.os, "geteuid", lambda: 0)
    monkeypatch.setattr(realnode, "CGROUP_ROOT", tmp_path)
    with pytest.raises(realnode.ClusterError, match="no cgroup hierarchy"):
        realnode.check_host()
