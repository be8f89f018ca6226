"""The plugin's subcommands. Each reads or writes through :mod:`sdcguard.cli.kube` and returns
an :class:`~sdcguard.cli.output.Result`; deciding what to show is kept apart from the I/O
(``summarize_fleet``, ``history_entries``, ``select_policy``) so it is testable on decoded
models without a cluster."""

from __future__ import annotations

import datetime as dt
import hashlib
import socket
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from kubernetes.client.exceptions import ApiException

from sdcguard.api import (
    GROUP,
    PLURAL_BASELINES,
    PLURAL_HARDWARE,
    PLURAL_POLICIES,
    PLURAL_TESTS,
    PLURAL_TICKETS,
    VERSION,
    CheckStatus,
    RepairTicket,
    RepairTicketStatus,
    Resolution,
    ScreeningReason,
    SDCBaseline,
    SDCHardware,
    SDCPolicy,
    SDCTest,
    SDCTestPhase,
    SDCTestSpec,
    Suite,
    TicketPhase,
    Verdict,
    to_body,
    unnamed_suite,
)
from sdcguard.api.report import SDCReport
from sdcguard.api.resources import REPORT
from sdcguard.cli.kube import (
    CliError,
    Connection,
    Listing,
    Where,
    call,
    decode,
    get_node,
    get_typed,
    list_events,
    list_nodes,
    list_typed,
    patch_custom,
    whoami,
)
from sdcguard.cli.objects import Event, Node, wire, wire_time
from sdcguard.cli.output import Result, Table, age, cell, format_time
from sdcguard.domain import keys
from sdcguard.domain.budgets import PoolUsage, add_member, allowed_devices
from sdcguard.domain.devicetaints import SliceDevice
from sdcguard.domain.hardware import candidates, record_name
from sdcguard.domain.lifecycle import TABLE, NodeState
from sdcguard.domain.lifecycle import Event as LifecycleEvent
from sdcguard.domain.observed import NodeFacts, NodeSnapshot, Observed, TicketFacts
from sdcguard.domain.recertification import LABEL_OVERDUE
from sdcguard.domain.seeds import SeedsPassed
from sdcguard.domain.selection import most_specific, selects

PLUGIN = "kubectl-sdc"

# The manual-action contract on Nodes. The operator acts on ``sdcguard.dev/quarantine`` or
# ``sdcguard.dev/release`` (value: the reason) and removes it; the ``request*`` annotations
# stay behind as the record of the last request: what, why, who, and a unique id that ties
# the annotation to the audit Event.
REQUEST = keys.PREFIX + "request"
REQUEST_REASON = keys.PREFIX + "request-reason"
REQUEST_BY = keys.PREFIX + "request-by"
REQUEST_ID = keys.PREFIX + "request-id"
ACTION_ANNOTATIONS = {"quarantine": keys.REQUEST_QUARANTINE, "release": keys.REQUEST_RELEASE}
EVENT_REASONS = {
    "quarantine": "ManualQuarantineRequested",
    "release": "ManualReleaseRequested",
}
TEST_NODE_LABEL = keys.PREFIX + "node"
REQUESTED_BY = keys.PREFIX + "requested-by"
RESOLVED_BY = keys.PREFIX + "resolved-by"
STATE_ORDER = [s.value for s in NodeState]
CLOSED_PHASES = {TicketPhase.CLOSED, TicketPhase.RETIRED}
NO_POOL = "-"
NO_POLICY = "-"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _ticket_phase(ticket: RepairTicket) -> TicketPhase:
    return ticket.status.phase if ticket.status else TicketPhase.OPEN


def _test_phase(test: SDCTest) -> SDCTestPhase:
    return test.status.phase if test.status else SDCTestPhase.PENDING


OnNode = TypeVar("OnNode", SDCTest, RepairTicket, SDCReport)
"""The kinds whose CRDs make spec.nodeName selectable."""


def on_node(node: str, model: type[OnNode]) -> Where[OnNode]:
    """One node's objects of ``model`` (SDCTests, RepairTickets, SDCReports): the API
    server selects them by spec.nodeName, a field each of their CRDs makes selectable."""
    del model  # names the type the selection is for
    return Where(f"spec.nodeName={node}", lambda o: o.spec.node_name == node)


def unfinished_tests() -> Where[SDCTest]:
    """The SDCTests that have not ended (one without a status is Pending)."""
    ended = ",".join(f"status.phase!={p.value}" for p in SDCTestPhase if p.finished)
    return Where(ended, lambda t: not _test_phase(t).finished)


def open_tickets() -> Where[RepairTicket]:
    """The RepairTickets not closed or retired (one without a status is Open)."""
    closed = ",".join(f"status.phase!={p.value}" for p in sorted(CLOSED_PHASES))
    return Where(closed, lambda t: _ticket_phase(t) not in CLOSED_PHASES)


def _value(member: StrEnum | None) -> str | None:
    """An enum member as the plain string the API writes (None stays None)."""
    return None if member is None else member.value


# --------------------------------------------------------------------------- policies


def _policies(conn: Connection) -> list[SDCPolicy]:
    """The policies that decode; one that does not is skipped (the operator reports it)."""
    return list_typed(conn, SDCPolicy, PLURAL_POLICIES).items


def _facts(node: Node, policy: SDCPolicy) -> NodeFacts:
    spec = policy.spec
    return NodeFacts.from_body(
        node.body, spec.accelerators, spec.budgets.pool_label, spec.dra_classes, node.dra_devices
    )


def policy_selects(policy: SDCPolicy, node: Node) -> bool:
    """Whether ``policy`` covers ``node``: its whole nodeSelector (matchLabels and
    matchExpressions), and an accelerator (or the policy simulates devices on the CPU)."""
    if not selects(policy.spec.node_selector, node.labels):
        return False
    return _facts(node, policy).accelerators > 0 or policy.spec.probe.cpu_devices > 0


def select_policy(policies: Sequence[SDCPolicy], node: Node) -> SDCPolicy | None:
    """The policy that covers ``node``: the most specific selector wins (most matchLabels
    and matchExpressions),
    by the operator's own rule (:func:`sdcguard.domain.selection.most_specific`).

    Raises CliError when two equally specific policies cover the node (where the operator
    picks the first name), so that people fix the tie.
    """
    matching = [p for p in policies if policy_selects(p, node)]
    top = most_specific(node.labels, {p.metadata.name: p.spec.node_selector for p in matching})
    if not top:
        return None
    if len(top) > 1:
        raise CliError(
            f"node {node.name} is covered by policies {', '.join(top)}; choose one with --policy"
        )
    return next(p for p in matching if p.metadata.name == top[0])


