"""Which policy owns a node when several select it.

Two policies acting on one node would fight (each reserving, testing and
untainting by its own rules), so exactly one owns it: the most specific
selector (most ``matchLabels``) wins, and among equally specific ones the
policy whose name sorts first. ``kubectl sdc`` reports such ties as errors so
people can fix them; the operator still has to pick one deterministically.
"""

from __future__ import annotations

from collections.abc import Mapping


def selects(match_labels: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """Whether a selector's matchLabels all hold on ``labels`` (empty selects all)."""
    return all(labels.get(k) == v for k, v in match_labels.items())


def owning_policy(
    labels: Mapping[str, str], policies: Mapping[str, Mapping[str, str]]
) -> str | None:
    """The name of the policy that owns a node with ``labels``; ``policies`` maps each
    policy's name to its selector's matchLabels. None when no policy selects it."""
    matching = [(name, sel) for name, sel in policies.items() if selects(sel, labels)]
    if not matching:
        return None
    return min(matching, key=lambda item: (-len(item[1]), item[0]))[0]
