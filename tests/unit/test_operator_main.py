"""``python -m sdcguard``: the fleet's copy starts listing before Kopf runs, alone or
with leader election, and Kopf's startup handler is handed that warm copy (a start on a
long history overlaps the API server's part of the lists with the rest of the start;
``bench.retention.run`` measures it)."""

from __future__ import annotations

from typing import Any

import kopf
import pytest
from kubernetes import client

import sdcguard.__main__ as entry
from sdcguard import logs
from sdcguard.adapters import kube
from sdcguard.adapters.inventory import Inventory


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """What happened, in order: each inventory warmed, and Kopf's run with its memo."""
    events: list[tuple[str, Any]] = []
    monkeypatch.setattr(Inventory, "warm", lambda self: events.append(("warm", self)))
    monkeypatch.setattr(kube, "make_api_client", lambda: client.ApiClient(client.Configuration()))
    monkeypatch.setattr(kopf, "run", lambda **kwargs: events.append(("kopf", kwargs)))
    monkeypatch.setattr(logs, "configure_logging", lambda *_: None)  # the suite's own
    monkeypatch.delenv("SDCGUARD_LEADER_ELECTION", raising=False)
    return events


def test_a_single_replica_warms_its_copy_before_kopf_and_hands_it_over(
    seen: list[tuple[str, Any]],
) -> None:
    assert entry.main(["--liveness", ""]) == 0
    assert [what for what, _ in seen] == ["warm", "kopf"]
    memo = seen[1][1]["memo"]
    assert memo.inventory is seen[0][1]  # the startup handler takes this copy
    # Alone, the process stops its copy with Kopf (nothing stands by).
    assert not memo.get("keep_inventory")


def test_with_leader_election_the_copy_is_warm_before_the_first_term(
    seen: list[tuple[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    import sdcguard.runtime.terms as terms

    terms_seen: dict[str, Any] = {}

    def lead(election: Any, **kwargs: Any) -> int:
        terms_seen.update(kwargs)
        return 0

    monkeypatch.setattr(terms, "lead_while_elected", lead)
    monkeypatch.setenv("SDCGUARD_LEADER_ELECTION", "true")
    monkeypatch.setenv("SDCGUARD_METRICS_PORT", "0")
    assert entry.main(["--liveness", ""]) == 0
    assert [what for what, _ in seen] == ["warm"]
    memo = terms_seen["memo"]
    assert memo.inventory is seen[0][1]
    assert memo.keep_inventory  # a lost Lease keeps the copy warm for the next term
    assert terms_seen["synced"] == memo.inventory.synced
