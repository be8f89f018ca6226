"""Why sdcguard holds back a node's next step: a wait is a typed value, not a phrase.

A wait has a reason from a closed set (:class:`WaitReason`, the one word the
SDCTest's and the RepairTicket's ``Waiting`` condition carry, part of the API) and a
message for people (the node's ``sdcguard.dev/waiting``, the condition's message,
``kubectl sdc status``, the ``Waiting`` Event). The reason is chosen where the wait is
found, never read back from the text, so a message can be reworded freely.

:func:`publish` is the pure step that records a wait on the node (and, once it has
lasted :data:`WAIT_EVENT_AFTER` seconds, says it in one Event), or forgets one.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from sdcguard.domain import keys
from sdcguard.domain.echo import bounded

WAIT_EVENT_AFTER = 60.0
"""Seconds a wait lasts before an Event says why the node waits."""
WAIT_MESSAGE_CHARS = 256
"""How much of a wait's message the node's annotation and the conditions keep."""


class WaitReason(StrEnum):
    """The closed set of reasons a wait may have; the value is the condition's reason."""

    PROBE_UNSCHEDULABLE = "ProbeUnschedulable"
    """The test's probe Pod cannot be scheduled (the message quotes the scheduler)."""
    NODE_NOT_READY = "NodeNotReady"
    POLICY_PAUSED = "PolicyPaused"
    FOREIGN_TAINT = "ForeignTaint"
    """Someone else's taint keeps probe Pods off the node."""
    NO_ACCELERATORS = "NoAccelerators"
    """The node has no allocatable accelerators yet."""
    RUNTIME_CLASS_MISSING = "RuntimeClassMissing"
    """The policy's probe RuntimeClass does not exist: a probe Pod would be refused."""
    MIXED_MIG = "MixedMig"
    """The node offers whole GPUs and MIG instances at once (NVIDIA's mixed MIG strategy
    with some GPUs unpartitioned): it is not screened until all are one or the other."""
    BREAKER_OPEN = "BreakerOpen"
    BACK_OFF = "BackOff"
    """Inconclusive results: the node is screened again only after a back-off."""
    ANOTHER_TEST = "AnotherTest"
    """Another test of the node is still running."""
    PENDING_POD = "PendingPod"
    """A pending pod needs the node: a routine screening gives way."""
    AWAITING_BASELINE = "AwaitingBaseline"
    """The test's digests are recorded and wait for a baseline's quorum."""
    BUDGET = "Budget"
    """The pool's budget (maxConcurrentTests, maxUnavailable, maxUnavailableDevices)."""


@dataclass(frozen=True)
class Wait:
    """One wait: why (``reason``, for machines) and what a person reads (``message``)."""

    reason: WaitReason
    message: str

    def about(self, what: str) -> Wait:
        """The same wait, its message saying what waits (``"<what>: <message>"``)."""
        return Wait(self.reason, f"{what}: {self.message}")

    def bounded(self) -> Wait:
        """The wait with its message cut to what annotations and conditions keep."""
        return Wait(self.reason, bounded(self.message, WAIT_MESSAGE_CHARS))


@dataclass(frozen=True)
class Published:
    """What recording a wait (or its end) changes: the node's annotations, an Event's
    message when one is due, and the requeue (shortened so the Event is on time)."""

    changes: dict[str, str | None]
    event_message: str | None
    requeue: float | None


def publish(
    wait: Wait | None,
    node: str,
    annotations: Mapping[str, str],
    requeue: float | None,
    now: dt.datetime,
) -> Published:
    """Record why the node waits (``sdcguard.dev/waiting``, since when) and, once the
    wait has lasted WAIT_EVENT_AFTER seconds, say it in one Event; a node that no
    longer waits forgets the record."""
    changes: dict[str, str | None] = {}
    if wait is None:
        for key in (keys.WAITING, keys.WAITING_SINCE, keys.WAITING_TOLD):
            if key in annotations:
                changes[key] = None
        return Published(changes, None, requeue)
    message = wait.message
    since = keys.parse_time(annotations.get(keys.WAITING_SINCE)) or now
    changes[keys.WAITING] = message
    changes[keys.WAITING_SINCE] = keys.format_time(since)
    if annotations.get(keys.WAITING_TOLD) == message:
        return Published(changes, None, requeue)
    waited = (now - since).total_seconds()
    if waited < WAIT_EVENT_AFTER:
        left = max(1.0, WAIT_EVENT_AFTER - waited)
        return Published(changes, None, left if requeue is None else min(requeue, left))
    changes[keys.WAITING_TOLD] = message
    return Published(changes, f"{node}: {message} (waiting {int(waited)}s)", requeue)
