"""The plugin's subcommands. Each reads or writes through :mod:`sdcguard.cli.kube` and returns
an :class:`~sdcguard.cli.output.Result`; deciding what to show is kept apart from the I/O
(``summarize_fleet``, ``history_entries``, ``select_policy``) so it is testable on plain dicts."""

from __future__ import annotations

import datetime as dt
import hashlib
import socket
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from sdcguard.api import (
    GROUP,
    PLURAL_BASELINES,
    PLURAL_HARDWARE,
    PLURAL_POLICIES,
    PLURAL_TESTS,
    PLURAL_TICKETS,
    VERSION,
    Resolution,
    ScreeningReason,
    SDCPolicy,
    SDCTest,
    SDCTestPhase,
    SDCTestSpec,
    Suite,
    TicketPhase,
    to_body,
    unnamed_suite,
)
from sdcguard.cli.kube import (
    CliError,
    Connection,
    call,
    get_custom,
    get_node,
    list_custom,
    list_nodes,
    patch_custom,
    whoami,
)
from sdcguard.cli.output import Result, Table, age, cell, format_time, parse_time
from sdcguard.domain import keys
from sdcguard.domain.budgets import PoolUsage, add_member, allowed_devices
from sdcguard.domain.devicetaints import SliceDevice
from sdcguard.domain.hardware import candidates, record_name
from sdcguard.domain.lifecycle import TABLE, Event, NodeState
from sdcguard.domain.observed import NodeFacts, NodeSnapshot, Observed, TicketFacts
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
CLOSED_PHASES = {TicketPhase.CLOSED.value, TicketPhase.RETIRED.value}
FINISHED_PHASES = {p.value for p in SDCTestPhase if p.finished}
NO_POOL = "-"
NO_POLICY = "-"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta: Mapping[str, Any] = obj.get("metadata") or {}
    return meta


def _name(obj: Mapping[str, Any]) -> str:
    return str(_meta(obj).get("name", ""))


# --------------------------------------------------------------------------- policies


def _policies(items: Iterable[Mapping[str, Any]]) -> list[SDCPolicy]:
    """Parsed policies; one that does not parse is skipped (the operator reports it)."""
    parsed = []
    for item in items:
        try:
            parsed.append(SDCPolicy.model_validate(item))
        except ValidationError:
            continue
    return parsed


def _facts(node: Mapping[str, Any], policy: SDCPolicy) -> NodeFacts:
    return NodeFacts.from_body(node, policy.spec.accelerators, policy.spec.budgets.pool_label)


def policy_selects(policy: SDCPolicy, node: Mapping[str, Any]) -> bool:
    """Whether ``policy`` covers ``node``: its whole nodeSelector (matchLabels and
    matchExpressions), and an accelerator (or the policy simulates devices on the CPU)."""
    labels = _meta(node).get("labels") or {}
    if not selects(policy.spec.node_selector, labels):
        return False
    return _facts(node, policy).accelerators > 0 or policy.spec.probe.cpu_devices > 0


