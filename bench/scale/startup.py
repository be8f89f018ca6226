"""Operator start-up against a history of SDCTests and RepairTickets, by their count.

    python -m bench.scale.startup [--sizes 500,1000,2000,4000] [--tickets-share 0.1]
        [--repeats 3] [--operator-src DIR] [--out bench/results/startup.md]
        [--before OLD.json] [--render RUN.json]

SDCTests grow with the fleet and its history (one per screening, kept), tickets with
its failures. They reach the operator through its own paged list-then-watch
(``adapters/inventory.py``), not Kopf's indexing, whose initial listing wakes every
waiting worker for each object indexed (time in the square of the count). On a local
control plane, with one policy and no nodes, the benchmark creates SDCTests up to each
size (finished ones, with a status as a probe writes it: five checks with digests and
metrics, 2.2 KB each before the API server adds its metadata) and a share of
RepairTickets (nine in ten closed and delivered, one in ten open, so the ticket
announcer has those to look at), then starts the operator as a real process and times,
from the process's start:

- **copy complete**: the operator's log says its SDCTest and RepairTicket mirrors
  synced (every kind listed completely once; no decision before);
- **first pass**: the operator's first reconcile pass (Kopf has started, its few
  indexes are complete, the policy's daemon has run once over the complete copy);
- the operator's CPU time and peak RSS at its first pass, and its CPU use in the
  32 s after it (nothing to do but the announcer's looks at the open tickets);
- **standby takeover** (``--takeovers`` per size): two replicas with leader election;
  once the leader has passed once and the standby has listed every kind, the leader
  is killed (SIGKILL); seconds from the kill to the standby's Lease (the lease
  duration, 8 s, is most of it) and to its first pass;

and, in-process, the CPU time of one paged list of the SDCTests through the
operator's own mirror (parse, slim, store; the API server's time apart), per 1,000
tests. The operator is started ``--repeats`` times per size (medians; the machine is
shared, so wall times carry noise, CPU times less). A linear fit of each figure
against the count says whether start-up grows linearly. ``--operator-src`` runs
another ``operator/`` tree (an older commit's, for a before/after comparison); its
in-process figure is then not measured. Each run's figures are kept beside the table
as JSON (``startup.json``); ``--before`` shows another run's (the older operator's)
beside them, in the table and the plot (``startup.png``), and ``--render`` writes the
table and plot again from a run's JSON without running.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime as dt
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from kubernetes import client, config

from bench.scale.inventory import linear_fit
from sdcdev import harness
from sdcdev.cluster.localcluster import LocalCluster
from sdcdev.harness import NS, REPO, apply_crds, ensure_namespace, policy_body
from sdcguard.adapters import notify
from sdcguard.adapters.inventory import Inventory
from sdcguard.adapters.pass_state import TestSnapshot
from sdcguard.api import GROUP, VERSION, RepairTicket
from sdcguard.runtime.mirror import Mirror, cluster_custom, retrying_client

CHECKS = ("compute", "collective", "golden", "memory", "training")
POLICY = "startup-bench"
WAIT_S = 600.0
IDLE_S = 32.0
"""How long the first start of each size is watched after its first pass: two periods
of the ticket announcer (15 s), which looks again at the open tickets only."""


def sdctest_body(i: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """An SDCTest and the status a finished screening writes to it."""
    node = f"gpu-{i // 4:06d}"
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SDCTest",
        "metadata": {"name": f"{node}-{i % 4 + 1}", "labels": {"sdcguard.dev/node": node}},
        "spec": {"nodeName": node, "policyRef": POLICY, "suite": "acceptance", "reason": "Join"},
    }
    sdc = i % 50 == 0
    status = {
        "phase": "Failed" if sdc else "Passed",
        "verdict": "SDC" if sdc else "Pass",
        "reason": "GoldenMismatch" if sdc else "AllChecksPassed",
        "message": "screening finished",
        "startTime": "2026-12-01T00:00:00Z",
        "completionTime": "2026-12-01T00:09:00Z",
        "fingerprintHash": f"{i % 7:064x}",
        "jobName": f"sdcprobe-{node}-{i % 4 + 1}",
        "deviceIDs": [f"GPU-{i:08d}-{d}" for d in range(8)],
        "dataSeed": 1000 + i,
        "checks": [
            {
                "name": name,
                "verdict": "SDC" if sdc and name == "golden" else "Pass",
                "reason": "digests agree across devices and with the baseline",
                "digest": f"{(i * 31 + k):064x}",
                "metrics": {"seconds": "12.5", "mismatches": "0", "gbps": "812.4"},
                **({"oddDevice": 3} if sdc and name == "golden" else {}),
            }
            for k, name in enumerate(CHECKS)
        ],
        "conditions": [
            {
                "type": "Complete",
                "status": "True",
                "reason": "ProbeFinished",
                "message": "the probe reported",
                "lastTransitionTime": "2026-12-01T00:09:00Z",
            }
        ],
    }
    return body, {"status": status}


def ticket_body(i: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """A RepairTicket: nine in ten closed with their closing event delivered (no timer),
    one in ten open (a timer, which finds no sinks and writes nothing)."""
    node = f"gpu-{i * 10:06d}"
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "RepairTicket",
        "metadata": {"name": f"{node}-t{i}"},
        "spec": {"nodeName": node, "policyRef": POLICY, "evidence": [f"{node}-1", f"{node}-2"]},
    }
    status: dict[str, Any] = {"phase": "Open", "openedAt": "2026-12-01T00:10:00Z"}
    if i % 10:
        status.update(
            phase="Closed", closedAt="2026-12-01T01:00:00Z", openedAt="2026-12-01T00:10:00Z"
        )
        ticket = RepairTicket.model_validate({**body, "status": status})
        key = notify.idempotency_key(ticket, notify.event_for(ticket))
        status["notification"] = {"delivered": True, "attempts": 1, "idempotencyKey": key}
    return body, {"status": status}


def create(custom: client.CustomObjectsApi, plural: str, made: tuple[dict[str, Any], ...]) -> None:
    body, status = made
    custom.create_cluster_custom_object(GROUP, VERSION, plural, body)
    name = body["metadata"]["name"]
    custom.patch_cluster_custom_object_status(GROUP, VERSION, plural, name, status)


def fill(api: client.ApiClient, plural: str, make: Any, start: int, stop: int) -> None:
    custom = client.CustomObjectsApi(api)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for future in [pool.submit(create, custom, plural, make(i)) for i in range(start, stop)]:
            future.result()


def list_cost(api: client.ApiClient) -> tuple[float, float, int]:
    """Wall and CPU seconds of one paged list of every SDCTest through the mirror."""
    mirror: Mirror[TestSnapshot] = Mirror(
        retrying_client(api), cluster_custom(GROUP, VERSION, "sdctests"), TestSnapshot.slim
    )
    wall, cpu = time.monotonic(), time.thread_time()
    mirror.relist(threading.Event())
    return time.monotonic() - wall, time.thread_time() - cpu, len(mirror)


def start_operator(kubeconfig: Path, log: Path, src: Path, **extra: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    # Timed as its image runs it, from compiled bytecode: a shell that turns the
    # bytecode cache off would have every start compile the operator first (seconds).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(
        KUBECONFIG=str(kubeconfig),
        SDCGUARD_NAMESPACE=NS,
        SDCGUARD_LOG_FORMAT="json",
        SDCGUARD_METRICS_PORT="0",
        PYTHONPATH=os.pathsep.join([str(src), str(REPO / "jobs")]),
        **extra,
    )
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "sdcguard", "--liveness", ""],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop(proc: subprocess.Popen[bytes], *, kill: bool = False) -> None:
    """SIGTERM (a clean stop: a leader hands its Lease over), or SIGKILL (a crash)."""
    if proc.poll() is None:
        if kill:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class OperatorLog:
    """The milestones in one operator's JSON log, each at the time it was first read
    (seconds on the monotonic clock)."""

    def __init__(self, path: Path, proc: subprocess.Popen[bytes]) -> None:
        self.path, self.proc = path, proc
        self.offset = 0
        self.seen: dict[str, float] = {}

    def read(self) -> None:
        text = self.path.read_bytes()[self.offset :]
        cut = text.rfind(b"\n") + 1
        self.offset += cut
        now = time.monotonic()
        for line in text[:cut].splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            event = entry.get("event")
            if event == "mirror synced":
                self.seen.setdefault(f"synced {entry.get('kind')}", now)
            elif event in ("reconcile pass", "leading"):
                self.seen.setdefault(str(event), now)

    def wait(self, what: str, started: float) -> float:
        """Seconds from ``started`` to the milestone ``what``."""
        while what not in self.seen:
            if time.monotonic() - started > WAIT_S or self.proc.poll() is not None:
                raise RuntimeError(f"no {what} (log {self.path}):\n{self.path.read_text()[-3000:]}")
            self.read()
            time.sleep(0.05)
        return self.seen[what] - started


def until_first_pass(ps: psutil.Process, watch: OperatorLog, started: float) -> int:
    """Read the operator's log until its first reconcile pass (raises, with the log's
    tail, after ``WAIT_S`` or if the process ends); its peak RSS meanwhile, in bytes."""
    peak = 0
    while "reconcile pass" not in watch.seen:
        if time.monotonic() - started > WAIT_S or watch.proc.poll() is not None:
            watch.wait("reconcile pass", started)  # raises, with the log
        watch.read()
        peak = max(peak, ps.memory_info().rss)
        time.sleep(0.05)
    return peak


def time_start(kubeconfig: Path, log: Path, src: Path, idle_s: float = 0.0) -> dict[str, float]:
    """Start the operator; seconds from its start to each milestone in its log (and,
    with ``idle_s``, its CPU use over that long after the first pass: cores)."""
    started = time.monotonic()
    proc = start_operator(kubeconfig, log, src)
    out: dict[str, float] = {}
    try:
        ps = psutil.Process(proc.pid)
        watch = OperatorLog(log, proc)
        peak_rss = until_first_pass(ps, watch, started)
        out["first pass"] = watch.seen["reconcile pass"] - started
        times = ps.cpu_times()
        out["cpu"] = times.user + times.system
        if idle_s:
            time.sleep(idle_s)
            later = ps.cpu_times()
            out["idle cores"] = (later.user + later.system - out["cpu"]) / idle_s
            peak_rss = max(peak_rss, ps.memory_info().rss)
        out["rss"] = float(peak_rss)
    finally:
        stop(proc)
    ours = [watch.seen.get(f"synced {k}") for k in ("sdctests", "repairtickets")]
    if all(at is not None for at in ours):
        out["copy complete"] = max(at for at in ours if at is not None) - started
    return out


def takeover(kubeconfig: Path, logs: Path, src: Path) -> dict[str, float]:
    """Two replicas with leader election: once the leader has made its first pass and
    the standby's copy is warm (every kind the leader listed, listed by the standby
    too), the leader is killed; seconds from the kill to the standby's Lease and to its
    first pass."""
    election = {"SDCGUARD_LEADER_ELECTION": "true"}
    started = time.monotonic()
    leader = start_operator(
        kubeconfig, logs / "leader.log", src, SDCGUARD_LEADER_IDENTITY="bench-a", **election
    )
    standby: subprocess.Popen[bytes] | None = None
    try:
        first = OperatorLog(logs / "leader.log", leader)
        first.wait("reconcile pass", started)
        standby = start_operator(
            kubeconfig, logs / "standby.log", src, SDCGUARD_LEADER_IDENTITY="bench-b", **election
        )
        second = OperatorLog(logs / "standby.log", standby)
        for kind in [k for k in first.seen if k.startswith("synced ")]:
            second.wait(kind, started)
        time.sleep(2.0)  # the standby campaigns (and fails) at least once
        assert "leading" not in second.seen, "the standby led while the leader lived"
        killed = time.monotonic()
        stop(leader, kill=True)
        return {
            "lease": second.wait("leading", killed),
            "first pass": second.wait("reconcile pass", killed),
        }
    finally:
        stop(leader, kill=True)
        if standby is not None:
            stop(standby)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.scale.startup", description=__doc__)
    parser.add_argument("--sizes", default="500,1000,2000,4000")
    parser.add_argument("--tickets-share", type=float, default=0.1)
    parser.add_argument("--operator-src", type=Path, default=REPO / "operator")
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/startup.md")
    parser.add_argument("--label", default="", help="what the run is, for the table")
    parser.add_argument("--repeats", type=int, default=3, help="operator starts per size")
    parser.add_argument("--takeovers", type=int, default=1, help="standby takeovers per size")
    parser.add_argument(
        "--render", type=Path, help="no run: write the table and plot of this run's JSON"
    )
    parser.add_argument(
        "--before", type=Path, help="another run's JSON (an older operator), shown beside"
    )
    args = parser.parse_args(argv)
    if args.render:
        run = json.loads(args.render.read_text())
    else:
        run = measure(args)
        args.out.with_suffix(".json").write_text(json.dumps(run, indent=1) + "\n")
    before = json.loads(args.before.read_text()) if args.before else None
    write(args.out, run, before)
    return 0


def measure(args: argparse.Namespace) -> dict[str, Any]:
    sizes = sorted(int(s) for s in args.sizes.split(","))
    own = args.operator_src.resolve() == (REPO / "operator").resolve()
    rows: list[dict[str, Any]] = []
    run: dict[str, Any] = {
        "load": os.getloadavg()[0],
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "label": args.label,
        "rows": rows,
    }
    with LocalCluster() as cluster:
        admin = config.new_client_from_config(str(cluster.kubeconfig))
        admin.configuration.connection_pool_maxsize = 16
        apply_crds(admin)
        ensure_namespace(admin)
        client.CustomObjectsApi(admin).create_cluster_custom_object(
            GROUP, harness.VERSION, "sdcpolicies", policy_body(POLICY)
        )
        made_tests = made_tickets = 0
        for n in sizes:
            tickets = int(n * args.tickets_share)
            fill(admin, "sdctests", sdctest_body, made_tests, n)
            fill(admin, "repairtickets", ticket_body, made_tickets, tickets)
            made_tests, made_tickets = n, tickets
            row: dict[str, Any] = {"tests": n, "tickets": tickets, "load": os.getloadavg()[0]}
            row["repeats"] = args.repeats
            if own:
                wall, cpu, kept = list_cost(admin)
                assert kept == n, (kept, n)
                row.update(list_wall=wall, list_cpu=cpu)
            starts = [
                time_start(
                    cluster.kubeconfig,
                    Path(cluster.state_dir) / f"operator-{n}-{k}.log",
                    args.operator_src,
                    idle_s=IDLE_S if k == 0 else 0.0,
                )
                for k in range(args.repeats)
            ]
            for key in starts[0]:
                values = sorted(s[key] for s in starts if key in s)
                row[key] = max(values) if key == "rss" else statistics.median(values)
            row["first passes"] = [round(s["first pass"], 2) for s in starts]
            for k in range(args.takeovers):
                logs = Path(cluster.state_dir) / f"takeover-{n}-{k}"
                logs.mkdir()
                took = takeover(cluster.kubeconfig, logs, args.operator_src)
                row.setdefault("takeovers", []).append({k: round(v, 2) for k, v in took.items()})
            print(json.dumps(row), flush=True)
            rows.append(row)
        # The inventory sees every object the API server has (its copy is complete).
        inv = Inventory(admin, NS, test_node=lambda _: None, clock=lambda: dt.datetime.now(dt.UTC))
        inv.warm()
        while not inv.synced():
            time.sleep(0.1)
        copied = (len(inv.tests), len(inv.tickets))
        inv.stop()
        assert copied == (made_tests, made_tickets), copied
    run["when"] = f"{dt.datetime.now(dt.UTC):%Y-%m-%dT%H:%M:%SZ}"
    return run


FITTED = (
    ("copy complete", "copy complete"),
    ("first pass", "first pass"),
    ("cpu", "operator CPU at first pass"),
    ("list_cpu", "CPU of one paged list"),
    ("takeover", "standby takeover, kill → the new leader's first pass"),
)


def table(run: dict[str, Any]) -> list[str]:
    rows = run["rows"]
    lines = [
        f"`python -m bench.scale.startup` on {run['cpus']} CPUs, Python {run['python']}, "
        f"load average {run['load']:.1f} at start, {run['when']}. {run['label']}".rstrip(),
        "",
        "| SDCTests | RepairTickets | copy complete | first pass (each start) "
        "| operator CPU at first pass | CPU after it (cores) | peak RSS "
        "| one paged list of the tests: wall / CPU (per 1,000) "
        "| standby takeover: kill → Lease / → first pass | load |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        listed = (
            f"{r['list_wall']:.2f} s / {r['list_cpu']:.2f} s "
            f"({1000 * r['list_cpu'] / r['tests']:.3f} s)"
            if "list_cpu" in r
            else "not measured"
        )
        copy = f"{r['copy complete']:.2f} s" if "copy complete" in r else "(no mirror)"
        idle = f"{r['idle cores']:.3f}" if "idle cores" in r else "not measured"
        took = "; ".join(
            f"{t['lease']:.1f} / {t['first pass']:.1f} s" for t in r.get("takeovers", [])
        )
        lines.append(
            f"| {r['tests']:,} | {r['tickets']:,} | {copy} | {r['first pass']:.2f} s "
            f"({', '.join(f'{v:.1f}' for v in r['first passes'])}) "
            f"| {r['cpu']:.1f} s | {idle} | {r['rss'] / 1e6:.0f} MB | {listed} "
            f"| {took or 'not measured'} | {r['load']:.1f} |"
        )
    xs = [float(r["tests"]) for r in rows]
    lines += ["", "Linear fits against the number of SDCTests (y = a + b·n):", ""]
    fitted = [{**r, "takeover": takeover_s(r)} for r in rows]
    for key, what in FITTED:
        if all(r.get(key) is not None for r in fitted) and len(rows) > 1:
            a, b, r2 = linear_fit(xs, [float(r[key]) for r in fitted])
            lines.append(f"- {what}: a = {a:.2f} s, b = {1000 * b:.3f} s per 1,000, r² = {r2:.3f}")
    return lines


def write(out: Path, run: dict[str, Any], before: dict[str, Any] | None) -> None:
    lines = ["# Operator start-up by the number of SDCTests", "", *table(run)]
    lines += [
        "",
        "Each size adds to the objects of the one before (one control plane), and the",
        "operator is started anew for each (medians of the starts): times are from its",
        "process start, read from its own log. The first pass needs Kopf started too (its",
        "indexes of the few policies and baselines).",
    ]
    if before is not None:
        lines += ["", "## Before: the same benchmark, SDCTests and tickets through Kopf", ""]
        lines += table(before)
        lines += [
            "",
            "What each SDCTest above the smallest size added (first pass wall, operator CPU):",
            "constant when start-up is linear in them, growing when it is quadratic.",
            "",
        ]
        for name, doc in (("now", run), ("before", before)):
            base = doc["rows"][0]
            for r in doc["rows"][1:]:
                extra = r["tests"] - base["tests"]
                lines.append(
                    f"- {name}, {base['tests']:,} → {r['tests']:,}: "
                    f"{1000 * (r['first pass'] - base['first pass']) / extra:.2f} ms, "
                    f"{1000 * (r['cpu'] - base['cpu']) / extra:.2f} ms"
                )
    out.write_text("\n".join(lines) + "\n")
    plot(run, before, out.with_suffix(".png"))
    print(out.read_text())


def takeover_s(row: dict[str, Any]) -> float | None:
    """The median of a size's takeovers, kill → the new leader's first pass."""
    took = [t["first pass"] for t in row.get("takeovers", [])]
    return statistics.median(took) if took else None


def plot(run: dict[str, Any], before: dict[str, Any] | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (wall, cpu, took) = plt.subplots(1, 3, figsize=(14, 4))
    for name, doc, style in (("now", run, "o-"), ("before (Kopf indexes)", before, "s--")):
        if doc is None:
            continue
        xs = [r["tests"] for r in doc["rows"]]
        wall.plot(xs, [r["first pass"] for r in doc["rows"]], style, label=name)
        cpu.plot(xs, [r["cpu"] for r in doc["rows"]], style, label=name)
        taken = [(r["tests"], t) for r in doc["rows"] if (t := takeover_s(r)) is not None]
        took.plot([x for x, _ in taken], [y for _, y in taken], style, label=name)
    wall.set(xlabel="SDCTests (and a tenth as many tickets)", ylabel="s")
    wall.set_title("start → first pass")
    cpu.set(xlabel="SDCTests", ylabel="CPU s", title="operator CPU at its first pass")
    took.set(xlabel="SDCTests", ylabel="s", title="leader killed → standby's first pass")
    for ax in (wall, cpu, took):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
