"""``kubectl sdc status`` lists the nodes sdcguard holds back, and why."""

from __future__ import annotations

from sdcguard.cli.commands import _waiting_rows
from sdcguard.cli.objects import Node


def _node(name: str, **annotations: str) -> Node:
    return Node.from_body(
        {
            "metadata": {
                "name": name,
                "labels": {"sdcguard.dev/state": "Repairing"},
                "annotations": annotations,
            }
        }
    )


def test_waiting_nodes_are_listed_longest_first_with_the_reason() -> None:
    rows = _waiting_rows(
        [
            _node("a", **{"sdcguard.dev/qualified-at": "2026-01-01T00:00:00Z"}),
            _node(
                "b",
                **{
                    "sdcguard.dev/waiting": "verification waits: node not Ready",
                    "sdcguard.dev/waiting-since": "2026-01-01T00:05:00Z",
                },
            ),
            _node(
                "c",
                **{
                    "sdcguard.dev/waiting": "verification waits: circuit breaker open",
                    "sdcguard.dev/waiting-since": "2026-01-01T00:01:00Z",
                },
            ),
        ]
    )
    assert [(r["node"], r["state"], r["why"]) for r in rows] == [
        ("c", "Repairing", "verification waits: circuit breaker open"),
        ("b", "Repairing", "verification waits: node not Ready"),
    ]


def test_a_tied_node_is_counted_under_the_policy_the_operator_picks() -> None:
    """Equally specific selectors: the operator's rule (the name that sorts first)
    decides where status counts the node, never a POLICY "-" row."""
    from sdcguard.api import SDCPolicy
    from sdcguard.cli.commands import summarize_fleet

    def policy(name: str) -> SDCPolicy:
        return SDCPolicy.model_validate(
            {"metadata": {"name": name}, "spec": {"nodeSelector": {"matchLabels": {"t": "x"}}}}
        )

    node = Node.from_body(
        {
            "metadata": {"name": "n", "labels": {"t": "x", "sdcguard.dev/state": "Qualified"}},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}},
        }
    )
    summary = summarize_fleet([node], [policy("zeta"), policy("alpha")])
    assert [row["policy"] for row in summary.pools] == ["alpha"]
