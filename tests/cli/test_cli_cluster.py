"""kubectl sdc against the local control plane: every subcommand, as a person reads it
(tables) and as a program reads it (-o json), plus the plugin mechanism of kubectl itself."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from sdcdev.cluster.localcluster import LocalCluster
from sdcdev.harness import GROUP, VERSION, create_sdctest, workload_record
from sdcguard.cli import main

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.cluster


@dataclass
class Fleet:
    """Objects this module created, with a unique suffix so other tests are not disturbed."""

    suffix: str
    kubeconfig: str
    env: dict[str, str]
    api: client.ApiClient
    policy: str
    healthy: str
    sick: str
    gone: str
    ticket: str
    baseline: str

    def sdc(self, *args: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        code = main([*args, "--kubeconfig", self.kubeconfig], stdout=out, stderr=err)
        return code, out.getvalue(), err.getvalue()

    def sdc_json(self, *args: str) -> Any:
        code, out, err = self.sdc(*args, "-o", "json")
        assert code == 0, err
        return json.loads(out)


def _custom(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def _create_node(core: client.CoreV1Api, name: str, labels: dict[str, str], gpus: int) -> None:
    core.create_node(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}
    )
    core.patch_node_status(
        name,
        {
            "status": {
                "capacity": {"nvidia.com/gpu": str(gpus)},
                "allocatable": {"nvidia.com/gpu": str(gpus)},
            }
        },
        _content_type="application/merge-patch+json",
    )


@pytest.fixture(scope="module")
def fleet(cluster: LocalCluster, api_client: client.ApiClient) -> Iterator[Fleet]:
    env = cluster.env()
    subprocess.run(
        ["kubectl", "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds")],
        env=env,
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            "kubectl",
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "-f",
            str(ROOT / "crds"),
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    s = uuid.uuid4().hex[:6]
    f = Fleet(
        suffix=s,
        kubeconfig=str(cluster.kubeconfig),
        env=env,
        api=api_client,
        policy=f"cli-{s}",
        healthy=f"cli-{s}-gpu-1",
        sick=f"cli-{s}-gpu-2",
        gone=f"cli-{s}-gpu-0",
        ticket=f"cli-{s}-gpu-2-1",
        baseline=f"fp-cli{s}",
    )
    core = client.CoreV1Api(api_client)
    custom = _custom(api_client)
    pool_label = f"cli-test.sdcguard.dev/pool-{s}"
    labels = {"cli-test.sdcguard.dev/run": s, pool_label: "h100"}
    custom.create_cluster_custom_object(
        GROUP,
        VERSION,
        "sdcpolicies",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SDCPolicy",
            "metadata": {"name": f.policy},
            "spec": {
                "nodeSelector": {"matchLabels": {"cli-test.sdcguard.dev/run": s}},
                "budgets": {"poolLabel": pool_label},
                "mode": "Observe",
            },
        },
    )
    _create_node(core, f.healthy, {**labels, "sdcguard.dev/state": "Qualified"}, 8)
    _create_node(core, f.sick, {**labels, "sdcguard.dev/state": "Repairing"}, 8)
    custom.patch_cluster_custom_object_status(
        GROUP,
        VERSION,
        "sdcpolicies",
        f.policy,
        {
            "status": {
                "breaker": {
                    "state": "Open",
                    "reason": "3 of 5 screenings failed in the last 1h (limit 50%)",
                    "windowSamples": 5,
                    "windowFailures": 3,
                }
            }
        },
    )
    # A failed test and its ticket for the sick node; a test for a node that is gone.
    for test_name, node_name, status in (
        (
            f"{f.sick}-rq-1",
            f.sick,
            {
                "phase": "Failed",
                "verdict": "SDC",
                "reason": "DigestMismatch",
                "startTime": "2025-01-01T10:00:00Z",
                "completionTime": "2025-01-01T10:20:00Z",
                "checks": [
                    {"name": "golden", "verdict": "SDC", "oddDevice": 5, "firstDivergentStep": 12}
                ],
            },
        ),
        (f"{f.gone}-acc-1", f.gone, {"phase": "Passed", "verdict": "Pass"}),
    ):
        create_sdctest(
            custom,
            test_name,
            {
                "nodeName": node_name,
                "policyRef": f.policy,
                "suite": "requalification",
                "reason": "Expiry",
            },
            status,
        )
    custom.create_cluster_custom_object(
        GROUP,
        VERSION,
        "repairtickets",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "RepairTicket",
            "metadata": {"name": f.ticket},
            "spec": {
                "nodeName": f.sick,
                "policyRef": f.policy,
                "evidence": [f"{f.sick}-rq-1"],
                "external": {"system": "jira", "id": "OPS-7"},
            },
        },
    )
    custom.patch_cluster_custom_object_status(
        GROUP,
        VERSION,
        "repairtickets",
        f.ticket,
        {
            "status": {
                "phase": "InRepair",
                "cycle": 1,
                "openedAt": "2025-01-01T10:21:00Z",
                "history": [
                    {"time": "2025-01-01T10:21:00Z", "phase": "Open", "message": "quarantined"},
                    {"time": "2025-01-01T11:00:00Z", "phase": "InRepair", "message": "handed over"},
                ],
            }
        },
    )
    custom.create_cluster_custom_object(
        GROUP,
        VERSION,
        "sdcbaselines",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SDCBaseline",
            "metadata": {"name": f.baseline},
            "spec": {
                "fingerprint": {
                    "hash": "ab" * 32,
                    "backend": "cuda",
                    "deviceModel": "NVIDIA H100",
                    "deviceCount": 8,
                },
                "digests": {"golden": "cd" * 32, "compute": "ef" * 32},
                "source": "Consensus",
                "trusted": True,
            },
        },
    )
    custom.patch_cluster_custom_object_status(
        GROUP,
        VERSION,
        "sdcbaselines",
        f.baseline,
        {"status": {"agreeingNodes": [f.healthy, f"{f.gone}", "n3", "n4"]}},
    )
    yield f
    for plural, names in (
        ("sdctests", None),
        ("repairtickets", [f.ticket]),
        ("sdcbaselines", [f.baseline]),
        ("sdcpolicies", [f.policy]),
    ):
        if names is None:
            items = custom.list_cluster_custom_object(GROUP, VERSION, plural)["items"]
            names = [
                i["metadata"]["name"] for i in items if i["metadata"]["name"].startswith(f"cli-{s}")
            ]
        for name in names:
            custom.delete_cluster_custom_object(GROUP, VERSION, plural, name)
    for name in (f.healthy, f.sick):
        core.delete_node(name)


# ---------------------------------------------------------------- status


def test_status_json(fleet: Fleet) -> None:
    data = fleet.sdc_json("status")
    (mine,) = [p for p in data["policies"] if p["name"] == fleet.policy]
    assert mine["mode"] == "Observe"
    assert mine["breaker"]["state"] == "Open"
    assert "3 of 5" in mine["breaker"]["reason"]
    (pool,) = [p for p in data["pools"] if p["policy"] == fleet.policy]
    assert pool == {
        "policy": fleet.policy,
        "pool": "h100",
        "nodes": 2,
        "states": {"Qualified": 1, "Repairing": 1},
        "overdue": 0,
    }
    (ticket,) = [t for t in data["openTickets"] if t["name"] == fleet.ticket]
    assert ticket["node"] == fleet.sick and ticket["phase"] == "InRepair"
    assert ticket["external"] == "jira:OPS-7"


def test_status_table(fleet: Fleet) -> None:
    code, out, _ = fleet.sdc("status")
    assert code == 0
    assert "POLICY" in out and "BREAKER" in out
    line = next(t for t in out.splitlines() if t.startswith(fleet.policy + " ") and "Observe" in t)
    assert "Open" in line and "3/5 failed" in line
    pool_line = next(t for t in out.splitlines() if t.startswith(fleet.policy) and "h100" in t)
    assert pool_line.split()[:3] == [fleet.policy, "h100", "2"]
    assert "Open repair tickets:" in out and fleet.ticket in out


def test_status_yaml(fleet: Fleet) -> None:
    code, out, _ = fleet.sdc("status", "-o", "yaml")
    assert code == 0
    assert any(p["name"] == fleet.policy for p in yaml.safe_load(out)["policies"])


def test_status_shows_the_next_nodes_for_budget_and_why(fleet: Fleet) -> None:
    why = "chance 3.00e-02: fault began since the last pass 400h ago"
    _custom(fleet.api).patch_cluster_custom_object_status(
        GROUP,
        VERSION,
        "sdcpolicies",
        fleet.policy,
        {
            "status": {
                "budgetOrder": [
                    {"node": fleet.healthy, "basis": "risk", "chance": 0.03, "reason": why}
                ]
            }
        },
    )
    data = fleet.sdc_json("status")
    (row,) = [r for r in data["budgetOrder"] if r["policy"] == fleet.policy]
    assert (row["place"], row["node"], row["basis"], row["reason"]) == (
        1,
        fleet.healthy,
        "risk",
        why,
    )
    code, out, _ = fleet.sdc("status")
    assert code == 0 and "Next for test budget" in out and why in out


# ---------------------------------------------------------------- fleet


def test_fleet_figures_from_the_objects_sdcguard_keeps(fleet: Fleet) -> None:
    data = fleet.sdc_json("fleet")
    assert sum(t["failures"] for t in data["hardwareTypes"]) >= 1, "the sick node's SDC verdict"
    for row in data["hardwareTypes"]:
        assert 0 <= row["low"] <= row["rate"] <= row["high"] <= 1
    assert data["onsetToQuarantine"]["incidents"] >= 1, "the sick node's ticket"
    assert 0 <= data["pastRecertification"]["share"] <= 1
    assert "note" in data["exposure"]
    code, out, err = fleet.sdc("fleet")
    assert code == 0, err
    assert "Failures per hardware type" in out and "Onset to quarantine" in out
    assert "Exposure estimate for the current policy" in out


# ---------------------------------------------------------------- test


def test_test_creates_a_manual_sdctest(fleet: Fleet) -> None:
    created = fleet.sdc_json("test", fleet.healthy, "--suite", "acceptance")
    name = created["metadata"]["name"]
    assert name.startswith(f"{fleet.healthy}-manual-")
    obj = _custom(fleet.api).get_cluster_custom_object(GROUP, VERSION, "sdctests", name)
    assert obj["spec"] == {
        "nodeName": fleet.healthy,
        "policyRef": fleet.policy,
        "suite": "acceptance",
        "reason": "Manual",
        "attempt": 1,
    }
    assert obj["metadata"]["labels"]["sdcguard.dev/node"] == fleet.healthy
    assert obj["metadata"]["annotations"]["sdcguard.dev/requested-by"] == "admin"
    # A second request while the first has not ended is refused, naming the first.
    code, out, err = fleet.sdc("test", fleet.healthy, "--policy", fleet.policy)
    assert code == 1 and out == ""
    assert err == (
        f"error: node {fleet.healthy} already has a test that has not ended: sdctest/{name} "
        f"(Pending); follow it with kubectl get sdctest {name} -w, and run this again once it "
        f"ends (or cancel it: kubectl delete sdctest {name})\n"
    )
    tests = [
        t
        for t in _custom(fleet.api).list_cluster_custom_object(GROUP, VERSION, "sdctests")["items"]
        if t["spec"]["nodeName"] == fleet.healthy
    ]
    assert [t["metadata"]["name"] for t in tests] == [name]
    # Once it ended, the next one is created; a node that qualified before gets the
    # requalification suite.
    _custom(fleet.api).patch_cluster_custom_object_status(
        GROUP, VERSION, "sdctests", name, {"status": {"phase": "Passed", "verdict": "Pass"}}
    )
    client.CoreV1Api(fleet.api).patch_node(
        fleet.healthy,
        {"metadata": {"annotations": {"sdcguard.dev/qualified-at": "2025-01-01T00:00:00Z"}}},
    )
    code, out, _ = fleet.sdc("test", fleet.healthy, "--policy", fleet.policy)
    assert code == 0 and "requalification suite (the node qualified before)" in out
    assert "kubectl get sdctest" in out


def test_a_manual_test_of_a_never_qualified_node_is_an_acceptance_test(fleet: Fleet) -> None:
    core = client.CoreV1Api(fleet.api)
    name = f"cli-{fleet.suffix}-new-1"
    _create_node(core, name, {"cli-test.sdcguard.dev/run": fleet.suffix}, 8)
    core.patch_node(
        name, {"spec": {"taints": [{"key": "sdcguard.dev/unqualified", "effect": "NoSchedule"}]}}
    )
    try:
        code, out, err = fleet.sdc("test", name, "-o", "yaml")
        assert code == 0, err
        created = yaml.safe_load(out)
        assert created["spec"]["suite"] == "acceptance"
        # -o yaml leaves server-side apply's bookkeeping out, as kubectl does.
        assert "managedFields" not in created["metadata"] and "managedFields" not in out
        obj = _custom(fleet.api).get_cluster_custom_object(
            GROUP, VERSION, "sdctests", created["metadata"]["name"]
        )
        assert obj["spec"]["suite"] == "acceptance" and obj["metadata"]["managedFields"]
    finally:
        core.delete_node(name)


def test_two_test_requests_at_the_same_moment_create_one_sdctest(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both requests find no test running (they are held together right after that
    check), then both create: the API server lets exactly one through, and the other is
    refused, naming the test that was made."""
    from sdcguard.cli import commands

    core = client.CoreV1Api(fleet.api)
    node = f"cli-{fleet.suffix}-race-1"
    _create_node(core, node, {"cli-test.sdcguard.dev/run": fleet.suffix}, 8)
    both_checked = threading.Barrier(2, timeout=20)
    checked = commands.running_test

    def check_then_wait(*args: Any) -> Any:
        found = checked(*args)
        both_checked.wait()
        return found

    monkeypatch.setattr(commands, "running_test", check_then_wait)
    results: list[tuple[int, str, str]] = []
    tests: list[str] = []
    try:
        threads = [
            threading.Thread(target=lambda: results.append(fleet.sdc("test", node)))
            for _ in range(2)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        tests = [
            t["metadata"]["name"]
            for t in _custom(fleet.api).list_cluster_custom_object(GROUP, VERSION, "sdctests")[
                "items"
            ]
            if t["spec"]["nodeName"] == node
        ]
        assert tests == [f"{node}-manual-1"], tests
        assert sorted(code for code, _, _ in results) == [0, 1]
        refused = next(err for code, _, err in results if code == 1)
        assert refused == (
            f"error: node {node} already has a test that has not ended: sdctest/{node}-manual-1 "
            "was created by another request at the same moment; follow it with kubectl get "
            f"sdctest {node}-manual-1 -w, and run this again once it ends\n"
        )
    finally:
        core.delete_node(node)
        for name in tests:
            _custom(fleet.api).delete_cluster_custom_object(GROUP, VERSION, "sdctests", name)


def test_test_errors(fleet: Fleet) -> None:
    code, _, err = fleet.sdc("test", f"cli-{fleet.suffix}-missing")
    assert code == 1
    assert err == (
        f"error: node cli-{fleet.suffix}-missing not found; list nodes with kubectl get nodes\n"
    )
    code, _, err = fleet.sdc("test", fleet.healthy, "--policy", f"cli-{fleet.suffix}-nopolicy")
    assert code == 1 and "sdcpolicy" in err and "not found" in err


# ---------------------------------------------------------------- quarantine, release


def _node(fleet: Fleet, name: str) -> client.V1Node:
    return client.CoreV1Api(fleet.api).read_node(name)


def _events(fleet: Fleet, name: str) -> list[client.CoreV1Event]:
    return (
        client.CoreV1Api(fleet.api)
        .list_namespaced_event(
            "default", field_selector=f"involvedObject.kind=Node,involvedObject.name={name}"
        )
        .items
    )


def test_quarantine_and_release_write_the_contract_and_an_event(fleet: Fleet) -> None:
    data = fleet.sdc_json("quarantine", fleet.healthy, "--reason", "loss spikes in job 1234")
    assert data["by"] == "admin" and data["request"] == "quarantine"
    ann = _node(fleet, fleet.healthy).metadata.annotations
    assert ann["sdcguard.dev/request"] == "quarantine"
    assert ann["sdcguard.dev/request-reason"] == "loss spikes in job 1234"
    assert ann["sdcguard.dev/request-by"] == "admin"
    assert ann["sdcguard.dev/request-id"] == data["requestId"]
    assert ann["sdcguard.dev/quarantine"] == "loss spikes in job 1234"
    (event,) = [e for e in _events(fleet, fleet.healthy) if e.reason == "ManualQuarantineRequested"]
    assert data["requestId"] in event.message and event.type == "Warning"
    assert event.involved_object.uid == _node(fleet, fleet.healthy).metadata.uid

    # Without an operator here the state stays Qualified: set it as the operator would.
    client.CoreV1Api(fleet.api).patch_node(
        fleet.healthy, {"metadata": {"labels": {"sdcguard.dev/state": "Quarantined"}}}
    )
    code, out, _ = fleet.sdc("release", fleet.healthy, "--reason", "false alarm, job bug")
    client.CoreV1Api(fleet.api).patch_node(
        fleet.healthy, {"metadata": {"labels": {"sdcguard.dev/state": "Qualified"}}}
    )
    assert code == 0 and "release requested by admin" in out
    ann = _node(fleet, fleet.healthy).metadata.annotations
    assert ann["sdcguard.dev/request"] == "release"
    assert ann["sdcguard.dev/release"] == "false alarm, job bug"
    assert "sdcguard.dev/quarantine" not in ann
    assert ann["sdcguard.dev/request-id"] != data["requestId"]
    reasons = {e.reason for e in _events(fleet, fleet.healthy)}
    assert {"ManualQuarantineRequested", "ManualReleaseRequested"} <= reasons


def test_release_of_a_node_that_is_only_testing_is_refused(fleet: Fleet) -> None:
    core = client.CoreV1Api(fleet.api)
    name = f"cli-{fleet.suffix}-testing-1"
    _create_node(core, name, {"cli-test.sdcguard.dev/run": fleet.suffix}, 8)
    core.patch_node(
        name,
        {
            "metadata": {
                "labels": {"sdcguard.dev/state": "Testing"},
                "annotations": {"sdcguard.dev/test": f"{name}-rq-4"},
            }
        },
    )
    try:
        code, out, err = fleet.sdc("release", name, "--reason", "want it back")
        assert code == 1 and out == ""
        assert err == (
            f"error: node {name} is Testing (sdctest/{name}-rq-4), not quarantined: there is "
            "nothing to release. It returns to service by itself when the test passes; to stop "
            f"the test: kubectl delete sdctest {name}-rq-4\n"
        )
        annotations = core.read_node(name).metadata.annotations or {}
        assert "sdcguard.dev/release" not in annotations
        assert "sdcguard.dev/request" not in annotations
        assert not [e for e in _events(fleet, name) if e.reason == "ManualReleaseRequested"]
        # Qualified: in service already.
        core.patch_node(name, {"metadata": {"labels": {"sdcguard.dev/state": "Qualified"}}})
        code, _, err = fleet.sdc("release", name, "--reason", "want it back")
        assert code == 1 and f"node {name} is Qualified: there is nothing to release" in err
    finally:
        core.delete_node(name)


def test_quarantine_of_a_missing_node(fleet: Fleet) -> None:
    code, _, err = fleet.sdc("quarantine", "no-such-node-x", "--reason", "r")
    assert code == 1 and "node no-such-node-x not found; list nodes with kubectl get nodes" in err


# ---------------------------------------------------------------- repaired


def test_repaired_sets_the_resolution(fleet: Fleet) -> None:
    patched = fleet.sdc_json(
        "repaired", fleet.ticket, "--note", "GPU 5 replaced", "--resolution", "Replaced"
    )
    assert patched["spec"]["resolution"] == "Replaced"
    obj = _custom(fleet.api).get_cluster_custom_object(
        GROUP, VERSION, "repairtickets", fleet.ticket
    )
    assert obj["spec"]["resolution"] == "Replaced"
    assert obj["spec"]["resolutionNote"] == "GPU 5 replaced"
    assert obj["metadata"]["annotations"]["sdcguard.dev/resolved-by"] == "admin"
    code, _, err = fleet.sdc("repaired", "no-such-ticket", "--note", "x")
    assert code == 1
    assert err == (
        "error: repairticket no-such-ticket not found; "
        "list tickets with kubectl get repairtickets\n"
    )


# ---------------------------------------------------------------- history


def test_history_json_is_sorted_and_complete(fleet: Fleet) -> None:
    fleet.sdc("quarantine", fleet.sick, "--reason", "history check")
    data = fleet.sdc_json("history", fleet.sick)
    assert data["node"] == fleet.sick and data["exists"] and data["state"] == "Repairing"
    entries = data["entries"]
    times = [e["time"] for e in entries]
    assert times == sorted(times)
    kinds = [(e["kind"], e["name"]) for e in entries]
    assert ("SDCTest", f"{fleet.sick}-rq-1") in kinds
    assert kinds.count(("RepairTicket", fleet.ticket)) == 2
    assert any(e["kind"] == "Event" and e["reason"] == "ManualQuarantineRequested" for e in entries)
    test = next(e for e in entries if e["kind"] == "SDCTest")
    assert test["verdict"] == "SDC" and test["time"] == "2025-01-01T10:20:00Z"
    assert "golden=SDC(device 5, step 12)" in test["detail"]


def test_the_api_server_selects_tests_and_tickets_by_node_and_phase(fleet: Fleet) -> None:
    """The CRDs' selectableFields: one node's SDCTests and tickets, and the tests that have
    not ended (one with no status yet among them), come from the API server's own
    selection, as the plugin's history, test and status commands ask for them."""
    from sdcguard.api import RepairTicket, SDCTest
    from sdcguard.cli.commands import on_node, open_tickets, unfinished_tests

    custom = _custom(fleet.api)
    fresh = f"{fleet.healthy}-sel-{fleet.suffix}"
    create_sdctest(custom, fresh, {"nodeName": fleet.healthy, "policyRef": fleet.policy})
    try:

        def names(plural: str, selector: str) -> set[str]:
            items = custom.list_cluster_custom_object(
                GROUP, VERSION, plural, field_selector=selector
            )["items"]
            return {i["metadata"]["name"] for i in items}

        sick_tests = names("sdctests", on_node(fleet.sick, SDCTest).field_selector)
        assert f"{fleet.sick}-rq-1" in sick_tests
        assert all(n.startswith(fleet.sick) for n in sick_tests), sick_tests
        unfinished = names("sdctests", unfinished_tests().field_selector)
        assert fresh in unfinished and f"{fleet.sick}-rq-1" not in unfinished
        on_sick = on_node(fleet.sick, RepairTicket).field_selector
        assert names("repairtickets", on_sick) == {fleet.ticket}
        assert fleet.ticket in names("repairtickets", open_tickets().field_selector)
        # The plugin reads the same through its lists.
        screenings = fleet.sdc_json("status")["screenings"]
        assert fresh in {s["name"] for s in screenings}
    finally:
        custom.delete_cluster_custom_object(GROUP, VERSION, "sdctests", fresh)


def test_history_table_and_a_deleted_node(fleet: Fleet) -> None:
    code, out, _ = fleet.sdc("history", fleet.sick, "--limit", "2")
    assert code == 0 and out.startswith(f"Node {fleet.sick}: state Repairing")
    lines = out.strip().splitlines()
    # header line, seeds passed, data seeds passed, column titles, 2 entries
    assert len(lines) == 6 and lines[1] == "Seeds passed (0): none"
    assert lines[2] == "Data seeds passed (0): none"
    code, out, _ = fleet.sdc("history", fleet.gone)
    assert code == 0 and "no longer exists" in out and f"{fleet.gone}-acc-1" in out
    code, _, err = fleet.sdc("history", f"cli-{fleet.suffix}-never")
    assert code == 1 and "not found; list nodes with kubectl get nodes" in err


@pytest.mark.parametrize("limit", ["-1", "0", "x"])
def test_history_refuses_a_limit_that_is_not_a_count(
    fleet: Fleet, limit: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        fleet.sdc("history", fleet.sick, "--limit", limit)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --limit:" in err
    assert "give 1 or more" in err or "is not a whole number" in err


# ---------------------------------------------------------------- baselines


def test_baselines(fleet: Fleet) -> None:
    (row,) = [b for b in fleet.sdc_json("baselines") if b["name"] == fleet.baseline]
    assert row["fingerprint"] == "ab" * 6 and row["hash"] == "ab" * 32
    assert row["source"] == "Consensus" and row["trusted"] is True
    assert row["checks"] == ["compute", "golden"]
    assert row["nodes"] == [fleet.healthy, fleet.gone, "n3", "n4"]
    code, out, _ = fleet.sdc("baselines")
    assert code == 0
    line = next(t for t in out.splitlines() if t.startswith(fleet.baseline))
    assert "NVIDIA H100" in line and "true" in line and "4 (" in line
    assert "ab" * 32 not in out  # the full hash is a wide column


def test_baselines_wide_and_without_headers(fleet: Fleet) -> None:
    code, out, _ = fleet.sdc("baselines", "-o", "wide")
    assert code == 0 and out.splitlines()[0].split()[-1] == "HASH"
    line = next(t for t in out.splitlines() if t.startswith(fleet.baseline))
    assert line.endswith("ab" * 32)
    code, out, _ = fleet.sdc("baselines", "--no-headers")
    assert code == 0 and "NAME" not in out and fleet.baseline in out


# ---------------------------------------------------------------- as a kubectl plugin


def test_runs_as_a_kubectl_plugin(fleet: Fleet, tmp_path: Path) -> None:
    plugin = tmp_path / "kubectl-sdc"
    plugin.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m sdcguard.cli "$@"\n')
    plugin.chmod(0o755)
    env = dict(fleet.env)
    env["PATH"] = os.pathsep.join([str(tmp_path), env["PATH"]])
    env["PYTHONPATH"] = os.pathsep.join(str(ROOT / p) for p in ("operator", "jobs", "."))
    listed = subprocess.run(
        ["kubectl", "plugin", "list"], env=env, capture_output=True, text=True, check=False
    )
    assert str(plugin) in listed.stdout
    proc = subprocess.run(
        ["kubectl", "sdc", "baselines", "-o", "json"],  # KUBECONFIG comes from the environment
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert any(b["name"] == fleet.baseline for b in json.loads(proc.stdout))


def test_completion_names_the_clusters_nodes(fleet: Fleet) -> None:
    """Node and ticket names come from the cluster the line's --kubeconfig names."""

    def complete(*words: str) -> list[str]:
        out = io.StringIO()
        assert main(["__complete", "--kubeconfig", fleet.kubeconfig, *words], stdout=out) == 0
        return out.getvalue().splitlines()

    assert complete("history", f"cli-{fleet.suffix}-gpu-") == [fleet.healthy, fleet.sick, ":4"]
    assert complete("repaired", f"cli-{fleet.suffix}-gpu-2-") == [fleet.ticket, ":4"]


def test_kubectl_completes_the_plugin_in_a_real_shell(fleet: Fleet, tmp_path: Path) -> None:
    """`kubectl sdc <TAB>` in bash: kubectl (1.26+) runs kubectl_complete-sdc from PATH,
    which asks the plugin; node names come from the cluster."""
    from tests.cli.tmuxshell import BASH_COMPLETION, need, plugin_bin, shell

    need("bash")
    if not BASH_COMPLETION.is_file():
        pytest.skip(
            "bash-completion is not installed, which kubectl's bash completion needs "
            "(apt-get install -y bash-completion)"
        )
    rc = tmp_path / "bashrc"
    rc.write_text(
        f"PS1='sdc-bash> '\nsource {BASH_COMPLETION}\nsource <(kubectl completion bash)\n"
    )
    env = {k: v for k, v in fleet.env.items() if not k.startswith("TMUX")}
    env["PATH"] = os.pathsep.join([str(plugin_bin(tmp_path / "bin")), env["PATH"]])
    argv = ["bash", "--noprofile", "--rcfile", str(rc), "-i"]
    with shell(argv, env, tmp_path, "sdc-bash>") as sh:
        sh.complete("kubectl sdc st", "sdc-bash> kubectl sdc status")
        sh.complete(f"kubectl sdc history {fleet.sick[:-1]}", fleet.healthy, tabs=2)
        sh.complete(f"kubectl sdc repaired {fleet.sick}", f"repaired {fleet.ticket}")


def test_blast_radius_of_a_node_before_any_failure_and_of_an_unknown_name(fleet: Fleet) -> None:
    node = fleet.healthy
    status = {
        "since": "2026-12-01T08:00:00Z",
        "workloads": [
            {
                "namespace": "ml",
                "kind": "PyTorchJob",
                "name": "bert",
                "apiVersion": "kubeflow.org/v1",
                "pods": ["bert-worker-0"],
                "podCount": 1,
                "running": ["bert-worker-0"],
                "accelerators": 8,
                "firstSeen": "2026-12-01T09:00:00Z",
            }
        ],
    }
    with workload_record(fleet.api, node, status):
        shown = fleet.sdc_json("blast-radius", node)
        assert shown["ticket"] is None and shown["windowEnd"] is None
        assert shown["windowStart"] == "2026-12-01T08:00:00Z"
        assert [w["name"] for w in shown["workloads"]] == ["bert"]
        code, out, _ = fleet.sdc("blast-radius", node)
        assert code == 0
        assert "now (no failing screening)" in out and "PyTorchJob/bert" in out
        assert "running" in out

    code, _, err = fleet.sdc("blast-radius", f"no-such-{fleet.suffix}")
    assert code == 1
    assert "no RepairTicket and no WorkloadRecord named" in err
