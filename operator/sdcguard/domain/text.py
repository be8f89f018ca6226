"""Text that others wrote, made safe to show: bounded and without control characters.

An SDCReport's fields (``gpuUUID``, ``detail``, evidence) are written by a workload.
Before such text reaches a node annotation, an Event or a terminal it goes through
:func:`clean_text`: control characters (C0, C1, DEL), format characters (bidi
overrides and isolates, zero-width joiners) and line or paragraph separators are
replaced by a space, runs of spaces are collapsed, and the result is cut to a bound,
ending in an ellipsis when cut. A terminal then shows what was written, never an
escape sequence that moves the cursor, rewrites earlier lines or reverses text.
"""

from __future__ import annotations

import unicodedata

#: Unicode categories replaced: controls, format characters, line and paragraph
#: separators (unassigned and private-use code points are left: they do not act).
_UNSAFE = frozenset({"Cc", "Cf", "Zl", "Zp"})


def clean_text(value: object, limit: int = 256) -> str:
    """``value`` as one printable line of at most ``limit`` characters."""
    if limit < 1:
        raise ValueError(f"limit must be positive, got {limit}")
    text = "".join(
        " " if unicodedata.category(ch) in _UNSAFE else ch for ch in str(value)[: limit * 4]
    )
    text = " ".join(text.split())
    if len(text) > limit:
        text = text[: limit - 1].rstrip() + "…"
    return text


def clean_optional(value: object | None, limit: int = 256) -> str | None:
    """:func:`clean_text`, keeping None (and text that cleans to nothing) as None."""
    if value is None:
        return None
    return clean_text(value, limit) or None


def printable(value: object, *, keep_newlines: bool = False) -> str:
    """``value`` with every control, format or separator character replaced by ``?``
    (spacing kept, and line breaks where ``keep_newlines``): for terminal output."""
    return "".join(
        ch
        if (keep_newlines and ch == "\n") or ch == " " or unicodedata.category(ch) not in _UNSAFE
        else "?"
        for ch in str(value)
    )
