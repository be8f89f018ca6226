"""What the demo watches: each node's way through the lifecycle, its tests, tickets, probes,
and whether the policy's budgets hold at every moment.

A :class:`Recorder` follows the fleet's Nodes with a watch (every state change, in order)
and polls SDCTests, RepairTickets, SDCBaselines and the simulator's snapshot once a
second. The display, the end condition, the summary and the timeline picture all read
from it; nothing here writes to the cluster.
"""

from __future__ import annotations

import datetime as dt
import functools
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from sdcdev.sim.fleet import FLEET_LABEL, Fleet
from sdcdev.sim.kube import JsonDict, Kube, ListWatch
from sdcdev.sim.state import FleetSnapshot, NodeActivity
from sdcguard.api.common import GROUP, VERSION, parse_time
from sdcguard.api.policy import allowed_unavailable

STATE_LABEL = "sdcguard.dev/state"
OWNED_TAINTS = "sdcguard.dev/owned-taints"
QUALIFIED_AT = "sdcguard.dev/qualified-at"
CURRENT_TEST = "sdcguard.dev/test"
RETRY_AFTER = "sdcguard.dev/retry-after"
API = f"/apis/{GROUP}/{VERSION}"

JOINING = "Joining"
"""A node the operator has not labelled yet."""
FINISHED_PHASES = frozenset({"Passed", "Failed", "Inconclusive", "Cancelled"})
HELD_FOR_REPAIR = frozenset({"Quarantined", "Repairing", "Verifying"})
RESCREEN_REASONS = frozenset({"ReturnFromUse", "Expiry"})


def _split(value: object) -> frozenset[str]:
    return frozenset(p.strip() for p in str(value or "").split(",") if p.strip())


@dataclass
class NodeTrack:
    """One node: its fleet config, its latest facts, and its history."""

    name: str
    instance_type: str
    pool: str
    faulty: bool
    intermittent: bool
    real: bool = False
    """A real node (kubelet, containerd) beside the simulated fleet."""
    states: list[tuple[float, str]] = field(default_factory=list)
    readiness: list[tuple[float, bool]] = field(default_factory=list)
    busy: list[list[float | None]] = field(default_factory=list)
    """[start, end] of each stretch of customer use (end None while it lasts)."""
    state: str = JOINING
    ready: bool = False
    exists: bool = False
    uid: str = ""
    taints: frozenset[str] = frozenset()
    owned_taints: frozenset[str] = frozenset()
    qualified_at: str | None = None
    current_test: str | None = None
    retry_after: dt.datetime | None = None

    @property
    def held(self) -> bool:
        """Held from work, as the operator's budgets count it (see domain.budgets)."""
        return self.state in HELD_FOR_REPAIR or self.screening_held

    @property
    def screening_held(self) -> bool:
        """A node that had served, taken away for a (re-)screening."""
        return (
            self.state in ("Testing", "Suspect")
            and self.qualified_at is not None
            and bool(self.owned_taints & self.taints)
        )

    def path(self) -> list[str]:
        """States passed through, in order, without repeats."""
        out: list[str] = []
        for _, state in self.states:
            if not out or out[-1] != state:
                out.append(state)
        return out

    def first(self, state: str) -> float | None:
        return next((t for t, s in self.states if s == state), None)


@dataclass
class TestRecord:
    """One SDCTest of the demo policy, as last seen."""

    name: str
    node: str
    reason: str
    suite: str
    attempt: int
    phase: str
    verdict: str | None
    why: str
    message: str
    created: float
    started: float | None
    completed: float | None
    failed_checks: tuple[str, ...]
    awaiting_baseline: bool
    ticket: str | None

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED_PHASES


@dataclass
class TicketRecord:
    """One RepairTicket, as last seen."""

    name: str
    node: str
    phase: str
    cycle: int
    resolution: str | None
    external_id: str | None
    evidence: tuple[str, ...]
    opened: float
    closed: float | None
    history: list[tuple[float, str]]


@dataclass(frozen=True)
class ProbeRun:
    """One probe the simulator ran for real."""

    node: str
    pod: str
    seconds: float
    outcome: str
    faults_injected: bool
    finished: float


