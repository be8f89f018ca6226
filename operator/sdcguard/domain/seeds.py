"""Which seed a screening's probe draws its data from (pure).

Judging stays bitwise-exact, so a node is only ever compared with data it was
given: devices within the node against each other (no baseline needed, any
seed), and the node against a baseline recorded for the same seed. The seed is
part of the probe's fingerprint (its ``config_hash``), so a baseline is always
one seed's baseline, and a baseline of another seed is never compared.

The scheme: every SDCTest gets the seed of the UTC day it was created
(:func:`daily_seed`), unless a person pinned one (``spec.seed``). All screenings
of a fingerprint on one day share the day's seed, so the day's first ``quorum``
nodes establish its baseline by consensus exactly as with a fixed seed, and a
confirmation re-run on the same day repeats the data that failed. Every day
brings a new seed, so a node screened on n different days has been checked on
n different data sets: a data-dependent defect that one seed's inputs do not
trigger gets a fresh chance at every later screening. The cost is one baseline
per fingerprint per day of screening (old seeds never come back, so their
baselines can be pruned).

Why a day, and not a fresh seed per screening or a small rotating set:

- A baseline by consensus needs ``quorum`` nodes of one fingerprint screened on
  the same data. With a fresh seed per screening no seed would ever be seen by a
  second node: no consensus could form, every screening would wait for a
  baseline, and a defect shared by every device of a node (which only a baseline
  shows) would never be found. A day's seed is shared by every screening of the
  fleet that day, so its quorum forms from the day's first screenings.
- A rotating set of K seeds also gives consensus, but caps the data a node is
  ever checked on at K sets; a day's seed never comes back, so the data a node
  has passed grows with every day it is screened, without bound.
- A confirmation re-run on the same day repeats the data that failed, so a
  data-dependent defect reproduces instead of being cleared by other data.

The limit: screenings of one node within one UTC day all see that day's data
(a node re-screened after every short job repeats it until midnight), and a
confirmation created after midnight draws the next day's seed.

The seed depends only on the test's creation time (or its name, where that is
unknown), so a restart that rebuilds the probe Job rebuilds it with the same
seed.
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
