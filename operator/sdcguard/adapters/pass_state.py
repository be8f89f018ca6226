"""What one reconcile pass works on, and what passes remember between them: the view
of the indexes, the per-policy memory and its pool ledger, parsed tests, urgent work,
and the small collaborators the reconciler's parts share (:class:`Expectations`,
:class:`KnownTests`, :class:`NodeDeletePermission`, :class:`LazyDeviceTaints`), each
the one owner of its state."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import structlog
from pydantic import ValidationError

from sdcguard.adapters import observe
from sdcguard.adapters.devicetaints import DeviceTaints
from sdcguard.adapters.hardware import HardwareRecord
from sdcguard.adapters.kube import KubeWriter
from sdcguard.api import (
    NextNode,
    SDCBaseline,
    SDCPolicy,
    SDCTest,
    SDCTestPhase,
    SDCTestStatus,
    Verdict,
)
from sdcguard.domain import breaker as breaker_mod
from sdcguard.domain.budgets import PoolMember, PoolUsage, add_member
from sdcguard.domain.observed import NodeSnapshot, Observed, Share, TestFacts
from sdcguard.domain.selection import Selector

log = structlog.get_logger("sdcguard.reconcile")

_V = TypeVar("_V")

AWAITING_BASELINE_REASONS = ("BaselineAbsent", "NoTrustedBaseline", "BaselinePending")
PROBE_VANISHED_GRACE = dt.timedelta(seconds=120)
REQUEUE_MAX_SECONDS = 3600.0
STATUS_EVERY = dt.timedelta(seconds=5)
TICKET_STATUS_GRACE = dt.timedelta(seconds=30)
"""A new ticket's own status write lands well within this; after it, one is missing."""
HISTORY_GRACE = dt.timedelta(seconds=30)
"""A decision's hardware history, written just after its node patch, is in the records
well within this; after it, one is missing (the operator stopped in between)."""
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _has_outcome(observed: Observed) -> bool:
    """The node's current test has finished: its decision releases, quarantines or
    re-runs, and is applied before any new start."""
    return observed.test is not None and observed.test.finished


@dataclass
class FleetView:
    """A consistent copy of the indexes for one pass."""

    nodes: dict[str, NodeSnapshot]
    busy: dict[str, list[observe.PodUse]] = field(default_factory=dict)
    pending: list[observe.PendingDemand] = field(default_factory=list)
    probe_pods: dict[str, list[observe.ProbePod]] = field(default_factory=dict)
    probe_jobs: dict[str, observe.ProbeJob] = field(default_factory=dict)
    tests: dict[str, list[TestSnapshot]] = field(default_factory=dict)
    tickets: dict[str, list[observe.TicketSnapshot]] = field(default_factory=dict)
    baselines: dict[str, SDCBaseline] = field(default_factory=dict)
    """Every readable SDCBaseline, parsed once by the index handler."""
    last_busy: dict[str, dt.datetime] = field(default_factory=dict)
    operator_started: dt.datetime | None = None
    policies: dict[str, Selector] = field(default_factory=dict)
    """Every policy's name and selector matchLabels (one policy owns each node)."""
    complete: bool = True
    """False: only some nodes' entries (urgent work), enough to decide just those."""
    workloads_known: bool = True
    """False: the workload Pods have not listed completely yet (a start or restart on a
    big fleet), so ``busy``, ``pending`` and ``last_busy`` may miss Pods; only nodes
    whose current test has finished are decided (see ``Reconciler._observe``)."""
    hardware: dict[str, HardwareRecord] = field(default_factory=dict)
    """Every readable SDCHardware by name (only failing hardware has one)."""
    id_holders: Callable[[NodeSnapshot], Mapping[str, Sequence[str]]] = lambda _: {}
    """For a Node's host identifiers, every Node of the fleet that holds each one (read
    from the fleet copy when asked: only nodes with hardware to identify ask)."""

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
            workloads_known=self.workloads_known and newer.workloads_known,
            hardware=newer.hardware,
            id_holders=newer.id_holders,
        )


