"""One policy owns each node: the most specific selector, then the first name."""

from sdcguard.domain.selection import most_specific, owning_policy, selects

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
