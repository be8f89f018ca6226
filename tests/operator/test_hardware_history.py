"""Hardware history against the real API server and the operator process: a failing host
that comes back under a new Node name is recognised, verified on join with the
repair-verification suite, counted across its tickets, and retired at the cycle limit;
Nodes that share identifiers never share a history."""

from __future__ import annotations

import dataclasses
import io
import json
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sdcdev.harness import (
    ProbeKubelet,
    create_policy,
    gpu_fleet,
    list_custom,
    new_case,
    node_state,
    read_node,
    registered_nodes,
    ticket_in_phase,
    trusted_baseline,
    wait_for,
)
from sdcdev.sim.fleet import NodeConfig
from sdcdev.sim.nodes import Heartbeats
from sdcguard.cli.main import main as kubectl_sdc
from tests.chart.alerts import alert_expr, scrape_url
from tests.notify.test_notify import Receiver, receiver
from tests.promql import Scrape, firing

__all__ = ["receiver"]  # the local webhook receiver, as a fixture here


def _host(case: str, name: str, *, as_node: str | None = None, provider: str = "") -> NodeConfig:
    """The simulated host ``name``; registered as Node ``as_node`` (another Node name for
    the same machine: same system UUID and machine ID, and the providerID given)."""
    cfg = gpu_fleet([name], case=case).nodes[0]
    if as_node is None:
        return cfg
    labels = {**cfg.labels, "kubernetes.io/hostname": as_node}
    return dataclasses.replace(
        cfg,
        name=as_node,
        hardware_name=name,
        provider_id=provider or cfg.provider_id,
        labels=labels,
    )


def _delete_node(api: client.ApiClient, beats: Heartbeats, name: str) -> None:
    beats.stop()
    client.CoreV1Api(api).delete_node(name)

    def gone() -> bool:
        try:
            client.CoreV1Api(api).read_node(name)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(gone, 30, f"node {name} deleted")


def _events(api: client.ApiClient, node: str) -> dict[str, str]:
    items = (
        client.CoreV1Api(api)
        .list_namespaced_event("default", field_selector=f"involvedObject.name={node}")
        .items
    )
    return {e.reason: e.message for e in items}


def _records(api: client.ApiClient, node: str) -> list[dict[str, Any]]:
    items = client.CustomObjectsApi(api).list_cluster_custom_object(
        "sdcguard.dev", "v1alpha1", "sdchardwares"
    )["items"]
    return [
        i
        for i in items
        if any(n["node"] == node for n in (i.get("status") or {}).get("nodes") or [])
    ]


def _metrics(url: str) -> Scrape:
    """The operator's /metrics, once it serves them (it may still be starting)."""

    def scrape() -> Scrape | None:
        try:
            return scrape_url(url)
        except OSError:
            return None

    found: Scrape = wait_for(scrape, 60, "the operator's /metrics")
    return found


def _value(scrape: Scrape, name: str, **labels: str) -> float:
    return scrape.get((name, frozenset(labels.items())), 0.0)


def _delta(before: Scrape, after: Scrape, name: str, **labels: str) -> float:
    return _value(after, name, **labels) - _value(before, name, **labels)


def _payloads(rec: Receiver, node: str, event: str) -> list[dict[str, Any]]:
    return [
        p
        for p in (s.json() for s in rec.seen)
        if p["ticket"]["nodeName"] == node and p["event"] == event
    ]