@dataclass
class PoolLedger:
    """Every owned node's share of its pool's usage, and their sums by pool, kept equal
    as nodes are set and forgotten (a pass reads the sums, never recounts the fleet)."""

    members: dict[str, PoolMember] = field(default_factory=dict)
    """Every owned node's share of its pool's usage, as last decided."""
    usage: dict[str, PoolUsage] = field(default_factory=dict)
    """``members`` summed by pool."""

    def set_member(self, node: str, member: PoolMember) -> None:
        old = self.members.get(node)
        if old is not None:
            add_member(self.usage, old, -1)
        self.members[node] = member
        add_member(self.usage, member)

    def usage_without(
        self, nodes: Iterable[str], between: Callable[[], None] | None = None
    ) -> dict[str, PoolUsage]:
        """Pool usage of every node but ``nodes`` (``between`` is called every 256 of
        them: a full pass takes the whole fleet out)."""
        usage = dict(self.usage)
        for count, node in enumerate(nodes):
            if between is not None and count % 256 == 255:
                between()
            member = self.members.get(node)
            if member is not None:
                add_member(usage, member, -1)
        return usage

    def forget(self, node: str) -> None:
        member = self.members.pop(node, None)
        if member is not None:
            add_member(self.usage, member, -1)


@dataclass
class PolicyMemory:
    """What earlier passes learned about one policy's nodes, so that a pass can decide
    only the nodes whose observations changed (or whose time came) and still keep the
    pool budgets over all of them. Losing it costs one full pass, nothing else."""

    pools: PoolLedger = field(default_factory=PoolLedger)
    """Every owned node's share of its pool's budgets, and their sums."""
    waiting: dict[str, tuple[tuple[object, ...], str]] = field(default_factory=dict)
    """Nodes with a test due but no budget: node -> (place in the budget order, pool)."""
    due: dict[str, dt.datetime] = field(default_factory=dict)
    """When each node asked to be decided again."""
    states: dict[str, str] = field(default_factory=dict)
    status_at: dt.datetime | None = None
    """When the policy's status was last brought up to date."""
    illegal: dict[str, str] = field(default_factory=dict)
    """Nodes whose last decision hit a (state, event) pair outside the table."""
    held: set[str] = field(default_factory=set)
    """Nodes whose confirmed failure the open breaker holds."""
    overlaps: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    """Nodes this policy selects that other policies select too: node -> (the owner,
    every policy that selects it)."""
    overdue: set[str] = field(default_factory=set)
    """Qualified nodes whose qualification is older than maxQualificationAge."""
    mode: str | None = None
    """The policy's mode as the last pass of its own loop saw it."""
    enforced_since: dt.datetime | None = None
    """When this operator saw the policy switch from Observe to Enforce (None: in Observe,
    or no switch seen since it started)."""
    overtaken: dict[str, int] = field(default_factory=dict)
    """Routine nodes waiting for budget: routine screenings of their pool started since
    they began to wait (the risk order's starvation counter)."""
    budget_order: list[NextNode] = field(default_factory=list)
    """The waiting nodes first in the budget order, with why, as of the last full pass."""

    def forget(self, node: str) -> None:
        self.pools.forget(node)
        self.overdue.discard(node)
        tables = (self.waiting, self.due, self.states, self.illegal, self.overlaps)
        for table in (*tables, self.overtaken):
            table.pop(node, None)
        self.held.discard(node)


class SharedValues:
    """Equal immutable values kept once (:class:`observed.Share`): a finished test's
    check names, device IDs, fingerprint and policy repeat those of thousands of other
    tests, and each decoded body would otherwise hold its own copies. Holds at most
    ``limit`` values, and starts again empty when full (a value kept twice then is only
    memory, never a wrong answer). The mirrors' threads share it: a dict's get and set
    are atomic."""

    def __init__(self, limit: int = 65_536) -> None:
        self._limit = limit
        self._kept: dict[Any, Any] = {}

    def __call__(self, value: _V, /) -> _V:
        found = self._kept.get(value)
        if found is not None:
            return found  # type: ignore[no-any-return]
        if len(self._kept) >= self._limit:
            self._kept.clear()
        self._kept[value] = value
        return value

    def __len__(self) -> int:
        return len(self._kept)


