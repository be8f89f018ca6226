"""A policy's passes as the runtime's scheduler drives them (``runtime/scheduling.py``):
the view of the fleet each pass reads, made from the inventory's copy and Kopf's few
indexes, and the reconciler that decides and acts on it."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

import kopf
import structlog
from pydantic import ValidationError

from sdcguard.adapters import observe
from sdcguard.adapters.inventory import Inventory
from sdcguard.adapters.pass_state import FleetView, UrgentWork
from sdcguard.adapters.reconciler import Reconciler
from sdcguard.api import SDCPolicy

log = structlog.get_logger("sdcguard")

INDEX_NAMES = ("baselines_index", "policies_index")
"""Kopf's indexes a pass reads: only kinds that stay few (the rest is the inventory's)."""

Indexes = Mapping[str, Mapping[str, Iterable[Any]]]
"""Kopf's indexes by name (live, or copied for a pass)."""


def fleet_view(
    inventory: Inventory,
    indexes: Indexes,
    started: dt.datetime,
    only: frozenset[str] | None = None,
) -> FleetView:
    """A consistent copy of the inventory and Kopf's indexes for one pass (they change
    while it runs).

    ``only``: just these nodes' entries (and their tests' Pods and Jobs), for urgent
    work that decides only them; a copy of everything costs O(fleet) each time."""

    def first(store: Iterable[Any]) -> Any:
        return next(iter(store))

    inv = inventory
    known = inv.workloads_synced()  # before the copy of Pods: the Pods read below
    pending = inv.pending()
    baselines = {k: first(v) for k, v in indexes["baselines_index"].items()}
    records = inv.hardware_records()
    policies = {k: first(v) for k, v in indexes["policies_index"].items()}
    if only is None:
        return FleetView(
            nodes=inv.node_bodies(),
            busy=inv.busy(),
            probe_pods=inv.probe_pods_by_test(),
            probe_jobs=inv.probe_jobs_by_test(),
            tests=inv.tests_by_node(),
            tickets=inv.tickets_by_node(),
            last_busy=dict(inv.last_busy),
            pending=pending,
            baselines=baselines,
            operator_started=started,
            policies=policies,
            hardware=records,
            id_holders=lambda node: inv.id_holders([node]),
            workloads_known=known,
        )
    tests = inv.tests_by_node(only)
    names = [t.name for snapshots in tests.values() for t in snapshots]
    return FleetView(
        nodes=inv.node_bodies(only),
        busy=inv.busy(only),
        probe_pods=inv.probe_pods_by_test(names),
        probe_jobs=inv.probe_jobs_by_test(names),
        tests=tests,
        tickets=inv.tickets_by_node(only),
        last_busy={k: v for k in only if (v := inv.last_busy.get(k)) is not None},
        pending=pending,
        baselines=baselines,
        operator_started=started,
        policies=policies,
        complete=False,
        hardware=records,
        id_holders=lambda node: inv.id_holders([node]),
        workloads_known=known,
    )


def in_flight(inventory: Inventory) -> set[str]:
    """The nodes with an SDCTest not finished (its probe may have ended meanwhile)."""
    return {
        node
        for node, tests in inventory.tests_by_node().items()
        if any(t.known is not None and not t.known.finished for t in tests)
    }


class ParsedPolicy:
    """The policy's body parsed once per change of it (its resourceVersion), so a
    pass and every urgent pass get the typed model, never the raw body."""

    def __init__(self) -> None:
        self.version: str | None = None
        self.policy: SDCPolicy | None = None

    def of(self, body: Mapping[str, Any]) -> SDCPolicy | None:
        """The typed policy, or None while its body is unreadable (logged once)."""
        version = str(body.get("metadata", {}).get("resourceVersion", ""))
        if version != self.version or not version:
            self.version = version
            try:
                self.policy = SDCPolicy.model_validate(dict(body))
            except ValidationError as exc:  # the API server should have refused it
                log.error("policy unreadable; nothing done", error=str(exc)[:500])
                self.policy = None
        return self.policy


class ReconcilerPasses:
    """One policy's passes over the reconciler, for the runtime's scheduler
    (:class:`sdcguard.runtime.scheduling.PolicyPasses`)."""

    def __init__(
        self,
        name: str,
        body: kopf.Body,
        reconciler: Reconciler,
        inventory: Inventory,
        indexes: Mapping[str, kopf.Index[str, Any]],
        started: dt.datetime,
    ) -> None:
        self.name = name
        self.body = body
        """The policy's body as Kopf keeps it (live: it changes with the object)."""
        self.reconciler = reconciler
        self.inventory = inventory
        self.indexes = indexes
        self.started = started
        self._parsed = ParsedPolicy()

    def policy(self) -> SDCPolicy | None:
        return self._parsed.of(self.body)

    def probes_ready(self) -> bool:
        return self.inventory.probes_synced()

    def ready(self) -> bool:
        return self.inventory.synced()

    def copy_indexes(self) -> dict[str, dict[str, list[Any]]]:
        return {name: {k: list(v) for k, v in self.indexes[name].items()} for name in INDEX_NAMES}

    def view(self, copies: Indexes) -> FleetView:
        return fleet_view(self.inventory, copies, self.started)

    def urgent_view(
        self,
        nodes: frozenset[str],
        pods: dict[str, observe.ProbePod],
        jobs: dict[str, observe.ProbeJob],
    ) -> FleetView:
        """The view of urgent nodes, with the ended Pods and Jobs as their events said."""
        view = fleet_view(self.inventory, self.indexes, self.started, only=nodes)
        for test, pod in pods.items():
            others = [p for p in view.probe_pods.get(test, []) if p.name != pod.name]
            view.probe_pods[test] = [*others, pod]
        view.probe_jobs.update(jobs)
        return view

    def mark(self) -> int:
        return self.reconciler.mark()

    def run_pass(
        self,
        policy: SDCPolicy,
        view: FleetView,
        now: dt.datetime,
        dirty: frozenset[str] | None,
        since: int,
    ) -> float:
        return self.reconciler.run_pass(policy, view, now, dirty, since=since)

    def offer(
        self, policy: SDCPolicy, view: FleetView, nodes: frozenset[str], now: dt.datetime
    ) -> None:
        self.reconciler.offer_urgent(UrgentWork(policy, view, nodes, now))

    def serve_offered(self) -> None:
        self.reconciler.serve_offered()

    def requeue_unserved(self) -> set[str]:
        left = self.reconciler.take_unserved()
        for work in left:
            self.reconciler.offer_urgent(work)
        return {node for work in left for node in work.nodes}

    def look_again(self, now: dt.datetime) -> set[str]:
        """Before the workload Pods have listed, nothing else comes back to a node: those
        with a test in flight (a Job to create, a probe's end that came with the first
        list, a status write that failed) and those whose decision asked to be looked at
        again by now (a write that failed)."""
        return in_flight(self.inventory) | self.reconciler.due_nodes(self.name, now)