def select_policy(policies: Sequence[SDCPolicy], node: Mapping[str, Any]) -> SDCPolicy | None:
    """The policy that covers ``node``: the most specific selector wins (most matchLabels
    and matchExpressions),
    by the operator's own rule (:func:`sdcguard.domain.selection.most_specific`).

    Raises CliError when two equally specific policies cover the node (where the operator
    picks the first name), so that people fix the tie.
    """
    matching = [p for p in policies if policy_selects(p, node)]
    labels = _meta(node).get("labels") or {}
    top = most_specific(labels, {p.metadata.name: p.spec.node_selector for p in matching})
    if not top:
        return None
    if len(top) > 1:
        raise CliError(
            f"node {_name(node)} is covered by policies {', '.join(top)}; choose one with --policy"
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


def summarize_fleet(
    nodes: Iterable[Mapping[str, Any]], policies: Sequence[SDCPolicy]
) -> FleetSummary:
    """Count nodes per (policy, pool, state). Nodes without a state label that no policy covers
    are not part of the fleet; a covered node without a label is "Unqualified" when it
    carries the policy's gate taint (it waits for its acceptance test, which labels it)
    and "New" otherwise (not seen yet)."""
    counts: dict[tuple[str, str], Counter[str]] = {}
    totals: Counter[str] = Counter()
    for node in nodes:
        labels = _meta(node).get("labels") or {}
        state = labels.get(keys.LABEL_STATE)
        policy = _owner(policies, node)  # a tie: counted where the operator puts it
        if state is None and policy is None:
            continue
        if state is None and policy is not None:
            gate = policy.spec.taints.gate
            gated = any(t.get("key") == gate for t in (node.get("spec") or {}).get("taints") or [])
            state = "Unqualified" if gated else None
        state = state or "New"
        pool = NO_POOL
        if policy is not None and policy.spec.budgets.pool_label:
            pool = labels.get(policy.spec.budgets.pool_label) or NO_POOL
        key = (policy.metadata.name if policy else NO_POLICY, pool)
        counts.setdefault(key, Counter())[state] += 1
        totals[state] += 1
    pools = [
        {
            "policy": policy_name,
            "pool": pool,
            "nodes": sum(states.values()),
            "states": dict(sorted(states.items(), key=lambda kv: _state_sort_key(kv[0]))),
        }
        for (policy_name, pool), states in sorted(counts.items())
    ]
    ordered = dict(sorted(totals.items(), key=lambda kv: _state_sort_key(kv[0])))
    return FleetSummary(pools=pools, states=ordered, nodes=sum(totals.values()))


def _ticket_row(ticket: Mapping[str, Any], now: dt.datetime) -> dict[str, Any]:
    spec = ticket.get("spec") or {}
    status = ticket.get("status") or {}
    opened = parse_time(status.get("openedAt")) or parse_time(
        _meta(ticket).get("creationTimestamp")
    )
    external = spec.get("external") or {}
    return {
        "name": _name(ticket),
        "node": spec.get("nodeName"),
        "phase": status.get("phase", TicketPhase.OPEN.value),
        "cycle": status.get("cycle", 1),
        "resolution": spec.get("resolution"),
        "openedAt": format_time(opened),
        "ageSeconds": int((now - opened).total_seconds()) if opened else None,
        "external": (f"{external.get('system')}:{external.get('id')}" if external else None),
        "delivered": (status.get("notification") or {}).get("delivered"),
    }


def status(conn: Connection) -> Result:
    """Fleet by state and pool, each policy's mode and breaker, and the open tickets."""
    now = _now()
    raw_policies = list_custom(conn, PLURAL_POLICIES)
    policies = _policies(raw_policies)
    nodes = list_nodes(conn)
    summary = summarize_fleet(nodes, policies)
    waiting = _waiting_rows(nodes)
    open_tickets = [
        t
        for t in list_custom(conn, PLURAL_TICKETS)
        if (t.get("status") or {}).get("phase", TicketPhase.OPEN.value) not in CLOSED_PHASES
    ]
    tickets = [_ticket_row(t, now) for t in open_tickets]
    devices = _device_rows(open_tickets)
    device_budget = _device_budget_rows(nodes, policies, devices, open_tickets)
    tickets.sort(key=lambda t: t["openedAt"] or "")
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
    data = {
        "policies": policy_rows,
        "nodes": summary.nodes,
        "states": summary.states,
        "pools": summary.pools,
        "openTickets": tickets,
        "devicesOutOfService": devices,
        "deviceBudget": device_budget,
        "waiting": waiting,
    }
    columns = [s for s in [*STATE_ORDER, "New"] if s in summary.states]
    columns += sorted(s for s in summary.states if s not in columns)
    tables = [
        Table(
            ["policy", "mode", "paused", "breaker", "window", "reason"],
            [
                [
                    p["name"],
                    p["mode"],
                    cell(p["paused"]),
                    p["breaker"]["state"],
                    f"{p['breaker']['windowFailures']}/{p['breaker']['windowSamples']} failed",
                    cell(p["breaker"]["reason"]),
                ]
                for p in policy_rows
            ],
            empty="No SDCPolicy: nothing is screened. Create one (kubectl explain sdcpolicy.spec) "
            "or install the chart with policy.create=true.",
        ),
        Table(
            ["policy", "pool", "nodes", *columns],
            [
                [
                    row["policy"],
                    row["pool"],
                    str(row["nodes"]),
                    *[str(row["states"].get(s, 0)) for s in columns],
                ]
                for row in summary.pools
            ],
            empty="No accelerator nodes found.",
        ),
        Table(
            ["ticket", "node", "phase", "cycle", "age", "external", "notified"],
            [
                [
                    t["name"],
                    cell(t["node"]),
                    t["phase"],
                    str(t["cycle"]),
                    age(parse_time(t["openedAt"]), now),
                    cell(t["external"]),
                    cell(t["delivered"]),
                ]
                for t in tickets
            ],
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
            ["node", "state", "for", "why"],
            [
                [w["node"], cell(w["state"]), age(parse_time(w["since"]), now), w["why"]]
                for w in waiting
            ],
            title="Waiting nodes:",
            empty="No node waits.",
        ),
    ]
    return Result(data=data, tables=tables)


def _device_budget_rows(
    nodes: Iterable[Mapping[str, Any]],
    policies: Sequence[SDCPolicy],
    devices: list[dict[str, Any]],
    tickets: list[dict[str, Any]],
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
    ticketed = {(t.get("spec") or {}).get("nodeName") for t in tickets}
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


def _owner(policies: Sequence[SDCPolicy], node: Mapping[str, Any]) -> SDCPolicy | None:
    """The policy that owns ``node`` (on a tie, the one the operator picks), or None."""
    try:
        return select_policy(policies, node)
    except CliError:
        labels = _meta(node).get("labels") or {}
        top = most_specific(labels, {p.metadata.name: p.spec.node_selector for p in policies})
        return next(p for p in policies if p.metadata.name == top[0])


def _device_rows(tickets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The devices that open tickets of quarantine scope Device took out of service."""
    rows = []
    for ticket in tickets:
        spec = ticket.get("spec") or {}
        record = spec.get("quarantine") or {}
        if record.get("scope") != "Device":
            continue
        for device in record.get("devices") or []:
            rows.append(
                {
                    "node": spec.get("nodeName", ""),
                    "device": f"{device.get('driver', '')}/{device.get('pool', '')}/"
                    f"{device.get('device', '')}",
                    "uuid": device.get("uuid"),
                    "ticket": _meta(ticket).get("name", ""),
                    "rule": device.get("rule", ""),
                }
            )
    rows.sort(key=lambda r: (r["node"], r["device"]))
    return rows


def _waiting_rows(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Nodes whose next step sdcguard holds back, and why (sdcguard.dev/waiting), longest
    first."""
    rows = []
    for node in nodes:
        meta = _meta(node)
        annotations = meta.get("annotations") or {}
        why = annotations.get(keys.WAITING)
        if not why:
            continue
        rows.append(
            {
                "node": meta.get("name", ""),
                "state": (meta.get("labels") or {}).get(keys.LABEL_STATE),
                "since": annotations.get(keys.WAITING_SINCE),
                "why": why,
            }
        )
    rows.sort(key=lambda r: (r["since"] or "", r["node"]))
    return rows


# --------------------------------------------------------------------------- test


def default_suite(node: Mapping[str, Any]) -> tuple[Suite, str]:
    """The suite a manual test runs when none is named, and why: a node that never
    qualified gets the acceptance suite (as the operator's own gate would), any other
    the requalification suite."""
    meta = _meta(node)
    state = (meta.get("labels") or {}).get(keys.LABEL_STATE)
    never = not (meta.get("annotations") or {}).get(keys.QUALIFIED_AT)
    suite = unnamed_suite(not (never and state in (None, NodeState.UNQUALIFIED.value)))
    if suite == Suite.ACCEPTANCE:
        return suite, "the node never qualified"
    return suite, "the node qualified before"


def running_test(
    node: Mapping[str, Any], tests: Iterable[Mapping[str, Any]]
) -> tuple[str, str] | None:
    """The name and phase of a test that has not ended on ``node``, if any: the one the
    node's annotation names, else any unfinished SDCTest for it."""
    name = _name(node)
    unfinished = {
        _name(t): str((t.get("status") or {}).get("phase") or SDCTestPhase.PENDING.value)
        for t in tests
        if (t.get("spec") or {}).get("nodeName") == name
        and (t.get("status") or {}).get("phase") not in FINISHED_PHASES
    }
    current = ((_meta(node).get("annotations") or {}).get(keys.CURRENT_TEST)) or ""
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
        policy = SDCPolicy.model_validate(get_custom(conn, PLURAL_POLICIES, policy_name))
        if not policy_selects(policy, node):
            raise CliError(
                f"policy {policy_name} does not cover node {node_name} (its nodeSelector or "
                "accelerators do not match); pick another with --policy"
            )
    else:
        chosen = select_policy(_policies(list_custom(conn, PLURAL_POLICIES)), node)
        if chosen is None:
            raise CliError(
                f"no SDCPolicy covers node {node_name}; pass --policy NAME, or label the node to "
                "match a policy's nodeSelector (kubectl get sdcpolicies -o yaml)"
            )
        policy = chosen
    labels = _meta(node).get("labels") or {}
    if labels.get(keys.LABEL_EXCLUDE) == "true":
        raise CliError(
            f"node {node_name} is excluded ({keys.LABEL_EXCLUDE}=true); remove the label first: "
            f"kubectl label node {node_name} {keys.LABEL_EXCLUDE}-"
        )
    tests = list_custom(conn, PLURAL_TESTS)
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
            f"sdctest/{name} created: {suite.value} suite ({why}) on node {node_name} "
            f"(policy {policy.metadata.name}, reason Manual).",
            f"Follow it: kubectl get sdctest {name} -w",
        ],
    )


class _NameTaken(Exception):
    """The API server answered 409: an SDCTest of that name exists already."""


def manual_test_name(node_name: str, tests: Iterable[Mapping[str, Any]]) -> str:
    """``<node>-manual-<n>``: one more than the highest n of the node's manual tests (a
    long node name is cut and given a digest of the whole, so names stay apart)."""
    stem = node_name
    if len(stem) > 200:
        stem = f"{stem[:191].rstrip('-.')}-{hashlib.sha256(node_name.encode()).hexdigest()[:8]}"
    prefix = f"{stem}-manual-"
    taken = [_name(t)[len(prefix) :] for t in tests if _name(t).startswith(prefix)]
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
    node: Mapping[str, Any], action: str, message: str, request_id: str, now: dt.datetime
) -> dict[str, Any]:
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    micro = now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    name = _name(node)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name[:200]}.{request_id[:8]}", "namespace": "default"},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Node",
            "name": name,
            "uid": _meta(node).get("uid"),
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


