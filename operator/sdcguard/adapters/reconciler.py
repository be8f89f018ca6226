"""One reconcile pass over a policy's nodes: observe, decide (pure), act.

The pass is level-triggered and idempotent. Everything it needs is in the
indexes (a :class:`FleetView`); every write goes through :class:`KubeWriter`.
Names of SDCTests, Jobs and RepairTickets are deterministic, so a pass that
runs twice (or after a restart) gets a 409 instead of a duplicate; node
patches carry the resourceVersion they were computed from, so a stale pass
gets a 409 instead of clobbering a newer state.

A pass also remembers which writes it made and skips a node until the watch
has delivered them (the "expectations" of controller-runtime), so two passes
in quick succession do not act twice on one observation.

The :class:`Reconciler` is composed of collaborators, each made once in its
constructor and handed the others it needs; each owns its own state, and none
inherits from another. What the passes remember, and who keeps it:

====================  =====================================================================
collaborator          its state (attributes), and what it is
====================  =====================================================================
Reconciler            ``_memory``: each policy's :class:`PolicyMemory` (its ``pools``
                      ledger, waits, states, conditions); ``_facts``: parsed node facts;
                      ``_told_overlap``: overlaps already told; ``last_counts``; ``_lock``
UrgentQueue           ``_offered``: work not yet served; ``touched``: nodes it decided
                      during the running pass; ``depth``; ``served``; ``served_at``
Expectations          ``nodes``, ``tests``: node patches and test statuses the watch has
                      not brought back yet
KnownTests            ``nodes``: each test's node; ``_noted``: the resourceVersion each
                      was read at; ``_sweeps``: breaker samples by policy;
                      ``_sample_owner``: which policy holds a test's sample
TestRunner            ``probe_pods_deleted``: tests whose probe Pod went before it ended
Executor              ``_told_forbidden``: nodes whose refused deletion was told
RepairTickets         ``_replaced``: tickets closed as Replaced; ``workloads``: the
                      workload records a new ticket's blast radius comes from
HardwareHistory       ``written``, ``failed``, ``due``: history notes settled, failed and
                      not yet old enough; ``recognised``: hardware counted once
NodeDeletePermission  ``_asked``: whether Nodes may be deleted, and when that was asked
LazyDeviceTaints      ``_made``: the DRA client, made at first use (scope Device only)
PolicyStatusReporter  nothing but its ``sender`` (a :class:`StatusSender`, or None)
RiskBook              ``history``: each hardware type's screenings and failures as of the
                      last full pass; ``reports``: the report admission's recent reports
NodePatchStage        nothing: writes plans' node-patch stage, notes Expectations
====================  =====================================================================

The settings, the metrics and the writer are handed to each collaborator that
needs them; a collaborator changes another's state only through its methods.
"""

from __future__ import annotations

import datetime as dt
import heapq
import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Set
from typing import Any

import structlog
import urllib3
from kubernetes.client.exceptions import ApiException

from sdcguard.adapters import hardware, observe
from sdcguard.adapters.executor import Executor
from sdcguard.adapters.history import HardwareHistory
from sdcguard.adapters.kube import KubeWriter
from sdcguard.adapters.node_writes import NodePatchStage
from sdcguard.adapters.observations import (
    current_test,
    idle_since,
    inherit_current,
    needed,
    queued_tests,
    seq_floor,
    unschedulable,
)
from sdcguard.adapters.pass_state import (
    _EPOCH,
    REQUEUE_MAX_SECONDS,
    STATUS_EVERY,
    Expectations,
    FleetView,
    KnownTest,
    KnownTests,
    LazyDeviceTaints,
    NodeDeletePermission,
    PolicyMemory,
    UrgentWork,
    _has_outcome,
)
from sdcguard.adapters.policy_release import PolicyRelease
from sdcguard.adapters.policy_status import PolicyStatusReporter, StatusSender
from sdcguard.adapters.recertification import Recertification
from sdcguard.adapters.risk_book import RiskBook, count_overtaken
from sdcguard.adapters.runtime_class import RuntimeClasses
from sdcguard.adapters.test_runner import TestRunner
from sdcguard.adapters.tickets import RepairTickets
from sdcguard.adapters.urgent import UrgentQueue
from sdcguard.adapters.workload_record import WorkloadBook
from sdcguard.api import (
    GROUP,
    Mode,
    NextNode,
    QuarantineScope,
    SDCPolicy,
    SDCPolicySpec,
    SDCTest,
    TicketPhase,
    accelerator_resources,
)
from sdcguard.domain import keys
from sdcguard.domain.decide import Decision
from sdcguard.domain.devicetaints import NodeDevices
from sdcguard.domain.echo import bounded
from sdcguard.domain.lifecycle import NodeState
from sdcguard.domain.observed import NodeFacts, NodeSnapshot, Observed, TestFacts, TicketFacts
from sdcguard.domain.scheduling import (
    BudgetOrder,
    RiskContext,
    budget_key,
    iter_decisions,
    member_after,
    rank,
)
from sdcguard.domain.selection import Selector, owning_policy, selects, specificity
from sdcguard.domain.topology import (
    Domain,
    DomainUsage,
    count_node,
    domains_of,
    topology_status,
)
from sdcguard.metrics import Metrics
from sdcguard.settings import Settings

