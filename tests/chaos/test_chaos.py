"""Chaos: the operator is SIGKILLed at random moments behind a faulty API connection.

A fleet of 10 nodes (3 with SDC) goes through acceptance while the operator process
is killed and restarted at least 10 times and every request it makes crosses
:class:`FaultProxy` (dropped connections, 500/429/409, lost responses on writes,
delays, cut watch streams). Meanwhile workloads come and go on healthy nodes (so
return-from-use screenings start and stop), probe Pods take a random 0.5-3 s, and
one SDC node is repaired through its ticket. Then the chaos stops, the operator
converges, and the invariants are checked against what is stored in the cluster.

The run is seeded: the seed is printed, and ``SDCGUARD_CHAOS_SEED=<n>`` repeats its
draws (kill times, fault draws, probe delays, workload placement). Real time and
concurrency still vary the interleaving, which is the point of the exercise.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import os
import random
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sdcdev.cluster.localcluster import LocalCluster
from sdcdev.faultproxy import FaultProxy
from sdcdev.harness import (
    GROUP,
    NS,
    VERSION,
    OperatorProcess,
    ProbeKubelet,
    delete_all,
    gpu_nodes,
    list_custom,
    policy_body,
    ticket_in_phase,
    trusted_baseline,
    wait_for,
)
from sdcguard.api import SDCPolicy
from sdcguard.api.sdctest import SDCTestPhase
from sdcguard.domain import breaker as breaker_mod
from sdcguard.domain import keys

GATE, TESTING, QUARANTINE = (
    "sdcguard.dev/unqualified",
    "sdcguard.dev/testing",
    "sdcguard.dev/quarantined",
)
FINISHED = {p.value for p in SDCTestPhase if p.finished}
OPEN_TICKET_PHASES = {"Open", "Acknowledged", "InRepair", "Verifying"}
KILLS = 12
NODES = 10
FAULTY = 3


class SlowProbeKubelet(ProbeKubelet):
    """A ProbeKubelet whose probes take a random while (so kills land mid-test)."""

    def __init__(self, api: client.ApiClient, outcomes: dict[str, str], rng: random.Random):
        super().__init__(api, outcomes)
        self.rng = rng
        self.due: dict[str, float] = {}

    def _complete(self, pod: client.V1Pod, outcome: str) -> None:
        due = self.due.setdefault(pod.metadata.name, time.monotonic() + self.rng.uniform(0.5, 3))
        if time.monotonic() >= due:
            super()._complete(pod, outcome)


class Background(threading.Thread):
    """A loop that runs ``step`` until stopped, swallowing API hiccups."""

    def __init__(self, name: str, step: Any) -> None:
        super().__init__(name=name, daemon=True)
        self.step = step
        self.halt = threading.Event()
        self.errors: Counter[str] = Counter()

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                self.step(self.halt)
            except Exception as exc:
                self.errors[type(exc).__name__] += 1
                self.halt.wait(0.5)


def proxy_kubeconfig(path: Path, url: str, token: str) -> Path:
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: chaos
  cluster: {{server: "{url}"}}
users:
- name: operator
  user: {{token: {token}}}
contexts:
- name: chaos
  context: {{cluster: chaos, user: operator}}
current-context: chaos
"""
    )
    return path


def _labels(node: client.V1Node) -> dict[str, str]:
    return node.metadata.labels or {}


def _state(api: client.ApiClient, name: str) -> str | None:
    return _labels(client.CoreV1Api(api).read_node(name)).get(keys.LABEL_STATE)


# Invariants -----------------------------------------------------------------------------


