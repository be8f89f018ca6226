"""Ticket sinks against a real HTTP server on 127.0.0.1 (stdlib client, no cluster).

Each receiver checks what a real endpoint would: method, path, headers, a valid
HMAC signature over the exact body, and the JSON fields of the documented schema.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import json
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from sdcguard.adapters import notify
from sdcguard.api import (
    VERSION,
    HardwareIdentity,
    Notification,
    ObjectMeta,
    RepairTicket,
    RepairTicketSpec,
    RepairTicketStatus,
    TicketPhase,
    TicketSink,
)

NOW = dt.datetime(2025, 3, 1, 12, 0, tzinfo=dt.UTC)
KEY = b"s3cret-signing-key"
LOOPBACK_RECEIVER = notify.SinkAddresses(allow_http=True, allow_loopback=True)
"""The explicit allowance these tests need: their receivers are plain HTTP on loopback,
which the operator refuses by default (tests/security checks that)."""


def deliver(*args: Any, **kwargs: Any) -> notify.DeliveryOutcome:
    return notify.deliver(*args, addresses=LOOPBACK_RECEIVER, **kwargs)


API = "https://kube.example:6443"


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


Reply = tuple[int, dict[str, str], bytes]


@dataclass
class Receiver:
    """An HTTP server that answers from a script and records every request."""

    answer: Callable[[Seen], Reply]
    seen: list[Seen] = field(default_factory=list)
    url: str = ""


@pytest.fixture
def receiver() -> Iterator[Callable[[Callable[[Seen], Reply]], Receiver]]:
    servers: list[ThreadingHTTPServer] = []

    def start(answer: Callable[[Seen], Reply]) -> Receiver:
        rec = Receiver(answer)

        class Handler(BaseHTTPRequestHandler):
            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                seen = Seen(
                    self.command,
                    self.path,
                    {k.lower(): v for k, v in self.headers.items()},
                    self.rfile.read(length),
                )
                rec.seen.append(seen)
                status, headers, body = rec.answer(seen)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _handle

            def log_message(self, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        servers.append(server)
        threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
        rec.url = f"http://127.0.0.1:{server.server_address[1]}"
        return rec

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def make_ticket(phase: TicketPhase = TicketPhase.OPEN, cycle: int = 1, **spec: Any) -> RepairTicket:
    return RepairTicket(
        metadata=ObjectMeta(name="gpu-node-7-1", uid="0b9c6c1e-uid"),
        spec=RepairTicketSpec(
            node_name="gpu-node-7",
            policy_ref="default",
            hardware=HardwareIdentity(
                provider_id="aws:///us-east-1a/i-0abc", device_ids=["GPU-1111", "GPU-2222"]
            ),
            evidence=["gpu-node-7-rq-1", "gpu-node-7-rq-2"],
            **spec,
        ),
        status=RepairTicketStatus(phase=phase, cycle=cycle, opened_at=NOW),
    )


class FakeSleep:
    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


def ok(_: Seen) -> Reply:
    return 200, {}, b"{}"


# ---------------------------------------------------------------- payload


def test_payload_has_the_documented_fields() -> None:
    payload = notify.build_payload(make_ticket(), api_server=API, cluster="prod-a", now=NOW)
    assert payload["schemaVersion"] == notify.WEBHOOK_SCHEMA_VERSION
    assert payload["event"] == "ticket.opened"
    assert payload["occurredAt"] == "2025-03-01T12:00:00Z"
    assert payload["cluster"] == "prod-a"
    t = payload["ticket"]
    assert t["name"] == "gpu-node-7-1"
    assert t["nodeName"] == "gpu-node-7"
    assert t["hardware"] == {
        "providerID": "aws:///us-east-1a/i-0abc",
        "deviceIDs": ["GPU-1111", "GPU-2222"],
    }
    assert t["evidence"] == ["gpu-node-7-rq-1", "gpu-node-7-rq-2"]
    assert (t["phase"], t["cycle"], t["openedAt"]) == ("Open", 1, "2025-03-01T12:00:00Z")
    assert t["url"] == f"{API}/apis/sdcguard.dev/{VERSION}/repairtickets/gpu-node-7-1"
    # The body is plain JSON: what receivers in any language parse.
    assert json.loads(notify.encode_body(payload)) == payload


def test_event_follows_the_ticket_phase() -> None:
    assert notify.event_for(make_ticket(TicketPhase.OPEN)) is notify.TicketEvent.OPENED
    assert notify.event_for(make_ticket(TicketPhase.IN_REPAIR)) is notify.TicketEvent.UPDATED
    assert notify.event_for(make_ticket(TicketPhase.CLOSED)) is notify.TicketEvent.CLOSED
    assert notify.event_for(make_ticket(TicketPhase.RETIRED)) is notify.TicketEvent.CLOSED


def test_idempotency_key_is_stable_per_event_and_new_per_cycle() -> None:
    first = notify.build_payload(make_ticket(), api_server=API, now=NOW)
    rebuilt = notify.build_payload(
        make_ticket(), api_server=API, now=NOW + dt.timedelta(hours=3)
    )  # e.g. after an operator restart
    second_cycle = notify.build_payload(make_ticket(cycle=2), api_server=API, now=NOW)
    closed = notify.build_payload(make_ticket(TicketPhase.CLOSED), api_server=API, now=NOW)
    assert first["idempotencyKey"] == rebuilt["idempotencyKey"]
    assert (
        len({first["idempotencyKey"], second_cycle["idempotencyKey"], closed["idempotencyKey"]})
        == 3
    )
    assert len(first["idempotencyKey"]) <= 128  # fits status.notification.idempotencyKey


def standard_signature(message_id: str, timestamp: str, body: bytes, key: bytes) -> str:
    """The receiver-side check documented in the chart README (Standard Webhooks)."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def test_signature_verifies_like_the_readme_example() -> None:
    body = b'{"event":"ticket.opened"}'
    header = notify.sign("msg-1", 1_700_000_000, body, KEY)
    assert hmac.compare_digest(standard_signature("msg-1", "1700000000", body, KEY), header)
    headers = {
        "webhook-id": "msg-1",
        "webhook-timestamp": "1700000000",
        "webhook-signature": header,
    }
    assert notify.verify_signature(body, KEY, headers, now=1_700_000_100)
    assert not notify.verify_signature(body + b" ", KEY, headers, now=1_700_000_100)
    assert not notify.verify_signature(body, b"other-key", headers, now=1_700_000_100)
    # Outside the replay window the same bytes are refused.
    assert not notify.verify_signature(body, KEY, headers, now=1_700_000_000 + 301)
    # A whsec_ Secret value is the base64 of the key, as Standard Webhooks libraries take it.
    encoded = b"whsec_" + base64.b64encode(KEY)
    assert notify.sign("msg-1", 1_700_000_000, body, encoded) == header


