"""The training Job that report tests make by hand, with Pods of their own."""

from __future__ import annotations

from typing import Any


def held_job(name: str) -> dict[str, Any]:
    """A training Job that nothing runs: suspended, so it makes no Pods of its own, and
    ``managedBy`` another controller, so the Job controller leaves it alone. Left to
    that controller, it would release (take the controller reference off) the hand-made
    Pods the tests give it, which lack its selector's labels, and a report decided
    after that would be refused JobMismatch, whatever the test meant to check."""
    return {
        "metadata": {"name": name},
        "spec": {
            "suspend": True,
            "managedBy": "sdcguard.test/nobody",
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "train", "image": "example.invalid/train:1"}],
                }
            },
        },
    }