# --------------------------------------------------------------------------- status


@dataclass(frozen=True)
class FleetSummary:
    """Nodes by policy, pool and state."""

    pools: list[dict[str, Any]]
    states: dict[str, int]
    nodes: int


def _state_sort_key(state: str) -> tuple[int, str]:
    return (STATE_ORDER.index(state) if state in STATE_ORDER else len(STATE_ORDER), state)


def summarize_fleet(nodes: Iterable[Node], policies: Sequence[SDCPolicy]) -> FleetSummary:
    """Count nodes per (policy, pool, state). Nodes without a state label that no policy covers
    are not part of the fleet; a covered node without a label is "Unqualified" when it
    carries the policy's gate taint (it waits for its acceptance test, which labels it)
    and "New" otherwise (not seen yet)."""
    counts: dict[tuple[str, str], Counter[str]] = {}
    overdue: Counter[tuple[str, str]] = Counter()
    totals: Counter[str] = Counter()
    for node in nodes:
        state = node.state
        policy = _owner(policies, node)  # a tie: counted where the operator puts it
        if state is None and policy is None:
            continue
        if state is None and policy is not None:
            gated = policy.spec.taints.gate in node.taint_keys
            state = "Unqualified" if gated else None
        state = state or "New"
        pool = NO_POOL
        if policy is not None and policy.spec.budgets.pool_label:
            pool = node.labels.get(policy.spec.budgets.pool_label) or NO_POOL
        key = (policy.metadata.name if policy else NO_POLICY, pool)
        counts.setdefault(key, Counter())[state] += 1
        overdue[key] += node.labels.get(LABEL_OVERDUE) == "true"
        totals[state] += 1
    pools = [
        {
            "policy": policy_name,
            "pool": pool,
            "nodes": sum(states.values()),
            "overdue": overdue[(policy_name, pool)],
            "states": dict(sorted(states.items(), key=lambda kv: _state_sort_key(kv[0]))),
        }
        for (policy_name, pool), states in sorted(counts.items())
    ]
    ordered = dict(sorted(totals.items(), key=lambda kv: _state_sort_key(kv[0])))
    return FleetSummary(pools=pools, states=ordered, nodes=sum(totals.values()))


def _ticket_row(ticket: RepairTicket, now: dt.datetime) -> dict[str, Any]:
    spec, status = ticket.spec, ticket.status
    opened = _opened_at(ticket)
    external = spec.external
    return {
        "name": ticket.metadata.name,
        "node": spec.node_name,
        "phase": _ticket_phase(ticket).value,
        "cycle": status.cycle if status else 1,
        "resolution": _value(spec.resolution),
        "openedAt": format_time(opened),
        "ageSeconds": int((now - opened).total_seconds()) if opened else None,
        "external": f"{external.system}:{external.id}" if external else None,
        "delivered": _delivered(status),
    }


def _screening_rows(tests: Iterable[SDCTest], now: dt.datetime) -> list[dict[str, Any]]:
    """Screenings not yet ended, with their budget and when they are expected to end
    (the operator's estimate: Job start + the suite's budget + start-up allowance)."""
    rows = []
    for test in tests:
        st = test.status
        phase = _test_phase(test)
        if phase.finished:
            continue
        rows.append(
            {
                "name": test.metadata.name,
                "node": test.spec.node_name,
                "reason": test.spec.reason.value,
                "suite": _value((st.suite if st else None) or test.spec.suite),
                "phase": phase.value,
                "budgetSeconds": st.budget_seconds if st else None,
                "expectedEnd": format_time(st.expected_end) if st and st.expected_end else None,
                "startTime": format_time(st.start_time) if st and st.start_time else None,
            }
        )
    return sorted(rows, key=lambda r: (r["expectedEnd"] or "~", r["node"]))


def _ends_in(expected_end: str | None, now: dt.datetime) -> str:
    if not expected_end:
        return "-"
    end = keys.parse_time(expected_end)
    if end is None:
        return "-"
    if end <= now:
        return f"overdue {age(end, now)}"
    return f"in {age(now, end)}"


def _topology_rows(policies: Iterable[SDCPolicy]) -> list[dict[str, Any]]:
    """Each policy's topology budgets with the domains its last full pass counted (None:
    not counted yet)."""
    rows = []
    for p in sorted(policies, key=lambda p: p.metadata.name):
        counted = {t.label_key: t for t in (p.status.topology if p.status else [])}
        for budget in p.spec.budgets.topology:
            seen = counted.get(budget.label_key)
            rows.append(
                {
                    "policy": p.metadata.name,
                    "labelKey": budget.label_key,
                    "maxUnavailable": budget.max_unavailable,
                    "domains": seen.domains if seen else None,
                    "atLimit": seen.at_limit if seen else None,
                    "mostHeld": seen.most_held if seen else None,
                }
            )
    return rows


def _topology_warnings(rows: Iterable[dict[str, Any]]) -> list[str]:
    """A line per topology key that no node carries (the budget limits nothing)."""
    return [
        f"warning: policy {r['policy']}: no node carries the label {r['labelKey']}, so "
        "budgets.topology limits nothing for it"
        for r in rows
        if r["domains"] == 0
    ]