# ---------------------------------------------------------------- webhook


def test_webhook_request_shape(receiver: Callable[..., Receiver]) -> None:
    rec = receiver(ok)
    sink = TicketSink(type="webhook", url=rec.url + "/hooks/sdc")
    payload = notify.build_payload(make_ticket(), api_server=API, now=NOW)

    outcome = deliver(payload, sink, KEY, sleep=FakeSleep())

    assert outcome == notify.DeliveryOutcome(delivered=True, attempts=1)
    (req,) = rec.seen
    assert (req.method, req.path) == ("POST", "/hooks/sdc")
    assert req.headers["content-type"] == "application/json"
    assert req.headers["idempotency-key"] == payload["idempotencyKey"]
    assert req.headers["x-sdcguard-event"] == "ticket.opened"
    assert req.headers["webhook-id"] == payload["idempotencyKey"]
    timestamp = req.headers["webhook-timestamp"]
    expected = standard_signature(req.headers["webhook-id"], timestamp, req.body, KEY)
    assert req.headers["webhook-signature"] == expected
    body = req.json()
    assert body["event"] == "ticket.opened"
    assert body["ticket"]["nodeName"] == "gpu-node-7"
    assert body["ticket"]["evidence"] == ["gpu-node-7-rq-1", "gpu-node-7-rq-2"]
    assert "authorization" not in req.headers  # the signing key never travels


def test_webhook_without_secret_is_unsigned(receiver: Callable[..., Receiver]) -> None:
    rec = receiver(ok)
    payload = notify.build_payload(make_ticket(), api_server=API, now=NOW)
    outcome = deliver(payload, TicketSink(type="webhook", url=rec.url), None)
    assert outcome.delivered
    assert "webhook-signature" not in rec.seen[0].headers


