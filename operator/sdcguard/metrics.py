"""Prometheus metrics. One registry per operator process (tests make their own).

Every replica serves /metrics, the standby too (with ``replicas: 2``): a scrape target
that refused while standing by would be a target down for as long as the fleet is
healthy. ``sdcguard_leader`` says which replica acts; the gauges that describe the fleet
as the leader sees it are set by the leader only, and cleared when a replica stands by,
so a sum over replicas counts each node once.
"""

from __future__ import annotations

import importlib.metadata
import platform
from dataclasses import dataclass, field

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    start_http_server,
)

SCREENING_BUCKETS = (5, 10, 20, 30, 60, 120, 300, 600, 1200, 3600)
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)


@dataclass
class Metrics:
    """All series the operator exports; names start with ``sdcguard_``."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        # process_cpu_seconds_total, process_resident_memory_bytes, open fds, start time.
        ProcessCollector(registry=r)
        self.build_info = Gauge(
            "sdcguard_build_info",
            "Always 1; the labels say which sdcguard, Python and Kopf this process runs.",
            ["version", "python", "kopf"],
            registry=r,
        )
        self.build_info.labels(
            version=_distribution_version("sdcguard"),
            python=platform.python_version(),
            kopf=_distribution_version("kopf"),
        ).set(1)
        self.leader = Gauge(
            "sdcguard_leader",
            "1 while this replica acts (it holds the leader Lease, or runs alone); 0 while "
            "it stands by. Summed over replicas: 1 when healthy, 0 when nothing acts.",
            registry=r,
        )
        self.nodes = Gauge(
            "sdcguard_nodes",
            "Accelerator nodes by lifecycle state.",
            ["policy", "state"],
            registry=r,
        )
        self.screenings = Counter(
            "sdcguard_screenings_total",
            "Finished screenings by check and verdict.",
            ["check", "verdict"],
            registry=r,
        )
        self.tests = Counter(
            "sdcguard_tests_total",
            "Finished SDCTests by suite and phase.",
            ["suite", "phase"],
            registry=r,
        )
        self.catch_shortfalls = Counter(
            "sdcguard_screening_catch_shortfall_total",
            "Finished SDCTests whose checks fell short of the policy's catch target "
            "(status.catchTargetMet false): screenings that ran but caught less than asked.",
            ["suite"],
            registry=r,
        )
        self.screening_duration = Histogram(
            "sdcguard_screening_duration_seconds",
            "SDCTest start to verdict.",
            ["suite"],
            buckets=SCREENING_BUCKETS,
            registry=r,
        )
        self.finish_to_quarantine = Histogram(
            "sdcguard_probe_finish_to_quarantine_seconds",
            "Probe container finished to node tainted and cordoned.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.quarantines = Counter(
            "sdcguard_quarantines_total", "Nodes quarantined.", ["policy"], registry=r
        )
        self.blast_radius_workloads = Counter(
            "sdcguard_blast_radius_workloads_total",
            "Workloads that used a node between its last passing screening and its "
            "quarantine (each told by a Warning Event in its namespace).",
            ["policy"],
            registry=r,
        )
        self.hardware_records = Gauge(
            "sdcguard_hardware_records",
            "SDCHardware records (hardware with a failure history) by identifier kind, and "
            "whether the hardware is retired.",
            ["kind", "retired"],
            registry=r,
        )
        self.hardware_recognised = Counter(
            "sdcguard_hardware_recognised_total",
            "Hardware with a failure history seen under a new Node (a host registered under "
            "a new name or uid, a GPU moved into another host), by the identifier that "
            "recognised it and whether that hardware was retired.",
            ["kind", "retired"],
            registry=r,
        )
        self.hardware_retired = Counter(
            "sdcguard_hardware_retired_total",
            "Hardware retired: OutOfRepairCycles (a confirmed failure past maxRepairCycles) "
            "or RetiredByRequest (a ticket's Retire resolution).",
            ["reason"],
            registry=r,
        )
        self.hardware_untracked = Counter(
            "sdcguard_hardware_untracked_failures_total",
            "Confirmed failures of nodes with no trusted hardware identifier (empty, "
            "placeholder or shared with another Node): no history is kept for them.",
            registry=r,
        )
        self.tickets_open = Gauge(
            "sdcguard_repair_tickets_open",
            "Open RepairTickets by age bucket.",
            ["age"],
            registry=r,
        )
        self.oldest_ticket = Gauge(
            "sdcguard_repair_ticket_oldest_open_seconds",
            "Age of the oldest open ticket.",
            registry=r,
        )
        self.breaker_open = Gauge(
            "sdcguard_circuit_breaker_open",
            "1 while the policy's breaker is tripped.",
            ["policy"],
            registry=r,
        )
        self.breaker_fraction = Gauge(
            "sdcguard_circuit_breaker_failure_fraction",
            "Failed share of screenings in the breaker window.",
            ["policy"],
            registry=r,
        )
        self.budget_in_use = Gauge(
            "sdcguard_budget_in_use",
            "Tests running (tests), nodes held (unavailable) and devices out of service "
            "(devices) per pool.",
            ["policy", "pool", "budget"],
            registry=r,
        )
        self.topology_domains = Gauge(
            "sdcguard_topology_domains",
            "Per topology budget (spec.budgets.topology): its domains (domains), those whose "
            "held nodes reached maxUnavailable (at_limit), and the most nodes held in one "
            "domain (most_held). domains 0: no node carries the label key.",
            ["policy", "label_key", "measure"],
            registry=r,
        )
        self.qualification_overdue = Gauge(
            "sdcguard_qualification_overdue_nodes",
            "Qualified nodes whose qualification is older than maxQualificationAge "
            "(labelled sdcguard.dev/overdue=true).",
            ["policy"],
            registry=r,
        )
        self.type_screenings = Gauge(
            "sdcguard_hardware_type_screenings",
            "Finished screenings with a verdict on the hardware (Pass or SDC) per hardware "
            "type, and how many failed (outcome), over the SDCTests kept.",
            ["type", "outcome"],
            registry=r,
        )
        self.type_failure_rate = Gauge(
            "sdcguard_hardware_type_failure_rate",
            "Failures per screening of each hardware type: the Jeffreys mean (bound=mean) "
            "and the 95% Wilson interval (low, high).",
            ["type", "bound"],
            registry=r,
        )
        self.onset_to_quarantine = Gauge(
            "sdcguard_onset_to_quarantine_hours",
            "Median hours from a fault's onset to its quarantine, bracketed: at least "
            "quarantine minus first evidence (low), at most quarantine minus last pass (high).",
            ["bound"],
            registry=r,
        )
        self.exposure_estimate = Gauge(
            "sdcguard_exposure_estimate_hours",
            "Hours a fault serves work before a screening catches it under the current "
            "policy (screenings alone), from the measured interval, catch chance and busy "
            "share (basis=screenings: reports from training jobs only shorten it); "
            "absent until a node was screened twice with a catch chance recorded.",
            ["basis"],
            registry=r,
        )
        self.illegal_transitions = Counter(
            "sdcguard_illegal_transitions_total",
            "Transitions outside the lifecycle table (always a bug).",
            ["from_state", "event"],
            registry=r,
        )
        self.api_writes = Counter(
            "sdcguard_api_writes_total",
            "Mutating API requests sent, by kind.",
            ["kind"],
            registry=r,
        )
        self.mirror_objects = Gauge(
            "sdcguard_mirror_objects",
            "Objects in the operator's copy of the fleet (listed, then watched), by kind.",
            ["kind"],
            registry=r,
        )
        self.reconcile_passes = Counter(
            "sdcguard_reconcile_passes_total",
            "Reconcile passes over the fleet, counted once each pass's writes are done, by "
            "policy and kind (full: every node; targeted: the nodes that changed; urgent: "
            "probe ends only).",
            ["policy", "kind"],
            registry=r,
        )
        self.full_pass_seconds = Histogram(
            "sdcguard_full_pass_seconds",
            "Wall time of a full pass (its copy of the fleet and every node decided).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.full_pass_interval = Gauge(
            "sdcguard_full_pass_interval_seconds",
            "Time until the next scheduled full pass: resyncSeconds, or more where full "
            "passes would otherwise take over a fifth of the operator's time.",
            registry=r,
        )
        self.gc_pause = Histogram(
            "sdcguard_gc_pause_seconds",
            "Pauses of Python's cyclic garbage collector (every thread stops), by "
            "generation; observed when the heap is settled after a full pass.",
            ["generation"],
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5),
            registry=r,
        )
        self.gc_frozen = Gauge(
            "sdcguard_gc_frozen_objects",
            "Objects in the collector's permanent generation (frozen after each full "
            "pass, so collections skip the long-lived fleet copy).",
            registry=r,
        )
        self.notifications = Counter(
            "sdcguard_ticket_notifications_total",
            "Ticket sink deliveries by outcome.",
            ["sink", "outcome"],
            registry=r,
        )
        self.retention_deleted = Counter(
            "sdcguard_retention_deleted_total",
            "History deleted by retention, by kind (sdctests, repairtickets, sdcreports, "
            "workloadrecords, sdcbaselines).",
            ["kind"],
            registry=r,
        )
        self.retention_held = Gauge(
            "sdcguard_retention_objects",
            "Objects of each kind retention keeps, as of its last sweep (the unreadable "
            "ones included).",
            ["kind"],
            registry=r,
        )
        self.retention_unreadable = Gauge(
            "sdcguard_retention_unreadable_objects",
            "Objects of each kind the operator could not parse at its last sweep: never "
            "deleted, named in the sweep's log line.",
            ["kind"],
            registry=r,
        )

    def lead(self) -> None:
        """This replica acts from now on (its Kopf has started)."""
        self.leader.set(1)

    def stand_by(self) -> None:
        """This replica stopped acting: it says so, and forgets the fleet gauges it set
        as leader (they would go stale beside the new leader's, and alerts such as a
        breaker left open would keep firing from the replica that no longer acts)."""
        self.leader.set(0)
        for gauge in (
            self.nodes,
            self.hardware_records,
            self.tickets_open,
            self.breaker_open,
            self.breaker_fraction,
            self.budget_in_use,
            self.topology_domains,
            self.retention_held,
            self.retention_unreadable,
            self.qualification_overdue,
            self.type_screenings,
            self.type_failure_rate,
            self.onset_to_quarantine,
            self.exposure_estimate,
        ):
            gauge.clear()
        self.oldest_ticket.set(0)
        self.full_pass_interval.set(0)

    def serve(self, port: int) -> None:
        """Expose /metrics on ``port`` (a daemon thread)."""
        start_http_server(port, registry=self.registry)


def _distribution_version(name: str) -> str:
    """An installed distribution's version; "unknown" when run from a source checkout."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
