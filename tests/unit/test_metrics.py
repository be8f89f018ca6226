"""What every replica's /metrics says about itself: which build it runs, its process, and
whether it acts; a replica that stops acting drops the fleet gauges it set."""

from __future__ import annotations

import importlib.metadata
import platform
import socket
import urllib.request

from prometheus_client import CollectorRegistry

from sdcguard.metrics import Metrics
from tests.chart.alerts import scrape_registry
from tests.promql import Scrape


def _value(scrape: Scrape, name: str, **labels: str) -> float | None:
    return scrape.get((name, frozenset(labels.items())))


def _names(scrape: Scrape) -> set[str]:
    return {name for name, _ in scrape}


def test_build_info_names_the_python_and_kopf_it_runs() -> None:
    scrape = scrape_registry(Metrics(registry=CollectorRegistry()).registry)
    (labels,) = [dict(k) for name, k in scrape if name == "sdcguard_build_info"]
    assert labels["python"] == platform.python_version()
    assert labels["kopf"] == importlib.metadata.version("kopf")
    assert labels["version"]  # the installed distribution's, or "unknown" from a checkout
    assert _value(scrape, "sdcguard_build_info", **labels) == 1


def test_process_metrics_are_on_the_operators_registry() -> None:
    names = _names(scrape_registry(Metrics(registry=CollectorRegistry()).registry))
    assert {
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
    } <= names


def test_a_replica_says_whether_it_leads() -> None:
    metrics = Metrics(registry=CollectorRegistry())
    assert _value(scrape_registry(metrics.registry), "sdcguard_leader") == 0  # not yet
    metrics.lead()
    assert _value(scrape_registry(metrics.registry), "sdcguard_leader") == 1
    metrics.stand_by()
    assert _value(scrape_registry(metrics.registry), "sdcguard_leader") == 0


def test_standing_by_drops_the_fleet_gauges_and_keeps_the_counters() -> None:
    metrics = Metrics(registry=CollectorRegistry())
    metrics.lead()
    metrics.nodes.labels(policy="gpus", state="Quarantined").set(3)
    metrics.breaker_open.labels(policy="gpus").set(1)
    metrics.budget_in_use.labels(policy="gpus", pool="", budget="tests").set(2)
    metrics.qualification_overdue.labels(policy="gpus").set(2)
    metrics.tickets_open.labels(age="1d").set(1)
    metrics.hardware_records.labels(kind="ProviderID", retired="false").set(4)
    metrics.oldest_ticket.set(7200)
    metrics.quarantines.labels(policy="gpus").inc()

    metrics.stand_by()

    scrape = scrape_registry(metrics.registry)
    for gone in (
        "sdcguard_nodes",
        "sdcguard_circuit_breaker_open",
        "sdcguard_budget_in_use",
        "sdcguard_qualification_overdue_nodes",
        "sdcguard_repair_tickets_open",
        "sdcguard_hardware_records",
    ):
        assert gone not in _names(scrape), f"{gone} kept by a replica that no longer acts"
    assert _value(scrape, "sdcguard_repair_ticket_oldest_open_seconds") == 0
    # What this process did while it led stays counted (rates sum over replicas).
    assert _value(scrape, "sdcguard_quarantines_total", policy="gpus") == 1


def test_a_standby_serves_its_metrics() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    metrics = Metrics(registry=CollectorRegistry())
    metrics.serve(port)
    metrics.stand_by()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    assert "sdcguard_leader 0.0" in text
    assert "process_resident_memory_bytes" in text


def test_a_screening_short_of_its_catch_target_is_counted() -> None:
    """A shortfall is never silent: the test records it and the metric counts it."""
    from prometheus_client import CollectorRegistry

    from sdcguard.metrics import Metrics

    metrics = Metrics(registry=CollectorRegistry())
    metrics.catch_shortfalls.labels(suite="requalification").inc()
    value = metrics.registry.get_sample_value(
        "sdcguard_screening_catch_shortfall_total", {"suite": "requalification"}
    )
    assert value == 1.0
