"""A discrete-event fleet: workloads, fault onsets, reports, screenings and repairs over
simulated months, scheduled by the operator's own pure code with an injected clock.

What comes from sdcguard (nothing of it is re-implemented here):

- the policy: ``SDCPolicySpec`` and its defaults (triggers, budgets, probe budget,
  confirmation, repair cycles), durations through ``parse_duration``;
- budgets: every reservation asks ``domain.budgets.can_reserve`` with the pool's
  ``PoolUsage``;
- confirmation: ``domain.breaker.failures_to_confirm`` says how many failing runs
  quarantine a node;
- the catch chance of a screening: the probe's planner (``sdcprobe.config.plan_rounds``
  and ``catch_probability``) at the probe's measured round costs and the policy's
  budget;
- the order: today's (``domain.risk.todays_key``, the order of ``scheduling.priority``) or
  the risk order (``domain.risk.rank_due_nodes``), fed with what the simulated fleet
  measured, as the operator would.

What is modelled (assumptions, stated in the results): per node, jobs follow idle gaps
(long gang-sized jobs and short ones); a node is screened only in an idle window; fault
onsets arrive per node at its hardware type's rate, raised on hosts that were repaired;
a report from a job running with the training library arrives at a stated rate while
the fault is active and ends that job; repairs fail at a stated rate. Gang jobs are
not coordinated across nodes (each node draws its own), and the circuit breaker never
trips at these failure rates, so it is not modelled.
"""

from __future__ import annotations

import datetime as dt
import functools
import heapq
import math
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from sdcguard.api import SDCPolicySpec, parse_duration
from sdcguard.domain.breaker import failures_to_confirm
from sdcguard.domain.budgets import PoolUsage, can_reserve
from sdcguard.domain.risk import RiskInputs, RiskOrder, TypeHistory, rank_due_nodes, todays_key
from sdcprobe.config import catch_probability, plan_rounds

EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
HOUR = 3600.0


@dataclass(frozen=True)
class HardwareType:
    name: str
    share: float
    onsets_per_node_year: float


@dataclass(frozen=True)
class Model:
    """The fleet and its faults (the assumptions every policy shares)."""

    nodes: int = 2000
    days: float = 180.0
    types: tuple[HardwareType, ...] = (
        HardwareType("type-a", 0.55, 0.1),
        HardwareType("type-b", 0.30, 0.3),
        HardwareType("type-c", 0.15, 1.2),
    )
    repaired_rate_factor: float = 3.0
    """A host that came back from repair starts faults this many times as often."""
    repair_fail: float = 0.25
    repair_hours: float = 72.0
    gang_share: float = 0.25
    gang_hours: float = 240.0
    short_hours: float = 4.0
    gap_hours: float = 3.0
    library_share: float = 0.6
    """Jobs running with the training library (sdctrain)."""
    report_rate: float = 0.5
    """Reports per busy hour from a library job on a node whose fault is always active."""
    false_report_rate: float = 1e-5
    """Reports per library job-hour on a healthy node."""
    false_fail: float = 1e-4
    """A healthy screening's chance of an SDC verdict (confirmation re-runs it)."""
    kinds: tuple[tuple[str, float], ...] = (
        ("persistent", 0.4),
        ("intermittent", 0.35),
        ("data-dependent", 0.25),
    )
    intermittent_round_p: float = 0.1
    data_round_p: float = 0.01
    screen_overhead_s: float = 180.0
    """Reservation, Pod start and judging around the probe's budget."""
    pass_minutes: float = 60.0
    """The operator's periodic pass; a finished test, a node falling due, a report and a
    repair also wake it, as their watch events do."""
    # Round costs and start-up: the probe benchmark's 60 s CPU run (bench/results/
    # probe.json); pass a device's own to plan at its speed.
    round_ms: tuple[tuple[str, float], ...] = (
        ("compute", 73.1),
        ("collective", 219.2),
        ("memory", 132.3),
        ("golden", 146.0),
    )
    startup_s: float = 12.3


