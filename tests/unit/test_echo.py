"""Bounded echoes of user-supplied strings."""

from __future__ import annotations

from sdcguard.domain import keys
from sdcguard.domain.decide import decide
from sdcguard.domain.echo import ECHO_LIMIT, bounded
from sdcguard.domain.lifecycle import EmitEvent, NodeState
from sdcguard.domain.observed import Observed
from tests.unit.factories import NOW, node, policy


def test_short_strings_are_echoed_whole() -> None:
    assert bounded("disk 3 flaky") == "disk 3 flaky"
    assert bounded("x" * ECHO_LIMIT) == "x" * ECHO_LIMIT


def test_long_strings_are_cut_within_the_limit_and_say_so() -> None:
    cut = bounded("y" * 240_000)
    assert len(cut) == ECHO_LIMIT
    assert cut.startswith("yyy") and cut.endswith("… (cut, 240000 characters)")
    assert len(bounded("z" * 5000, 100)) == 100


def test_a_huge_suspect_annotation_is_echoed_bounded() -> None:
    """A 240,000-character sdcguard.dev/suspect: the note (logs, conditions) and every
    Event message stay short and say the text was cut."""
    n = node(
        state=NodeState.QUALIFIED,
        qualified_at=NOW,
        annotations={keys.REQUEST_SUSPECT: "w" * 240_000},
    )
    d = decide(Observed(node=n, idle_since=NOW), policy(), NOW)
    assert d.state == NodeState.SUSPECT
    assert len(d.note) <= 600 and "(cut, 240000 characters)" in d.note
    messages = [a.message for a in d.actions if isinstance(a, EmitEvent)]
    assert messages and all(len(m) <= 1100 for m in messages)
    assert all("(cut, 240000 characters)" in m for m in messages)