def node_violations(
    node: client.V1Node, tests: list[dict[str, Any]], tickets: list[dict[str, Any]]
) -> list[str]:
    """Label, taints, cordon, bookkeeping and tickets of one node agree with its state."""
    name = node.metadata.name
    state = _labels(node).get(keys.LABEL_STATE)
    ann = node.metadata.annotations or {}
    taints = {t.key for t in node.spec.taints or []}
    owned = set(keys.split_list(ann.get(keys.OWNED_TAINTS)))
    unfinished = [t for t in tests if (t.get("status") or {}).get("phase") not in FINISHED]
    open_tickets = [
        t for t in tickets if (t.get("status") or {}).get("phase", "Open") in OPEN_TICKET_PHASES
    ]
    out = []
    if not owned <= taints:
        out.append(f"{name}: owned-taints {sorted(owned)} but taints are {sorted(taints)}")
    if TESTING in taints and not unfinished:
        out.append(f"{name}: reserved (testing taint) without a running test")
    if len(open_tickets) > 1:
        out.append(f"{name}: {len(open_tickets)} open tickets")
    if state == "Qualified":
        ours = taints & {GATE, TESTING, QUARANTINE}
        if ours:
            out.append(f"{name}: Qualified but tainted {sorted(ours)}")
        if node.spec.unschedulable:
            out.append(f"{name}: Qualified but cordoned")
        if keys.parse_time(ann.get(keys.QUALIFIED_AT)) is None:
            out.append(f"{name}: Qualified without a qualified-at time")
        for key in (keys.CURRENT_TEST, keys.CORDONED_BY_US, keys.SUSPECT_CHECKS):
            if key in ann:
                out.append(f"{name}: Qualified but still annotated {key}={ann[key]}")
        if open_tickets:
            out.append(f"{name}: Qualified with open ticket {open_tickets[0]['metadata']['name']}")
    elif state == "Quarantined":
        if QUARANTINE not in taints or QUARANTINE not in owned:
            out.append(f"{name}: Quarantined without our quarantine taint ({sorted(taints)})")
        if TESTING in taints:
            out.append(f"{name}: Quarantined but still carries the testing taint")
        if not node.spec.unschedulable or ann.get(keys.CORDONED_BY_US) != "true":
            out.append(f"{name}: Quarantined but not cordoned by us")
        if len(open_tickets) != 1:
            out.append(f"{name}: Quarantined with {len(open_tickets)} open tickets")
    return out


def screening_violations(
    node: str, tests: list[dict[str, Any]], jobs: list[client.V1Job]
) -> list[str]:
    """No test left running, no two tests of a node at once, one Job per test at most."""
    out = []
    for t in tests:
        if (t.get("status") or {}).get("phase") not in FINISHED:
            out.append(f"{node}: SDCTest {t['metadata']['name']} never finished")

    def created(t: dict[str, Any]) -> dt.datetime:
        return keys.parse_time(t["metadata"]["creationTimestamp"]) or dt.datetime.min

    ordered = sorted(tests, key=lambda t: (created(t), t["metadata"]["name"]))
    for before, after in itertools.pairwise(ordered):
        done = keys.parse_time((before.get("status") or {}).get("completionTime"))
        # Timestamps have one-second resolution: allow one second of rounding.
        if done is not None and created(after) + dt.timedelta(seconds=1) < done:
            out.append(
                f"{node}: SDCTests {before['metadata']['name']} and "
                f"{after['metadata']['name']} ran at the same time"
            )
    joins = Counter(t["spec"].get("attempt", 1) for t in tests if t["spec"]["reason"] == "Join")
    out += [f"{node}: {n} Join tests with attempt {a}" for a, n in joins.items() if n > 1]
    per_test = Counter((j.metadata.labels or {}).get("sdcguard.dev/test") for j in jobs)
    names = {t["metadata"]["name"] for t in tests}
    for test, n in per_test.items():
        if n > 1:
            out.append(f"{node}: {n} probe Jobs for SDCTest {test}")
        if test not in names:
            out.append(f"{node}: probe Job for missing SDCTest {test}")
    return out


def breaker_violations(policy_doc: dict[str, Any], tests: dict[str, dict[str, Any]]) -> list[str]:
    """The stored breaker state follows from its own samples, and each sample is a real
    screening with the verdict it claims."""
    policy = SDCPolicy.model_validate(policy_doc)
    status = policy.status
    if status is None or status.breaker is None:
        return ["policy has no breaker status"]
    stored = status.breaker
    samples = breaker_mod.samples_from_status(stored)
    tripped = stored.tripped_at if stored.state.value == "Open" else None
    last = max((s.at for s in samples), default=dt.datetime.now(dt.UTC))
    view = breaker_mod.evaluate(
        samples,
        policy.spec.circuit_breaker,
        last,
        stored.reset_at,
        tripped,
        breaker_mod.failures_to_confirm(policy.spec.confirmation),
    )
    out = []
    if view.open != (stored.state.value == "Open"):
        out.append(f"breaker stored {stored.state.value} but its samples say open={view.open}")
    if (view.samples, view.failures) != (stored.window_samples, stored.window_failures):
        out.append(
            f"breaker window stored {stored.window_failures}/{stored.window_samples}, "
            f"samples give {view.failures}/{view.samples}"
        )
    cond = next((c for c in status.conditions if c.type == "BreakerOpen"), None)
    if cond is None or (cond.status == "True") != view.open:
        out.append(f"BreakerOpen condition {cond and cond.status} disagrees with the samples")
    elif f"{view.failures} of {view.samples} nodes screened" not in cond.message:
        out.append(f"BreakerOpen message {cond.message!r} does not explain the window")
    seen = Counter(s.test for s in samples)
    out += [f"breaker counts SDCTest {t} {n} times" for t, n in seen.items() if n > 1]
    for s in samples:
        test = tests.get(s.test)
        verdict = ((test or {}).get("status") or {}).get("verdict")
        if test is None:
            out.append(f"breaker sample for unknown SDCTest {s.test}")
        elif s.failed != (verdict == "SDC"):
            out.append(f"breaker sample failed={s.failed} but {s.test} has verdict {verdict}")
    return out


