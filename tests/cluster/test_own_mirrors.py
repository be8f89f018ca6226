"""Our own kinds in the operator's copy, against the real API server: SDCTests,
RepairTickets and SDCHardware records are listed in pages and watched (not indexed by
Kopf), kept as slim frozen snapshots grouped by node, and every creation, change and
deletion pokes the nodes it is about."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from kubernetes import client

from sdcguard.adapters.inventory import Inventory
from sdcguard.api import IdentityKind
from sdcguard.domain.hardware import record_name
from tests.cluster.test_mirror import _clock, _until
from tests.operator.harness import apply_crds

GROUP, VERSION = "sdcguard.dev", "v1alpha1"


def _test(name: str, node: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SDCTest",
        "metadata": {"name": name},
        "spec": {"nodeName": node, "policyRef": "fleet", "suite": "acceptance"},
    }
    return body


def _finished_status() -> dict[str, Any]:
    return {
        "status": {
            "phase": "Failed",
            "verdict": "SDC",
            "completionTime": "2026-01-02T03:00:00Z",
            "checks": [{"name": "golden", "verdict": "SDC", "oddDevice": 1, "message": "m" * 300}],
        }
    }


def _ticket(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "RepairTicket",
        "metadata": {"name": name},
        "spec": {"nodeName": node, "policyRef": "fleet", "evidence": [f"{name}-test"]},
    }


def test_tests_tickets_and_hardware_are_copied_slim_and_poke_their_nodes(
    api_client: client.ApiClient,
) -> None:
    apply_crds(api_client)
    custom = client.CustomObjectsApi(api_client)
    case = uuid.uuid4().hex[:6]
    node_a, node_b = f"own-{case}-a", f"own-{case}-b"
    first, second, ticket = f"{node_a}-1", f"{node_b}-1", f"{node_a}-t1"
    hw_id = f"aws:///own-{case}"
    hardware = record_name(IdentityKind.PROVIDER_ID, hw_id)
    # There before the operator starts: the first list brings them.
    custom.create_cluster_custom_object(GROUP, VERSION, "sdctests", _test(first, node_a))
    custom.patch_cluster_custom_object_status(GROUP, VERSION, "sdctests", first, _finished_status())
    custom.create_cluster_custom_object(GROUP, VERSION, "repairtickets", _ticket(ticket, node_a))
    pokes: list[list[str] | None] = []

    def poked(nodes: list[str] | None) -> bool:
        return any(p is None if nodes is None else p == nodes for p in pokes)

    async def scenario() -> None:
        inv = Inventory(api_client, f"own-{case}", test_node=lambda _: None, clock=_clock)
        inv.start(asyncio.get_running_loop(), lambda nodes=None, **_: pokes.append(nodes))
        try:
            assert await asyncio.wait_for(inv.wait_synced(lambda: False), 30)
            # Complete or nothing: the copy counts as synced only with every kind listed.
            inv.tests.synced.clear()
            assert not inv.synced()
            inv.tests.synced.set()
            [listed] = inv.tests_by_node([node_a])[node_a]
            api_version = custom.get_cluster_custom_object(GROUP, VERSION, "sdctests", first)
            assert listed.resource_version == api_version["metadata"]["resourceVersion"]
            assert listed.node_name == node_a and listed.known is not None
            assert listed.known.running is None, "a finished test is kept as its facts"
            assert listed.known.facts.failed_checks == {"golden"}
            assert inv.node_of_test(first) == node_a
            [kept] = inv.tickets_by_node([node_a])[node_a]
            assert kept.name == ticket and kept.ticket is not None and not kept.has_status
            assert pokes == [], "the first list pokes nothing (the first pass is full)"

            # A new test, its status change and its deletion each poke its node.
            await asyncio.to_thread(
                custom.create_cluster_custom_object,
                GROUP,
                VERSION,
                "sdctests",
                _test(second, node_b),
            )
            await _until(lambda: inv.tests_by_node([node_b]), "the new test")
            await _until(lambda: poked([node_b]), "the new test's poke")
            [new] = inv.tests_by_node([node_b])[node_b]
            assert new.known is not None and new.known.running is not None
            pokes.clear()
            await asyncio.to_thread(
                custom.patch_cluster_custom_object_status,
                GROUP,
                VERSION,
                "sdctests",
                second,
                {"status": {"phase": "Running"}},
            )
            await _until(
                lambda: (
                    (t := inv.tests.get(second)) is not None
                    and t.known is not None
                    and t.known.facts.phase.value == "Running"
                ),
                "the status change",
            )
            await _until(lambda: poked([node_b]), "the status change's poke")
            pokes.clear()
            await asyncio.to_thread(
                custom.delete_cluster_custom_object, GROUP, VERSION, "sdctests", first
            )
            await _until(lambda: not inv.tests_by_node([node_a]), "the deleted test gone")
            await _until(lambda: poked([node_a]), "the deletion's poke")
            assert inv.tests_by_node([node_b]), "the other node's test stays"

            # A ticket's status and its deletion poke its node.
            pokes.clear()
            await asyncio.to_thread(
                custom.patch_cluster_custom_object_status,
                GROUP,
                VERSION,
                "repairtickets",
                ticket,
                {"status": {"phase": "Open", "openedAt": "2026-01-02T03:04:05Z"}},
            )
            await _until(
                lambda: (t := inv.tickets.get(ticket)) is not None and t.phase == "Open",
                "the ticket's status",
            )
            await _until(lambda: poked([node_a]), "the ticket's poke")
            pokes.clear()
            await asyncio.to_thread(
                custom.delete_cluster_custom_object, GROUP, VERSION, "repairtickets", ticket
            )
            await _until(lambda: not inv.tickets_by_node([node_a]), "the deleted ticket gone")
            await _until(lambda: poked([node_a]), "the ticket deletion's poke")

            # A hardware record may name any node: every node is looked at.
            pokes.clear()
            await asyncio.to_thread(
                custom.create_cluster_custom_object,
                GROUP,
                VERSION,
                "sdchardwares",
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "SDCHardware",
                    "metadata": {"name": hardware},
                    "spec": {"kind": "ProviderID", "id": hw_id},
                },
            )
            await _until(lambda: hardware in inv.hardware_records(), "the hardware record")
            await _until(lambda: poked(None), "the full look")
            record = inv.hardware_records()[hardware]
            assert record.spec.id == hw_id and record.status is None
            assert all(m.stats.lists == 1 for m in inv.mirrors), "watched, never relisted"
        finally:
            inv.stop()

    try:
        asyncio.run(scenario())
    finally:
        for plural, name in (
            ("sdctests", first),
            ("sdctests", second),
            ("repairtickets", ticket),
            ("sdchardwares", hardware),
        ):
            try:
                custom.delete_cluster_custom_object(GROUP, VERSION, plural, name)
            except client.ApiException as exc:
                if exc.status != 404:
                    raise
