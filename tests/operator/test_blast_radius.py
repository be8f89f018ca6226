"""Blast radius end to end: a training Job's Pod uses a node that then fails its
screening; the ticket, the webhook payload, the Event in the Job's namespace and
``kubectl sdc blast-radius`` all name the Job and the window. And idle time survives
an operator restart through the node's WorkloadRecord."""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import io
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sdcdev.harness import (
    GROUP,
    NS,
    VERSION,
    ProbeKubelet,
    create_policy,
    gpu_nodes,
    gpu_pod,
    list_custom,
    new_case,
    node_state,
    read_node,
    trusted_baseline,
    wait_for,
)
from sdcguard.cli.main import main as kubectl_sdc
from sdcguard.domain.keys import QUALIFIED_AT, parse_time

KEY = b"blast-radius-key"


class Receiver(BaseHTTPRequestHandler):
    received: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        type(self).received.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def team_namespace(api: client.ApiClient, case: str) -> Iterator[str]:
    core = client.CoreV1Api(api)
    name = f"team-{case}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        with contextlib.suppress(ApiException):
            core.delete_namespace(name)


def training_job(api: client.ApiClient, ns: str, name: str) -> client.V1Job:
    """A suspended Job: its Pods below are made by hand, owned by it, as its controller would."""
    return client.BatchV1Api(api).create_namespaced_job(
        ns,
        client.V1Job(
            metadata=client.V1ObjectMeta(name=name),
            spec=client.V1JobSpec(
                suspend=True,
                template=client.V1PodTemplateSpec(
                    spec=client.V1PodSpec(
                        restart_policy="Never",
                        containers=[client.V1Container(name="c", image="localhost/none:1")],
                    )
                ),
            ),
        ),
    )


def run_gpu_pod(
    api: client.ApiClient, ns: str, name: str, node: str, owner: client.V1Job | None
) -> None:
    client.CoreV1Api(api).create_namespaced_pod(ns, gpu_pod(name, node, owner=owner))


def end_pod(api: client.ApiClient, ns: str, name: str) -> None:
    client.CoreV1Api(api).patch_namespaced_pod_status(name, ns, {"status": {"phase": "Succeeded"}})


def record(api: client.ApiClient, node: str) -> dict[str, Any] | None:
    try:
        got: dict[str, Any] = client.CustomObjectsApi(api).get_cluster_custom_object(
            GROUP, VERSION, "workloadrecords", node
        )
        return got
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def workloads(api: client.ApiClient, node: str) -> list[dict[str, Any]]:
    return list(((record(api, node) or {}).get("status") or {}).get("workloads") or [])


