"""Our own kinds in the operator's copy, against the real API server: SDCTests,
RepairTickets and SDCHardware records are listed in pages and watched (not indexed by
Kopf), kept as slim frozen snapshots grouped by node, and every creation, change and
deletion pokes the nodes it is about."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from kubernetes import client

from sdcdev.harness import apply_crds
from sdcguard.adapters.inventory import Inventory
from sdcguard.api import IdentityKind
from sdcguard.domain.hardware import record_name
from tests.cluster.test_mirror import _clock, _until

GROUP, VERSION = "sdcguard.dev", "v1alpha1"
METHODS = {
    "create": "create_cluster_custom_object",
    "status": "patch_cluster_custom_object_status",
    "delete": "delete_cluster_custom_object",
}


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
            # The first list pokes nothing (the first pass is a full one).
            assert not any(p is None or {node_a, node_b} & set(p) for p in pokes), pokes

            async def change(
                call: str, plural: str, args: tuple[Any, ...], seen: Any, poke: list[str] | None
            ) -> None:
                """One API call; then the copy shows it (``seen``) and ``poke`` came."""
                pokes.clear()
                method = getattr(custom, METHODS[call])
                await asyncio.to_thread(method, GROUP, VERSION, plural, *args)
                await _until(seen, f"{call} {plural} in the copy")
                await _until(lambda: poked(poke), f"the poke after {call} {plural}")

            def phase_of(name: str) -> str | None:
                test = inv.tests.get(name)
                known = test.known if test is not None else None
                return known.facts.phase.value if known is not None else None

            # A new test, its status change and its deletion each poke its node.
            await change(
                "create",
                "sdctests",
                (_test(second, node_b),),
                lambda: inv.tests_by_node([node_b]),
                [node_b],
            )
            [new] = inv.tests_by_node([node_b])[node_b]
            assert new.known is not None and new.known.running is not None
            running = {"status": {"phase": "Running"}}
            await change(
                "status",
                "sdctests",
                (second, running),
                lambda: phase_of(second) == "Running",
                [node_b],
            )
            await change(
                "delete", "sdctests", (first,), lambda: not inv.tests_by_node([node_a]), [node_a]
            )
            assert inv.tests_by_node([node_b]), "the other node's test stays"

            # A ticket's status and its deletion poke its node.
            opened = {"status": {"phase": "Open", "openedAt": "2026-01-02T03:04:05Z"}}
            await change(
                "status",
                "repairtickets",
                (ticket, opened),
                lambda: (t := inv.tickets.get(ticket)) is not None and t.phase == "Open",
                [node_a],
            )
            await change(
                "delete",
                "repairtickets",
                (ticket,),
                lambda: not inv.tickets_by_node([node_a]),
                [node_a],
            )

            # A hardware record pokes the nodes it concerns: none while no node holds
            # its identifier and its status names none; the node it was seen under once
            # its status says so.
            hardware_body = {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "SDCHardware",
                "metadata": {"name": hardware},
                "spec": {"kind": "ProviderID", "id": hw_id},
            }
            pokes.clear()
            await asyncio.to_thread(
                custom.create_cluster_custom_object, GROUP, VERSION, "sdchardwares", hardware_body
            )
            await _until(lambda: hardware in inv.hardware_records(), "create sdchardwares")
            await asyncio.sleep(0.5)
            assert not pokes, f"a record no node holds poked {pokes}"
            record = inv.hardware_records()[hardware]
            assert record.spec.id == hw_id and record.status is None
            when = "2026-01-02T03:04:05Z"
            seen = {"node": node_b, "firstSeen": when, "lastSeen": when}
            seen_under = {"status": {"lastNode": node_b, "nodes": [seen]}}
            await change(
                "status",
                "sdchardwares",
                (hardware, seen_under),
                lambda: (
                    (r := inv.hardware_records().get(hardware)) is not None and r.status is not None
                ),
                [node_b],
            )
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
