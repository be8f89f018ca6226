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
"""

from __future__ import annotations

import datetime as dt
import heapq
import queue
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import structlog
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from sdcguard.adapters import observe
from sdcguard.adapters.kube import KubeWriter
from sdcguard.api import (
    BreakerStatus,
    CheckSpec,
    Finding,
    Mode,
    NodeCounts,
    RepairTicket,
    Resolution,
    SDCBaseline,
    SDCBaselineSpec,
    SDCPolicy,
    SDCPolicyStatus,
    SDCTest,
    SDCTestPhase,
    SDCTestStatus,
    TicketPhase,
    Verdict,
    baseline_name,
    set_condition,
    to_body,
)
from sdcguard.builders.probe_job import ProbeJobRequest, build_probe_job, job_name
from sdcguard.domain import baselines, keys
from sdcguard.domain import breaker as breaker_mod
from sdcguard.domain.budgets import PoolMember, PoolUsage, add_member, pool_usage
from sdcguard.domain.decide import Decision, closes_as_replaced, iter_decisions, priority
from sdcguard.domain.judging import Judgement, PodEnd, judge_result
from sdcguard.domain.lifecycle import (
    CancelTest,
    CloseTicket,
    CreateTest,
    CreateTicket,
    DeleteNode,
    Drain,
    EmitEvent,
    NodeState,
    RaiseCycle,
    Retire,
    SetTicketPhase,
)
from sdcguard.domain.nodepatch import NodePatch, plan_node_patch
from sdcguard.domain.observed import NodeFacts, Observed, TestFacts, TicketFacts
from sdcguard.domain.selection import owning_policy
from sdcguard.domain.testphase import (
    CreateJob,
    MarkAwaitingBaseline,
    TestEvent,
    WriteStatus,
    phase_event,
    phase_transition,
    verdict_phase,
)
from sdcguard.metrics import Metrics
from sdcguard.settings import Settings

log = structlog.get_logger("sdcguard.reconcile")

AWAITING_BASELINE_REASONS = ("BaselineAbsent", "NoTrustedBaseline", "BaselinePending")
PROBE_VANISHED_GRACE = dt.timedelta(seconds=120)
REQUEUE_MAX_SECONDS = 3600.0
STATUS_EVERY = dt.timedelta(seconds=5)
TICKET_STATUS_GRACE = dt.timedelta(seconds=30)
"""A new ticket's own status write lands well within this; after it, one is missing."""
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
T = TypeVar("T")


def probe_timeout(checks: Iterable[CheckSpec], active_deadline: int) -> int:
    """The probe's hard limit for its workers: the suite's per-check timeouts added up,
    within the Job's deadline (less a margin to report the result)."""
    return max(10, min(sum(c.timeout_seconds for c in checks), active_deadline - 30))


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _has_outcome(observed: Observed) -> bool:
    """The node's current test has finished: its decision releases, quarantines or
    re-runs, and is applied before any new start."""
    return observed.test is not None and observed.test.finished


@dataclass
class FleetView:
    """A consistent copy of the indexes for one pass."""

    nodes: dict[str, dict[str, Any]]
    busy: dict[str, list[observe.PodUse]] = field(default_factory=dict)
    pending: list[observe.PendingDemand] = field(default_factory=list)
    probe_pods: dict[str, list[observe.ProbePod]] = field(default_factory=dict)
    probe_jobs: dict[str, observe.ProbeJob] = field(default_factory=dict)
    tests: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    tickets: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    baselines: dict[str, dict[str, Any]] = field(default_factory=dict)
    last_busy: dict[str, dt.datetime] = field(default_factory=dict)
    operator_started: dt.datetime | None = None
    policies: dict[str, dict[str, str]] = field(default_factory=dict)
    """Every policy's name and selector matchLabels (one policy owns each node)."""
    complete: bool = True
    """False: only some nodes' entries (urgent work), enough to decide just those."""

    def merged(self, newer: FleetView) -> FleetView:
        """This partial view updated with a newer one (urgent work offered in a row)."""
        return FleetView(
            nodes={**self.nodes, **newer.nodes},
            busy={**self.busy, **newer.busy},
            pending=newer.pending,
            probe_pods={**self.probe_pods, **newer.probe_pods},
            probe_jobs={**self.probe_jobs, **newer.probe_jobs},
            tests={**self.tests, **newer.tests},
            tickets={**self.tickets, **newer.tickets},
            baselines=newer.baselines,
            last_busy=newer.last_busy,
            operator_started=newer.operator_started,
            policies=newer.policies,
            complete=self.complete and newer.complete,
        )


def _rv(body: Mapping[str, Any]) -> str:
    return str((body.get("metadata") or {}).get("resourceVersion", ""))


@dataclass
class PolicyMemory:
    """What earlier passes learned about one policy's nodes, so that a pass can decide
    only the nodes whose observations changed (or whose time came) and still keep the
    pool budgets over all of them. Losing it costs one full pass, nothing else."""

    members: dict[str, PoolMember] = field(default_factory=dict)
    """Every owned node's share of its pool's usage, as last decided."""
    waiting: dict[str, tuple[tuple[int, dt.datetime, str], str]] = field(default_factory=dict)
    """Nodes with a test due but no budget: node -> (priority, pool)."""
    due: dict[str, dt.datetime] = field(default_factory=dict)
    """When each node asked to be decided again."""
    states: dict[str, str] = field(default_factory=dict)
    usage: dict[str, PoolUsage] = field(default_factory=dict)
    """``members`` summed by pool, kept up to date with them."""
    breaker: tuple[Any, ...] | None = None
    """The last breaker computed, with what it was computed from (see _breaker)."""
    status_at: dt.datetime | None = None
    """When the policy's status was last brought up to date."""
    illegal: dict[str, str] = field(default_factory=dict)
    """Nodes whose last decision hit a (state, event) pair outside the table."""
    held: set[str] = field(default_factory=set)
    """Nodes whose confirmed failure the open breaker holds."""

    def set_member(self, node: str, member: PoolMember) -> None:
        old = self.members.get(node)
        if old is not None:
            add_member(self.usage, old, -1)
        self.members[node] = member
        add_member(self.usage, member)

    def usage_without(self, nodes: Iterable[str]) -> dict[str, PoolUsage]:
        """Pool usage of every node but ``nodes``."""
        usage = dict(self.usage)
        for node in nodes:
            member = self.members.get(node)
            if member is not None:
                add_member(usage, member, -1)
        return usage

    def forget(self, node: str) -> None:
        member = self.members.pop(node, None)
        if member is not None:
            add_member(self.usage, member, -1)
        for table in (self.waiting, self.due, self.states, self.illegal):
            table.pop(node, None)
        self.held.discard(node)


@dataclass(frozen=True)
class KnownTest:
    """What a pass keeps of an SDCTest: the whole object while it runs (it is moved
    along), only its facts once finished (thousands of those stay in memory)."""

    name: str
    policy: str
    created: dt.datetime
    facts: TestFacts
    running: SDCTest | None

    @property
    def finished(self) -> bool:
        return self.facts.finished

    @classmethod
    def of(cls, test: SDCTest) -> KnownTest:
        facts = TestFacts.from_api(test)
        return cls(
            name=test.metadata.name,
            policy=test.spec.policy_ref,
            created=test.metadata.creation_timestamp or _EPOCH,
            facts=facts,
            running=None if facts.finished else test,
        )