def test_webhook_retries_a_500_with_the_same_key_and_body(
    receiver: Callable[..., Receiver],
) -> None:
    rec = receiver(lambda seen: (500, {}, b"boom") if len(rec.seen) == 1 else (200, {}, b""))
    payload = notify.build_payload(make_ticket(), api_server=API, now=NOW)
    sleep = FakeSleep()

    outcome = deliver(payload, TicketSink(type="webhook", url=rec.url), KEY, sleep=sleep)

    assert outcome.delivered and outcome.attempts == 2 and outcome.last_error is None
    assert sleep.calls == []  # urllib3's Retry tries a first failure again at once
    first, second = rec.seen
    assert first.headers["idempotency-key"] == second.headers["idempotency-key"]
    assert first.body == second.body
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    for seen in (first, second):  # each attempt is dated and signed on its own
        timestamp = seen.headers["webhook-timestamp"]
        expected = standard_signature(seen.headers["webhook-id"], timestamp, seen.body, KEY)
        assert seen.headers["webhook-signature"] == expected
    assert (
        first.headers["x-sdcguard-delivery-attempt"],
        second.headers["x-sdcguard-delivery-attempt"],
    ) == ("1", "2")


def test_webhook_backoff_is_exponential_and_bounded(receiver: Callable[..., Receiver]) -> None:
    rec = receiver(lambda seen: (503, {}, b"busy"))
    payload = notify.build_payload(make_ticket(), api_server=API, now=NOW)
    sleep = FakeSleep()

    outcome = deliver(
        payload,
        TicketSink(type="webhook", url=rec.url),
        KEY,
        retry=notify.RetryPolicy(max_attempts=7),
        previous_attempts=3,
        sleep=sleep,
    )

    assert not outcome.delivered and outcome.attempts == 7 == len(rec.seen)
    # At once, then doubling from 1 s, capped at the call's longest pause.
    assert sleep.calls == [1.0, 2.0, 4.0, 8.0, notify.MAX_DELAY_PER_CALL_SECONDS]
    assert outcome.last_error is not None and "HTTP 503: busy" in outcome.last_error
    assert outcome.retry_after == notify.next_retry_delay(10) and not outcome.permanent


def test_webhook_honours_retry_after(receiver: Callable[..., Receiver]) -> None:
    rec = receiver(
        lambda seen: (429, {"Retry-After": "3"}, b"") if len(rec.seen) == 1 else (204, {}, b"")
    )
    payload = notify.build_payload(make_ticket(), api_server=API, now=NOW)
    sleep = FakeSleep()
    outcome = deliver(payload, TicketSink(type="webhook", url=rec.url), KEY, sleep=sleep)
    assert outcome.delivered and sleep.calls == [3.0]


def test_long_retry_after_is_handed_back_to_the_operator(
    receiver: Callable[..., Receiver],
) -> None:
    rec = receiver(lambda seen: (503, {"Retry-After": "600"}, b""))
    payload = notify.build_payload(make_ticket(), api_server=API, now=NOW)
    sleep = FakeSleep()
    outcome = deliver(payload, TicketSink(type="webhook", url=rec.url), KEY, sleep=sleep)
    assert not outcome.delivered and outcome.attempts == 1 and sleep.calls == []
    assert outcome.retry_after is not None and outcome.retry_after >= 600


def test_retry_after_as_a_date_is_read_against_the_clock_passed_in(
    receiver: Callable[..., Receiver],
) -> None:
    rec = receiver(
        lambda seen: (
            (503, {"Retry-After": "Sat, 01 Mar 2025 12:00:07 GMT"}, b"")
            if len(rec.seen) == 1
            else (200, {}, b"")
        )
    )
    payload = notify.build_payload(make_ticket(), api_server=API, now=NOW)
    sleep = FakeSleep()
    outcome = deliver(
        payload,
        TicketSink(type="webhook", url=rec.url),
        KEY,
        sleep=sleep,
        clock=NOW.timestamp,
    )
    assert outcome.delivered and sleep.calls == [7.0]


def test_an_unreadable_retry_after_leaves_the_backoff_to_decide(
    receiver: Callable[..., Receiver],
) -> None:
    rec = receiver(lambda seen: (503, {"Retry-After": "soon"}, b""))
    payload = notify.build_payload(make_ticket(), api_server=API, now=NOW)
    sleep = FakeSleep()
    outcome = deliver(payload, TicketSink(type="webhook", url=rec.url), KEY, sleep=sleep)
    assert not outcome.delivered and outcome.attempts == 3 and sleep.calls == [1.0]