SHARED = SharedValues()
"""The operator's one table: every copy of the SDCTests (leader's, standby's) shares it."""


@dataclass(frozen=True, slots=True)
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
    def of(cls, test: SDCTest, share: Share = SHARED) -> KnownTest:
        facts = TestFacts.from_api(test, share)
        return cls(
            name=test.metadata.name,
            policy=share(test.spec.policy_ref),
            created=test.metadata.creation_timestamp or _EPOCH,
            facts=facts,
            running=None if facts.finished else test,
        )


FINISHED_PHASES = frozenset(p.value for p in SDCTestPhase if p.finished)
KEPT_FINISHED_STATUS = (
    "phase",
    "verdict",
    "reason",
    "message",
    "startTime",
    "completionTime",
    "fingerprintHash",
    "jobName",
    "deviceIDs",
    "dataSeed",  # a confirmation re-run repeats it
    "catchTargetMet",  # the policy's CatchTargetMet condition counts the shortfalls
    "catchShortfall",
)
KEPT_CHECK_FIELDS = (
    "name",
    "verdict",
    "oddDevice",
    "firstDivergentStep",
    "firstDivergentSubmodule",
    "catchChance",  # the risk order's credit for a pass
)


def trim_test(body: Mapping[str, Any]) -> dict[str, Any]:
    """An SDCTest as the operator reads it: a finished one keeps its outcome and each
    check's name, verdict and where it located a fault (for the RepairTicket), not
    digests, metrics or conditions (kubectl shows those)."""
    trimmed = observe.trim_own(body)
    status = trimmed.get("status") or {}
    if isinstance(status, Mapping) and status.get("phase") in FINISHED_PHASES:
        kept = {k: status[k] for k in KEPT_FINISHED_STATUS if k in status}
        kept["checks"] = [
            {k: c[k] for k in KEPT_CHECK_FIELDS if k in c}
            for c in status.get("checks") or []
            if isinstance(c, dict)
        ]
        trimmed["status"] = kept
    return trimmed


@dataclass(frozen=True, slots=True)
class TestSnapshot:
    """An SDCTest as the operator's copy keeps it, made once per change of it: its
    :class:`KnownTest` (only the facts once it is finished), or None with ``error`` when
    it does not validate; ``node_name`` is its spec's node (read from the raw body, so an
    unreadable test is still filed under its node)."""

    __test__ = False  # not a pytest test class

    name: str
    resource_version: str = ""
    known: KnownTest | None = None
    error: str = ""
    node_name: str = ""

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> TestSnapshot:
        meta = body.get("metadata") or {}
        name, rv = str(meta.get("name", "")), str(meta.get("resourceVersion") or "")
        spec = body.get("spec")
        node = str(spec.get("nodeName") or "") if isinstance(spec, Mapping) else ""
        try:
            test = SDCTest.model_validate(body)
        except ValidationError as exc:
            return cls(name, rv, None, str(exc)[:300], node)
        return cls(name, rv, KnownTest.of(test), node_name=node)

    @classmethod
    def slim(cls, body: Mapping[str, Any]) -> TestSnapshot:
        """The snapshot of a body as listed or watched: trimmed first (:func:`trim_test`),
        so a finished test keeps only its facts."""
        return cls.from_body(trim_test(body))


@dataclass(frozen=True)
class UrgentWork:
    """Nodes whose probe just ended, with the view they were seen in: served between
    the steps of a longer pass, so a finished test never waits behind one."""

    policy: SDCPolicy
    """The policy as parsed once when its body changed (never re-read per pass)."""
    view: FleetView
    nodes: frozenset[str]
    now: dt.datetime
    """When the view was taken: the time the urgent pass decides at (no hidden clock)."""