@dataclass
class Snapshot:
    """What the cluster stores about the chaos fleet, read in one go."""

    nodes: dict[str, client.V1Node]
    by_node: dict[str, list[dict[str, Any]]]
    tickets: dict[str, list[dict[str, Any]]]
    jobs: list[client.V1Job]
    policy: dict[str, Any]

    @property
    def tests(self) -> dict[str, dict[str, Any]]:
        return {t["metadata"]["name"]: t for tests in self.by_node.values() for t in tests}

    @property
    def screened(self) -> set[str]:
        """Finished screenings with a verdict the breaker counts (Pass or SDC)."""
        return {
            n
            for n, t in self.tests.items()
            if (t.get("status") or {}).get("verdict") in ("Pass", "SDC")
        }

    @property
    def sampled(self) -> set[str]:
        """The screenings in the stored breaker's samples."""
        breaker = (self.policy.get("status") or {}).get("breaker") or {}
        return {s["testName"] for s in breaker.get("samples") or []}


def snapshot(api: client.ApiClient, nodes: list[str], policy: str) -> Snapshot:
    core = client.CoreV1Api(api)
    return Snapshot(
        nodes={n: core.read_node(n) for n in nodes},
        by_node={n: list_custom(api, "sdctests", n) for n in nodes},
        tickets={n: list_custom(api, "repairtickets", n) for n in nodes},
        jobs=client.BatchV1Api(api).list_namespaced_job(NS).items,
        policy=client.CustomObjectsApi(api).get_cluster_custom_object(
            GROUP, VERSION, "sdcpolicies", policy
        ),
    )


def missing_samples_report(
    policy_doc: dict[str, Any],
    tests: dict[str, dict[str, Any]],
    missing: list[str],
    operator: OperatorProcess,
) -> str:
    """What a person needs to tell why finished screenings are not in the breaker's
    samples: each one's status, the stored breaker, and what the operator logged about
    the policy's status and its passes."""
    status = policy_doc.get("status") or {}
    breaker = status.get("breaker") or {}
    samples = breaker.get("samples") or []
    lines = [
        f"policy resourceVersion {policy_doc['metadata'].get('resourceVersion')}, "
        f"breaker {breaker.get('state')} window {breaker.get('windowFailures')}/"
        f"{breaker.get('windowSamples')}, {len(samples)} samples, newest "
        f"{max((s.get('time', '') for s in samples), default='-')}",
        "conditions: "
        + "; ".join(
            f"{c.get('type')}={c.get('status')} at {c.get('lastTransitionTime')}"
            for c in status.get("conditions") or []
        ),
    ]
    for name in missing:
        st = (tests.get(name) or {}).get("status") or {}
        meta = (tests.get(name) or {}).get("metadata") or {}
        lines.append(
            f"missing {name}: rv {meta.get('resourceVersion')} phase {st.get('phase')} "
            f"verdict {st.get('verdict')} completed {st.get('completionTime')} "
            f"created {meta.get('creationTimestamp')}"
        )
    text = operator.log_path.read_text(errors="replace") if operator.log_path.exists() else ""
    wanted = ("failed", "error", "Traceback", *missing)
    lines += [line for line in text.splitlines() if any(w in line for w in wanted)][-40:]
    return "---- breaker samples ----\n" + "\n".join(lines)


