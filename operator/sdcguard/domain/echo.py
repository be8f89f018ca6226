"""Bounded echoes: how sdcguard repeats a string someone else wrote.

Annotations, ticket notes and probe output may be long (an annotation may hold
256 KiB). Wherever the operator echoes such a string (a log line, an Event, a
condition, a ticket's history or a sink's payload) it goes through :func:`bounded`,
which keeps the start and says that, and how much, was cut.
"""

from __future__ import annotations

ECHO_LIMIT = 1024
"""Characters kept of an echoed string by default (an Event message's limit too)."""


def bounded(text: str, limit: int = ECHO_LIMIT) -> str:
    """``text`` if it has at most ``limit`` characters; else its start, followed by
    ``… (cut, N characters)`` where N is the original length, within ``limit``."""
    if len(text) <= limit:
        return text
    suffix = f"… (cut, {len(text)} characters)"
    return text[: max(0, limit - len(suffix))] + suffix