def release_refusal(node: Mapping[str, Any]) -> str | None:
    """Why a release request for ``node`` would be refused, or None when the operator can act
    on it. Releasing returns a node held out of service (quarantined, under repair, suspect,
    retired, or gated before acceptance) to Qualified; a node that is merely being tested,
    or already qualified, has nothing to release, and the operator would undo it at once."""
    meta = _meta(node)
    name = _name(node)
    state = (meta.get("labels") or {}).get(keys.LABEL_STATE)
    if state == NodeState.TESTING.value:
        test = (meta.get("annotations") or {}).get(keys.CURRENT_TEST)
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
    if (known, Event.MANUAL_RELEASE) not in TABLE:
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
    labels = _meta(node).get("labels") or {}
    if action == "release":
        refusal = release_refusal(node)
        if refusal:
            raise CliError(refusal)
    warnings = []
    if labels.get(keys.LABEL_EXCLUDE) == "true":
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
        event_name = _name(created)
    except CliError as exc:
        warnings.append(
            f"warning: the request is recorded on the node, but the Event was not: {exc}"
        )
    state = labels.get(keys.LABEL_STATE)
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
    ticket = get_custom(conn, PLURAL_TICKETS, ticket_name)
    phase = (ticket.get("status") or {}).get("phase", TicketPhase.OPEN.value)
    if phase in CLOSED_PHASES:
        raise CliError(f"repairticket {ticket_name} is already {phase}; nothing to resolve")
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
    node = (patched.get("spec") or {}).get("nodeName")
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