def status(conn: Connection) -> Result:
    """Fleet by state and pool, each policy's mode and breaker, the screenings running
    (budget and expected end), and the open tickets."""
    now = _now()
    policies = _policies(conn)
    nodes = list_nodes(conn)
    listed_tests = list_typed(conn, SDCTest, PLURAL_TESTS, unfinished_tests())
    screenings = _screening_rows(listed_tests.items, now)
    summary = summarize_fleet(nodes, policies)
    waiting = _waiting_rows(nodes)
    next_nodes = _next_rows(policies)
    listed = list_typed(conn, RepairTicket, PLURAL_TICKETS, open_tickets())
    still_open = listed.items
    opened = sorted(((_ticket_row(t, now), t) for t in still_open), key=_opened_first)
    tickets = [row for row, _ in opened]
    devices = _device_rows(still_open)
    device_budget = _device_budget_rows(nodes, policies, devices, still_open)
    policy_rows: list[dict[str, Any]] = []
    for p in sorted(policies, key=lambda p: p.metadata.name):
        breaker = p.status.breaker if p.status else None
        policy_rows.append(
            {
                "name": p.metadata.name,
                "mode": p.spec.mode.value,
                "paused": p.spec.paused,
                "breaker": {
                    "state": breaker.state.value if breaker else "Closed",
                    "reason": breaker.reason if breaker else "",
                    "trippedAt": format_time(breaker.tripped_at) if breaker else None,
                    "windowSamples": breaker.window_samples if breaker else 0,
                    "windowFailures": breaker.window_failures if breaker else 0,
                    "windowFailedDevices": breaker.window_failed_devices if breaker else 0,
                },
            }
        )
    topology = _topology_rows(policies)
    data = {
        "policies": policy_rows,
        "topology": topology,
        "nodes": summary.nodes,
        "states": summary.states,
        "pools": summary.pools,
        "openTickets": tickets,
        "devicesOutOfService": devices,
        "deviceBudget": device_budget,
        "waiting": waiting,
        "screenings": screenings,
        "budgetOrder": next_nodes,
    }
    columns = [s for s in [*STATE_ORDER, "New"] if s in summary.states]
    columns += sorted(s for s in summary.states if s not in columns)
    tables = [
        Table(
            ["policy", "mode", "paused", "breaker", "window", "reason", "tripped at"],
            [
                [
                    p["name"],
                    p["mode"],
                    cell(p["paused"]),
                    p["breaker"]["state"],
                    f"{p['breaker']['windowFailures']}/{p['breaker']['windowSamples']} failed",
                    cell(p["breaker"]["reason"]),
                    cell(p["breaker"]["trippedAt"]),
                ]
                for p in policy_rows
            ],
            wide=["tripped at"],
            empty="No SDCPolicy: nothing is screened. Create one (kubectl explain sdcpolicy.spec) "
            "or install the chart with policy.create=true.",
        ),
        Table(
            ["policy", "pool", "nodes", *columns, "overdue"],
            [
                [
                    row["policy"],
                    row["pool"],
                    str(row["nodes"]),
                    *[str(row["states"].get(s, 0)) for s in columns],
                    str(row["overdue"]),
                ]
                for row in summary.pools
            ],
            empty="No accelerator nodes found.",
        ),
        Table(
            [
                "ticket",
                "node",
                "phase",
                "cycle",
                "age",
                "external",
                "notified",
                "resolution",
                "opened at",
            ],
            [
                [
                    t["name"],
                    cell(t["node"]),
                    t["phase"],
                    str(t["cycle"]),
                    age(_opened_at(ticket), now),
                    cell(t["external"]),
                    cell(t["delivered"]),
                    cell(t["resolution"]),
                    cell(t["openedAt"]),
                ]
                for t, ticket in opened
            ],
            wide=["resolution", "opened at"],
            title="Open repair tickets:",
            empty="No open repair tickets.",
        ),
        Table(
            ["node", "device", "uuid", "ticket", "rule"],
            [[d["node"], d["device"], cell(d["uuid"]), d["ticket"], d["rule"]] for d in devices],
            title="Devices out of service (quarantine scope Device; their nodes serve):",
            empty="No device is out of service on its own.",
        ),
        Table(
            ["policy", "pool", "devices", "out of service", "maxUnavailableDevices", "allows"],
            [
                [
                    b["policy"],
                    b["pool"],
                    str(b["devices"]),
                    str(b["outOfService"]),
                    cell(b["maxUnavailableDevices"]),
                    cell(b["allows"]),
                ]
                for b in device_budget
            ],
            title="Device budget (devices of held nodes and device taints, per pool):",
            empty="No accelerator devices found.",
        ),
        Table(
            ["policy", "label key", "maxUnavailable", "domains", "at limit", "most held"],
            [
                [
                    t["policy"],
                    t["labelKey"],
                    str(t["maxUnavailable"]),
                    cell(t["domains"]),
                    cell(t["atLimit"]),
                    cell(t["mostHeld"]),
                ]
                for t in topology
            ],
            title="Topology budgets (nodes held per domain; a domain at its limit screens no "
            "more until one returns):",
        ),
        Table(
            ["node", "state", "for", "why", "since"],
            [
                [
                    w["node"],
                    cell(w["state"]),
                    age(keys.parse_time(w["since"]), now),
                    w["why"],
                    cell(w["since"]),
                ]
                for w in waiting
            ],
            wide=["since"],
            title="Waiting nodes:",
            empty="No node waits.",
        ),
        Table(
            ["test", "node", "reason", "phase", "budget", "ends", "expected end"],
            [
                [
                    r["name"],
                    r["node"],
                    r["reason"],
                    r["phase"],
                    f"{r['budgetSeconds']}s" if r["budgetSeconds"] is not None else "-",
                    _ends_in(r["expectedEnd"], now),
                    cell(r["expectedEnd"]),
                ]
                for r in screenings
            ],
            wide=["expected end"],
            title="Screenings in progress:",
            empty="No screening in progress.",
        ),
        Table(
            ["policy", "#", "node", "basis", "chance", "why"],
            [
                [
                    n["policy"],
                    str(n["place"]),
                    n["node"],
                    n["basis"],
                    f"{n['chance']:.1e}" if n["chance"] is not None else "-",
                    n["reason"],
                ]
                for n in next_nodes
            ],
            title="Next for test budget (the risk order, as of the last full pass):",
            empty="No node waits for test budget.",
        ),
    ]
    return Result(
        data=data,
        tables=tables,
        lines=[*listed.warnings, *listed_tests.warnings, *_topology_warnings(topology)],
    )


def _next_rows(policies: Iterable[SDCPolicy]) -> list[dict[str, Any]]:
    """Each policy's first nodes waiting for test budget, in order, with why (its status's
    budgetOrder: the risk order's inputs and score per node)."""
    rows = []
    for p in sorted(policies, key=lambda p: p.metadata.name):
        for place, n in enumerate(p.status.budget_order if p.status else [], start=1):
            rows.append(
                {
                    "policy": p.metadata.name,
                    "place": place,
                    "node": n.node,
                    "basis": n.basis,
                    "chance": n.chance,
                    "reason": n.reason,
                }
            )
    return rows


def _delivered(status: RepairTicketStatus | None) -> bool | None:
    """Whether the sinks accepted the ticket; None ("-") while no delivery is recorded."""
    if status is None or "notification" not in status.model_fields_set:
        return None
    return status.notification.delivered


def _opened_at(ticket: RepairTicket) -> dt.datetime | None:
    """When the ticket's node was quarantined (its creation, for a ticket without status)."""
    opened = ticket.status.opened_at if ticket.status else None
    return opened or ticket.metadata.creation_timestamp


