"""Two policy conditions that must not say "all is well" when it is not (pure; the policy
status adapter reads the counts and Secrets and writes them).

- ``Ready`` is False (reason ``NoNodesSelected``) while the policy selects no node: a
  policy that screens nothing is not ready to protect anything, and ``Ready=True`` let a
  selector typo pass unnoticed.
- ``TicketSinksReady`` says, before the first quarantine needs it, whether every ticket
  sink's Secret and key exist: a missing Secret used to show only when a ticket failed
  to go out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from sdcguard.api import Mode, TicketSink

TICKET_SINKS_READY = "TicketSinksReady"


@dataclass(frozen=True)
class ConditionValue:
    """A condition's status, reason and message (the adapter adds type and times)."""

    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str


def ready_condition(selected: int, mode: Mode, paused: bool) -> ConditionValue:
    """``Ready``: True only while the policy selects at least one node."""
    if not selected:
        return ConditionValue(
            "False",
            "NoNodesSelected",
            "the selector matches no node, so nothing is screened (see NoNodesSelected)",
        )
    said = f"{selected} nodes; mode {mode.value}" + ("; paused" if paused else "")
    return ConditionValue("True", "Reconciled", said)


def secrets_to_read(sinks: Sequence[TicketSink]) -> frozenset[tuple[str, str]]:
    """The (namespace, name) of every Secret the sinks name."""
    return frozenset(
        (s.secret_ref.namespace, s.secret_ref.name) for s in sinks if s.secret_ref is not None
    )


def ticket_sinks_condition(
    sinks: Sequence[TicketSink], secrets: Mapping[tuple[str, str], frozenset[str] | None]
) -> ConditionValue:
    """``TicketSinksReady`` from the keys each named Secret has (``secrets``: its keys,
    None or absent when it does not exist or cannot be read)."""
    if not sinks:
        return ConditionValue("True", "NoSinks", "no ticket sinks: tickets are only recorded")
    problems = []
    for sink in sinks:
        ref = sink.secret_ref
        if ref is None:
            continue
        found = secrets.get((ref.namespace, ref.name))
        if found is None:
            problems.append(f"{sink.type}: Secret {ref.namespace}/{ref.name} not found")
        elif ref.key not in found:
            problems.append(f"{sink.type}: Secret {ref.namespace}/{ref.name} has no key {ref.key}")
    if problems:
        return ConditionValue(
            "False",
            "SecretMissing",
            "; ".join(problems) + ": tickets will not reach these sinks until it is fixed",
        )
    return ConditionValue(
        "True", "SecretsFound", f"{len(sinks)} sinks; their Secrets and keys exist"
    )
