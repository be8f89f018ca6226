"""``kubectl sdc status`` lists the nodes sdcguard holds back, and why."""

from __future__ import annotations

from sdcguard.cli.commands import _waiting_rows


def _node(name: str, **annotations: str) -> dict[str, object]:
    return {
        "metadata": {
            "name": name,
            "labels": {"sdcguard.dev/state": "Repairing"},
            "annotations": annotations,
        }
    }


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