def _opened_first(pair: tuple[dict[str, Any], RepairTicket]) -> str:
    return str(pair[0]["openedAt"] or "")


def _device_budget_rows(
    nodes: Iterable[Node],
    policies: Sequence[SDCPolicy],
    devices: list[dict[str, Any]],
    tickets: list[RepairTicket],
) -> list[dict[str, Any]]:
    """Per policy and pool: its devices, those out of service as the operator counts them
    (``Observed.pool_member``: all devices of a held node, the tainted ones of a node of
    scope Device), and what ``maxUnavailableDevices`` allows."""
    tainted: dict[str, list[SliceDevice]] = {}
    for row in devices:
        driver, _, rest = row["device"].partition("/")
        pool, _, name = rest.rpartition("/")
        tainted.setdefault(row["node"], []).append(
            SliceDevice(driver, pool, name, row["uuid"] or "")
        )
    ticketed = {t.spec.node_name for t in tickets}
    usage: dict[tuple[str, str], dict[str, PoolUsage]] = {}
    by_name = {p.metadata.name: p for p in policies}
    for node in nodes:
        policy = _owner(policies, node)
        if policy is None:
            continue
        facts = _facts(node, policy)
        name = facts.name
        ticket = (
            TicketFacts(name, devices=tuple(tainted.get(name, ()))) if name in ticketed else None
        )
        holding = frozenset({policy.spec.taints.testing, policy.spec.taints.quarantine})
        member = Observed(node=facts, ticket=ticket).pool_member(holding)
        pools = usage.setdefault((policy.metadata.name, facts.pool or NO_POOL), {})
        add_member(pools, member)
    rows = []
    for (policy_name, pool), pools in sorted(usage.items()):
        total = next(iter(pools.values()))
        budgets = by_name[policy_name].spec.budgets
        rows.append(
            {
                "policy": policy_name,
                "pool": pool,
                "devices": total.devices,
                "outOfService": total.devices_unavailable,
                "maxUnavailableDevices": budgets.max_unavailable_devices,
                "allows": allowed_devices(budgets, total.devices),
            }
        )
    return rows


def _owner(policies: Sequence[SDCPolicy], node: Node) -> SDCPolicy | None:
    """The policy that owns ``node`` (on a tie, the one the operator picks), or None."""
    try:
        return select_policy(policies, node)
    except CliError:
        top = most_specific(node.labels, {p.metadata.name: p.spec.node_selector for p in policies})
        return next(p for p in policies if p.metadata.name == top[0])


def _device_rows(tickets: list[RepairTicket]) -> list[dict[str, Any]]:
    """The devices that open tickets of quarantine scope Device took out of service."""
    rows = []
    for ticket in tickets:
        record = ticket.spec.quarantine
        if record is None or record.scope != "Device":
            continue
        for device in record.devices:
            rows.append(
                {
                    "node": ticket.spec.node_name,
                    "device": f"{device.driver}/{device.pool}/{device.device}",
                    "uuid": device.uuid,
                    "ticket": ticket.metadata.name,
                    "rule": device.rule,
                }
            )
    rows.sort(key=lambda r: (r["node"], r["device"]))
    return rows


def _waiting_rows(nodes: list[Node]) -> list[dict[str, Any]]:
    """Nodes whose next step sdcguard holds back, and why (sdcguard.dev/waiting), longest
    first."""
    rows = []
    for node in nodes:
        why = node.annotations.get(keys.WAITING)
        if not why:
            continue
        rows.append(
            {
                "node": node.name,
                "state": node.state,
                "since": node.annotations.get(keys.WAITING_SINCE),
                "why": why,
            }
        )
    rows.sort(key=lambda r: (r["since"] or "", r["node"]))
    return rows


# --------------------------------------------------------------------------- test


def default_suite(node: Node) -> tuple[Suite, str]:
    """The suite a manual test runs when none is named, and why: a node that never
    qualified gets the acceptance suite (as the operator's own gate would), any other
    the requalification suite."""
    never = not node.annotations.get(keys.QUALIFIED_AT)
    suite = unnamed_suite(not (never and node.state in (None, NodeState.UNQUALIFIED.value)))
    if suite == Suite.ACCEPTANCE:
        return suite, "the node never qualified"
    return suite, "the node qualified before"


def running_test(node: Node, tests: Iterable[SDCTest]) -> tuple[str, str] | None:
    """The name and phase of a test that has not ended on ``node``, if any: the one the
    node's annotation names, else any unfinished SDCTest for it."""
    unfinished = {
        t.metadata.name: _test_phase(t).value
        for t in tests
        if t.spec.node_name == node.name and not _test_phase(t).finished
    }
    current = node.annotations.get(keys.CURRENT_TEST, "")
    if current in unfinished:
        return current, unfinished[current]
    if unfinished:
        first = sorted(unfinished)[0]
        return first, unfinished[first]
    return None


def start_test(
    conn: Connection,
    node_name: str,
    suite: Suite | None,
    policy_name: str | None,
    seed: int | None = None,
    data_seed: int | None = None,
) -> Result:
    """Create an SDCTest (reason Manual) for ``node_name``, unless one is running there;
    ``seed`` pins the seed of the probe's baseline rounds, ``data_seed`` that of the
    others."""
    node = get_node(conn, node_name)
    if policy_name:
        policy = get_typed(conn, SDCPolicy, PLURAL_POLICIES, policy_name)
        if not policy_selects(policy, node):
            raise CliError(
                f"policy {policy_name} does not cover node {node_name} (its nodeSelector or "
                "accelerators do not match); pick another with --policy"
            )
    else:
        chosen = select_policy(_policies(conn), node)
        if chosen is None:
            raise CliError(
                f"no SDCPolicy covers node {node_name}; pass --policy NAME, or label the node to "
                "match a policy's nodeSelector (kubectl get sdcpolicies -o yaml)"
            )
        policy = chosen
    if node.labels.get(keys.LABEL_EXCLUDE) == "true":
        raise CliError(
            f"node {node_name} is excluded ({keys.LABEL_EXCLUDE}=true); remove the label first: "
            f"kubectl label node {node_name} {keys.LABEL_EXCLUDE}-"
        )
    listed = list_typed(conn, SDCTest, PLURAL_TESTS, on_node(node_name, SDCTest))
    tests = listed.items
    running = running_test(node, tests)
    if running is not None:
        test_name, phase = running
        raise CliError(
            f"node {node_name} already has a test that has not ended: sdctest/{test_name} "
            f"({phase}); follow it with kubectl get sdctest {test_name} -w, and run this again "
            f"once it ends (or cancel it: kubectl delete sdctest {test_name})"
        )
    why = "as asked"
    if suite is None:
        suite, why = default_suite(node)
    who = whoami(conn)
    test = SDCTest(
        spec=SDCTestSpec(
            node_name=node_name,
            policy_ref=policy.metadata.name,
            suite=suite,
            reason=ScreeningReason.MANUAL,
            seed=seed,
            data_seed=data_seed,
        )
    )
    body = to_body(test)
    name = manual_test_name(node_name, tests)
    body["metadata"] = {
        # A name of its own per node and number, not generateName: of two runs at the same
        # moment that both found no test running, the API server refuses the second (409).
        "name": name,
        # Label values stop at 63 characters; longer node names are found by spec.nodeName.
        "labels": {TEST_NODE_LABEL: node_name} if len(node_name) <= 63 else {},
        "annotations": {REQUESTED_BY: who},
    }
    created = _create_manual_test(conn, body, node_name)
    return Result(
        data=created,
        lines=[
            *listed.warnings,
            f"sdctest/{name} created: {suite.value} suite ({why}) on node {node_name} "
            f"(policy {policy.metadata.name}, reason Manual).",
            f"Follow it: kubectl get sdctest {name} -w",
        ],
    )


