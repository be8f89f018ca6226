"""kubectl sdc fleet without a cluster: the figures from decoded objects."""

from __future__ import annotations

import datetime as dt
import io
import json
from typing import Any

from sdcguard.api import RepairTicket, SDCPolicy, SDCTest
from sdcguard.api.report import SDCReport
from sdcguard.cli import commands
from sdcguard.cli.fleet import figures, render
from sdcguard.cli.main import build_parser
from sdcguard.cli.objects import Node
from sdcguard.cli.output import emit
from sdcguard.domain import keys

NOW = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)
H = dt.timedelta(hours=1)
PRODUCT = "nvidia.com/gpu.product"


def _t(when: dt.datetime) -> str:
    return keys.format_time(when)


def gpu_node(name: str, product: str, qualified_hours_ago: float | None = 10) -> Node:
    annotations = {}
    if qualified_hours_ago is not None:
        annotations[keys.QUALIFIED_AT] = _t(NOW - qualified_hours_ago * H)
    return Node.from_body(
        {
            "metadata": {
                "name": name,
                "labels": {PRODUCT: product, keys.LABEL_STATE: "Qualified", "gpu": "yes"},
                "annotations": annotations,
            },
            "status": {"allocatable": {"nvidia.com/gpu": "8"}},
        }
    )


def screening(name: str, node: str, hours_ago: float, verdict: str, catch: float = 0.9) -> SDCTest:
    return SDCTest.model_validate(
        {
            "metadata": {"name": name},
            "spec": {"nodeName": node, "policyRef": "p"},
            "status": {
                "phase": "Passed" if verdict == "Pass" else "Failed",
                "verdict": verdict,
                "completionTime": _t(NOW - hours_ago * H),
                "checks": [{"name": "gemm", "verdict": verdict, "catchChance": catch}],
            },
        }
    )


def ticket(node: str, hours_ago: float) -> RepairTicket:
    return RepairTicket.model_validate(
        {
            "metadata": {"name": f"{node}-1", "creationTimestamp": _t(NOW - hours_ago * H)},
            "spec": {"nodeName": node, "policyRef": "p"},
        }
    )


def report(node: str, hours_ago: float) -> SDCReport:
    return SDCReport.model_validate(
        {
            "metadata": {
                "name": f"r-{node}",
                "namespace": "ml",
                "creationTimestamp": _t(NOW - hours_ago * H),
            },
            "spec": {
                "nodeName": node,
                "podName": "trainer-0",
                "jobName": "trainer",
                "step": 450,
                "method": "ShadowAudit",
            },
        }
    )


POLICY = SDCPolicy.model_validate(
    {
        "metadata": {"name": "p"},
        "spec": {
            "nodeSelector": {"matchLabels": {"gpu": "yes"}},
            "triggers": {"maxQualificationAge": "100h"},
        },
    }
)