@dataclass(frozen=True)
class Policy:
    name: str
    spec: SDCPolicySpec
    risk: bool = False
    library: bool = True
    pools: bool = False
    """Pool by hardware type (the guide's ``poolLabel: node.kubernetes.io/instance-type``)."""


class St(IntEnum):
    QUALIFIED = 0
    TESTING = 1
    SUSPECT = 2
    QUARANTINED = 3
    VERIFYING = 4
    UNQUALIFIED = 5


@dataclass
class Episode:
    node: int
    kind: str
    onset: float
    active: float
    """Fraction of time (intermittent) or of fresh data (data-dependent) it shows."""
    exposure: float = 0.0
    floor: float | None = None
    """Exposure by the end of the job running at onset (or a report): hours no
    screening order can remove, since a node is screened only between jobs."""
    quarantined: float | None = None
    by: str = ""


@dataclass
class Node:
    idx: int
    type: str
    pool: str
    state: St = St.UNQUALIFIED
    token: int = 0
    busy: bool = False
    job_start: float = 0.0
    job_end: float = 0.0
    job_library: bool = False
    idle_since: float = 0.0
    qualified_at: float | None = None
    last_screen_end: float = 0.0
    episode: Episode | None = None
    repairs: int = 0
    cycles: int = 0
    reports: list[float] = field(default_factory=list)
    work_rng: random.Random = field(default_factory=random.Random)
    fault_rng: random.Random = field(default_factory=random.Random)
    """Per node, so every policy sees the same workloads and onsets in the same order
    on each node (common random numbers: differences are the policy's, less noise)."""
    overtaken: int = 0
    due_since: float | None = None
    pending_job: bool = False
    confirming: bool = False
    test_tier: int = 4


class Ev(IntEnum):
    JOB_START = 0
    JOB_END = 1
    ONSET = 2
    REPORT = 3
    SCREEN_END = 4
    REPAIR_DONE = 5
    DUE = 6