log = structlog.get_logger("sdcguard.reconcile")

NEXT_NODES_SHOWN = 10
"""Nodes waiting for budget that the policy's status lists, first to last."""

__all__ = ["FleetView", "KnownTest", "PolicyMemory", "Reconciler", "UrgentWork"]


def _budget_order(
    memory: PolicyMemory,
    by_node: Mapping[str, Observed],
    risk: RiskContext,
    now: dt.datetime,
    decided: Set[str],
) -> list[NextNode]:
    """The first nodes waiting for budget in the order they get it, each with why.

    A node decided in this pass had its place worked out as its decision was applied
    (``memory.waiting``, the same context and clock); the others' places are worked
    out here. The order comes from those places, and only the first ten are ranked
    again for their reasons (a full ranking of every waiting node cost as much as the
    pass's own)."""
    places = {
        n: key if n in decided else budget_key(by_node[n], now, risk)
        for n, (key, _) in memory.waiting.items()
        if n in by_node
    }
    first = sorted(places, key=places.__getitem__)[:NEXT_NODES_SHOWN]
    return [
        NextNode(
            node=observed.node.name,
            basis=ranked.basis.value,
            chance=ranked.score.chance if ranked.score is not None else None,
            reason=bounded(ranked.reason, 512),
        )
        for observed, ranked in rank([by_node[n] for n in first], risk, now)
    ]


def _ticket_names(ticket: TicketFacts) -> tuple[str, ...]:
    """The ticket's name, or each device ticket's of a scope Device incident."""
    return tuple(m.name for m in ticket.members) or (ticket.name,)