def pod(node: str, gpus: int = 8, probe: bool = False) -> dict[str, Any]:
    labels = {"app.kubernetes.io/component": "sdcprobe"} if probe else {}
    return {
        "metadata": {"labels": labels},
        "spec": {
            "nodeName": node,
            "containers": [{"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
        },
    }


def test_one_failure_in_a_thousand_screenings_says_how_little_it_means() -> None:
    nodes = [gpu_node("h1", "H100")]
    tests = [screening(f"t{i}", "h1", 1000 - i, "Pass") for i in range(999)]
    tests.append(screening("bad", "h1", 0.5, "SDC"))
    f = figures(nodes, [POLICY], tests, [], [], [], NOW)
    (row,) = f.types
    assert (row.hardware_type, row.screenings, row.failures) == ("H100", 1000, 1)
    assert row.low < 0.0005 and row.high > 0.005, "a factor of about 30 either way"
    text = render(f).tables[0].rows[0]
    assert "too few screenings" in text[-1]


def test_the_fleet_figures_from_what_sdcguard_keeps() -> None:
    nodes = [
        gpu_node("a1", "A100", 20),
        gpu_node("a2", "A100", 150),
        gpu_node("h1", "H100", 5),
        gpu_node("h2", "H100", None),
    ]
    tests = [
        screening("a1-1", "a1", 220, "Pass", 0.8),
        screening("a1-2", "a1", 120, "Pass", 0.6),
        screening("a1-3", "a1", 20, "Pass", 0.7),
        screening("h1-1", "h1", 300, "Pass"),
        screening("h1-2", "h1", 100, "SDC"),
        screening("h1-3", "h1", 5, "Pass"),
    ]
    # h1: passed at -300h, a job reported at -150h, failed at -100h, quarantined at -99h.
    tickets = [ticket("h1", 99)]
    reports = [report("h1", 150)]
    pods = [pod("a1"), pod("h1", probe=True), pod("gone")]
    f = figures(nodes, [POLICY], tests, tickets, reports, pods, NOW)
    assert [(t.hardware_type, t.screenings, t.failures) for t in f.types] == [
        ("A100", 3, 0),
        ("H100", 3, 1),
    ]
    assert f.onset.incidents == 1
    assert f.onset.median_low_hours == 51  # quarantine - first evidence (the report)
    assert f.onset.median_high_hours == 201  # quarantine - last pass
    assert (f.past_recertification.count, f.past_recertification.of) == (2, 4)
    assert f.hours_between == (100 + 100 + 200 + 95) / 4
    assert f.busy_share == 0.25, "a1 works; a probe is not work; gone is no fleet node"
    assert f.estimate is not None
    result = render(f)
    assert result.data["exposure"]["estimateHours"] == f.estimate.hours
    assert any("2 of 4 qualified nodes" in line for line in result.lines)
    assert any("between 51.0h and 201.0h" in line for line in result.lines)


def test_a_fleet_with_no_history_says_so() -> None:
    f = figures([gpu_node("n1", "H100")], [POLICY], [], [], [], [], NOW)
    result = render(f)
    assert f.types == [] and f.estimate is None
    assert result.tables[0].rows == []
    assert any("no quarantine yet" in line for line in result.lines)
    assert any("no estimate yet" in line for line in result.lines)
    assert result.data["exposure"]["estimateHours"] is None


def test_a_pod_holding_a_dra_claim_works_its_node() -> None:
    claimed = {"metadata": {}, "spec": {"nodeName": "n1", "resourceClaims": [{"name": "gpus"}]}}
    f = figures(
        [gpu_node("n1", "H100"), gpu_node("n2", "H100")], [POLICY], [], [], [], [claimed], NOW
    )
    assert f.busy_share == 0.5


def test_pods_unknown_count_every_hour_as_work() -> None:
    f = figures([gpu_node("n1", "H100")], [POLICY], [], [], [], None, NOW)
    assert f.busy_share == 1.0


def test_fleet_is_a_command_with_json_output() -> None:
    args = build_parser().parse_args(["fleet", "-o", "json"])
    assert args.command == "fleet"
    tests = [screening("t", "n1", 1, "Pass")]
    f = figures([gpu_node("n1", "H100")], [POLICY], tests, [], [], [], NOW)
    out = io.StringIO()
    emit(render(f), "json", out)
    assert json.loads(out.getvalue())["hardwareTypes"][0]["type"] == "H100"


def test_status_shows_why_a_node_is_next() -> None:
    policy = SDCPolicy.model_validate(
        {
            "metadata": {"name": "p"},
            "status": {
                "budgetOrder": [
                    {"node": "h1", "basis": "risk", "chance": 0.03, "reason": "chance 3.00e-02"},
                    {"node": "h2", "basis": "overdue", "reason": "overdue: 500 ahead"},
                ]
            },
        }
    )
    rows = commands._next_rows([policy])
    assert [(r["place"], r["node"], r["basis"]) for r in rows] == [
        (1, "h1", "risk"),
        (2, "h2", "overdue"),
    ]
    assert rows[0]["reason"] == "chance 3.00e-02"
