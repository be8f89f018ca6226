"""The chart's alert rules and /metrics scrapes, for tests that check an alert fires
(with :mod:`tests.promql`) on what the operator really exports."""

from __future__ import annotations

import functools
import json
import urllib.request
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from tests.chart.helm import find, render
from tests.promql import Scrape, parse_scrape


@functools.cache
def _rules(values_json: str) -> dict[str, dict[str, Any]]:
    values = json.loads(values_json)
    values.setdefault("metrics", {}).setdefault("prometheusRule", {})["enabled"] = True
    rule = find(render(values), "PrometheusRule")
    return {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}


def alert_rules(rule_values: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """The chart's alerts by name (``rule_values``: metrics.prometheusRule values)."""
    values = {"metrics": {"prometheusRule": dict(rule_values or {})}}
    return _rules(json.dumps(values, sort_keys=True))


def alert_expr(name: str, rule_values: dict[str, Any] | None = None) -> str:
    expr: str = alert_rules(rule_values)[name]["expr"]
    return expr


def scrape_registry(registry: CollectorRegistry) -> Scrape:
    return parse_scrape(generate_latest(registry).decode())


def scrape_url(url: str) -> Scrape:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return parse_scrape(resp.read().decode())