class Reconciler:
    """Runs passes: observe, decide (pure), act, composed of the collaborators in the
    module docstring's table. Holds only caches that a restart may lose without harm."""

    def __init__(
        self,
        writer: KubeWriter,
        settings: Settings,
        metrics: Metrics,
        status_sender: StatusSender | None = None,
        workloads: WorkloadBook | None = None,
    ) -> None:
        self.writer = writer
        self.settings = settings
        self.metrics = metrics
        self.expectations = Expectations()
        self.known = KnownTests()
        node_patch = NodePatchStage(writer, self.expectations)
        self.device_taints = LazyDeviceTaints(writer)
        self.permission = NodeDeletePermission(writer)
        self.runtime_classes = RuntimeClasses(writer.api)
        self.runner = TestRunner(
            writer, settings, metrics, self.known, self.expectations, node_patch
        )
        self.history = HardwareHistory(writer, metrics, self.known, self.expectations)
        self.tickets = RepairTickets(writer, metrics, self.known, self.expectations, workloads)
        self.executor = Executor(
            writer,
            settings,
            metrics,
            known=self.known,
            expectations=self.expectations,
            runner=self.runner,
            history=self.history,
            permission=self.permission,
            node_patch=node_patch,
            tickets=self.tickets,
            device_taints=self.device_taints,
        )
        self.reporter = PolicyStatusReporter(
            writer, metrics, self.known, self.permission, status_sender
        )
        self.recertification = Recertification(node_patch, metrics)
        self.releaser = PolicyRelease(writer, self.runner, node_patch)
        self.deleted: set[str] = set()
        """The uids of policies whose deletion released their nodes: a pass of one (urgent
        work offered before it went) decides nothing."""
        self.risk = RiskBook(metrics)
        """The risk order's inputs (its report counts are wired at assembly)."""
        self.urgent = UrgentQueue()
        self.last_counts: Counter[str] = Counter()
        """What the last pass (not an urgent one) did, by kind."""
        self.served = threading.Event()
        """Set when a policy's first full pass has ended: work that can wait for the
        fleet to be served first (retention's first sweep) waits for it."""
        self._lock = threading.RLock()
        self._memory: dict[str, PolicyMemory] = {}
        self._facts: dict[str, tuple[tuple[Any, ...], NodeFacts]] = {}
        """Node name -> its facts, parsed once per resourceVersion and policy spec."""
        self._told_overlap: dict[str, tuple[str, tuple[str, ...]]] = {}
        """Overlaps already logged and told in an Event, by node."""

    @property
    def test_nodes(self) -> Mapping[str, str]:
        """SDCTest name -> node name, for events that name only the test."""
        return self.known.nodes

    @property
    def status_sender(self) -> StatusSender | None:
        return self.reporter.sender

    @property
    def workloads(self) -> WorkloadBook | None:
        return self.tickets.workloads

    @workloads.setter
    def workloads(self, book: WorkloadBook | None) -> None:
        self.tickets.workloads = book

    def run_pass(
        self,
        policy: SDCPolicy,
        view: FleetView,
        now: dt.datetime,
        dirty: Iterable[str] | None = None,
        since: int | None = None,
    ) -> float:
        """Reconcile the policy's nodes; returns seconds until the next look.

        ``dirty`` None: a full pass over every node the policy selects. Otherwise only
        the named nodes, the nodes whose requested time has come, and as many nodes
        waiting for budget as the pools may have room for; the rest of the fleet
        counts in the budgets as last seen.

        Passes of different policies run in one worker thread; they are serialized,
        since they share the write counter, the expectations and the caches (and a
        node may move between policies when selectors change). Urgent work offered
        while a pass runs is served between its steps.

        ``since``: the :meth:`mark` taken before ``view`` was copied; nodes that urgent
        work decided after it (while the view was being copied, in another thread) are
        left to that fresher decision, as are those decided while the pass runs.
        """
        with self._lock:
            self.urgent.begin_pass(since)
            scope = None if dirty is None else frozenset(dirty)
            self._serve_urgent()
            try:
                return self._run_pass(policy, view, now, scope, fill=True)
            finally:
                self._serve_urgent()
                self.urgent.end_pass()

    def release_policy(
        self,
        name: str,
        uid: str,
        selector: Selector | None,
        others: Mapping[str, Selector],
        nodes: Iterable[NodeSnapshot],
        tests: Iterable[SDCTest],
        now: dt.datetime,
    ) -> Counter[str]:
        """A deleted policy's tests end and its nodes are released or handed over
        (``adapters/policy_release.py``), between passes; no later pass of it acts.
        ``selector`` None: its spec is unreadable, so no node is known to be its own."""
        with self._lock:
            if uid:
                self.deleted.add(uid)
            self._memory.pop(name, None)
            # A status we wrote that the copy does not show yet (a verdict) is the truth.
            settled = [self.expectations.settle_test(t) for t in tests]
            return self.releaser.release(name, selector, others, nodes, settled, now)

    def mark(self) -> int:
        """Where urgent work stands now: take it before copying a pass's view."""
        return self.urgent.mark()

    def served_since(self, mark: int) -> set[str]:
        """The nodes urgent work decided after ``mark``."""
        with self._lock:
            return self.urgent.served_since(mark)

    def offer_urgent(self, work: UrgentWork) -> None:
        """Hand nodes whose probe ended to the running pass (thread-safe)."""
        self.urgent.offer(work)

    def serve_offered(self) -> None:
        """Serve the urgent work offered so far, with no pass around it (the policy loop
        before the workload Pods have listed: probe ends only)."""
        with self._lock:
            self.urgent.begin_pass(None)
            try:
                self._serve_urgent()
            finally:
                self.urgent.end_pass()

    def due_nodes(self, policy: str, now: dt.datetime) -> set[str]:
        """The policy's nodes whose decision asked to be looked at again by ``now`` (a
        failed write, a wait); call it from the pass's thread."""
        memory = self._memory.get(policy)
        return {n for n, when in memory.due.items() if when <= now} if memory else set()

    def take_unserved(self) -> list[UrgentWork]:
        """Urgent work the last pass did not get to (offered as it ended)."""
        return self.urgent.take()

    def _serve_urgent(self) -> None:
        """Serve the urgent work offered so far, each in a pass of its own nodes."""
        self.urgent.serve(
            lambda work, nodes: self._run_pass(work.policy, work.view, work.now, nodes, fill=False)
        )

    def _skip(self, node: str) -> bool:
        return self.urgent.skip(node)

    def _node_facts(self, snapshot: NodeSnapshot, spec: Any) -> NodeFacts:
        key = (
            snapshot.resource_version,
            tuple(spec.accelerators),
            spec.budgets.pool_label,
            snapshot.dra_devices,
            spec.dra_classes,
        )
        cached = self._facts.get(snapshot.name)
        if cached is not None and cached[0] == key and key[0]:
            return cached[1]
        node = NodeFacts.from_snapshot(
            snapshot, spec.accelerators, spec.budgets.pool_label, spec.dra_classes
        )
        self._facts[snapshot.name] = (key, node)
        return node

    def _prune(self, view: FleetView) -> None:
        """Drop the caches of objects the view no longer has (full passes only)."""
        self.known.prune(view)
        self.tickets.prune(view)
        for name in [n for n in self._facts if n not in view.nodes]:
            del self._facts[name]

    def _scope(
        self,
        memory: PolicyMemory,
        policy_name: str,
        spec: Any,
        view: FleetView,
        selectors: dict[str, Selector],
        wanted: Iterable[str],
    ) -> dict[str, NodeFacts]:
        """Facts of the wanted nodes this policy owns; forgets the others."""
        facts: dict[str, NodeFacts] = {}
        for count, node_name in enumerate(wanted):
            if count % 256 == 255:
                self._serve_urgent()
            body = view.nodes.get(node_name)
            if body is None:
                memory.forget(node_name)
                continue
            labels = body.labels
            claims = {p: specificity(s) for p, s in selectors.items() if selects(s, labels)}
            owner = owning_policy(labels, selectors)
            if owner != policy_name:
                memory.forget(node_name)
            if len(claims) > 1 and policy_name in claims and owner is not None:
                self._note_overlap(memory, policy_name, node_name, owner, claims, body)
            else:
                memory.overlaps.pop(node_name, None)
            if owner != policy_name:
                continue
            node = self._node_facts(body, spec)
            if node.accelerators <= 0 and node.state is None:
                memory.forget(node_name)
                continue  # not an accelerator node, and never one of ours
            facts[node_name] = node
        return facts

    def _note_overlap(
        self,
        memory: PolicyMemory,
        policy_name: str,
        node_name: str,
        owner: str,
        claims: Mapping[str, int],
        body: NodeSnapshot,
    ) -> None:
        """Several policies select the node: remember it for both policies' PolicyOverlap
        condition; the owner's pass logs it and tells it in one Event on the Node."""
        overlap = (owner, tuple(sorted(claims)))
        memory.overlaps[node_name] = overlap
        if owner != policy_name or self._told_overlap.get(node_name) == overlap:
            return
        self._told_overlap[node_name] = overlap
        tie = sorted(p for p, size in claims.items() if size == claims[owner])
        rule = (
            "equally specific selectors: the name that sorts first wins"
            if len(tie) > 1
            else "the most specific selector wins"
        )
        others = [p for p in overlap[1] if p != owner]
        log.warning("policies overlap", node=node_name, owner=owner, also=others, rule=rule)
        self.writer.event(
            kind="Node",
            name=node_name,
            uid=body.uid or None,
            reason="PolicyOverlap",
            message=bounded(
                f"{node_name} is selected by policies {', '.join(overlap[1])}; {owner} owns it "
                f"({rule}); make the selectors disjoint"
            ),
            now=dt.datetime.now(dt.UTC),
            warning=True,
        )

    def _fill(self, memory: PolicyMemory, spec: Any, facts: dict[str, NodeFacts]) -> list[str]:
        """Nodes waiting for budget that may fit now, best first (a targeted pass
        decides them too, so a finished test's slot is used at once)."""
        if not memory.waiting:
            return []
        limit = spec.budgets.max_concurrent_tests
        free: Counter[str] = Counter()
        for pool, usage in memory.pools.usage_without(facts).items():
            free[pool] = limit - usage.tests
        for _, pool in memory.waiting.values():
            free.setdefault(pool, limit)
        picked: list[str] = []
        candidates = heapq.nsmallest(
            max(0, sum(max(0, v) for v in free.values())) + len(facts),
            ((key, node, pool) for node, (key, pool) in memory.waiting.items()),
        )
        for _, node, pool in candidates:
            if node in facts or free[pool] <= 0:
                continue
            free[pool] -= 1
            picked.append(node)
        return picked

    def _run_pass(
        self,
        policy: SDCPolicy,
        view: FleetView,
        now: dt.datetime,
        scope: frozenset[str] | None,
        *,
        fill: bool,
    ) -> float:
        if policy.metadata.uid and policy.metadata.uid in self.deleted:
            return REQUEUE_MAX_SECONDS  # released: nothing of it acts again
        counts: Counter[str] = Counter()
        writes_before = Counter(self.writer.writes)
        name = policy.metadata.name
        spec = policy.spec
        full = scope is None
        memory = self._memory.setdefault(name, PolicyMemory())
        if fill:  # the policy's own loop: urgent work may carry an older copy of it
            self._note_mode(policy, memory, now)
        if full:
            self._prune(view)

        selectors: dict[str, Selector] = {**view.policies, name: spec.node_selector}
        if scope is None:
            wanted: list[str] = list(view.nodes)
        elif not view.complete:
            wanted = sorted(scope)  # a partial view holds these nodes and no others
        else:
            due = {n for n, when in memory.due.items() if when <= now}
            wanted = sorted(scope | due)
        facts = self._scope(memory, name, spec, view, selectors, wanted)
        # Tests whose node is gone are settled by whichever pass looks at the node.
        vanished = {n for n in wanted if n not in view.nodes}
        if full:
            for gone in [n for n in {*memory.states, *memory.pools.members} if n not in facts]:
                memory.forget(gone)
        elif fill and view.complete:
            more = self._fill(memory, spec, facts)
            facts.update(self._scope(memory, name, spec, view, selectors, more))
        counts["nodes-decided"] = len(facts)
        deleted = [n for n in view.tickets if n not in view.nodes] if full else sorted(vanished)
        for node_name in deleted:
            self.tickets.close_node_gone(policy, view, node_name, now, counts)

        tests_by_node = self._advance_tests(policy, view, facts, vanished, full, now, counts)
        breaker, breaker_status = self.reporter.breaker(policy, now)

        observations = self._observe(
            spec, memory, view, facts, tests_by_node, breaker.open, now, counts
        )
        holding = frozenset({spec.taints.testing, spec.taints.quarantine})
        serve = self._serve_urgent
        others = memory.pools.usage_without((o.node.name for o in observations), serve)
        by_node = {o.node.name: o for o in observations}
        if full:
            self.risk.refresh(view)
        risk = self.risk.context(view, memory, by_node)
        decisions: list[Decision] = []
        other_domains = (
            self._domain_usage(spec, memory, view, by_node) if spec.budgets.topology else None
        )
        order = BudgetOrder.of(observations, now, risk)
        decided = iter_decisions(
            observations,
            spec,
            now,
            others,
            between=serve,
            other_domains=other_domains,
            risk=risk,
            order=order,
        )
        for count, decision in enumerate(decided):
            if count % 256 == 255:
                self._serve_urgent()
            decisions.append(decision)
        illegal_before = dict(memory.illegal)
        for decision in decisions:
            self._note_illegal(name, memory, decision)
        wake = self._act(
            policy, memory, view, decisions, by_node, tests_by_node, holding, now, counts, order
        )
        count_overtaken(memory, decisions, by_node)
        if full:
            memory.budget_order = _budget_order(
                memory, by_node, risk, now, {d.node for d in decisions}
            )
        if not full and memory.due:
            soonest = min(memory.due.values())
            wake = min(wake, max(0.0, (soonest - now).total_seconds()))

        states = Counter(memory.states.values())
        self.recertification.mark(policy, memory, view, facts, now, counts)
        # The topology budgets' domains, counted on full passes (a walk of the policy's
        # nodes, only when the policy has topology budgets).
        topology = (
            topology_status(self._domain_usage(spec, memory, view), spec.budgets.topology)
            if full
            else None
        )
        if (
            full
            or memory.illegal != illegal_before
            or self.reporter.due(memory, policy, breaker, breaker_status, now)
        ):
            held = sorted(memory.held)[:1000]
            breaker_status = breaker_status.model_copy(
                update={
                    "held_nodes": held,
                    "samples": self.reporter.breaker_samples(policy, breaker_status, now),
                }
            )
            self.reporter.write(
                policy,
                breaker,
                breaker_status,
                states,
                now,
                memory.illegal,
                memory.overlaps,
                capacity=self.recertification.capacity(policy, memory, tests_by_node)
                if full
                else None,
                topology=topology,
                budget_order=memory.budget_order,
            )
            memory.status_at = now
        elif memory.status_at is not None:
            # Held back by the interval: come back for it even if nothing else happens.
            left = STATUS_EVERY - (now - memory.status_at)
            wake = min(wake, max(0.0, left.total_seconds()))
        if full or memory.status_at is not None:  # counts of the whole fleet only
            self.reporter.export_nodes(name, states, breaker)
        if full:
            self.reporter.export_usage(name, memory.pools.usage, view, now)
            self.reporter.export_topology(name, topology or ())
        kind = "full" if full else ("urgent" if not fill else "targeted")
        self.metrics.reconcile_passes.labels(policy=name, kind=kind).inc()
        writes = Counter(self.writer.writes)
        writes.subtract(writes_before)
        counts.update({f"writes-{k}": v for k, v in writes.items() if v})
        log.info(
            "reconcile pass",
            policy=name,
            kind=kind,
            nodes=len(memory.states),
            **dict(sorted(counts.items())),
        )
        if not self.urgent.depth:
            self.last_counts = counts
        if full:
            self.served.set()
        return wake

    @staticmethod
    def _domain_usage(
        spec: SDCPolicySpec,
        memory: PolicyMemory,
        view: FleetView,
        skip: Mapping[str, object] | None = None,
    ) -> dict[Domain, DomainUsage]:
        """Usage by topology domain of the policy's nodes as last decided, but ``skip``."""
        budgets = spec.budgets.topology
        usage: dict[Domain, DomainUsage] = {}
        if not budgets:
            return usage
        for node, member in memory.pools.members.items():
            snap = view.nodes.get(node)
            if snap is None or (skip is not None and node in skip):
                continue
            count_node(usage, domains_of(snap.labels, budgets), member.held)
        return usage

    def _advance_tests(
        self,
        policy: SDCPolicy,
        view: FleetView,
        facts: Mapping[str, NodeFacts],
        vanished: set[str],
        full: bool,
        now: dt.datetime,
        counts: Counter[str],
    ) -> dict[str, list[KnownTest]]:
        """Move the policy's unfinished tests along, first: their outcome is what the
        node decisions read; returns the tests by node."""
        name = policy.metadata.name
        # A full pass
        # reads every test (and so refreshes the breaker's samples); a targeted one
        # only the decided nodes' tests.
        tests_by_node: dict[str, list[KnownTest]] = {}
        looked = view.tests.keys() if full else [n for n in (*facts, *vanished) if n in view.tests]
        for count, node_name in enumerate(looked):
            if count % 256 == 255:
                self._serve_urgent()
            for body in view.tests[node_name]:
                known = self.known.read(body, node_name)
                if known is None or known.policy != name:
                    continue
                moving = full or node_name in facts or node_name in vanished
                if known.running is not None and moving:
                    test = self._advance_guarded(
                        policy, known.running, node_name, view, facts, now, counts
                    )
                    if test is not known.running:
                        known = KnownTest.of(test)
                        self.known.note_sample(test.metadata.name, node_name, known)
                tests_by_node.setdefault(node_name, []).append(known)

        return tests_by_node

    def _observe(
        self,
        spec: SDCPolicySpec,
        memory: PolicyMemory,
        view: FleetView,
        facts: Mapping[str, NodeFacts],
        tests_by_node: Mapping[str, list[KnownTest]],
        breaker_open: bool,
        now: dt.datetime,
        counts: Counter[str],
    ) -> list[Observed]:
        """What ``decide`` reads about each node to decide (observation assembly); skips
        nodes whose last write has not come back through the watch."""
        observations: list[Observed] = []
        runtime_missing = bool(facts) and self.runtime_classes.missing(
            spec.probe.runtime_class_name, now
        )
        for count, (node_name, node) in enumerate(facts.items()):
            if count % 256 == 255:
                self._serve_urgent()
            if self._skip(node_name):
                continue
            if self.expectations.node_pending(node_name, view.nodes[node_name].resource_version):
                counts["nodes-awaiting-watch"] += 1
                # Our last write has not come back through the watch yet; its event
                # brings the node back, and if it never comes, this look does.
                memory.due[node_name] = now + dt.timedelta(seconds=5)
                continue
            self.tickets.restore_status(
                view.tickets.get(node_name, []),
                now,
                counts,
                retired=node.state == NodeState.RETIRED,
            )
            self.history.restore(view, view.nodes[node_name], now, counts)
            tests = inherit_current(node, tests_by_node.get(node_name, []), view)
            node = seq_floor(node, tests, view)
            test = current_test(node, tests)
            if not view.workloads_known and (test is None or not test.finished):
                # Without every workload Pod listed, a node missing from the copy would
                # look idle: only a finished test's outcome (release, confirmation,
                # quarantine) is decided, and the rest waits for the complete copy.
                counts["nodes-awaiting-pods"] += 1
                continue
            ticket = self._open_ticket(view.tickets.get(node_name, []))
            # The policy's accelerators, with a MIG node's profiles (spec.accelerators).
            accelerators = accelerator_resources(
                spec.accelerators, view.nodes[node_name].allocatable
            )
            if keys.DRAIN_UNTIL not in node.annotations:
                self.executor.drained.discard(node_name)  # the drain ended
            observations.append(
                Observed(
                    node=node,
                    test=test,
                    queued=queued_tests(test, tests),
                    probe_unschedulable=unschedulable(test, view),
                    ticket=ticket,
                    devices=self._devices(spec, node_name, test, ticket),
                    idle_since=idle_since(node_name, accelerators, view),
                    pending_pod_needs_node=needed(
                        node_name, list(accelerators), view, spec.taints.testing
                    ),
                    breaker_open=breaker_open,
                    enforced_since=memory.enforced_since,
                    drain_asked=node_name in self.executor.drained,
                    runtime_class_missing=runtime_missing,
                    joined_after_start=(
                        node.created is not None
                        and view.operator_started is not None
                        and node.created > view.operator_started
                    ),
                    hardware=hardware.facts(
                        view.nodes[node_name],
                        view.id_holders,
                        view.hardware,
                        spec.repair.repair_cycle_window,
                        now,
                        hardware.latest_devices(
                            (k.created, k.facts) for k in tests_by_node.get(node_name, [])
                        )
                        if view.hardware
                        else (),
                    ),
                )
            )

        return observations

    def _devices(
        self, spec: SDCPolicySpec, node: str, test: TestFacts | None, ticket: TicketFacts | None
    ) -> NodeDevices | None:
        """The node's ResourceSlice devices, read only where a quarantine of scope Device
        may be opened now (a finished test with failed checks and no open ticket); None
        otherwise, or when they cannot be read (the quarantine then takes the node)."""
        if spec.quarantine.scope != QuarantineScope.DEVICE or ticket is not None:
            return None
        if test is None or not test.finished or not test.failed_checks:
            return None
        try:
            return self.device_taints.get().node_devices(node)
        except (ApiException, urllib3.exceptions.HTTPError) as exc:
            log.warning(
                "resource slices not read; a quarantine takes the node",
                node=node,
                error=bounded(str(exc), 512),
            )
            return None

    def _act(
        self,
        policy: SDCPolicy,
        memory: PolicyMemory,
        view: FleetView,
        decisions: list[Decision],
        by_node: Mapping[str, Observed],
        tests_by_node: Mapping[str, list[KnownTest]],
        holding: frozenset[str],
        now: dt.datetime,
        counts: Counter[str],
        order: BudgetOrder,
    ) -> float:
        """Apply the decisions and remember what they leave; returns seconds until the
        next look a decision asked for (``order``: the pass's, for the places of the
        nodes that wait for budget)."""
        wake = REQUEUE_MAX_SECONDS
        # Budgets are granted in priority order; writes go out with the outcomes of
        # finished tests first (a release or quarantine never waits behind new starts).
        decisions.sort(key=lambda d: not _has_outcome(by_node[d.node]))
        for count, decision in enumerate(decisions):
            node_name = decision.node
            if count % 256 == 255:
                # Most decisions of a full pass change nothing and write nothing; a
                # probe's end must not wait for thousands of them.
                self._serve_urgent()
            if self._skip(node_name):
                continue  # urgent work decided it from fresher facts: its memory stands
            observed = by_node[node_name]
            member = observed.pool_member(holding)
            if decision.actions and self.executor.refused_delete(policy, decision, view, now):
                counts["node-delete-forbidden"] += 1
                memory.states[node_name] = (decision.previous or decision.state).value
                memory.due[node_name] = now + dt.timedelta(minutes=5)
                wake = min(wake, 300.0)
                continue
            if decision.actions:
                self._serve_urgent()
                if self._skip(node_name):
                    continue
                if self._apply_guarded(policy, decision, view, now, counts):
                    # Written: the pool counts the node as the decision left it, before
                    # its watch event comes back (a quarantine holds it at once).
                    member = member_after(member, decision)
                else:
                    memory.due[node_name] = now + dt.timedelta(seconds=1)
                    wake = min(wake, 1.0)
                    memory.pools.set_member(node_name, member)
                    continue
            memory.pools.set_member(node_name, member)
            memory.states[node_name] = decision.state.value
            if observed.ticket is not None:
                for name in _ticket_names(observed.ticket):
                    self.tickets.waiting(view, node_name, name, decision.wait, now)
            for known in tests_by_node.get(node_name, []):
                if known.running is not None:
                    self.executor.test_waiting(known.running, decision, now)
            if decision.held:
                memory.held.add(node_name)
            else:
                memory.held.discard(node_name)
            if decision.waits_for_budget:
                memory.waiting[node_name] = (order.places[node_name], observed.node.pool)
            else:
                memory.waiting.pop(node_name, None)
            if decision.requeue_after is not None:
                memory.due[node_name] = now + dt.timedelta(seconds=decision.requeue_after)
                wake = min(wake, decision.requeue_after)
            else:
                memory.due.pop(node_name, None)
            history = self.history.take_due(node_name)
            if history is not None:
                # Back when the history note is old enough to tell whether it was written.
                memory.due[node_name] = min(memory.due.get(node_name, history), history)
                wake = min(wake, max((history - now).total_seconds(), 1.0))
        return wake

    def _note_mode(self, policy: SDCPolicy, memory: PolicyMemory, now: dt.datetime) -> None:
        """A switch from Observe to Enforce gates every node not yet qualified: remember
        when (a back-off from Observe no longer holds those nodes) and say it in an Event
        that names the command screening one now."""
        mode = policy.spec.mode
        if memory.mode == Mode.OBSERVE.value and mode == Mode.ENFORCE:
            memory.enforced_since = now
            waiting = sorted(
                n
                for n, s in memory.states.items()
                if s in (NodeState.UNQUALIFIED.value, NodeState.TESTING.value)
            )
            shown = ", ".join(waiting[:10]) + (" ..." if len(waiting) > 10 else "")
            nodes = f"{len(waiting)} unqualified or under test: {shown}" if waiting else "none now"
            self.writer.event(
                kind="SDCPolicy",
                name=policy.metadata.name,
                uid=policy.metadata.uid or None,
                reason="EnforceStarted",
                message=bounded(
                    f"mode Enforce: a node not yet qualified is gated until it passes "
                    f"({nodes}); each is screened as soon as the budgets allow (a back-off "
                    "from Observe is waived); kubectl sdc test NODE screens one now"
                ),
                now=now,
                api_version=f"{GROUP}/v1alpha1",
            )
            log.info("mode switched to Enforce", policy=policy.metadata.name, gated=len(waiting))
        elif mode == Mode.OBSERVE:
            memory.enforced_since = None
        memory.mode = mode.value

    def _note_illegal(self, policy: str, memory: PolicyMemory, decision: Decision) -> None:
        """A node whose event has no row costs only that node: counted, logged with the
        node, kept for the policy's IllegalTransition condition until it decides cleanly."""
        exc = decision.illegal
        if exc is None:
            memory.illegal.pop(decision.node, None)
            return
        self.metrics.illegal_transitions.labels(
            from_state=exc.state.value, event=exc.event.value
        ).inc()
        log.error(
            "illegal transition; node left as it is",
            policy=policy,
            node=decision.node,
            state=exc.state.value,
            trigger=exc.event.value,
        )
        memory.illegal[decision.node] = f"{exc.state.value} on {exc.event.value}"

    def _advance_guarded(
        self,
        policy: SDCPolicy,
        test: SDCTest,
        node_name: str,
        view: FleetView,
        facts: Mapping[str, NodeFacts],
        now: dt.datetime,
        counts: Counter[str],
    ) -> SDCTest:
        """Advance one test; a failed request costs this test only (the next pass tries
        again). While our last status write has not come back through the watch, go on
        from the test as we wrote it, never from the older copy (that would act twice)."""
        test = self.expectations.settle_test(test)
        self._serve_urgent()
        if self._skip(node_name):
            return test
        try:
            return self.runner.advance_test(
                policy, test, facts.get(node_name), view.nodes.get(node_name), view, now, counts
            )
        except Exception as exc:  # ApiException, a dropped connection, a timeout
            counts["test-errors"] += 1
            log.warning(
                "advancing a test failed; retrying",
                test=test.metadata.name,
                node=node_name,
                error=f"{type(exc).__name__}: {str(exc)[:200]}",
            )
            return test

    def _apply_guarded(
        self,
        policy: SDCPolicy,
        decision: Decision,
        view: FleetView,
        now: dt.datetime,
        counts: Counter[str],
    ) -> bool:
        """Apply one decision; False when a request failed (the next pass decides again
        from fresh observations: 409 means our view was stale, anything else that the
        API hiccupped)."""
        try:
            self.executor.apply(policy, decision, view, now, counts)
        except ApiException as exc:
            counts[f"apply-error-{exc.status}"] += 1
            log.warning(
                "applying a decision failed; retrying",
                node=decision.node,
                status=exc.status,
                reason=exc.reason,
            )
            return False
        except Exception as exc:  # a dropped connection, a timeout: same remedy
            counts["apply-error-other"] += 1
            log.warning(
                "applying a decision failed; retrying",
                node=decision.node,
                error=f"{type(exc).__name__}: {str(exc)[:200]}",
            )
            return False
        return True

    def _open_ticket(self, seen: list[observe.TicketSnapshot]) -> TicketFacts | None:
        tickets = []
        for snapshot in seen:
            ticket = snapshot.ticket
            if ticket is None:
                continue
            phase = ticket.status.phase if ticket.status else TicketPhase.OPEN
            if phase != TicketPhase.CLOSED:
                tickets.append(ticket)
        if not tickets:
            return None
        newest = max(
            tickets, key=lambda t: (t.metadata.creation_timestamp or _EPOCH, t.metadata.name)
        )
        facts = TicketFacts.from_api(newest)
        if not facts.devices:
            return facts
        # Scope Device: one ticket per device, all of one incident (a node has one open
        # quarantine at a time); the node is decided on all of them together.
        return TicketFacts.incident(
            [f for f in map(TicketFacts.from_api, tickets) if f.devices] or [facts]
        )
