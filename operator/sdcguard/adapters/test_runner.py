"""Moving SDCTests along the phase table (domain.testphase): probe Jobs, judging the
probe's result, baseline consensus."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import replace

import structlog
from kubernetes.client.exceptions import ApiException

from sdcguard.adapters.kube import KubeWriter
from sdcguard.adapters.node_writes import NodePatchStage, annotation_plan
from sdcguard.adapters.pass_state import (
    PROBE_VANISHED_GRACE,
    Expectations,
    FleetView,
    KnownTests,
)
from sdcguard.api import (
    Condition,
    Mode,
    ObjectMeta,
    ScreeningReason,
    SDCBaseline,
    SDCBaselineSpec,
    SDCPolicy,
    SDCTest,
    SDCTestPhase,
    SDCTestStatus,
    Verdict,
    accelerator_resources,
    baseline_name,
    find_condition,
    set_condition,
    suite_of,
    to_body,
    unnamed_suite,
)
from sdcguard.builders.probe_job import (
    ProbeJobRequest,
    ProbeTuning,
    attestation_secret_name,
    build_attestation_secret,
    build_claim_template,
    build_probe_job,
    job_name,
)
from sdcguard.domain import baselines, keys
from sdcguard.domain.attestation import Attestation
from sdcguard.domain.echo import bounded
from sdcguard.domain.judging import (
    Judgement,
    NodeExpectation,
    PodEnd,
    judge_result,
    record_catch,
)
from sdcguard.domain.lifecycle import NodeState
from sdcguard.domain.observed import NodeFacts, NodeSnapshot
from sdcguard.domain.plan import Plan
from sdcguard.domain.quantity import whole_quantity
from sdcguard.domain.screening_time import running_fields
from sdcguard.domain.seeds import data_seed, screening_seed
from sdcguard.domain.testphase import (
    CreateJob,
    DeleteJob,
    MarkAwaitingBaseline,
    PolicyChange,
    TestEvent,
    WriteStatus,
    phase_event,
    phase_transition,
    policy_change_ending,
    verdict_phase,
)
from sdcguard.metrics import Metrics
from sdcguard.settings import Settings

log = structlog.get_logger("sdcguard.reconcile")
#: Tests remembered as having had their probe Pod deleted mid-run (oldest dropped first).
PROBE_PODS_DELETED_KEPT = 4096


def _seed_of(test: SDCTest) -> int:
    """The seed of this screening's baseline rounds (pinned, or the fixed baseline seed;
    see domain.seeds)."""
    return screening_seed(test.spec.seed)


def _data_seed_of(test: SDCTest, view: FleetView) -> int:
    """The seed of the screening's own data (the rounds no baseline covers): pinned, the
    confirmed test's for a confirmation re-run, else the test's own (see domain.seeds).

    A confirmation confirms the node's newest earlier test. Its verdict is not required
    here: the view may predate the write of that verdict (the judgement, the confirmation
    and its Job can come in one pass), and in a chain of re-runs every confirmation
    carries the first test's data seed on, so the newest earlier one has it too."""
    confirmed: int | None = None
    if test.spec.reason == ScreeningReason.CONFIRMATION:
        created = test.metadata.creation_timestamp
        earlier = [
            known
            for body in view.tests.get(test.spec.node_name, [])
            if (known := body.known) is not None
            and known.name != test.metadata.name
            and known.facts.data_seed is not None
            and (created is None or known.created <= created)
        ]
        if earlier:
            confirmed = max(earlier, key=lambda k: (k.created, k.name)).facts.data_seed
    return data_seed(
        test.spec.data_seed,
        test.spec.seed,
        test.metadata.uid or "",
        test.metadata.name,
        confirmed,
    )


def _not_waiting(
    conditions: list[Condition], reason: str, message: str, now: dt.datetime
) -> list[Condition]:
    """``conditions`` with a Waiting condition that was True set False (left as it is
    otherwise)."""
    previous = find_condition(conditions, "Waiting")
    if previous is None or previous.status != "True":
        return conditions
    return set_condition(conditions, "Waiting", "False", reason, message, now)


