"""Labels and annotations sdcguard reads and writes on Nodes and policies.

Set by sdcguard (bookkeeping, so that a restart loses nothing):

- label ``sdcguard.dev/state``: the lifecycle state (``kubectl get nodes -L sdcguard.dev/state``)
- ``sdcguard.dev/owned-taints``: comma-separated taint keys sdcguard added (only these are removed)
- ``sdcguard.dev/cordoned-by-us``: "true" when sdcguard cordoned the node (only then it uncordons)
- ``sdcguard.dev/owned-annotations``: autoscaler annotations sdcguard set (only these are removed)
- ``sdcguard.dev/qualified-at``, ``sdcguard.dev/fingerprint``: the last qualification
- ``sdcguard.dev/seeds-passed``: the seeds its passed screenings ran on (JSON, bounded;
  outlives the SDCTests retention deletes, see ``seeds.SeedsPassed``)
- ``sdcguard.dev/state-since``: when the node entered its state
- ``sdcguard.dev/test``: the SDCTest whose outcome the node waits for
- ``sdcguard.dev/seq``: counter that makes SDCTest and RepairTicket names unique and repeatable
- ``sdcguard.dev/suspect-checks``, ``sdcguard.dev/evidence``: the failed checks and SDCTests
  behind a suspicion
- ``sdcguard.dev/inconclusive``, ``sdcguard.dev/retry-after``: back-off after inconclusive results
- ``sdcguard.dev/drain-until``: a quarantine drain whose evictions are retried until then
- ``sdcguard.dev/held``: a confirmed failure whose quarantine the open circuit breaker
  holds (the node stays Suspect and reserved; re-tested when the breaker closes)
- ``sdcguard.dev/observed-failure``: a failure Observe mode recorded without acting on
  it (JSON: the failing tests and checks); Enforce confirms it before any quarantine
  (see ``lifecycle``: Quarantined + ObservedFailure -> Suspect)
- ``sdcguard.dev/history``: the hardware history the decision that entered the node's
  state writes after the node patch (JSON; written again by a later pass if the operator
  stopped in between, see ``lifecycle.history_note``)

Set by people and workloads (sdcguard acts, then removes the annotation):

- ``sdcguard.dev/suspect=<why>``: re-screen this node before it takes more work
- ``sdcguard.dev/quarantine=<why>``: quarantine now
- ``sdcguard.dev/release=<why>``: return to service without a test (a running test is
  cancelled, the ticket closed; screened again in its next idle window)
- label ``sdcguard.dev/exclude=true``: opt out; sdcguard removes its own taints and touches
  nothing else until the label is removed
- on an SDCPolicy, ``sdcguard.dev/reset-breaker=<new value>``: close the circuit breaker
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable

from sdcguard.api.common import GROUP
from sdcguard.api.common import parse_time as parse_time  # the one time parser

PREFIX = f"{GROUP}/"
LABEL_STATE = PREFIX + "state"
LABEL_EXCLUDE = PREFIX + "exclude"
LABEL_NODE = PREFIX + "node"
"""On SDCTests and RepairTickets: the node they are about (for label selectors)."""

OWNED_TAINTS = PREFIX + "owned-taints"
CORDONED_BY_US = PREFIX + "cordoned-by-us"
OWNED_ANNOTATIONS = PREFIX + "owned-annotations"
QUALIFIED_AT = PREFIX + "qualified-at"
FINGERPRINT = PREFIX + "fingerprint"
SEEDS_PASSED = PREFIX + "seeds-passed"
STATE_SINCE = PREFIX + "state-since"
CURRENT_TEST = PREFIX + "test"
SEQ = PREFIX + "seq"
SUSPECT_CHECKS = PREFIX + "suspect-checks"
EVIDENCE = PREFIX + "evidence"
INCONCLUSIVE = PREFIX + "inconclusive"
RETRY_AFTER = PREFIX + "retry-after"
DRAIN_UNTIL = PREFIX + "drain-until"
HELD = PREFIX + "held"
HISTORY = PREFIX + "history"
OBSERVED_FAILURE = PREFIX + "observed-failure"
WAITING = PREFIX + "waiting"
"""Why sdcguard holds back the node's next step (node not Ready, budget, back-off, ...)."""
WAITING_SINCE = PREFIX + "waiting-since"
WAITING_TOLD = PREFIX + "waiting-told"
"""The wait an Event already reported (one Event per wait that lasts)."""

REQUEST_SUSPECT = PREFIX + "suspect"
REQUEST_QUARANTINE = PREFIX + "quarantine"
REQUEST_RELEASE = PREFIX + "release"
RESET_BREAKER = PREFIX + "reset-breaker"

CA_SCALE_DOWN_DISABLED = "cluster-autoscaler.kubernetes.io/scale-down-disabled"
KARPENTER_DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
AUTOSCALER_ANNOTATIONS = (CA_SCALE_DOWN_DISABLED, KARPENTER_DO_NOT_DISRUPT)


def format_time(value: dt.datetime) -> str:
    """RFC 3339 in UTC with second precision, as Kubernetes writes times."""
    # isoformat, not strftime: a full pass formats a time for most nodes.
    return value.astimezone(dt.UTC).replace(microsecond=0, tzinfo=None).isoformat() + "Z"


def split_list(value: str | None) -> tuple[str, ...]:
    """Items of a comma-separated annotation, in order, without blanks or repeats."""
    items = (item.strip() for item in (value or "").split(","))
    return tuple(dict.fromkeys(item for item in items if item))


def join_list(items: tuple[str, ...] | list[str] | frozenset[str]) -> str | None:
    """The annotation value for ``items``; None (remove the annotation) when empty."""
    ordered = sorted(items) if isinstance(items, frozenset) else list(dict.fromkeys(items))
    return ",".join(ordered) or None


NODE_CONDITION = "SDCQualified"
"""The Node condition sdcguard keeps (``domain.nodecondition``): True while the node is
certified, False while it is quarantined, in repair or retired, Unknown otherwise."""


def observed_failure_text(tests: Iterable[str], checks: Iterable[str]) -> str:
    """The ``observed-failure`` annotation: the failing tests and checks Observe saw."""
    doc = {"tests": list(dict.fromkeys(tests))[-8:], "checks": sorted(set(checks))}
    return json.dumps(doc, separators=(",", ":"))


def parse_observed_failure(text: str | None) -> tuple[tuple[str, ...], frozenset[str]] | None:
    """(tests, checks) of an ``observed-failure`` annotation; None without one. A value
    that does not parse (a person's edit) still marks the failure, with nothing named."""
    if text is None:
        return None
    try:
        doc = json.loads(text)
        tests = tuple(str(t) for t in doc.get("tests", ()))
        checks = frozenset(str(c) for c in doc.get("checks", ()))
    except (ValueError, TypeError, AttributeError):
        return (), frozenset()
    return tests, checks