def _cli(kubeconfig: str, *args: str) -> Any:
    out, err = io.StringIO(), io.StringIO()
    code = kubectl_sdc([*args, "--kubeconfig", kubeconfig, "-o", "json"], stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    return json.loads(out.getvalue())


def test_host_back_under_new_names_is_recognised_and_retired_at_the_cycle_limit(
    api_client, operator, cluster, receiver
) -> None:
    case = new_case()
    host = f"hw-{case}-a"
    second, third = f"hw-{case}-b", f"hw-{case}-c"
    trusted_baseline(api_client)
    first = _host(case, host)
    outcomes = {host: "sdc", second: "sdc", third: "sdc"}
    hook = receiver(lambda _: (200, {}, b""))
    sink = {"type": "webhook", "url": hook.url + "/sdc"}
    before = _metrics(operator.metrics_url)
    with ProbeKubelet(api_client, outcomes):
        create_policy(api_client, case, repair={"maxRepairCycles": 2, "ticketSinks": [sink]})
        # 1. The host fails its acceptance: cycle 1, and its history begins.
        with registered_nodes(api_client, [first]) as beats:
            wait_for(lambda: ticket_in_phase(api_client, host, "Open"), 120, "first quarantine")
            ticket = ticket_in_phase(api_client, host, "Open")
            assert ticket is not None and ticket["status"]["cycle"] == 1
            identity = ticket["spec"]["hardware"]
            assert identity["providerID"] == first.provider_id
            assert identity["systemUUID"] and identity["machineID"]
            assert identity["cyclesBefore"] == 0 and len(identity["records"]) == 3
            records = wait_for(lambda: len(_records(api_client, host)) == 3, 30, "records")
            assert records
            _delete_node(api_client, beats, host)

        # 2. The same machine registers as a new Node: recognised, verified on join.
        with registered_nodes(api_client, [_host(case, host, as_node=second)]) as beats:
            wait_for(lambda: ticket_in_phase(api_client, second, "Open"), 120, "second quarantine")
            tests = list_custom(api_client, "sdctests", second)
            joined = [t for t in tests if t["spec"]["reason"] == "Join"]
            assert joined and all(t["spec"]["suite"] == "repairVerification" for t in joined)
            # Recognised under the new name (the HardwareRecognised Event goes with the
            # join's node write; when that write is retried after a 409 the test is
            # adopted and the Event not repeated, so the records are what to check).
            seen = _records(api_client, second)
            assert len(seen) == 3
            assert all([n["node"] for n in r["status"]["nodes"]] == [host, second] for r in seen)
            ticket = ticket_in_phase(api_client, second, "Open")
            assert ticket is not None
            assert ticket["status"]["cycle"] == 2, "counted across tickets and Node names"
            assert ticket["spec"]["hardware"]["cyclesBefore"] == 1
            # The webhook is told the history: the cycle before, and each record with
            # the first failure under the first Node name.
            sent = wait_for(lambda: _payloads(hook, second, "ticket.opened"), 60, "webhook")
            history = sent[0]["ticket"]["hardwareHistory"]
            assert history["cyclesBefore"] == 1 and history["maxRepairCycles"] == 2
            assert history["repairCycleWindow"] == "720h"
            told = {r["name"]: r for r in history["records"]}
            assert set(told) == set(ticket["spec"]["hardware"]["records"])
            for r in told.values():
                assert r["kind"] in {"ProviderID", "SystemUUID", "MachineID"}
                assert r["totalFailures"] >= 1 and r["failuresInWindow"] >= 1
                assert r["lastFailures"][0]["node"] == host
                assert r["lastFailures"][0]["kind"] == "Quarantined"
                assert r["nodes"][:2] == [host, second] and r["retired"] is None
            assert len({json.dumps(p, sort_keys=True) for p in sent}) == 1
            _delete_node(api_client, beats, second)

        # 3. And again: past maxRepairCycles (2), the third failure retires it.
        with registered_nodes(api_client, [_host(case, host, as_node=third)]) as beats:
            wait_for(lambda: node_state(api_client, third) == "Retired", 120, "retirement")
            assert read_node(api_client, third).spec.unschedulable is True
            # The ticket is created before the node's write and its phase is written after
            # it (plan stage STATUSES), so a reader may see the node first.
            ticket = wait_for(
                lambda: ticket_in_phase(api_client, third, "Retired"), 30, "ticket retired"
            )
            assert ticket["status"]["cycle"] == 3
            # The Event follows the hardware records, which follow the node's write and
            # the ticket's phase (plan stages HISTORY, then EVENTS).
            wait_for(lambda: "Retired" in _events(api_client, third), 30, "Retired Event")

            def retired_records() -> list[dict[str, Any]] | None:
                found = _records(api_client, third)
                ok = len(found) == 3 and all(r["status"].get("retired") for r in found)
                return found if ok else None

            found = wait_for(retired_records, 30, "records retired")
            for record in found:
                st = record["status"]
                assert [n["node"] for n in st["nodes"]] == [host, second, third]
                assert [f["kind"] for f in st["failures"]] == [
                    "Quarantined",
                    "Quarantined",
                    "Retired",
                ]
                assert st["totalFailures"] == 3

            # The kubectl plugin shows it by Node name and by identifier.
            kubeconfig = str(cluster.kubeconfig)
            by_node = _cli(kubeconfig, "hardware", third)
            assert {r["name"] for r in by_node} == {r["metadata"]["name"] for r in found}
            by_id = _cli(kubeconfig, "hardware", _host(case, host).provider_id)
            assert len(by_id) == 1 and by_id[0]["kind"] == "ProviderID"
            assert by_id[0]["totalFailures"] == 3 and by_id[0]["retired"]["node"] == third

            closed = wait_for(lambda: _payloads(hook, third, "ticket.closed"), 60, "webhook")
            assert closed[0]["ticket"]["hardwareHistory"]["cyclesBefore"] == 2
            _delete_node(api_client, beats, third)

        # 4. Retired hardware handed back once more is retired again at once, on join.
        fourth = f"hw-{case}-d"
        with registered_nodes(api_client, [_host(case, host, as_node=fourth)]):
            wait_for(lambda: node_state(api_client, fourth) == "Retired", 120, "re-retired")

    # The metrics counted it: recognised three times by its providerID (the strongest of
    # its identifiers), the last time as retired hardware; retired once (the fourth
    # Node only found it retired); the records gauge shows the retired host.
    def retired_gauge() -> Scrape | None:
        scrape = scrape_url(operator.metrics_url)
        held = _value(scrape, "sdcguard_hardware_records", kind="ProviderID", retired="true")
        return scrape if held >= 1 else None

    after = wait_for(retired_gauge, 60, "the records gauge (full pass)")
    recognised = "sdcguard_hardware_recognised_total"
    assert _delta(before, after, recognised, kind="ProviderID", retired="false") == 2
    assert _delta(before, after, recognised, kind="SystemUUID", retired="false") == 0
    retired = "sdcguard_hardware_retired_total"
    assert _delta(before, after, retired, reason="OutOfRepairCycles") == 1
    assert firing(alert_expr("SdcguardHardwareRetired"), [before, after]) == [
        {"reason": "OutOfRepairCycles"}
    ]
    assert _delta(before, after, recognised, kind="ProviderID", retired="true") == 1
    assert firing(alert_expr("SdcguardRetiredHardwareReturned"), [before, after]) == [
        {"kind": "ProviderID"}
    ]


def test_nodes_sharing_identifiers_never_share_a_history(api_client, operator) -> None:
    """Two Nodes with one providerID, system UUID and machine ID (a cloned image on
    machines the provisioner named alike): nothing can tell them apart, so nothing is
    recorded under those IDs and each ticket says why."""
    case = new_case()
    one, two = f"dup-{case}-a", f"dup-{case}-b"
    clone = f"clone-{case}"
    shared = _host(case, clone).provider_id
    cfgs = [_host(case, clone, as_node=one), _host(case, clone, as_node=two)]
    trusted_baseline(api_client)
    before = _metrics(operator.metrics_url)
    with ProbeKubelet(api_client, {one: "sdc", two: "sdc"}):
        create_policy(api_client, case, repair={"maxRepairCycles": 1})
        with registered_nodes(api_client, cfgs):
            for name, other in ((one, two), (two, one)):
                wait_for(
                    lambda n=name: ticket_in_phase(api_client, n, "Open"),
                    120,
                    f"{name} quarantined",
                )
                ticket = ticket_in_phase(api_client, name, "Open")
                assert ticket is not None and ticket["status"]["cycle"] == 1
                hw = ticket["spec"]["hardware"]
                assert hw["providerID"] == shared
                assert hw["records"] == [] and hw["cyclesBefore"] == 0
                notes = {u["kind"]: u["reason"] for u in hw["untrusted"]}
                assert set(notes) == {"ProviderID", "SystemUUID", "MachineID"}
                assert all(f"shared with Node {other}" in why for why in notes.values())
            assert _records(api_client, one) == [] and _records(api_client, two) == []
            # Both failed once with maxRepairCycles 1: had their histories merged, the
            # second would have been retired. Each is quarantined at cycle 1.
            assert node_state(api_client, one) == node_state(api_client, two) == "Quarantined"
    # Each failure that kept no history is counted, so a fleet of cloned IDs shows.
    after = _metrics(operator.metrics_url)
    assert _delta(before, after, "sdcguard_hardware_untracked_failures_total") == 2


def test_a_gpu_moved_into_another_host_brings_its_history(api_client, operator) -> None:
    """The probe names each device's UUID; the failing one (the odd device) gets a
    history of its own, and a host it is moved into counts it: with maxRepairCycles 1,
    that host's first failure naming the GPU retires it."""
    case = new_case()
    old, new = f"gpu-{case}-a", f"gpu-{case}-b"
    bad = f"GPU-{case}-0001"
    devices = {old: (f"GPU-{case}-a000", bad), new: (bad, f"GPU-{case}-b001")}
    trusted_baseline(api_client)
    outcomes = {old: "sdc@1@3", new: "sdc@0@3"}  # the same GPU, index 1 there, 0 here
    before = _metrics(operator.metrics_url)
    with ProbeKubelet(api_client, outcomes, devices=devices):
        create_policy(api_client, case, repair={"maxRepairCycles": 1})
        with registered_nodes(api_client, [_host(case, old)]) as beats:
            wait_for(lambda: ticket_in_phase(api_client, old, "Open"), 120, "quarantine")
            ticket = ticket_in_phase(api_client, old, "Open")
            assert ticket is not None
            assert ticket["spec"]["hardware"]["deviceIDs"] == list(devices[old])
            gpu = wait_for(
                lambda: [r for r in _records(api_client, old) if r["spec"]["kind"] == "Device"],
                30,
                "the GPU's record",
            )
            assert [r["spec"]["id"] for r in gpu] == [bad], "only the odd device"
            _delete_node(api_client, beats, old)
        with registered_nodes(api_client, [_host(case, new)]):
            wait_for(lambda: node_state(api_client, new) == "Retired", 120, "retirement")
            ticket = wait_for(
                lambda: ticket_in_phase(api_client, new, "Retired"), 30, "ticket retired"
            )
            assert ticket["status"]["cycle"] == 2
            assert ticket["spec"]["hardware"]["cyclesBefore"] == 1
            tests = list_custom(api_client, "sdctests", new)
            assert all(t["spec"]["suite"] == "acceptance" for t in tests), (
                "a GPU is known only once the probe names it: the join test is acceptance"
            )
    after = _metrics(operator.metrics_url)
    recognised = "sdcguard_hardware_recognised_total"
    assert _delta(before, after, recognised, kind="Device", retired="false") == 1
    assert _delta(before, after, recognised, kind="ProviderID", retired="false") == 0
