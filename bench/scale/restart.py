"""A restart mid-run under start-up faults, and a standby that takes over (bench.scale).

Run by :func:`bench.scale.run.measure` after the other measurements of a size:

- **Restart.** Nodes join and are reserved (their probe Pods are held running by the
  fake kubelet); the operator is killed (SIGKILL) with those reservations in flight,
  the probes end while no operator runs, and a new operator starts behind the fault
  proxy (:mod:`sdcdev.faultproxy`): lists (streaming lists, or pages where the server
  serves no streaming lists) and other reads answered 429 or 500 at a rate,
  connections dropped, watches and streams cut, until its first full pass. Measured: time
  to its first write, to the first quarantine of an SDC node found after the restart,
  whether every reservation ended (Qualified or Quarantined), writes per joiner across
  the restart (a repeat is a no-op: no second SDCTest), that its copy of the fleet was
  complete (its "mirror synced" counts against a LIST), that nothing was written before
  every kind but the workload Pods had listed, and that before the Pods had listed
  only nodes with a test in flight at the kill were written (their probe ends).
- **Standby.** The restarted operator runs with leader election; a standby replica
  under another ServiceAccount keeps its copy warm. The Lease's holder is killed
  several times (a node joins at each kill, so the new leader has something to do);
  measured: kill to the new leader's Lease and to its first write, and, from the audit
  log, that no write of one replica fell inside another's term (terms as the Lease's
  successful writes show them, so a leader that stepped down on its own is checked
  too, and such takeovers are counted).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import statistics
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from bench.scale import audit
from bench.scale.fleet import FastKubelet, JobWatch, NodeWatch, node_name, register_nodes
from sdcdev.cluster.localcluster import LocalCluster
from sdcdev.faultproxy import FaultProxy, FaultRates
from sdcdev.harness import NS, OperatorProcess

RESTART_JOINS = 20
"""Nodes in flight at each kill; every fourth reports SDC."""
RESTARTS = 3
"""Restarts per size. How soon the first quarantine comes depends on when the copy of
the probe kinds completes, which the random cut streams move by seconds: one restart
is one draw, so the figures are the median and the maximum over these."""
TIMED = (
    "resume_s",
    "first_fleet_write_s",
    "mirrors_synced_s",
    "probes_synced_s",
    "first_quarantine_after_restart_s",
)
"""A restart's timings: over several restarts, the median, with ``<key>_max`` beside it."""
KILLS = 5
LEASE = "sdcguard-leader"
LEADER_ENV = {
    "SDCGUARD_LEADER_ELECTION": "true",
    "SDCGUARD_LEASE_DURATION_SECONDS": "8",
    "SDCGUARD_RENEW_DEADLINE_SECONDS": "5",
    "SDCGUARD_RETRY_PERIOD_SECONDS": "1",
}
STARTUP_FAULTS = FaultRates(
    drop=0.05,
    error_500=0.10,
    error_429=0.10,
    conflict_409=0.0,
    lost_response=0.0,
    delay=0.0,
    max_delay_s=0.0,
    cut_watch=0.5,
    max_watch_s=3.0,
)
"""Reads (lists included) fail at these rates; half the watches (streaming lists
included) are cut 1-3 s after they start."""
NOT_CHANGES = frozenset({"selfsubjectaccessreviews", "selfsubjectrulesreviews"})


@dataclass
class Replica:
    """One operator process, its ServiceAccount's audit user and its log."""

    proc: OperatorProcess
    user: str
    log: Path
    identity: str
    synced: dict[str, tuple[float, int]] = field(default_factory=dict)
    """kind -> (time, objects) of each mirror's first complete list, from the log."""
    passes: list[tuple[float, int]] = field(default_factory=list)
    """(time, nodes) of each reconcile pass."""
    lead_at: float | None = None
    since: float = 0.0
    """Wall time of the process's last start: the log is read from there."""
    restarts: list[int] = field(default_factory=list)
    """Exit codes of the processes that ended and were started again."""

    def keep_running(self) -> None:
        """Start the process again if it ended, as the kubelet restarts a container (a
        leader that cannot renew its Lease exits, and comes back as a standby)."""
        proc = self.proc.proc
        if proc is not None and proc.poll() is not None:
            self.restarts.append(proc.returncode)
            self.since = time.time()
            self.proc.start()

    def read_log(self) -> None:
        self.synced.clear()
        self.passes.clear()
        if not self.log.exists():
            return
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            event = doc.get("event")
            if event not in ("mirror synced", "reconcile pass", "leading"):
                continue
            at = dt.datetime.fromisoformat(
                str(doc.get("timestamp", "")).replace("Z", "+00:00")
            ).timestamp()
            if at < self.since:
                continue
            if event == "mirror synced":
                self.synced.setdefault(str(doc.get("kind")), (at, int(doc.get("objects", 0))))
            elif event == "leading":
                self.lead_at = at
            else:
                self.passes.append((at, int(doc.get("nodes", 0))))


