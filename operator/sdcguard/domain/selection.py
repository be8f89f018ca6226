"""Which policy owns a node when several select it.

Two policies acting on one node would fight (each reserving, testing and
untainting by its own rules), so exactly one owns it: the most specific
selector (most ``matchLabels`` plus ``matchExpressions``) wins, and among
equally specific ones the policy whose name sorts first. ``kubectl sdc``
reports such ties as errors so people can fix them; the operator still has to
pick one deterministically.

A selector is a policy's full ``NodeSelector`` (matchLabels and
matchExpressions, as Kubernetes label selectors), or a plain mapping, read as
matchLabels alone.
"""

from __future__ import annotations

from collections.abc import Mapping

from sdcguard.api.policy import LabelSelectorRequirement, NodeSelector, SelectorOperator

Selector = NodeSelector | Mapping[str, str]


def requirement_holds(req: LabelSelectorRequirement, labels: Mapping[str, str]) -> bool:
    """One matchExpressions entry, with Kubernetes' meaning of each operator."""
    value = labels.get(req.key)
    match req.operator:
        case SelectorOperator.IN:
            return value is not None and value in req.values
        case SelectorOperator.NOT_IN:
            return value is None or value not in req.values
        case SelectorOperator.EXISTS:
            return value is not None
        case SelectorOperator.DOES_NOT_EXIST:
            return value is None
    return False  # pragma: no cover  (the enum has no other member)


def selects(selector: Selector, labels: Mapping[str, str]) -> bool:
    """Whether all of a selector's matchLabels and matchExpressions hold on ``labels``
    (an empty selector selects everything)."""
    if isinstance(selector, NodeSelector):
        return all(labels.get(k) == v for k, v in selector.match_labels.items()) and all(
            requirement_holds(r, labels) for r in selector.match_expressions
        )
    return all(labels.get(k) == v for k, v in selector.items())


def specificity(selector: Selector) -> int:
    """How specific a selector is: its matchLabels plus its matchExpressions."""
    if isinstance(selector, NodeSelector):
        return len(selector.match_labels) + len(selector.match_expressions)
    return len(selector)


def most_specific(labels: Mapping[str, str], policies: Mapping[str, Selector]) -> list[str]:
    """The names, sorted, of the policies selecting a node with ``labels`` whose selectors
    are the most specific; ``policies`` maps each policy's name to its selector. Empty when
    no policy selects it; more than one is a tie."""
    matching = {name: specificity(sel) for name, sel in policies.items() if selects(sel, labels)}
    if not matching:
        return []
    best = max(matching.values())
    return sorted(name for name, size in matching.items() if size == best)


def owning_policy(labels: Mapping[str, str], policies: Mapping[str, Selector]) -> str | None:
    """The name of the policy that owns a node with ``labels``; ``policies`` maps each
    policy's name to its selector. None when no policy selects it."""
    top = most_specific(labels, policies)
    return top[0] if top else None
