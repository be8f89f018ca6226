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


def most_specific(
    labels: Mapping[str, str], policies: Mapping[str, Mapping[str, str]]
) -> list[str]:
    """The names, sorted, of the policies selecting a node with ``labels`` whose selectors
    are the most specific (most matchLabels); ``policies`` maps each policy's name to its
    selector's matchLabels. Empty when no policy selects it; more than one is a tie."""
    matching = {name: len(sel) for name, sel in policies.items() if selects(sel, labels)}
    if not matching:
        return []
    best = max(matching.values())
    return sorted(name for name, size in matching.items() if size == best)


def owning_policy(
    labels: Mapping[str, str], policies: Mapping[str, Mapping[str, str]]
) -> str | None:
    """The name of the policy that owns a node with ``labels``; ``policies`` maps each
    policy's name to its selector's matchLabels. None when no policy selects it."""
    top = most_specific(labels, policies)
    return top[0] if top else None