def _wait(predicate: Callable[[], Any], timeout: float, every: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return False


def _writes(auditlog: audit.AuditLog, start: float, end: float) -> list[audit.Request]:
    return [
        r
        for r in auditlog.between(start, end)
        if r.write and r.resource not in NOT_CHANGES and r.code < 400
    ]


def _holder(admin: client.ApiClient) -> str | None:
    with contextlib.suppress(client.ApiException):
        lease: Any = client.CoordinationV1Api(admin).read_namespaced_lease(LEASE, NS)
        return lease.spec.holder_identity or None
    return None


def _proxy_kubeconfig(path: Path, url: str, token: str) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f'clusters:\n- name: proxied\n  cluster: {{server: "{url}"}}\n'
        f"users:\n- name: operator\n  user: {{token: {token}}}\n"
        "contexts:\n- name: proxied\n  context: {cluster: proxied, user: operator}\n"
        "current-context: proxied\n"
    )
    return path


def _listed(admin: client.ApiClient) -> dict[str, int]:
    """What a LIST returns now, for the kinds whose mirror keeps every object."""
    core, batch = client.CoreV1Api(admin), client.BatchV1Api(admin)
    probe = "app.kubernetes.io/component=sdcprobe"

    def count(resp: Any) -> int:
        return len(json.loads(resp.data)["items"])

    return {
        "nodes": count(core.list_node(_preload_content=False)),
        "probe-pods": count(
            core.list_namespaced_pod(NS, label_selector=probe, _preload_content=False)
        ),
        "probe-jobs": count(
            batch.list_namespaced_job(NS, label_selector=probe, _preload_content=False)
        ),
    }


def _copy_now(admin: client.ApiClient, metrics_url: str) -> tuple[dict[str, int], dict[str, int]]:
    """A LIST of each kind beside the operator's copy of it at the same moment (its
    ``sdcguard_mirror_objects``, scraped before and after the LIST and taken when the
    two scrapes agree: probe Jobs and Pods come and go while the fleet runs). The copy
    as it completed is counted separately: what was deleted since shows as a difference
    there, not here."""
    listed: dict[str, int] = {}
    now: dict[str, int] = {}
    for _ in range(10):
        before = _mirror_objects(metrics_url)
        listed = _listed(admin)
        after = _mirror_objects(metrics_url)
        now = after
        if all(before.get(k) == after.get(k) for k in listed):
            break
        time.sleep(1.0)
    return listed, now


def _mirror_objects(metrics_url: str) -> dict[str, int]:
    try:
        with urllib.request.urlopen(metrics_url, timeout=10) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    found: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "sdcguard_mirror_objects":
            for sample in family.samples:
                found[sample.labels["kind"]] = int(sample.value)
    return found