def _checks_summary(checks: Sequence[Mapping[str, Any]]) -> str:
    parts = []
    for check in checks:
        text = f"{check.get('name')}={check.get('verdict')}"
        extra = []
        if check.get("oddDevice") is not None:
            extra.append(f"device {check['oddDevice']}")
        if check.get("firstDivergentStep") is not None:
            extra.append(f"step {check['firstDivergentStep']}")
        if extra:
            text += f"({', '.join(extra)})"
        parts.append(text)
    return " ".join(parts)


def history_entries(
    tests: Iterable[Mapping[str, Any]],
    tickets: Iterable[Mapping[str, Any]],
    events: Iterable[Mapping[str, Any]],
    reports: Iterable[Mapping[str, Any]] = (),
) -> list[dict[str, Any]]:
    """One time-ordered list of what happened to a node (oldest first)."""
    entries: list[dict[str, Any]] = []
    for report in reports:
        spec, st = report.get("spec") or {}, report.get("status") or {}
        meta = _meta(report)
        detail = (
            f"{spec.get('method')} at step {spec.get('step')} "
            f"({spec.get('confirmation', 'Unconfirmed')})"
        )
        if spec.get("gpuUUID"):
            detail += f" on GPU {spec['gpuUUID']}"
        detail += f", job {spec.get('jobName') or spec.get('podName')}: "
        detail += f"{st.get('phase', 'Pending')}"
        if st.get("reason"):
            detail += f" [{st['reason']}]"
        if st.get("outcome"):
            detail += f", {st['outcome']}"
        entries.append(
            {
                "time": format_time(
                    parse_time(spec.get("observedAt")) or parse_time(meta.get("creationTimestamp"))
                ),
                "kind": "SDCReport",
                "name": f"{meta.get('namespace')}/{meta.get('name')}",
                "detail": detail,
                "phase": st.get("phase"),
                "outcome": st.get("outcome"),
                "gpuUUID": spec.get("gpuUUID"),
                "method": spec.get("method"),
            }
        )
    for test in tests:
        spec, st = test.get("spec") or {}, test.get("status") or {}
        created = parse_time(_meta(test).get("creationTimestamp"))
        finished = parse_time(st.get("completionTime"))
        # The suite that ran (the operator's pick for a test that named none).
        suite = st.get("suite") or spec.get("suite") or "suite not chosen yet"
        detail = f"{suite} ({spec.get('reason')}): {st.get('phase', 'Pending')}"
        if st.get("verdict"):
            detail += f", verdict {st['verdict']}"
        if st.get("reason"):
            detail += f" [{st['reason']}]"
        seed = st.get("seed", spec.get("seed"))
        if seed is not None:
            detail += f", seed {seed}"
        data = st.get("dataSeed", spec.get("dataSeed"))
        if data is not None and data != seed:
            detail += f", data seed {data}"
        checks = _checks_summary(st.get("checks") or [])
        if checks:
            detail += f"; {checks}"
        entries.append(
            {
                "time": format_time(finished or parse_time(st.get("startTime")) or created),
                "kind": "SDCTest",
                "name": _name(test),
                "detail": detail,
                "phase": st.get("phase", "Pending"),
                "verdict": st.get("verdict"),
                "suite": st.get("suite") or spec.get("suite"),
                "reason": spec.get("reason"),
                "startTime": st.get("startTime"),
                "completionTime": st.get("completionTime"),
                "seed": seed,
                "dataSeed": data,
            }
        )
    for ticket in tickets:
        spec, st = ticket.get("spec") or {}, ticket.get("status") or {}
        history = st.get("history") or []
        if not history:
            history = [
                {
                    "time": st.get("openedAt") or _meta(ticket).get("creationTimestamp"),
                    "phase": st.get("phase", TicketPhase.OPEN.value),
                    "message": "opened",
                }
            ]
        for step in history:
            detail = f"{step.get('phase')} (cycle {st.get('cycle', 1)})"
            if step.get("message"):
                detail += f": {step['message']}"
            entries.append(
                {
                    "time": format_time(parse_time(step.get("time"))),
                    "kind": "RepairTicket",
                    "name": _name(ticket),
                    "detail": detail,
                    "phase": step.get("phase"),
                    "resolution": spec.get("resolution"),
                }
            )
    for event in events:
        when = (
            parse_time(event.get("eventTime"))
            or parse_time(event.get("lastTimestamp"))
            or parse_time(event.get("firstTimestamp"))
            or parse_time(_meta(event).get("creationTimestamp"))
        )
        involved = event.get("involvedObject") or {}
        count = event.get("count") or 1
        entries.append(
            {
                "time": format_time(when),
                "kind": "Event",
                "name": f"{involved.get('kind')}/{involved.get('name')}",
                "detail": f"{event.get('type', 'Normal')} {event.get('reason')}: "
                f"{event.get('message', '')}" + (f" (x{count})" if count > 1 else ""),
                "type": event.get("type"),
                "reason": event.get("reason"),
                "message": event.get("message"),
            }
        )
    entries.sort(key=lambda e: (e["time"] or "", e["kind"], e["name"]))
    return entries


