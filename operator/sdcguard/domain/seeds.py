"""Which seeds a screening's probe draws its data from (pure).

A screening has two seeds. The probe's rounds that a baseline covers (its first
``baseline_rounds`` of every check: compute 2, collective 2, memory 5 patterns,
golden 16 steps) draw their data from the **seed** (``--seed``); every later round,
the vast majority of a screening, draws from the screening's own **data seed**
(``--data-seed``).

Why two: judging stays bitwise-exact, so a node is only ever compared with data it
was given. Every check of every round has judges that need no baseline: a bitwise
replay on the same device, agreement between the node's devices, ABFT checksums
against an fp64 reference, collective sums that are exact integers, memory patterns
regenerated on the device. Those work on any data, so the later rounds draw fresh
data every screening (:func:`data_seed`, new for every SDCTest). What only a
baseline shows is a defect that every device of the node has alike (a bad
firmware, a wrong kernel in the image): for that the node's digests are compared
bitwise with an SDCBaseline of the node's fingerprint, which needs every node of
the fingerprint to compute the same data in those rounds.

The scheme: **one fixed baseline seed** (:data:`BASELINE_SEED`) for the baseline's
rounds of every unpinned screening, and a **fresh data seed** for every later round.
The seed is part of the probe's fingerprint (its ``config_hash``); the data seed is
not, since no baseline covers its rounds. So a fingerprint's SDCBaseline is
established once (by the consensus of ``quorum`` nodes, by reference nodes, or by a
person's approval) and stays valid until the fingerprint itself changes: a new
accelerator model, driver, runtime, torch, probe image or check parameters. Nothing
about it expires with the calendar, and a fingerprint that loses its nodes has its
baseline pruned by retention (``domain/retention.py``).

Why not a seed that changes with time (one per UTC day was the earlier scheme):

- every fingerprint needed a new baseline every day, and a Recorded or approved one
  had to be redone by a person daily;
- a hardware type screened by fewer than ``quorum`` nodes on one day could never
  pass in Consensus mode, and each day's first screenings held their nodes waiting
  for a quorum;
- the day's first ``quorum`` agreeing nodes decided what was right for that day,
  a new chance every day for a shared defect to make itself the reference.

What it bought was one more baseline-checked data set per day. The defects only a
baseline sees are shared by every device of a node, which are systematic (a wrong
kernel, microcode or library) rather than data-dependent in the way a marginal
transistor is; the baseline's rounds already span every check (GEMM shapes and
dtypes, collectives, memory patterns, the golden model's training steps). What
grows a node's data coverage is the data seed: n screenings are n fresh data sets,
judged by the node's own devices against each other and against exact references.

Why not a small pool of baseline seeds: each seed of a pool has its own
``config_hash``, so its own fingerprint and SDCBaseline. A pool of k seeds costs k
quorums (or k approvals for a pool smaller than ``quorum``) to add k baseline data
sets once; a fleet gains little for it, and a pool below the quorum pays it by hand.

Repeating data: a **confirmation** re-run takes the data seed of the test it
confirms (the node's newest earlier test), so a data-dependent defect reproduces
instead of being cleared by other data; the seed is the same for every screening.
A person can pin both (``spec.seed``, ``spec.dataSeed``; ``kubectl sdc test --seed N
--data-seed M``); pinning only the seed pins the data seed to the same value, so a
pinned test repeats all of its data. A pinned seed other than :data:`BASELINE_SEED`
is a fingerprint of its own, with its own baseline.

The limit: a defect shared by every device that only the data seed's rounds would
trigger is not seen (no baseline covers them), and the baseline's rounds see the
same data at every screening. A node's digests of those rounds being public
(in the SDCBaseline) is the replay limit ``docs/security.md`` describes.

What a node passed on outlives its SDCTests: each pass adds its seeds to the node's
compact record (:class:`SeedsPassed`, the ``sdcguard.dev/seeds-passed`` annotation),
which retention never prunes; ``kubectl sdc history`` joins it with the tests kept.

Every seed depends only on the test's own fields (uid, name, pins) and, for a
confirmation, on the test it confirms, so a restart that rebuilds the probe Job
rebuilds it with the same seeds.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

#: Seeds are non-negative 31-bit integers, as the probe accepts them.
MAX_SEED = (1 << 31) - 1


def _hashed(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") % (MAX_SEED + 1)


#: The seed of the baseline's rounds of every unpinned screening. Fixed: a baseline
#: established for a fingerprint stays comparable until the fingerprint changes.
BASELINE_SEED = _hashed("sdcguard-baseline-seed:1")


def screening_seed(pinned: int | None) -> int:
    """The seed of one screening's baseline rounds: the pinned one, else
    :data:`BASELINE_SEED` (the same for every screening, whenever it runs)."""
    return BASELINE_SEED if pinned is None else pinned


def data_seed(
    pinned: int | None,
    pinned_seed: int | None,
    test_uid: str,
    test_name: str,
    confirmed: int | None = None,
) -> int:
    """The data seed of one screening (every round a baseline does not cover).

    ``pinned`` (spec.dataSeed) wins; a pinned ``pinned_seed`` (spec.seed) alone pins
    the data seed to it; ``confirmed`` is the data seed of the test a confirmation
    re-run confirms; otherwise a seed of the test's own, from its uid (unique to the
    object) and name: new for every screening, the same for every rebuild of its Job.
    """
    if pinned is not None:
        return pinned
    if pinned_seed is not None:
        return pinned_seed
    if confirmed is not None:
        return confirmed
    return _hashed(f"sdcguard-data-seed:{test_uid}:{test_name}")


@dataclass(frozen=True)
class SeedsPassed:
    """The seeds a node's passed screenings ran on, kept on the Node
    (``sdcguard.dev/seeds-passed``) so retention can delete the SDCTests that carried
    them: how many screenings passed, the distinct baseline seeds, and the most recent
    data seeds. Bounded (a Node object is watched by every controller): the baseline
    seeds to :data:`MAX_SEEDS_KEPT` (one in practice), the data seeds to the last
    :data:`MAX_DATA_SEEDS_KEPT`; ``passed`` counts them all. ``last`` is the newest
    test recorded, so recording the same pass twice (a decision re-run after a
    restart) counts it once."""

    passed: int = 0
    seeds: tuple[int, ...] = ()
    data_seeds: tuple[int, ...] = ()
    last: str = ""

    def add(self, test: str, seed: int | None, data: int | None) -> SeedsPassed:
        """This record with the passed screening ``test`` added."""
        if not test or test == self.last:
            return self
        seeds = self.seeds if seed is None or seed in self.seeds else (*self.seeds, seed)
        datas = self.data_seeds if data is None else (*self.data_seeds, data)
        return SeedsPassed(
            self.passed + 1,
            seeds[-MAX_SEEDS_KEPT:],
            datas[-MAX_DATA_SEEDS_KEPT:],
            test,
        )

    def text(self) -> str:
        """The annotation's value (compact JSON)."""
        doc = {"passed": self.passed, "seeds": list(self.seeds),
               "dataSeeds": list(self.data_seeds), "last": self.last}  # fmt: skip
        return json.dumps(doc, separators=(",", ":"))

    @classmethod
    def parse(cls, text: str | None) -> SeedsPassed:
        """The record in an annotation's value; an empty record for none or one that
        does not parse (a person's edit), so counting starts again instead of failing."""
        try:
            doc = json.loads(text or "{}")
            passed = int(doc.get("passed", 0))
            seeds = tuple(int(s) for s in doc.get("seeds", ()))
            datas = tuple(int(s) for s in doc.get("dataSeeds", ()))
            last = str(doc.get("last", ""))
        except (ValueError, TypeError, AttributeError):
            return cls()
        if passed < 0 or any(not 0 <= s <= MAX_SEED for s in (*seeds, *datas)):
            return cls()
        return cls(passed, seeds[-MAX_SEEDS_KEPT:], datas[-MAX_DATA_SEEDS_KEPT:], last[:253])


#: Distinct baseline seeds a :class:`SeedsPassed` keeps (pinned seeds add to the fixed one).
MAX_SEEDS_KEPT = 16
#: Most recent data seeds a :class:`SeedsPassed` keeps.
MAX_DATA_SEEDS_KEPT = 32
