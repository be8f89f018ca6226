"""The ticket announcer's delivery step against a real HTTP server on 127.0.0.1: the same
bytes for one event on every attempt, Retry-After and permanent refusals honoured,
the Jira key written back, Observe and dry-run reaching no sink."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from typing import Any

from kubernetes import client

from sdcguard.adapters import ticket_sinks
from sdcguard.adapters.kube import KubeWriter
from sdcguard.api import RepairTicket, SDCPolicy, TicketPhase, to_body
from sdcguard.metrics import Metrics
from tests.notify.test_notify import LOOPBACK_RECEIVER, NOW, Receiver, Reply, Seen, make_ticket


class _Writer(KubeWriter):
    """Records the status and spec patches instead of sending them."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.patches: list[tuple[str, dict[str, Any]]] = []

    def patch_custom_status(self, plural: str, name: str, status: dict[str, Any]) -> None:
        self.patches.append(("status", status))

    def patch_custom(self, plural: str, name: str, patch: dict[str, Any]) -> None:
        self.patches.append(("spec", patch))


def _policy(sink: dict[str, Any], mode: str = "Enforce") -> SDCPolicy:
    return SDCPolicy.model_validate(
        {
            "metadata": {"name": "default"},
            "spec": {"mode": mode, "repair": {"ticketSinks": [sink]}},
        }
    )


def _writer(dry_run: bool = False) -> _Writer:
    return _Writer(api=client.ApiClient(), metrics=Metrics(), dry_run=dry_run)


def _body(**status: Any) -> dict[str, Any]:
    body = to_body(make_ticket())
    body["status"] = {**body["status"], **status}
    return body


def _announce(
    rec: Receiver, body: dict[str, Any], when: dt.datetime, **kw: Any
) -> tuple[str, _Writer]:
    writer = kw.pop("writer", None) or _writer()
    policy = kw.pop("policy", None) or _policy({"type": "webhook", "url": rec.url + "/sdc"})
    ticket = RepairTicket.model_validate(body)
    outcome = ticket_sinks.announce(
        ticket, policy, writer, Metrics(), when, sleep=lambda _: None, addresses=LOOPBACK_RECEIVER
    )
    return outcome, writer


def _notification(writer: _Writer) -> dict[str, Any]:
    status = [p for kind, p in writer.patches if kind == "status"][-1]
    return dict(status["notification"]), status


def test_every_attempt_of_one_event_sends_the_same_bytes(
    receiver: Callable[[Callable[[Seen], Reply]], Receiver],
) -> None:
    rec = receiver(lambda _: (500, {}, b""))
    first, writer = _announce(rec, _body(), NOW)
    assert first == "retry"
    note, _ = _notification(writer)
    later = NOW + dt.timedelta(hours=2)  # past the back-off
    second, _ = _announce(rec, _body(notification=note), later)
    assert second == "retry"
    bodies = {s.body for s in rec.seen}
    assert len(rec.seen) >= 2 and len(bodies) == 1, "body (and signature) changed"
    assert json.loads(rec.seen[0].body)["occurredAt"] == "2025-03-01T12:00:00Z"


def test_retry_after_is_honoured_between_ticks(
    receiver: Callable[[Callable[[Seen], Reply]], Receiver],
) -> None:
    rec = receiver(lambda _: (503, {"Retry-After": "600"}, b""))
    outcome, writer = _announce(rec, _body(), NOW)
    assert outcome == "retry"
    note, _ = _notification(writer)
    assert note["nextAttempt"] == "2025-03-01T12:10:00Z"
    asked = len(rec.seen)
    tick, _ = _announce(rec, _body(notification=note), NOW + dt.timedelta(seconds=15))
    assert tick == "waiting" and len(rec.seen) == asked, "the sink said not before 10 min"
    again, _ = _announce(rec, _body(notification=note), NOW + dt.timedelta(minutes=11))
    assert again == "retry" and len(rec.seen) > asked


def test_a_permanent_refusal_stops_with_a_condition(
    receiver: Callable[[Callable[[Seen], Reply]], Receiver],
) -> None:
    rec = receiver(lambda _: (400, {}, b'{"error": "unknown project"}'))
    outcome, writer = _announce(rec, _body(), NOW)
    assert outcome == "failed" and len(rec.seen) == 1
    note, status = _notification(writer)
    assert note["permanent"] is True and note["nextAttempt"] == "2025-03-01T13:00:00Z"
    cond = next(c for c in status["conditions"] if c["type"] == "NotificationFailed")
    assert cond["status"] == "True" and cond["reason"] == "PermanentError"
    assert "400" in cond["message"]
    tick, _ = _announce(rec, _body(notification=note), NOW + dt.timedelta(minutes=5))
    assert tick == "waiting" and len(rec.seen) == 1