def test_the_proxy_the_environment_names_carries_the_request(
    receiver: Callable[..., Receiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTP_PROXY / HTTPS_PROXY (the chart's operator.extraEnv) reach the sinks, as
    they did through the standard library."""
    proxy = receiver(ok)
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    payload = notify.build_payload(make_ticket(), api_server=API, now=NOW)
    url = "http://hooks.example.invalid/sdc"
    assert deliver(payload, TicketSink(type="webhook", url=url), KEY).delivered
    (req,) = proxy.seen
    assert req.path == url  # the absolute form a proxy is sent
    # NO_PROXY names the hosts reached directly: the proxy sees nothing more.
    direct = receiver(ok)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    assert deliver(payload, TicketSink(type="webhook", url=direct.url), KEY).delivered
    assert len(proxy.seen) == 1 and len(direct.seen) == 1


def test_client_error_is_permanent_and_not_retried(receiver: Callable[..., Receiver]) -> None:
    rec = receiver(lambda seen: (401, {}, b"bad signature"))
    payload = notify.build_payload(make_ticket(), api_server=API, now=NOW)
    sleep = FakeSleep()
    outcome = deliver(payload, TicketSink(type="webhook", url=rec.url), KEY, sleep=sleep)
    assert not outcome.delivered and outcome.permanent and outcome.attempts == 1
    assert sleep.calls == [] and outcome.last_error is not None
    assert "HTTP 401: bad signature" in outcome.last_error


def test_user_info_in_the_url_becomes_basic_auth(receiver: Callable[..., Receiver]) -> None:
    rec = receiver(ok)
    url = rec.url.replace("http://", "http://hook%40user:p%3Ass@") + "/in?x=1"
    payload = notify.build_payload(make_ticket(), api_server=API, now=NOW)
    assert deliver(payload, TicketSink(type="webhook", url=url), KEY).delivered
    (req,) = rec.seen
    assert req.path == "/in?x=1"
    assert req.headers["authorization"] == basic(b"hook@user:p:ss")


def test_redirects_are_not_followed(receiver: Callable[..., Receiver]) -> None:
    rec = receiver(lambda seen: (302, {"Location": "http://127.0.0.1:1/elsewhere"}, b""))
    payload = notify.build_payload(make_ticket(), api_server=API, now=NOW)
    outcome = deliver(payload, TicketSink(type="webhook", url=rec.url), KEY, sleep=FakeSleep())
    assert not outcome.delivered and outcome.permanent and len(rec.seen) == 1


def test_receiver_down_records_the_error_without_raising() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://user:pw@127.0.0.1:{port}/hook?token=abc"
    payload = notify.build_payload(make_ticket(), api_server=API, now=NOW)
    sleep = FakeSleep()

    outcome = deliver(payload, TicketSink(type="webhook", url=url), KEY, sleep=sleep)

    assert not outcome.delivered
    assert outcome.attempts == notify.DEFAULT_MAX_ATTEMPTS
    assert outcome.last_error is not None and f"127.0.0.1:{port}/hook" in outcome.last_error
    assert "refused" in outcome.last_error.lower()
    assert "pw" not in outcome.last_error and "token" not in outcome.last_error
    assert outcome.retry_after is not None and outcome.retry_after > 0
    assert sleep.calls == [1.0]  # three attempts: at once, then after 1 s


def test_record_delivery_accumulates_attempts() -> None:
    failed = notify.DeliveryOutcome(False, 3, "HTTP 503", retry_after=60)
    first = notify.record_delivery(Notification(), failed, "k", NOW)
    assert (first.delivered, first.attempts, first.last_error) == (False, 3, "HTTP 503")
    done = notify.record_delivery(first, notify.DeliveryOutcome(True, 1), "k", NOW)
    assert (done.delivered, done.attempts, done.last_error, done.idempotency_key) == (
        True,
        4,
        None,
        "k",
    )
    assert done.last_attempt == NOW


def test_next_retry_delay_grows_and_caps() -> None:
    delays = [notify.next_retry_delay(n) for n in range(0, 20)]
    assert delays[:3] == [30.0, 60.0, 120.0]
    assert delays == sorted(delays) and delays[-1] == notify.RETRY_AFTER_CAP_SECONDS


# ---------------------------------------------------------------- jira


def jira_sink(url: str) -> TicketSink:
    from sdcguard.api.policy import SecretKeyRef

    return TicketSink(
        type="jira",
        url=f"{url}/?project=OPS&issueType=Task&closeTransition=Done",
        secret_ref=SecretKeyRef(name="jira", namespace="sdcguard-system"),
    )


JIRA_SECRET = b"ops@example.com:api-token-123"


def basic(secret: bytes) -> str:
    return "Basic " + base64.b64encode(secret).decode()


def test_jira_creates_an_issue_in_adf(receiver: Callable[..., Receiver]) -> None:
    def answer(seen: Seen) -> Reply:
        if seen.path == "/rest/api/3/search/jql":
            return 200, {}, b'{"issues": []}'
        return 201, {}, json.dumps({"id": "10001", "key": "OPS-42"}).encode()

    rec = receiver(answer)
    payload = notify.build_payload(make_ticket(), api_server=API, now=NOW)

    outcome = deliver(payload, jira_sink(rec.url), JIRA_SECRET, sleep=FakeSleep())

    assert outcome.delivered and outcome.attempts == 2
    assert outcome.external is not None
    assert (outcome.external.system, outcome.external.id) == ("jira", "OPS-42")
    assert outcome.external.url == f"{rec.url}/browse/OPS-42"
    search, create = rec.seen
    assert (search.method, search.path) == ("POST", "/rest/api/3/search/jql")
    assert 'project = "OPS"' in search.json()["jql"]
    assert (create.method, create.path) == ("POST", "/rest/api/3/issue")
    for req in rec.seen:
        assert req.headers["authorization"] == basic(JIRA_SECRET)
        assert req.headers["content-type"] == "application/json"
    fields = create.json()["fields"]
    assert fields["project"] == {"key": "OPS"}
    assert fields["issuetype"] == {"name": "Task"}
    assert "gpu-node-7" in fields["summary"]
    doc = fields["description"]
    assert doc["type"] == "doc" and doc["version"] == 1
    assert {node["type"] for node in doc["content"]} == {"paragraph", "bulletList"}
    text = json.dumps(doc)
    assert "gpu-node-7-rq-1" in text and "GPU-1111" in text
    label = next(lbl for lbl in fields["labels"] if lbl != "sdcguard")
    assert f'labels = "{label}"' in search.json()["jql"]


def test_jira_retry_finds_the_issue_instead_of_filing_twice(
    receiver: Callable[..., Receiver],
) -> None:
    rec = receiver(lambda seen: (200, {}, b'{"issues": [{"id": "1", "key": "OPS-42"}]}'))
    payload = notify.build_payload(make_ticket(), api_server=API, now=NOW)
    outcome = deliver(payload, jira_sink(rec.url), JIRA_SECRET, sleep=FakeSleep())
    assert outcome.delivered and outcome.external is not None and outcome.external.id == "OPS-42"
    assert [s.path for s in rec.seen] == ["/rest/api/3/search/jql"]


def test_jira_close_comments_and_transitions(receiver: Callable[..., Receiver]) -> None:
    from sdcguard.api import ExternalRef, Resolution

    def answer(seen: Seen) -> Reply:
        if seen.method == "GET" and seen.path.endswith("/transitions"):
            body = {
                "transitions": [
                    {"id": "11", "name": "Start", "to": {"name": "In Progress"}},
                    {"id": "31", "name": "Done", "to": {"name": "Done"}},
                ]
            }
            return 200, {}, json.dumps(body).encode()
        if seen.path.endswith("/transitions"):
            return 204, {}, b""
        return 201, {}, b'{"id": "9"}'

    rec = receiver(answer)
    ticket = make_ticket(
        TicketPhase.CLOSED,
        external=ExternalRef(system="jira", id="OPS-42"),
        resolution=Resolution.REPAIRED,
        resolution_note="GPU 3 reseated",
    )
    payload = notify.build_payload(ticket, api_server=API, now=NOW)

    outcome = deliver(payload, jira_sink(rec.url), JIRA_SECRET, sleep=FakeSleep())

    assert outcome.delivered, outcome.last_error
    assert [(s.method, s.path) for s in rec.seen] == [
        ("POST", "/rest/api/3/issue/OPS-42/comment"),
        ("GET", "/rest/api/3/issue/OPS-42/transitions"),
        ("POST", "/rest/api/3/issue/OPS-42/transitions"),
    ]
    comment = json.dumps(rec.seen[0].json()["body"])
    assert "Repaired" in comment and "GPU 3 reseated" in comment
    assert rec.seen[2].json() == {"transition": {"id": "31"}}


def test_jira_server_error_keeps_the_issue_reference(receiver: Callable[..., Receiver]) -> None:
    from sdcguard.api import ExternalRef

    rec = receiver(lambda seen: (502, {}, b"gateway"))
    ticket = make_ticket(TicketPhase.IN_REPAIR, external=ExternalRef(system="jira", id="OPS-7"))
    payload = notify.build_payload(ticket, api_server=API, now=NOW)
    outcome = deliver(payload, jira_sink(rec.url), JIRA_SECRET, sleep=FakeSleep())
    assert not outcome.delivered and outcome.attempts == 3
    assert outcome.external is not None and outcome.external.id == "OPS-7"
    assert outcome.last_error is not None and "HTTP 502" in outcome.last_error


def test_jira_misconfiguration_is_a_recorded_permanent_failure() -> None:
    from sdcguard.api.policy import SecretKeyRef

    payload = notify.build_payload(make_ticket(), api_server=API, now=NOW)
    no_project = TicketSink(
        type="jira",
        url="https://example.atlassian.net/",
        secret_ref=SecretKeyRef(name="jira", namespace="ns"),
    )
    outcome = deliver(payload, no_project, JIRA_SECRET)
    assert not outcome.delivered and outcome.permanent and outcome.attempts == 0
    assert outcome.last_error is not None and "project" in outcome.last_error

    good = jira_sink("https://example.atlassian.net")
    for secret in (b"token-without-email", None):
        outcome = deliver(payload, good, secret)
        assert not outcome.delivered and outcome.permanent and outcome.attempts == 0
        assert outcome.last_error is not None and "email:api-token" in outcome.last_error


def test_jira_sink_parses_the_url() -> None:
    sink = notify.jira_sink(jira_sink("https://acme.atlassian.net"))
    assert sink == notify.JiraSink(
        base_url="https://acme.atlassian.net",
        project="OPS",
        issue_type="Task",
        close_transition="Done",
    )


# ---------------------------------------------------------------- blast radius


def _radius(workloads: int) -> Any:
    from sdcguard.api import BlastRadius, Workload

    return BlastRadius(
        window_start=NOW - dt.timedelta(hours=5),
        window_end=NOW,
        workloads=[
            Workload(
                namespace="team-a",
                kind="Job",
                name=f"train-{i}",
                api_version="batch/v1",
                uid=f"uid-{i}",
                pods=[f"train-{i}-0"],
                pod_count=1,
                accelerators=8,
                first_seen=NOW - dt.timedelta(hours=4),
                last_seen=NOW - dt.timedelta(hours=1),
            )
            for i in range(workloads)
        ],
        dropped=2,
        advice="roll back to a checkpoint saved before 2025-03-01T07:00:00Z",
    )


def test_a_webhook_receives_the_blast_radius(receiver: Callable[..., Receiver]) -> None:
    rec = receiver(ok)
    ticket = make_ticket(blast_radius=_radius(2))
    payload = notify.build_payload(ticket, api_server=API, now=NOW)
    outcome = deliver(
        payload, TicketSink(type="webhook", url=f"{rec.url}/sdc"), KEY, sleep=FakeSleep()
    )
    assert outcome.delivered
    blast = rec.seen[-1].json()["ticket"]["blastRadius"]
    assert blast["windowStart"] == "2025-03-01T07:00:00Z"
    assert blast["windowEnd"] == "2025-03-01T12:00:00Z"
    assert blast["dropped"] == 2 and blast["advice"].startswith("roll back")
    first = blast["workloads"][0]
    assert first == {
        "namespace": "team-a",
        "kind": "Job",
        "name": "train-0",
        "apiVersion": "batch/v1",
        "uid": "uid-0",
        "pods": ["train-0-0"],
        "podCount": 1,
        "running": [],
        "accelerators": 8,
        "firstSeen": "2025-03-01T08:00:00Z",
        "lastSeen": "2025-03-01T11:00:00Z",
    }
    # A ticket without a blast radius (records off) says so with null.
    plain = notify.build_payload(make_ticket(), api_server=API, now=NOW)
    assert plain["ticket"]["blastRadius"] is None


def test_a_jira_issue_lists_the_first_workloads_and_counts_the_rest() -> None:
    payload = notify.build_payload(make_ticket(blast_radius=_radius(25)), api_server=API, now=NOW)
    text = json.dumps(notify.adf_document(payload))
    assert "27 workloads used the node from 2025-03-01T07:00:00Z" in text
    assert "team-a/Job/train-19" in text and "team-a/Job/train-20" not in text
    assert "More workloads: " in text and "7 (see the RepairTicket)" in text
