"""A quarantine is announced to a signed webhook, at least once, even if it is down at first."""

from __future__ import annotations

import base64
import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kubernetes import client

from sdcdev.harness import (
    GROUP,
    NS,
    VERSION,
    ProbeKubelet,
    gpu_nodes,
    list_custom,
    node_state,
    policy_body,
    trusted_baseline,
    wait_for,
)
from sdcguard.adapters.notify import verify_signature

KEY = b"webhook-signing-key"


class Receiver(BaseHTTPRequestHandler):
    failures_left = 2
    received: list[tuple[dict[str, str], bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        type(self).received.append(({k.lower(): v for k, v in self.headers.items()}, body))
        if type(self).failures_left > 0:
            type(self).failures_left -= 1
            self.send_response(500)
            self.end_headers()
            return
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_quarantine_reaches_a_webhook_that_was_down(api_client, operator) -> None:
    case = uuid.uuid4().hex[:6]
    node = f"hook-{case}"
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    core = client.CoreV1Api(api_client)
    core.create_namespaced_secret(
        NS,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name=f"hook-{case}"),
            data={"token": base64.b64encode(KEY).decode()},
        ),
    )
    trusted_baseline(api_client)
    try:
        with gpu_nodes(api_client, [node], case=case), ProbeKubelet(api_client, {node: "sdc"}):
            sink = {
                "type": "webhook",
                "url": f"http://127.0.0.1:{server.server_port}/sdc",
                "secretRef": {"name": f"hook-{case}", "namespace": NS, "key": "token"},
            }
            body = policy_body(
                f"p-{case}",
                match_labels={"sdcguard.test/case": case},
                repair={"maxRepairCycles": 2, "ticketSinks": [sink]},
            )
            client.CustomObjectsApi(api_client).create_cluster_custom_object(
                GROUP, VERSION, "sdcpolicies", body
            )
            wait_for(lambda: node_state(api_client, node) == "Quarantined", 90, "quarantine")
            ticket = wait_for(
                lambda: [
                    t
                    for t in list_custom(api_client, "repairtickets", node)
                    if ((t.get("status") or {}).get("notification") or {}).get("delivered")
                ],
                90,
                "the webhook delivery to be recorded",
            )[0]
    finally:
        server.shutdown()
    note = ticket["status"]["notification"]
    assert note["attempts"] >= 3  # two 500s, then 200
    # Nothing holds the ticket's deletion: no operator is needed to delete it.
    assert not ticket["metadata"].get("finalizers")
    keys = {h["idempotency-key"] for h, _ in Receiver.received}
    assert len(keys) == 1 and note["idempotencyKey"] in keys
    headers, raw = Receiver.received[-1]
    assert verify_signature(raw, KEY, headers, now=float(headers["webhook-timestamp"]))
    payload = json.loads(raw)
    assert payload["event"] == "ticket.opened"
    assert payload["ticket"]["nodeName"] == node
    assert payload["ticket"]["evidence"] == ticket["spec"]["evidence"]


def test_an_older_releases_kopf_finalizer_leaves_the_tickets(api_client, operator) -> None:
    """Tickets that an older release's Kopf timer marked with its finalizer (so they
    could not be deleted with no operator running) lose it; other finalizers stay."""
    custom = client.CustomObjectsApi(api_client)
    name = f"old-{uuid.uuid4().hex[:6]}"
    marker = "kopf.zalando.org/KopfFinalizerMarker"
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "RepairTicket",
        "metadata": {"name": name, "finalizers": ["example.com/keep", marker]},
        "spec": {"nodeName": name, "policyRef": f"gone-{name}"},
    }
    custom.create_cluster_custom_object(GROUP, VERSION, "repairtickets", body)
    try:

        def finalizers() -> list[str]:
            got = custom.get_cluster_custom_object(GROUP, VERSION, "repairtickets", name)
            found: list[str] = got["metadata"].get("finalizers") or []
            return found

        wait_for(lambda: marker not in finalizers(), 30, "the Kopf finalizer to go")
        assert finalizers() == ["example.com/keep"]
    finally:
        custom.patch_cluster_custom_object(
            GROUP, VERSION, "repairtickets", name, {"metadata": {"finalizers": None}}
        )
        custom.delete_cluster_custom_object(GROUP, VERSION, "repairtickets", name)


def _sinks_ready(api: client.ApiClient, policy: str) -> dict[str, Any] | None:
    body = client.CustomObjectsApi(api).get_cluster_custom_object(
        GROUP, VERSION, "sdcpolicies", policy
    )
    conditions = (body.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "TicketSinksReady"), None)


def test_a_missing_sink_secret_or_key_shows_before_any_quarantine(api_client, operator) -> None:
    """TicketSinksReady is False, naming the Secret, while the sink's Secret is missing,
    still False (naming the key) when it lacks the key, and True once it has it: no
    quarantine is needed to find out."""
    case = uuid.uuid4().hex[:6]
    node, secret = f"sinkcheck-{case}", f"hook-{case}"
    sink = {
        "type": "webhook",
        "url": "https://repairs.example.com/sdc",
        "secretRef": {"name": secret, "namespace": NS, "key": "token"},
    }
    body = policy_body(
        f"p-{case}",
        match_labels={"sdcguard.test/case": case},
        repair={"maxRepairCycles": 2, "ticketSinks": [sink]},
    )
    core = client.CoreV1Api(api_client)
    with gpu_nodes(api_client, [node], case=case):
        client.CustomObjectsApi(api_client).create_cluster_custom_object(
            GROUP, VERSION, "sdcpolicies", body
        )
        policy = f"p-{case}"
        missing = wait_for(
            lambda: (c := _sinks_ready(api_client, policy)) and c["status"] == "False" and c,
            60,
            "TicketSinksReady False",
        )
        assert missing["reason"] == "SecretMissing"
        assert f"Secret {NS}/{secret} not found" in missing["message"]
        core.create_namespaced_secret(
            NS,
            client.V1Secret(
                metadata=client.V1ObjectMeta(name=secret),
                data={"other": base64.b64encode(KEY).decode()},
            ),
        )
        wait_for(
            lambda: (
                "has no key token" in (_sinks_ready(api_client, policy) or {}).get("message", "")
            ),
            60,
            "TicketSinksReady to name the missing key",
        )
        core.patch_namespaced_secret(
            secret, NS, {"data": {"token": base64.b64encode(KEY).decode()}}
        )
        wait_for(
            lambda: (_sinks_ready(api_client, policy) or {}).get("status") == "True",
            60,
            "TicketSinksReady True",
        )
        core.delete_namespaced_secret(secret, NS)
