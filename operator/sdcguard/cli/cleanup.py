"""``kubectl sdc cleanup``: take sdcguard off every node before it is uninstalled.

What each node loses, and why nodes held out for their hardware keep everything, is
:mod:`sdcguard.domain.cleanup`. Here: each node's release is one merge patch guarded by
the resourceVersion read (a conflict re-reads the node and plans again), every unfinished
SDCTest ends Cancelled (reason ``Uninstalled``: nothing would judge it) and its probe Job
is deleted. Run it with the operator stopped, or the operator writes its state again; a
second run finds nothing to do.

``--stop-operator NAMESPACE/DEPLOYMENT`` (the chart's pre-delete hook) first scales the
operator's Deployment to zero and waits for its Pods to end, so nothing writes its state
again; every SDCPolicy then loses Kopf's finalizer, which only a running operator removes
(a policy deleted with no operator left would otherwise wait forever; a reinstalled
operator puts it back)."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Sequence
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sdcguard.api import (
    GROUP,
    PLURAL_TESTS,
    VERSION,
    SDCPolicy,
    SDCTest,
    SDCTestPhase,
    SDCTestStatus,
    set_condition,
)
from sdcguard.builders.probe_job import TEST_LABEL, label_value
from sdcguard.cli.kube import CliError, Connection, call, list_typed
from sdcguard.cli.output import Result, Table
from sdcguard.domain.cleanup import NodeRelease, plan_release

CONFLICT_RETRIES = 5
REASON = "Uninstalled"
KOPF_FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"
"""The finalizer Kopf keeps on every SDCPolicy while an operator runs (its loop is a
daemon; its deletion handler releases the policy's nodes)."""
STOP_TIMEOUT_SECONDS = 120.0


def stop_operator(
    conn: Connection,
    target: str,
    timeout: float = STOP_TIMEOUT_SECONDS,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """Scale the operator's Deployment (``NAMESPACE/NAME``) to zero and wait until its
    Pods are gone; returns what was done, for the output."""
    namespace, _, name = target.partition("/")
    if not namespace or not name:
        raise CliError(f"--stop-operator takes NAMESPACE/DEPLOYMENT, got {target!r}")
    apps = client.AppsV1Api(conn.api)
    deployment = call(
        conn, apps.read_namespaced_deployment, name, namespace, plural="deployments", name=name
    )
    selector = ((deployment.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    call(
        conn,
        apps.patch_namespaced_deployment_scale,
        name,
        namespace,
        {"spec": {"replicas": 0}},
        plural="deployments",
        name=name,
    )
    labels = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
    deadline = clock() + timeout
    while True:
        pods = call(
            conn, conn.core.list_namespaced_pod, namespace, label_selector=labels, plural="pods"
        )
        left = [p["metadata"]["name"] for p in (pods or {}).get("items") or []]
        if not left:
            return f"operator {namespace}/{name} scaled to zero; its Pods have ended"
        if clock() >= deadline:
            raise CliError(
                f"operator Pods {', '.join(left)} still run {timeout:.0f} s after "
                f"{namespace}/{name} was scaled to zero; nothing was cleaned up"
            )
        sleep(1.0)


def drop_policy_finalizers(conn: Connection) -> list[str]:
    """Take Kopf's finalizer off every SDCPolicy (no operator is left to); returns the
    policies changed. Guarded by the resourceVersion read: a conflict is left as it is
    (someone else changed the policy; the next run takes it off)."""
    listed = list_typed(conn, SDCPolicy, "sdcpolicies")
    changed = []
    for policy in listed.items:
        finalizers = policy.metadata.finalizers
        if KOPF_FINALIZER not in finalizers:
            continue
        kept = [f for f in finalizers if f != KOPF_FINALIZER]
        patch = {
            "metadata": {
                "finalizers": kept or None,
                "resourceVersion": policy.metadata.resource_version,
            }
        }
        name = policy.metadata.name
        call(
            conn,
            conn.custom.patch_cluster_custom_object,
            GROUP,
            VERSION,
            "sdcpolicies",
            name,
            patch,
            plural="sdcpolicies",
            name=name,
        )
        changed.append(name)
    return changed


def _release(conn: Connection, name: str) -> NodeRelease:
    """Plan and write one node's release; a write that meets a newer Node (409) reads it
    again and plans again, so a taint someone added in between is never dropped."""
    for _ in range(CONFLICT_RETRIES):
        body: dict[str, Any] = call(conn, conn.core.read_node, name, plural="nodes", name=name)
        meta, spec = body.get("metadata") or {}, body.get("spec") or {}
        plan = plan_release(
            name,
            meta.get("labels") or {},
            meta.get("annotations") or {},
            spec.get("taints") or [],
            bool(spec.get("unschedulable")),
        )
        if plan.kept or not plan.changes:
            return plan
        try:
            conn.core.patch_node(name, plan.patch(meta.get("resourceVersion")))
            return plan
        except ApiException as exc:
            if exc.status != 409:
                raise CliError(f"node {name}: API error {exc.status}: {exc.reason}") from None
    raise CliError(f"node {name} kept changing; run the command again")


def _cancel(
    conn: Connection, test: SDCTest, now: dt.datetime, jobs_namespace: str | None = None
) -> int:
    """End one unfinished test Cancelled and delete its probe Jobs; returns Jobs deleted."""
    status = test.status or SDCTestStatus()
    message = "sdcguard is being uninstalled: cancelled, no result"
    patch = {
        "metadata": {"resourceVersion": test.metadata.resource_version},
        "status": {
            "phase": SDCTestPhase.CANCELLED.value,
            "reason": REASON,
            "message": message,
            "completionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "conditions": [
                c.model_dump(mode="json", by_alias=True, exclude_none=True)
                for c in set_condition(status.conditions, "Complete", "True", REASON, message, now)
            ],
        },
    }
    name = test.metadata.name
    call(
        conn,
        conn.custom.patch_cluster_custom_object_status,
        GROUP,
        VERSION,
        PLURAL_TESTS,
        name,
        patch,
        plural=PLURAL_TESTS,
        name=name,
    )
    batch = client.BatchV1Api(conn.api)
    selector = f"{TEST_LABEL}={label_value(name)}"
    if jobs_namespace:  # the operator's namespace: its probe Jobs live there only
        jobs = call(
            conn,
            batch.list_namespaced_job,
            jobs_namespace,
            label_selector=selector,
            plural="jobs",
        )
    else:
        jobs = call(conn, batch.list_job_for_all_namespaces, label_selector=selector, plural="jobs")
    deleted = 0
    for job in (jobs or {}).get("items") or []:
        meta = job.get("metadata") or {}
        try:
            batch.delete_namespaced_job(
                meta["name"], meta["namespace"], propagation_policy="Background"
            )
            deleted += 1
        except ApiException as exc:
            if exc.status != 404:
                raise CliError(f"job {meta['name']}: API error {exc.status}") from None
    return deleted


def cleanup(
    conn: Connection,
    confirm: Callable[[list[str]], bool],
    now: dt.datetime,
    selector: str | None = None,
    stop: str | None = None,
    jobs_namespace: str | None = None,
) -> Result:
    """Release every node sdcguard holds except those held out for their hardware, and
    cancel every unfinished SDCTest (deleting its Job). ``selector``: only the nodes with
    these labels, and only their tests (one pool at a time). ``stop``: the operator's
    Deployment (NAMESPACE/NAME), scaled to zero first; then the policies lose Kopf's
    finalizer. ``jobs_namespace``: look for probe Jobs only there."""
    stopped = [stop_operator(conn, stop)] if stop else []
    bodies = call(conn, conn.core.list_node, label_selector=selector or "", plural="nodes")
    selected = {i["metadata"]["name"] for i in (bodies or {}).get("items") or []}
    plans = []
    for item in (bodies or {}).get("items") or []:
        meta, spec = item.get("metadata") or {}, item.get("spec") or {}
        plans.append(
            plan_release(
                meta["name"],
                meta.get("labels") or {},
                meta.get("annotations") or {},
                spec.get("taints") or [],
                bool(spec.get("unschedulable")),
            )
        )
    listed = list_typed(conn, SDCTest, PLURAL_TESTS)
    running = [
        t
        for t in listed.items
        if not (t.status or SDCTestStatus()).phase.finished
        and (selector is None or t.spec.node_name in selected)
    ]
    touched = [p for p in plans if p.kept or p.changes]
    if not touched and not running:
        unheld = drop_policy_finalizers(conn) if stop else []
        return Result(
            data={"nodes": [], "cancelledTests": [], "kept": [], "unheldPolicies": unheld},
            lines=[
                *stopped,
                "nothing of sdcguard's on any node; no test in flight",
                *listed.warnings,
            ],
        )
    summary = [p.describe() for p in sorted(touched, key=lambda p: p.node)]
    summary += [f"test {t.metadata.name}: cancel, delete its Job" for t in running]
    if not confirm(summary):
        raise CliError("not cleaned up: nothing was changed")
    done = [_release(conn, p.node) for p in sorted(touched, key=lambda p: p.node)]
    jobs = sum(_cancel(conn, t, now, jobs_namespace) for t in running)
    unheld = drop_policy_finalizers(conn) if stop else []
    kept = [p for p in done if p.kept]
    rows: list[Sequence[str]] = [
        [p.node, "kept" if p.kept else "released" if p.changes else "clean", p.describe()]
        for p in done
    ]
    lines = [
        *stopped,
        f"{len(done) - len(kept)} nodes released, {len(running)} tests cancelled, "
        f"{jobs} Jobs deleted",
        *listed.warnings,
    ]
    if kept:
        lines.append(
            f"kept {len(kept)} nodes held out for their hardware (quarantined, in repair, "
            "verifying or retired): return one with kubectl taint/uncordon by hand, or "
            "reinstall and use kubectl sdc release NODE"
        )
    return Result(
        data={
            "nodes": [p.node for p in done if not p.kept],
            "kept": [p.node for p in kept],
            "cancelledTests": [t.metadata.name for t in running],
            "jobsDeleted": jobs,
            "unheldPolicies": unheld,
        },
        tables=[Table(["node", "result", "what"], rows)],
        lines=lines,
    )