class TestRunner:
    """Executes the rows of the SDCTest phase table. Of its own it keeps only the tests
    whose probe Pod was seen deleted before it ended; the tests it reads are noted in
    :class:`KnownTests`, its status writes in :class:`Expectations`, and a node that
    baseline consensus makes suspect is marked through the plan's node-patch stage."""

    __test__ = False

    def __init__(
        self,
        writer: KubeWriter,
        settings: Settings,
        metrics: Metrics,
        known: KnownTests,
        expectations: Expectations,
        node_patch: NodePatchStage,
    ) -> None:
        self.writer = writer
        self.settings = settings
        self.metrics = metrics
        self._known = known
        self._expectations = expectations
        self._node_patch = node_patch
        self.probe_pods_deleted: dict[str, None] = {}
        """SDCTests whose probe Pod was seen deleted before it ended (a drain, an
        eviction): the Job failure that follows, once the Pod is gone, is not a crash of
        the probe."""

    def probe_request(
        self,
        policy: SDCPolicy,
        test: SDCTest,
        node: NodeFacts,
        node_body: NodeSnapshot,
        data: int | None = None,
    ) -> ProbeJobRequest:
        spec = policy.spec
        checks = spec.suites.checks(suite_of(test))
        capacity = node_body.allocatable
        # Every accelerator resource the node offers, in full: a MIG node's profiles
        # all together, so the probe screens every instance and no Pod shares one.
        accelerators = tuple(
            (name, count)
            for name in accelerator_resources(spec.accelerators, capacity)
            if (count := whole_quantity(capacity.get(name, 0))) > 0
        )
        budget = spec.suite_budget(suite_of(test))
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
            accelerators=accelerators,
            dra_claims=() if accelerators else node.dra_claims,
            tolerated_taint_keys=(spec.taints.gate, spec.taints.testing, spec.taints.quarantine),
            cpu_devices=spec.probe.cpu_devices or None,
            resources={
                "requests": {k: str(v) for k, v in spec.probe.resources.requests.items()},
                "limits": {k: str(v) for k, v in spec.probe.resources.limits.items()},
            },
            priority_class=spec.probe.priority_class_name or self.settings.probe_priority_class,
            runtime_class=spec.probe.runtime_class_name or "",
            image_pull_secrets=tuple(spec.probe.image_pull_secrets),
            tolerations=tuple(t.pod_toleration() for t in spec.probe.tolerations),
            pod_labels=tuple(sorted(spec.probe.labels.items())),
            pod_annotations=tuple(sorted(spec.probe.annotations.items())),
            check_params=tuple(dict.fromkeys(params)),
            command=tuple(spec.probe.command or ()),
            extra_args=tuple(spec.probe.args or ()),
            tuning=ProbeTuning.of(spec.probe),
            seed=_seed_of(test),
            data_seed=data,
        )

    def pod_end(
        self, test: SDCTest, view: FleetView, now: dt.datetime
    ) -> tuple[PodEnd | None, dt.datetime | None]:
        """How the test's probe Pod ended, or None while it runs."""
        name = test.metadata.name
        pods = view.probe_pods.get(name, [])
        job = view.probe_jobs.get(name)
        if any(p.deleted and p.phase not in ("Succeeded", "Failed") for p in pods):
            self.probe_pods_deleted[name] = None
            while len(self.probe_pods_deleted) > PROBE_PODS_DELETED_KEPT:
                del self.probe_pods_deleted[next(iter(self.probe_pods_deleted))]
        deleted = name in self.probe_pods_deleted
        ended = [p for p in pods if p.phase in ("Succeeded", "Failed") and p.exit_code is not None]
        if ended:
            pod = max(ended, key=lambda p: p.finished or now)
            crashed = pod.terminated_reason not in ("", "Completed", "Error")
            return (
                PodEnd(
                    message=pod.termination_message,
                    exit_code=pod.exit_code,
                    # The Job's deadline kills the Pod with SIGTERM: the Pod ends
                    # Failed (exit 2 or 137), the Job says DeadlineExceeded.
                    timed_out=pod.pod_reason == "DeadlineExceeded"
                    or (job is not None and job.failed_reason == "DeadlineExceeded"),
                    crashed=crashed,
                    detail=pod.terminated_reason or pod.pod_reason,
                    deleted=pod.deleted or deleted,
                ),
                pod.finished,
            )
        stuck = next((p.start_failure for p in pods if p.start_failure and not p.deleted), None)
        if stuck is not None:
            return PodEnd(message=None, exit_code=None, never_started=True, detail=stuck), now
        if job is not None and job.failed_reason:
            timed_out = job.failed_reason == "DeadlineExceeded"
            return (
                PodEnd(
                    message=None,
                    exit_code=None,
                    timed_out=timed_out,
                    crashed=not timed_out,
                    detail=job.failed_reason,
                    deleted=deleted,
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
                    deleted=deleted,
                ),
                now,
            )
        return None, None

    def judge(
        self, policy: SDCPolicy, test: SDCTest, end: PodEnd, view: FleetView, now: dt.datetime
    ) -> Judgement:
        """Judge, and take part in baseline consensus when no baseline is trusted yet."""
        expected = [c.name.value for c in policy.spec.suites.checks(suite_of(test))]
        known = self._baseline_specs(view)
        node = self._expectation(test, view)
        sealing = self.attestation(test)
        judgement = judge_result(end, expected, known, node, sealing)
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
            return judge_result(end, expected, {**known, fp.hash: trusted}, node, sealing)
        return judgement

    def attestation(self, test: SDCTest) -> Attestation | None:
        """The nonce and key ``test``'s result must be sealed with (None: attestation
        is off, no key is set)."""
        key = self.settings.attestation_key()
        if key is None or not test.metadata.uid:
            return None
        return Attestation.derive(key, str(test.metadata.uid))

    def _expectation(self, test: SDCTest, view: FleetView) -> NodeExpectation:
        """What the node's labels and earlier screenings say its fingerprint should be."""
        snapshot = view.nodes.get(test.spec.node_name)
        earlier = [
            t.known.facts.fingerprint
            for t in view.tests.get(test.spec.node_name, [])
            if t.known is not None and t.name != test.metadata.name
        ]
        return NodeExpectation.of(snapshot.labels if snapshot else {}, earlier)

    def _baseline_specs(self, view: FleetView) -> dict[str, SDCBaselineSpec]:
        return baselines.bound_baselines({name: b.spec for name, b in view.baselines.items()})

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
        current = view.baselines.get(name)
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
        if current is None:
            baseline = SDCBaseline(metadata=ObjectMeta(name=name), spec=update.spec)
            self.writer.create_custom("sdcbaselines", to_body(baseline))
        elif update.spec != current.spec:
            self.writer.patch_custom("sdcbaselines", name, {"spec": to_body(update.spec)})
        self.writer.patch_custom_status("sdcbaselines", name, to_body(update.status))
        view.baselines[name] = SDCBaseline(
            metadata=ObjectMeta(name=name), spec=update.spec, status=update.status
        )
        log.info(
            "baseline candidate", baseline=name, node=test.spec.node_name, message=update.message
        )
        for suspect in update.suspects:
            self._report_suspect(suspect, f"digests disagree with baseline {name[:20]}", view)
        return update.spec if update.became_trusted else None

    def _report_suspect(self, node: str, why: str, view: FleetView) -> None:
        """Mark a node suspect the way a workload would (the lifecycle takes it from there)."""
        body = view.nodes.get(node)
        if body is None or keys.REQUEST_SUSPECT in body.annotations:
            return
        self._node_patch.annotate(node, annotation_plan([(keys.REQUEST_SUSPECT, why)]))

    def advance_test(
        self,
        policy: SDCPolicy,
        test: SDCTest,
        node: NodeFacts | None,
        node_body: NodeSnapshot | None,
        view: FleetView,
        now: dt.datetime,
        counts: Counter[str],
    ) -> SDCTest:
        """Move one unfinished test along one row of ``testphase.TEST_TRANSITIONS``;
        returns the test as it is now."""
        status = test.status or SDCTestStatus()
        if status.suite is None and node is not None and not status.phase.finished:
            # A hand-written test that names no suite gets the one the operator would run.
            before = node.qualified_at is not None or node.state not in (
                None,
                NodeState.UNQUALIFIED,
            )
            chosen = test.spec.suite or unnamed_suite(before)
            status = status.model_copy(update={"suite": chosen})
            test = test.model_copy(update={"status": status})
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
        if node is not None and node.current_test not in (None, test.metadata.name):
            # The reservation is another test's: this one waits for it to end, and is
            # adopted then (the node's decision says so on the test and the node).
            reserved = False
        # A node that is there but no longer this policy's (its labels or the selectors
        # changed) ends the test Cancelled: no result, no back-off, its new owner screens.
        event = phase_event(
            status.phase,
            node_exists=node_body is not None,
            owned=node is not None,
            reserved=reserved,
            verdict=judgement.verdict if judgement else None,
            awaiting_baseline=awaiting,
        )
        if event is None:
            return test
        row = phase_transition(status.phase, event)
        verdict, reason = Verdict.INCONCLUSIVE, "NodeGone"
        if node_body is None:
            message = f"node {test.spec.node_name} no longer exists"
        else:  # the Node is there, but this policy no longer selects it
            reason, message = policy_change_ending(
                test.spec.node_name, policy.metadata.name, PolicyChange.NODE_LEFT_POLICY
            )
        if judgement is not None:
            verdict, reason, message = judgement.verdict, judgement.reason, judgement.message
        finished: SDCTest | None = None
        for step in Plan.of(row.actions).steps:  # all in the objects stage, in row order
            match step:
                case CreateJob():
                    assert node is not None and node_body is not None
                    self._end_predecessors(test, view, counts)
                    data = _data_seed_of(test, view)
                    request = self.probe_request(policy, test, node, node_body, data)
                    sealing = self.attestation(test)
                    if sealing is not None:
                        # The nonce and key exist from now on, for this Job's Pod alone.
                        self.writer.create_secret(
                            build_attestation_secret(
                                test.metadata.name,
                                str(test.metadata.uid or ""),
                                self.settings.namespace,
                                sealing.secret_data(),
                            )
                        )
                        request = replace(
                            request,
                            attestation_secret=attestation_secret_name(test.metadata.name),
                        )
                    for device_class, _ in request.dra_claims:
                        # Made once per class and kept (a 409 from then on).
                        self.writer.create_claim_template(
                            build_claim_template(self.settings.namespace, device_class)
                        )
                    manifest = build_probe_job(request)
                    self.writer.create_job(manifest)
                    counts["jobs-created"] += 1
                case DeleteJob():
                    self.writer.delete_job(self.settings.namespace, job_name(test.metadata.name))
                    counts["jobs-deleted"] += 1
                case MarkAwaitingBaseline():
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
                        self.write_status(test, status)
                case WriteStatus() if row.target == SDCTestPhase.RESERVING:
                    status = status.model_copy(update={"phase": SDCTestPhase.RESERVING})
                    self.write_status(test, status)
                case WriteStatus() if row.target == SDCTestPhase.RUNNING:
                    status = self._running_status(test, status, now, _data_seed_of(test, view))
                    status = status.model_copy(
                        update=running_fields(policy.spec, suite_of(test), now)
                    )
                    self.write_status(test, status)
                case WriteStatus():
                    if judgement is not None:
                        self._count_judgement(judgement, finished_at, now)
                        status = status.model_copy(
                            update={
                                "checks": judgement.check_statuses(),
                                "fingerprint_hash": (
                                    judgement.fingerprint.hash if judgement.fingerprint else None
                                ),
                                "device_ids": list(judgement.devices),
                            }
                        )
                        status = record_catch(status, judgement, now)
                    ended = row.target if event == TestEvent.POLICY_CHANGED else None
                    finished = self._finish(
                        test, status, verdict, reason, message, now, counts, phase=ended
                    )
                case _:
                    raise ValueError(f"{type(step).__name__} is not an SDCTest step")
        if finished is not None:
            return finished
        return test.model_copy(update={"status": status})

    def end_by_policy_change(
        self,
        policy: str,
        test: SDCTest,
        change: PolicyChange,
        now: dt.datetime,
        counts: Counter[str],
    ) -> SDCTest:
        """End an unfinished test that ``policy`` no longer owns, by its row of the phase
        table (``PolicyChanged``: Cancelled, no verdict, its Job deleted); a finished test
        is returned as it is."""
        status = test.status or SDCTestStatus()
        if status.phase.finished:
            return test
        row = phase_transition(status.phase, TestEvent.POLICY_CHANGED)
        reason, message = policy_change_ending(test.spec.node_name, policy, change)
        finished = test
        for step in Plan.of(row.actions).steps:
            match step:
                case DeleteJob():
                    self.writer.delete_job(self.settings.namespace, job_name(test.metadata.name))
                    counts["jobs-deleted"] += 1
                case WriteStatus():
                    finished = self._finish(
                        test,
                        status,
                        Verdict.INCONCLUSIVE,
                        reason,
                        message,
                        now,
                        counts,
                        phase=row.target,
                    )
                case _:
                    raise ValueError(f"{type(step).__name__} is not a policy change's step")
        return finished

    def _end_predecessors(self, test: SDCTest, view: FleetView, counts: Counter[str]) -> None:
        """Delete the still-active probe Jobs of the node's finished tests, so a new test
        never waits behind the Pod of one that ended (a Job left by an older release, or
        one whose delete did not get through).

        A Job whose Pods have all ended holds nothing and stays for its logs and the
        termination message its verdict came from: the Job controller marks it Failed
        a moment after its Pod ends, and a confirmation test starts in that moment."""
        node = test.spec.node_name
        for body in view.tests.get(node, []):
            known = self._known.read(body, node)
            if known is None or known.name == test.metadata.name or known.running is not None:
                continue
            job = view.probe_jobs.get(known.name)
            if job is None or job.complete or job.failed_reason:
                continue
            pods = view.probe_pods.get(known.name, [])
            if pods and all(p.phase in ("Succeeded", "Failed") for p in pods):
                continue
            self.writer.delete_job(self.settings.namespace, job.name)
            counts["jobs-deleted"] += 1
            log.info("probe Job of an ended test deleted", job=job.name, test=known.name, node=node)

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
        self, test: SDCTest, status: SDCTestStatus, now: dt.datetime, data: int
    ) -> SDCTestStatus:
        name = test.metadata.name
        conditions = set_condition(
            status.conditions,
            "JobCreated",
            "True",
            "JobCreated",
            f"probe Job {self.settings.namespace}/{job_name(name)}",
            now,
        )
        return status.model_copy(
            update={
                "phase": SDCTestPhase.RUNNING,
                "seed": _seed_of(test),
                "data_seed": data,
                "job_name": job_name(name),
                "start_time": now,
                "conditions": _not_waiting(conditions, "Started", "the probe Job is created", now),
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
        phase: SDCTestPhase | None = None,
    ) -> SDCTest:
        """Write the test's end: the verdict's phase, or ``phase`` where the row says
        (Cancelled by a policy change, which records no verdict)."""
        phase = phase or verdict_phase(verdict)
        cancelled = phase == SDCTestPhase.CANCELLED
        conditions = set_condition(
            status.conditions, "Complete", "True", reason or verdict.value, bounded(message), now
        )
        conditions = [c for c in conditions if c.type != "AwaitingBaseline"]
        conditions = _not_waiting(conditions, "Finished", "the test has ended", now)
        status = status.model_copy(
            update={
                "phase": phase,
                "verdict": None if cancelled else verdict,
                "reason": (reason or verdict.value)[:64],
                "message": bounded(message, 4096),
                "completion_time": now,
                "conditions": conditions,
            }
        )
        self.write_status(test, status)
        counts[f"tests-{phase.value.lower()}"] += 1
        self.metrics.tests.labels(suite=suite_of(test).value, phase=phase.value).inc()
        if status.catch_target_met is False:  # never silent: counted, and on the test
            self.metrics.catch_shortfalls.labels(suite=suite_of(test).value).inc()
        if status.start_time is not None:
            self.metrics.screening_duration.labels(suite=suite_of(test).value).observe(
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

    def write_status(self, test: SDCTest, status: SDCTestStatus) -> None:
        """Write the test's status; a pass goes on from it until the watch brings it back."""
        try:
            self.writer.patch_custom_status("sdctests", test.metadata.name, to_body(status))
        except ApiException as exc:
            if exc.status != 404:
                raise
        self._expectations.wrote_test(test, status)