@dataclass(frozen=True)
class UrgentWork:
    """Nodes whose probe just ended, with the view they were seen in: served between
    the steps of a longer pass, so a finished test never waits behind one."""

    policy: Mapping[str, Any]
    view: FleetView
    nodes: frozenset[str]


@dataclass
class Reconciler:
    """Runs passes; holds only caches that a restart may lose without harm."""

    writer: KubeWriter
    settings: Settings
    metrics: Metrics
    # name -> resourceVersion the object had when we last wrote it; skip until it moves.
    expect_nodes: dict[str, str] = field(default_factory=dict)
    expect_tests: dict[str, tuple[str, SDCTest]] = field(default_factory=dict)
    """SDCTest name -> (resourceVersion before our status write, the test as written):
    until the watch brings the write back, a pass goes on from what we wrote."""
    last_counts: Counter[str] = field(default_factory=Counter)
    test_nodes: dict[str, str] = field(default_factory=dict)
    """SDCTest name -> node name, for events that name only the test."""
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _memory: dict[str, PolicyMemory] = field(default_factory=dict)
    # Parsed objects by name, with the resourceVersion they were parsed at: a pass
    # parses only what changed since the last one.
    _tests: dict[str, tuple[str, KnownTest | None]] = field(default_factory=dict)
    _tickets: dict[str, tuple[str, RepairTicket | None]] = field(default_factory=dict)
    _facts: dict[str, tuple[tuple[Any, ...], NodeFacts]] = field(default_factory=dict)
    _samples: dict[str, tuple[str, breaker_mod.Sample]] = field(default_factory=dict)
    """Finished screenings (Pass or SDC) by test name, with their policy: the breaker's
    samples, kept as tests are parsed."""
    _samples_version: int = 0
    _replaced: dict[str, str | None] = field(default_factory=dict)
    """Tickets closed as Replaced, with the resourceVersion they had (until it moves)."""
    _urgent: queue.SimpleQueue[UrgentWork] = field(default_factory=queue.SimpleQueue)
    _touched: set[str] = field(default_factory=set)
    _depth: int = 0

    # -- probe Jobs and judging ----------------------------------------------

    def probe_request(
        self, policy: SDCPolicy, test: SDCTest, node: NodeFacts, node_body: Mapping[str, Any]
    ) -> ProbeJobRequest:
        spec = policy.spec
        checks = spec.suites.checks(test.spec.suite)
        capacity = (node_body.get("status") or {}).get("allocatable") or {}
        resource = next((r for r in spec.accelerators if str(capacity.get(r, "0")) != "0"), None)
        count = int(str(capacity.get(resource, "0"))) if resource else 0
        budget = spec.probe.budget_seconds
        params: list[tuple[str, str]] = []
        for check in checks:
            for key, value in sorted(check.params.items()):
                params.append((key, str(value)))
        return ProbeJobRequest(
            test_name=test.metadata.name,
            test_uid=test.metadata.uid or "",
            node_name=node.name,
            namespace=self.settings.namespace,
            image=spec.probe.image or self.settings.default_probe_image,
            checks=tuple(c.name.value for c in checks),
            budget_seconds=budget,
            active_deadline_seconds=spec.probe.active_deadline_seconds,
            ttl_seconds_after_finished=spec.probe.ttl_seconds_after_finished,
            accelerator_resource=resource,
            accelerator_count=count,
            tolerated_taint_keys=(spec.taints.gate, spec.taints.testing, spec.taints.quarantine),
            cpu_devices=spec.probe.cpu_devices or None,
            resources={
                "requests": {k: str(v) for k, v in spec.probe.resources.requests.items()},
                "limits": {k: str(v) for k, v in spec.probe.resources.limits.items()},
            },
            priority_class=self.settings.probe_priority_class,
            check_params=tuple(dict.fromkeys(params)),
            command=tuple(spec.probe.command or ()),
            extra_args=tuple(spec.probe.args or ()),
            timeout_seconds=probe_timeout(checks, spec.probe.active_deadline_seconds),
        )

    def pod_end(
        self, test: SDCTest, view: FleetView, now: dt.datetime
    ) -> tuple[PodEnd | None, dt.datetime | None]:
        """How the test's probe Pod ended, or None while it runs."""
        name = test.metadata.name
        pods = view.probe_pods.get(name, [])
        job = view.probe_jobs.get(name)
        ended = [p for p in pods if p.phase in ("Succeeded", "Failed") and p.exit_code is not None]
        if ended:
            pod = max(ended, key=lambda p: p.finished or now)
            crashed = pod.terminated_reason not in ("", "Completed", "Error")
            return (
                PodEnd(
                    message=pod.termination_message,
                    exit_code=pod.exit_code,
                    timed_out=pod.pod_reason == "DeadlineExceeded",
                    crashed=crashed,
                    detail=pod.terminated_reason or pod.pod_reason,
                ),
                pod.finished,
            )
        if job is not None and job.failed_reason:
            timed_out = job.failed_reason == "DeadlineExceeded"
            return (
                PodEnd(
                    message=None,
                    exit_code=None,
                    timed_out=timed_out,
                    crashed=not timed_out,
                    detail=job.failed_reason,
                ),
                now,
            )
        status = test.status
        started = status.start_time if status else None
        deadline = dt.timedelta(seconds=0)
        if started is not None and job is None and not pods:
            deadline = now - started
        if started is not None and deadline > PROBE_VANISHED_GRACE:
            return (
                PodEnd(
                    message=None,
                    exit_code=None,
                    crashed=True,
                    detail="ProbeVanished: the probe Job and Pod are gone",
                ),
                now,
            )
        return None, None

    def judge(
        self, policy: SDCPolicy, test: SDCTest, end: PodEnd, view: FleetView, now: dt.datetime
    ) -> Judgement:
        """Judge, and take part in baseline consensus when no baseline is trusted yet."""
        expected = [c.name.value for c in policy.spec.suites.checks(test.spec.suite)]
        known = self._baseline_specs(view)
        judgement = judge_result(end, expected, known)
        fp = judgement.fingerprint
        if (
            fp is None
            or judgement.verdict != Verdict.INCONCLUSIVE
            or judgement.injected
            or not judgement.digests
        ):
            return judgement
        current = known.get(fp.hash)
        if (
            current is not None
            and current.trusted
            and all(check in current.digests for check in judgement.digests)
        ):
            return judgement
        trusted = self._record_candidate(policy, test, judgement, view, now)
        if trusted is not None:
            return judge_result(end, expected, {**known, fp.hash: trusted})
        return judgement

    def _baseline_specs(self, view: FleetView) -> dict[str, SDCBaselineSpec]:
        specs: dict[str, SDCBaselineSpec] = {}
        for body in view.baselines.values():
            try:
                baseline = SDCBaseline.model_validate(body)
            except ValidationError:
                continue
            specs[baseline.spec.fingerprint.hash] = baseline.spec
        return specs

    def _record_candidate(
        self,
        policy: SDCPolicy,
        test: SDCTest,
        judgement: Judgement,
        view: FleetView,
        now: dt.datetime,
    ) -> SDCBaselineSpec | None:
        """Add this node's digests to its fingerprint's candidates; returns the baseline
        if consensus made it trusted just now. Disagreeing nodes are reported suspect."""
        fp = judgement.fingerprint
        assert fp is not None
        name = baseline_name(fp.hash)
        body = view.baselines.get(name)
        current = SDCBaseline.model_validate(body) if body is not None else None
        candidates = current.status.candidates if current and current.status else []
        if any(
            c.node_name == test.spec.node_name and c.test_name == test.metadata.name
            for c in candidates
        ):
            return None  # already recorded in an earlier pass
        update = baselines.record_candidate(
            current.spec if current else None,
            current.status if current else None,
            fingerprint=baselines.fingerprint_spec(fp),
            node=test.spec.node_name,
            test=test.metadata.name,
            digests=judgement.digests,
            settings=policy.spec.baseline,
            now=now,
        )
        spec_body = to_body(update.spec)
        status_body = to_body(update.status)
        if current is None:
            self.writer.create_custom(
                "sdcbaselines",
                {
                    "apiVersion": "sdcguard.dev/v1alpha1",
                    "kind": "SDCBaseline",
                    "metadata": {"name": name},
                    "spec": spec_body,
                },
            )
        elif update.spec != current.spec:
            self.writer.patch_custom("sdcbaselines", name, {"spec": spec_body})
        self.writer.patch_custom_status("sdcbaselines", name, status_body)
        view.baselines[name] = {
            "metadata": {"name": name},
            "spec": spec_body,
            "status": status_body,
        }
        log.info(
            "baseline candidate", baseline=name, node=test.spec.node_name, message=update.message
        )
        for suspect in update.suspects:
            self._report_suspect(suspect, f"digests disagree with baseline {name[:20]}", view)
        return update.spec if update.became_trusted else None

    def _report_suspect(self, node: str, why: str, view: FleetView) -> None:
        """Mark a node suspect the way a workload would (the lifecycle takes it from there)."""
        body = view.nodes.get(node)
        if body is None or keys.REQUEST_SUSPECT in (body["metadata"].get("annotations") or {}):
            return
        self.writer.patch_node(node, {"metadata": {"annotations": {keys.REQUEST_SUSPECT: why}}})

    # -- tests: Pending -> Running -> judged ------------------------------------

    def advance_test(
        self,
        policy: SDCPolicy,
        test: SDCTest,
        node: NodeFacts | None,
        node_body: Mapping[str, Any] | None,
        view: FleetView,
        now: dt.datetime,
        counts: Counter[str],
    ) -> SDCTest:
        """Move one unfinished test along one row of ``testphase.TEST_TRANSITIONS``;
        returns the test as it is now."""
        status = test.status or SDCTestStatus()
        judgement: Judgement | None = None
        end: PodEnd | None = None
        finished_at: dt.datetime | None = None
        awaiting = False
        if node is not None and status.phase == SDCTestPhase.RUNNING:
            end, finished_at = self.pod_end(test, view, now)
            if end is not None:
                judgement = self.judge(policy, test, end, view, now)
                awaiting = self._awaits_quorum(policy, status, judgement, now)
        taints = policy.spec.taints
        # Reserved: our testing taint (or the quarantine taint, for verification of a
        # repaired node) keeps other work off. Observe mode reserves nothing.
        reserved = node is not None and (
            node.has_taint(taints.testing)
            or node.has_taint(taints.quarantine)
            or policy.spec.mode == Mode.OBSERVE
        )
        event = phase_event(
            status.phase,
            node_exists=node is not None and node_body is not None,
            reserved=reserved,
            verdict=judgement.verdict if judgement else None,
            awaiting_baseline=awaiting,
        )
        if event is None:
            return test
        row = phase_transition(status.phase, event)
        verdict, reason = Verdict.INCONCLUSIVE, "NodeGone"
        message = f"node {test.spec.node_name} no longer exists"
        if judgement is not None:
            verdict, reason, message = judgement.verdict, judgement.reason, judgement.message
        for action in row.actions:
            if isinstance(action, CreateJob):
                assert node is not None and node_body is not None
                manifest = build_probe_job(self.probe_request(policy, test, node, node_body))
                self.writer.create_job(manifest)
                counts["jobs-created"] += 1
            elif isinstance(action, MarkAwaitingBaseline):
                conds = set_condition(
                    status.conditions,
                    "AwaitingBaseline",
                    "True",
                    "AwaitingQuorum",
                    "digests recorded; waiting for enough nodes to agree on a baseline",
                    now,
                )
                if conds != status.conditions:
                    status = status.model_copy(update={"conditions": conds})
                    self._write_test_status(test, status)
            elif isinstance(action, WriteStatus) and row.target == SDCTestPhase.RESERVING:
                status = status.model_copy(update={"phase": SDCTestPhase.RESERVING})
                self._write_test_status(test, status)
            elif isinstance(action, WriteStatus) and row.target == SDCTestPhase.RUNNING:
                status = self._running_status(test, status, now)
                self._write_test_status(test, status)
            elif isinstance(action, WriteStatus):
                if judgement is not None:
                    self._count_judgement(judgement, finished_at, now)
                    status = status.model_copy(
                        update={
                            "checks": judgement.check_statuses(),
                            "fingerprint_hash": (
                                judgement.fingerprint.hash if judgement.fingerprint else None
                            ),
                        }
                    )
                return self._finish(test, status, verdict, reason, message, now, counts)
        return test.model_copy(update={"status": status})

    def _awaits_quorum(
        self,
        policy: SDCPolicy,
        status: SDCTestStatus,
        judgement: Judgement,
        now: dt.datetime,
    ) -> bool:
        """No baseline yet: wait (the digests are candidates) until the Job's deadline."""
        if judgement.verdict != Verdict.INCONCLUSIVE or judgement.reason != "BaselineAbsent":
            return False
        started = status.start_time or now
        return now - started < dt.timedelta(seconds=policy.spec.probe.active_deadline_seconds)

    def _running_status(
        self, test: SDCTest, status: SDCTestStatus, now: dt.datetime
    ) -> SDCTestStatus:
        name = test.metadata.name
        return status.model_copy(
            update={
                "phase": SDCTestPhase.RUNNING,
                "job_name": job_name(name),
                "start_time": now,
                "conditions": set_condition(
                    status.conditions,
                    "JobCreated",
                    "True",
                    "JobCreated",
                    f"probe Job {self.settings.namespace}/{job_name(name)}",
                    now,
                ),
            }
        )

    def _count_judgement(
        self, judgement: Judgement, finished_at: dt.datetime | None, now: dt.datetime
    ) -> None:
        if finished_at is not None and judgement.verdict == Verdict.SDC:
            self.metrics.finish_to_quarantine.observe(max(0.0, (now - finished_at).total_seconds()))
        for check in judgement.checks:
            self.metrics.screenings.labels(check=check.name, verdict=check.verdict.value).inc()

    def _finish(
        self,
        test: SDCTest,
        status: SDCTestStatus,
        verdict: Verdict,
        reason: str,
        message: str,
        now: dt.datetime,
        counts: Counter[str],
    ) -> SDCTest:
        phase = verdict_phase(verdict)
        conditions = set_condition(
            status.conditions, "Complete", "True", reason or verdict.value, message[:1024], now
        )
        conditions = [c for c in conditions if c.type != "AwaitingBaseline"]
        status = status.model_copy(
            update={
                "phase": phase,
                "verdict": verdict,
                "reason": (reason or verdict.value)[:64],
                "message": message[:4096],
                "completion_time": now,
                "conditions": conditions,
            }
        )
        self._write_test_status(test, status)
        counts[f"tests-{phase.value.lower()}"] += 1
        self.metrics.tests.labels(suite=test.spec.suite.value, phase=phase.value).inc()
        if status.start_time is not None:
            self.metrics.screening_duration.labels(suite=test.spec.suite.value).observe(
                max(0.0, (now - status.start_time).total_seconds())
            )
        log.info(
            "test finished",
            test=test.metadata.name,
            node=test.spec.node_name,
            phase=phase.value,
            verdict=verdict.value,
            reason=reason,
        )
        return test.model_copy(update={"status": status})

    def _write_test_status(self, test: SDCTest, status: SDCTestStatus) -> None:
        try:
            self.writer.patch_custom_status("sdctests", test.metadata.name, to_body(status))
        except ApiException as exc:
            if exc.status != 404:
                raise
        if test.metadata.resource_version:
            written = test.model_copy(update={"status": status})
            self.expect_tests[test.metadata.name] = (test.metadata.resource_version, written)

    # -- the pass ----------------------------------------------------------------

    def run_pass(
        self,
        policy_body: Mapping[str, Any],
        view: FleetView,
        now: dt.datetime,
        dirty: Iterable[str] | None = None,
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
        """
        with self._lock:
            self._touched = set()
            scope = None if dirty is None else frozenset(dirty)
            self._serve_urgent()
            try:
                return self._run_pass(policy_body, view, now, scope, fill=True)
            finally:
                self._serve_urgent()
                self._touched = set()

    # -- urgent work -------------------------------------------------------------

    def offer_urgent(self, work: UrgentWork) -> None:
        """Hand nodes whose probe ended to the running pass (thread-safe)."""
        self._urgent.put(work)

    def take_unserved(self) -> list[UrgentWork]:
        """Urgent work the last pass did not get to (offered as it ended)."""
        left = []
        while True:
            try:
                left.append(self._urgent.get_nowait())
            except queue.Empty:
                return left

    def _serve_urgent(self) -> None:
        """Serve the urgent work offered so far, one pass per policy (work offered
        while it runs waits for the next check, so the running pass moves on too)."""
        if self._depth:
            return
        merged: dict[str, UrgentWork] = {}
        for work in self.take_unserved():
            key = str((work.policy.get("metadata") or {}).get("name", ""))
            earlier = merged.get(key)
            if earlier is not None:
                work = UrgentWork(
                    work.policy, earlier.view.merged(work.view), earlier.nodes | work.nodes
                )
            merged[key] = work
        for work in merged.values():
            self._depth += 1
            try:
                self._run_pass(work.policy, work.view, _utcnow(), work.nodes, fill=False)
            except Exception:  # the loop's next pass decides again
                log.exception("urgent pass failed", nodes=sorted(work.nodes)[:10])
            finally:
                self._depth -= 1
                self._touched |= work.nodes

    def _skip(self, node: str) -> bool:
        """Urgent work served during this pass decided the node from fresher facts."""
        return not self._depth and node in self._touched

    # -- parsing, once per resourceVersion -------------------------------------------

    @staticmethod
    def _cached(cache: dict[str, tuple[str, T]], body: Mapping[str, Any], parse: Any) -> T:
        """``parse(body)``, or what it gave for this name at this resourceVersion."""
        name = str((body.get("metadata") or {}).get("name", ""))
        rv = _rv(body)
        cached = cache.get(name)
        if cached is not None and cached[0] == rv and rv:
            return cached[1]
        value: T = parse(body)
        cache[name] = (rv, value)
        return value

    def _test(self, body: Mapping[str, Any], node_name: str) -> KnownTest | None:
        def parse(body: Mapping[str, Any]) -> KnownTest | None:
            try:
                test = SDCTest.model_validate(body)
            except ValidationError as exc:
                log.warning("unreadable SDCTest skipped", node=node_name, error=str(exc)[:300])
                self._note_sample(str(body.get("metadata", {}).get("name", "")), node_name, None)
                return None
            self.test_nodes[test.metadata.name] = node_name
            self._note_sample(test.metadata.name, node_name, test)
            return KnownTest.of(test)

        known: KnownTest | None = self._cached(self._tests, body, parse)
        return known

    def _note_sample(self, name: str, node_name: str, test: SDCTest | None) -> None:
        status = test.status if test is not None else None
        sample = None
        if (
            test is not None
            and status is not None
            and status.completion_time is not None
            and status.verdict in (Verdict.PASS, Verdict.SDC)
        ):
            sample = (
                test.spec.policy_ref,
                breaker_mod.Sample(
                    status.completion_time, status.verdict == Verdict.SDC, node_name, name
                ),
            )
        if self._samples.get(name) != sample:
            if sample is None:
                del self._samples[name]
            else:
                self._samples[name] = sample
            self._samples_version += 1

    def _ticket_obj(self, body: Mapping[str, Any]) -> RepairTicket | None:
        def parse(body: Mapping[str, Any]) -> RepairTicket | None:
            try:
                return RepairTicket.model_validate(body)
            except ValidationError:
                return None

        ticket: RepairTicket | None = self._cached(self._tickets, body, parse)
        return ticket

    def _node_facts(self, body: Mapping[str, Any], spec: Any) -> NodeFacts:
        meta = body["metadata"]
        key = (_rv(body), tuple(spec.accelerators), spec.budgets.pool_label)
        cached = self._facts.get(meta["name"])
        if cached is not None and cached[0] == key and key[0]:
            return cached[1]
        node = NodeFacts.from_body(body, spec.accelerators, spec.budgets.pool_label)
        self._facts[meta["name"]] = (key, node)
        return node

    def _prune(self, view: FleetView) -> None:
        """Drop parse caches of objects the view no longer has (full passes only)."""
        tests = {
            str((b.get("metadata") or {}).get("name", ""))
            for bodies in view.tests.values()
            for b in bodies
        }
        tickets = {
            str((b.get("metadata") or {}).get("name", ""))
            for bodies in view.tickets.values()
            for b in bodies
        }
        for name in [n for n in self._tests if n not in tests]:
            del self._tests[name]
            self.test_nodes.pop(name, None)
            if self._samples.pop(name, None) is not None:
                self._samples_version += 1
        for name in [n for n in self._tickets if n not in tickets]:
            del self._tickets[name]
        for name in [n for n in self._replaced if n not in tickets]:
            del self._replaced[name]
        for name in [n for n in self._facts if n not in view.nodes]:
            del self._facts[name]

    # -- the pass ----------------------------------------------------------------

    def _scope(
        self,
        memory: PolicyMemory,
        policy_name: str,
        spec: Any,
        view: FleetView,
        selectors: dict[str, dict[str, str]],
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
            labels = body["metadata"].get("labels") or {}
            if owning_policy(labels, selectors) != policy_name:
                memory.forget(node_name)
                continue
            node = self._node_facts(body, spec)
            if node.accelerators <= 0 and node.state is None:
                memory.forget(node_name)
                continue  # not an accelerator node, and never one of ours
            facts[node_name] = node
        return facts

    def _fill(self, memory: PolicyMemory, spec: Any, facts: dict[str, NodeFacts]) -> list[str]:
        """Nodes waiting for budget that may fit now, best first (a targeted pass
        decides them too, so a finished test's slot is used at once)."""
        if not memory.waiting:
            return []
        limit = spec.budgets.max_concurrent_tests
        free: Counter[str] = Counter()
        for pool, usage in memory.usage_without(facts).items():
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
        policy_body: Mapping[str, Any],
        view: FleetView,
        now: dt.datetime,
        scope: frozenset[str] | None,
        *,
        fill: bool,
    ) -> float:
        counts: Counter[str] = Counter()
        writes_before = Counter(self.writer.writes)
        try:
            policy = SDCPolicy.model_validate(policy_body)
        except ValidationError as exc:  # the API server should have refused it already
            log.error("policy unreadable; nothing done", error=str(exc)[:500])
            return 60.0
        name = policy.metadata.name
        spec = policy.spec
        full = scope is None
        memory = self._memory.setdefault(name, PolicyMemory())
        if full:
            self._prune(view)

        selectors = {**view.policies, name: dict(spec.node_selector.match_labels)}
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
            for gone in [n for n in {*memory.states, *memory.members} if n not in facts]:
                memory.forget(gone)
        elif fill and view.complete:
            more = self._fill(memory, spec, facts)
            facts.update(self._scope(memory, name, spec, view, selectors, more))
        counts["nodes-decided"] = len(facts)
        deleted = [n for n in view.tickets if n not in view.nodes] if full else sorted(vanished)
        for node_name in deleted:
            self._close_replaced(policy, view, node_name, now, counts)

        # Tests first: their outcome is what the node decisions read. A full pass
        # reads every test (and so refreshes the breaker's samples); a targeted one
        # only the decided nodes' tests.
        tests_by_node: dict[str, list[KnownTest]] = {}
        looked = view.tests.keys() if full else [n for n in (*facts, *vanished) if n in view.tests]
        for count, node_name in enumerate(looked):
            if count % 256 == 255:
                self._serve_urgent()
            for body in view.tests[node_name]:
                known = self._test(body, node_name)
                if known is None or known.policy != name:
                    continue
                moving = full or node_name in facts or node_name in vanished
                if known.running is not None and moving:
                    test = self._advance_guarded(
                        policy, known.running, node_name, view, facts, now, counts
                    )
                    if test is not known.running:
                        known = KnownTest.of(test)
                        self._note_sample(test.metadata.name, node_name, test)
                tests_by_node.setdefault(node_name, []).append(known)

        breaker, breaker_status = self._breaker(policy, now)

        observations = []
        for count, (node_name, node) in enumerate(facts.items()):
            if count % 256 == 255:
                self._serve_urgent()
            if self._skip(node_name):
                continue
            expected_rv = self.expect_nodes.get(node_name)
            if expected_rv is not None:
                if expected_rv == view.nodes[node_name]["metadata"].get("resourceVersion"):
                    counts["nodes-awaiting-watch"] += 1
                    # Our last write has not come back through the watch yet; its event
                    # brings the node back, and if it never comes, this look does.
                    memory.due[node_name] = now + dt.timedelta(seconds=5)
                    continue
                del self.expect_nodes[node_name]
            self._restore_ticket_status(view.tickets.get(node_name, []), now, counts)
            node = self._seq_floor(node, tests_by_node.get(node_name, []), view)
            observations.append(
                Observed(
                    node=node,
                    test=self._current_test(node, tests_by_node.get(node_name, [])),
                    ticket=self._open_ticket(view.tickets.get(node_name, [])),
                    idle_since=self._idle_since(node_name, spec.accelerators, view),
                    pending_pod_needs_node=self._needed(node_name, spec.accelerators, view),
                    breaker_open=breaker.open,
                )
            )

        holding = frozenset({spec.taints.testing, spec.taints.quarantine})
        others = memory.usage_without(o.node.name for o in observations)
        by_node = {o.node.name: o for o in observations}
        wake = REQUEUE_MAX_SECONDS
        decisions: list[Decision] = []
        for count, decision in enumerate(iter_decisions(observations, spec, now, others)):
            if count % 256 == 255:
                self._serve_urgent()
            decisions.append(decision)
        illegal_before = dict(memory.illegal)
        for decision in decisions:
            self._note_illegal(name, memory, decision)
        # Budgets are granted in priority order; writes go out with the outcomes of
        # finished tests first (a release or quarantine never waits behind new starts).
        decisions.sort(key=lambda d: not _has_outcome(by_node[d.node]))
        for decision in decisions:
            node_name = decision.node
            observed = by_node[node_name]
            member = observed.pool_member(holding)
            if decision.actions:
                self._serve_urgent()
                if self._skip(node_name):
                    continue
                if self._apply_guarded(policy, decision, view, now, counts):
                    if decision.starts_test:
                        member = replace(
                            member, testing=True, held=member.held or decision.takes_node
                        )
                else:
                    memory.due[node_name] = now + dt.timedelta(seconds=1)
                    wake = min(wake, 1.0)
                    memory.set_member(node_name, member)
                    continue
            memory.set_member(node_name, member)
            memory.states[node_name] = decision.state.value
            if decision.held:
                memory.held.add(node_name)
            else:
                memory.held.discard(node_name)
            if decision.waits_for_budget:
                memory.waiting[node_name] = (priority(observed), observed.node.pool)
            else:
                memory.waiting.pop(node_name, None)
            if decision.requeue_after is not None:
                memory.due[node_name] = now + dt.timedelta(seconds=decision.requeue_after)
                wake = min(wake, decision.requeue_after)
            else:
                memory.due.pop(node_name, None)
        if not full and memory.due:
            soonest = min(memory.due.values())
            wake = min(wake, max(0.0, (soonest - now).total_seconds()))

        states = Counter(memory.states.values())
        if (
            full
            or memory.illegal != illegal_before
            or self._status_due(memory, policy, breaker, breaker_status, now)
        ):
            held = sorted(memory.held)[:1000]
            breaker_status = breaker_status.model_copy(update={"held_nodes": held})
            self._write_policy_status(policy, breaker, breaker_status, states, now, memory.illegal)
            memory.status_at = now
        elif memory.status_at is not None:
            # Held back by the interval: come back for it even if nothing else happens.
            left = STATUS_EVERY - (now - memory.status_at)
            wake = min(wake, max(0.0, left.total_seconds()))
        self._export(name, states, breaker)
        if full:
            self._export_usage(name, holding, observations, view, now)
        self.metrics.reconcile_passes.inc()
        writes = Counter(self.writer.writes)
        writes.subtract(writes_before)
        counts.update({f"writes-{k}": v for k, v in writes.items() if v})
        log.info(
            "reconcile pass",
            policy=name,
            kind="full" if full else ("urgent" if not fill else "targeted"),
            nodes=len(memory.states),
            **dict(sorted(counts.items())),
        )
        if not self._depth:
            self.last_counts = counts
        return wake

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
        expected = self.expect_tests.get(test.metadata.name)
        if expected is not None:
            if expected[0] == test.metadata.resource_version:
                test = expected[1]
            else:
                self.expect_tests.pop(test.metadata.name, None)
        self._serve_urgent()
        if self._skip(node_name):
            return test
        try:
            return self.advance_test(
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
            self.apply(policy, decision, view, now, counts)
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

    # -- observations --------------------------------------------------------------

    @staticmethod
    def _seq_floor(node: NodeFacts, tests: list[KnownTest], view: FleetView) -> NodeFacts:
        """Never reuse the name of a finished SDCTest or closed RepairTicket.

        Names come from the node's ``sdcguard.dev/seq`` counter. If that annotation was
        mangled, or a crash left it behind an object that has since finished, the next
        name could be an old object's: the create would answer 409 and the old outcome
        would be taken for the new test. Objects still in flight are not counted, so a
        decision repeated after a crash still finds (and adopts) what it created.
        """
        if not node.uid:
            return node
        marker = f"-{node.uid[:5]}-"

        def seq(name: str) -> int | None:
            """N of a name ending in -<uid[:5]>-N (a string test: a pattern per node
            would overflow the regex cache on a big fleet)."""
            _, found, tail = name.rpartition(marker)
            return int(tail) if found and tail.isdecimal() else None

        done: list[int] = []
        for test in tests:
            number = seq(test.name)
            if number is not None and test.finished:
                done.append(number)
        for body in view.tickets.get(node.name, []):
            number = seq(str(body.get("metadata", {}).get("name", "")))
            if number is not None and (body.get("status") or {}).get("phase") in (
                "Closed",
                "Retired",
            ):
                done.append(number)
        floor = max(done, default=0)
        raw = node.annotations.get(keys.SEQ, "0")
        if raw.isdigit() and int(raw) >= floor:
            return node
        return replace(node, annotations={**node.annotations, keys.SEQ: str(floor)})

    @staticmethod
    def _current_test(node: NodeFacts, tests: list[KnownTest]) -> TestFacts | None:
        current = node.current_test
        named = [t for t in tests if t.name == current]
        if named:
            return named[0].facts
        running = [t for t in tests if not t.finished]
        if not running:
            return None
        return max(running, key=lambda t: (t.created, t.name)).facts

    def _open_ticket(self, bodies: list[dict[str, Any]]) -> TicketFacts | None:
        tickets = []
        for body in bodies:
            ticket = self._ticket_obj(body)
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
        return TicketFacts.from_api(newest)

    @staticmethod
    def _idle_since(name: str, accelerators: Iterable[str], view: FleetView) -> dt.datetime | None:
        """None while a workload uses the node's accelerators (the policy's
        spec.accelerators); else since when it is idle.

        The time a workload last left is kept in memory; a node never seen busy counts
        as idle since it was created, so it does not look "used" after a restart.
        """
        if any(use.uses_any(accelerators) for use in view.busy.get(name, ())):
            return None
        last = view.last_busy.get(name)
        if last is not None:
            return last
        created = observe.parse_time(view.nodes[name]["metadata"].get("creationTimestamp"))
        return created or _EPOCH

    @staticmethod
    def _needed(name: str, accelerators: list[str], view: FleetView) -> bool:
        """A pending pod asks for this node's kind of accelerator and would fit its labels."""
        body = view.nodes[name]
        labels = body["metadata"].get("labels") or {}
        allocatable = body["status"].get("allocatable") or {}
        offered = {r for r in accelerators if str(allocatable.get(r, "0")) not in ("0", "")}
        for demand in view.pending:
            if not offered & set(demand.resources):
                continue
            if all(labels.get(k) == v for k, v in demand.node_selector.items()):
                return True
        return False

    # -- acting ----------------------------------------------------------------------

    def apply(
        self,
        policy: SDCPolicy,
        decision: Decision,
        view: FleetView,
        now: dt.datetime,
        counts: Counter[str],
    ) -> None:
        """Apply one decision in this order:

        1. objects: SDCTests, RepairTickets and their phase changes;
        2. the node patch (labels, annotations, taints, cordon, ownership), one write;
        3. evictions (a drain), so evicted pods find the node tainted and cordoned; an
           eviction error is logged and retried by a later pass, it never undoes 1-2;
        4. statuses: a new ticket's Open status;
        5. Events, which only tell what the objects already record;
        6. deleting the Node (replacement, retirement by deletion).

        A crash in between repeats the same decision, and deterministic names make the
        repeat a no-op (an Event may be lost)."""
        node_name = decision.node
        body = view.nodes[node_name]
        node = NodeFacts.from_body(body, policy.spec.accelerators, policy.spec.budgets.pool_label)
        delete_node = False
        drain = False
        events: list[EmitEvent] = []
        opened: list[CreateTicket] = []
        for action in decision.actions:
            if isinstance(action, CreateTest):
                self._create_test(policy, node_name, action, counts)
            elif isinstance(action, CancelTest):
                self._cancel_test(view, node_name, action, now, counts)
            elif isinstance(action, CreateTicket):
                if self._create_ticket(policy, body, action, view, counts):
                    opened.append(action)
            elif isinstance(action, SetTicketPhase):
                self._ticket_status(view, node_name, action.name, action.phase, action.message, now)
            elif isinstance(action, CloseTicket):
                self._ticket_status(
                    view, node_name, action.name, TicketPhase.CLOSED, action.message, now
                )
            elif isinstance(action, RaiseCycle):
                self._raise_cycle(view, node_name, action, now)
            elif isinstance(action, Retire):
                if action.name:
                    self._ticket_status(
                        view, node_name, action.name, TicketPhase.RETIRED, "retired", now
                    )
                delete_node = delete_node or action.delete_node
            elif isinstance(action, EmitEvent):
                if self.settings.routine_events or not action.routine:
                    events.append(action)
            elif isinstance(action, Drain):
                drain = True
            elif isinstance(action, DeleteNode):
                delete_node = True
        patch = plan_node_patch(node, decision.actions)
        if not patch.empty:
            rv = str(body["metadata"].get("resourceVersion", ""))
            self.writer.patch_node(node_name, patch.body(rv))
            self.expect_nodes[node_name] = rv
            counts["node-patches"] += 1
        if drain:
            self._drain(node_name, patch, node, counts)
        # A new ticket's status (Open, its history) after the taint: the ticket itself,
        # created before the patch, is the record of why (a ticket without a status
        # reads as Open), so the quarantine waits for one write less.
        for ticket in opened:
            self._open_ticket_status(ticket, now)
        # Events last: they only tell; the objects and the node already say it all.
        for event in events:
            self.writer.event(
                kind="Node",
                name=node_name,
                uid=node.uid or None,
                reason=event.reason,
                message=event.message,
                now=now,
                warning=event.warning,
            )
        if decision.changed:
            counts[f"to-{decision.state.value.lower()}"] += 1
            if decision.state == NodeState.QUARANTINED:
                self.metrics.quarantines.labels(policy=policy.metadata.name).inc()
            log.info(
                "transition",
                node=node_name,
                previous=decision.previous,
                state=decision.state.value,
                trigger=decision.event,
                note=decision.note,
            )
        if delete_node:
            self.writer.delete_node(node_name)

    def _drain(
        self, node_name: str, patch: NodePatch, node: NodeFacts, counts: Counter[str]
    ) -> None:
        """Evict the node's pods; once none is left to ask, the drain's deadline goes."""
        try:
            result = self.writer.evict_pods_on_node(
                node_name, skip_namespaces=(self.settings.namespace,)
            )
        except Exception as exc:  # the list failed: a later pass (DrainDue) asks again
            counts["drain-errors"] += 1
            log.warning(
                "drain failed; retrying", node=node_name, error=f"{type(exc).__name__}: {exc}"
            )
            return
        counts["pods-evicted"] += result.asked
        counts["pods-eviction-refused"] += result.blocked
        pending = patch.annotations.get(keys.DRAIN_UNTIL, node.annotations.get(keys.DRAIN_UNTIL))
        if not result.done:
            log.info(
                "drain incomplete; retrying",
                node=node_name,
                refused=result.blocked,
                failed=result.failed,
                until=pending,
            )
        elif pending is not None:
            self.writer.patch_node(
                node_name, {"metadata": {"annotations": {keys.DRAIN_UNTIL: None}}}
            )

    def _close_replaced(
        self,
        policy: SDCPolicy,
        view: FleetView,
        node_name: str,
        now: dt.datetime,
        counts: Counter[str],
    ) -> None:
        """Close, as Replaced, the tickets of a node deleted for replacement."""
        for body in view.tickets.get(node_name, []):
            ticket = self._ticket_obj(body)
            if ticket is None or ticket.spec.policy_ref != policy.metadata.name:
                continue
            if not closes_as_replaced(TicketFacts.from_api(ticket), policy.spec, False):
                continue
            name = ticket.metadata.name
            if self._replaced.get(name) == ticket.metadata.resource_version:
                continue  # closed already; the watch has not brought it back yet
            try:
                if ticket.spec.resolution is None:
                    self.writer.patch_custom(
                        "repairtickets", name, {"spec": {"resolution": Resolution.REPLACED.value}}
                    )
                self._ticket_status(
                    view,
                    node_name,
                    name,
                    TicketPhase.CLOSED,
                    f"node {node_name} deleted for replacement; its successor joins as new",
                    now,
                )
            except ApiException as exc:
                counts[f"ticket-close-error-{exc.status}"] += 1
                continue
            self._replaced[name] = ticket.metadata.resource_version
            counts["tickets-replaced"] += 1
            log.info("ticket closed: node replaced", ticket=name, node=node_name)

    def _cancel_test(
        self,
        view: FleetView,
        node_name: str,
        action: CancelTest,
        now: dt.datetime,
        counts: Counter[str],
    ) -> None:
        """The test ends as Cancelled (no verdict), and its probe Job goes."""
        for body in view.tests.get(node_name, []):
            known = self._test(body, node_name)
            if known is None or known.name != action.name or known.running is None:
                continue
            test = known.running
            expected = self.expect_tests.get(test.metadata.name)
            if expected is not None and expected[0] == test.metadata.resource_version:
                test = expected[1]
            current = (test.status or SDCTestStatus()).phase
            if current.finished:
                continue
            row = phase_transition(current, TestEvent.CANCELLED)  # WriteStatus, DeleteJob
            status = (test.status or SDCTestStatus()).model_copy(
                update={
                    "phase": row.target,
                    "reason": "Cancelled",
                    "message": action.message[:4096],
                    "completion_time": now,
                    "conditions": set_condition(
                        (test.status or SDCTestStatus()).conditions,
                        "Complete",
                        "True",
                        "Cancelled",
                        action.message[:1024],
                        now,
                    ),
                }
            )
            self._write_test_status(test, status)
            self.writer.delete_job(self.settings.namespace, job_name(test.metadata.name))
            counts["tests-cancelled"] += 1
            self.metrics.tests.labels(
                suite=test.spec.suite.value, phase=SDCTestPhase.CANCELLED.value
            ).inc()
            log.info("test cancelled", test=test.metadata.name, node=node_name)

    def _create_test(
        self, policy: SDCPolicy, node: str, action: CreateTest, counts: Counter[str]
    ) -> None:
        body = {
            "apiVersion": "sdcguard.dev/v1alpha1",
            "kind": "SDCTest",
            "metadata": {"name": action.name, "labels": {"sdcguard.dev/node": node[:63]}},
            "spec": {
                "nodeName": node,
                "policyRef": policy.metadata.name,
                "suite": (action.suite or "requalification"),
                "reason": action.reason.value,
                "attempt": action.attempt,
                **({"ticketRef": action.ticket} if action.ticket else {}),
            },
        }
        created = self.writer.create_custom("sdctests", body)
        counts["tests-created" if created is not None else "tests-existed"] += 1

    def _create_ticket(
        self,
        policy: SDCPolicy,
        node_body: Mapping[str, Any],
        action: CreateTicket,
        view: FleetView,
        counts: Counter[str],
    ) -> bool:
        """Create the ticket; False when it existed (its status is then left alone)."""
        evidence = list(dict.fromkeys(action.evidence))
        findings = self._findings(view, str(node_body["metadata"]["name"]), evidence)
        meta, spec = node_body["metadata"], node_body["spec"]
        hardware = {
            k: v
            for k, v in (
                ("providerID", spec.get("providerID")),
                ("systemUUID", (node_body["status"].get("nodeInfo") or {}).get("systemUUID")),
            )
            if v
        }
        body = {
            "apiVersion": "sdcguard.dev/v1alpha1",
            "kind": "RepairTicket",
            "metadata": {"name": action.name, "labels": {"sdcguard.dev/node": meta["name"][:63]}},
            "spec": {
                "nodeName": meta["name"],
                "policyRef": policy.metadata.name,
                "hardware": hardware,
                "evidence": evidence,
                **({"findings": [to_body(f) for f in findings]} if findings else {}),
            },
        }
        created = self.writer.create_custom("repairtickets", body)
        if created is None:
            counts["tickets-existed"] += 1
            return False
        counts["tickets-created"] += 1
        return True

    def _findings(self, view: FleetView, node: str, evidence: list[str]) -> list[Finding]:
        """Where the evidence tests' failed checks located the fault, in evidence order."""
        by_name: dict[str, TestFacts] = {}
        for body in view.tests.get(node, []):
            known = self._test(body, node)
            if known is None:
                continue
            facts = known.facts
            written = self.expect_tests.get(known.name)
            if written is not None and written[0] == _rv(body):
                facts = TestFacts.from_api(written[1])  # judged in this pass, not back yet
            by_name[known.name] = facts
        found = [f for name in evidence if name in by_name for f in by_name[name].findings]
        return found[:64]

    def _open_ticket_status(self, action: CreateTicket, now: dt.datetime) -> None:
        status = {
            "phase": TicketPhase.OPEN.value,
            "cycle": 1,
            "openedAt": keys.format_time(now),
            "history": [
                {"time": keys.format_time(now), "phase": "Open", "message": action.message[:1024]}
            ],
        }
        self.writer.patch_custom_status("repairtickets", action.name, status)

    def _restore_ticket_status(
        self, bodies: list[dict[str, Any]], now: dt.datetime, counts: Counter[str]
    ) -> None:
        """A ticket whose status never came (the operator died between creating it and
        writing its status, which follows the taint) gets it, dated at its creation."""
        for body in bodies:
            meta = body.get("metadata") or {}
            created = observe.parse_time(meta.get("creationTimestamp"))
            if body.get("status") or created is None or now - created < TICKET_STATUS_GRACE:
                continue
            message = "opened (status written after an interruption)"
            self._open_ticket_status(CreateTicket(str(meta.get("name", "")), (), message), created)
            counts["ticket-status-restored"] += 1

    def _ticket(self, view: FleetView, node: str, name: str) -> RepairTicket | None:
        for body in view.tickets.get(node, []):
            if body.get("metadata", {}).get("name") == name:
                return self._ticket_obj(body)
        return None

    def _ticket_status(
        self,
        view: FleetView,
        node: str,
        name: str,
        phase: TicketPhase,
        message: str,
        now: dt.datetime,
    ) -> None:
        ticket = self._ticket(view, node, name)
        status = ticket.status if ticket and ticket.status else None
        if status is not None and status.phase == phase:
            return
        history = [to_body(h) for h in (status.history if status else [])]
        history.append(
            {"time": keys.format_time(now), "phase": phase.value, "message": message[:1024]}
        )
        patch: dict[str, Any] = {"phase": phase.value, "history": history[-256:]}
        if phase in (TicketPhase.CLOSED, TicketPhase.RETIRED):
            patch["closedAt"] = keys.format_time(now)
        self.writer.patch_custom_status("repairtickets", name, patch)

    def _raise_cycle(
        self, view: FleetView, node: str, action: RaiseCycle, now: dt.datetime
    ) -> None:
        ticket = self._ticket(view, node, action.name)
        if ticket is None or (action.test and action.test in ticket.spec.evidence):
            return
        evidence = [*ticket.spec.evidence, action.test] if action.test else ticket.spec.evidence
        findings = [*ticket.spec.findings, *self._findings(view, node, [action.test])][-64:]
        self.writer.patch_custom(
            "repairtickets",
            action.name,
            {
                "spec": {
                    "evidence": evidence,
                    "findings": [to_body(f) for f in findings],
                    "resolution": None,
                    "resolutionNote": None,
                }
            },
        )
        status = ticket.status
        cycle = (status.cycle if status else 1) + 1
        history = [to_body(h) for h in (status.history if status else [])]
        message = f"repair cycle {cycle}: verification {action.test} failed"
        history.append({"time": keys.format_time(now), "phase": "Open", "message": message})
        self.writer.patch_custom_status(
            "repairtickets",
            action.name,
            {"phase": TicketPhase.OPEN.value, "cycle": cycle, "history": history[-256:]},
        )

    # -- policy status and breaker -------------------------------------------------

    def _breaker(
        self, policy: SDCPolicy, now: dt.datetime
    ) -> tuple[breaker_mod.BreakerView, BreakerStatus]:
        """The breaker now, and the status to store.

        Its samples are the policy's finished SDCTests (a Pass or SDC verdict at its
        completion time), rebuilt from the tests themselves, so no screening is ever
        missed or counted twice, whatever failed or restarted in between; the stored
        status only latches the trip (``trippedAt``) and the last reset. The result is
        reused for up to a second while no sample and nothing stored changed."""
        name = policy.metadata.name
        memory = self._memory.setdefault(name, PolicyMemory())
        reset = policy.metadata.annotations.get(keys.RESET_BREAKER)
        key = (self._samples_version, policy.metadata.resource_version, reset)
        if memory.breaker is not None:
            cached_key, at, result = memory.breaker
            if cached_key == key and dt.timedelta(0) <= now - at < dt.timedelta(seconds=1):
                return result  # type: ignore[no-any-return]
        samples = [sample for owner, sample in self._samples.values() if owner == name]
        stored = policy.status.breaker if policy.status else None
        result = breaker_mod.advance(
            stored.model_copy(update={"samples": []}) if stored else None,
            policy.spec.circuit_breaker,
            now,
            reset,
            samples,
            breaker_mod.failures_to_confirm(policy.spec.confirmation),
        )
        memory.breaker = (key, now, result)
        return result

    def _write_policy_status(
        self,
        policy: SDCPolicy,
        breaker: breaker_mod.BreakerView,
        breaker_status: BreakerStatus,
        states: Counter[str],
        now: dt.datetime,
        illegal: Mapping[str, str],
    ) -> None:
        """Write the policy's status if it changed."""
        old = policy.status or SDCPolicyStatus()
        bad = sorted(illegal.items())
        conditions = set_condition(
            old.conditions,
            "IllegalTransition",
            "True" if bad else "False",
            "NodesLeftAsTheyAre" if bad else "NoneSeen",
            (
                f"{len(bad)} nodes hit a transition outside the lifecycle table (a bug; "
                "see the operator log): " + ", ".join(f"{n} ({why})" for n, why in bad[:10])
            )[:1024]
            if bad
            else "every decision followed the lifecycle table",
            now,
            policy.metadata.generation,
        )
        conditions = set_condition(
            conditions,
            "BreakerOpen",
            "True" if breaker.open else "False",
            "Tripped" if breaker.open else "WithinLimit",
            breaker.explain(),
            now,
            policy.metadata.generation,
        )
        conditions = set_condition(
            conditions,
            "Ready",
            "True",
            "Reconciled",
            f"{sum(states.values())} nodes; mode {policy.spec.mode.value}"
            + ("; paused" if policy.spec.paused else ""),
            now,
            policy.metadata.generation,
        )
        new = old.model_copy(
            update={
                "observed_generation": policy.metadata.generation,
                "conditions": conditions,
                "breaker": breaker_status,
                "counts": NodeCounts.model_validate(
                    {s.value.lower(): states.get(s.value, 0) for s in NodeState}
                ),
            }
        )
        new = SDCPolicyStatus.model_validate(to_body(new))
        if to_body(new) == to_body(old):
            return
        try:
            self.writer.patch_custom_status("sdcpolicies", policy.metadata.name, to_body(new))
        except ApiException as exc:
            if exc.status != 404:
                raise

    @staticmethod
    def _status_due(
        memory: PolicyMemory,
        policy: SDCPolicy,
        breaker: breaker_mod.BreakerView,
        breaker_status: BreakerStatus,
        now: dt.datetime,
    ) -> bool:
        """Between full passes the policy's status (counts, breaker window) is written at
        most every STATUS_EVERY; a trip or reset of the breaker at once."""
        old = policy.status or SDCPolicyStatus()
        stored = old.breaker or BreakerStatus()
        was_open = any(c.type == "BreakerOpen" and c.status == "True" for c in old.conditions)
        if was_open != breaker.open or (breaker_status.state, breaker_status.tripped_at) != (
            stored.state,
            stored.tripped_at,
        ):
            return True
        return memory.status_at is None or now - memory.status_at >= STATUS_EVERY

    def _export_usage(
        self,
        policy: str,
        holding: frozenset[str],
        observations: list[Observed],
        view: FleetView,
        now: dt.datetime,
    ) -> None:
        """Budget in use per pool, and open tickets by age (for the SLA alert)."""
        for pool, usage in pool_usage(o.pool_member(holding) for o in observations).items():
            label = pool or "default"
            self.metrics.budget_in_use.labels(policy=policy, pool=label, budget="tests").set(
                usage.tests
            )
            self.metrics.budget_in_use.labels(policy=policy, pool=label, budget="unavailable").set(
                usage.unavailable
            )
        ages: list[float] = []
        for bodies in view.tickets.values():
            for body in bodies:
                status = body.get("status") or {}
                if status.get("phase") in (None, "Closed", "Retired"):
                    continue
                opened = observe.parse_time(status.get("openedAt"))
                if opened is not None:
                    ages.append((now - opened).total_seconds())
        buckets = {"lt1h": 0, "1h-24h": 0, "1d-7d": 0, "gt7d": 0}
        for age in ages:
            key = (
                "lt1h"
                if age < 3600
                else "1h-24h"
                if age < 86400
                else "1d-7d"
                if age < 7 * 86400
                else "gt7d"
            )
            buckets[key] += 1
        for key, count in buckets.items():
            self.metrics.tickets_open.labels(age=key).set(count)
        self.metrics.oldest_ticket.set(max(ages, default=0.0))

    def _export(self, policy: str, states: Counter[str], breaker: breaker_mod.BreakerView) -> None:
        for state in NodeState:
            self.metrics.nodes.labels(policy=policy, state=state.value).set(
                states.get(state.value, 0)
            )
        self.metrics.breaker_open.labels(policy=policy).set(1 if breaker.open else 0)
        self.metrics.breaker_fraction.labels(policy=policy).set(
            breaker.failures / breaker.samples if breaker.samples else 0.0
        )
