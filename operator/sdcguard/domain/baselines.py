"""Golden values per fingerprint: compare with a trusted baseline, or build one.

A new fingerprint (new accelerator model, driver, runtime, probe image or check
parameters) has no trusted baseline, so its first screenings are inconclusive and
each node's digests are recorded as a *candidate* on the fingerprint's SDCBaseline.

- Consensus mode: once ``quorum`` nodes report identical digests, and no other group
  is as large, those digests become trusted. Nodes that disagree are a minority
  whose hardware computed something else: they become Suspect and are screened
  again, now against the trusted baseline.
- Recorded mode: the person names reference nodes in the SDCBaseline's
  ``recordedFrom``; once all of them reported and agree, their digests are trusted.
- Approved: a person writes the digests and sets ``trusted: true`` themselves.

A trusted baseline is never changed by candidates: only a person can un-trust it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from sdcguard.api import (
    BaselineMode,
    BaselineSettings,
    BaselineSource,
    Candidate,
    FingerprintSpec,
    SDCBaselineSpec,
    SDCBaselineStatus,
    baseline_name,
    set_condition,
)
from sdcprobe.result import Fingerprint

Comparison = Literal["match", "mismatch", "absent"]
TRUSTED = "Trusted"


def fingerprint_spec(fingerprint: Fingerprint) -> FingerprintSpec:
    """The SDCBaseline fingerprint for a probe result's fingerprint."""
    return FingerprintSpec(
        hash=fingerprint.hash,
        backend=fingerprint.backend,
        device_model=fingerprint.device_model,
        device_count=fingerprint.device_count,
        driver=fingerprint.driver,
        runtime=fingerprint.runtime,
        torch=fingerprint.torch,
        torch_xla=fingerprint.torch_xla,
        cpu_isa=fingerprint.cpu_isa,
        threads=fingerprint.threads,
        config_hash=fingerprint.config_hash,
    )


def compare(digests: Mapping[str, str], baseline: SDCBaselineSpec | None) -> dict[str, Comparison]:
    """Per check: match or mismatch against a trusted baseline, absent without one."""
    golden = baseline.digests if baseline is not None and baseline.trusted else {}
    return {
        check: ("absent" if check not in golden else "match" if golden[check] == d else "mismatch")
        for check, d in digests.items()
    }


@dataclass(frozen=True)
class BaselineUpdate:
    """What to write back after recording one node's digests."""

    spec: SDCBaselineSpec
    status: SDCBaselineStatus
    became_trusted: bool
    suspects: tuple[str, ...]
    """Nodes whose digests disagree with the trusted ones: mark them suspect."""
    message: str


def _groups(candidates: list[Candidate]) -> list[tuple[frozenset[tuple[str, str]], list[str]]]:
    """Candidates grouped by identical digests, largest group first."""
    by_digests: dict[frozenset[tuple[str, str]], list[str]] = {}
    for candidate in candidates:
        by_digests.setdefault(frozenset(candidate.digests.items()), []).append(candidate.node_name)
    return sorted(by_digests.items(), key=lambda item: (-len(item[1]), sorted(item[1])))


