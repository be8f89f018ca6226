"""The chart's retention values: refused when zero or negative (with the schema's
message), passed to the operator as the settings it reads, and the ClusterRole lets
it delete the kinds retention prunes."""

from __future__ import annotations

from typing import Any

import pytest

from sdcguard.domain.retention import HistoryKind
from sdcguard.settings import Settings
from tests.chart.helm import find, render, render_error


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"testsPerNode": 0}, "at '/operator/retention/testsPerNode': minimum: got 0, want 1"),
        ({"testsDays": -5}, "at '/operator/retention/testsDays': minimum: got -5, want 1"),
        ({"closedTicketsDays": 0}, "/operator/retention/closedTicketsDays"),
        ({"reportsDays": 0}, "/operator/retention/reportsDays"),
        ({"baselinesDays": -1}, "/operator/retention/baselinesDays"),
        ({"deletesPerSecond": 0}, "/operator/retention/deletesPerSecond"),
        ({"keepForever": True}, "additional properties 'keepForever' not allowed"),
    ],
)
def test_zero_or_negative_retention_is_refused(values: dict[str, Any], message: str) -> None:
    err = render_error({"operator": {"retention": values}})
    assert "values don't meet the specifications of the schema" in err
    assert message in err


def test_retention_values_reach_the_operator_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    docs = render({"operator": {"retention": {"testsPerNode": 4, "closedTicketsDays": 90}}})
    container = find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    for name, value in env.items():
        if name.startswith("SDCGUARD_RETENTION_"):
            monkeypatch.setenv(name, value)
    settings = Settings()
    assert settings.retention_tests_per_node == 4
    assert settings.retention_closed_tickets_days == 90
    assert settings.retention_tests_days == 30  # the chart's default, as the operator's


def test_the_operator_may_delete_what_retention_prunes() -> None:
    role = find(render({}), "ClusterRole", "sdcguard-operator")
    may_delete = {
        resource
        for rule in role["rules"]
        if rule["apiGroups"] == ["sdcguard.dev"] and "delete" in rule["verbs"]
        for resource in rule["resources"]
    }
    assert {k.value for k in HistoryKind} <= may_delete
    assert "sdchardwares" not in may_delete  # hardware history outlives retention