class _NameTaken(Exception):
    """The API server answered 409: an SDCTest of that name exists already."""


def manual_test_name(node_name: str, tests: Iterable[SDCTest]) -> str:
    """``<node>-manual-<n>``: one more than the highest n of the node's manual tests (a
    long node name is cut and given a digest of the whole, so names stay apart)."""
    stem = node_name
    if len(stem) > 200:
        stem = f"{stem[:191].rstrip('-.')}-{hashlib.sha256(node_name.encode()).hexdigest()[:8]}"
    prefix = f"{stem}-manual-"
    names = [t.metadata.name for t in tests]
    taken = [n[len(prefix) :] for n in names if n.startswith(prefix)]
    return f"{prefix}{max((int(n) for n in taken if n.isdecimal()), default=0) + 1}"


def _create_manual_test(conn: Connection, body: dict[str, Any], node_name: str) -> dict[str, Any]:
    """Create the SDCTest; a name already taken means another ``kubectl sdc test`` of this
    node got there first: refuse, naming it."""

    def create(*args: Any, **kwargs: Any) -> Any:
        try:
            return conn.custom.create_cluster_custom_object(*args, **kwargs)
        except ApiException as exc:
            if exc.status == 409:
                raise _NameTaken from None
            raise

    name = str(body["metadata"]["name"])
    try:
        created: dict[str, Any] = call(
            conn, create, GROUP, VERSION, PLURAL_TESTS, body, plural=PLURAL_TESTS, name=name
        )
    except _NameTaken:
        raise CliError(
            f"node {node_name} already has a test that has not ended: sdctest/{name} was "
            f"created by another request at the same moment; follow it with kubectl get "
            f"sdctest {name} -w, and run this again once it ends"
        ) from None
    return created


# --------------------------------------------------------------------------- quarantine, release


def request_annotations(
    action: str, reason: str, by: str, request_id: str
) -> dict[str, str | None]:
    """The node annotations of one manual request (None removes an annotation).

    A request also withdraws a pending opposite request, so the last word counts.
    """
    other = "release" if action == "quarantine" else "quarantine"
    return {
        ACTION_ANNOTATIONS[action]: reason,
        ACTION_ANNOTATIONS[other]: None,
        REQUEST: action,
        REQUEST_REASON: reason,
        REQUEST_BY: by,
        REQUEST_ID: request_id,
    }


def _audit_event(
    node: Node, action: str, message: str, request_id: str, now: dt.datetime
) -> dict[str, Any]:
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    micro = now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    name = node.name
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name[:200]}.{request_id[:8]}", "namespace": "default"},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Node",
            "name": name,
            "uid": node.metadata.uid,
        },
        "reason": EVENT_REASONS[action],
        "message": message,
        "type": "Warning" if action == "quarantine" else "Normal",
        "action": action.capitalize(),
        "source": {"component": PLUGIN},
        "reportingComponent": PLUGIN,
        "reportingInstance": socket.gethostname()[:128],
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "eventTime": micro,
        "count": 1,
    }


def release_refusal(node: Node) -> str | None:
    """Why a release request for ``node`` would be refused, or None when the operator can act
    on it. Releasing returns a node held out of service (quarantined, under repair, suspect,
    retired, or gated before acceptance) to Qualified; a node that is merely being tested,
    or already qualified, has nothing to release, and the operator would undo it at once."""
    name, state = node.name, node.state
    if state == NodeState.TESTING.value:
        test = node.annotations.get(keys.CURRENT_TEST)
        running = f" (sdctest/{test})" if test else ""
        stop = f"; to stop the test: kubectl delete sdctest {test}" if test else ""
        return (
            f"node {name} is Testing{running}, not quarantined: there is nothing to release. It "
            f"returns to service by itself when the test passes{stop}"
        )
    if state is None or state == NodeState.EXCLUDED.value:
        return None
    try:
        known = NodeState(state)
    except ValueError:
        return None  # a mangled label: the operator recovers the state from its records
    if (known, LifecycleEvent.MANUAL_RELEASE) not in TABLE:
        return (
            f"node {name} is {state}: there is nothing to release (a release returns a node "
            "held out of service, e.g. Quarantined or Repairing, to Qualified)"
        )
    return None


