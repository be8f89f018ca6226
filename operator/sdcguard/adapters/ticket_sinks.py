"""Announce RepairTicket changes to the policy's ticket sinks, at least once.

Delivery state lives in the ticket's ``status.notification`` (idempotency key of
the current event, attempts, last error), so an operator restart resumes where it
left off and a receiver that is down only delays the announcement: quarantine
never waits for it. Receivers dedupe on the idempotency key.

:class:`Announcer` is the one loop that does it for the fleet, from the operator's own
copy of the tickets (``adapters/inventory.py``). It is not a Kopf timer: Kopf puts
its finalizer on every object that has a timer (a write on each new ticket, made
between the ticket's creation and the quarantine's node patch, and a ticket that
cannot be deleted while no operator runs), and lists its resource in one request.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import datetime as dt
import functools
import time
from collections.abc import Callable, Mapping

import structlog
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sdcguard.adapters import hardware, notify
from sdcguard.adapters.hardware import HardwareRecord
from sdcguard.adapters.kube import KubeWriter
from sdcguard.adapters.observe import TicketSnapshot
from sdcguard.api import (
    Mode,
    Notification,
    RepairTicket,
    SDCPolicy,
    TicketPhase,
    TicketSink,
    set_condition,
    to_body,
)
from sdcguard.domain.echo import bounded
from sdcguard.metrics import Metrics
from sdcguard.settings import Settings, load_settings

log = structlog.get_logger("sdcguard.tickets")


def sink_addresses(settings: Settings) -> notify.SinkAddresses:
    """Where ticket sinks may point, as the operator's settings say."""
    return notify.SinkAddresses.from_settings(
        allow_http=settings.sink_allow_http,
        allow_loopback=settings.sink_allow_loopback,
        denied_cidrs=settings.sink_denied_cidrs,
        allowed_cidrs=settings.sink_allowed_cidrs,
    )


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


def needs_announcing(ticket: RepairTicket) -> bool:
    """Whether a ticket has an event left to deliver: open tickets (their next event may
    come), and closed ones until their closing event is delivered."""
    if ticket.status is None or ticket.status.phase not in (
        TicketPhase.CLOSED,
        TicketPhase.RETIRED,
    ):
        return True
    note = ticket.status.notification or Notification()
    return not (
        note.delivered
        and note.idempotency_key == notify.idempotency_key(ticket, notify.event_for(ticket))
    )


