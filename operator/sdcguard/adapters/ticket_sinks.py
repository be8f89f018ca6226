"""Announce RepairTicket changes to the policy's ticket sinks, at least once.

Delivery state lives in the ticket's ``status.notification`` (idempotency key of
the current event, attempts, last error), so an operator restart resumes where it
left off and a receiver that is down only delays the announcement: quarantine
never waits for it. Receivers dedupe on the idempotency key.
"""

from __future__ import annotations

import base64
import datetime as dt
import time
from collections.abc import Callable
from typing import Any

import structlog
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from sdcguard.adapters import hardware, notify
from sdcguard.adapters.hardware import HardwareRecord
from sdcguard.adapters.kube import KubeWriter
from sdcguard.api import (
    Mode,
    Notification,
    RepairTicket,
    SDCPolicy,
    TicketSink,
    set_condition,
    to_body,
)
from sdcguard.domain.echo import bounded
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


def event_time(ticket: RepairTicket) -> dt.datetime:
    """When the ticket's current event happened (its last phase change): the payload's
    ``occurredAt``, so every attempt of one event sends the same bytes."""
    status = ticket.status
    if status is not None and status.history:
        return status.history[-1].time
    if status is not None and status.opened_at is not None:
        return status.opened_at
    return ticket.metadata.creation_timestamp or dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def needs_announcing(body: dict[str, Any]) -> bool:
    """Whether a ticket has an event left to deliver: open tickets (their next event may
    come), and closed ones until their closing event is delivered."""
    status = body.get("status") or {}
    if status.get("phase") not in ("Closed", "Retired"):
        return True
    try:
        ticket = RepairTicket.model_validate(body)
    except ValidationError:
        return False
    note = ticket.status.notification if ticket.status else Notification()
    return not (
        note.delivered
        and note.idempotency_key == notify.idempotency_key(ticket, notify.event_for(ticket))
    )


def announce(
    body: dict[str, Any],
    policy: SDCPolicy | None,
    writer: KubeWriter,
    metrics: Metrics,
    now: dt.datetime,
    *,
    records: Callable[[str], HardwareRecord | None] = lambda _: None,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Deliver the ticket's current event to every sink of its policy, if not yet done.

    ``policy``: the ticket's SDCPolicy as the index holds it (None: gone). ``records``:
    an SDCHardware record by name (the index), for the hardware history the event
    carries; it is built at the event's first attempt and kept in
    ``status.notification``, so later attempts send the same bytes. Returns what
    happened, for the log: "no-sinks", "observe", "dry-run", "up-to-date", "waiting",
    "delivered", "retry", "failed" (a permanent refusal) or "unreadable".
    """
    try:
        ticket = RepairTicket.model_validate(body)
    except ValidationError:
        return "unreadable"
    if policy is None or not policy.spec.repair.ticket_sinks:
        return "no-sinks"
    if policy.spec.mode == Mode.OBSERVE:
        return "observe"  # Observe reaches no repair system
    if writer.dry_run:
        log.info("dry-run: ticket not announced", ticket=ticket.metadata.name)
        return "dry-run"
    sinks = policy.spec.repair.ticket_sinks
    event = notify.event_for(ticket)
    key = notify.idempotency_key(ticket, event)
    previous = ticket.status.notification if ticket.status else Notification()
    same_event = previous.idempotency_key == key
    if same_event and previous.delivered:
        return "up-to-date"
    if same_event and previous.next_attempt is not None and now < previous.next_attempt:
        return "waiting"
    at = event_time(ticket)
    # What the event's first attempt told is told again: its hardware history and the
    # external ticket known then (a Jira sink writing its issue back between two
    # attempts changes neither the body nor its signature).
    first = not (same_event and previous.hardware_history is not None)
    history = previous.hardware_history if not first else None
    if history is None:
        history = hardware.ticket_history(ticket, policy.spec.repair, records, at)
    told = ticket.spec.external if first else previous.external
    payload = notify.build_payload(
        ticket,
        event=event,
        api_server=writer.api.configuration.host,
        now=at,
        history=history,
        external=told,
    )
    delivered_all = True
    permanent = False
    attempts = 0
    wait = 0.0
    last_error: str | None = None
    external = None
    for sink in sinks:
        try:
            secret = _secret(writer.core, sink)
        except (ApiException, KeyError) as exc:
            delivered_all, last_error = False, bounded(f"{sink.type} {sink.url}: secret: {exc}")
            wait = max(wait, notify.next_retry_delay(previous.attempts if same_event else 0))
            metrics.notifications.labels(sink=sink.type, outcome="failed").inc()
            continue
        outcome = notify.deliver(
            payload,
            sink,
            secret,
            previous_attempts=previous.attempts if same_event else 0,
            sleep=sleep,
        )
        attempts += outcome.attempts
        external = external or outcome.external
        metrics.notifications.labels(
            sink=sink.type, outcome="delivered" if outcome.delivered else "failed"
        ).inc()
        if not outcome.delivered:
            delivered_all = False
            permanent = permanent or outcome.permanent
            wait = max(wait, outcome.retry_after or 0.0)
            last_error = bounded(f"{sink.type} {sink.url}: {outcome.last_error}")
    if external is not None and ticket.spec.external is None:
        # The issue the sink filed is the ticket's external reference (it acknowledges it).
        writer.patch_custom(
            "repairtickets", ticket.metadata.name, {"spec": {"external": to_body(external)}}
        )
    record = Notification(
        delivered=delivered_all,
        attempts=(previous.attempts if same_event else 0) + attempts,
        last_error=last_error,
        idempotency_key=key,
        last_attempt=now,
        next_attempt=None if delivered_all else now + dt.timedelta(seconds=wait),
        permanent=permanent and not delivered_all,
        hardware_history=history,
        external=told,
    )
    conditions = ticket.status.conditions if ticket.status else []
    failed = record.permanent
    conditions = set_condition(
        conditions,
        "NotificationFailed",
        "True" if failed else "False",
        "PermanentError" if failed else ("Delivered" if delivered_all else "Retrying"),
        bounded(last_error or "") if failed else ("delivered" if delivered_all else "retrying"),
        now,
    )
    writer.patch_custom_status(
        "repairtickets",
        ticket.metadata.name,
        {"notification": to_body(record), "conditions": [to_body(c) for c in conditions]},
    )
    log.info(
        "ticket announced" if delivered_all else "ticket announcement failed; will retry",
        ticket=ticket.metadata.name,
        node=ticket.spec.node_name,
        notification_event=event.value,
        attempts=record.attempts,
        next_attempt=record.next_attempt,
        permanent=record.permanent,
        error=last_error,
    )
    if delivered_all:
        return "delivered"
    return "failed" if permanent else "retry"