def request_action(conn: Connection, action: str, node_name: str, reason: str) -> Result:
    """Annotate ``node_name`` with a quarantine or release request and record an Event."""
    reason = " ".join(reason.split())
    if not reason:
        raise CliError(f"--reason must say why the node should be {action}d, for the audit trail")
    node = get_node(conn, node_name)
    if action == "release":
        refusal = release_refusal(node)
        if refusal:
            raise CliError(refusal)
    warnings = []
    if node.labels.get(keys.LABEL_EXCLUDE) == "true":
        warnings.append(
            f"warning: node {node_name} is excluded ({keys.LABEL_EXCLUDE}=true); the operator "
            "ignores the request until the label is removed"
        )
    who = whoami(conn)
    request_id = str(uuid.uuid4())
    now = _now()
    annotations = request_annotations(action, reason, who, request_id)
    call(
        conn,
        conn.core.patch_node,
        node_name,
        {"metadata": {"annotations": annotations}},
        plural="nodes",
        name=node_name,
        _content_type="application/merge-patch+json",
    )
    message = f"{who} requested {action} of node {node_name}: {reason} (request {request_id})"
    event_name: str | None = None
    try:
        created = call(
            conn,
            conn.core.create_namespaced_event,
            "default",
            _audit_event(node, action, message, request_id, now),
            plural="events",
        )
        event_name = Event.model_validate(created).metadata.name
    except CliError as exc:
        warnings.append(
            f"warning: the request is recorded on the node, but the Event was not: {exc}"
        )
    state = node.state
    data = {
        "node": node_name,
        "request": action,
        "reason": reason,
        "by": who,
        "requestId": request_id,
        "event": event_name,
        "stateBefore": state,
    }
    return Result(
        data=data,
        lines=[
            *warnings,
            f"node/{node_name}: {action} requested by {who} (request {request_id}); "
            "the operator acts on it shortly.",
            f"Watch it: kubectl get node {node_name} -L {keys.LABEL_STATE} -w",
        ],
    )


# --------------------------------------------------------------------------- repaired


def resolve_ticket(conn: Connection, ticket_name: str, resolution: Resolution, note: str) -> Result:
    """Record the repair side's answer on a RepairTicket."""
    note = note.strip()
    if not note:
        raise CliError("--note must say what was done (it goes into the ticket's history)")
    ticket = get_typed(conn, RepairTicket, PLURAL_TICKETS, ticket_name)
    phase = _ticket_phase(ticket)
    if phase in CLOSED_PHASES:
        raise CliError(f"repairticket {ticket_name} is already {phase.value}; nothing to resolve")
    who = whoami(conn)
    patched = patch_custom(
        conn,
        PLURAL_TICKETS,
        ticket_name,
        {
            "metadata": {"annotations": {RESOLVED_BY: who}},
            "spec": {"resolution": resolution.value, "resolutionNote": note},
        },
    )
    node = decode(RepairTicket, patched, PLURAL_TICKETS).spec.node_name
    next_step = (
        "the node will be retired."
        if resolution == Resolution.RETIRE
        else "the operator verifies the node with the repairVerification suite next."
    )
    return Result(
        data=patched,
        lines=[
            f"repairticket/{ticket_name} resolved as {resolution.value} by {who}; {next_step}",
            f"Follow it: kubectl sdc history {node}" if node else "",
        ],
    )


# --------------------------------------------------------------------------- history


def _checks_summary(checks: Sequence[CheckStatus]) -> str:
    parts = []
    for check in checks:
        text = f"{check.name}={check.verdict.value}"
        extra = []
        if check.odd_device is not None:
            extra.append(f"device {check.odd_device}")
        if check.first_divergent_step is not None:
            extra.append(f"step {check.first_divergent_step}")
        if extra:
            text += f"({', '.join(extra)})"
        parts.append(text)
    return " ".join(parts)


def _report_entry(report: SDCReport) -> dict[str, Any]:
    spec, st = report.spec, report.status
    phase = _value(st.phase if st else None)
    detail = f"{spec.method.value} at step {spec.step} ({spec.confirmation.value})"
    if spec.gpu_uuid:
        detail += f" on GPU {spec.gpu_uuid}"
    detail += f", job {spec.job_name or spec.pod_name}: {phase or 'Pending'}"
    if st and st.reason:
        detail += f" [{st.reason}]"
    if st and st.outcome:
        detail += f", {st.outcome.value}"
    namespace = getattr(report.metadata, "namespace", None)  # kept as an extra field
    return {
        "time": format_time(spec.observed_at or report.metadata.creation_timestamp),
        "kind": "SDCReport",
        "name": f"{namespace}/{report.metadata.name}",
        "detail": detail,
        "phase": phase,
        "outcome": _value(st.outcome if st else None),
        "gpuUUID": spec.gpu_uuid,
        "method": spec.method.value,
    }


def _test_entry(test: SDCTest) -> dict[str, Any]:
    spec, st = test.spec, test.status
    phase = _test_phase(test).value
    # The suite that ran (the operator's pick for a test that named none).
    suite = _value((st.suite if st else None) or spec.suite)
    detail = f"{suite or 'suite not chosen yet'} ({spec.reason.value}): {phase}"
    if st and st.verdict:
        detail += f", verdict {st.verdict.value}"
    if st and st.reason:
        detail += f" [{st.reason}]"
    seed = st.seed if st and st.seed is not None else spec.seed
    data = st.data_seed if st and st.data_seed is not None else spec.data_seed
    if seed is not None:
        detail += f", seed {seed}"
    if data is not None and data != seed:
        detail += f", data seed {data}"
    checks = _checks_summary(st.checks if st else [])
    if checks:
        detail += f"; {checks}"
    if st and st.catch_target_met is False:
        detail += f"; catch target missed: {st.catch_shortfall or 'no detail'}"
    started = st.start_time if st else None
    finished = st.completion_time if st else None
    return {
        "time": format_time(finished or started or test.metadata.creation_timestamp),
        "kind": "SDCTest",
        "name": test.metadata.name,
        "detail": detail,
        "phase": phase,
        "verdict": _value(st.verdict if st else None),
        "suite": suite,
        "reason": spec.reason.value,
        "startTime": wire_time(started),
        "completionTime": wire_time(finished),
        "seed": seed,
        "dataSeed": data,
        "catchTargetMet": st.catch_target_met if st else None,
    }


def _ticket_entries(ticket: RepairTicket) -> list[dict[str, Any]]:
    st = ticket.status
    steps: list[tuple[dt.datetime | None, str, str]] = [
        (step.time, step.phase.value, step.message) for step in (st.history if st else [])
    ]
    if not steps:
        steps = [(_opened_at(ticket), _ticket_phase(ticket).value, "opened")]
    cycle = st.cycle if st else 1
    entries = []
    for time, phase, message in steps:
        detail = f"{phase} (cycle {cycle})"
        if message:
            detail += f": {message}"
        entries.append(
            {
                "time": format_time(time),
                "kind": "RepairTicket",
                "name": ticket.metadata.name,
                "detail": detail,
                "phase": phase,
                "resolution": _value(ticket.spec.resolution),
            }
        )
    return entries


def _event_entry(event: Event) -> dict[str, Any]:
    kind, name = event.about
    count = event.count or 1
    return {
        "time": format_time(event.time),
        "kind": "Event",
        "name": f"{kind}/{name}",
        "detail": f"{event.type or 'Normal'} {event.reason}: {event.message or ''}"
        + (f" (x{count})" if count > 1 else ""),
        "type": event.type,
        "reason": event.reason,
        "message": event.message,
    }


