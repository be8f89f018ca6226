"""The demo's real node: the chart's operator Pod runs there, and the node is one of the rows.

With a real node (``LocalCluster(real_node=True)``: containerd, a CNI bridge, the kubelet
and a test device plugin advertising ``nvidia.com/gpu: 2``), the demo installs the
operator with ``helm install`` as the chart's Deployment, whose Pod runs on that node,
and screens the node itself under a policy of its own:

1. acceptance in a real probe container; the node's fingerprint is its own, so the
   demo approves its candidate digests as its baseline (``source: Approved``), as a
   person certifying reference hardware does (one node reaches no consensus);
2. once Qualified, a fault: the real node's policy sets ``probe.command`` (a fault
   spec in ``SDCPROBE_FAULTS``) and ``probe.args`` (``--allow-fault-injection``),
   which only a demo or a test does, and a manual screening is asked for, as
   ``kubectl sdc test`` does; SDC, the confirmation re-run, Quarantined, a
   RepairTicket;
3. the repair: the probe as shipped again, and the ticket resolved as Repaired, as
   ``kubectl sdc repaired`` does; the repair verification passes and the node is
   Qualified again.

Everything here goes through the API server, as a person or a repair system would.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sdcdev.sim.demo_watch import RecorderView
from sdcdev.sim.kube import JsonDict, Kube
from sdcguard.api.common import GROUP, VERSION
from sdcprobe import attest
from sdcprobe.result import ResultError, parse_result

REAL_NODE_LABEL = "sdcguard.dev/real-node"
STATE_LABEL = "sdcguard.dev/state"
FAULTS = {"faults": [{"site": "matmul", "rate": 0.01, "bits": "exp", "device": 1}]}
"""Exponent flips in every GEMM output of the node's device 1: the devices disagree, and
each check's digest differs from the approved baseline."""


def real_node_policy_body(name: str, budget_seconds: int, checks: tuple[str, ...]) -> JsonDict:
    """The real node's own SDCPolicy: its two CPU devices stand for its two GPUs, no
    re-screening after use (the demo asks for its screenings), one confirmation re-run."""
    suite = [{"name": c} for c in checks]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SDCPolicy",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"matchLabels": {REAL_NODE_LABEL: "true"}},
            "triggers": {
                "onJoin": True,
                "onReturnFromUse": {"enabled": False},
                "inconclusiveBackoff": "10s",
            },
            "suites": {"acceptance": suite, "requalification": suite, "repairVerification": suite},
            "probe": {
                "budgetSeconds": budget_seconds,
                "cpuDevices": 2,
                "activeDeadlineSeconds": 300,
                "ttlSecondsAfterFinished": 900,
            },
            "budgets": {"maxConcurrentTests": 1, "maxUnavailable": 1},
            "confirmation": {"reruns": 1},
            "repair": {"maxRepairCycles": 2},
            "baseline": {"mode": "Consensus", "quorum": 2},
        },
    }


@dataclass
class ChartOperator:
    """The operator as the chart's Pod (``helm install``), as the demo sees it."""

    api: client.ApiClient
    release: str
    namespace: str
    pod: str
    node: str
    runtime: str
    ready_seconds: float
    uninstall: Callable[[], object]
    logs: Callable[[], str]

    @property
    def alive(self) -> bool:
        """Its Pod is there and its container runs (a restart counts as alive: the
        Deployment's job)."""
        try:
            pod = client.CoreV1Api(self.api).read_namespaced_pod(self.pod, self.namespace)
        except ApiException:
            return False
        statuses = (pod.status.container_statuses if pod.status else None) or []
        return (
            bool(statuses)
            and statuses[0].state is not None
            and (statuses[0].state.running is not None)
        )

    def where(self) -> str:
        return f"Pod {self.namespace}/{self.pod} on node {self.node} ({self.runtime})"

    def stop(self) -> None:
        self.uninstall()

    def save_log(self, path: Path) -> None:
        """The operator container's log, as the kubelet wrote it."""
        with contextlib.suppress(OSError):
            path.write_text(self.logs())


@dataclass(frozen=True)
class KubeletVerdict:
    """A real-node test's probe result, as the kubelet wrote it into its Pod's status."""

    test: str
    pod: str
    node: str
    exit_code: int | None
    verdict: str
    injection: bool
    """The probe ran with fault injection on (it says so in every result)."""
    injected: int