def describe(api: client.ApiClient, nodes: list[str]) -> str:
    """Every node's state, taints, bookkeeping, tests and tickets (for a failure report)."""
    lines = []
    for name in nodes:
        node = client.CoreV1Api(api).read_node(name)
        ann = {
            k.removeprefix(keys.PREFIX): v
            for k, v in (node.metadata.annotations or {}).items()
            if k.startswith(keys.PREFIX)
        }
        taints = sorted(t.key for t in node.spec.taints or [])
        lines.append(
            f"{name}: {_labels(node).get(keys.LABEL_STATE)} taints={taints} "
            f"cordoned={bool(node.spec.unschedulable)} {ann}"
        )
        for t in list_custom(api, "sdctests", name):
            st = t.get("status") or {}
            lines.append(
                f"  test {t['metadata']['name']} {t['spec']['reason']}/{t['spec'].get('attempt')} "
                f"{st.get('phase')} {st.get('verdict')} {st.get('reason')}"
            )
        for t in list_custom(api, "repairtickets", name):
            st = t.get("status") or {}
            lines.append(
                f"  ticket {t['metadata']['name']} {st.get('phase')} "
                f"resolution={t['spec'].get('resolution')} cycle={st.get('cycle')}"
            )
    return "\n".join(lines)


# The test ------------------------------------------------------------------------------