NODE_DELETE_RECHECK = dt.timedelta(minutes=5)
"""How long the answer to "may we delete Nodes?" is trusted (RBAC may change)."""


class Expectations:
    """Writes the watch has not brought back yet (controller-runtime's "expectations"):
    until it does, a pass skips the node, and goes on from the test as it was written,
    so two passes in quick succession never act twice on one observation."""

    def __init__(self) -> None:
        self.nodes: dict[str, str] = {}
        """Node name -> the resourceVersion it had when we last patched it."""
        self.tests: dict[str, tuple[str, SDCTest]] = {}
        """SDCTest name -> (resourceVersion before our status write, the test as written)."""

    def wrote_node(self, name: str, resource_version: str) -> None:
        self.nodes[name] = resource_version

    def node_pending(self, name: str, resource_version: str) -> bool:
        """Our last patch of the node has not come back (forgotten once it has)."""
        expected = self.nodes.get(name)
        if expected is None:
            return False
        if expected == resource_version:
            return True
        del self.nodes[name]
        return False

    def wrote_test(self, before: SDCTest, status: SDCTestStatus) -> None:
        if before.metadata.resource_version:
            written = before.model_copy(update={"status": status})
            self.tests[before.metadata.name] = (before.metadata.resource_version, written)

    def written_test(self, name: str, resource_version: str) -> SDCTest | None:
        """The test as we wrote it, while the copy at ``resource_version`` predates it."""
        expected = self.tests.get(name)
        return expected[1] if expected is not None and expected[0] == resource_version else None

    def settle_test(self, test: SDCTest) -> SDCTest:
        """``test``, or the test as we wrote it while the watch has not brought that back;
        forgets the write once it has."""
        written = self.written_test(test.metadata.name, test.metadata.resource_version or "")
        if written is not None:
            return written
        self.tests.pop(test.metadata.name, None)
        return test


