"""The chart's alerts evaluated against the operator's own metrics: each one fires on
the series its trouble produces and stays quiet on a healthy fleet. A renamed metric or
label value, a wrong threshold or unit, or a broken expression fails here."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from sdcguard.api import SDCTestPhase
from sdcguard.domain.lifecycle import NodeState
from sdcguard.metrics import Metrics
from tests.chart.alerts import alert_expr, alert_rules, scrape_registry
from tests.promql import Scrape, firing

POLICY = "gpus"


JOB = "sdcguard-metrics"
"""The job of the chart's ServiceMonitor for release "sdcguard" (its metrics Service)."""
NAMESPACE = "sdcguard-system"


def _target(scrape: Scrape, pod: str = "sdcguard-0", job: str = JOB, ns: str = NAMESPACE) -> Scrape:
    """``scrape`` with the target labels Prometheus adds to each series it scrapes."""
    extra = {("job", job), ("namespace", ns), ("pod", pod)}
    return {(name, labels | extra): value for (name, labels), value in scrape.items()}


def _healthy() -> tuple[Metrics, Scrape]:
    """A fleet where everything is fine, and its first scrape."""
    metrics = Metrics(registry=CollectorRegistry())
    metrics.lead()
    metrics.nodes.labels(policy=POLICY, state=NodeState.QUALIFIED.value).set(8)
    metrics.nodes.labels(policy=POLICY, state=NodeState.QUARANTINED.value).set(0)
    metrics.breaker_open.labels(policy=POLICY).set(0)
    metrics.tests.labels(suite="acceptance", phase=SDCTestPhase.PASSED.value).inc(5)
    metrics.notifications.labels(sink="webhook", outcome="delivered").inc(2)
    metrics.oldest_ticket.set(3600)
    return metrics, scrape_registry(metrics.registry)


def test_every_alert_is_evaluated_here() -> None:
    assert set(alert_rules()) == {
        "SdcguardOperatorDown",
        "SdcguardCircuitBreakerOpen",
        "SdcguardNodesQuarantined",
        "SdcguardQualificationOverdue",
        "SdcguardTestsInconclusive",
        "SdcguardRepairTicketOverSLA",
        "SdcguardTicketNotificationFailing",
        "SdcguardHardwareRetired",
        "SdcguardRetiredHardwareReturned",
        "SdcguardIllegalTransition",
    }, "a new alert needs its firing test below"
    for rule in alert_rules().values():
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"]


def test_a_healthy_fleet_fires_nothing() -> None:
    metrics, first = _healthy()
    metrics.tests.labels(suite="acceptance", phase=SDCTestPhase.PASSED.value).inc(3)
    history = [_target(first), _target(scrape_registry(metrics.registry))]
    fired = {name: firing(rule["expr"], history) for name, rule in alert_rules().items()}
    assert fired == {name: [] for name in fired}


def test_breaker_open_fires_for_its_policy() -> None:
    metrics, first = _healthy()
    metrics.breaker_open.labels(policy=POLICY).set(1)
    history = [first, scrape_registry(metrics.registry)]
    assert firing(alert_expr("SdcguardCircuitBreakerOpen"), history) == [{"policy": POLICY}]


def test_overdue_qualifications_fire_for_their_policy() -> None:
    metrics, first = _healthy()
    metrics.qualification_overdue.labels(policy=POLICY).set(0)
    assert (
        firing(alert_expr("SdcguardQualificationOverdue"), [scrape_registry(metrics.registry)])
        == []
    )
    metrics.qualification_overdue.labels(policy=POLICY).set(3)
    history = [first, scrape_registry(metrics.registry)]
    assert firing(alert_expr("SdcguardQualificationOverdue"), history) == [{"policy": POLICY}]


def test_quarantined_nodes_over_the_threshold_fire() -> None:
    metrics, _ = _healthy()
    metrics.nodes.labels(policy=POLICY, state=NodeState.QUARANTINED.value).set(2)
    history = [scrape_registry(metrics.registry)]
    assert firing(alert_expr("SdcguardNodesQuarantined"), history) == [{"policy": POLICY}]
    expr = alert_expr("SdcguardNodesQuarantined", {"quarantinedNodesThreshold": 2})
    assert firing(expr, history) == []


def test_inconclusive_share_over_the_fraction_fires() -> None:
    metrics, first = _healthy()
    tests = metrics.tests
    tests.labels(suite="acceptance", phase=SDCTestPhase.PASSED.value).inc(3)
    tests.labels(suite="acceptance", phase=SDCTestPhase.INCONCLUSIVE.value).inc(1)
    history = [first, scrape_registry(metrics.registry)]
    # 1 of 4 in the window: at the default 25% it does not fire, below it does.
    assert firing(alert_expr("SdcguardTestsInconclusive"), history) == []
    lower = alert_expr("SdcguardTestsInconclusive", {"inconclusiveFraction": 0.2})
    assert firing(lower, history) == [{}]
    # Inconclusive tests counted before the window do not count.
    assert firing(lower, [history[-1], history[-1]]) == []


