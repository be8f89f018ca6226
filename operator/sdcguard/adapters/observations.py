"""Observation assembly: what ``decide`` reads about one node, from the pass's view:
its current test, the floor of its name sequence, since when it is idle, and whether a
pending pod needs it. Pure functions of their arguments (no I/O, no clock)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import replace

import structlog

from sdcguard.adapters import observe
from sdcguard.adapters.pass_state import (
    _EPOCH,
    FleetView,
    KnownTest,
)
from sdcguard.domain import demand, keys
from sdcguard.domain.observed import NodeFacts, TestFacts

log = structlog.get_logger("sdcguard.reconcile")


def seq_floor(node: NodeFacts, tests: list[KnownTest], view: FleetView) -> NodeFacts:
    """Never reuse the name of a finished SDCTest or closed RepairTicket.

    Names come from the node's ``sdcguard.dev/seq`` counter. If that annotation was
    mangled, or a crash left it behind an object that has since finished, the next
    name could be an old object's: the create would answer 409 and the old outcome
    would be taken for the new test. Objects still in flight are not counted, so a
    decision repeated after a crash still finds (and adopts) what it created.
    """
    if not node.uid:
        return node
    marker = f"-{node.uid[:5]}-"

    def seq(name: str) -> int | None:
        """N of a name ending in -<uid[:5]>-N (a string test: a pattern per node
        would overflow the regex cache on a big fleet)."""
        _, found, tail = name.rpartition(marker)
        return int(tail) if found and tail.isdecimal() else None

    done: list[int] = []
    for test in tests:
        number = seq(test.name)
        if number is not None and test.finished:
            done.append(number)
    for ticket in view.tickets.get(node.name, []):
        number = seq(ticket.name)
        if number is not None and ticket.phase in ("Closed", "Retired"):
            done.append(number)
    floor = max(done, default=0)
    raw = node.annotations.get(keys.SEQ, "0")
    if raw.isdigit() and int(raw) >= floor:
        return node
    return replace(node, annotations={**node.annotations, keys.SEQ: str(floor)})


def inherit_current(node: NodeFacts, tests: list[KnownTest], view: FleetView) -> list[KnownTest]:
    """The policy's tests of the node, with the node's current test added when another
    policy holds it: the node changed owner while that policy screened it. Its outcome
    (Cancelled by the policy change: no result, no back-off) is what the new owner reads;
    without it the new owner would take the test for lost and back the node off."""
    current = node.current_test
    if not current or any(t.name == current for t in tests):
        return tests
    for seen in view.tests.get(node.name, []):
        if seen.name == current and seen.known is not None:
            return [*tests, seen.known]
    return tests


def current_test(node: NodeFacts, tests: list[KnownTest]) -> TestFacts | None:
    current = node.current_test
    named = [t for t in tests if t.name == current]
    if named:
        return named[0].facts
    running = [t for t in tests if not t.finished]
    if not running:
        return None
    return max(running, key=lambda t: (t.created, t.name)).facts


def queued_tests(current: TestFacts | None, tests: list[KnownTest]) -> tuple[str, ...]:
    """The node's unfinished tests other than ``current``, oldest first: they wait for it."""
    if current is None:
        return ()
    waiting = [t for t in tests if not t.finished and t.name != current.name]
    return tuple(t.name for t in sorted(waiting, key=lambda t: (t.created, t.name)))


def unschedulable(test: TestFacts | None, view: FleetView) -> str | None:
    """The scheduler's message while it cannot place the running test's probe Pod."""
    if test is None or test.finished:
        return None
    for pod in view.probe_pods.get(test.name, []):
        if pod.phase == "Pending" and pod.unschedulable and not pod.deleted:
            return pod.unschedulable
    return None


def idle_since(name: str, accelerators: Iterable[str], view: FleetView) -> dt.datetime | None:
    """None while a workload uses the node's accelerators (the policy's
    spec.accelerators); else since when it is idle.

    The time a workload last left is kept in memory; a node never seen busy counts
    as idle since it was created, so it does not look "used" after a restart.
    """
    if any(use.uses_any(accelerators) for use in view.busy.get(name, ())):
        return None
    last = view.last_busy.get(name)
    if last is not None:
        return last
    return view.nodes[name].created or _EPOCH


def needed(name: str, accelerators: list[str], view: FleetView, testing_taint: str = "") -> bool:
    """A pending pod asks for this node's kind of accelerator and the scheduler could
    place it there (``domain.demand``): its selector and required affinity select the
    node, it tolerates the node's taints other than sdcguard's own (the ``testing_taint``
    key and those the node records as ours), and its requests fit the node.

    A pod that fits no node is demand for none, so it holds no screening back."""
    node = view.nodes[name]
    labels, allocatable = node.labels, node.allocatable
    offered = {r for r in accelerators if str(allocatable.get(r, "0")) not in ("0", "")}
    if node.dra_devices:  # devices a pending pod's ResourceClaims could be given
        offered.add(observe.CLAIMED_DEVICES)
    reserved = frozenset(keys.split_list(node.annotations.get(keys.OWNED_TAINTS)))
    if testing_taint:
        reserved |= {testing_taint}
    for pending in view.pending:
        if not offered & set(pending.resources):
            continue
        if demand.could_run_on(pending.placement, name, labels, node.taints, allocatable, reserved):
            return True
    return False