def test_operator_survives_kills_and_a_faulty_api(
    cluster: LocalCluster,
    crds: None,
    api_client: client.ApiClient,
    tmp_path: Path,
) -> None:
    seed = int(os.environ.get("SDCGUARD_CHAOS_SEED") or random.SystemRandom().randrange(2**31))
    print(f"\nchaos seed: {seed} (repeat with SDCGUARD_CHAOS_SEED={seed})", flush=True)
    rng = random.Random(seed)
    case = uuid.uuid4().hex[:6]
    nodes = [f"chaos-{case}-{i}" for i in range(NODES)]
    faulty = sorted(random.Random(seed).sample(nodes, FAULTY))
    repaired = faulty[0]
    healthy = [n for n in nodes if n not in faulty]
    outcomes = {n: ("sdc" if n in faulty else "pass") for n in nodes}
    core, custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
    trusted_baseline(api_client)

    with (
        FaultProxy(cluster.server, cluster.ca_file, cluster.token, seed) as proxy,
        gpu_nodes(api_client, nodes, case=case),
        SlowProbeKubelet(api_client, outcomes, random.Random(seed + 1)),
    ):
        kubeconfig = proxy_kubeconfig(tmp_path / "kubeconfig", proxy.url, cluster.token)
        operator = OperatorProcess(kubeconfig, tmp_path / "operator.log")
        policy = f"chaos-{case}"
        custom.create_cluster_custom_object(
            GROUP,
            VERSION,
            "sdcpolicies",
            policy_body(
                policy,
                match_labels={"sdcguard.test/case": case},
                budgets={"maxConcurrentTests": 4, "maxUnavailable": "50%"},
                circuitBreaker={"window": "1h", "minSamples": 20, "maxFailureFraction": 0.6},
            ),
        )
        workload_rng = random.Random(seed + 2)
        running: dict[str, str] = {}

        def churn(halt: threading.Event) -> None:
            """Workloads come and go on qualified healthy nodes (return-from-use)."""
            halt.wait(workload_rng.uniform(2, 5))
            for pod in list(running):
                if workload_rng.random() < 0.6:
                    core.delete_namespaced_pod(pod, "default", grace_period_seconds=0)
                    del running[pod]
            candidates = [n for n in healthy if n not in running.values()]
            if len(running) >= 2 or not candidates:
                return
            node = workload_rng.choice(candidates)
            n = core.read_node(node)
            if _labels(n).get(keys.LABEL_STATE) != "Qualified" or n.spec.taints:
                return
            pod = f"work-{case}-{uuid.uuid4().hex[:5]}"
            core.create_namespaced_pod(
                "default",
                {
                    "metadata": {"name": pod},
                    "spec": {
                        "nodeName": node,
                        "containers": [
                            {
                                "name": "train",
                                "image": "example.invalid/train",
                                "resources": {"limits": {"nvidia.com/gpu": "8"}},
                            }
                        ],
                    },
                },
            )
            running[pod] = node
            core.patch_namespaced_pod_status(pod, "default", {"status": {"phase": "Running"}})

        repairs: list[str] = []

        def repair(halt: threading.Event) -> None:
            """The repair side fixes the first SDC node once it is quarantined."""
            halt.wait(1)
            if repairs or _state(api_client, repaired) != "Quarantined":
                return
            ticket = ticket_in_phase(api_client, repaired, "Open")
            if ticket is None:
                return
            outcomes[repaired] = "pass"
            custom.patch_cluster_custom_object(
                GROUP,
                VERSION,
                "repairtickets",
                ticket["metadata"]["name"],
                {"spec": {"resolution": "Repaired", "resolutionNote": "chaos: GPU reseated"}},
            )
            repairs.append(ticket["metadata"]["name"])

        workers = [Background("chaos-churn", churn), Background("chaos-repair", repair)]
        started = time.monotonic()
        operator.start()
        for worker in workers:
            worker.start()
        kills = 0
        try:
            for _ in range(KILLS):
                time.sleep(rng.uniform(3, 11))
                operator.kill()
                kills += 1
                time.sleep(rng.uniform(0, 1.5))
                operator.start()
            chaos_s = time.monotonic() - started
            for worker in workers:
                worker.halt.set()
                worker.join(timeout=15)
            for pod in list(running):
                core.delete_namespaced_pod(pod, "default", grace_period_seconds=0)
            proxy.calm()
            print(
                f"chaos: {kills} kills in {chaos_s:.0f}s; faults injected {dict(proxy.injected)}; "
                f"repair tickets resolved {repairs}; background errors "
                f"{[dict(w.errors) for w in workers]}",
                flush=True,
            )

            def converged() -> bool:
                tests = [t for n in nodes for t in list_custom(api_client, "sdctests", n)]
                if any((t.get("status") or {}).get("phase") not in FINISHED for t in tests):
                    return False
                want = {n: "Quarantined" for n in faulty} | {n: "Qualified" for n in healthy}
                if repairs:
                    want[repaired] = "Qualified"
                return all(_state(api_client, n) == s for n, s in want.items())

            t0 = time.monotonic()
            wait_for(converged, 240, f"convergence after chaos (seed {seed})", every=1.0)
            # And stays there: two more full passes of the operator (not a sleep, which
            # would pass as well with a stalled operator) leave it converged.
            operator.wait_passes(policy)
            wait_for(converged, 60, f"a stable state (seed {seed})", every=1.0)
            print(f"converged {time.monotonic() - t0:.0f}s after the chaos stopped", flush=True)

            # Idle nodes are screened again (ReturnFromUse) once the churn's Pods are gone,
            # so a screening may have ended just now; the policy's status (the breaker's
            # samples) is written at most every 5 s between full passes. Checked on a
            # snapshot in which every finished screening has had that long to be counted.
            t1 = time.monotonic()
            while True:
                snap = snapshot(api_client, nodes, policy)
                missing = sorted(snap.screened - snap.sampled)
                settled = all(
                    (t.get("status") or {}).get("phase") in FINISHED for t in snap.tests.values()
                )
                if (not missing and settled) or time.monotonic() - t1 > 30:
                    break
                time.sleep(1.0)
            print(f"breaker's samples checked {time.monotonic() - t1:.0f}s later", flush=True)

            violations: list[str] = []
            for name in nodes:
                node, tests, tickets = snap.nodes[name], snap.by_node[name], snap.tickets[name]
                node_jobs = [
                    j
                    for j in snap.jobs
                    if (j.metadata.labels or {}).get("sdcguard.dev/node") == name
                ]
                violations += node_violations(node, tests, tickets)
                violations += screening_violations(name, tests, node_jobs)
                if name in faulty and not (repairs and name == repaired):
                    if len(tickets) != 1:
                        violations.append(f"{name}: faulty node has {len(tickets)} tickets")
                elif name == repaired and repairs:
                    phases = [(t.get("status") or {}).get("phase") for t in tickets]
                    if phases != ["Closed"]:
                        violations.append(f"{name}: repaired node's tickets are {phases}")
                elif tickets:
                    violations.append(f"{name}: healthy node has tickets")
            violations += breaker_violations(snap.policy, snap.tests)
            reasons = Counter(t["spec"]["reason"] for t in snap.tests.values())
            print(
                f"tests: {len(snap.tests)} {dict(reasons)}; "
                f"screenings not in the breaker's samples: {missing}",
                flush=True,
            )
            # The breaker rebuilds its samples from finished SDCTests: a screening whose
            # pass died (or whose operator was killed) still counts.
            violations += [f"breaker never counted screening {t}" for t in missing]
            if missing:
                print(
                    missing_samples_report(snap.policy, snap.tests, missing, operator), flush=True
                )
            assert kills >= 10
            assert not violations, f"seed {seed}: " + "\n".join(violations)
        except BaseException:
            print("---- operator log (tail) ----\n" + operator.log_tail(60))
            print("---- nodes ----\n" + describe(api_client, nodes), flush=True)
            raise
        finally:
            operator.stop()
            for worker in workers:
                worker.halt.set()
            for pod in list(running):
                with contextlib.suppress(client.ApiException):
                    core.delete_namespaced_pod(pod, "default", grace_period_seconds=0)
            delete_all(api_client)


pytestmark = pytest.mark.cluster