class KnownTests:
    """The SDCTests the passes have read: each test's node (events name only the test),
    and each policy's circuit-breaker samples, noted once per resourceVersion."""

    __test__ = False  # not a pytest test class

    def __init__(self) -> None:
        self.nodes: dict[str, str] = {}
        """SDCTest name -> node name."""
        self._noted: dict[str, str] = {}
        """SDCTest name -> the resourceVersion its sample and node were noted at."""
        self._sweeps: dict[str, breaker_mod.Sweep] = {}
        """Each policy's breaker samples: its finished screenings (Pass or SDC), kept as
        tests are read, and swept as they come (see ``breaker.Sweep``)."""
        self._sample_owner: dict[str, str] = {}
        """SDCTest name -> the policy whose sweep holds its sample."""
        self._shortfalls: dict[str, dict[str, tuple[dt.datetime, str]]] = {}
        """Policy -> its finished screenings that fell short of the catch target: test
        name -> (completion time, what fell short)."""

    def read(self, seen: TestSnapshot, node_name: str) -> KnownTest | None:
        """The test as the index keeps it (None: unreadable); its node and its breaker
        sample are noted once per resourceVersion."""
        rv = seen.resource_version
        if self._noted.get(seen.name) != rv or not rv:
            if seen.known is None:
                log.warning("unreadable SDCTest skipped", node=node_name, error=seen.error)
            else:
                self.nodes[seen.name] = node_name
            self.note_sample(seen.name, node_name, seen.known)
            self._noted[seen.name] = rv
        return seen.known

    def note_sample(self, name: str, node_name: str, known: KnownTest | None) -> None:
        facts = known.facts if known is not None else None
        sample = None
        if (
            known is not None
            and facts is not None
            and facts.completed_at is not None
            and facts.verdict in (Verdict.PASS, Verdict.SDC)
        ):
            sample = (
                known.policy,
                breaker_mod.Sample(
                    facts.completed_at,
                    facts.verdict == Verdict.SDC,
                    node_name,
                    name,
                    facts.named_devices,
                ),
            )
        owner = self._sample_owner.get(name)
        if owner is not None and (sample is None or sample[0] != owner):
            self._sweeps[owner].remove(name)
            del self._sample_owner[name]
        if sample is not None:
            self._sample_owner[name] = sample[0]
            self.sweep(sample[0]).add(name, sample[1])
        self._note_shortfall(name, known)

    def _note_shortfall(self, name: str, known: KnownTest | None) -> None:
        for held in self._shortfalls.values():
            held.pop(name, None)
        facts = known.facts if known is not None else None
        if (
            known is not None
            and facts is not None
            and facts.completed_at is not None
            and facts.catch_shortfall is not None
        ):
            held = self._shortfalls.setdefault(known.policy, {})
            held[name] = (facts.completed_at, facts.catch_shortfall)

    def shortfalls(
        self, policy: str, now: dt.datetime, window: dt.timedelta
    ) -> list[tuple[str, dt.datetime, str]]:
        """The policy's screenings that fell short of the catch target within ``window``
        before ``now`` as (test, completion time, what fell short), oldest first; older
        ones are forgotten."""
        held = self._shortfalls.get(policy, {})
        for name in [n for n, (at, _) in held.items() if now - at > window]:
            del held[name]
        return sorted(((n, at, why) for n, (at, why) in held.items()), key=lambda x: x[1])

    def sweep(self, policy: str) -> breaker_mod.Sweep:
        """The policy's breaker samples (made empty at first use)."""
        found = self._sweeps.get(policy)
        if found is None:
            found = self._sweeps[policy] = breaker_mod.Sweep()
        return found

    def prune(self, view: FleetView) -> None:
        """Forget the tests the view no longer has (full passes only)."""
        tests = {t.name for snapshots in view.tests.values() for t in snapshots}
        for name in [n for n in self._noted if n not in tests]:
            del self._noted[name]
            self.nodes.pop(name, None)
            owner = self._sample_owner.pop(name, None)
            if owner is not None:
                self._sweeps[owner].remove(name)
            for held in self._shortfalls.values():
                held.pop(name, None)

    def judged(
        self, view: FleetView, node: str, expectations: Expectations
    ) -> dict[str, TestFacts]:
        """The node's tests' facts, as this pass judged them (a verdict written in this
        pass counts before the watch brings it back)."""
        by_name: dict[str, TestFacts] = {}
        for body in view.tests.get(node, []):
            known = self.read(body, node)
            if known is None:
                continue
            written = expectations.written_test(known.name, body.resource_version)
            by_name[known.name] = TestFacts.from_api(written) if written else known.facts
        return by_name


class NodeDeletePermission:
    """Whether our ServiceAccount may delete Nodes (SelfSubjectAccessReview), asked again
    after NODE_DELETE_RECHECK: read by the policy's NodeDeletePermitted condition and by
    the executor before a decision that deletes a Node."""

    def __init__(self, writer: KubeWriter) -> None:
        self._writer = writer
        self._asked: tuple[dt.datetime, bool | None] | None = None

    def allowed(self, now: dt.datetime) -> bool | None:
        """Whether the operator may delete Nodes (None: the review itself failed)."""
        cached = self._asked
        if cached is not None and now - cached[0] < NODE_DELETE_RECHECK:
            return cached[1]
        allowed = self._writer.may("delete", "nodes")
        self._asked = (now, allowed)
        return allowed


class LazyDeviceTaints:
    """DRA reads and DeviceTaintRule writes, made at first use: only policies of
    quarantine scope Device need them."""

    def __init__(self, writer: KubeWriter) -> None:
        self._writer = writer
        self._made: DeviceTaints | None = None

    def get(self) -> DeviceTaints:
        if self._made is None:
            self._made = DeviceTaints(self._writer.api, allow=self._writer.allow)
        return self._made
