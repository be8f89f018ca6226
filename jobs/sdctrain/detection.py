"""What the guard found and who hands it on: the types the guard (which finds) and the
report (which tells sdcguard) share.

They live apart from both so that neither imports the other for them: the guard
makes :class:`Detection` values and calls a :class:`Reporter`; ``sdctrain.report``
implements one and needs nothing else of the guard, which imports the report
(its default reporter) in turn.
"""

from __future__ import annotations

from dataclasses import dataclass

from sdctrain.verdicts import Confirmation, Method


@dataclass(frozen=True)
class Detection:
    """One confirmed finding about one rank."""

    method: Method
    step: int
    rank: int | None
    """The accused rank (global rank in the job); None when nobody could be named."""
    confirmation: Confirmation
    detail: str
    node: str | None = None
    pod: str | None = None
    namespace: str | None = None
    job: str | None = None
    gpu_uuid: str | None = None
    evidence: tuple[tuple[str, str], ...] = ()


class Reporter:
    """Something that hands a detection to the fleet (see :mod:`sdctrain.report`)."""

    def report(self, detection: Detection) -> str | None:  # pragma: no cover - interface
        raise NotImplementedError