def cli(cluster: Any, *args: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    code = kubectl_sdc(["--kubeconfig", str(cluster.kubeconfig), *args], stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    return out.getvalue()


def test_a_node_that_fails_tells_the_workloads_it_ran(api_client, operator, cluster) -> None:
    case = new_case()
    node = f"blast-{case}"
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client.CoreV1Api(api_client).create_namespaced_secret(
        NS,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name=f"blast-{case}"),
            data={"token": base64.b64encode(KEY).decode()},
        ),
    )
    trusted_baseline(api_client)
    outcomes = {node: "pass"}
    sink = {
        "type": "webhook",
        "url": f"http://127.0.0.1:{server.server_port}/sdc",
        "secretRef": {"name": f"blast-{case}", "namespace": NS, "key": "token"},
    }
    try:
        with (
            gpu_nodes(api_client, [node], case=case),
            ProbeKubelet(api_client, outcomes),
            team_namespace(api_client, case) as team,
        ):
            create_policy(api_client, case, repair={"maxRepairCycles": 2, "ticketSinks": [sink]})
            wait_for(lambda: node_state(api_client, node) == "Qualified", 90, "acceptance")
            passed = parse_time(read_node(api_client, node).metadata.annotations[QUALIFIED_AT])
            assert record(api_client, node) is None  # nothing used it: nothing written

            job = training_job(api_client, team, "train")
            run_gpu_pod(api_client, team, "train-0", node, job)
            run_gpu_pod(api_client, team, "notebook", node, None)  # a Pod without an owner
            running = wait_for(
                lambda: [w for w in workloads(api_client, node) if w["running"]],
                30,
                "the workload record to list the running Pods",
            )
            assert {(w["kind"], w["name"]) for w in running} == {
                ("Job", "train"),
                ("Pod", "notebook"),
            }
            outcomes[node] = "sdc"  # the node goes bad while the Job runs
            end_pod(api_client, team, "train-0")
            end_pod(api_client, team, "notebook")

            wait_for(lambda: node_state(api_client, node) == "Quarantined", 120, "quarantine")
            [ticket] = list_custom(api_client, "repairtickets", node)
            radius = ticket["spec"]["blastRadius"]
            assert parse_time(radius["windowStart"]) == passed
            end = parse_time(radius["windowEnd"])
            assert end is not None and passed is not None and end > passed
            by_name = {w["name"]: w for w in radius["workloads"]}
            assert set(by_name) == {"train", "notebook"}
            train = by_name["train"]
            assert (train["namespace"], train["kind"], train["apiVersion"]) == (
                team,
                "Job",
                "batch/v1",
            )
            assert train["uid"] == job.metadata.uid
            assert train["pods"] == ["train-0"] and train["accelerators"] == 8
            assert train["lastSeen"] and train["firstSeen"] <= train["lastSeen"]
            assert "roll back to a checkpoint saved before" in radius["advice"]

            payload = wait_for(
                lambda: [p for p in Receiver.received if p["ticket"]["nodeName"] == node],
                60,
                "the webhook delivery",
            )[0]
            assert payload["ticket"]["blastRadius"]["workloads"] == radius["workloads"]
            assert payload["ticket"]["blastRadius"]["windowStart"] == radius["windowStart"]

            events = wait_for(
                lambda: [
                    e
                    for e in client.CoreV1Api(api_client).list_namespaced_event(team).items
                    if e.reason == "SDCBlastRadius"
                ],
                30,
                "the Warning Events in the team's namespace",
            )
            about = {(e.involved_object.kind, e.involved_object.name): e for e in events}
            assert set(about) == {("Job", "train"), ("Pod", "notebook")}
            event = about[("Job", "train")]
            assert event.type == "Warning"
            assert event.involved_object.uid == job.metadata.uid
            assert node in event.message and ticket["metadata"]["name"] in event.message
            assert radius["windowStart"] in event.message
            assert "roll back to a checkpoint saved before" in event.message

            shown = json.loads(cli(cluster, "blast-radius", node, "-o", "json"))
            assert shown["ticket"] == ticket["metadata"]["name"]
            assert shown["workloads"] == radius["workloads"]
            by_ticket = json.loads(cli(cluster, "-o", "json", "blast-radius", shown["ticket"]))
            assert by_ticket == shown
            table = cli(cluster, "blast-radius", node)
            assert "Job/train" in table and "Pod/notebook" in table and team in table
            assert "What to do: roll back" in table
    finally:
        server.shutdown()


def test_idle_time_survives_an_operator_restart(api_client, operator) -> None:
    """A node left idle before a restart is screened idleFor after its last workload
    ended, not idleFor after the restart (nor never)."""
    case = new_case()
    node = f"idle-{case}"
    idle_for = 25.0
    trusted_baseline(api_client)
    with (
        gpu_nodes(api_client, [node], case=case),
        ProbeKubelet(api_client, {node: "pass"}),
        team_namespace(api_client, case) as team,
    ):
        create_policy(
            api_client, case, triggers={"onReturnFromUse": {"enabled": True, "idleFor": "25s"}}
        )
        wait_for(lambda: node_state(api_client, node) == "Qualified", 90, "acceptance")
        run_gpu_pod(api_client, team, "worker", node, None)
        wait_for(lambda: workloads(api_client, node), 30, "the record of the running Pod")
        end_pod(api_client, team, "worker")
        status = wait_for(
            lambda: (
                ((record(api_client, node) or {}).get("status") or {}).get("idleSince")
                and record(api_client, node)["status"]
            ),  # type: ignore[index]
            30,
            "the record's idleSince",
        )
        idle = parse_time(status["idleSince"])
        assert idle is not None
        operator.kill()
        time.sleep(3)
        operator.start()
        test = wait_for(
            lambda: [
                t
                for t in list_custom(api_client, "sdctests", node)
                if t["spec"].get("reason") == "ReturnFromUse"
            ],
            90,
            "the return-from-use screening",
        )[0]
        created = parse_time(test["metadata"]["creationTimestamp"])
        assert created is not None
        due = idle + dt.timedelta(seconds=idle_for)
        # Not before its time, and not idleFor after the restart: the restart took the
        # operator some seconds, and a pass runs at most every few seconds.
        assert created >= due - dt.timedelta(seconds=1.5), (created, due)
        assert created <= due + dt.timedelta(seconds=15), (created, due)


@pytest.fixture(autouse=True)
def _clear_receiver() -> Iterator[None]:
    Receiver.received = []
    yield
