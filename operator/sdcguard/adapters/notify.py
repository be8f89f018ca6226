"""Ticket sinks: tell external systems about RepairTickets.

Two sinks, both synchronous and free of Kubernetes calls (the operator runs them
in a worker thread and records the outcome in ``status.notification``):

- **webhook**: POST a JSON document (:class:`WebhookPayload`, schema version
  ``WEBHOOK_SCHEMA_VERSION``) signed as Standard Webhooks specify (``webhook-id``,
  ``webhook-timestamp``, ``webhook-signature: v1,<base64 HMAC-SHA256 of
  "id.timestamp.body">``), so receivers can refuse replays older than their window,
  and carrying an ``Idempotency-Key`` (equal to ``webhook-id``) that is the same for
  every attempt of one event, across retries and restarts.
- **jira**: create an issue through the Jira Cloud REST API v3 (description in
  Atlassian Document Format, Basic auth ``email:token``), comment on updates,
  and transition it on close.

Delivery is at-least-once, on two clocks. Within one :func:`deliver` call,
urllib3's :class:`~urllib3.util.Retry` decides which failures are transient (a
dropped connection, the statuses of :data:`RETRYABLE_STATUS`), how long to back off
between attempts, and how long a ``Retry-After`` asks for; the call makes a bounded
number of attempts and returns a :class:`DeliveryOutcome` instead of raising. Between calls
the schedule lives in the ticket's ``status.notification`` (the operator calls
again after ``outcome.retry_after`` seconds, across reconciles and restarts),
which no HTTP library keeps. Receivers de-duplicate on the idempotency key.

Before any request the sink's address is checked (:class:`SinkAddresses`): no
``http://``, no link-local, cloud-metadata or cluster-internal address, no loopback,
unless a setting allows it; a refused address is a permanent, recorded failure.
Response bodies are read up to :data:`MAX_RESPONSE_BYTES`. URLs in errors and logs
are redacted (:func:`redact_url`): sink URLs may carry credentials.

Each attempt is sent by this module rather than by urllib3's own retry loop, so
that it carries its own ``X-Sdcguard-Delivery-Attempt`` number. Time (``sleep``,
``clock``) and the network (``opener``) are passed in, so every branch is testable
without waiting or a real endpoint.
"""

from __future__ import annotations

import base64
import datetime as dt
import email.utils
import functools
import hashlib
import hmac
import io
import ipaddress
import json
import socket
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Literal, Protocol, Self, TypedDict, cast

import urllib3
from urllib3.exceptions import HTTPError as TransportError
from urllib3.exceptions import InvalidHeader, MaxRetryError

from sdcguard.api import (
    GROUP,
    VERSION,
    ExternalRef,
    HardwareHistory,
    Notification,
    RepairTicket,
    TicketPhase,
    TicketSink,
    to_body,
)
from sdcguard.domain.echo import bounded

WEBHOOK_SCHEMA_VERSION = "1"
"""Version of :class:`WebhookPayload`; raised only for changes that break receivers."""
SIGNATURE_HEADER = "webhook-signature"
"""Standard Webhooks: space-separated ``v1,<base64 HMAC-SHA256>`` signatures."""
ID_HEADER = "webhook-id"
"""Standard Webhooks: the message id (the idempotency key: equal on every attempt)."""
TIMESTAMP_HEADER = "webhook-timestamp"
"""Standard Webhooks: Unix seconds of this attempt; signed, so a replay is dated."""
REPLAY_WINDOW_SECONDS = 300
"""How far a receiver should accept ``webhook-timestamp`` from its own clock (the
Standard Webhooks libraries' default tolerance); older requests are replays."""
SECRET_PREFIX = "whsec_"
"""A Secret value starting with this holds the key base64-encoded (Standard Webhooks'
format); any other value is the key's raw bytes."""
MAX_RESPONSE_BYTES = 1 << 20
"""Response bodies are read up to this (a sink cannot exhaust the operator's memory)."""
IDEMPOTENCY_HEADER = "Idempotency-Key"
EVENT_HEADER = "X-Sdcguard-Event"
ATTEMPT_HEADER = "X-Sdcguard-Delivery-Attempt"
USER_AGENT = "sdcguard-notify/1"
MAX_ERROR_CHARS = 1000  # status.notification.lastError is limited to 1024
DEFAULT_TIMEOUT_SECONDS = 10.0
# Bounded work per call: the operator, not this loop, is what retries for hours.
DEFAULT_MAX_ATTEMPTS = 3
# urllib3's backoff: the first retry at once, then 1 s, 2 s, 4 s, ... (factor x 2^n).
DEFAULT_BACKOFF_FACTOR = 0.5
MAX_DELAY_PER_CALL_SECONDS = 10.0
# Between calls: 30s, 1m, 2m, ... capped at 1h.
RETRY_AFTER_BASE_SECONDS = 30.0
RETRY_AFTER_CAP_SECONDS = 3600.0
JIRA_WORKLOADS_SHOWN = 20
"""Workloads listed in a Jira issue's description; the rest are counted."""
RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


class TicketEvent(StrEnum):
    """What happened to the ticket."""

    OPENED = "ticket.opened"
    UPDATED = "ticket.updated"
    CLOSED = "ticket.closed"


# --------------------------------------------------------------------------- payload


class UntrustedPayload(TypedDict):
    """An identifier of the node not used to recognise its hardware, and why."""

    kind: str
    value: str
    reason: str


class HardwarePayload(TypedDict, total=False):
    """Hardware identity, as far as it is known."""

    providerID: str
    machineID: str
    systemUUID: str
    deviceIDs: list[str]
    untrusted: list[UntrustedPayload]


class HardwareFailurePayload(TypedDict, total=False):
    """One confirmed failure of the hardware (as in ``SDCHardware.status.failures``)."""

    time: str
    kind: str
    node: str
    ticket: str
    test: str


