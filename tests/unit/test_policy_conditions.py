"""Ready is not True while a policy selects no node; TicketSinksReady says whether each
sink's Secret and key exist before a quarantine needs them."""

from __future__ import annotations

import pytest

from sdcguard.api import Mode, TicketSink
from sdcguard.domain.policy_conditions import (
    ready_condition,
    secrets_to_read,
    ticket_sinks_condition,
)


@pytest.mark.parametrize(
    ("selected", "status", "reason"), [(0, "False", "NoNodesSelected"), (3, "True", "Reconciled")]
)
def test_ready_needs_a_selected_node(selected: int, status: str, reason: str) -> None:
    ready = ready_condition(selected, Mode.OBSERVE, paused=False)
    assert (ready.status, ready.reason) == (status, reason)


def _sink(**ref: str) -> TicketSink:
    return TicketSink.model_validate(
        {
            "type": "webhook",
            "url": "https://repairs.example.com/sdc",
            "secretRef": {"name": "hook", "namespace": "ops", **ref},
        }
    )


@pytest.mark.parametrize(
    ("secrets", "status", "said"),
    [
        ({("ops", "hook"): frozenset({"token"})}, "True", "Secrets and keys exist"),
        ({}, "False", "Secret ops/hook not found"),
        ({("ops", "hook"): None}, "False", "Secret ops/hook not found"),
        ({("ops", "hook"): frozenset({"other"})}, "False", "has no key token"),
    ],
    ids=["found", "absent", "unreadable", "no-key"],
)
def test_ticket_sinks_ready_says_what_is_missing(
    secrets: dict[tuple[str, str], frozenset[str] | None], status: str, said: str
) -> None:
    condition = ticket_sinks_condition([_sink()], secrets)
    assert condition.status == status and said in condition.message
    assert secrets_to_read([_sink()]) == {("ops", "hook")}


def test_no_sinks_is_ready() -> None:
    assert ticket_sinks_condition([], {}).status == "True"
