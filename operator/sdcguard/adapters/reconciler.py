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
import re
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import structlog
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from sdcguard.adapters import observe
from sdcguard.adapters.kube import KubeWriter
from sdcguard.api import (
    BreakerStatus,
    Mode,
    NodeCounts,
    RepairTicket,
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
from sdcguard.domain.budgets import pool_usage
from sdcguard.domain.decide import Decision, decide_all
from sdcguard.domain.judging import Judgement, PodEnd, judge_result
from sdcguard.domain.lifecycle import (
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
from sdcguard.domain.nodepatch import plan_node_patch
from sdcguard.domain.observed import NodeFacts, Observed, TestFacts, TicketFacts
from sdcguard.domain.selection import owning_policy
from sdcguard.metrics import Metrics
from sdcguard.settings import Settings

log = structlog.get_logger("sdcguard.reconcile")

AWAITING_BASELINE_REASONS = ("BaselineAbsent", "NoTrustedBaseline", "BaselinePending")
PROBE_VANISHED_GRACE = dt.timedelta(seconds=120)
REQUEUE_MAX_SECONDS = 3600.0
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


@dataclass
class FleetView:
    """A consistent copy of the indexes for one pass."""

    nodes: dict[str, dict[str, Any]]
    busy: dict[str, list[observe.PodUse]]
    pending: list[observe.PendingDemand]
    probe_pods: dict[str, list[observe.ProbePod]]
    probe_jobs: dict[str, observe.ProbeJob]
    tests: dict[str, list[dict[str, Any]]]
    tickets: dict[str, list[dict[str, Any]]]
    baselines: dict[str, dict[str, Any]]
    last_busy: dict[str, dt.datetime] = field(default_factory=dict)
    operator_started: dt.datetime | None = None
    policies: dict[str, dict[str, str]] = field(default_factory=dict)
    """Every policy's name and selector matchLabels (one policy owns each node)."""


def _rv(body: Mapping[str, Any]) -> str:
    return str((body.get("metadata") or {}).get("resourceVersion", ""))


@dataclass
class Reconciler:
    """Runs passes; holds only caches that a restart may lose without harm."""

    writer: KubeWriter
    settings: Settings
    metrics: Metrics
    # name -> resourceVersion the object had when we last wrote it; skip until it moves.
    expect_nodes: dict[str, str] = field(default_factory=dict)
    expect_tests: dict[str, str] = field(default_factory=dict)
    last_counts: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

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
        """Move one unfinished test along; returns the test as it is now."""
        status = test.status or SDCTestStatus()
        name = test.metadata.name
        if node is None or node_body is None:
            return self._finish(
                test,
                status,
                Verdict.INCONCLUSIVE,
                "NodeGone",
                f"node {test.spec.node_name} no longer exists",
                now,
                counts,
            )
        if status.phase in (SDCTestPhase.PENDING, SDCTestPhase.RESERVING):
            # Reserved: our testing taint (or the quarantine taint, for verification of a
            # repaired node) keeps other work off. Observe mode reserves nothing.
            taints = policy.spec.taints
            reserved = (
                node.has_taint(taints.testing)
                or node.has_taint(taints.quarantine)
                or policy.spec.mode == Mode.OBSERVE
            )
            if not reserved:
                if status.phase == SDCTestPhase.PENDING:
                    status = status.model_copy(update={"phase": SDCTestPhase.RESERVING})
                    self._write_test_status(test, status)
                return test.model_copy(update={"status": status})
            manifest = build_probe_job(self.probe_request(policy, test, node, node_body))
            self.writer.create_job(manifest)
            counts["jobs-created"] += 1
            status = status.model_copy(
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
            self._write_test_status(test, status)
            return test.model_copy(update={"status": status})
        if status.phase != SDCTestPhase.RUNNING:
            return test
        end, finished_at = self.pod_end(test, view, now)
        if end is None:
            return test
        judgement = self.judge(policy, test, end, view, now)
        if judgement.verdict == Verdict.INCONCLUSIVE and judgement.reason == "BaselineAbsent":
            started = status.start_time or now
            wait = dt.timedelta(seconds=policy.spec.probe.active_deadline_seconds)
            if now - started < wait:
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
                return test.model_copy(update={"status": status})
        if finished_at is not None and judgement.verdict == Verdict.SDC:
            self.metrics.finish_to_quarantine.observe(max(0.0, (now - finished_at).total_seconds()))
        for check in judgement.checks:
            self.metrics.screenings.labels(check=check.name, verdict=check.verdict.value).inc()
        status = status.model_copy(
            update={
                "checks": judgement.check_statuses(),
                "fingerprint_hash": judgement.fingerprint.hash if judgement.fingerprint else None,
            }
        )
        return self._finish(
            test, status, judgement.verdict, judgement.reason, judgement.message, now, counts
        )

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
        # Failed means wrong answers were found; a crash or timeout is no evidence either
        # way, so it is Inconclusive (the verdict column still says Crash or Timeout).
        phase = (
            SDCTestPhase.PASSED
            if verdict == Verdict.PASS
            else SDCTestPhase.FAILED
            if verdict == Verdict.SDC
            else SDCTestPhase.INCONCLUSIVE
        )
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
            self.expect_tests[test.metadata.name] = test.metadata.resource_version

    # -- the pass ----------------------------------------------------------------

    def run_pass(self, policy_body: Mapping[str, Any], view: FleetView, now: dt.datetime) -> float:
        """Reconcile every node the policy selects; returns seconds until the next look.

        Passes of different policies run in worker threads; they are serialized, since
        they share the write counter and the expectations (and a node may move between
        policies when selectors change).
        """
        with self._lock:
            return self._run_pass(policy_body, view, now)

    def _run_pass(self, policy_body: Mapping[str, Any], view: FleetView, now: dt.datetime) -> float:
        counts: Counter[str] = Counter()
        self.writer.writes.clear()
        try:
            policy = SDCPolicy.model_validate(policy_body)
        except ValidationError as exc:  # the API server should have refused it already
            log.error("policy unreadable; nothing done", error=str(exc)[:500])
            return 60.0
        name = policy.metadata.name
        spec = policy.spec

        facts: dict[str, NodeFacts] = {}
        selectors = {**view.policies, name: dict(spec.node_selector.match_labels)}
        for node_name, body in view.nodes.items():
            labels = body["metadata"].get("labels") or {}
            if owning_policy(labels, selectors) != name:
                continue
            node = NodeFacts.from_body(body, spec.accelerators, spec.budgets.pool_label)
            if node.accelerators <= 0 and node.state is None:
                continue  # not an accelerator node, and never one of ours
            facts[node_name] = node

        # Tests first: their outcome is what the node decisions read.
        tests_by_node: dict[str, list[SDCTest]] = {}
        for node_name, bodies in view.tests.items():
            for body in bodies:
                try:
                    test = SDCTest.model_validate(body)
                except ValidationError as exc:
                    log.warning("unreadable SDCTest skipped", node=node_name, error=str(exc)[:300])
                    continue
                if test.spec.policy_ref != name:
                    continue
                status = test.status
                expected = self.expect_tests.get(test.metadata.name)
                stale = expected is not None and expected == test.metadata.resource_version
                if not stale:
                    self.expect_tests.pop(test.metadata.name, None)
                if (status is None or not status.phase.finished) and not stale:
                    test = self.advance_test(
                        policy,
                        test,
                        facts.get(node_name),
                        view.nodes.get(node_name),
                        view,
                        now,
                        counts,
                    )
                tests_by_node.setdefault(node_name, []).append(test)

        breaker, breaker_status = self._breaker(policy, tests_by_node, now)

        observations = []
        for node_name, node in facts.items():
            expected_rv = self.expect_nodes.get(node_name)
            if expected_rv is not None:
                if expected_rv == view.nodes[node_name]["metadata"].get("resourceVersion"):
                    counts["nodes-awaiting-watch"] += 1
                    continue  # our last write has not come back through the watch yet
                del self.expect_nodes[node_name]
            node = self._seq_floor(node, tests_by_node.get(node_name, []), view)
            observations.append(
                Observed(
                    node=node,
                    test=self._current_test(node, tests_by_node.get(node_name, [])),
                    ticket=self._open_ticket(view.tickets.get(node_name, [])),
                    idle_since=self._idle_since(node_name, node, view),
                    pending_pod_needs_node=self._needed(node_name, spec.accelerators, view),
                    breaker_open=breaker.open,
                )
            )

        wake = REQUEUE_MAX_SECONDS
        states: Counter[str] = Counter()
        for decision in decide_all(observations, spec, now):
            states[decision.state.value] += 1
            if decision.requeue_after is not None:
                wake = min(wake, decision.requeue_after)
            if not decision.actions:
                continue
            try:
                self.apply(policy, decision, view, now, counts)
            except ApiException as exc:
                # 409: our view was stale; anything else: the API hiccupped. Either way
                # the next pass (soon) decides again from fresh observations.
                counts[f"apply-error-{exc.status}"] += 1
                wake = min(wake, 1.0)
                log.warning(
                    "applying a decision failed; retrying",
                    node=decision.node,
                    status=exc.status,
                    reason=exc.reason,
                )
        self._write_policy_status(policy, breaker, breaker_status, states, now)
        self._export(name, states, breaker)
        holding = frozenset({spec.taints.testing, spec.taints.quarantine})
        self._export_usage(name, holding, observations, view, now)
        self.metrics.reconcile_passes.inc()
        counts.update({f"writes-{k}": v for k, v in self.writer.writes.items()})
        log.info("reconcile pass", policy=name, nodes=len(facts), **dict(sorted(counts.items())))
        self.last_counts = counts
        return wake

    # -- observations --------------------------------------------------------------

    @staticmethod
    def _seq_floor(node: NodeFacts, tests: list[SDCTest], view: FleetView) -> NodeFacts:
        """Never reuse the name of a finished SDCTest or closed RepairTicket.

        Names come from the node's ``sdcguard.dev/seq`` counter. If that annotation was
        mangled, or a crash left it behind an object that has since finished, the next
        name could be an old object's: the create would answer 409 and the old outcome
        would be taken for the new test. Objects still in flight are not counted, so a
        decision repeated after a crash still finds (and adopts) what it created.
        """
        suffix = re.compile(rf"-{re.escape(node.uid[:5])}-(\d+)$") if node.uid else None
        if suffix is None:
            return node
        done: list[int] = []
        for test in tests:
            match = suffix.search(test.metadata.name)
            if match and test.status is not None and test.status.phase.finished:
                done.append(int(match.group(1)))
        for body in view.tickets.get(node.name, []):
            match = suffix.search(str(body.get("metadata", {}).get("name", "")))
            if match and (body.get("status") or {}).get("phase") in ("Closed", "Retired"):
                done.append(int(match.group(1)))
        floor = max(done, default=0)
        raw = node.annotations.get(keys.SEQ, "0")
        if raw.isdigit() and int(raw) >= floor:
            return node
        return replace(node, annotations={**node.annotations, keys.SEQ: str(floor)})

    @staticmethod
    def _current_test(node: NodeFacts, tests: list[SDCTest]) -> TestFacts | None:
        current = node.current_test
        named = [t for t in tests if t.metadata.name == current]
        if named:
            return TestFacts.from_api(named[0])
        running = [t for t in tests if not (t.status and t.status.phase.finished)]
        if not running:
            return None
        newest = max(
            running, key=lambda t: (t.metadata.creation_timestamp or _EPOCH, t.metadata.name)
        )
        return TestFacts.from_api(newest)

    @staticmethod
    def _open_ticket(bodies: list[dict[str, Any]]) -> TicketFacts | None:
        tickets = []
        for body in bodies:
            try:
                ticket = RepairTicket.model_validate(body)
            except ValidationError:
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
    def _idle_since(name: str, node: NodeFacts, view: FleetView) -> dt.datetime | None:
        """None while a workload uses the node's accelerators; else since when it is idle.

        The time a workload last left is kept in memory; a node never seen busy counts
        as idle since it was created, so it does not look "used" after a restart.
        """
        if view.busy.get(name):
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
        """Objects first (tests, tickets, events), the node patch last: a crash in between
        repeats the same decision, and deterministic names make the repeat a no-op."""
        node_name = decision.node
        body = view.nodes[node_name]
        node = NodeFacts.from_body(body, policy.spec.accelerators, policy.spec.budgets.pool_label)
        delete_node = False
        for action in decision.actions:
            if isinstance(action, CreateTest):
                self._create_test(policy, node_name, action, counts)
            elif isinstance(action, CreateTicket):
                self._create_ticket(policy, body, action, now, counts)
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
                self.writer.event(
                    kind="Node",
                    name=node_name,
                    uid=node.uid or None,
                    reason=action.reason,
                    message=action.message,
                    now=now,
                    warning=action.warning,
                )
            elif isinstance(action, Drain):
                counts["pods-evicted"] += self.writer.evict_pods_on_node(
                    node_name, skip_namespaces=(self.settings.namespace,)
                )
            elif isinstance(action, DeleteNode):
                delete_node = True
        patch = plan_node_patch(node, decision.actions)
        if not patch.empty:
            rv = str(body["metadata"].get("resourceVersion", ""))
            self.writer.patch_node(node_name, patch.body(rv))
            self.expect_nodes[node_name] = rv
            counts["node-patches"] += 1
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
        now: dt.datetime,
        counts: Counter[str],
    ) -> None:
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
                "evidence": list(dict.fromkeys(action.evidence)),
            },
        }
        created = self.writer.create_custom("repairtickets", body)
        if created is None:
            counts["tickets-existed"] += 1
            return
        counts["tickets-created"] += 1
        status = {
            "phase": TicketPhase.OPEN.value,
            "cycle": 1,
            "openedAt": keys.format_time(now),
            "history": [
                {"time": keys.format_time(now), "phase": "Open", "message": action.message[:1024]}
            ],
        }
        self.writer.patch_custom_status("repairtickets", action.name, status)

    def _ticket(self, view: FleetView, node: str, name: str) -> RepairTicket | None:
        for body in view.tickets.get(node, []):
            if body.get("metadata", {}).get("name") == name:
                try:
                    return RepairTicket.model_validate(body)
                except ValidationError:
                    return None
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
        self.writer.patch_custom(
            "repairtickets",
            action.name,
            {"spec": {"evidence": evidence, "resolution": None, "resolutionNote": None}},
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
        self, policy: SDCPolicy, tests_by_node: Mapping[str, list[SDCTest]], now: dt.datetime
    ) -> tuple[breaker_mod.BreakerView, BreakerStatus]:
        """The breaker now, and the status to store.

        Its samples are rebuilt on every pass from the policy's finished SDCTests (a
        Pass or SDC verdict at its completion time), so no screening is ever missed or
        counted twice, whatever failed or restarted in between; the stored status only
        latches the trip (``trippedAt``) and the last reset."""
        samples = [
            breaker_mod.Sample(
                test.status.completion_time,
                test.status.verdict == Verdict.SDC,
                node,
                test.metadata.name,
            )
            for node, tests in tests_by_node.items()
            for test in tests
            if test.status is not None
            and test.status.completion_time is not None
            and test.status.verdict in (Verdict.PASS, Verdict.SDC)
        ]
        stored = policy.status.breaker if policy.status else None
        return breaker_mod.advance(
            stored.model_copy(update={"samples": []}) if stored else None,
            policy.spec.circuit_breaker,
            now,
            policy.metadata.annotations.get(keys.RESET_BREAKER),
            samples,
        )

    def _write_policy_status(
        self,
        policy: SDCPolicy,
        breaker: breaker_mod.BreakerView,
        breaker_status: BreakerStatus,
        states: Counter[str],
        now: dt.datetime,
    ) -> None:
        old = policy.status or SDCPolicyStatus()
        conditions = set_condition(
            old.conditions,
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
        if to_body(new) != to_body(old):
            try:
                self.writer.patch_custom_status("sdcpolicies", policy.metadata.name, to_body(new))
            except ApiException as exc:
                if exc.status != 404:
                    raise

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
