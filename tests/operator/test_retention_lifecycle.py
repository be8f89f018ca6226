"""The lifecycle goes on after a prune: a quarantined node's old history is pruned
while its ticket is open (a sweep with its clock a year ahead), the ticket and its
evidence survive, and the repair then verifies the node and returns it to the pool."""

from __future__ import annotations

import datetime as dt

from kubernetes import client

from sdcdev.harness import (
    GROUP,
    VERSION,
    OperatorProcess,
    ProbeKubelet,
    create_policy,
    gpu_nodes,
    new_case,
    node_state,
    ticket_in_phase,
    trusted_baseline,
    wait_for,
)
from sdcdev.harness import list_custom as list_node_custom
from sdcguard.adapters.kube import KubeWriter
from sdcguard.adapters.retention import RetentionSweeper, TokenBucket, list_custom, read_history
from sdcguard.domain.retention import RetentionLimits
from sdcguard.metrics import Metrics
from tests.unit.test_retention import sdctest_body

OLD = 5


class _ApiCopy:
    """The copy retention reads, listed from the API server (the operator under test
    runs as its own process)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    def tests(self) -> list[object]:
        from sdcguard.adapters.pass_state import TestSnapshot

        return [TestSnapshot.slim(b) for b in list_custom(self.api, "sdctests")]

    def tickets(self) -> list[object]:
        from sdcguard.adapters.observe import TicketSnapshot

        return [TicketSnapshot.from_body(b) for b in list_custom(self.api, "repairtickets")]

    def nodes(self) -> list[object]:
        from sdcguard.domain.observed import NodeSnapshot

        items = client.CoreV1Api(self.api).list_node(_preload_content=False)
        import json

        return [NodeSnapshot.from_body(b) for b in json.loads(items.data)["items"]]

    def unreadable(self) -> list[object]:
        return []


def test_a_prune_during_repair_keeps_what_the_lifecycle_reads(
    api_client: client.ApiClient, operator: OperatorProcess
) -> None:
    case = new_case()
    node = f"pruned-{case}"
    trusted_baseline(api_client)
    custom = client.CustomObjectsApi(api_client)
    outcomes = {node: "sdc@5@11"}
    with gpu_nodes(api_client, [node], case=case), ProbeKubelet(api_client, outcomes):
        # A history from before: screenings this node passed long ago.
        for i in range(OLD):
            old = sdctest_body(f"{node}-old-{i}", node)
            old["metadata"].pop("resourceVersion")
            old["metadata"].pop("creationTimestamp")
            custom.create_cluster_custom_object(GROUP, VERSION, "sdctests", old)
            custom.patch_cluster_custom_object_status(
                GROUP, VERSION, "sdctests", old["metadata"]["name"], {"status": old["status"]}
            )
        create_policy(api_client, case)
        wait_for(lambda: node_state(api_client, node) == "Quarantined", 120, "quarantine")
        ticket = wait_for(lambda: ticket_in_phase(api_client, node, "Open"), 30, "the ticket")
        evidence = set(ticket["spec"]["evidence"])

        metrics = Metrics()
        copy = _ApiCopy(api_client)
        sweeper = RetentionSweeper(
            writer=KubeWriter(api=api_client, metrics=metrics),
            metrics=metrics,
            limits=RetentionLimits(tests_per_node=1),
            bucket=TokenBucket(50, 5),
            read=lambda: read_history(copy, lambda plural: list_custom(api_client, plural)),  # type: ignore[arg-type]
            clock=lambda: dt.datetime.now(dt.UTC) + dt.timedelta(days=400),
        )
        done = sweeper.sweep()
        left = {t["metadata"]["name"] for t in list_node_custom(api_client, "sdctests", node)}
        # The old passes go but the newest (the node's last pass); the failed screening
        # and its confirmation are the open ticket's evidence, and stay.
        assert done.get("sdctests-deleted") == OLD - 1, done
        assert evidence <= left and f"{node}-old-{OLD - 1}" in left
        assert ticket_in_phase(api_client, node, "Open") is not None

        # The repair side fixes the node: it is verified and returns.
        outcomes[node] = "pass"
        custom.patch_cluster_custom_object(
            GROUP,
            VERSION,
            "repairtickets",
            ticket["metadata"]["name"],
            {"spec": {"resolution": "Repaired"}},
        )
        wait_for(lambda: node_state(api_client, node) == "Qualified", 120, "return to the pool")
        wait_for(lambda: ticket_in_phase(api_client, node, "Closed"), 30, "the ticket to close")