@dataclass
class RealNodeScript:
    """Moves the real node's row along: approve its baseline, inject the fault, repair;
    and reads each finished test's termination message from its probe Pod."""

    api: client.ApiClient
    kubeconfig: Path
    node: str
    policy: str
    namespace: str
    """Where the operator creates probe Jobs."""
    note: Callable[[str], None]
    verdicts: dict[str, KubeletVerdict] = field(default_factory=dict)
    approved: bool = False
    fault_on: bool = False
    asked: int = 0
    """Manual screenings asked for with the fault on."""
    repaired: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)

    def step(self, view: RecorderView) -> None:
        """One look at the row; at most one action."""
        track = view.nodes.get(self.node)
        if track is None or not track.exists:
            return
        try:
            self._read_verdicts(view)
            test = view.current_test(self.node)
            if test is not None and test.awaiting_baseline and not self.approved:
                self._approve_candidate()
                return
            if (
                track.state == "Qualified"
                and track.first("Quarantined") is None
                and self._screening_due(view)
            ):
                self._inject_fault()
                return
            ticket = view.open_ticket(self.node)
            if (
                ticket is not None
                and track.state in ("Quarantined", "Repairing")
                and not ticket.resolution
                and ticket.name not in self.repaired
            ):
                self._repair(ticket.name)
        except (ApiException, OSError, ValueError) as exc:
            # The API server hiccupped, or a CLI rule refused: next second, and said once.
            said = f"{type(exc).__name__}: {str(exc)[:200]}"
            if said not in self.errors:
                self.errors.append(said)
                self.note(f"{self.node}: {said} (trying again)")

    def _sdc(self, *args: str) -> str:
        """``kubectl sdc ARGS`` (the plugin's entry point), as a person would run it; its
        first line."""
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        proc = subprocess.run(
            [sys.executable, "-m", "sdcguard.cli", *args],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        if proc.returncode != 0:
            raise ValueError(f"kubectl sdc {args[0]}: {(proc.stderr or proc.stdout).strip()}")
        return (proc.stdout.strip().splitlines() or [""])[0]

    def _custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    def _approve_candidate(self) -> bool:
        """Trust the real node's candidate digests (``source: Approved``)."""
        listed = Kube(self.api).request("GET", f"/apis/{GROUP}/{VERSION}/sdcbaselines")
        items: list[JsonDict] = listed.get("items") or []
        for baseline in items:
            for candidate in (baseline.get("status") or {}).get("candidates") or []:
                if candidate.get("nodeName") == self.node and candidate.get("digests"):
                    patch = {
                        "spec": {
                            "digests": candidate["digests"],
                            "trusted": True,
                            "source": "Approved",
                        }
                    }
                    name = baseline["metadata"]["name"]
                    self._custom().patch_cluster_custom_object(
                        GROUP, VERSION, "sdcbaselines", name, patch
                    )
                    self.approved = True
                    self.note(
                        f"{self.node}: approved its candidate digests as baseline {name} "
                        "(its fingerprint is its own: as a person certifying reference "
                        "hardware does)"
                    )
                    return True
        return False

    def _read_verdicts(self, view: RecorderView) -> None:
        """The termination message of each finished test's probe Pod (kept for 900 s
        after its Job ends), parsed as the operator parses it."""
        for test in view.tests_of(self.node):
            if not test.finished or test.name in self.verdicts or test.verdict is None:
                continue
            pods = client.CoreV1Api(self.api).list_namespaced_pod(
                self.namespace, label_selector=f"sdcguard.dev/test={test.name}"
            )
            for pod in pods.items:
                statuses = (pod.status.container_statuses if pod.status else None) or []
                term = statuses[0].state.terminated if statuses and statuses[0].state else None
                if term is None or not term.message:
                    continue
                try:
                    result = parse_result(self._opened(test.name, term.message))
                except ResultError:
                    continue
                seen = KubeletVerdict(
                    test=test.name,
                    pod=str(pod.metadata.name if pod.metadata else ""),
                    node=str(pod.spec.node_name if pod.spec else ""),
                    exit_code=term.exit_code,
                    verdict=str(result.verdict),
                    injection=result.injection.enabled,
                    injected=result.injection.count,
                )
                self.verdicts[test.name] = seen
                said = (
                    f", fault injection on ({seen.injected} corrupted elements)"
                    if seen.injection
                    else ""
                )
                self.note(
                    f"{self.node}: sdctest/{test.name} {test.verdict}; the kubelet's "
                    f"termination message of {seen.pod}: verdict {seen.verdict}, exit "
                    f"{seen.exit_code}{said}"
                )
                break

    def _opened(self, test: str, message: str) -> str:
        """The result document of a termination message: opened with the test's
        attestation Secret when the probe sealed it (as the operator opens it; a seal
        that does not verify raises ResultError), else the message as it is."""
        if attest.PREFIX not in message:
            return message
        # The test's attestation Secret carries the same test label as its probe Pod.
        secrets = (
            client.CoreV1Api(self.api)
            .list_namespaced_secret(self.namespace, label_selector=f"sdcguard.dev/test={test}")
            .items
        )
        if not secrets:
            raise ResultError(f"the attestation Secret of {test} is gone")
        secret = secrets[0]
        data = {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}
        # The Secret's files as the probe reads them (sdcprobe.attest).
        key = bytes.fromhex(data.get("key", ""))
        document, why = attest.unseal(message, key, data.get("nonce", ""))
        if document is None:
            raise ResultError(why)
        return document

    def _screening_due(self, view: RecorderView) -> bool:
        """The first manual screening, or another after one that ended Inconclusive (a
        probe starved of CPU on a loaded machine gets no result: no evidence either way),
        at most six."""
        manual = [t for t in view.tests_of(self.node) if t.reason == "Manual"]
        if self.asked >= 6 or len(manual) != self.asked:
            return False
        return not manual or (manual[-1].finished and manual[-1].verdict == "Inconclusive")

    def _patch_probe(self, probe: dict[str, Any]) -> None:
        self._custom().patch_cluster_custom_object(
            GROUP, VERSION, "sdcpolicies", self.policy, {"spec": {"probe": probe}}
        )

    def _inject_fault(self) -> None:
        self._patch_probe(
            {
                "command": [
                    "env",
                    f"SDCPROBE_FAULTS={json.dumps(FAULTS)}",
                    "python",
                    "-m",
                    "sdcprobe",
                ],
                "args": ["--allow-fault-injection"],
            }
        )
        again = " again (the last one was Inconclusive)" if self.asked else ""
        self.fault_on = True
        said = self._sdc("test", self.node, "--policy", self.policy)
        self.asked += 1
        self.note(
            f"{self.node}: fault injected (exponent flips in device 1's GEMMs, through the "
            f"policy's probe command); kubectl sdc test{again}: {said}"
        )

    def _repair(self, ticket: str) -> None:
        if self.fault_on:
            self._patch_probe({"command": None, "args": None})
            self.fault_on = False
        self._sdc("repaired", ticket, "--note", "demo: replaced device 1")
        self.repaired.add(ticket)
        self.note(
            f"{self.node}: the probe as shipped again; kubectl sdc repaired {ticket} "
            "(replaced device 1) -> repair verification"
        )


def reset_node(api: client.ApiClient, name: str) -> None:
    """Remove what sdcguard left on a node that outlives the demo (the real node of a
    shared cluster): its labels (not the kubelet's real-node label), annotations,
    taints and cordon. Run once no operator screens the node any more."""
    kube = Kube(api)
    try:
        node = kube.request("GET", f"/api/v1/nodes/{name}")
    except ApiException:
        return
    meta = node.get("metadata") or {}
    labels = {
        k: None
        for k in meta.get("labels") or {}
        if k.startswith("sdcguard.dev/") and k != REAL_NODE_LABEL
    }
    annotations = {k: None for k in meta.get("annotations") or {} if k.startswith("sdcguard.dev/")}
    taints = [
        t
        for t in (node.get("spec") or {}).get("taints") or []
        if not str(t.get("key", "")).startswith("sdcguard.dev/")
    ]
    kube.patch_node(
        name,
        {
            "metadata": {"labels": labels, "annotations": annotations},
            "spec": {"taints": taints or None, "unschedulable": None},
        },
    )