class HardwareRecordPayload(TypedDict):
    """One SDCHardware record of the ticket's hardware, as of the event."""

    name: str
    kind: str
    id: str
    totalFailures: int
    failuresInWindow: int
    lastFailures: list[HardwareFailurePayload]
    nodes: list[str]
    retired: str | None


class HardwareHistoryPayload(TypedDict):
    """The repair cycles the hardware used before this ticket, and its records."""

    cyclesBefore: int
    repairCycleWindow: str
    maxRepairCycles: int
    records: list[HardwareRecordPayload]
    recordsDropped: int


class ExternalPayload(TypedDict):
    """The ticket in an external system, once one exists."""

    system: str
    id: str
    url: str | None


class FindingPayload(TypedDict, total=False):
    """Where one failed check of one SDCTest located the fault."""

    test: str
    check: str
    oddDevice: int
    firstDivergentStep: int
    firstDivergentSubmodule: str


class WorkloadPayload(TypedDict, total=False):
    """One workload of the blast radius (fields as in ``WorkloadRecord``)."""

    namespace: str
    kind: str
    name: str
    apiVersion: str
    uid: str
    note: str
    pods: list[str]
    podCount: int
    running: list[str]
    accelerators: int
    firstSeen: str
    lastSeen: str


class BlastRadiusPayload(TypedDict):
    """The workloads that used the node between its last pass and the failing screening."""

    windowStart: str | None
    windowEnd: str | None
    workloads: list[WorkloadPayload]
    dropped: int
    advice: str


class TicketPayload(TypedDict):
    """The RepairTicket as receivers see it."""

    name: str
    uid: str | None
    nodeName: str
    policyRef: str | None
    hardware: HardwarePayload
    hardwareHistory: HardwareHistoryPayload
    evidence: list[str]
    findings: list[FindingPayload]
    phase: str
    cycle: int
    openedAt: str | None
    closedAt: str | None
    resolution: str | None
    resolutionNote: str | None
    external: ExternalPayload | None
    url: str
    blastRadius: BlastRadiusPayload | None


class WebhookPayload(TypedDict):
    """The JSON document POSTed to a webhook sink (schema version 1).

    Receivers must ignore fields they do not know: new fields may be added
    without raising ``schemaVersion``.
    """

    schemaVersion: str
    event: str
    idempotencyKey: str
    occurredAt: str
    cluster: str
    ticket: TicketPayload


