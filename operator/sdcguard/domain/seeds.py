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
with a baseline established by consensus of ``quorum`` nodes of the fingerprint,
which needs those nodes to see the same data. So the baseline's rounds keep one
shared seed per UTC day (:func:`daily_seed`): all screenings of a fingerprint on
one day share it, the day's first ``quorum`` nodes establish its baseline exactly as
with a fixed seed, and every day brings a new one (one baseline per fingerprint per
day of screening; old seeds never come back, so their baselines can be pruned).
The seed is part of the probe's fingerprint (its ``config_hash``); the data seed is
not, since no baseline covers its rounds.

What a node has been checked on therefore grows with every screening, not every
day: n screenings are n data sets in the later rounds (a data-dependent defect
that one screening's inputs do not trigger gets a fresh chance at the next), plus
one baseline-checked data set per day.

Repeating data: a **confirmation** re-run takes the data seed of the test it
confirms (the node's newest earlier test), so a data-dependent
defect reproduces instead of being cleared by other data; on the same UTC day it
shares the seed too. A person can pin both (``spec.seed``, ``spec.dataSeed``;
``kubectl sdc test --seed N --data-seed M``); pinning only the seed pins the data
seed to the same value, so a pinned test repeats all of its data.

The limits: a confirmation created after midnight draws the next day's seed for the
baseline's rounds (its data seed is still the failed test's); and a defect shared
by every device that only the data seed's rounds would trigger is not seen (no
baseline covers them), while the day seed's rounds still vary from day to day.

Every seed depends only on the test's own fields (creation time, uid, name, pins)
and, for a confirmation, on the test it confirms, so a restart that rebuilds the
probe Job rebuilds it with the same seeds.
"""

from __future__ import annotations

import datetime as dt
import hashlib

#: Seeds are non-negative 31-bit integers, as the probe accepts them.
MAX_SEED = (1 << 31) - 1
#: How long one seed is in use.
SEED_PERIOD = dt.timedelta(days=1)


def _hashed(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") % (MAX_SEED + 1)


def daily_seed(at: dt.datetime, period: dt.timedelta = SEED_PERIOD) -> int:
    """The seed of the period (a UTC day by default) that contains ``at``."""
    aware = at if at.tzinfo is not None else at.replace(tzinfo=dt.UTC)
    epoch = int(aware.timestamp() // period.total_seconds())
    return _hashed(f"sdcguard-seed:{int(period.total_seconds())}:{epoch}")


def screening_seed(pinned: int | None, created: dt.datetime | None, test_name: str) -> int:
    """The seed of one screening: the pinned one, else the seed of the day the test was
    created, else (no creation time known) one derived from the test's name."""
    if pinned is not None:
        return pinned
    if created is not None:
        return daily_seed(created)
    return _hashed(f"sdcguard-seed:name:{test_name}")


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