def history_entries(
    tests: Iterable[SDCTest],
    tickets: Iterable[RepairTicket],
    events: Iterable[Event],
    reports: Iterable[SDCReport] = (),
) -> list[dict[str, Any]]:
    """One time-ordered list of what happened to a node (oldest first)."""
    entries: list[dict[str, Any]] = [_report_entry(r) for r in reports]
    entries += [_test_entry(t) for t in tests]
    for ticket in tickets:
        entries += _ticket_entries(ticket)
    entries += [_event_entry(e) for e in events]
    entries.sort(key=lambda e: (e["time"] or "", e["kind"], e["name"]))
    return entries


def seeds_passed(tests: Iterable[SDCTest], field: str = "seed") -> list[int]:
    """The distinct seeds (``field``: ``seed``, or ``dataSeed`` for the screenings' own
    data) of a node's passed screenings, in the order first passed."""
    if field not in ("seed", "dataSeed"):
        raise ValueError(f"field must be seed or dataSeed, not {field!r}")
    done: list[tuple[str, int]] = []
    for test in tests:
        st = test.status
        if st is None or st.verdict != Verdict.PASS:
            continue
        seed = st.seed if field == "seed" else st.data_seed
        if seed is not None:
            done.append((wire_time(st.completion_time) or "", seed))
    return list(dict.fromkeys(seed for _, seed in sorted(done)))


def node_seeds_passed(
    tests: Iterable[SDCTest], annotations: Mapping[str, str]
) -> tuple[list[int], list[int], int]:
    """A node's seeds passed, its data seeds passed and how many screenings passed: the
    node's compact record (``sdcguard.dev/seeds-passed``, which keeps the seeds of passes
    whose SDCTests retention deleted) joined with the tests still kept."""
    kept = list(tests)
    record = SeedsPassed.parse(annotations.get(keys.SEEDS_PASSED))
    passed = list(dict.fromkeys([*record.seeds, *seeds_passed(kept)]))
    data = list(dict.fromkeys([*record.data_seeds, *seeds_passed(kept, "dataSeed")]))
    kept_passes = sum(1 for t in kept if t.status and t.status.verdict == Verdict.PASS)
    return passed, data, max(record.passed, kept_passes)


def history(conn: Connection, node_name: str, limit: int | None) -> Result:
    """SDCTests, RepairTickets and Events of one node, oldest first."""
    node: Node | None
    try:
        node = get_node(conn, node_name)
    except CliError as exc:
        if "not found" not in str(exc):
            raise
        node = None
    listed_tests = list_typed(conn, SDCTest, PLURAL_TESTS, on_node(node_name, SDCTest))
    listed_tickets = list_typed(
        conn, RepairTicket, PLURAL_TICKETS, on_node(node_name, RepairTicket)
    )
    tests = listed_tests.items
    tickets = listed_tickets.items
    warnings = [*listed_tests.warnings, *listed_tickets.warnings]
    # Training jobs' reports live in their namespaces; they outlive the Events.
    try:
        listed_reports = list_typed(conn, SDCReport, REPORT.plural, on_node(node_name, SDCReport))
    except CliError:  # no SDCReport CRD yet, or no right to list reports: history without
        listed_reports = Listing([])
    reports = listed_reports.items
    warnings += listed_reports.warnings
    if node is None and not tests and not tickets and not reports:
        raise CliError(f"node {node_name} not found; list nodes with kubectl get nodes")
    names = {("SDCTest", t.metadata.name) for t in tests}
    names |= {("RepairTicket", t.metadata.name) for t in tickets}
    node_events = list_events(
        conn,
        conn.core.list_event_for_all_namespaces,
        field_selector=f"involvedObject.kind=Node,involvedObject.name={node_name}",
    )
    # Events about cluster-scoped sdcguard objects are kept in the default namespace.
    object_events = [
        e for e in list_events(conn, conn.core.list_namespaced_event, "default") if e.about in names
    ]
    entries = history_entries(tests, tickets, [*node_events, *object_events], reports)
    if limit is not None:
        if limit < 1:
            raise CliError(f"--limit {limit}: give 1 or more, or leave it out to see everything")
        entries = entries[-limit:]
    annotations = node.annotations if node else {}
    passed, data_passed, screenings_passed = node_seeds_passed(tests, annotations)
    data = {
        "node": node_name,
        "seedsPassed": passed,
        "dataSeedsPassed": data_passed,
        "screeningsPassed": screenings_passed,
        "exists": node is not None,
        "state": node.state if node else None,
        "qualifiedAt": annotations.get(keys.QUALIFIED_AT),
        "fingerprint": annotations.get(keys.FINGERPRINT),
        "entries": entries,
    }
    header = (
        f"Node {node_name}: state {cell(data['state'])}, qualified at "
        f"{cell(data['qualifiedAt'])}, fingerprint {cell(data['fingerprint'])}"
        if node is not None
        else f"Node {node_name} no longer exists; its records:"
    )
    header += f"\nSeeds passed ({len(passed)}): {' '.join(str(x) for x in passed) or 'none'}"
    # Past the compact record's bound only the newest data seeds are listed.
    more = screenings_passed > len(data_passed)
    of = f", newest of {screenings_passed} screenings passed" if more else ""
    header += (
        f"\nData seeds passed ({len(data_passed)}{of}): "
        f"{' '.join(str(x) for x in data_passed) or 'none'}"
    )
    table = Table(
        ["time", "kind", "name", "detail", "phase"],
        [
            [cell(e["time"]), e["kind"], e["name"], e["detail"], cell(e.get("phase"))]
            for e in entries
        ],
        wide=["phase"],
        title=header,
        empty=header + "\nNo tests, tickets or events recorded.",
    )
    return Result(data=data, tables=[table], lines=warnings)


# --------------------------------------------------------------------------- baselines


def _baseline_row(item: SDCBaseline) -> dict[str, Any]:
    spec, st = item.spec, item.status
    fp = spec.fingerprint
    return {
        "name": item.metadata.name,
        "fingerprint": fp.short_hash or fp.hash[:12],
        "hash": fp.hash,
        "deviceModel": fp.device_model,
        "backend": fp.backend,
        "driver": fp.driver,
        "source": spec.source.value,
        "trusted": spec.trusted,
        "checks": sorted(spec.digests),
        "nodes": list(st.agreeing_nodes) if st else [],
        "recordedFrom": list(spec.recorded_from),
        "disagreeingNodes": list(st.disagreeing_nodes) if st else [],
        "candidates": len(st.candidates) if st else 0,
        "createdAt": wire_time(item.metadata.creation_timestamp),
    }