def announce(
    ticket: RepairTicket,
    policy: SDCPolicy | None,
    writer: KubeWriter,
    metrics: Metrics,
    now: dt.datetime,
    *,
    records: Callable[[str], HardwareRecord | None] = lambda _: None,
    sleep: Callable[[float], None] = time.sleep,
    addresses: notify.SinkAddresses = notify.STRICT,
) -> str:
    """Deliver the ticket's current event to every sink of its policy, if not yet done.

    ``policy``: the ticket's SDCPolicy as the index holds it (None: gone). ``records``:
    an SDCHardware record by name (the index), for the hardware history the event
    carries; it is built at the event's first attempt and kept in
    ``status.notification``, so later attempts send the same bytes. Returns what
    happened, for the log: "no-sinks", "observe", "dry-run", "up-to-date", "waiting",
    "delivered", "retry" or "failed" (a permanent refusal). ``addresses``: where sinks
    may point.
    """
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
            delivered_all, last_error = (
                False,
                bounded(f"{sink.type} {notify.redact_url(sink.url)}: secret: {exc}"),
            )
            wait = max(wait, notify.next_retry_delay(previous.attempts if same_event else 0))
            metrics.notifications.labels(sink=sink.type, outcome="failed").inc()
            continue
        outcome = notify.deliver(
            payload,
            sink,
            secret,
            previous_attempts=previous.attempts if same_event else 0,
            sleep=sleep,
            addresses=addresses,
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
            last_error = bounded(f"{sink.type} {notify.redact_url(sink.url)}: {outcome.last_error}")
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


KOPF_FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"
"""The finalizer an older release's Kopf timer put on every ticket: removed on sight."""

ANNOUNCE_INTERVAL_SECONDS = 15.0
"""How often a ticket with an event left is looked at again when it has not changed."""


class Announcer:
    """Every ticket's pending event delivered to its policy's sinks, in a few worker
    threads (a sink that is slow or down delays only the tickets it is working on).

    A ticket is tried when it first appears, whenever it changes (a new phase, its own
    notification written back) and every ``interval`` seconds while it has an event
    left; :func:`announce` then reads its status to decide whether anything is sent
    (delivered already, or waiting for Retry-After or the back-off). A ticket that does
    not parse is never tried (the API server validates them).

    ``tickets``: the copy of every ticket by name; ``policy``: an SDCPolicy by name as
    Kopf's index holds it (None: gone or unreadable, so nothing is sent); ``addresses``:
    where sinks may point (default: from the operator's settings).
    """

    def __init__(
        self,
        tickets: Callable[[], Mapping[str, TicketSnapshot]],
        writer: KubeWriter,
        metrics: Metrics,
        *,
        records: Callable[[str], HardwareRecord | None] = lambda _: None,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        interval: float = ANNOUNCE_INTERVAL_SECONDS,
        workers: int = 4,
        addresses: notify.SinkAddresses | None = None,
    ) -> None:
        self.tickets = tickets
        self.addresses = addresses or sink_addresses(load_settings())
        self.writer = writer
        self.metrics = metrics
        self.records = records
        self.clock = clock
        self.interval = interval
        self.policy: Callable[[str], SDCPolicy | None] | None = None
        """Set by the first policy daemon, which holds Kopf's policy index; no ticket is
        tried before (a ticket's policy would look gone)."""
        self.pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="tickets")
        self._tried: dict[str, tuple[str, float]] = {}
        """Each ticket's resourceVersion and monotonic time at its last try."""
        self._busy: set[str] = set()
        self._settled: dict[str, str] = {}
        """Tickets with nothing left to do, at the resourceVersion that showed it."""

    def due(self, now: float) -> list[TicketSnapshot]:
        """The tickets to try now (``now``: monotonic seconds), oldest try first."""
        if self.policy is None:
            return []
        tickets = self.tickets()
        for memory in (self._tried, self._settled):
            for gone in memory.keys() - tickets.keys():
                del memory[gone]
        found: list[TicketSnapshot] = []
        for name, snap in tickets.items():
            if name in self._busy or snap.ticket is None:
                continue
            if self._settled.get(name) == snap.resource_version:
                continue
            if KOPF_FINALIZER not in snap.finalizers and not needs_announcing(snap.ticket):
                self._settled[name] = snap.resource_version
                continue
            version, at = self._tried.get(name, ("", -self.interval))
            if version == snap.resource_version and now - at < self.interval:
                continue  # unchanged since its last try, and tried not long ago
            found.append(snap)
        found.sort(key=lambda t: self._tried.get(t.name, ("", 0.0))[1])
        return found

    def attempt(self, snap: TicketSnapshot) -> str:
        """One ticket (in a worker thread): drop an old Kopf finalizer, then announce."""
        ticket, policy = snap.ticket, self.policy
        assert ticket is not None and policy is not None
        if KOPF_FINALIZER in snap.finalizers:
            kept = [f for f in snap.finalizers if f != KOPF_FINALIZER]
            # Guarded by the resourceVersion: a finalizer added meanwhile is not lost.
            self.writer.patch_custom(
                "repairtickets",
                snap.name,
                {
                    "metadata": {
                        "finalizers": kept or None,
                        "resourceVersion": snap.resource_version,
                    }
                },
            )
            log.info("old Kopf finalizer removed from ticket", ticket=snap.name)
            if not needs_announcing(ticket):
                return "up-to-date"
        return announce(
            ticket,
            policy(ticket.spec.policy_ref) if ticket.spec.policy_ref else None,
            self.writer,
            self.metrics,
            self.clock(),
            records=self.records,
            addresses=self.addresses,
        )

    def start_due(self, loop: asyncio.AbstractEventLoop) -> list[asyncio.Future[str]]:
        """Hand every due ticket to a worker; returns their futures."""
        now = time.monotonic()
        started: list[asyncio.Future[str]] = []
        for snap in self.due(now):
            self._busy.add(snap.name)
            self._tried[snap.name] = (snap.resource_version, now)
            future = loop.run_in_executor(self.pool, self._attempt_logged, snap)
            future.add_done_callback(functools.partial(self._done, snap.name))
            started.append(future)
        return started

    def _done(self, name: str, _: asyncio.Future[str]) -> None:
        self._busy.discard(name)

    def _attempt_logged(self, snap: TicketSnapshot) -> str:
        try:
            return self.attempt(snap)
        except Exception as exc:  # an API error: the next look tries again
            log.warning(
                "ticket announcement not done; will retry", ticket=snap.name, error=str(exc)[:300]
            )
            return "error"

    async def run(self, stopped: Callable[[], bool], tick: float = 1.0) -> None:
        """Look for due tickets every ``tick`` seconds until ``stopped()``."""
        loop = asyncio.get_running_loop()
        while not stopped():
            self.start_due(loop)
            await asyncio.sleep(tick)

    def stop(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
