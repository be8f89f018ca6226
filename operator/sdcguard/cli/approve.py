"""``kubectl sdc baselines approve``: a person trusts a fingerprint's candidate digests.

A pool with fewer nodes of one fingerprint than the policy's quorum never reaches a
consensus; its tests wait (AwaitingBaseline) and its nodes stay unqualified. Approving the
candidate digests is the way through. The command shows what it approves (the digests and
the nodes and tests that produced them), asks before it writes, and records who approved and
when on the SDCBaseline, so a trust no quorum established always names its person. The
choice itself is :func:`sdcguard.domain.baselines.approve` (pure); this module reads, asks and
writes."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

from sdcguard.api import PLURAL_BASELINES, SDCBaseline
from sdcguard.api.baseline import SHORT_HASH_CHARS
from sdcguard.cli.kube import CliError, Connection, list_typed, patch_custom
from sdcguard.cli.objects import wire_time
from sdcguard.cli.output import Result, Table, cell
from sdcguard.domain.baselines import Approval, ApprovalRefused, approve

MIN_PREFIX = 8
"""Shortest fingerprint prefix accepted (the short hashes shown are 12 characters)."""
MAX_APPROVER = 128
"""spec.approvedBy's bound."""


def find_baseline(
    baselines: Sequence[SDCBaseline], fingerprint: str | None, node: str | None
) -> SDCBaseline:
    """The SDCBaseline meant: by its name, its fingerprint hash or a prefix of at least
    8 characters; or, by ``node``, the one holding that node's latest candidate (the
    fingerprint of its latest screening)."""
    if fingerprint:
        wanted = fingerprint.lower()
        if len(wanted) < MIN_PREFIX and not wanted.startswith("fp-"):
            raise CliError(
                f"fingerprint {fingerprint!r} is too short: give at least {MIN_PREFIX} "
                "characters (kubectl sdc baselines lists them)"
            )
        found = [
            b
            for b in baselines
            if b.metadata.name == wanted or b.spec.fingerprint.hash.startswith(wanted)
        ]
        if not found:
            raise CliError(
                f"no SDCBaseline has fingerprint {fingerprint}; kubectl sdc baselines lists them"
            )
        if len(found) > 1:
            names = ", ".join(sorted(b.metadata.name for b in found))
            raise CliError(f"fingerprint {fingerprint} is ambiguous ({names}): give more of it")
        return found[0]
    if node is None:
        raise CliError("name a FINGERPRINT or a node (--node NODE)")
    held = [
        (candidate.recorded_at or dt.datetime.min.replace(tzinfo=dt.UTC), b)
        for b in baselines
        for candidate in (b.status.candidates if b.status else [])
        if candidate.node_name == node
    ]
    if not held:
        raise CliError(
            f"node {node} has no candidate digests on any SDCBaseline: screen it first "
            f"(kubectl sdc test {node}), or it already qualified against a trusted baseline"
        )
    return max(held, key=lambda pair: pair[0])[1]


def summary(baseline: SDCBaseline, approval: Approval) -> list[str]:
    """What the person is asked to approve: the digests and who produced them."""
    fp = baseline.spec.fingerprint
    described = ", ".join(
        part
        for part in (fp.device_model, f"x{fp.device_count}" if fp.device_count else "", fp.backend)
        if part
    )
    lines = [
        f"SDCBaseline {baseline.metadata.name}: fingerprint "
        f"{fp.short_hash or fp.hash[:SHORT_HASH_CHARS]} ({described or 'no device details'})",
        "digests to trust:",
        *(f"  {check}: {digest}" for check, digest in sorted(approval.spec.digests.items())),
        "produced by:",
        *(
            f"  node {c.node_name}, test {c.test_name or '?'}, at {wire_time(c.recorded_at) or '?'}"
            for c in approval.producers
        ),
    ]
    if approval.disagreeing:
        lines.append(
            "other digests (these nodes become suspect and are screened again): "
            + ", ".join(c.node_name for c in approval.disagreeing)
        )
    return lines


def approve_baseline(
    conn: Connection,
    fingerprint: str | None,
    node: str | None,
    approver: str,
    confirm: Callable[[list[str]], bool],
    now: dt.datetime,
) -> Result:
    """Approve a baseline's candidate digests after ``confirm`` accepted the summary.

    The write is a merge patch guarded by the resourceVersion that was read, so a candidate
    recorded (or a trust established) between reading and writing makes it fail with a
    conflict instead of approving digests the person did not see."""
    listed = list_typed(conn, SDCBaseline, PLURAL_BASELINES)
    baseline = find_baseline(listed.items, fingerprint, node)
    try:
        approval = approve(
            baseline.spec, baseline.status, node=node, by=approver[:MAX_APPROVER], now=now
        )
    except ApprovalRefused as exc:
        raise CliError(f"SDCBaseline {baseline.metadata.name}: {exc}") from None
    if not confirm(summary(baseline, approval)):
        raise CliError("not approved: nothing was changed")
    spec = approval.spec
    stale = {check: None for check in baseline.spec.digests if check not in spec.digests}
    patch: dict[str, Any] = {
        "metadata": {"resourceVersion": baseline.metadata.resource_version},
        "spec": {
            "digests": {**stale, **spec.digests},
            "trusted": True,
            "source": spec.source.value,
            "recordedFrom": list(spec.recorded_from),
            "approvedBy": spec.approved_by,
            "approvedAt": wire_time(spec.approved_at),
        },
    }
    patch_custom(conn, PLURAL_BASELINES, baseline.metadata.name, patch)
    row = {
        "name": baseline.metadata.name,
        "fingerprint": baseline.spec.fingerprint.hash,
        "digests": dict(spec.digests),
        "nodes": list(spec.recorded_from),
        "approvedBy": spec.approved_by,
        "approvedAt": wire_time(spec.approved_at),
    }
    table = Table(
        ["name", "trusted", "source", "checks", "nodes", "approved by"],
        [
            [
                baseline.metadata.name,
                "true",
                spec.source.value,
                ",".join(sorted(spec.digests)),
                ",".join(spec.recorded_from),
                cell(spec.approved_by),
            ]
        ],
    )
    return Result(
        data=row,
        tables=[table],
        lines=[
            "approved: tests waiting for this baseline are judged against it on their next "
            "reconcile (kubectl sdc status)"
        ],
    )