@dataclass
class Phases:
    """What the restart and standby phases share with the rest of a size's run."""

    n: int
    first_free: int
    admin: client.ApiClient
    cluster: LocalCluster
    workdir: Path
    auditlog: audit.AuditLog
    nodes: NodeWatch
    jobs: JobWatch
    kubelet: FastKubelet
    kubeconfigs: dict[str, Path]
    """audit user -> kubeconfig with that ServiceAccount's token."""
    tokens: dict[str, str]
    env: dict[str, str]
    say: Callable[[str], None]
    started: list[Replica] = field(default_factory=list)
    resources: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    @property
    def copy_wait_s(self) -> float:
        """How long a new process may take to list the fleet and pass over it: 300 s,
        or 30 ms a node above 10,000: several times what the copy takes behind the
        faults (bench/results/scale.md), so only a stuck process fails the wait."""
        return max(300.0, 0.03 * self.n)

    def replica(self, user: str, kubeconfig: Path, tag: str, lead: bool = True) -> Replica:
        """A started operator process; with ``lead``, it runs with leader election."""
        log = self.workdir / f"operator-{tag}.log"
        identity = f"replica-{tag}"
        env = {**self.env, **LEADER_ENV, "SDCGUARD_LEADER_IDENTITY": identity} if lead else self.env
        proc = OperatorProcess(kubeconfig, log, env=dict(env))
        replica = Replica(proc, user, log, identity)
        self.started.append(replica)
        proc.start()
        return replica

    def stop_all(self) -> None:
        for replica in self.started:
            replica.proc.stop()
        self.resources.close()

    # Restart -------------------------------------------------------------------

    def restart(
        self, operator: OperatorProcess, rounds: int = RESTARTS
    ) -> tuple[dict[str, Any], Replica]:
        """Restart the operator ``rounds`` times (:meth:`restart_once`), each new process
        killed by the next round; the results combined (:func:`combine_rounds`), and the
        last process, which runs with leader election and leads the standby phase.

        Only the last runs with leader election: a killed leader's Lease would keep the
        next one from acting until it expired, which is the standby phase's measure,
        not the restart's. The first round's process holds no Lease either."""
        results: list[dict[str, Any]] = []
        current = operator
        new: Replica | None = None
        for i in range(rounds):
            out, new = self.restart_once(current, i, lead=i == rounds - 1)
            results.append(out)
            current = new.proc
        assert new is not None, "at least one restart"
        combined = combine_rounds(results)
        self.say(
            f"restart: first quarantine over {rounds} restarts: median "
            f"{combined['first_quarantine_after_restart_s']} s, max "
            f"{combined['first_quarantine_after_restart_s_max']} s"
        )
        return combined, new

    def restart_once(
        self, operator: OperatorProcess, round_no: int = 0, lead: bool = True
    ) -> tuple[dict[str, Any], Replica]:
        """Kill the operator with reservations in flight; start one behind faults."""
        joiners = [node_name(self.first_free + i) for i in range(RESTART_JOINS)]
        self.first_free += RESTART_JOINS
        sick = joiners[::4]
        self.kubelet.sdc_nodes.update(sick)
        self.kubelet.hold.update(joiners)
        register_nodes(self.admin, joiners, threads=4)
        reserved = _wait(lambda: all(self.jobs.created.get(x) for x in joiners), 120)
        states = self.nodes.states()
        in_flight = sorted(x for x in joiners if states.get(x) == "Testing")
        testing_at_kill = {x for x, state in states.items() if state == "Testing"}
        operator.kill()
        killed = time.time()
        held = self.kubelet.release()
        self.say(
            f"restart {round_no + 1}: killed the operator with {len(in_flight)} reservations "
            f"in flight ({held} probe Pods end while it is down)"
        )
        time.sleep(2.0)
        out: dict[str, Any] = {"joiners": len(joiners), "sdc_joiners": len(sick)}
        out["reserved_before_kill"] = (
            len(in_flight) if reserved else f"{len(in_flight)} (timed out)"
        )
        token = self.tokens[audit.OPERATOR_USER]
        # The restarted operator talks through the proxy for the rest of its life (it
        # leads the standby phase): the proxy closes with the phases (stop_all).
        proxy = self.resources.enter_context(
            FaultProxy(
                self.cluster.server,
                self.cluster.ca_file,
                token,
                seed=16 + round_no,
                rates=STARTUP_FAULTS,
            )
        )
        config = _proxy_kubeconfig(
            self.workdir / f"proxied-{round_no}.kubeconfig", proxy.url, token
        )
        restarted_at = time.time()
        tag = "restarted" if round_no == 0 else f"restarted-{round_no}"
        new = self.replica(audit.OPERATOR_USER, config, tag, lead=lead)

        def full_pass() -> bool:
            new.keep_running()
            new.read_log()
            return any(nodes >= self.n for _, nodes in new.passes)

        if not _wait(full_pass, self.copy_wait_s, every=0.5):
            raise RuntimeError(f"the restarted operator never passed; see {new.log}")
        proxy.calm()
        out["faults_injected"] = dict(proxy.injected)
        listed_at = time.time()
        listed, now = _copy_now(self.admin, new.proc.metrics_url)
        settled = _wait(
            lambda: all(
                self.nodes.states().get(x) == ("Quarantined" if x in sick else "Qualified")
                for x in joiners
            ),
            300,
            every=0.5,
        )
        new.read_log()
        states = self.nodes.states()
        out["settled"] = settled
        out["lost_reservations"] = sorted(
            x for x in in_flight if states.get(x) not in ("Qualified", "Quarantined")
        )
        writes = _writes(self.auditlog, restarted_at, time.time() + 1)
        # resume_s: its first accepted write of any kind (the Lease, with leader
        # election); first_fleet_write_s: its first write about the fleet.
        first_write = min((r.at for r in writes), default=None)
        out["resume_s"] = round(first_write - restarted_at, 2) if first_write else None
        fleet = min((r.at for r in writes if r.resource != "leases"), default=None)
        out["first_fleet_write_s"] = round(fleet - restarted_at, 2) if fleet else None
        synced_at = max((at for at, _ in new.synced.values()), default=None)
        out["mirrors_synced_s"] = round(synced_at - restarted_at, 2) if synced_at else None
        # Probe ends are served once every kind but the workload Pods has listed; what
        # reads the Pods (reservations) waits for their copy too (adapters/inventory.py).
        probes_at = max((at for k, (at, _) in new.synced.items() if k != "pods"), default=None)
        out["probes_synced_s"] = round(probes_at - restarted_at, 2) if probes_at else None
        # The Lease is the election's, not an action on the fleet.
        fleet_writes = [r for r in writes if r.resource != "leases"]
        out["writes_before_probe_copy"] = sum(
            1 for r in fleet_writes if probes_at is None or r.at < probes_at
        )
        early = [r for r in fleet_writes if synced_at is None or r.at < synced_at]
        others = sorted({r.node for r in early if r.node and r.node not in testing_at_kill})
        out["writes_before_pod_copy"] = {
            # Nodes whose test was in flight at the kill: their probe ends, served early.
            "in_flight": sum(1 for r in early if r.node in testing_at_kill),
            # Any other node: none may be written from a copy without the Pods.
            "other_nodes": sum(1 for r in early if r.node and r.node not in testing_at_kill),
            "other_node_names": others[:10],
            # Named after no node (hardware records, by host identifier).
            "unattributed": dict(Counter(r.kind for r in early if not r.node)),
        }
        # The copy is counted as it completed, the LIST after the first full pass: the
        # Jobs the operator created in between (each with its Pod) are told apart.
        created = sum(
            1
            for r in _writes(self.auditlog, synced_at or listed_at, listed_at)
            if r.kind == "create jobs"
        )
        out["copy_against_list"] = {
            kind: {
                "mirror": now.get(kind),
                "list": count,
                "mirror_at_sync": new.synced.get(kind, (0.0, None))[1],
                **({"created_since_copy": created} if kind.startswith("probe-") else {}),
            }
            for kind, count in listed.items()
        }
        out["process_restarts"] = list(new.restarts)
        marks = [
            rec.quarantined[0]
            for x in sick
            if (rec := self.nodes.record(x)).quarantined and rec.quarantined[0] > restarted_at
        ]
        out["first_quarantine_after_restart_s"] = (
            round(min(marks) - restarted_at, 2) if marks else None
        )
        per_joiner = Counter(r.node for r in _writes(self.auditlog, killed - 600, time.time() + 1)
                             if r.node in set(joiners))  # fmt: skip
        tests = Counter(
            r.node
            for r in _writes(self.auditlog, killed - 600, time.time() + 1)
            if r.kind == "create sdctests" and r.node in set(joiners)
        )
        out["sdctests_created_per_joiner"] = {
            "clean_max": max((tests[x] for x in joiners if x not in sick), default=None),
            "sdc_max": max((tests[x] for x in sick), default=None),
        }
        out["writes_per_clean_joiner_max"] = max(
            (per_joiner[x] for x in joiners if x not in sick), default=None
        )
        out["refused_creates_after_restart"] = sum(
            1
            for r in self.auditlog.between(restarted_at, time.time() + 1)
            if r.verb == "create" and r.code == 409
        )
        self.say(f"restart {round_no + 1}: {out}")
        return out, new

    # Standby -------------------------------------------------------------------

    def standby(self, leader: Replica) -> dict[str, Any]:
        """Kill the Lease's holder KILLS times with a warm standby; the takeover each time.

        Each kill is of whichever replica holds the Lease then (read from the Lease, not
        assumed: a leader whose renewals time out under load steps down on its own, and
        the standby takes over before any kill). The terms of the check come from the
        audit log's successful Lease writes: a replica's term starts with its first
        Lease write after the other's, so a takeover without a kill is checked as well
        as the killed ones, and counted apart."""
        users = {leader.user: self.kubeconfigs[leader.user]}
        other = audit.STANDBY_USER if leader.user == audit.OPERATOR_USER else audit.OPERATOR_USER
        users[other] = self.kubeconfigs[other]
        started = time.time()
        replicas = [leader, self.replica(other, users[other], "standby-0")]
        every = list(replicas)
        kills: list[float] = []
        takeovers: list[dict[str, float]] = []
        rss_standby: list[float] = []
        kinds = ("nodes", "pods", "probe-pods", "probe-jobs")

        def warm(replica: Replica) -> bool:
            # A replica that ended (a leader that could not renew its Lease exits) is
            # started again, as the kubelet would, and is warm once it has listed anew:
            # a kill with no live standby measures nothing (and waited out every timeout).
            replica.keep_running()
            replica.read_log()
            return all(k in replica.synced for k in kinds)

        for i in range(KILLS):
            pair = list(replicas)
            if not _wait(lambda p=pair: all(warm(r) for r in p), self.copy_wait_s, every=0.5):
                raise RuntimeError(f"a replica never synced; see {[str(r.log) for r in pair]}")
            active = self._holding(pair, 120.0)
            standby = next(r for r in pair if r is not active)
            time.sleep(1.0)
            if standby.proc.proc is not None:
                with contextlib.suppress(psutil.Error):
                    rss = psutil.Process(standby.proc.proc.pid).memory_info().rss
                    rss_standby.append(rss / 2**20)
            joiner = node_name(self.first_free)
            self.first_free += 1
            active.proc.kill()
            killed = time.time()
            kills.append(killed)
            register_nodes(self.admin, [joiner], threads=1)
            took = _wait(lambda s=standby: _holder(self.admin) == s.identity, 120, every=0.1)
            leased = time.time() - killed if took else None

            def acted(s: Replica = standby, k: float = killed) -> list[audit.Request]:
                return [
                    r
                    for r in _writes(self.auditlog, k, time.time() + 1)
                    if r.user == s.user and r.resource != "leases"
                ]

            # Its first write, however long it takes (Kopf lists our resources first).
            _wait(acted, 600, every=0.2)
            mine = acted()
            first = min((r.at for r in mine), default=None)
            takeovers.append(
                {
                    "lease_s": round(leased, 2) if leased is not None else -1.0,
                    "first_write_s": round(first - killed, 2) if first else -1.0,
                }
            )
            self.say(f"standby: kill {i + 1}/{KILLS}: {takeovers[-1]}")
            # The killed one comes back as the new standby.
            back = self.replica(active.user, users[active.user], f"r{i + 1}")
            replicas = [standby, back]
            every.append(back)
        time.sleep(2.0)
        end = time.time()
        terms = lease_terms(self.auditlog, leader.user, started, end)
        unforced = [
            at for _, at in terms[1:] if not any(k <= at <= k + LEASE_TAKEOVER_MAX_S for k in kills)
        ]
        overlaps = outside_terms(_writes(self.auditlog, started, end), terms)
        firsts = sorted(t["first_write_s"] for t in takeovers if t["first_write_s"] >= 0)
        out = {
            "kills": KILLS,
            "lease_duration_s": float(LEADER_ENV["SDCGUARD_LEASE_DURATION_SECONDS"]),
            "takeovers": takeovers,
            "first_write_s": {
                "n": len(firsts),
                "p50": firsts[len(firsts) // 2] if firsts else None,
                "max": firsts[-1] if firsts else None,
            },
            "terms": len(terms),
            "takeovers_without_kill": [round(at - started, 1) for at in unforced],
            "writes_outside_own_term": len(overlaps),
            "outside_examples": overlaps[:5],
            "standby_rss_mb": round(max(rss_standby), 1) if rss_standby else None,
            # Exit codes of the processes that ended and were started again, by replica.
            "process_restarts": {r.identity: list(r.restarts) for r in every if r.restarts},
        }
        self.say(f"standby: {out}")
        return out

    def _holding(self, replicas: list[Replica], timeout: float) -> Replica:
        """The replica that holds the Lease (waits for one to)."""
        deadline = time.time() + timeout
        while True:
            holder = _holder(self.admin)
            found = next((r for r in replicas if r.identity == holder), None)
            if found is not None:
                return found
            if time.time() > deadline:
                raise RuntimeError(f"no replica holds the Lease (holder: {holder})")
            time.sleep(0.2)


def combine_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Several restarts' results as one: the timings (:data:`TIMED`) as the median, with
    the maximum as ``<key>_max`` (``None`` when a restart lacked the figure: a missing
    quarantine fails the target, it is not left out); the checks over every restart
    (reservations lost in any, writes before a copy in all, faults in all, the worst
    SDCTests and writes per joiner). ``copy_against_list`` is the restart's whose copy
    differs from its LIST, where one does, else the last one's. Each restart's own
    result is kept under ``rounds``."""
    if not rounds:
        raise ValueError("no restarts to combine")
    out: dict[str, Any] = dict(rounds[-1])
    out["restarts"] = len(rounds)
    for key in TIMED:
        values = [r.get(key) for r in rounds]
        present = sorted(v for v in values if v is not None)
        out[key] = round(statistics.median(present), 2) if present else None
        out[f"{key}_max"] = present[-1] if len(present) == len(values) else None
    for key in ("joiners", "sdc_joiners", "refused_creates_after_restart"):
        out[key] = sum(int(r.get(key) or 0) for r in rounds)
    reserved = [r.get("reserved_before_kill") for r in rounds]
    out["reserved_before_kill"] = (
        sum(reserved)
        if all(isinstance(x, int) for x in reserved)
        else " + ".join(map(str, reserved))
    )
    out["settled"] = all(r.get("settled") for r in rounds)
    out["lost_reservations"] = sorted(x for r in rounds for x in r.get("lost_reservations", []))
    faults: Counter[str] = Counter()
    for r in rounds:
        faults.update(r.get("faults_injected", {}))
    out["faults_injected"] = dict(faults)
    out["writes_before_probe_copy"] = sum(
        int(r.get("writes_before_probe_copy") or 0) for r in rounds
    )
    pods = [r.get("writes_before_pod_copy") or {} for r in rounds]
    unattributed: Counter[str] = Counter()
    for p in pods:
        unattributed.update(p.get("unattributed", {}))
    out["writes_before_pod_copy"] = {
        "in_flight": sum(int(p.get("in_flight", 0)) for p in pods),
        "other_nodes": sum(int(p.get("other_nodes", 0)) for p in pods),
        "other_node_names": sorted({x for p in pods for x in p.get("other_node_names", [])})[:10],
        "unattributed": dict(unattributed),
    }
    differing = [
        r["copy_against_list"]
        for r in rounds
        if any(v.get("mirror") != v.get("list") for v in r.get("copy_against_list", {}).values())
    ]
    out["copy_against_list"] = (
        differing[0] if differing else rounds[-1].get("copy_against_list", {})
    )
    out["process_restarts"] = [x for r in rounds for x in r.get("process_restarts", [])]
    per_joiner = [r.get("sdctests_created_per_joiner") or {} for r in rounds]
    out["sdctests_created_per_joiner"] = {
        key: max((p[key] for p in per_joiner if p.get(key) is not None), default=None)
        for key in ("clean_max", "sdc_max")
    }
    out["writes_per_clean_joiner_max"] = max(
        (r["writes_per_clean_joiner_max"] for r in rounds
         if r.get("writes_per_clean_joiner_max") is not None),
        default=None,
    )  # fmt: skip
    out["rounds"] = [dict(r) for r in rounds]
    return out


LEASE_TAKEOVER_MAX_S = 120.0
"""A term that starts within this long after a kill is that kill's takeover."""


def lease_terms(
    auditlog: audit.AuditLog, first: str, start: float, end: float
) -> list[tuple[str, float]]:
    """(user, start) of each term from ``start`` to ``end``: ``first`` holds the Lease at
    ``start``, and a term begins with a user's first successful Lease write after
    another user's (a holder that lost the Lease cannot write it again: its replace
    carries a stale resourceVersion and is refused)."""
    terms: list[tuple[str, float]] = [(first, 0.0)]
    for r in sorted(auditlog.between(start, end), key=lambda r: r.at):
        if r.resource != "leases" or r.name != LEASE or not r.write or r.code >= 300:
            continue
        if r.user != terms[-1][0]:
            terms.append((r.user, r.at))
    return terms


def outside_terms(
    writes: list[audit.Request], terms: list[tuple[str, float]]
) -> list[dict[str, Any]]:
    """The writes (Lease writes aside) made by a user other than the term's holder, by
    when the API server received them: a request a leader sent before its death is in
    its own term."""
    overlaps = []
    for r in writes:
        if r.resource == "leases":
            continue
        term = max((t for t in terms if t[1] <= r.at), key=lambda t: t[1])
        if r.user != term[0]:
            overlaps.append({"at": r.at, "user": r.user, "kind": r.kind, "name": r.name})
    return overlaps
