"""Announce RepairTicket changes to the policy's ticket sinks, at least once.

Delivery state lives in the ticket's ``status.notification`` (idempotency key of
the current event, attempts, last error), so an operator restart resumes where it
left off and a receiver that is down only delays the announcement: quarantine
never waits for it. Receivers dedupe on the idempotency key.
"""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any

import structlog
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from sdcguard.adapters import notify
from sdcguard.adapters.kube import GROUP, VERSION, KubeWriter
from sdcguard.api import Notification, RepairTicket, SDCPolicy, TicketSink, to_body
from sdcguard.metrics import Metrics

log = structlog.get_logger("sdcguard.tickets")


def _secret(core: client.CoreV1Api, sink: TicketSink) -> bytes | None:
    ref = sink.secret_ref
    if ref is None:
        return None
    secret = core.read_namespaced_secret(ref.name, ref.namespace)
    data = (secret.data or {}).get(ref.key)
    if data is None:
        raise KeyError(f"Secret {ref.namespace}/{ref.name} has no key {ref.key!r}")
    return base64.b64decode(data)


def announce(body: dict[str, Any], writer: KubeWriter, metrics: Metrics, now: dt.datetime) -> str:
    """Deliver the ticket's current event to every sink of its policy, if not yet done.

    Returns what happened, for the log: "no-sinks", "up-to-date", "delivered",
    "retry" or "unreadable".
    """
    try:
        ticket = RepairTicket.model_validate(body)
    except ValidationError:
        return "unreadable"
    if not ticket.spec.policy_ref:
        return "no-sinks"
    try:
        raw = writer.custom.get_cluster_custom_object(
            GROUP, VERSION, "sdcpolicies", ticket.spec.policy_ref
        )
        policy = SDCPolicy.model_validate(raw)
    except (ApiException, ValidationError):
        return "no-sinks"
    sinks = policy.spec.repair.ticket_sinks
    if not sinks:
        return "no-sinks"
    event = notify.event_for(ticket)
    key = notify.idempotency_key(ticket, event)
    previous = ticket.status.notification if ticket.status else Notification()
    if previous.idempotency_key == key and previous.delivered:
        return "up-to-date"
    payload = notify.build_payload(
        ticket, event=event, api_server=writer.api.configuration.host, now=now
    )
    delivered_all = True
    attempts = 0
    last_error: str | None = None
    for sink in sinks:
        try:
            secret = _secret(writer.core, sink)
        except (ApiException, KeyError) as exc:
            delivered_all, last_error = False, f"{sink.type} {sink.url}: secret: {exc}"[:1024]
            metrics.notifications.labels(sink=sink.type, outcome="failed").inc()
            continue
        outcome = notify.deliver(payload, sink, secret)
        attempts += outcome.attempts
        metrics.notifications.labels(
            sink=sink.type, outcome="delivered" if outcome.delivered else "failed"
        ).inc()
        if not outcome.delivered:
            delivered_all = False
            last_error = f"{sink.type} {sink.url}: {outcome.last_error}"[:1024]
    same_event = previous.idempotency_key == key
    record = Notification(
        delivered=delivered_all,
        attempts=(previous.attempts if same_event else 0) + attempts,
        last_error=last_error,
        idempotency_key=key,
        last_attempt=now,
    )
    writer.patch_custom_status(
        "repairtickets", ticket.metadata.name, {"notification": to_body(record)}
    )
    log.info(
        "ticket announced" if delivered_all else "ticket announcement failed; will retry",
        ticket=ticket.metadata.name,
        node=ticket.spec.node_name,
        notification_event=event.value,
        attempts=record.attempts,
        error=last_error,
    )
    return "delivered" if delivered_all else "retry"
