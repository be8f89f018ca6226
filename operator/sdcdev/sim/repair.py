"""The simulated repair shop: works the operator's RepairTickets.

It watches ``repairtickets.sdcguard.dev`` at the operator's API version (cluster-scoped). An open
ticket (no ``spec.resolution``, phase not Closed or Retired) is taken at once:
``spec.external`` records the shop's system, ticket id and URL. After
``repair.delaySeconds`` the node is "repaired" (its fault profile cleared in
the simulator, unless the profile needs more repairs than it has had) and the
ticket gets ``spec.resolution`` and ``spec.resolutionNote``. A ticket whose
resolution is cleared again is worked again. Without the CRD it logs once and
looks again every ``crd_retry_seconds`` (15 s).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from sdcdev.sim.fleet import RepairSettings
from sdcdev.sim.kube import TICKETS_PATH, JsonDict, Kube, ListWatch, retry_call
from sdcdev.sim.state import FleetState
from sdcdev.sim.timers import TimerHandle, Timers

log = structlog.get_logger("sdcdev.sim")

CLOSED_PHASES = frozenset({"Closed", "Retired"})


@dataclass(frozen=True)
class TicketView:
    name: str
    node_name: str | None
    resolution: str | None
    phase: str | None
    external: dict[str, Any] | None

    @property
    def open(self) -> bool:
        return not self.resolution and self.phase not in CLOSED_PHASES


def ticket_view(obj: JsonDict) -> TicketView:
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    external = spec.get("external")
    return TicketView(
        name=str(obj.get("metadata", {}).get("name", "")),
        node_name=spec.get("nodeName"),
        resolution=spec.get("resolution"),
        phase=status.get("phase"),
        external=external if isinstance(external, dict) else None,
    )


def external_ref(system: str, ticket: str) -> dict[str, str]:
    """The shop's own record of a ticket: stable id and URL."""
    short = hashlib.sha256(ticket.encode()).hexdigest()[:8].upper()
    ticket_id = f"SIM-{short}"
    return {
        "system": system,
        "id": ticket_id,
        "url": f"https://repair.sim.invalid/tickets/{ticket_id}",
    }


def resolution_patch(
    settings: RepairSettings, ticket: str, node: str, cleared: bool, repairs: int
) -> JsonDict:
    """The spec patch that closes a ticket from the shop's side."""
    note = (
        f"simulated repair #{repairs} of {node}: faults cleared"
        if cleared
        else f"simulated repair #{repairs} of {node}: part swapped, fault may persist"
    )
    return {
        "spec": {
            "resolution": settings.resolution,
            "resolutionNote": note,
            "external": external_ref(settings.system, ticket),
        }
    }


class RepairShop:
    """Watches tickets and resolves open ones after a delay."""

    def __init__(
        self,
        kube: Kube,
        state: FleetState,
        timers: Timers,
        settings: RepairSettings,
        *,
        on_repair: Callable[[str, str], None] | None = None,
        crd_retry_seconds: float = 15.0,
    ) -> None:
        self.kube = kube
        self.state = state
        self.timers = timers
        self.settings = settings
        self.on_repair = on_repair
        self._pending: dict[str, TimerHandle] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.resolved = 0
        self.watch = ListWatch(
            kube,
            TICKETS_PATH,
            on_sync=self._on_sync,
            on_event=self._on_event,
            stop_event=self._stop,
            missing_retry_seconds=crd_retry_seconds,
        )
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self.watch.run, name="sim-repair", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.watch.stop()
        with self._lock:
            for handle in self._pending.values():
                handle.cancel()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _on_sync(self, items: list[JsonDict]) -> None:
        for obj in items:
            self._consider(ticket_view(obj))

    def _on_event(self, kind: str, obj: JsonDict) -> None:
        ticket = ticket_view(obj)
        if kind == "DELETED":
            with self._lock:
                handle = self._pending.pop(ticket.name, None)
            if handle is not None:
                handle.cancel()
            return
        self._consider(ticket)

    def _consider(self, ticket: TicketView) -> None:
        if not ticket.open or not self.state.has(ticket.node_name):
            return
        with self._lock:
            if ticket.name in self._pending:
                return
            self._pending[ticket.name] = self.timers.call_later(
                self.settings.delay_seconds,
                lambda: self._repair(ticket.name),
                f"repair {ticket.name}",
            )
        if ticket.external is None:
            self.timers.call_soon(lambda: self._acknowledge(ticket.name), f"ack {ticket.name}")
        log.info(
            "sim.repair.accepted",
            ticket=ticket.name,
            node=ticket.node_name,
            due_in_seconds=self.settings.delay_seconds,
        )

    def _acknowledge(self, name: str) -> None:
        retry_call(
            lambda: self.kube.patch_ticket(
                name, {"spec": {"external": external_ref(self.settings.system, name)}}
            ),
            what=f"ticket {name} external reference",
        )

    def _repair(self, name: str) -> None:
        with self._lock:
            self._pending.pop(name, None)
        try:
            ticket = ticket_view(self.kube.get_ticket(name))
        except Exception as exc:
            log.warning("sim.repair.ticket_unreadable", ticket=name, error=repr(exc)[:200])
            return
        if not ticket.open or ticket.node_name is None or not self.state.has(ticket.node_name):
            return
        cleared = self.state.repair(ticket.node_name)
        repairs = self.state.snapshot().node(ticket.node_name).repairs
        body = resolution_patch(self.settings, name, ticket.node_name, cleared, repairs)
        if retry_call(lambda: self.kube.patch_ticket(name, body), what=f"ticket {name} resolution"):
            self.resolved += 1
            log.info(
                "sim.repair.resolved",
                ticket=name,
                node=ticket.node_name,
                resolution=self.settings.resolution,
                faults_cleared=cleared,
            )
            if self.on_repair is not None:
                self.on_repair(ticket.node_name, name)
