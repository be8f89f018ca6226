"""``kubectl sdc fleet``: the figures a fleet operator looks at, from objects sdcguard
already keeps (``domain.fleetstats``): failures per hardware type with a 95% interval,
time from onset to quarantine as the fleet can bracket it, the share of qualified nodes
past their re-certification age, and the exposure the current policy implies."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sdcguard.api import (
    PLURAL_TESTS,
    PLURAL_TICKETS,
    RepairTicket,
    SDCPolicy,
    SDCTest,
    Verdict,
    accelerator_resources,
)
from sdcguard.api.common import parse_duration
from sdcguard.api.report import SDCReport
from sdcguard.api.resources import REPORT
from sdcguard.cli.commands import _now, _owner, _policies
from sdcguard.cli.kube import CliError, Connection, Listing, call, list_nodes, list_typed
from sdcguard.cli.objects import Node
from sdcguard.cli.output import Result, Table
from sdcguard.domain import keys
from sdcguard.domain.fleetstats import (
    FleetFigures,
    Screening,
    Share,
    fleet_figures,
    hardware_type,
    past_recertification,
)
from sdcguard.domain.quantity import whole_quantity
from sdcguard.domain.states import NodeState

#: Probe Pods carry this component label: they are screening, not work.
_COMPONENT = ("app.kubernetes.io/component", "sdcprobe")


def screenings(tests: Iterable[SDCTest], types: Mapping[str, str]) -> list[Screening]:
    """Finished screenings with a verdict on the hardware (Pass or SDC), each with its
    node's hardware type (``types``: node -> type) and its weakest check's catch chance."""
    rows = []
    for test in tests:
        st = test.status
        if st is None or st.verdict not in (Verdict.PASS, Verdict.SDC):
            continue
        finished = st.completion_time
        if finished is None:
            continue
        catches = [c.catch_chance for c in st.checks if c.catch_chance is not None]
        rows.append(
            Screening(
                node=test.spec.node_name,
                hardware_type=types.get(test.spec.node_name, ""),
                finished_at=finished,
                failed=st.verdict == Verdict.SDC,
                catch_chance=min(catches) if catches else None,
            )
        )
    return rows


def quarantines(tickets: Iterable[RepairTicket]) -> list[tuple[str, dt.datetime]]:
    """Each repair ticket is one quarantine: its node and when it opened."""
    out = []
    for t in tickets:
        opened = t.metadata.creation_timestamp
        if opened is not None:
            out.append((t.spec.node_name, opened))
    return out


def recertification(
    nodes: Iterable[Node], policies: Sequence[SDCPolicy], now: dt.datetime
) -> Share:
    """Qualified nodes past their policy's maxQualificationAge (policies with none set
    count no node)."""
    share = Share(0, 0)
    by_policy: dict[str, list[dt.datetime | None]] = {}
    for node in nodes:
        if node.state != NodeState.QUALIFIED.value or not policies:
            continue
        policy = _owner(policies, node)
        if policy is None:
            continue
        at = keys.parse_time(node.annotations.get(keys.QUALIFIED_AT))
        by_policy.setdefault(policy.metadata.name, []).append(at)
    for policy in policies:
        age = policy.spec.triggers.max_qualification_age
        if age == "0" or policy.metadata.name not in by_policy:
            continue
        limit = dt.timedelta(seconds=parse_duration(age))
        share = share + past_recertification(by_policy[policy.metadata.name], limit, now)
    return share


def busy_share(
    nodes: Iterable[Node],
    policies: Sequence[SDCPolicy],
    pods: Iterable[Mapping[str, Any]] | None,
) -> float:
    """The share of qualified nodes running a Pod (not a probe) that holds one of its
    policy's accelerators now (or any DRA claim): the hours a fault there serves work. Pods unknown
    (None): 1, every hour counts as work."""
    if pods is None:
        return 1.0
    wanted: dict[str, list[str]] = {}
    for node in nodes:
        if node.state != NodeState.QUALIFIED.value or not policies:
            continue
        policy = _owner(policies, node)
        if policy is not None:
            wanted[node.name] = list(policy.spec.accelerators)
    if not wanted:
        return 0.0
    busy = set()
    for pod in pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        on = str(spec.get("nodeName") or "")
        if on not in wanted or (meta.get("labels") or {}).get(_COMPONENT[0]) == _COMPONENT[1]:
            continue
        if spec.get("resourceClaims"):  # its claims' devices are the node's, as the operator counts
            busy.add(on)
            continue
        for container in spec.get("containers") or []:
            limits = (container.get("resources") or {}).get("limits") or {}
            names = accelerator_resources(wanted[on], limits)
            if any(whole_quantity(limits.get(n, 0)) > 0 for n in names):
                busy.add(on)
    return len(busy) / len(wanted)


def figures(
    nodes: Sequence[Node],
    policies: Sequence[SDCPolicy],
    tests: Iterable[SDCTest],
    tickets: Iterable[RepairTicket],
    reports: Iterable[SDCReport],
    pods: Iterable[Mapping[str, Any]] | None,
    now: dt.datetime,
) -> FleetFigures:
    """The figures from decoded objects (no cluster needed: testable on its own)."""
    types = {n.name: hardware_type(n.labels) for n in nodes}
    reported = [
        (r.spec.node_name, r.metadata.creation_timestamp)
        for r in reports
        if r.metadata.creation_timestamp is not None
    ]
    return fleet_figures(
        screenings(tests, types),
        quarantines(tickets),
        reported,
        recertification(nodes, policies, now),
        busy_share(nodes, policies, pods),
    )


def _hours(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}h"


def render(f: FleetFigures) -> Result:
    """The figures as data (-o json|yaml) and tables."""
    past = f.past_recertification
    data = {
        "hardwareTypes": [
            {
                "type": t.hardware_type,
                "screenings": t.screenings,
                "failures": t.failures,
                "rate": t.rate,
                "low": t.low,
                "high": t.high,
            }
            for t in f.types
        ],
        "onsetToQuarantine": {
            "incidents": f.onset.incidents,
            "bounded": f.onset.bounded,
            "medianLowHours": f.onset.median_low_hours,
            "medianHighHours": f.onset.median_high_hours,
        },
        "pastRecertification": {"nodes": past.count, "of": past.of, "share": past.fraction},
        "exposure": {
            "hoursBetweenScreenings": f.hours_between,
            "catchChance": f.catch_chance,
            "busyShare": f.busy_share,
            "estimateHours": f.estimate.hours if f.estimate else None,
            "note": f.explain_estimate(),
        },
    }
    tables = [
        Table(
            ["hardware type", "screenings", "failures", "rate", "95% interval", "what it means"],
            [
                [
                    t.hardware_type or "(unlabelled)",
                    str(t.screenings),
                    str(t.failures),
                    f"{t.rate:.1e}",
                    f"{t.low:.1e} - {t.high:.1e}",
                    _meaning(t.low, t.high),
                ]
                for t in f.types
            ],
            title="Failures per hardware type (a failure: a screening with an SDC verdict):",
            empty="No screening has finished yet: no failure rate to show.",
        ),
    ]
    lines = [
        "Onset to quarantine: "
        + f.onset.explain()
        + (
            " (the onset is unseen: at least quarantine minus first evidence, at most "
            "quarantine minus the last pass)"
            if f.onset.incidents
            else ""
        ),
        f"Past re-certification age: {past.count} of {past.of} qualified nodes"
        + (f" ({past.fraction:.0%})" if past.of else ""),
        "Exposure estimate for the current policy: " + f.explain_estimate(),
    ]
    return Result(data=data, tables=tables, lines=lines)


def _meaning(low: float, high: float) -> str:
    """How much the interval pins the rate down (a wide one says how little it means)."""
    if low <= 0:
        return f"no failure yet: the rate may still be as high as {high:.1e}"
    ratio = high / low
    if ratio >= 10:
        return f"too few screenings: known only within x{ratio:.0f}"
    return f"known within x{ratio:.1f}"


def fleet(conn: Connection) -> Result:
    """Read the objects and show the figures."""
    now = _now()
    policies = _policies(conn)
    nodes = list_nodes(conn)
    tests = list_typed(conn, SDCTest, PLURAL_TESTS)
    tickets = list_typed(conn, RepairTicket, PLURAL_TICKETS)
    try:
        reports = list_typed(conn, SDCReport, REPORT.plural)
    except CliError:  # no SDCReport CRD, or no right to list them: no report evidence
        reports = Listing([])
    warnings = [*tests.warnings, *tickets.warnings, *reports.warnings]
    pods: list[Mapping[str, Any]] | None
    try:
        body = call(
            conn,
            conn.core.list_pod_for_all_namespaces,
            field_selector="status.phase=Running",
            plural="pods",
        )
        pods = list((body.get("items") if isinstance(body, Mapping) else None) or [])
    except CliError as exc:
        pods = None
        warnings.append(f"Pods not listed ({exc}): the estimate counts every hour as work")
    result = render(figures(nodes, policies, tests.items, tickets.items, reports.items, pods, now))
    result.lines += warnings
    return result