@dataclass(frozen=True)
class Reservation:
    """A serving node taken for a re-screening, with its pool's held count just before."""

    t: float
    node: str
    pool: str
    held_before: int
    limit: int

    @property
    def within_budget(self) -> bool:
        return self.held_before < self.limit


@dataclass
class PoolBudget:
    """One pool's budget and what the run used of it."""

    pool: str
    nodes: int
    max_tests: int
    max_unavailable: int
    peak_tests: int = 0
    peak_held: int = 0
    peak_screening_held: int = 0
    samples: int = 0
    test_violations: list[tuple[float, int]] = field(default_factory=list)
    screening_violations: list[tuple[float, int]] = field(default_factory=list)


@dataclass(frozen=True)
class Transition:
    t: float
    node: str
    old: str
    new: str
    test: str | None = None
    """The SDCTest the node named (``sdcguard.dev/test``) as it entered ``new``."""


@dataclass(frozen=True)
class BaselineView:
    name: str
    trusted: bool
    agreeing: int
    candidates: int


class Recorder:
    """Follows the fleet and the demo policy; thread-safe reads through :meth:`view`."""

    def __init__(
        self,
        api_client: client.ApiClient,
        fleet: Fleet,
        policy: str,
        *,
        max_concurrent_tests: int,
        max_unavailable: int | str,
        snapshot: Callable[[], FleetSnapshot] | None = None,
        clock: Callable[[], float] = time.monotonic,
        real_nodes: Mapping[str, str] | None = None,
        real_policy: str | None = None,
    ) -> None:
        """``real_nodes``: real nodes (name -> instance type) to follow too, each a pool
        of its own screened under ``real_policy``; the demo injects a fault there, so
        each counts as faulty."""
        self.kube = Kube(api_client)
        self.fleet = fleet
        self.policy = policy
        self.policies = {policy} | ({real_policy} if real_policy else set())
        self.snapshot_fn = snapshot
        self.clock = clock
        self.t0 = clock()
        self.t0_wall = dt.datetime.now(dt.UTC)
        self.nodes: dict[str, NodeTrack] = {
            n.name: NodeTrack(
                name=n.name,
                instance_type=n.instance_type.name,
                pool=n.pool,
                faulty=n.fault_profile is not None,
                intermittent=n.fault_profile is not None
                and n.fault_profile.intermittent is not None,
            )
            for n in fleet.nodes
        }
        real = dict(real_nodes or {})
        for name, instance_type in real.items():
            self.nodes[name] = NodeTrack(
                name=name,
                instance_type=instance_type,
                pool=instance_type,
                faulty=True,
                intermittent=False,
                real=True,
            )
        sizes: dict[str, int] = {}
        for n in fleet.nodes:
            sizes[n.instance_type.name] = sizes.get(n.instance_type.name, 0) + 1
        for instance_type in real.values():
            sizes[instance_type] = sizes.get(instance_type, 0) + 1
        self.budgets = {
            pool: PoolBudget(
                pool=pool,
                nodes=size,
                max_tests=max_concurrent_tests,
                max_unavailable=allowed_unavailable(max_unavailable, size),
            )
            for pool, size in sorted(sizes.items())
        }
        self.tests: dict[str, TestRecord] = {}
        self.tickets: dict[str, TicketRecord] = {}
        self.baseline: BaselineView | None = None
        self.activity: dict[str, NodeActivity] = {}
        self.probing_since: dict[str, float] = {}
        self.probes: dict[str, ProbeRun] = {}
        self.probes_running = 0
        self.probes_queued = 0
        self.reservations: list[Reservation] = []
        self.transitions: list[Transition] = []
        self.poll_errors = 0
        self._lock = threading.RLock()
        self._stop = threading.Event()
        fleet_names = frozenset(n.name for n in fleet.nodes)
        self._watches = [
            ListWatch(
                self.kube,
                "/api/v1/nodes",
                query={"labelSelector": f"{FLEET_LABEL}={fleet.name}"},
                on_sync=lambda items: self._on_sync(items, fleet_names),
                on_event=self._on_event,
                stop_event=self._stop,
                watch_timeout=30,
            )
        ]
        for name in real:
            self._watches.append(
                ListWatch(
                    self.kube,
                    "/api/v1/nodes",
                    query={"fieldSelector": f"metadata.name={name}"},
                    on_sync=functools.partial(self._sync_one, frozenset({name})),
                    on_event=self._on_event,
                    stop_event=self._stop,
                    watch_timeout=30,
                )
            )
        self._threads: list[threading.Thread] = []

    # Time ------------------------------------------------------------------------
    def now(self) -> float:
        """Seconds since the recorder started (the lifecycle's t = 0)."""
        return self.clock() - self.t0

    def rel(self, value: object) -> float | None:
        """An API timestamp as seconds since t = 0."""
        parsed = parse_time(value)
        return None if parsed is None else (parsed - self.t0_wall).total_seconds()

    # Lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        for i, watch in enumerate(self._watches):
            thread = threading.Thread(target=watch.run, name=f"demo-node-watch-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        for watch in self._watches:
            watch.stop()
        for thread in self._threads:
            thread.join(timeout=10)

    # Nodes (watch thread) -----------------------------------------------------------
    def _sync_one(self, covered: frozenset[str], items: list[JsonDict]) -> None:
        self._on_sync(items, covered)

    def _on_sync(self, items: list[JsonDict], covered: frozenset[str]) -> None:
        """A watch's full list: the nodes it covers that are not in it are gone."""
        seen = set()
        for obj in items:
            seen.add(obj.get("metadata", {}).get("name"))
            self._node(obj, deleted=False)
        with self._lock:
            for track in self.nodes.values():
                if track.name in covered and track.name not in seen and track.exists:
                    track.exists = False

    def _on_event(self, kind: str, obj: JsonDict) -> None:
        self._node(obj, deleted=kind == "DELETED")

    def _node(self, obj: JsonDict, *, deleted: bool) -> None:
        meta = obj.get("metadata") or {}
        track = self.nodes.get(str(meta.get("name", "")))
        if track is None:
            return
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        conditions = (obj.get("status") or {}).get("conditions") or []
        t = self.now()
        with self._lock:
            was_screening = track.screening_held
            track.exists = not deleted
            track.uid = str(meta.get("uid", ""))
            track.taints = frozenset(
                str(x.get("key", "")) for x in (obj.get("spec") or {}).get("taints") or []
            )
            track.owned_taints = _split(annotations.get(OWNED_TAINTS))
            track.qualified_at = annotations.get(QUALIFIED_AT) or None
            track.current_test = annotations.get(CURRENT_TEST) or None
            track.retry_after = parse_time(annotations.get(RETRY_AFTER))
            state = str(labels.get(STATE_LABEL) or JOINING)
            if not track.states or track.state != state:
                self.transitions.append(
                    Transition(t, track.name, track.state, state, track.current_test)
                )
                track.states.append((t, state))
                track.state = state
            ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
            if not track.readiness or track.ready != ready:
                track.readiness.append((t, ready))
                track.ready = ready
            if track.screening_held and not was_screening and not deleted:
                pool = track.instance_type
                held = sum(
                    1
                    for other in self.nodes.values()
                    if other is not track and other.instance_type == pool and other.held
                )
                budget = self.budgets[pool]
                self.reservations.append(
                    Reservation(t, track.name, pool, held, budget.max_unavailable)
                )

    # Everything else (polled) ----------------------------------------------------------
    def poll(self) -> None:
        """List tests, tickets and baselines, read the simulator, and sample the budgets."""
        try:
            tests = self._list("sdctests")
            tickets = self._list("repairtickets")
            baselines = self._list("sdcbaselines", mine=False)
        except Exception:  # the API server hiccupped: next second
            self.poll_errors += 1
            return
        snap = self.snapshot_fn() if self.snapshot_fn is not None else None
        t = self.now()
        with self._lock:
            for obj in tests:
                record = self._test(obj)
                self.tests[record.name] = record
            for obj in tickets:
                ticket = self._ticket(obj)
                self.tickets[ticket.name] = ticket
            self.baseline = self._baseline(baselines)
            if snap is not None:
                self._snapshot(snap)
            self._sample_budgets(t)

    def _list(self, plural: str, *, mine: bool = True) -> list[JsonDict]:
        items = list(self.kube.request("GET", f"{API}/{plural}").get("items") or [])
        if not mine:
            return items
        return [
            i
            for i in items
            if (i.get("spec") or {}).get("policyRef") in self.policies
            and (i.get("spec") or {}).get("nodeName") in self.nodes
        ]

    def _test(self, obj: JsonDict) -> TestRecord:
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        status = obj.get("status") or {}
        conditions = status.get("conditions") or []
        return TestRecord(
            name=str(meta.get("name", "")),
            node=str(spec.get("nodeName", "")),
            reason=str(spec.get("reason", "")),
            suite=str(spec.get("suite", "")),
            attempt=int(spec.get("attempt") or 1),
            phase=str(status.get("phase") or "Pending"),
            verdict=status.get("verdict"),
            why=str(status.get("reason") or ""),
            message=str(status.get("message") or ""),
            created=self.rel(meta.get("creationTimestamp")) or 0.0,
            started=self.rel(status.get("startTime")),
            completed=self.rel(status.get("completionTime")),
            failed_checks=tuple(
                str(c.get("name")) for c in status.get("checks") or [] if c.get("verdict") == "SDC"
            ),
            awaiting_baseline=any(
                c.get("type") == "AwaitingBaseline" and c.get("status") == "True"
                for c in conditions
            ),
            ticket=spec.get("ticketRef"),
        )

    def _ticket(self, obj: JsonDict) -> TicketRecord:
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        status = obj.get("status") or {}
        external = spec.get("external") or {}
        history = [
            (self.rel(h.get("time")) or 0.0, str(h.get("phase", "")))
            for h in status.get("history") or []
        ]
        return TicketRecord(
            name=str(meta.get("name", "")),
            node=str(spec.get("nodeName", "")),
            phase=str(status.get("phase") or "Open"),
            cycle=int(status.get("cycle") or 1),
            resolution=spec.get("resolution"),
            external_id=external.get("id") if isinstance(external, dict) else None,
            evidence=tuple(str(e) for e in spec.get("evidence") or []),
            opened=self.rel(meta.get("creationTimestamp")) or 0.0,
            closed=self.rel(status.get("closedAt")),
            history=history,
        )

    def _baseline(self, items: list[JsonDict]) -> BaselineView | None:
        """The baseline the fleet's nodes take part in (they share one fingerprint)."""
        best: BaselineView | None = None
        for obj in items:
            spec, status = obj.get("spec") or {}, obj.get("status") or {}
            candidates = [
                c for c in status.get("candidates") or [] if c.get("nodeName") in self.nodes
            ]
            agreeing = [n for n in status.get("agreeingNodes") or [] if n in self.nodes]
            recorded = [n for n in spec.get("recordedFrom") or [] if n in self.nodes]
            if not (candidates or agreeing or recorded):
                continue
            view = BaselineView(
                name=str(obj.get("metadata", {}).get("name", "")),
                trusted=bool(spec.get("trusted")),
                agreeing=len(agreeing),
                candidates=len(candidates) + len(agreeing),
            )
            if best is None or view.candidates > best.candidates:
                best = view
        return best

    def _snapshot(self, snap: FleetSnapshot) -> None:
        self.probes_running = snap.probes_running
        self.probes_queued = snap.probes_queued
        t = self.now()
        for node in snap.nodes:
            self.activity[node.name] = node
            if node.activity != "probing":
                self.probing_since.pop(node.name, None)
            else:
                self.probing_since.setdefault(node.name, t)
            track = self.nodes.get(node.name)
            if track is not None:
                using = node.activity == "busy"
                open_stretch = bool(track.busy) and track.busy[-1][1] is None
                if using and not open_stretch:
                    track.busy.append([t, None])
                elif open_stretch and not using:
                    track.busy[-1][1] = t
            last = node.last_probe
            if last is not None and last.pod not in self.probes:
                self.probes[last.pod] = ProbeRun(
                    node=node.name,
                    pod=last.pod,
                    seconds=last.seconds,
                    outcome=last.outcome,
                    faults_injected=last.faults_injected,
                    finished=self.rel(last.finished_at) or self.now(),
                )

    def _sample_budgets(self, t: float) -> None:
        tests: dict[str, int] = dict.fromkeys(self.budgets, 0)
        for record in self.tests.values():
            track = self.nodes.get(record.node)
            # As the operator counts maxConcurrentTests: a test whose probe ended and that
            # only waits for a baseline's quorum runs nothing (its node still counts as
            # unavailable, below).
            if track is not None and not record.finished and not record.awaiting_baseline:
                tests[track.instance_type] += 1
        for pool, budget in self.budgets.items():
            members = [n for n in self.nodes.values() if n.instance_type == pool]
            held = sum(1 for n in members if n.held)
            screening = sum(1 for n in members if n.screening_held)
            budget.samples += 1
            budget.peak_tests = max(budget.peak_tests, tests[pool])
            budget.peak_held = max(budget.peak_held, held)
            budget.peak_screening_held = max(budget.peak_screening_held, screening)
            if tests[pool] > budget.max_tests:
                budget.test_violations.append((t, tests[pool]))
            if screening > budget.max_unavailable:
                budget.screening_violations.append((t, screening))

    # Reading ---------------------------------------------------------------------------
    def view(self) -> RecorderView:
        """A consistent copy for one display refresh or decision."""
        with self._lock:
            return RecorderView(
                t=self.now(),
                nodes={k: _copy_track(v) for k, v in self.nodes.items()},
                tests=dict(self.tests),
                tickets=dict(self.tickets),
                baseline=self.baseline,
                activity=dict(self.activity),
                probing_since=dict(self.probing_since),
                probes=list(self.probes.values()),
                probes_running=self.probes_running,
                probes_queued=self.probes_queued,
                transitions=list(self.transitions),
                rescreenings=len(self.reservations),
            )


def _copy_track(track: NodeTrack) -> NodeTrack:
    copy = NodeTrack(**{**track.__dict__})
    copy.states = list(track.states)
    copy.readiness = list(track.readiness)
    copy.busy = [list(b) for b in track.busy]
    return copy


@dataclass(frozen=True)
class RecorderView:
    """What the recorder knew at time ``t``."""

    t: float
    nodes: Mapping[str, NodeTrack]
    tests: Mapping[str, TestRecord]
    tickets: Mapping[str, TicketRecord]
    baseline: BaselineView | None
    activity: Mapping[str, NodeActivity]
    probing_since: Mapping[str, float]
    probes: list[ProbeRun]
    probes_running: int
    probes_queued: int
    transitions: list[Transition]
    rescreenings: int = 0
    """Serving nodes taken for a re-screening (reservations) so far."""

    def tests_of(self, node: str) -> list[TestRecord]:
        return sorted(
            (r for r in self.tests.values() if r.node == node), key=lambda r: (r.created, r.name)
        )

    def tickets_of(self, node: str) -> list[TicketRecord]:
        return sorted(
            (r for r in self.tickets.values() if r.node == node),
            key=lambda r: (r.opened, r.name),
        )

    def current_test(self, node: str) -> TestRecord | None:
        """The test the node waits for, else its newest unfinished one, else its newest."""
        track = self.nodes[node]
        if track.current_test and track.current_test in self.tests:
            return self.tests[track.current_test]
        tests = self.tests_of(node)
        running = [r for r in tests if not r.finished]
        chosen = running or tests
        return chosen[-1] if chosen else None

    def last_verdict(self, node: str) -> TestRecord | None:
        done = [r for r in self.tests_of(node) if r.finished]
        return max(done, key=lambda r: (r.completed or 0.0, r.name)) if done else None

    def open_ticket(self, node: str) -> TicketRecord | None:
        tickets = [r for r in self.tickets_of(node) if r.phase not in ("Closed", "Retired")]
        return tickets[-1] if tickets else None


def waiting_on(view: RecorderView, node: str, *, quorum: int, repair_delay: float) -> str:
    """What a node's next step waits for, in words."""
    track = view.nodes[node]
    if not track.exists:
        return "node deleted"
    if not track.ready:
        return "node NotReady (no kubelet heartbeat)"
    activity = view.activity.get(node)
    test = view.current_test(node)
    if test is not None and not test.finished:
        if test.phase in ("Pending", "Reserving"):
            return "a free test slot in its pool (budget)"
        if test.awaiting_baseline and track.real:
            return "approval of its own baseline (one node reaches no quorum)"
        if test.awaiting_baseline:
            agreeing = view.baseline.agreeing if view.baseline else 0
            return f"baseline quorum ({agreeing}/{quorum} nodes agree)"
        if activity is not None and activity.activity == "probe-queued":
            return f"a free probe slot ({view.probes_queued} queued)"
        if activity is not None and activity.activity == "probing":
            since = view.probing_since.get(node, view.t)
            return f"its probe, running for {max(0, int(view.t - since))}s"
        if test.phase == "Running" and track.real:
            return "its probe container (kubelet, containerd) and the termination message"
        if test.phase == "Running":
            return "the probe Pod to start" if activity is None else "the operator's verdict"
    state = track.state
    if state == JOINING:
        return "the operator to see the node"
    if state in ("Quarantined", "Repairing"):
        ticket = view.open_ticket(node)
        if ticket is None:
            return "a RepairTicket"
        if ticket.resolution:
            return f"verification of the repair ({ticket.resolution})"
        if track.real:
            return f"the demo's repair of {ticket.name} (probe as shipped, kubectl sdc repaired)"
        due = max(0, int(ticket.opened + repair_delay - view.t))
        return f"repair shop: {ticket.name} (done in ~{due}s)"
    if state == "Verifying":
        return "a repair verification test"
    if state in ("Unqualified", "Suspect"):
        if track.retry_after is not None:
            return "back-off after an inconclusive result"
        return "a test slot" if state == "Unqualified" else "a re-test"
    if state == "Qualified":
        if activity is not None and activity.activity == "busy":
            return "- (in customer use)"
        return "-"
    if state == "Retired":
        return "a person: out of repair cycles"
    return "-"


def pending_goals(
    view: RecorderView, *, allow_rescreening: bool, min_rescreenings: int = 0
) -> list[str]:
    """What still stands between now and the demo's end; empty when it is done.

    Done: every steadily faulty node has been quarantined, repaired, verified and is back
    Qualified; every ticket is Closed; every node is Qualified, with the end of every
    test it had before seen (or, with
    ``allow_rescreening``, being re-screened after customer use); and at least
    ``min_rescreenings`` serving nodes were taken for a re-screening after use.
    """
    pending: list[str] = []
    if view.rescreenings < min_rescreenings:
        pending.append(
            f"{min_rescreenings} re-screenings of nodes back from use ({view.rescreenings} so far)"
        )
    for track in view.nodes.values():
        steady = track.faulty and not track.intermittent
        if steady and track.first("Quarantined") is None:
            pending.append(f"{track.name} to be quarantined ({track.state})")
            continue
        if track.state == "Qualified":
            # The operator writes a test's end before the node's return, but the two
            # come through separate watches: a run that ended on the node's return
            # could keep the test Running in its record.
            since = track.states[-1][0] if track.states else 0.0
            unseen = [
                t.name for t in view.tests_of(track.name) if not t.finished and t.created <= since
            ]
            if unseen:
                pending.append(f"the end of {unseen[0]} to be seen ({track.name} Qualified)")
            continue
        test = view.current_test(track.name)
        rescreening = (
            track.state == "Testing"
            and track.qualified_at is not None
            and test is not None
            and test.reason in RESCREEN_REASONS
        )
        if allow_rescreening and rescreening:
            continue
        pending.append(f"{track.name} to be Qualified ({track.state})")
    for ticket in sorted(view.tickets.values(), key=lambda r: r.name):
        if ticket.phase != "Closed":
            pending.append(f"ticket {ticket.name} to close ({ticket.phase})")
    return pending


def summarize_events(api_client: client.ApiClient, nodes: Mapping[str, NodeTrack]) -> list[Any]:
    """sdcguard's Events on the fleet's Nodes (namespace default), oldest first."""
    uids = {t.uid for t in nodes.values() if t.uid}
    items = (
        Kube(api_client)
        .request(
            "GET",
            "/api/v1/namespaces/default/events",
            query={"fieldSelector": "involvedObject.kind=Node"},
        )
        .get("items")
        or []
    )
    events = []
    for e in items:
        obj = e.get("involvedObject") or {}
        if obj.get("uid") not in uids or (e.get("source") or {}).get("component") != "sdcguard":
            continue
        events.append(
            {
                "node": obj.get("name"),
                "reason": e.get("reason"),
                "type": e.get("type"),
                "message": e.get("message"),
                "time": e.get("lastTimestamp") or e.get("eventTime"),
            }
        )
    events.sort(key=lambda e: (str(e["time"]), str(e["node"])))
    return events
