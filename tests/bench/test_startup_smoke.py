"""The start-up benchmark's objects are what it says: valid finished SDCTests kept as
their facts, and tickets of which only the open ones have an event left to deliver
(so only those are looked at again by the ticket announcer)."""

from __future__ import annotations

from bench.scale.startup import sdctest_body, ticket_body

from sdcguard.adapters.pass_state import TestSnapshot
from sdcguard.adapters.ticket_sinks import needs_announcing
from sdcguard.api import RepairTicket, SDCTest, Verdict


def test_the_tests_are_finished_screenings_kept_as_facts() -> None:
    names, verdicts = set(), set()
    for i in range(200):
        body, status = sdctest_body(i)
        full = {**body, **status}
        SDCTest.model_validate(full)
        snap = TestSnapshot.slim(full)
        assert snap.known is not None and snap.known.running is None
        assert snap.node_name == body["spec"]["nodeName"]
        names.add(snap.name)
        verdicts.add(snap.known.facts.verdict)
    assert len(names) == 200, "every test has its own name"
    assert verdicts == {Verdict.SDC, Verdict.PASS}, "a share of the screenings found SDC"


def test_only_the_open_tickets_have_an_event_left_to_deliver() -> None:
    pending = []
    for i in range(30):
        body, status = ticket_body(i)
        full = {**body, **status}
        pending.append(needs_announcing(RepairTicket.model_validate(full)))
    assert pending == [i % 10 == 0 for i in range(30)]
