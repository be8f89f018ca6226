"""Pure judgements: which replica is odd, which GPU computed wrongly, and whether
the job may judge at all. No torch, no collectives: digests arrive as hashable
values (tuples of ints), ranks as ints, so every rank reaches the same verdict
from the same gathered facts.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum


class Method(StrEnum):
    """How a detection was made (the ``spec.method`` of an SDCReport)."""

    SHADOW_AUDIT = "ShadowAudit"
    REPLICA_CONSENSUS = "ReplicaConsensus"
    MEGATRON_RERUN = "MegatronRerun"


class Confirmation(StrEnum):
    """What the confirmation re-runs said, as the probe says it.

    Transient: a re-run on the same GPU did not reproduce the wrong result.
    Persistent: it did, and other GPUs computed the right one.
    Unconfirmed: only one result from that GPU; nobody re-ran it.
    """

    TRANSIENT = "Transient"
    PERSISTENT = "Persistent"
    UNCONFIRMED = "Unconfirmed"


@dataclass(frozen=True)
class Consensus:
    """Replica consensus over one digest per rank."""

    agree: bool
    odd_ranks: tuple[int, ...] = ()
    majority_ranks: tuple[int, ...] = ()
    reason: str = ""

    @property
    def attributed(self) -> bool:
        """Whether a strict majority names the odd ranks."""
        return not self.agree and bool(self.odd_ranks)


def replica_consensus(digests: Mapping[int, Hashable]) -> Consensus:
    """Group ranks by digest; a strict majority names every other rank as odd.

    Replicas of a data-parallel group hold bitwise identical parameters and
    optimizer state after every step (DDP applies the same all-reduced gradient
    with the same optimizer), so any difference is a fault. Two replicas that
    disagree have no majority: the difference is detected but not attributed.
    """
    if not digests:
        return Consensus(agree=True, reason="no replicas")
    groups: dict[Hashable, list[int]] = defaultdict(list)
    for rank in sorted(digests):
        groups[digests[rank]].append(rank)
    if len(groups) == 1:
        return Consensus(agree=True, majority_ranks=tuple(sorted(digests)))
    ranked = sorted(groups.values(), key=len, reverse=True)
    top = ranked[0]
    if 2 * len(top) <= len(digests):
        sizes = "/".join(str(len(g)) for g in ranked)
        return Consensus(
            agree=False,
            reason=f"replicas split {sizes}: no strict majority to name the odd one",
        )
    odd = tuple(sorted(r for g in ranked[1:] for r in g))
    return Consensus(agree=False, odd_ranks=odd, majority_ranks=tuple(top))


@dataclass(frozen=True)
class Attribution:
    """Who computed one micro-batch wrongly, from every rank's results for it."""

    faulty: Mapping[int, Confirmation] = field(default_factory=dict)
    truth_known: bool = False
    reason: str = ""

    @property
    def clean(self) -> bool:
        """Every result agreed."""
        return not self.faulty and self.truth_known


