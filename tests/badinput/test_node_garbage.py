"""Garbage in sdcguard's own labels and annotations on a Node.

People and tools edit Nodes. Whatever they write into ``sdcguard.dev/*`` keys, the
operator must not crash, must not act on it as if it were true, must recover the
node's state from what the cluster holds (SDCTests, tickets, taints), and must never
remove a taint it did not add, whatever ``sdcguard.dev/owned-taints`` claims.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from sdcdev.harness import (
    GATE,
    GROUP,
    QUARANTINE,
    TESTING,
    VERSION,
    OperatorProcess,
    ProbeKubelet,
    annotate,
    create_policy,
    gpu_nodes,
    list_custom,
    new_case,
    node_state,
    read_node,
    taint_keys,
    trusted_baseline,
    wait_for,
)
from sdcguard.domain import keys

FOREIGN = "example.com/maintenance"


def _tests(api: client.ApiClient, node: str) -> list[dict[str, Any]]:
    return sorted(
        list_custom(api, "sdctests", node),
        key=lambda t: (t["metadata"]["creationTimestamp"], t["metadata"]["name"]),
    )


def _passed(test: dict[str, Any]) -> bool:
    return (test.get("status") or {}).get("phase") == "Passed"


def _healthy(api: client.ApiClient, name: str) -> bool:
    """Qualified, schedulable, none of our taints, a readable qualification time."""
    node = read_node(api, name)
    ann = node.metadata.annotations or {}
    taints = {t.key for t in node.spec.taints or []}
    return (
        (node.metadata.labels or {}).get(keys.LABEL_STATE) == "Qualified"
        and not node.spec.unschedulable
        and not taints & {GATE, TESTING, QUARANTINE}
        and keys.parse_time(ann.get(keys.QUALIFIED_AT)) is not None
    )


def _policy(node: str) -> str:
    """The policy of ``qualified_node`` (harness.create_policy's name for its case)."""
    return "p-" + node.removeprefix("garbage-")


@pytest.fixture
def qualified_node(
    api_client: client.ApiClient, operator: OperatorProcess
) -> Iterator[tuple[str, dict[str, str]]]:
    """One node through acceptance, under a policy of its own; yields (name, outcomes)."""
    case = new_case()
    name = f"garbage-{case}"
    outcomes = {name: "pass"}
    trusted_baseline(api_client)
    with gpu_nodes(api_client, [name], case=case), ProbeKubelet(api_client, outcomes):
        create_policy(api_client, case)
        wait_for(lambda: _healthy(api_client, name), 90, f"{name} to qualify")
        yield name, outcomes
        assert operator.proc is not None and operator.proc.poll() is None, "operator died"
        assert "reconcile pass failed" not in operator.log_path.read_text(errors="replace")


def test_bogus_state_label_is_recovered_without_retesting(
    api_client: client.ApiClient,
    operator: OperatorProcess,
    qualified_node: tuple[str, dict[str, str]],
) -> None:
    name, _ = qualified_node
    before = len(_tests(api_client, name))
    client.CoreV1Api(api_client).patch_node(
        name, {"metadata": {"labels": {keys.LABEL_STATE: "Bogus"}}}
    )
    wait_for(lambda: node_state(api_client, name) != "Bogus", 30, "the label to be rewritten")
    operator.wait_passes(_policy(name))  # a whole full pass over the recovered node
    assert _healthy(api_client, name)
    assert len(_tests(api_client, name)) == before, "re-tested instead of recovered"
    assert GATE not in taint_keys(api_client, name)


def test_bogus_state_label_never_strands_the_node(
    api_client: client.ApiClient, qualified_node: tuple[str, dict[str, str]]
) -> None:
    """Whatever it costs, the node ends Qualified and in service again."""
    name, _ = qualified_node
    client.CoreV1Api(api_client).patch_node(
        name, {"metadata": {"labels": {keys.LABEL_STATE: "Bogus"}}}
    )
    wait_for(lambda: node_state(api_client, name) != "Bogus", 30, "the label to be rewritten")
    wait_for(lambda: _healthy(api_client, name), 90, "the node back in service")


def test_garbage_seq_never_reuses_an_old_test(
    api_client: client.ApiClient,
    operator: OperatorProcess,
    qualified_node: tuple[str, dict[str, str]],
) -> None:
    name, outcomes = qualified_node
    annotate(api_client, name, {keys.SEQ: "abc"})
    operator.wait_passes(_policy(name))  # the garbage is read by a whole full pass
    outcomes[name] = "sdc"  # if it is really tested now, it fails
    annotate(api_client, name, {keys.REQUEST_SUSPECT: "workload saw NaNs"})
    wait_for(
        lambda: [t for t in _tests(api_client, name) if t["spec"]["reason"] == "Suspect"],
        45,
        "a Suspect screening of the node",
    )
    wait_for(
        lambda: node_state(api_client, name) in ("Suspect", "Quarantined"), 60, "the SDC found"
    )


@pytest.mark.parametrize(
    "annotations",
    [
        {keys.QUALIFIED_AT: "yesterday"},
        {keys.INCONCLUSIVE: "lots", keys.RETRY_AFTER: "never"},
        {keys.SUSPECT_CHECKS: ",,,;DROP TABLE", keys.EVIDENCE: "\u2603"},
        {keys.CURRENT_TEST: "no-such-test", keys.STATE_SINCE: "0000-00-00"},
        {keys.CORDONED_BY_US: "maybe", keys.SEQ: "-3"},
    ],
    ids=["qualified-at", "backoff", "suspicion", "current-test", "cordon-and-seq"],
)
def test_garbage_annotations_are_ignored_and_the_node_stays_in_service(
    api_client: client.ApiClient,
    operator: OperatorProcess,
    qualified_node: tuple[str, dict[str, str]],
    annotations: dict[str, str],
) -> None:
    name, _ = qualified_node
    annotate(api_client, name, annotations)
    operator.wait_passes(_policy(name))  # the garbage is read by a whole full pass
    # A re-screening may follow (an unreadable qualification time is an expired one),
    # but the node ends in service, with readable bookkeeping, and nothing else touched.
    wait_for(
        lambda: (
            _healthy(api_client, name)
            and not [t for t in _tests(api_client, name) if not _passed(t)]
        ),
        90,
        "the node in service with every screening passed",
    )
    assert not read_node(api_client, name).spec.unschedulable


def _claim_a_foreign_taint(api: client.ApiClient, name: str) -> None:
    """Someone else's taint on the node, and our bookkeeping claiming it."""
    node = read_node(api, name)
    taints = [{"key": t.key, "effect": t.effect} for t in node.spec.taints or []]
    # PreferNoSchedule: probe Pods (which tolerate only our taints) can still run there.
    taints.append({"key": FOREIGN, "value": "rack-7", "effect": "PreferNoSchedule"})
    client.CoreV1Api(api).patch_node(
        name,
        {"metadata": {"annotations": {keys.OWNED_TAINTS: FOREIGN}}, "spec": {"taints": taints}},
    )


def _foreign(api: client.ApiClient, name: str) -> bool:
    return FOREIGN in taint_keys(api, name)


def test_a_foreign_taint_is_never_removed_whatever_owned_taints_says(
    api_client: client.ApiClient, qualified_node: tuple[str, dict[str, str]]
) -> None:
    name, _ = qualified_node
    _claim_a_foreign_taint(api_client, name)
    custom = client.CustomObjectsApi(api_client)
    # Quarantine by request, repair, verification, release: every taint removal path.
    annotate(api_client, name, {keys.REQUEST_QUARANTINE: "by hand"})
    wait_for(lambda: node_state(api_client, name) == "Quarantined", 45, "quarantine")
    assert _foreign(api_client, name)
    ticket = wait_for(lambda: list_custom(api_client, "repairtickets", name), 30, "a ticket")[0]
    custom.patch_cluster_custom_object(
        GROUP,
        VERSION,
        "repairtickets",
        ticket["metadata"]["name"],
        {"spec": {"resolution": "FalseAlarm"}},
    )
    wait_for(lambda: _healthy(api_client, name), 90, "verification and release")
    assert _foreign(api_client, name), "the foreign taint was removed after verification"
    annotate(api_client, name, {keys.REQUEST_QUARANTINE: "again"})
    wait_for(lambda: node_state(api_client, name) == "Quarantined", 45, "quarantine")
    annotate(api_client, name, {keys.REQUEST_RELEASE: "false alarm"})
    wait_for(lambda: _healthy(api_client, name), 45, "release by request")
    assert _foreign(api_client, name), "the foreign taint was removed on release"


def test_a_claimed_foreign_taint_does_not_block_screening(
    api_client: client.ApiClient, qualified_node: tuple[str, dict[str, str]]
) -> None:
    name, _ = qualified_node
    _claim_a_foreign_taint(api_client, name)
    before = len(_tests(api_client, name))
    annotate(api_client, name, {keys.REQUEST_SUSPECT: "checking"})
    wait_for(lambda: len(_tests(api_client, name)) > before, 45, "a re-screening")
    wait_for(lambda: _healthy(api_client, name), 90, "release after the screening")
    assert _foreign(api_client, name), "the foreign taint was removed on release"


def test_a_foreign_annotation_is_never_removed_whatever_owned_annotations_says(
    api_client: client.ApiClient, qualified_node: tuple[str, dict[str, str]]
) -> None:
    name, _ = qualified_node
    annotate(
        api_client,
        name,
        {"example.com/owner": "team-a", keys.OWNED_ANNOTATIONS: "example.com/owner"},
    )
    annotate(api_client, name, {keys.REQUEST_QUARANTINE: "by hand"})
    wait_for(lambda: node_state(api_client, name) == "Quarantined", 45, "quarantine")
    annotate(api_client, name, {keys.REQUEST_RELEASE: "false alarm"})
    wait_for(lambda: _healthy(api_client, name), 45, "release by request")
    annotations = read_node(api_client, name).metadata.annotations or {}
    assert annotations.get("example.com/owner") == "team-a", "a foreign annotation was removed"


pytestmark = pytest.mark.cluster
