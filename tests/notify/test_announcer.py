"""The ticket announcer's loop over the operator's copy of the tickets, against a real
HTTP receiver on 127.0.0.1: which tickets it tries and when, one delivery per event
however often it looks, and the Kopf finalizer an older release left removed."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

from kubernetes import client

from sdcguard.adapters import notify, ticket_sinks
from sdcguard.adapters.observe import TicketSnapshot
from sdcguard.api import RepairTicket, TicketPhase, to_body
from sdcguard.metrics import Metrics
from tests.notify.test_announce import _policy, _Writer, _writer
from tests.notify.test_notify import LOOPBACK_RECEIVER, NOW, Receiver, Reply, Seen, make_ticket


def _snap(
    ticket: RepairTicket, version: str = "1", finalizers: tuple[str, ...] = ()
) -> TicketSnapshot:
    body = to_body(ticket)
    body["metadata"]["resourceVersion"] = version
    body["metadata"]["finalizers"] = list(finalizers)
    return TicketSnapshot.from_body(body)


def _delivered(ticket: RepairTicket) -> RepairTicket:
    key = notify.idempotency_key(ticket, notify.event_for(ticket))
    body = to_body(ticket)
    body["status"]["notification"] = {"delivered": True, "idempotencyKey": key}
    return RepairTicket.model_validate(body)


class _Copy:
    """The inventory's ticket mirror, as the announcer reads it."""

    def __init__(self, *snaps: TicketSnapshot) -> None:
        self.by_name = {s.name: s for s in snaps}

    def put(self, snap: TicketSnapshot) -> None:
        self.by_name[snap.name] = snap

    def __call__(self) -> dict[str, TicketSnapshot]:
        return dict(self.by_name)


def _announcer(copy: _Copy, rec: Receiver, writer: _Writer | None = None) -> ticket_sinks.Announcer:
    announcer = ticket_sinks.Announcer(
        copy,
        writer or _writer(),
        Metrics(),
        clock=lambda: NOW,
        interval=15.0,
        addresses=LOOPBACK_RECEIVER,
    )
    policy = _policy({"type": "webhook", "url": rec.url + "/sdc"})
    announcer.policy = lambda ref: policy if ref == "default" else None
    return announcer


def _named(ticket: RepairTicket, name: str) -> RepairTicket:
    meta = ticket.metadata.model_copy(update={"name": name})
    return ticket.model_copy(update={"metadata": meta})


def test_a_ticket_is_tried_when_new_when_changed_and_every_interval(
    receiver: Callable[[Callable[[Seen], Reply]], Receiver],
) -> None:
    rec = receiver(lambda _: (200, {}, b"{}"))
    copy = _Copy(_snap(make_ticket()))
    announcer = _announcer(copy, rec)
    (first,) = announcer.due(100.0)
    announcer._tried[first.name] = (first.resource_version, 100.0)
    assert announcer.due(101.0) == [], "unchanged and tried a second ago"
    assert announcer.due(114.9) == []
    assert [t.name for t in announcer.due(115.0)] == [first.name], "the interval passed"
    copy.put(dataclasses.replace(first, resource_version="2"))
    assert [t.resource_version for t in announcer.due(101.0)] == ["2"], "changed: at once"
    announcer._busy.add(first.name)
    assert announcer.due(200.0) == [], "a ticket being worked on is not handed out twice"


def test_nothing_is_tried_before_the_policies_are_known_and_settled_tickets_never(
    receiver: Callable[[Callable[[Seen], Reply]], Receiver],
) -> None:
    rec = receiver(lambda _: (200, {}, b"{}"))
    closed = _named(_delivered(make_ticket(phase=TicketPhase.CLOSED)), "done")
    unread = dataclasses.replace(_snap(_named(make_ticket(), "unread")), ticket=None)
    copy = _Copy(_snap(closed), unread, _snap(make_ticket()))
    announcer = _announcer(copy, rec)
    policy = announcer.policy
    announcer.policy = None
    assert announcer.due(0.0) == [], "a ticket's policy would look gone"
    announcer.policy = policy
    assert [t.name for t in announcer.due(0.0)] == ["gpu-node-7-1"]
    assert announcer._settled == {"done": "1"}, "a delivered closing event is remembered"
    copy.by_name.pop("done")
    announcer.due(0.0)
    assert announcer._settled == {}, "a deleted ticket is forgotten"


def test_one_delivery_per_event_however_often_the_loop_looks(
    receiver: Callable[[Callable[[Seen], Reply]], Receiver],
) -> None:
    rec = receiver(lambda _: (200, {}, b"{}"))
    writer = _writer()
    copy = _Copy(_snap(make_ticket()))
    announcer = _announcer(copy, rec, writer)

    async def looks(n: int) -> list[str]:
        outcomes: list[str] = []
        for _ in range(n):  # the status written back has not reached the copy yet
            outcomes += await asyncio.gather(*announcer.start_due(asyncio.get_running_loop()))
        return outcomes

    assert asyncio.run(looks(5)) == ["delivered"]
    assert len(rec.seen) == 1
    (status,) = [p for kind, p in writer.patches if kind == "status"]
    # The written status reaches the copy: looked at again, nothing is sent.
    body = to_body(make_ticket())
    body["status"] = {**body["status"], **status}
    copy.put(_snap(RepairTicket.model_validate(body), version="2"))
    assert asyncio.run(looks(3)) == ["up-to-date"]
    assert len(rec.seen) == 1
    announcer.stop()


def test_an_old_kopf_finalizer_is_removed_guarded_by_the_resource_version(
    receiver: Callable[[Callable[[Seen], Reply]], Receiver],
) -> None:
    rec = receiver(lambda _: (200, {}, b"{}"))
    writer = _writer()
    marker = ticket_sinks.KOPF_FINALIZER
    closed = _snap(
        _delivered(make_ticket(phase=TicketPhase.CLOSED)),
        version="7",
        finalizers=("example.com/keep", marker),
    )
    announcer = _announcer(_Copy(closed), rec, writer)
    (due,) = announcer.due(0.0)
    assert announcer.attempt(due) == "up-to-date", "a delivered ticket is not announced again"
    patch: dict[str, Any] = {
        "metadata": {"finalizers": ["example.com/keep"], "resourceVersion": "7"}
    }
    assert writer.patches == [("spec", patch)]
    assert rec.seen == []


def test_a_failed_write_is_logged_and_the_ticket_is_tried_again(
    receiver: Callable[[Callable[[Seen], Reply]], Receiver],
) -> None:
    rec = receiver(lambda _: (200, {}, b"{}"))

    class Refusing(_Writer):
        def patch_custom_status(self, plural: str, name: str, status: dict[str, Any]) -> None:
            raise RuntimeError("the API server is away")

    writer = Refusing(api=client.ApiClient(), metrics=Metrics())
    announcer = _announcer(_Copy(_snap(make_ticket())), rec, writer)

    async def look() -> list[str]:
        return list(await asyncio.gather(*announcer.start_due(asyncio.get_running_loop())))

    assert asyncio.run(look()) == ["error"]
    assert announcer._busy == set()
    later = announcer._tried["gpu-node-7-1"][1] + 15.0
    assert [t.name for t in announcer.due(later)] == ["gpu-node-7-1"]
