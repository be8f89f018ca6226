"""One policy owns each node: the most specific selector, then the first name."""

from sdcguard.api.policy import NodeSelector
from sdcguard.domain.selection import most_specific, owning_policy, selects, specificity

POLICIES = {
    "all": {},
    "h100": {"gpu": "h100"},
    "h100-train": {"gpu": "h100", "pool": "train"},
    "a-h100": {"gpu": "h100"},
}


def test_most_specific_selector_wins() -> None:
    assert owning_policy({"gpu": "h100", "pool": "train"}, POLICIES) == "h100-train"


def test_ties_go_to_the_first_name() -> None:
    assert owning_policy({"gpu": "h100", "pool": "infer"}, POLICIES) == "a-h100"


def test_empty_selector_catches_the_rest_and_none_when_nothing_selects() -> None:
    assert owning_policy({"gpu": "a100"}, POLICIES) == "all"
    assert owning_policy({"gpu": "a100"}, {"h100": {"gpu": "h100"}}) is None
    assert selects({}, {"x": "y"})


def test_most_specific_lists_the_policies_tied_at_the_top() -> None:
    assert most_specific({"gpu": "h100", "pool": "infer"}, POLICIES) == ["a-h100", "h100"]
    assert most_specific({"gpu": "h100", "pool": "train"}, POLICIES) == ["h100-train"]
    assert most_specific({"gpu": "a100"}, {"h100": {"gpu": "h100"}}) == []


def test_the_owner_is_the_first_of_the_most_specific() -> None:
    for labels in ({"gpu": "h100", "pool": "infer"}, {"gpu": "h100"}, {"gpu": "a100"}, {}):
        top = most_specific(labels, POLICIES)
        assert owning_policy(labels, POLICIES) == (top[0] if top else None)


def _sel(labels: dict[str, str] | None = None, *exprs: dict[str, object]) -> NodeSelector:
    return NodeSelector.model_validate(
        {"matchLabels": labels or {}, "matchExpressions": list(exprs)}
    )


def test_match_expressions_mean_what_they_mean_in_kubernetes() -> None:
    node = {"gpu": "h100", "pool": "train"}
    assert selects(_sel(None, {"key": "gpu", "operator": "In", "values": ["a100", "h100"]}), node)
    assert not selects(_sel(None, {"key": "gpu", "operator": "In", "values": ["a100"]}), node)
    assert not selects(_sel(None, {"key": "zone", "operator": "In", "values": ["a"]}), node)
    assert selects(_sel(None, {"key": "gpu", "operator": "NotIn", "values": ["a100"]}), node)
    assert selects(_sel(None, {"key": "zone", "operator": "NotIn", "values": ["a"]}), node)
    assert not selects(_sel(None, {"key": "pool", "operator": "NotIn", "values": ["train"]}), node)
    assert selects(_sel(None, {"key": "pool", "operator": "Exists"}), node)
    assert not selects(_sel(None, {"key": "zone", "operator": "Exists"}), node)
    assert selects(_sel(None, {"key": "zone", "operator": "DoesNotExist"}), node)
    assert not selects(_sel(None, {"key": "gpu", "operator": "DoesNotExist"}), node)
    # matchLabels and every expression must all hold.
    both = _sel({"gpu": "h100"}, {"key": "pool", "operator": "In", "values": ["infer"]})
    assert not selects(both, node)
    assert selects(_sel(), node)


def test_expressions_count_towards_specificity() -> None:
    policies = {
        "h100": _sel({"gpu": "h100"}),
        "h100-not-infer": _sel(
            {"gpu": "h100"}, {"key": "pool", "operator": "NotIn", "values": ["infer"]}
        ),
        "plain": {"gpu": "h100"},  # a mapping is read as matchLabels
    }
    assert owning_policy({"gpu": "h100", "pool": "train"}, policies) == "h100-not-infer"
    assert most_specific({"gpu": "h100", "pool": "infer"}, policies) == ["h100", "plain"]
    assert specificity(policies["h100-not-infer"]) == 2