def attribute_recompute(opinions: Mapping[int, Sequence[Hashable]]) -> Attribution:
    """Judge the results several ranks computed for the same micro-batch.

    ``opinions`` maps a rank to the results it produced (its first run first).
    With deterministic kernels every result must be identical, so:

    * a rank whose own results differ from each other is faulty;
    * the true result is the one value that at least two different ranks
      produced; every rank with another value is faulty;
    * with no such value, a lone self-consistent rank among inconsistent ones is
      taken as right; two self-consistent ranks that disagree are undecided (a
      third replica is needed), and nobody is blamed.

    A faulty rank is Persistent when all of its (two or more) results were wrong,
    Transient when one of them was right or it contradicted itself, Unconfirmed
    when it produced one wrong result only.
    """
    produced_by: dict[Hashable, set[int]] = defaultdict(set)
    for rank, values in opinions.items():
        for v in values:
            produced_by[v].add(rank)
    inconsistent = {r for r, values in opinions.items() if len(set(values)) > 1}
    backed = [v for v, ranks in produced_by.items() if len(ranks) >= 2]
    truth: Hashable | None = None
    if len(backed) == 1:
        truth = backed[0]
    elif not backed:
        consistent = [r for r in opinions if r not in inconsistent and opinions[r]]
        if len(consistent) == 1 and inconsistent:
            truth = opinions[consistent[0]][0]
    if truth is None:
        if len(backed) > 1:
            reason = "two different results are each backed by two ranks"
        elif len(produced_by) <= 1:
            return Attribution(truth_known=True)
        else:
            reason = (
                "ranks disagree and no result is backed by two of them: "
                "a third replica is needed to decide"
            )
        return Attribution(
            faulty={r: Confirmation.TRANSIENT for r in sorted(inconsistent)},
            truth_known=False,
            reason=reason,
        )
    faulty: dict[int, Confirmation] = {}
    for rank in sorted(opinions):
        values = opinions[rank]
        wrong = sum(1 for v in values if v != truth)
        if wrong == 0:
            continue
        if wrong == len(values):
            faulty[rank] = Confirmation.PERSISTENT if len(values) >= 2 else Confirmation.UNCONFIRMED
        else:
            faulty[rank] = Confirmation.TRANSIENT
    return Attribution(faulty=faulty, truth_known=True)


def confirm_divergence(first: Hashable, redigest: Hashable, cross: Hashable) -> tuple[str, str]:
    """Confirm a replica that differs from the majority: ``(kind, explanation)``.

    ``redigest`` is the odd rank digesting its own tensors again, ``cross`` another
    rank digesting a copy of them. Kinds: ``transient-digest`` (its digest changed
    on the same GPU: the computation is flaky, the state may be fine),
    ``state`` (another GPU sees the same different bytes: its parameters or
    optimizer state really diverged), ``digest`` (its bytes are fine, the GPU
    computes their digest wrongly every time).
    """
    if redigest != first:
        return "transient-digest", "its digest changed when recomputed on the same GPU"
    if cross == first:
        return "state", "another GPU digests its tensors to the same odd value: its state diverged"
    return "digest", "another GPU digests its tensors to the majority value: its digests are wrong"


#: Fingerprint keys that must be identical on every rank for any judgement.
SOFTWARE_KEYS = ("torch", "cuda", "cudnn", "python", "sdctrain", "threads", "tf32")


def refusals(
    fingerprints: Sequence[Mapping[str, str]], deterministic: Sequence[bool]
) -> dict[str, str]:
    """Why the job must not judge: ``{"consensus": why, "audit": why}`` for each refused check.

    Mixed software across ranks refuses both (a different library may round
    differently); non-deterministic kernels or mixed device models refuse the
    shadow audit (a recompute would differ without a fault). Consensus compares
    replicas that DDP keeps identical whatever the kernels, so determinism alone
    does not refuse it.
    """
    out: dict[str, str] = {}
    if len(fingerprints) < 2:
        out["consensus"] = out["audit"] = "a single replica has nobody to compare with"
        return out
    for key in SOFTWARE_KEYS:
        values = sorted({fp.get(key, "") for fp in fingerprints})
        if len(values) > 1:
            why = f"ranks run different {key} ({', '.join(v or 'unknown' for v in values)})"
            out.setdefault("consensus", why)
            out.setdefault("audit", why)
    models = sorted({fp.get("device", "") for fp in fingerprints})
    if len(models) > 1:
        out.setdefault("audit", f"ranks run on different devices ({', '.join(models)})")
    off = [str(r) for r, det in enumerate(deterministic) if not det]
    if off:
        out.setdefault(
            "audit",
            "deterministic algorithms are off on rank(s) "
            + ", ".join(off)
            + ": call torch.use_deterministic_algorithms(True) (and on CUDA set "
            "CUBLAS_WORKSPACE_CONFIG=:4096:8, cudnn.benchmark False)",
        )
    return out