def test_the_jira_issue_key_is_written_back_to_the_ticket(
    receiver: Callable[[Callable[[Seen], Reply]], Receiver],
) -> None:
    def jira(seen: Seen) -> Reply:
        if seen.path.endswith("/search/jql"):
            return 200, {}, b'{"issues": []}'
        return 201, {}, b'{"key": "OPS-42"}'

    rec = receiver(jira)
    import base64

    secret = base64.b64encode(b"bot@example.com:token").decode()
    writer = _writer()
    writer.core.read_namespaced_secret = lambda *a, **k: client.V1Secret(  # type: ignore[method-assign]
        data={"token": secret}
    )
    sink = {
        "type": "jira",
        "url": rec.url + "/?project=OPS",
        "secretRef": {"name": "jira", "namespace": "sdcguard-system", "key": "token"},
    }
    outcome, writer = _announce(rec, _body(), NOW, writer=writer, policy=_policy(sink))
    assert outcome == "delivered"
    (spec,) = [p for kind, p in writer.patches if kind == "spec"]
    assert spec == {
        "spec": {"external": {"system": "jira", "id": "OPS-42", "url": rec.url + "/browse/OPS-42"}}
    }


def test_a_jira_key_written_back_between_attempts_leaves_the_webhook_bytes_alone(
    receiver: Callable[[Callable[[Seen], Reply]], Receiver],
) -> None:
    """Jira files the issue and its key is written back; the webhook failed, and its
    retry (the ticket now names the issue) sends exactly the first attempt's bytes."""

    def sinks(seen: Seen) -> Reply:
        if seen.path.startswith("/sdc"):
            return 500, {}, b""
        if seen.path.endswith("/search/jql"):
            return 200, {}, b'{"issues": []}'
        return 201, {}, b'{"key": "OPS-42"}'

    rec = receiver(sinks)
    import base64

    secret = base64.b64encode(b"bot@example.com:token").decode()
    policy = SDCPolicy.model_validate(
        {
            "metadata": {"name": "default"},
            "spec": {
                "repair": {
                    "ticketSinks": [
                        {
                            "type": "jira",
                            "url": rec.url + "/?project=OPS",
                            "secretRef": {
                                "name": "jira",
                                "namespace": "sdcguard-system",
                                "key": "token",
                            },
                        },
                        {"type": "webhook", "url": rec.url + "/sdc"},
                    ]
                }
            },
        }
    )

    def writer() -> _Writer:
        w = _writer()
        w.core.read_namespaced_secret = lambda *a, **k: client.V1Secret(  # type: ignore[method-assign]
            data={"token": secret}
        )
        return w

    outcome, first = _announce(rec, _body(), NOW, writer=writer(), policy=policy)
    assert outcome == "retry"
    (spec,) = [p for kind, p in first.patches if kind == "spec"]
    note, _ = _notification(first)
    body = _body(notification=note)
    body["spec"] = {**body["spec"], **spec["spec"]}  # the key as the API now holds it
    later = NOW + dt.timedelta(hours=2)  # past the back-off
    again, second = _announce(rec, body, later, writer=writer(), policy=policy)
    assert again == "retry"
    hooks = [s.body for s in rec.seen if s.path.startswith("/sdc")]
    assert len(hooks) >= 2 and len(set(hooks)) == 1, "the webhook body changed"
    assert json.loads(hooks[0])["ticket"]["external"] is None
    assert not [p for kind, p in second.patches if kind == "spec"], "the key is known"
    # The next event names the issue.
    assert _notification(second)[0].get("external") is None


def test_observe_and_dry_run_reach_no_sink(
    receiver: Callable[[Callable[[Seen], Reply]], Receiver],
) -> None:
    rec = receiver(lambda _: (200, {}, b""))
    sink = {"type": "webhook", "url": rec.url + "/sdc"}
    observe, w1 = _announce(rec, _body(), NOW, policy=_policy(sink, mode="Observe"))
    dry, w2 = _announce(rec, _body(), NOW, writer=_writer(dry_run=True))
    assert (observe, dry) == ("observe", "dry-run")
    assert rec.seen == [] and w1.patches == [] and w2.patches == []


def test_only_tickets_with_an_event_left_are_announced() -> None:
    assert ticket_sinks.needs_announcing(make_ticket())
    closed = make_ticket(phase=TicketPhase.CLOSED)
    assert ticket_sinks.needs_announcing(closed), "the closing event is still to deliver"
    from sdcguard.adapters import notify

    key = notify.idempotency_key(closed, notify.event_for(closed))
    body = to_body(closed)
    body["status"]["notification"] = {"delivered": True, "idempotencyKey": key}
    assert not ticket_sinks.needs_announcing(RepairTicket.model_validate(body))