def _rfc3339(value: dt.datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ticket_url(api_server: str, name: str) -> str:
    """The RepairTicket's URL on the API server (what ``kubectl get --raw`` reads)."""
    return f"{api_server.rstrip('/')}/apis/{GROUP}/{VERSION}/repairtickets/{name}"


def event_for(ticket: RepairTicket) -> TicketEvent:
    """The event a ticket's current phase announces."""
    phase = ticket.status.phase if ticket.status else TicketPhase.OPEN
    if phase in (TicketPhase.CLOSED, TicketPhase.RETIRED):
        return TicketEvent.CLOSED
    if phase == TicketPhase.OPEN:
        return TicketEvent.OPENED
    return TicketEvent.UPDATED


def idempotency_key(ticket: RepairTicket, event: TicketEvent) -> str:
    """Stable key for one event of one ticket: the same on every attempt and after a restart.

    Built from the ticket's uid (its name when the uid is unknown), the event, the
    repair cycle and the phase, so a second cycle's "opened" is a new event while a
    retried delivery of the first is not.
    """
    status = ticket.status
    cycle = status.cycle if status else 1
    phase = status.phase if status else TicketPhase.OPEN
    identity = ticket.metadata.uid or ticket.metadata.name
    raw = f"{identity}|{event.value}|{cycle}|{phase.value}"
    return "sdcguard-" + hashlib.sha256(raw.encode()).hexdigest()[:40]


def _history(history: HardwareHistory) -> HardwareHistoryPayload:
    return {
        "cyclesBefore": history.cycles_before,
        "repairCycleWindow": history.repair_cycle_window,
        "maxRepairCycles": history.max_repair_cycles,
        "records": [
            {
                "name": r.name,
                "kind": r.kind.value,
                "id": r.id,
                "totalFailures": r.total_failures,
                "failuresInWindow": r.failures_in_window,
                "lastFailures": [cast(HardwareFailurePayload, to_body(f)) for f in r.last_failures],
                "nodes": list(r.nodes),
                "retired": _rfc3339(r.retired),
            }
            for r in history.records
        ],
        "recordsDropped": history.records_dropped,
    }


def build_payload(
    ticket: RepairTicket,
    *,
    event: TicketEvent | None = None,
    api_server: str,
    cluster: str = "",
    now: dt.datetime,
    history: HardwareHistory | None = None,
    external: ExternalRef | Literal["ticket"] | None = "ticket",
) -> WebhookPayload:
    """The webhook document for ``ticket``; ``event`` defaults to what its phase announces.

    ``now`` is recorded as ``occurredAt``; build the payload once per event and
    deliver that same payload on every attempt, so the body and signature repeat too.
    ``history``: the hardware's history as of the event (``domain.hardware``); without
    it only the ticket's own count of earlier cycles is told. ``external``: the external
    ticket to name, as known at the event's first attempt (default: the ticket's own
    ``spec.external``).
    """
    event = event or event_for(ticket)
    status = ticket.status
    hw = ticket.spec.hardware
    hardware: HardwarePayload = {}
    if hw.provider_id:
        hardware["providerID"] = hw.provider_id
    if hw.machine_id:
        hardware["machineID"] = hw.machine_id
    if hw.system_uuid:
        hardware["systemUUID"] = hw.system_uuid
    if hw.device_ids:
        hardware["deviceIDs"] = list(hw.device_ids)
    if hw.untrusted:
        hardware["untrusted"] = [
            {"kind": u.kind.value, "value": u.value, "reason": u.reason} for u in hw.untrusted
        ]
    history = history or HardwareHistory(cycles_before=hw.cycles_before)
    radius = ticket.spec.blast_radius
    blast: BlastRadiusPayload | None = None
    if radius is not None:
        blast = {
            "windowStart": _rfc3339(radius.window_start),
            "windowEnd": _rfc3339(radius.window_end),
            "workloads": [cast(WorkloadPayload, to_body(w)) for w in radius.workloads],
            "dropped": radius.dropped,
            "advice": radius.advice,
        }
    ext = ticket.spec.external if external == "ticket" else external
    told: ExternalPayload | None = (
        {"system": ext.system, "id": ext.id, "url": ext.url} if ext else None
    )
    return {
        "schemaVersion": WEBHOOK_SCHEMA_VERSION,
        "event": event.value,
        "idempotencyKey": idempotency_key(ticket, event),
        "occurredAt": _rfc3339(now) or "",
        "cluster": cluster,
        "ticket": {
            "name": ticket.metadata.name,
            "uid": ticket.metadata.uid,
            "nodeName": ticket.spec.node_name,
            "policyRef": ticket.spec.policy_ref,
            "hardware": hardware,
            "hardwareHistory": _history(history),
            "evidence": list(ticket.spec.evidence),
            "findings": [cast(FindingPayload, to_body(f)) for f in ticket.spec.findings],
            "phase": (status.phase if status else TicketPhase.OPEN).value,
            "cycle": status.cycle if status else 1,
            "openedAt": _rfc3339(status.opened_at if status else None),
            "closedAt": _rfc3339(status.closed_at if status else None),
            "resolution": ticket.spec.resolution.value if ticket.spec.resolution else None,
            "resolutionNote": (
                bounded(ticket.spec.resolution_note) if ticket.spec.resolution_note else None
            ),
            "external": told,
            "url": ticket_url(api_server, ticket.metadata.name),
            "blastRadius": blast,
        },
    }


def encode_body(payload: Mapping[str, Any]) -> bytes:
    """The exact bytes sent (and signed): compact JSON with sorted keys."""
    return json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()


def signing_key(secret: bytes) -> bytes:
    """The HMAC key a Secret's value stands for: ``whsec_<base64>`` decoded (the
    format Standard Webhooks libraries take), any other value as it is."""
    if secret.startswith(SECRET_PREFIX.encode()):
        return base64.b64decode(secret[len(SECRET_PREFIX) :])
    return secret


def sign(message_id: str, timestamp: int, body: bytes, key: bytes) -> str:
    """The ``webhook-signature`` value: ``v1,`` and the base64 HMAC-SHA256 (keyed with
    :func:`signing_key`) of ``"{id}.{timestamp}.{body}"``, as Standard Webhooks specify."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(signing_key(key), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def verify_signature(
    body: bytes,
    key: bytes,
    headers: Mapping[str, str],
    *,
    now: float,
    tolerance: float = REPLAY_WINDOW_SECONDS,
) -> bool:
    """Receiver side, a reference: whether ``headers`` sign ``body`` (constant time)
    and their timestamp is within ``tolerance`` seconds of ``now``. Receivers must also
    drop a ``webhook-id`` they accepted within the window (a replay inside it)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    try:
        message_id, timestamp = lowered[ID_HEADER], int(lowered[TIMESTAMP_HEADER])
    except (KeyError, ValueError):
        return False
    if abs(now - timestamp) > tolerance:
        return False
    expected = sign(message_id, timestamp, body, key)
    offered = lowered.get(SIGNATURE_HEADER, "").split()
    return any(hmac.compare_digest(expected, candidate) for candidate in offered)


# --------------------------------------------------------------------------- addresses

LINK_LOCAL = (ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fe80::/10"))
METADATA = (ipaddress.ip_network("169.254.169.254/32"), ipaddress.ip_network("fd00:ec2::254/128"))
"""Cloud instance-metadata endpoints (AWS, GCP, Azure, OpenStack; AWS's IPv6 one): they
hand out the node's cloud credentials."""

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], list[str]]