def test_a_ticket_over_its_sla_fires() -> None:
    metrics, _ = _healthy()
    metrics.oldest_ticket.set(71 * 3600)
    assert firing(alert_expr("SdcguardRepairTicketOverSLA"), [_scrape(metrics)]) == []
    metrics.oldest_ticket.set(73 * 3600)
    assert firing(alert_expr("SdcguardRepairTicketOverSLA"), [_scrape(metrics)]) == [{}]
    day = alert_expr("SdcguardRepairTicketOverSLA", {"ticketSlaHours": 24})
    metrics.oldest_ticket.set(25 * 3600)
    assert firing(day, [_scrape(metrics)]) == [{}]


def test_a_sink_that_delivers_nothing_fires() -> None:
    metrics, first = _healthy()
    metrics.notifications.labels(sink="jira", outcome="failed").inc(4)
    # The webhook fails once but still delivers: only Jira is failing.
    metrics.notifications.labels(sink="webhook", outcome="failed").inc()
    metrics.notifications.labels(sink="webhook", outcome="delivered").inc()
    history = [first, scrape_registry(metrics.registry)]
    assert firing(alert_expr("SdcguardTicketNotificationFailing"), history) == [{"sink": "jira"}]


def test_an_illegal_transition_fires() -> None:
    metrics, first = _healthy()
    assert firing(alert_expr("SdcguardIllegalTransition"), [first, first]) == []
    metrics.illegal_transitions.labels(from_state="Qualified", event="TestFailed").inc()
    history = [first, scrape_registry(metrics.registry)]
    assert firing(alert_expr("SdcguardIllegalTransition"), history) == [{}]


def test_retired_hardware_fires_by_reason() -> None:
    metrics, first = _healthy()
    # Hardware recognised (not retired) and records held fire nothing.
    metrics.hardware_recognised.labels(kind="ProviderID", retired="false").inc()
    metrics.hardware_records.labels(kind="ProviderID", retired="false").set(3)
    quiet = [first, scrape_registry(metrics.registry)]
    assert firing(alert_expr("SdcguardHardwareRetired"), quiet) == []
    assert firing(alert_expr("SdcguardRetiredHardwareReturned"), quiet) == []
    metrics.hardware_retired.labels(reason="OutOfRepairCycles").inc()
    history = [first, scrape_registry(metrics.registry)]
    assert firing(alert_expr("SdcguardHardwareRetired"), history) == [
        {"reason": "OutOfRepairCycles"}
    ]
    # An hour later with nothing new: quiet again.
    assert firing(alert_expr("SdcguardHardwareRetired"), [history[-1], history[-1]]) == []


def test_retired_hardware_coming_back_fires_by_identifier_kind() -> None:
    metrics, first = _healthy()
    metrics.hardware_recognised.labels(kind="Device", retired="true").inc()
    history = [first, scrape_registry(metrics.registry)]
    assert firing(alert_expr("SdcguardRetiredHardwareReturned"), history) == [{"kind": "Device"}]


def _scrape(metrics: Metrics) -> Scrape:
    return scrape_registry(metrics.registry)


def _replicas(*leading: bool, job: str = JOB, ns: str = NAMESPACE) -> Scrape:
    """One scrape of each replica (True: it acts), as Prometheus stores them together."""
    scrape: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for number, leads in enumerate(leading):
        metrics = Metrics(registry=CollectorRegistry())
        if leads:
            metrics.lead()
        else:
            metrics.stand_by()
        scrape.update(_target(scrape_registry(metrics.registry), f"sdcguard-{number}", job, ns))
    return scrape


def test_the_operator_is_down_when_no_replica_acts() -> None:
    expr = alert_expr("SdcguardOperatorDown")
    assert 'job="sdcguard-metrics"' in expr and 'namespace="sdcguard-system"' in expr
    # A leader and a standby, or one replica alone: up.
    assert firing(expr, [_replicas(True, False)]) == []
    assert firing(expr, [_replicas(True)]) == []
    # Both standing by (the Lease held by nobody that serves), or nothing scraped at all
    # (every replica gone: no series to sum): down.
    assert firing(expr, [_replicas(False, False)]) == [{}]
    assert firing(expr, [{}]) == [{}]
    # Another release's leader does not stand in for this one.
    assert firing(expr, [_replicas(True, ns="elsewhere")]) == [{}]


def test_the_operator_selector_can_be_set() -> None:
    expr = alert_expr("SdcguardOperatorDown", {"operatorSelector": 'job="sdc"'})
    assert firing(expr, [_replicas(True, job="sdc", ns="any")]) == []
    assert firing(expr, [_replicas(True)]) == [{}]