@dataclass
class Outcome:
    policy: str
    episodes: list[Episode]
    screening_hours: float
    screenings: int
    false_quarantines: int
    quarantines: int
    horizon: float
    busy_hours: float
    catch: dict[str, float]
    history: dict[str, tuple[int, int, float]]
    """Per hardware type: screenings, failures, service hours, as the fleet measured."""

    def summary(self) -> dict[str, Any]:
        exposures = sorted(e.exposure for e in self.episodes)
        caught = [e for e in self.episodes if e.quarantined is not None]
        by: dict[str, int] = {}
        for e in caught:
            by[e.by] = by.get(e.by, 0) + 1
        return {
            "policy": self.policy,
            "faults": len(self.episodes),
            "exposure_mean_h": round(statistics.fmean(exposures), 2) if exposures else 0.0,
            "exposure_p50_h": round(_quantile(exposures, 0.5), 2),
            "exposure_p95_h": round(_quantile(exposures, 0.95), 2),
            "floor_mean_h": round(
                statistics.fmean(e.exposure if e.floor is None else e.floor for e in self.episodes),
                2,
            )
            if self.episodes
            else 0.0,
            "never_caught": len(self.episodes) - len(caught),
            "screening_node_hours": round(self.screening_hours, 1),
            "screenings": self.screenings,
            "quarantines": self.quarantines,
            "false_quarantines": self.false_quarantines,
            "caught_by": dict(sorted(by.items())),
            "busy_share": round(self.busy_hours / (self.horizon * 1.0), 4),
        }


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    position = q * (len(values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (position - low)


def plan_catch(model: Model, budget_s: float) -> tuple[int, dict[str, float]]:
    """The probe's plan at the policy's budget: the smallest round count over the checks
    and the catch chance of a fault active in a fraction p of rounds."""
    round_s = {name: ms / 1000 for name, ms in model.round_ms}
    rounds = plan_rounds(round_s, budget_s - model.startup_s, {n: 1 for n in round_s})
    fewest = min(rounds.values())
    return fewest, {
        "intermittent_round_p": catch_probability(model.intermittent_round_p, fewest),
        "data_round_p": catch_probability(model.data_round_p, fewest),
        "p=0.1": catch_probability(0.1, fewest),
    }


class Fleet:
    """One policy over the model's horizon (single-threaded; ``seed`` fixes every draw)."""

    def __init__(self, model: Model, policy: Policy, seed: int) -> None:
        self.m, self.p = model, policy
        self.rng = random.Random(seed)
        # The fleet (types, install times) is the same for every policy; see Node.
        self.work_rng = random.Random(seed * 7 + 1)
        self.fault_rng = random.Random(seed * 7 + 2)
        spec = policy.spec
        self.horizon = model.days * 24
        self.idle_for = parse_duration(spec.triggers.on_return_from_use.idle_for) / HOUR
        self.return_from_use = spec.triggers.on_return_from_use.enabled
        age = spec.triggers.max_qualification_age
        self.max_age = None if age == "0" else parse_duration(age) / HOUR
        self.confirm = failures_to_confirm(spec.confirmation)
        self.max_cycles = spec.repair.max_repair_cycles
        self.screen_h = (spec.probe.budget_seconds + model.screen_overhead_s) / HOUR
        self.rounds, self.catch = plan_catch(model, float(spec.probe.budget_seconds))
        self.rates = {t.name: t.onsets_per_node_year / (365 * 24) for t in model.types}
        self.heap: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        self.nodes: list[Node] = []
        self.pool_nodes: dict[str, int] = {}
        self.pool_held: dict[str, int] = {}
        self.pool_tests: dict[str, int] = {}
        self.episodes: list[Episode] = []
        self.screening_hours = 0.0
        self.screenings = 0
        self.quarantines = 0
        self.false_quarantines = 0
        self.busy_hours = 0.0
        self.history: dict[str, list[float]] = {t.name: [0, 0, 0.0] for t in model.types}
        self.suspects: set[int] = set()
        self.verifying: set[int] = set()
        self.unqualified: set[int] = set()
        self.due: set[int] = set()
        """Idle qualified nodes whose trigger (return from use, expiry) has come."""
        weights = [t.share for t in model.types]
        for i in range(model.nodes):
            kind = self.work_rng.choices(model.types, weights)[0].name
            pool = kind if policy.pools else ""
            node = Node(
                i,
                kind,
                pool,
                work_rng=random.Random(seed * 1_000_003 + 2 * i),
                fault_rng=random.Random(seed * 1_000_003 + 2 * i + 1),
            )
            self.nodes.append(node)
            self.pool_nodes[pool] = self.pool_nodes.get(pool, 0) + 1
            self.pool_held.setdefault(pool, 0)
            self.pool_tests.setdefault(pool, 0)
            # Installed on a busy fleet: qualified long ago, at work or about to be.
            node.state = St.QUALIFIED
            node.qualified_at = -self.work_rng.uniform(0, 168)
            node.last_screen_end = node.qualified_at
            self._schedule_onset(node, 0.0)
            self._push(node.work_rng.uniform(0, model.gap_hours), Ev.JOB_START, node)

    # -- events --------------------------------------------------------------------

    def _push(self, at: float, ev: Ev, node: Node) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (at, self.seq, int(ev), node.idx, node.token))

    def _schedule_onset(self, node: Node, now: float) -> None:
        rate = self.rates[node.type] * (
            1 + (self.m.repaired_rate_factor - 1) * min(node.repairs, 1)
        )
        self._push(now + node.fault_rng.expovariate(rate), Ev.ONSET, node)

    def run(self) -> Outcome:
        step = self.m.pass_minutes / 60
        next_pass = 0.0
        heap = self.heap
        while True:
            at = heap[0][0] if heap else math.inf
            if next_pass <= at and next_pass < self.horizon:
                self._pass(next_pass)
                next_pass += step
                continue
            if at >= self.horizon:
                break
            _, _, ev, idx, token = heapq.heappop(heap)
            node = self.nodes[idx]
            if token != node.token and ev != Ev.ONSET:
                continue
            self._handle(Ev(ev), node, at)
        for node in self.nodes:
            if node.busy:
                self._end_job(node, self.horizon, record_idle=False)
        return Outcome(
            self.p.name,
            self.episodes,
            self.screening_hours,
            self.screenings,
            self.false_quarantines,
            self.quarantines,
            self.horizon * self.m.nodes,
            self.busy_hours,
            self.catch,
            {k: (int(v[0]), int(v[1]), float(v[2])) for k, v in self.history.items()},
        )

    def _handle(self, ev: Ev, node: Node, now: float) -> None:
        if ev == Ev.JOB_START:
            if node.state == St.TESTING:
                node.pending_job = True
            elif node.state == St.QUALIFIED:
                self._start_job(node, now)
        elif ev == Ev.JOB_END:
            self._end_job(node, now)
            self._push(now + node.work_rng.expovariate(1 / self.m.gap_hours), Ev.JOB_START, node)
        elif ev == Ev.ONSET:
            self._onset(node, now)
        elif ev == Ev.REPORT:
            self._report(node, now)
        elif ev == Ev.SCREEN_END:
            self._screen_end(node, now)
            self._pass(now)  # a finished test wakes the reconcile, as its watch event does
        elif ev == Ev.REPAIR_DONE:
            self._repair_done(node, now)
        elif ev == Ev.DUE and node.state == St.QUALIFIED and not node.busy:
            node.due_since = now
            self.due.add(node.idx)
            self._pass(now)

    def _start_job(self, node: Node, now: float) -> None:
        m = self.m
        mean = m.gang_hours if node.work_rng.random() < m.gang_share else m.short_hours
        node.busy, node.job_start = True, now
        node.job_end = now + node.work_rng.expovariate(1 / mean)
        node.job_library = self.p.library and node.work_rng.random() < m.library_share
        node.token += 1
        node.due_since = None
        self.due.discard(node.idx)
        self._push(node.job_end, Ev.JOB_END, node)
        self._schedule_report(node, now)

    def _end_job(self, node: Node, now: float, record_idle: bool = True) -> None:
        node.busy = False
        self.busy_hours += now - node.job_start
        e = node.episode
        if e is not None and e.quarantined is None:
            e.exposure += max(now - max(node.job_start, e.onset), 0.0)
            if e.floor is None:
                e.floor = e.exposure
        node.idle_since = now
        if record_idle and node.state == St.QUALIFIED:
            self._went_idle(node, now)

    def _report_rate(self, node: Node) -> float:
        if not node.job_library:
            return 0.0
        e = node.episode
        if e is None:
            return self.m.false_report_rate
        if e.kind == "persistent":
            return self.m.report_rate
        return self.m.report_rate * e.active

    def _schedule_report(self, node: Node, now: float) -> None:
        rate = self._report_rate(node)
        if rate > 0:
            at = now + self.rng.expovariate(rate)
            if at < node.job_end:
                self._push(at, Ev.REPORT, node)

    def _onset(self, node: Node, now: float) -> None:
        if node.state in (St.QUARANTINED, St.VERIFYING):
            # Out of service (a false quarantine): the onset waits for its return.
            self._schedule_onset(node, now)
            return
        names, weights = zip(*self.m.kinds, strict=True)
        kind = node.fault_rng.choices(names, weights)[0]
        active = 1.0 if kind == "persistent" else node.fault_rng.uniform(0.05, 0.4)
        node.episode = Episode(node.idx, kind, now, active, floor=None if node.busy else 0.0)
        self.episodes.append(node.episode)
        if node.busy:
            # The running job's report clock restarts with the fault.
            node.token += 1
            self._push(node.job_end, Ev.JOB_END, node)
            self._schedule_report(node, now)

    def _report(self, node: Node, now: float) -> None:
        # The library stops the job and the node becomes suspect (held, re-tested).
        self._end_job(node, now, record_idle=False)
        node.token += 1
        node.reports.append(now)
        self._set_state(node, St.SUSPECT)
        self.suspects.add(node.idx)
        self._pass(now)

    def _set_state(self, node: Node, state: St) -> None:
        held_before = node.state in (St.TESTING, St.SUSPECT, St.QUARANTINED, St.VERIFYING)
        held_after = state in (St.TESTING, St.SUSPECT, St.QUARANTINED, St.VERIFYING)
        self.pool_held[node.pool] += int(held_after) - int(held_before)
        node.state = state
        if state != St.QUALIFIED:
            self.due.discard(node.idx)

    # -- screenings ----------------------------------------------------------------

    def _went_idle(self, node: Node, now: float) -> None:
        """When the idle node's first trigger comes (as ``decide`` reads the policy's
        triggers): return from use ``idleFor`` after work, or expiry."""
        due = []
        if self.max_age is not None:
            due.append((node.qualified_at or 0.0) + self.max_age)
        used = node.qualified_at is None or node.idle_since > node.qualified_at
        if self.return_from_use and used:
            due.append(node.idle_since + self.idle_for)
        if due:
            self._push(max(min(due), now), Ev.DUE, node)

    def _pass(self, now: float) -> None:
        due: list[tuple[int, Node]] = []
        for idx in self.verifying:
            due.append((0, self.nodes[idx]))
        for idx in self.unqualified:
            due.append((1, self.nodes[idx]))
        for idx in self.suspects:
            due.append((2, self.nodes[idx]))
        routine = [self.nodes[idx] for idx in self.due]
        if not due and not routine:
            return
        budgets = self.p.spec.budgets
        if all(self.pool_tests[p] >= budgets.max_concurrent_tests for p in self.pool_tests):
            return  # nothing can start, so nothing is overtaken either
        ordered = self._order(due, routine, now)
        usage = {
            pool: PoolUsage(
                pool=pool,
                nodes=self.pool_nodes[pool],
                unavailable=self.pool_held[pool],
                tests=self.pool_tests[pool],
            )
            for pool in self.pool_nodes
        }
        started: dict[str, int] = {}
        waiting: list[Node] = []
        room = {p: budgets.max_concurrent_tests - u.tests for p, u in usage.items()}
        for tier, node in ordered:
            if room[node.pool] <= 0:
                if tier == 4:
                    waiting.append(node)
                continue
            takes = tier == 4
            check = can_reserve(usage[node.pool], budgets, takes_node=takes)
            if not check.allowed:
                if tier == 4:
                    waiting.append(node)
                continue
            usage[node.pool] = usage[node.pool].reserve(takes_node=takes)
            room[node.pool] -= 1
            self._start_screen(node, now, tier)
            if tier == 4:
                started[node.pool] = started.get(node.pool, 0) + 1
        for node in waiting:
            node.overtaken += started.get(node.pool, 0)

    def _order(
        self, due: list[tuple[int, Node]], routine: list[Node], now: float
    ) -> list[tuple[int, Node]]:
        inputs = [self._inputs(node, tier, now) for tier, node in due]
        inputs += [self._inputs(node, 4, now) for node in routine]
        by_name = {i.node: n for i, n in zip(inputs, [n for _, n in due] + routine, strict=True)}
        if self.p.risk:
            ranked = rank_due_nodes(inputs, self._history(), _clock(now), RiskOrder())
            return [(r.inputs.tier, by_name[r.inputs.node]) for r in ranked]
        return [(i.tier, by_name[i.node]) for i in sorted(inputs, key=todays_key)]

    def _inputs(self, node: Node, tier: int, now: float) -> RiskInputs:
        recent = sum(1 for t in node.reports if now - t < 30 * 24)
        return RiskInputs(
            node=f"n{node.idx:05d}",
            due_since=_clock(node.due_since if node.due_since is not None else now),
            tier=tier,
            qualified_at=_clock(node.qualified_at) if node.qualified_at is not None else None,
            last_pass_at=_clock(node.qualified_at) if node.qualified_at is not None else None,
            last_pass_catch=self.catch["p=0.1"],
            repairs=node.repairs,
            reports=recent,
            hardware_type=node.type,
            overtaken=node.overtaken,
        )

    def _history(self) -> dict[str, TypeHistory]:
        return {k: TypeHistory(int(v[0]), int(v[1]), v[2]) for k, v in self.history.items()}

    def _start_screen(self, node: Node, now: float, tier: int) -> None:
        self.due.discard(node.idx)
        self.suspects.discard(node.idx)
        self.unqualified.discard(node.idx)
        self.verifying.discard(node.idx)
        node.test_tier = tier
        node.due_since, node.overtaken = None, 0
        if node.state != St.VERIFYING:
            self._set_state(node, St.TESTING)
        self.pool_tests[node.pool] += 1
        node.token += 1
        node.confirming = False
        self._push(now + self.screen_h, Ev.SCREEN_END, node)

    def _catches(self, node: Node) -> bool:
        e = node.episode
        if e is None:
            return self.rng.random() < self.m.false_fail
        if e.kind == "persistent":
            return True
        if e.kind == "intermittent":
            return self.rng.random() < e.active * self.catch["intermittent_round_p"]
        return self.rng.random() < e.active * self.catch["data_round_p"]

    def _screen_end(self, node: Node, now: float) -> None:
        self.screening_hours += self.screen_h
        self.screenings += 1
        failed = self._catches(node)
        if failed and self.confirm > 1 and not node.confirming:
            node.confirming = True
            node.token += 1
            self._push(now + self.screen_h, Ev.SCREEN_END, node)
            return
        self.pool_tests[node.pool] -= 1
        hist = self.history[node.type]
        hist[0] += 1
        hist[1] += int(failed)
        hist[2] += max(now - node.last_screen_end, 0.0)
        node.last_screen_end = now
        if failed:
            by = {0: "verification", 1: "acceptance", 2: "report"}.get(node.test_tier, "screening")
            self._quarantine(node, now, by)
            return
        verifying = node.state == St.VERIFYING
        self._set_state(node, St.QUALIFIED)
        node.qualified_at = now
        if verifying and node.episode is not None:
            # A repair that failed and a verification that missed it: a new episode.
            node.episode = Episode(node.idx, node.episode.kind, now, node.episode.active)
            self.episodes.append(node.episode)
        node.token += 1
        if node.pending_job:
            node.pending_job = False
            self._start_job(node, now)
        else:
            node.idle_since = min(node.idle_since, now)
            self._went_idle(node, now)
            self._push(now + node.work_rng.expovariate(1 / self.m.gap_hours), Ev.JOB_START, node)

    def _quarantine(self, node: Node, now: float, by: str) -> None:
        self.quarantines += 1
        if node.episode is None:
            self.false_quarantines += 1
        elif node.episode.quarantined is None:
            node.episode.quarantined, node.episode.by = now, by
        node.pending_job = False
        self._set_state(node, St.QUARANTINED)
        node.token += 1
        self._push(now + node.fault_rng.expovariate(1 / self.m.repair_hours), Ev.REPAIR_DONE, node)

    def _repair_done(self, node: Node, now: float) -> None:
        # Exactly one onset is pending while a node has no fault: a false quarantine's
        # is still pending; a repaired or replaced host's is drawn here.
        node.cycles += 1
        faulty = node.episode is not None
        if faulty and node.fault_rng.random() >= self.m.repair_fail:
            node.episode = None
        if node.episode is None:
            node.repairs += 1
        if node.cycles > self.max_cycles:
            # Retired; a new node of the same type takes its place, gated until accepted.
            node.cycles, node.repairs, node.episode, node.reports = 0, 0, None, []
            self._set_state(node, St.UNQUALIFIED)
            node.qualified_at = None
            self.unqualified.add(node.idx)
        if faulty and node.episode is None:
            self._schedule_onset(node, now)
        if node.state == St.UNQUALIFIED:
            return
        self._set_state(node, St.VERIFYING)
        self.verifying.add(node.idx)
        self._pass(now)


@functools.lru_cache(maxsize=1 << 16)
def _clock(hours: float) -> dt.datetime:
    return EPOCH + dt.timedelta(hours=hours)


def simulate(
    model: Model, policy: Policy, seed: int, progress: Callable[[str], None] | None = None
) -> Outcome:
    outcome = Fleet(model, policy, seed).run()
    if progress is not None:
        progress(policy.name)
    return outcome