def resolve_host(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (the default :data:`Resolver`)."""
    return sorted({str(info[4][0]) for info in socket.getaddrinfo(host, port)})


@dataclass(frozen=True)
class SinkAddresses:
    """Where ticket sinks may point. The defaults refuse what an attacker who can write
    an SDCPolicy would aim the operator at: plain ``http://`` (credentials and evidence
    in clear), loopback (the operator's own Pod), link-local and cloud-metadata
    addresses (the node's cloud credentials) and the cluster's own ranges
    (``denied_cidrs``: Pod and Service CIDRs, set by the chart). ``allowed_cidrs`` wins
    over every refusal (an in-cluster receiver you run on purpose)."""

    allow_http: bool = False
    allow_loopback: bool = False
    denied_cidrs: tuple[Network, ...] = ()
    allowed_cidrs: tuple[Network, ...] = ()
    resolve: Resolver = field(default=resolve_host, compare=False)

    @classmethod
    def from_settings(
        cls,
        *,
        allow_http: bool,
        allow_loopback: bool,
        denied_cidrs: str,
        allowed_cidrs: str,
    ) -> SinkAddresses:
        """From the operator's settings (comma-separated CIDRs)."""

        def networks(text: str) -> tuple[Network, ...]:
            items = (item.strip() for item in text.split(","))
            return tuple(ipaddress.ip_network(item, strict=False) for item in items if item)

        return cls(allow_http, allow_loopback, networks(denied_cidrs), networks(allowed_cidrs))

    def refusal(self, url: str, *, via_proxy: bool = False) -> str | None:
        """Why ``url`` may not be sent to, or None. Through a proxy only literal addresses
        are checked (the proxy resolves the name; restrict it there)."""
        parts = urllib.parse.urlsplit(url)
        shown = redact_url(url)
        if parts.scheme not in ("https", "http") or not parts.hostname:
            return f"sink URL {shown} is not an https:// URL with a host"
        if parts.scheme == "http" and not self.allow_http:
            return (
                f"sink URL {shown} uses http://: credentials and evidence would travel in "
                "clear; use https:// (or set SDCGUARD_SINK_ALLOW_HTTP for a test receiver)"
            )
        host = parts.hostname
        try:
            literal: list[str] | None = [str(ipaddress.ip_address(host))]
        except ValueError:
            literal = None
        if literal is None and via_proxy:
            return None
        try:
            addresses = literal or self.resolve(host, parts.port or 443)
        except OSError:
            return None  # the connection fails the same way, and is retried
        for text in addresses:
            why = self._refused_address(ipaddress.ip_address(text.split("%")[0]))
            if why:
                return f"sink URL {shown} reaches {text}, {why}"
        return None

    def _refused_address(
        self, address: ipaddress.IPv4Address | ipaddress.IPv6Address
    ) -> str | None:
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
            address = address.ipv4_mapped
        if any(address in net for net in self.allowed_cidrs):
            return None
        if any(address in net for net in METADATA):
            return "a cloud metadata address (refused: it hands out node credentials)"
        if any(address in net for net in LINK_LOCAL):
            return "a link-local address (refused; allow it with SDCGUARD_SINK_ALLOWED_CIDRS)"
        if address.is_loopback and not self.allow_loopback:
            return "a loopback address (refused: the operator's own Pod)"
        if address.is_unspecified or address.is_multicast:
            return "not a unicast address"
        if any(address in net for net in self.denied_cidrs):
            return (
                "a cluster-internal address (SDCGUARD_SINK_DENIED_CIDRS; allow it with "
                "SDCGUARD_SINK_ALLOWED_CIDRS)"
            )
        return None


STRICT = SinkAddresses()
"""The default: every refusal on, no cluster ranges known."""


def _refused(sink_url: str, addresses: SinkAddresses) -> DeliveryOutcome | None:
    parts = urllib.parse.urlsplit(sink_url)
    proxy = urllib.request.getproxies().get(parts.scheme)
    via_proxy = bool(proxy) and not urllib.request.proxy_bypass(parts.hostname or "")
    why = addresses.refusal(sink_url, via_proxy=via_proxy)
    if why is None:
        return None
    return DeliveryOutcome(
        delivered=False,
        attempts=0,
        last_error=_short(why),
        retry_after=RETRY_AFTER_CAP_SECONDS,
        permanent=True,
    )


# --------------------------------------------------------------------------- transport


@dataclass(frozen=True)
class HttpRequest:
    """One outgoing request."""

    method: str
    url: str
    headers: Mapping[str, str]
    body: bytes | None = None
    timeout: float = DEFAULT_TIMEOUT_SECONDS


HttpResponse = urllib3.BaseHTTPResponse
"""A response of any status (an HTTP error status is a response, not an exception),
its body read."""


class HttpOpener(Protocol):
    """Sends one request, once: no retries, no redirects followed. Raises urllib3's
    HTTPError (or OSError) when no response arrives."""

    def __call__(self, request: HttpRequest, /) -> HttpResponse: ...


_DIRECT = urllib3.PoolManager(maxsize=4)
"""Connections kept for the sinks (the announcer's worker threads share them)."""


@functools.cache
def _proxy(url: str) -> urllib3.ProxyManager:
    auth = urllib3.util.parse_url(url).auth
    headers = urllib3.util.make_headers(proxy_basic_auth=auth) if auth else None
    return urllib3.ProxyManager(url, maxsize=4, proxy_headers=headers)


def _manager(url: str) -> urllib3.PoolManager:
    """The direct pool, or the proxy's the environment names for ``url``
    (``HTTPS_PROXY``, ``HTTP_PROXY``, ``NO_PROXY``, as the standard library reads them)."""
    parts = urllib.parse.urlsplit(url)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy and not urllib.request.proxy_bypass(parts.hostname or ""):
        return _proxy(proxy)
    return _DIRECT


def urllib3_opener(request: HttpRequest) -> HttpResponse:
    """The default :class:`HttpOpener`: one attempt through urllib3's connection pool.
    Redirects are answered, not followed: a signed POST must not be replayed elsewhere.
    The body is read up to :data:`MAX_RESPONSE_BYTES`; a longer one is cut there (and
    its connection closed rather than drained)."""
    response = _manager(request.url).request(
        request.method,
        request.url,
        body=request.body,
        headers=dict(request.headers),
        timeout=urllib3.Timeout(total=request.timeout),
        retries=False,
        redirect=False,
        preload_content=False,
    )
    try:
        data = response.read(MAX_RESPONSE_BYTES + 1)
    except BaseException:
        response.close()
        raise
    if len(data) > MAX_RESPONSE_BYTES:
        response.close()
    else:
        response.release_conn()
    return urllib3.HTTPResponse(
        body=io.BytesIO(data[:MAX_RESPONSE_BYTES]),
        headers=response.headers,
        status=response.status,
        reason=response.reason,
        preload_content=True,
    )


# --------------------------------------------------------------------------- outcome


@dataclass(frozen=True)
class DeliveryOutcome:
    """What one :func:`deliver` call achieved."""

    delivered: bool
    """The sink accepted the event."""
    attempts: int
    """HTTP attempts made in this call."""
    last_error: str | None = None
    """The last failure, short and with the sink's URL, if any."""
    retry_after: float | None = None
    """Seconds to wait before calling again (None once delivered)."""
    permanent: bool = False
    """The sink refused the request itself (a status urllib3's Retry does not retry: a 4xx
    other than 408/425/429, a redirect): retrying the same request will fail the same
    way until its configuration or credentials change."""
    external: ExternalRef | None = None
    """The ticket in the external system, when the sink created or found one (jira)."""


def next_retry_delay(previous_attempts: int) -> float:
    """Seconds between :func:`deliver` calls after ``previous_attempts`` failed attempts."""
    exponent = min(max(previous_attempts, 0), 16)
    return float(min(RETRY_AFTER_BASE_SECONDS * 2**exponent, RETRY_AFTER_CAP_SECONDS))


def record_delivery(
    previous: Notification, outcome: DeliveryOutcome, idempotency: str, now: dt.datetime
) -> Notification:
    """``status.notification`` after ``outcome``: attempts add up, the last error is kept
    until a delivery succeeds."""
    return Notification(
        delivered=outcome.delivered,
        attempts=previous.attempts + outcome.attempts,
        last_error=None if outcome.delivered else outcome.last_error,
        idempotency_key=idempotency,
        last_attempt=now,
    )


def _short(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def _describe(response: HttpResponse) -> str:
    snippet = response.data[:200].decode("utf-8", "replace").strip()
    return f"HTTP {response.status}" + (f": {snippet}" if snippet else "")


class SinkRetry(urllib3.Retry):
    """urllib3's Retry, reading an HTTP-date ``Retry-After`` against the clock passed
    in (urllib3 reads the system's)."""

    def __init__(self, *args: Any, clock: Callable[[], float] = time.time, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.clock = clock

    def new(self, **kw: Any) -> Self:
        renewed = super().new(**kw)
        renewed.clock = self.clock
        return renewed

    def parse_retry_after(self, retry_after: str) -> float:
        seconds = super().parse_retry_after(retry_after)  # refuses what it cannot read
        date = email.utils.parsedate_tz(retry_after)
        if retry_after.strip().isdigit() or date is None:
            return seconds
        seconds = max(0.0, email.utils.mktime_tz(date) - self.clock())
        return float(min(seconds, self.retry_after_max))


@dataclass(frozen=True)
class RetryPolicy:
    """How hard one :func:`deliver` call tries."""

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    backoff_factor: float = DEFAULT_BACKOFF_FACTOR
    max_delay: float = MAX_DELAY_PER_CALL_SECONDS
    """The longest pause within a call; a longer Retry-After is handed to the operator."""
    timeout: float = DEFAULT_TIMEOUT_SECONDS

    def schedule(self, clock: Callable[[], float]) -> SinkRetry:
        """urllib3's Retry for one call: any method (every request carries an
        idempotency key, or is a search that finds what a lost answer created), the
        transient statuses, Retry-After honoured."""
        return SinkRetry(
            total=self.max_attempts - 1,
            backoff_factor=self.backoff_factor,
            backoff_max=self.max_delay,
            status_forcelist=RETRYABLE_STATUS,
            allowed_methods=None,
            respect_retry_after_header=True,
            raise_on_redirect=False,
            raise_on_status=False,
            clock=clock,
        )


@dataclass(frozen=True)
class _Exchange:
    """Result of one request with retries."""

    response: HttpResponse | None
    attempts: int
    error: str | None
    retry_after: float | None
    permanent: bool


def _server_delay(schedule: SinkRetry, response: HttpResponse) -> float | None:
    try:
        return schedule.get_retry_after(response)
    except InvalidHeader:
        return None  # unreadable: the backoff decides


def _send_with_retries(
    build: Callable[[int], HttpRequest],
    opener: HttpOpener,
    retry: RetryPolicy,
    sleep: Callable[[float], None],
    clock: Callable[[], float],
    ok: Callable[[HttpResponse], bool] = lambda r: 200 <= r.status < 300,
) -> _Exchange:
    """Send ``build(attempt)`` until a 2xx, a permanent refusal, or urllib3's Retry
    says the attempts are spent."""
    schedule = retry.schedule(clock)
    attempt = 0
    while True:
        attempt += 1
        request = build(attempt)
        response: HttpResponse | None = None
        failure: Exception | None = None
        server_delay: float | None = None
        try:
            response = opener(request)
        except (TransportError, OSError) as exc:  # refused, reset, timed out, TLS
            failure = exc
            error = f"{request.method} {redact_url(request.url)}: {getattr(exc, 'reason', exc)}"
        else:
            if ok(response):
                return _Exchange(response, attempt, None, None, False)
            error = f"{request.method} {redact_url(request.url)}: {_describe(response)}"
            server_delay = _server_delay(schedule, response)
            if not schedule.is_retry(request.method, response.status, server_delay is not None):
                return _Exchange(response, attempt, error, None, True)
        try:
            schedule = schedule.increment(
                request.method, redact_url(request.url), response=response, error=failure
            )
        except MaxRetryError:
            return _Exchange(None, attempt, error, server_delay, False)
        pause = server_delay if server_delay is not None else schedule.get_backoff_time()
        if pause > retry.max_delay:
            # The server asks for longer than one call may wait: hand it back.
            return _Exchange(None, attempt, error, server_delay, False)
        if pause > 0:
            sleep(pause)


def _split_userinfo(url: str) -> tuple[str, str | None]:
    """``url`` without ``user:password@``, and that user info (percent-decoded)."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None:
        return url, None
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    userinfo = urllib.parse.unquote(parts.username)
    if parts.password is not None:
        userinfo += ":" + urllib.parse.unquote(parts.password)
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, parts.query, "")), userinfo


def redact_url(url: str) -> str:
    """The URL without user info, query string or fragment (they may carry tokens):
    what statuses, Events and logs show of a sink."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


def _outcome(
    exchange: _Exchange,
    previous_attempts: int,
    *,
    external: ExternalRef | None = None,
    attempts: int | None = None,
) -> DeliveryOutcome:
    made = exchange.attempts if attempts is None else attempts
    if exchange.error is None:
        return DeliveryOutcome(delivered=True, attempts=made, external=external)
    backoff = next_retry_delay(previous_attempts + made)
    if exchange.permanent:
        backoff = RETRY_AFTER_CAP_SECONDS
    wait = max(backoff, exchange.retry_after or 0.0)
    return DeliveryOutcome(
        delivered=False,
        attempts=made,
        last_error=_short(exchange.error),
        retry_after=wait,
        permanent=exchange.permanent,
        external=external,
    )


# --------------------------------------------------------------------------- webhook


def deliver_webhook(
    payload: WebhookPayload,
    sink: TicketSink,
    secret: bytes | None,
    opener: HttpOpener = urllib3_opener,
    *,
    retry: RetryPolicy | None = None,
    previous_attempts: int = 0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.time,
    addresses: SinkAddresses = STRICT,
) -> DeliveryOutcome:
    """POST ``payload`` to a webhook sink; never raises for delivery failures.

    ``secret`` is the HMAC key (the Secret's value, see :func:`signing_key`); without
    one the request is sent unsigned. ``addresses`` decides where it may go.
    ``previous_attempts`` (from ``status.notification.attempts``) only stretches
    ``retry_after``. Any 2xx is success; the statuses of :data:`RETRYABLE_STATUS` and
    dropped connections are retried (honouring Retry-After); other statuses are permanent
    refusals.
    """
    refused = _refused(sink.url, addresses)
    if refused is not None:
        return refused
    retry = retry or RetryPolicy()
    body = encode_body(payload)
    message_id = payload["idempotencyKey"]
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        IDEMPOTENCY_HEADER: message_id,
        ID_HEADER: message_id,
        EVENT_HEADER: payload["event"],
    }
    url, userinfo = _split_userinfo(sink.url)
    if userinfo:
        # https://user:password@host/ receivers: urllib3 sends no URL credentials itself
        # (and its make_headers encodes them as Latin-1; these are UTF-8).
        headers["Authorization"] = "Basic " + base64.b64encode(userinfo.encode()).decode()

    def build(attempt: int) -> HttpRequest:
        # Each attempt is dated and signed anew: the body and id repeat, the timestamp
        # does not, so a receiver's replay window applies to retries too.
        timestamp = int(clock())
        signed = {TIMESTAMP_HEADER: str(timestamp)}
        if secret:
            signed[SIGNATURE_HEADER] = sign(message_id, timestamp, body, secret)
        return HttpRequest(
            "POST",
            url,
            {**headers, **signed, ATTEMPT_HEADER: str(previous_attempts + attempt)},
            body,
            retry.timeout,
        )

    return _outcome(_send_with_retries(build, opener, retry, sleep, clock), previous_attempts)


# --------------------------------------------------------------------------- jira


@dataclass(frozen=True)
class JiraSink:
    """Where and how issues are filed in Jira Cloud."""

    base_url: str
    """Site URL, e.g. https://example.atlassian.net."""
    project: str
    """Project key, e.g. OPS."""
    issue_type: str = "Bug"
    """Issue type name."""
    close_transition: str = "Done"
    """Transition applied on ticket.closed: its id ("31") or its name ("Done")."""
    labels: tuple[str, ...] = ("sdcguard",)
    """Labels added to every issue (plus one per ticket, used to find it again)."""


def jira_sink(sink: TicketSink) -> JiraSink:
    """The Jira settings of a ``type: jira`` sink.

    The project, issue type and close transition ride in the sink URL's query
    string: ``https://example.atlassian.net/?project=OPS&issueType=Bug&closeTransition=Done``.
    Raises ValueError naming the missing parameter.
    """
    parts = urllib.parse.urlsplit(sink.url)
    query = dict(urllib.parse.parse_qsl(parts.query))
    project = query.get("project", "").strip()
    if not project:
        raise ValueError(
            f"ticket sink {redact_url(sink.url)}: jira needs the project key in the URL, "
            "e.g. https://example.atlassian.net/?project=OPS&issueType=Bug"
        )
    return JiraSink(
        base_url=urllib.parse.urlunsplit((parts.scheme, parts.netloc, "", "", "")),
        project=project,
        issue_type=query.get("issueType", "Bug"),
        close_transition=query.get("closeTransition", "Done"),
    )


def basic_auth(secret: bytes) -> str:
    """Authorization header for a Jira secret holding ``email:api-token``."""
    text = secret.decode().strip()
    if ":" not in text:
        raise ValueError(
            "jira secret must hold 'email:api-token' (the Atlassian account email, a colon, "
            "and an API token)"
        )
    return "Basic " + base64.b64encode(text.encode()).decode()


def _adf_text(text: str, *, strong: bool = False) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "text", "text": text}
    if strong:
        node["marks"] = [{"type": "strong"}]
    return node


def _adf_paragraph(*nodes: dict[str, Any]) -> dict[str, Any]:
    return {"type": "paragraph", "content": list(nodes)}


def adf_document(payload: WebhookPayload) -> dict[str, Any]:
    """The issue description in Atlassian Document Format."""
    t = payload["ticket"]
    rows: list[tuple[str, str]] = [
        ("Node", t["nodeName"]),
        ("Phase", f"{t['phase']} (repair cycle {t['cycle']})"),
        ("Opened", t["openedAt"] or "-"),
        ("Policy", t["policyRef"] or "-"),
        ("Evidence (SDCTests, SDCReports)", ", ".join(t["evidence"]) or "-"),
    ]
    rows += [
        (f"Hardware {k}", ", ".join(v) if isinstance(v, list) else str(v))
        for k, v in sorted(t["hardware"].items())
        if k != "untrusted"
    ]
    rows += _history_rows(t)
    blast = t.get("blastRadius")
    if blast is not None:
        shown = blast["workloads"][:JIRA_WORKLOADS_SHOWN]
        more = len(blast["workloads"]) - len(shown) + blast["dropped"]
        rows.append(
            (
                "Blast radius",
                f"{len(blast['workloads']) + blast['dropped']} workloads used the node from "
                f"{blast['windowStart'] or 'its first recorded use'} to {blast['windowEnd']}; "
                f"their owners were told: {blast['advice']}",
            )
        )
        rows += [
            (
                f"Workload {w.get('namespace')}/{w.get('kind')}/{w.get('name')}",
                f"{w.get('accelerators', 0)} accelerators, {w.get('podCount', 0)} pods, "
                f"{w.get('firstSeen', '?')} .. {w.get('lastSeen') or 'still running'}",
            )
            for w in shown
        ]
        if more > 0:
            rows.append(("More workloads", f"{more} (see the RepairTicket)"))
    items = [
        {
            "type": "listItem",
            "content": [_adf_paragraph(_adf_text(f"{label}: ", strong=True), _adf_text(value))],
        }
        for label, value in rows
    ]
    return {
        "type": "doc",
        "version": 1,
        "content": [
            _adf_paragraph(
                _adf_text(
                    f"sdcguard quarantined node {t['nodeName']}: it computed wrong results "
                    "(silent data corruption) and is out of production until repaired."
                )
            ),
            {"type": "bulletList", "content": items},
            _adf_paragraph(
                _adf_text("RepairTicket: "),
                {
                    "type": "text",
                    "text": t["name"],
                    "marks": [{"type": "link", "attrs": {"href": t["url"]}}],
                },
            ),
            _adf_paragraph(
                _adf_text(
                    "When the repair is done, set the resolution: kubectl sdc repaired "
                    f"{t['name']} --note '...' (or patch spec.resolution)."
                )
            ),
        ],
    }


def _history_rows(t: TicketPayload) -> list[tuple[str, str]]:
    """The hardware's history, one row per record (what ``kubectl sdc hardware`` shows)."""
    history = t["hardwareHistory"]
    window = history["repairCycleWindow"]
    limit = history["maxRepairCycles"]
    rows = [
        (
            "Hardware history",
            f"{history['cyclesBefore']} repair cycle(s) before this ticket"
            + (f" within {window}" if window and window != "0" else "")
            + (f" (maxRepairCycles {limit})" if limit else ""),
        )
    ]
    untrusted = t["hardware"].get("untrusted") or []
    if untrusted:
        rows.append(
            (
                "Identifiers not trusted",
                "; ".join(f"{u['kind']} {u['value']!r}: {u['reason']}" for u in untrusted),
            )
        )
    for r in history["records"]:
        text = f"{r['kind']} {r['id']}: {r['totalFailures']} failure(s), "
        text += f"{r['failuresInWindow']} in the window"
        if r["lastFailures"]:
            last = r["lastFailures"][-1]
            text += (
                f"; last {last.get('kind')} {last.get('time')} on {last.get('node')}"
                f" (ticket {last.get('ticket') or '-'})"
            )
        if r["nodes"]:
            text += "; seen as " + ", ".join(r["nodes"])
        if r["retired"]:
            text += f"; retired {r['retired']}"
        rows.append((f"SDCHardware {r['name']}", text))
    if history["recordsDropped"]:
        dropped = history["recordsDropped"]
        rows.append(("More hardware records", f"{dropped} (kubectl sdc hardware)"))
    return rows


def jira_issue_fields(payload: WebhookPayload, sink: JiraSink) -> dict[str, Any]:
    """The body of POST /rest/api/3/issue."""
    t = payload["ticket"]
    return {
        "fields": {
            "project": {"key": sink.project},
            "issuetype": {"name": sink.issue_type},
            "summary": f"[sdcguard] SDC on node {t['nodeName']} (ticket {t['name']})",
            "description": adf_document(payload),
            "labels": [*sink.labels, _ticket_label(payload)],
        }
    }


def _ticket_label(payload: WebhookPayload) -> str:
    # Jira labels cannot contain spaces; the ticket uid (or name) finds the issue again.
    identity = payload["ticket"]["uid"] or payload["ticket"]["name"]
    return "sdcguard-" + hashlib.sha256(identity.encode()).hexdigest()[:16]


def _json(response: HttpResponse | None) -> Any:
    if response is None or not response.data:
        return None
    try:
        return json.loads(response.data)
    except ValueError:
        return None


def deliver_jira(
    payload: WebhookPayload,
    sink: JiraSink,
    secret: bytes,
    opener: HttpOpener = urllib3_opener,
    *,
    retry: RetryPolicy | None = None,
    previous_attempts: int = 0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.time,
    addresses: SinkAddresses = STRICT,
) -> DeliveryOutcome:
    """File or update the Jira issue of a ticket event; never raises for delivery failures.

    - ticket.opened: finds an issue already filed for this ticket (by its label, so a
      retry after a lost response does not file a second one) or creates one.
    - ticket.updated: comments on the issue.
    - ticket.closed: comments and applies ``sink.close_transition``.

    The issue is found through ``payload.ticket.external`` when it names a jira issue,
    else by searching for the ticket's label. The outcome's ``external`` is the issue.
    ``addresses`` decides where requests may go.
    """
    refused = _refused(sink.base_url, addresses)
    if refused is not None:
        return refused
    retry = retry or RetryPolicy()
    try:
        auth = basic_auth(secret)
    except (ValueError, UnicodeDecodeError) as exc:
        return DeliveryOutcome(
            delivered=False,
            attempts=0,
            last_error=str(exc),
            retry_after=RETRY_AFTER_CAP_SECONDS,
            permanent=True,
        )
    api = sink.base_url.rstrip("/") + "/rest/api/3"
    headers = {
        "Authorization": auth,
        "Accept": "application/json",
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
    }
    made = 0

    def call(method: str, path: str, body: Any = None) -> _Exchange:
        nonlocal made
        data = None if body is None else json.dumps(body).encode()
        exchange = _send_with_retries(
            lambda _attempt: HttpRequest(method, api + path, headers, data, retry.timeout),
            opener,
            retry,
            sleep,
            clock,
        )
        made += exchange.attempts
        return exchange

    def failed(exchange: _Exchange, external: ExternalRef | None = None) -> DeliveryOutcome:
        return _outcome(exchange, previous_attempts, external=external, attempts=made)

    def ref(key: str) -> ExternalRef:
        return ExternalRef(system="jira", id=key, url=f"{sink.base_url.rstrip('/')}/browse/{key}")

    known = payload["ticket"]["external"]
    key = known["id"] if known and known["system"] == "jira" else None
    if key is None:
        jql = f'project = "{sink.project}" AND labels = "{_ticket_label(payload)}"'
        found = call("POST", "/search/jql", {"jql": jql, "fields": ["summary"], "maxResults": 1})
        if found.error is not None:
            return failed(found)
        issues = (_json(found.response) or {}).get("issues") or []
        if issues:
            key = str(issues[0].get("key") or "") or None
    if key is None:
        created = call("POST", "/issue", jira_issue_fields(payload, sink))
        if created.error is not None:
            return failed(created)
        key = str((_json(created.response) or {}).get("key") or "")
        if not key:
            return failed(
                replace(created, error="POST /rest/api/3/issue: response has no issue key")
            )
    if payload["event"] == TicketEvent.OPENED.value:
        return DeliveryOutcome(delivered=True, attempts=made, external=ref(key))

    t = payload["ticket"]
    note = f"sdcguard: ticket {t['name']} is {t['phase']} (cycle {t['cycle']})"
    if t["resolution"]:
        note += f"; resolution {t['resolution']}"
    if t["resolutionNote"]:
        note += f": {t['resolutionNote']}"
    comment = call(
        "POST",
        f"/issue/{urllib.parse.quote(key)}/comment",
        {"body": {"type": "doc", "version": 1, "content": [_adf_paragraph(_adf_text(note))]}},
    )
    if comment.error is not None:
        return failed(comment, ref(key))
    if payload["event"] != TicketEvent.CLOSED.value:
        return DeliveryOutcome(delivered=True, attempts=made, external=ref(key))

    transition_id = sink.close_transition
    if not transition_id.isdigit():
        listed = call("GET", f"/issue/{urllib.parse.quote(key)}/transitions")
        if listed.error is not None:
            return failed(listed, ref(key))
        wanted = transition_id.casefold()
        match = next(
            (
                tr
                for tr in (_json(listed.response) or {}).get("transitions") or []
                if str(tr.get("name", "")).casefold() == wanted
                or str((tr.get("to") or {}).get("name", "")).casefold() == wanted
            ),
            None,
        )
        if match is None:
            # Already closed (no such transition from Done) counts as done.
            return DeliveryOutcome(delivered=True, attempts=made, external=ref(key))
        transition_id = str(match.get("id"))
    moved = call(
        "POST",
        f"/issue/{urllib.parse.quote(key)}/transitions",
        {"transition": {"id": transition_id}},
    )
    if moved.error is not None:
        return failed(moved, ref(key))
    return DeliveryOutcome(delivered=True, attempts=made, external=ref(key))


# --------------------------------------------------------------------------- dispatch


def deliver(
    payload: WebhookPayload,
    sink: TicketSink,
    secret: bytes | None,
    opener: HttpOpener = urllib3_opener,
    *,
    retry: RetryPolicy | None = None,
    previous_attempts: int = 0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.time,
    addresses: SinkAddresses = STRICT,
) -> DeliveryOutcome:
    """Deliver one ticket event to one sink of either type; never raises for delivery
    failures (a misconfigured sink is a permanent, recorded failure)."""
    if sink.type == "webhook":
        return deliver_webhook(
            payload,
            sink,
            secret,
            opener,
            retry=retry,
            previous_attempts=previous_attempts,
            sleep=sleep,
            clock=clock,
            addresses=addresses,
        )
    try:
        jira = jira_sink(sink)
    except ValueError as exc:
        return DeliveryOutcome(
            delivered=False,
            attempts=0,
            last_error=_short(str(exc)),
            retry_after=RETRY_AFTER_CAP_SECONDS,
            permanent=True,
        )
    if not secret:
        return DeliveryOutcome(
            delivered=False,
            attempts=0,
            last_error="jira sink has no secret: set secretRef to a Secret holding "
            "'email:api-token'",
            retry_after=RETRY_AFTER_CAP_SECONDS,
            permanent=True,
        )
    return deliver_jira(
        payload,
        jira,
        secret,
        opener,
        retry=retry,
        previous_attempts=previous_attempts,
        sleep=sleep,
        clock=clock,
        addresses=addresses,
    )


__all__ = [
    "ID_HEADER",
    "MAX_RESPONSE_BYTES",
    "REPLAY_WINDOW_SECONDS",
    "SIGNATURE_HEADER",
    "STRICT",
    "TIMESTAMP_HEADER",
    "WEBHOOK_SCHEMA_VERSION",
    "DeliveryOutcome",
    "HttpOpener",
    "HttpRequest",
    "HttpResponse",
    "JiraSink",
    "RetryPolicy",
    "SinkAddresses",
    "TicketEvent",
    "WebhookPayload",
    "adf_document",
    "build_payload",
    "deliver",
    "deliver_jira",
    "deliver_webhook",
    "encode_body",
    "event_for",
    "idempotency_key",
    "jira_issue_fields",
    "jira_sink",
    "next_retry_delay",
    "record_delivery",
    "redact_url",
    "sign",
    "signing_key",
    "ticket_url",
    "urllib3_opener",
    "verify_signature",
]