def record_candidate(
    spec: SDCBaselineSpec | None,
    status: SDCBaselineStatus | None,
    *,
    fingerprint: FingerprintSpec,
    node: str,
    test: str,
    digests: Mapping[str, str],
    settings: BaselineSettings,
    now: dt.datetime,
) -> BaselineUpdate:
    """Record ``node``'s digests on the baseline of ``fingerprint`` (creating it when None).

    Pass only digests of a screening that found no SDC and ran every check of its suite.
    """
    if spec is None:
        source = (
            BaselineSource.CONSENSUS
            if settings.mode == BaselineMode.CONSENSUS
            else BaselineSource.RECORDED
        )
        spec = SDCBaselineSpec(fingerprint=fingerprint, source=source)
    status = status or SDCBaselineStatus()

    if spec.trusted:
        return _against_trusted(spec, status, node, test, digests, settings, now)

    entry = Candidate(node_name=node, digests=dict(digests), test_name=test, recorded_at=now)
    candidates = [c for c in status.candidates if c.node_name != node] + [entry]
    groups = _groups(candidates)
    leader_digests, leaders = groups[0]
    others = sorted(n for _, nodes in groups[1:] for n in nodes)
    runner_up = len(groups[1][1]) if len(groups) > 1 else 0

    contested = False
    if settings.mode == BaselineMode.CONSENSUS:
        reached = len(leaders) >= settings.quorum and len(leaders) > runner_up
        contested = len(leaders) >= settings.quorum and not reached
        waiting = (
            f"contested: groups of {len(leaders)} nodes report different digests"
            if contested
            else f"{len(leaders)} of {settings.quorum} nodes agree"
        )
    else:
        reference = set(spec.recorded_from)
        reported = [c for c in candidates if c.node_name in reference]
        ref_groups = _groups(reported)
        contested = len(ref_groups) > 1
        reached = bool(reference) and len(reported) == len(reference) and not contested
        if reached:
            leader_digests = ref_groups[0][0]
            leaders = [
                c.node_name for c in candidates if frozenset(c.digests.items()) == leader_digests
            ]
            others = sorted(set(c.node_name for c in candidates) - set(leaders))
        waiting = (
            f"{len(reported)} of {len(reference)} reference nodes reported"
            + ("; they disagree" if contested else "")
            if reference
            else "name reference nodes in spec.recordedFrom, or approve digests by hand"
        )

    if reached:
        new_spec = spec.model_copy(
            update={
                "digests": dict(sorted(leader_digests)),
                "trusted": True,
                "recorded_from": sorted(leaders)
                if settings.mode == BaselineMode.CONSENSUS
                else spec.recorded_from,
            }
        )
        suspects = tuple(others)
        message = f"trusted: {len(leaders)} nodes agree"
        if suspects:
            message += f"; {len(suspects)} disagree and become suspect: {', '.join(suspects)}"
        conditions = set_condition(
            status.conditions, TRUSTED, "True", "QuorumReached", message, now
        )
        new_status = SDCBaselineStatus(
            candidates=[],
            agreeing_nodes=sorted(leaders),
            disagreeing_nodes=list(suspects),
            conditions=conditions,
        )
        return BaselineUpdate(new_spec, new_status, True, suspects, message)

    reason = "Contested" if contested else "AwaitingQuorum"
    conditions = set_condition(status.conditions, TRUSTED, "False", reason, waiting, now)
    new_status = SDCBaselineStatus(
        candidates=candidates,
        agreeing_nodes=sorted(leaders),
        disagreeing_nodes=others,
        conditions=conditions,
    )
    return BaselineUpdate(spec, new_status, False, (), f"candidate from {node} recorded; {waiting}")


def _against_trusted(
    spec: SDCBaselineSpec,
    status: SDCBaselineStatus,
    node: str,
    test: str,
    digests: Mapping[str, str],
    settings: BaselineSettings,
    now: dt.datetime,
) -> BaselineUpdate:
    """Compare with a trusted baseline; checks it has no digest for yet (a check added to a
    suite later, e.g. memory in repair verification) are gathered by consensus the same way
    a new fingerprint is, and added once ``quorum`` agreeing nodes reported them. Digests the
    baseline has are never changed."""
    known = {c: d for c, d in digests.items() if c in spec.digests}
    missing = {c: d for c, d in digests.items() if c not in spec.digests}
    outcome = compare(known, spec)
    agrees = all(v == "match" for v in outcome.values())
    agreeing = [n for n in status.agreeing_nodes if n != node] + ([node] if agrees else [])
    disagreeing = [n for n in status.disagreeing_nodes if n != node] + ([] if agrees else [node])
    candidates = [c for c in status.candidates if c.node_name != node]
    new_spec = spec
    extended = False
    note = ""
    if missing and agrees:
        entry = Candidate(node_name=node, digests=missing, test_name=test, recorded_at=now)
        candidates = [*candidates, entry]
        groups = _groups(candidates)
        leader_digests, leaders = groups[0]
        runner_up = len(groups[1][1]) if len(groups) > 1 else 0
        if len(leaders) >= settings.quorum and len(leaders) > runner_up:
            added = dict(sorted(leader_digests))
            new_spec = spec.model_copy(update={"digests": {**spec.digests, **added}})
            candidates, extended = [], True
            note = f"; {', '.join(sorted(added))} added: {len(leaders)} nodes agree"
        else:
            waiting = f"{len(leaders)} of {settings.quorum} nodes agree"
            note = f"; {', '.join(sorted(missing))}: {waiting}"
    new_status = status.model_copy(
        update={
            "candidates": candidates,
            "agreeing_nodes": sorted(agreeing),
            "disagreeing_nodes": sorted(disagreeing),
        }
    )
    differs = ", ".join(c for c, v in outcome.items() if v != "match")
    message = (f"{node} agrees" if agrees else f"{node} differs in {differs}") + note
    return BaselineUpdate(new_spec, new_status, extended, () if agrees else (node,), message)


