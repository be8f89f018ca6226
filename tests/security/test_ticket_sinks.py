"""A person who can write an SDCPolicy, or read statuses and logs, against the ticket
sinks: the sink's credentials never show, the operator cannot be aimed at its own
Pod, the node's metadata service or the cluster's ranges, a signed webhook cannot be
replayed outside its window, and a sink cannot make the operator read without bound."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Callable
from ipaddress import ip_network

import pytest
from structlog.testing import capture_logs

from sdcguard.adapters import notify, ticket_sinks
from sdcguard.api import RepairTicket, TicketSink
from sdcguard.metrics import Metrics
from tests.notify.test_announce import _body, _policy, _writer
from tests.notify.test_notify import NOW, Receiver, Reply, Seen, make_ticket

KEY = b"webhook-signing-key"
TEST_RECEIVER = notify.SinkAddresses(allow_http=True, allow_loopback=True)

Start = Callable[[Callable[[Seen], Reply]], Receiver]


def _payload() -> notify.WebhookPayload:
    return notify.build_payload(make_ticket(), api_server="https://kube.example", now=NOW)


def test_sink_credentials_never_reach_the_status_or_the_log(receiver: Start) -> None:
    rec = receiver(lambda _: (503, {}, b"down"))
    port = rec.url.rsplit(":", 1)[1]
    url = f"http://hook-user:hunter2@127.0.0.1:{port}/sdc?token=QUERYSECRET#FRAGSECRET"
    writer = _writer()
    with capture_logs() as logs:
        ticket_sinks.announce(
            RepairTicket.model_validate(_body()),
            _policy({"type": "webhook", "url": url}),
            writer,
            Metrics(),
            NOW,
            sleep=lambda _: None,
            addresses=TEST_RECEIVER,
        )
    assert rec.seen, "the receiver was not reached: the test shows nothing"
    written = repr(writer.patches) + repr(logs)
    assert f"127.0.0.1:{port}/sdc" in written  # the sink is still named
    for secret in ("hunter2", "hook-user", "QUERYSECRET", "FRAGSECRET"):
        assert secret not in written, f"{secret} leaked into a status or the log"


def _never(request: notify.HttpRequest) -> notify.HttpResponse:
    raise AssertionError(f"a request was sent to {request.url}")


@pytest.mark.parametrize(
    ("url", "resolves_to", "why"),
    [
        ("http://hooks.example.com/sdc", ["203.0.113.7"], "uses http://"),
        ("https://169.254.169.254/latest/meta-data/", None, "cloud metadata"),
        ("https://[fd00:ec2::254]/latest/", None, "cloud metadata"),
        ("https://metadata.example.com/", ["169.254.169.254"], "cloud metadata"),
        ("https://[fe80::1]/hook", None, "link-local"),
        ("https://169.254.10.10/hook", None, "link-local"),
        ("https://127.0.0.1:8080/metrics", None, "loopback"),
        ("https://localhost.example.com/", ["::1"], "loopback"),
        ("https://[::ffff:169.254.169.254]/", None, "cloud metadata"),
        ("https://kubernetes.default.svc/api", ["10.96.0.1"], "cluster-internal"),
        ("https://10.244.3.7/hook", None, "cluster-internal"),
    ],
)
def test_a_sink_cannot_aim_the_operator_inward(
    url: str, resolves_to: list[str] | None, why: str
) -> None:
    addresses = notify.SinkAddresses(
        denied_cidrs=(ip_network("10.96.0.0/12"), ip_network("10.244.0.0/16")),
        resolve=lambda host, port: resolves_to or [],
    )
    jira = TicketSink.model_validate(
        {
            "type": "jira",
            "url": url.split("?")[0] + "?project=OPS",
            "secretRef": {"name": "jira", "namespace": "sdcguard-system", "key": "token"},
        }
    )
    for sink in (TicketSink(type="webhook", url=url), jira):
        outcome = notify.deliver(
            _payload(), sink, b"a@b.c:token", _never, addresses=addresses, sleep=lambda _: None
        )
        assert not outcome.delivered and outcome.permanent and outcome.attempts == 0
        assert outcome.last_error is not None and why in outcome.last_error, outcome.last_error


def test_a_setting_allows_a_receiver_the_defaults_refuse(receiver: Start) -> None:
    rec = receiver(lambda _: (200, {}, b""))
    sink = TicketSink(type="webhook", url=rec.url + "/sdc")
    refused = notify.deliver(_payload(), sink, KEY)
    assert not refused.delivered and refused.permanent and not rec.seen
    assert notify.deliver(_payload(), sink, KEY, addresses=TEST_RECEIVER).delivered
    allowed = notify.SinkAddresses(allow_http=True, allowed_cidrs=(ip_network("127.0.0.0/8"),))
    assert notify.deliver(_payload(), sink, KEY, addresses=allowed).delivered


def _standard_webhooks_signature(headers: dict[str, str], body: bytes, key: bytes) -> str:
    """Written from the Standard Webhooks specification, not from sdcguard's code
    (checked once against the ``standardwebhooks`` package, which accepts it)."""
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def test_webhooks_are_signed_as_standard_webhooks_and_replays_are_dated(
    receiver: Start,
) -> None:
    rec = receiver(lambda _: (200, {}, b""))
    sink = TicketSink(type="webhook", url=rec.url + "/sdc")
    sent_at = 1_767_000_000.0
    outcome = notify.deliver(_payload(), sink, KEY, addresses=TEST_RECEIVER, clock=lambda: sent_at)
    assert outcome.delivered
    (seen,) = rec.seen
    assert seen.headers["webhook-timestamp"] == str(int(sent_at))
    assert seen.headers["webhook-id"] == seen.headers["idempotency-key"]
    assert seen.headers["webhook-signature"] == _standard_webhooks_signature(
        seen.headers, seen.body, KEY
    )
    assert "x-sdcguard-signature" not in seen.headers  # the undated signature is gone

    # A replay is refused once it is older than the documented window, and it cannot
    # be re-dated: the timestamp is signed.
    window = notify.REPLAY_WINDOW_SECONDS
    assert notify.verify_signature(seen.body, KEY, seen.headers, now=sent_at + window)
    assert not notify.verify_signature(seen.body, KEY, seen.headers, now=sent_at + window + 1)
    redated = {**seen.headers, "webhook-timestamp": str(int(sent_at) + 3600)}
    assert not notify.verify_signature(seen.body, KEY, redated, now=sent_at + 3600)


def test_a_sink_cannot_make_the_operator_read_without_bound(receiver: Start) -> None:
    huge = b"x" * (notify.MAX_RESPONSE_BYTES * 4)
    rec = receiver(lambda _: (400, {}, huge))
    request = notify.HttpRequest("POST", rec.url + "/sdc", {}, b"{}")
    response = notify.urllib3_opener(request)
    assert response.status == 400
    assert len(response.data) == notify.MAX_RESPONSE_BYTES