def baselines(conn: Connection) -> Result:
    """Golden-value baselines: fingerprint, source, trust, and the nodes behind them."""
    now = _now()
    listed = list_typed(conn, SDCBaseline, PLURAL_BASELINES)
    items = sorted(listed.items, key=lambda b: b.metadata.name)
    rows = [_baseline_row(item) for item in items]

    def nodes_cell(row: Mapping[str, Any]) -> str:
        nodes = row["nodes"] or row["recordedFrom"]
        shown = ",".join(nodes[:3]) + (f",+{len(nodes) - 3}" if len(nodes) > 3 else "")
        return f"{len(nodes)} ({shown})" if nodes else "0"

    table = Table(
        [
            "name",
            "fingerprint",
            "device",
            "source",
            "trusted",
            "checks",
            "nodes",
            "age",
            "backend",
            "driver",
            "disagreeing",
            "candidates",
            "hash",
        ],
        [
            [
                r["name"],
                cell(r["fingerprint"]),
                cell(r["deviceModel"]),
                cell(r["source"]),
                cell(r["trusted"]),
                cell(",".join(r["checks"])),
                nodes_cell(r),
                age(item.metadata.creation_timestamp, now),
                cell(r["backend"]),
                cell(r["driver"]),
                str(len(r["disagreeingNodes"])),
                str(r["candidates"]),
                r["hash"],
            ]
            for r, item in zip(rows, items, strict=True)
        ],
        wide=["backend", "driver", "disagreeing", "candidates", "hash"],
        empty="No SDCBaselines yet: they appear when the first nodes of a fingerprint are tested.",
    )
    return Result(data=rows, tables=[table], lines=listed.warnings)


def _hardware_row(item: SDCHardware) -> dict[str, Any]:
    spec, st = item.spec, item.status
    failures = st.failures if st else []
    return {
        "name": item.metadata.name,
        "kind": spec.kind.value,
        "id": spec.id,
        "totalFailures": (st.total_failures if st else 0) or len(failures),
        "failures": [wire(f) for f in failures],
        "nodes": [wire(n) for n in (st.nodes if st else [])],
        "lastNode": st.last_node if st else None,
        "retired": wire(st.retired) if st and st.retired else None,
        "untrusted": [wire(u) for u in (st.untrusted if st else [])],
        "createdAt": wire_time(item.metadata.creation_timestamp),
    }


def _hardware_matches(conn: Connection, items: list[SDCHardware], wanted: str) -> list[SDCHardware]:
    """Records named ``wanted``, or keyed by it (a providerID, UUID or serial), or those
    of the Node of that name (by its trusted identifiers)."""
    by_name = [i for i in items if i.metadata.name == wanted]
    if by_name:
        return by_name
    value = wanted.strip().lower()
    by_id = [i for i in items if i.spec.id.lower() == value]
    if by_id:
        return by_id
    try:
        node: Node | None = get_node(conn, wanted)
    except CliError:
        node = None
    names: set[str] = set()
    if node is not None:
        snap = NodeSnapshot.from_body(node.body)
        ids = candidates(snap.provider_id, snap.system_uuid, snap.machine_id)
        names = {record_name(kind, v) for kind, v in ids if v.strip()}
    return [
        i
        for i in items
        if i.metadata.name in names
        or any(seen.node == wanted for seen in (i.status.nodes if i.status else []))
    ]


def _seen_as(item: SDCHardware) -> str:
    names = list(dict.fromkeys(seen.node for seen in (item.status.nodes if item.status else [])))
    return ",".join(names[:3]) + (f",+{len(names) - 3}" if len(names) > 3 else "") or "-"


def hardware(conn: Connection, wanted: str | None) -> Result:
    """SDCHardware records: the failure history of failing hardware across tickets and Node
    names. ``wanted``: a record's name, a hardware identifier, or a Node name."""
    now = _now()
    listed = list_typed(conn, SDCHardware, PLURAL_HARDWARE)
    items = sorted(listed.items, key=lambda i: i.metadata.name)
    if wanted is not None:
        items = _hardware_matches(conn, items, wanted)
        if not items:
            raise CliError(
                f"no hardware history for {wanted!r}: it names no SDCHardware, identifier or "
                "Node with one (only hardware that failed has a history); list them with "
                "kubectl sdc hardware"
            )
    rows = [_hardware_row(i) for i in items]
    summary = Table(
        ["name", "kind", "id", "failures", "last node", "seen as", "retired", "age", "untrusted"],
        [
            [
                r["name"],
                cell(r["kind"]),
                cell(r["id"]),
                str(r["totalFailures"]),
                cell(r["lastNode"]),
                _seen_as(item),
                cell(
                    format_time(item.status.retired.time)
                    if item.status and item.status.retired
                    else None
                ),
                age(item.metadata.creation_timestamp, now),
                str(len(r["untrusted"])),
            ]
            for r, item in zip(rows, items, strict=True)
        ],
        wide=["untrusted"],
        empty="No hardware history: no hardware has failed a screening yet.",
    )
    tables = [summary]
    if wanted is not None:
        for r, item in zip(rows, items, strict=True):
            st = item.status
            tables.append(
                Table(
                    ["time", "kind", "node", "ticket", "test"],
                    [
                        [
                            cell(format_time(f.time)),
                            cell(f.kind.value),
                            cell(f.node),
                            cell(f.ticket),
                            cell(f.test),
                        ]
                        for f in (st.failures if st else [])
                    ],
                    title=f"Failures of {r['name']} ({r['totalFailures']} in all)",
                )
            )
            if st and st.untrusted:
                tables.append(
                    Table(
                        ["kind", "value", "why not trusted"],
                        [[cell(u.kind.value), cell(u.value), cell(u.reason)] for u in st.untrusted],
                        title=f"Identifiers of {cell(r['lastNode'])} not used to recognise it",
                    )
                )
    lines = list(listed.warnings)
    if any(r["retired"] for r in rows):
        lines.append(
            "Retired hardware is retired again whenever a Node comes back with it; delete its "
            "SDCHardware (kubectl delete sdchardware NAME) to give it a fresh start."
        )
    return Result(data=rows, tables=tables, lines=lines)