@dataclass(frozen=True)
class Approval:
    """A person's approval of candidate digests, ready to write (see :func:`approve`)."""

    spec: SDCBaselineSpec
    """The spec to write: the digests, trusted, source Approved, who and when."""
    producers: tuple[Candidate, ...]
    """The candidates whose digests are approved (the nodes and tests behind them)."""
    disagreeing: tuple[Candidate, ...]
    """Candidates with other digests: suspects once the approved digests are trusted."""


class ApprovalRefused(ValueError):
    """Why no digests can be approved; the text says what to do instead."""


def approve(
    spec: SDCBaselineSpec,
    status: SDCBaselineStatus | None,
    *,
    node: str | None,
    by: str,
    now: dt.datetime,
) -> Approval:
    """Trust one group of candidate digests because a person vouches for them.

    This is how a pool smaller than the quorum qualifies: with one node of a fingerprint,
    no consensus can form, and a person who knows the hardware is sound approves its digests.
    ``node`` picks that node's digests; without it the candidates must agree (one group),
    since choosing between groups is a judgement the command asks the person to make.
    A trusted baseline is refused: replacing trusted digests is un-trusting them first.
    """
    if spec.trusted:
        raise ApprovalRefused(
            f"already trusted ({spec.source.value}): set spec.trusted to false first to "
            "replace its digests"
        )
    candidates = [c for c in (status.candidates if status else []) if c.digests]
    if not candidates:
        raise ApprovalRefused("no candidate digests yet: screen a node of this fingerprint first")
    if node is not None:
        chosen = [c for c in candidates if c.node_name == node]
        if not chosen:
            names = ", ".join(sorted(c.node_name for c in candidates))
            raise ApprovalRefused(f"node {node} has no candidate here (candidates: {names})")
        digests = frozenset(chosen[0].digests.items())
    else:
        groups = _groups(candidates)
        if len(groups) > 1:
            sizes = "; ".join(f"{len(nodes)}: {', '.join(sorted(nodes))}" for _, nodes in groups)
            raise ApprovalRefused(
                f"candidates disagree ({sizes}): pick the digests with --node NODE"
            )
        digests = groups[0][0]
    producers = tuple(c for c in candidates if frozenset(c.digests.items()) == digests)
    disagreeing = tuple(c for c in candidates if c not in producers)
    new_spec = spec.model_copy(
        update={
            "digests": dict(sorted(digests)),
            "trusted": True,
            "source": BaselineSource.APPROVED,
            "recorded_from": sorted(c.node_name for c in producers),
            "approved_by": by,
            "approved_at": now,
        }
    )
    return Approval(new_spec, producers, disagreeing)


def unreachable_quorum(pool_nodes: int, quorum: int) -> bool:
    """Whether a consensus of ``quorum`` nodes cannot form in a pool of ``pool_nodes``
    (0: the pool's size is not known, so nothing is claimed)."""
    return 0 < pool_nodes < quorum


def bound_baselines(by_name: Mapping[str, SDCBaselineSpec]) -> dict[str, SDCBaselineSpec]:
    """The baselines by fingerprint hash, each from the one object named for its hash
    (``baseline_name``): a second SDCBaseline that declares the same hash under another
    name is ignored, so it can neither shadow the real one nor stand in for it."""
    return {
        spec.fingerprint.hash: spec
        for name, spec in by_name.items()
        if name == baseline_name(spec.fingerprint.hash)
    }