def seeds_passed(tests: Iterable[Mapping[str, Any]], field: str = "seed") -> list[int]:
    """The distinct seeds (``field``: ``seed``, or ``dataSeed`` for the screenings' own
    data) of a node's passed screenings, in the order first passed."""
    done: list[tuple[str, int]] = []
    for test in tests:
        st = test.get("status") or {}
        seed = st.get(field)
        if st.get("verdict") == "Pass" and isinstance(seed, int):
            done.append((str(st.get("completionTime") or ""), seed))
    return list(dict.fromkeys(seed for _, seed in sorted(done)))


def history(conn: Connection, node_name: str, limit: int | None) -> Result:
    """SDCTests, RepairTickets and Events of one node, oldest first."""
    node: Mapping[str, Any] | None
    try:
        node = get_node(conn, node_name)
    except CliError as exc:
        if "not found" not in str(exc):
            raise
        node = None
    tests = [
        t
        for t in list_custom(conn, PLURAL_TESTS)
        if (t.get("spec") or {}).get("nodeName") == node_name
    ]
    tickets = [
        t
        for t in list_custom(conn, PLURAL_TICKETS)
        if (t.get("spec") or {}).get("nodeName") == node_name
    ]
    # Training jobs' reports live in their namespaces; they outlive the Events.
    try:
        all_reports = list_custom(conn, "sdcreports")
    except CliError:  # no SDCReport CRD yet, or no right to list reports: history without
        all_reports = []
    reports = [r for r in all_reports if (r.get("spec") or {}).get("nodeName") == node_name]
    if node is None and not tests and not tickets and not reports:
        raise CliError(f"node {node_name} not found; list nodes with kubectl get nodes")
    names = {("Node", node_name)}
    names |= {("SDCTest", _name(t)) for t in tests}
    names |= {("RepairTicket", _name(t)) for t in tickets}
    node_events = (
        call(
            conn,
            conn.core.list_event_for_all_namespaces,
            field_selector=f"involvedObject.kind=Node,involvedObject.name={node_name}",
            plural="events",
        ).get("items")
        or []
    )
    # Events about cluster-scoped sdcguard objects are kept in the default namespace.
    object_events = [
        e
        for e in call(conn, conn.core.list_namespaced_event, "default", plural="events").get(
            "items"
        )
        or []
        if (
            (e.get("involvedObject") or {}).get("kind"),
            (e.get("involvedObject") or {}).get("name"),
        )
        in names - {("Node", node_name)}
    ]
    entries = history_entries(tests, tickets, [*node_events, *object_events], reports)
    if limit is not None:
        if limit < 1:
            raise CliError(f"--limit {limit}: give 1 or more, or leave it out to see everything")
        entries = entries[-limit:]
    meta = _meta(node) if node else {}
    annotations = meta.get("annotations") or {}
    passed = seeds_passed(tests)
    data_passed = seeds_passed(tests, "dataSeed")
    data = {
        "node": node_name,
        "seedsPassed": passed,
        "dataSeedsPassed": data_passed,
        "exists": node is not None,
        "state": (meta.get("labels") or {}).get(keys.LABEL_STATE),
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
    header += (
        f"\nData seeds passed ({len(data_passed)}): "
        f"{' '.join(str(x) for x in data_passed) or 'none'}"
    )
    table = Table(
        ["time", "kind", "name", "detail"],
        [[cell(e["time"]), e["kind"], e["name"], e["detail"]] for e in entries],
        title=header,
        empty=header + "\nNo tests, tickets or events recorded.",
    )
    return Result(data=data, tables=[table])


# --------------------------------------------------------------------------- baselines


def baselines(conn: Connection) -> Result:
    """Golden-value baselines: fingerprint, source, trust, and the nodes behind them."""
    now = _now()
    rows: list[dict[str, Any]] = []
    for item in sorted(list_custom(conn, PLURAL_BASELINES), key=_name):
        spec, st = item.get("spec") or {}, item.get("status") or {}
        fp = spec.get("fingerprint") or {}
        agreeing = list(st.get("agreeingNodes") or [])
        rows.append(
            {
                "name": _name(item),
                "fingerprint": fp.get("shortHash") or str(fp.get("hash", ""))[:12],
                "hash": fp.get("hash"),
                "deviceModel": fp.get("deviceModel"),
                "backend": fp.get("backend"),
                "driver": fp.get("driver"),
                "source": spec.get("source"),
                "trusted": bool(spec.get("trusted", False)),
                "checks": sorted((spec.get("digests") or {}).keys()),
                "nodes": agreeing,
                "recordedFrom": list(spec.get("recordedFrom") or []),
                "disagreeingNodes": list(st.get("disagreeingNodes") or []),
                "candidates": len(st.get("candidates") or []),
                "createdAt": _meta(item).get("creationTimestamp"),
            }
        )

    def nodes_cell(row: Mapping[str, Any]) -> str:
        nodes = row["nodes"] or row["recordedFrom"]
        shown = ",".join(nodes[:3]) + (f",+{len(nodes) - 3}" if len(nodes) > 3 else "")
        return f"{len(nodes)} ({shown})" if nodes else "0"

    table = Table(
        ["name", "fingerprint", "device", "source", "trusted", "checks", "nodes", "age"],
        [
            [
                r["name"],
                cell(r["fingerprint"]),
                cell(r["deviceModel"]),
                cell(r["source"]),
                cell(r["trusted"]),
                cell(",".join(r["checks"])),
                nodes_cell(r),
                age(parse_time(r["createdAt"]), now),
            ]
            for r in rows
        ],
        empty="No SDCBaselines yet: they appear when the first nodes of a fingerprint are tested.",
    )
    return Result(data=rows, tables=[table])


def _hardware_row(item: Mapping[str, Any]) -> dict[str, Any]:
    spec, st = item.get("spec") or {}, item.get("status") or {}
    retired = st.get("retired") or None
    return {
        "name": _name(item),
        "kind": spec.get("kind"),
        "id": spec.get("id"),
        "totalFailures": int(st.get("totalFailures") or len(st.get("failures") or [])),
        "failures": list(st.get("failures") or []),
        "nodes": list(st.get("nodes") or []),
        "lastNode": st.get("lastNode"),
        "retired": retired,
        "untrusted": list(st.get("untrusted") or []),
        "createdAt": _meta(item).get("creationTimestamp"),
    }


def _hardware_matches(conn: Connection, items: list[dict[str, Any]], wanted: str) -> list[Any]:
    """Records named ``wanted``, or keyed by it (a providerID, UUID or serial), or those
    of the Node of that name (by its trusted identifiers)."""
    by_name = [i for i in items if _name(i) == wanted]
    if by_name:
        return by_name
    value = wanted.strip().lower()
    by_id = [i for i in items if str((i.get("spec") or {}).get("id", "")).lower() == value]
    if by_id:
        return by_id
    try:
        body = get_node(conn, wanted)
    except CliError:
        body = None
    names: set[str] = set()
    if body is not None:
        snap = NodeSnapshot.from_body(body)
        ids = candidates(snap.provider_id, snap.system_uuid, snap.machine_id)
        names = {record_name(kind, v) for kind, v in ids if v.strip()}
    return [
        i
        for i in items
        if _name(i) in names
        or any(n.get("node") == wanted for n in (i.get("status") or {}).get("nodes") or [])
    ]


def hardware(conn: Connection, wanted: str | None) -> Result:
    """SDCHardware records: the failure history of failing hardware across tickets and Node
    names. ``wanted``: a record's name, a hardware identifier, or a Node name."""
    now = _now()
    items = sorted(list_custom(conn, PLURAL_HARDWARE), key=_name)
    if wanted is not None:
        items = _hardware_matches(conn, items, wanted)
        if not items:
            raise CliError(
                f"no hardware history for {wanted!r}: it names no SDCHardware, identifier or "
                "Node with one (only hardware that failed has a history); list them with "
                "kubectl sdc hardware"
            )
    rows = [_hardware_row(i) for i in items]

    def seen(row: Mapping[str, Any]) -> str:
        names = list(dict.fromkeys(n.get("node", "") for n in row["nodes"]))
        return ",".join(names[:3]) + (f",+{len(names) - 3}" if len(names) > 3 else "") or "-"

    summary = Table(
        ["name", "kind", "id", "failures", "last node", "seen as", "retired", "age"],
        [
            [
                r["name"],
                cell(r["kind"]),
                cell(r["id"]),
                str(r["totalFailures"]),
                cell(r["lastNode"]),
                seen(r),
                cell((r["retired"] or {}).get("time")),
                age(parse_time(r["createdAt"]), now),
            ]
            for r in rows
        ],
        empty="No hardware history: no hardware has failed a screening yet.",
    )
    tables = [summary]
    if wanted is not None:
        for r in rows:
            tables.append(
                Table(
                    ["time", "kind", "node", "ticket", "test"],
                    [
                        [
                            cell(f.get("time")),
                            cell(f.get("kind")),
                            cell(f.get("node")),
                            cell(f.get("ticket")),
                            cell(f.get("test")),
                        ]
                        for f in r["failures"]
                    ],
                    title=f"Failures of {r['name']} ({r['totalFailures']} in all)",
                )
            )
            if r["untrusted"]:
                tables.append(
                    Table(
                        ["kind", "value", "why not trusted"],
                        [
                            [cell(u.get("kind")), cell(u.get("value")), cell(u.get("reason"))]
                            for u in r["untrusted"]
                        ],
                        title=f"Identifiers of {cell(r['lastNode'])} not used to recognise it",
                    )
                )
    lines = []
    if any(r["retired"] for r in rows):
        lines.append(
            "Retired hardware is retired again whenever a Node comes back with it; delete its "
            "SDCHardware (kubectl delete sdchardware NAME) to give it a fresh start."
        )
    return Result(data=rows, tables=tables, lines=lines)
