"""Policies' statuses are written in a thread of their own: a pass hands its status
over and goes on to the next probe's end, the newest status of a policy is the one
written, and a refused write is counted and logged (the next due pass sends it again).
"""

from __future__ import annotations

import threading
from typing import Any

from kubernetes import client

from sdcguard.adapters.policy_status import StatusSender
from sdcguard.adapters.reconciler import FleetView, Reconciler
from sdcguard.metrics import Metrics
from sdcguard.settings import Settings
from tests.unit.factories import NOW
from tests.unit.test_apply_order import _body, _policy_body, _Recorder, _snapshot


class _Held:
    """A writer whose status writes wait for ``go``; each write is kept in order."""

    def __init__(self, refuse: dict[str, Exception] | None = None) -> None:
        self.go = threading.Event()
        self.started = threading.Event()
        self.written: list[tuple[str, str, dict[str, Any]]] = []
        self.refuse = dict(refuse or {})

    def patch_custom_status(self, plural: str, name: str, status: dict[str, Any]) -> None:
        self.started.set()
        assert self.go.wait(10)
        if name in self.refuse:
            raise self.refuse.pop(name)
        self.written.append((plural, name, status))


def test_the_newest_status_of_a_policy_replaces_one_not_yet_written() -> None:
    writer = _Held()
    sender = StatusSender(writer)
    sender.send("fleet", {"n": 1})
    assert writer.started.wait(5)  # the first write is on its way, held
    sender.send("fleet", {"n": 2})
    sender.send("other", {"n": 1})
    sender.send("fleet", {"n": 3})  # replaces n=2, not yet sent
    assert not sender.flush(0.2), "a write still held is not flushed"
    writer.go.set()
    assert sender.flush(5)
    assert writer.written == [
        ("sdcpolicies", "fleet", {"n": 1}),
        ("sdcpolicies", "fleet", {"n": 3}),
        ("sdcpolicies", "other", {"n": 1}),
    ]
    assert sender.sent == 3 and sender.failed == 0


def test_a_refused_write_is_counted_and_the_next_one_goes_out() -> None:
    writer = _Held(
        refuse={
            "fleet": client.ApiException(status=500),
            "gone": client.ApiException(status=404),  # deleted meanwhile: nothing to tell
        }
    )
    writer.go.set()
    sender = StatusSender(writer)
    sender.send("fleet", {"n": 1})
    sender.send("gone", {"n": 1})
    assert sender.flush(5)
    assert sender.failed == 1 and writer.written == []
    sender.send("fleet", {"n": 2})
    assert sender.flush(5)
    assert writer.written == [("sdcpolicies", "fleet", {"n": 2})] and sender.sent == 1


def test_close_writes_what_is_pending_then_ends_the_thread() -> None:
    """Kopf stops (a process exit, or a lost Lease): the term's last statuses go out,
    the thread ends, and a pass that outlived the term hands over nothing more."""
    writer = _Held()
    sender = StatusSender(writer)
    sender.send("fleet", {"n": 1})
    assert writer.started.wait(5)
    sender.send("other", {"n": 1})
    assert not sender.close(0.2), "a write still held keeps the thread"
    sender.send("fleet", {"n": 2})  # after close: not taken
    writer.go.set()
    assert sender.close(5)
    assert writer.written == [
        ("sdcpolicies", "fleet", {"n": 1}),
        ("sdcpolicies", "other", {"n": 1}),
    ]
    assert sender.sent == 2 and sender.flush(1)


def test_an_idle_sender_closes_at_once() -> None:
    sender = StatusSender(_Held())
    assert sender.close(5)
    assert sender.sent == 0 and sender.failed == 0


class _HeldRecorder(_Recorder):
    """The recording writer of the apply-order tests, its policy status held."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.go = threading.Event()

    def patch_custom_status(self, plural: str, name: str, status: dict[str, Any]) -> None:
        if plural == "sdcpolicies":
            assert self.go.wait(10)
        super().patch_custom_status(plural, name, status)


def test_a_pass_does_not_wait_for_its_policy_status() -> None:
    metrics = Metrics()
    writer = _HeldRecorder(api=client.ApiClient(), metrics=metrics)
    rec = Reconciler(
        writer=writer,
        settings=Settings(metrics_port=0),
        metrics=metrics,
        status_sender=StatusSender(writer),
    )
    view = FleetView(nodes={"gpu-1": _snapshot(_body())}, policies={"fleet": {}})
    rec.run_pass(_policy_body(), view, NOW)  # returns while the status write is held
    kinds = [kind for kind, _ in writer.calls]
    assert "node-patch" in kinds and "repairtickets-create" in kinds
    assert "sdcpolicies-status" not in kinds
    writer.go.set()
    assert rec.status_sender.flush(5)
    status = next(body for kind, body in writer.calls if kind == "sdcpolicies-status")
    assert status["counts"]["quarantined"] == 1
