"""The probe's result protocol: a versioned JSON document, and its baseline twin.

The operator imports this module to read termination messages, so it must stay
light: it imports neither torch nor numpy (a test enforces that).

A result is written twice: in full to stdout (the Pod log) and, squeezed to at
most 4096 bytes by :func:`encode_for_termination`, to the termination message
that Kubernetes keeps in the Pod status. The operator reads the second one with
:func:`parse_result`.

Digests are comparable only under equal fingerprint hashes: the fingerprint
names everything that legitimately changes the bits a healthy device computes
(device model, driver, library versions, thread count, check parameters).
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

SCHEMA_VERSION = 1
RESULT_KIND = "sdcprobe.result"
BASELINE_KIND = "sdcprobe.baseline"
#: Kubernetes truncates termination messages beyond this many bytes.
TERMINATION_LIMIT = 4096

Verdict = Literal["pass", "fail", "inconclusive"]
BackendName = Literal["cpu", "cuda", "xla"]
BaselineStatus = Literal["match", "mismatch", "absent", "fingerprint-mismatch"]

HexDigest = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
"""A sha256 digest as 64 lowercase hex characters."""
# Check names are dictionary keys; bounding them bounds the termination message.
CheckName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")]
# Fingerprint fields are version strings and device names: printable ASCII,
# bounded, so the fingerprint always fits in a termination message.
ShortText = Annotated[str, StringConstraints(pattern=r"^[\x20-\x7e]{0,128}$")]
MetricValue = int | float | str | None
DeviceId = Annotated[str, StringConstraints(pattern=r"^[\x21-\x7e]{0,96}$")]
"""A device UUID or serial: printable ASCII without spaces ("" when unknown)."""

_HEX = frozenset("0123456789abcdef")


class ResultError(ValueError):
    """A termination message that is not a usable probe result.

    ``reason`` says what was wrong in words a person can act on.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Closed(BaseModel):
    # Schema version 1 is closed: an unknown field is an error, so a typo or a
    # newer probe never passes silently. Fields added within version 1 are
    # optional with defaults (``seed``, ``plan``); anything else needs a new version.
    model_config = ConfigDict(extra="forbid")


class Fingerprint(_Closed):
    """What a healthy device's bits depend on. Equal hashes => comparable digests."""

    hash: HexDigest = Field(description="sha256 over every other field (canonical JSON).")
    backend: BackendName
    device_model: ShortText = Field(description="e.g. 'NVIDIA H100 80GB HBM3', 'TPU v5e'.")
    device_count: int = Field(ge=0, description="Devices screened on this node.")
    driver: ShortText | None = Field(description="Kernel driver version, when known.")
    runtime: ShortText | None = Field(description="CUDA / PJRT / Neuron runtime version.")
    torch: ShortText
    torch_xla: ShortText | None
    cpu_isa: ShortText = Field(description="CPU architecture and the SIMD level torch uses.")
    threads: int = Field(ge=0, description="Intra-op threads per device worker.")
    config_hash: ShortText = Field(description="Hash of the check parameters.")

    @staticmethod
    def hash_fields(fields: dict[str, Any]) -> str:
        """The fingerprint hash of ``fields`` (every field except ``hash``)."""
        body = {k: v for k, v in fields.items() if k != "hash"}
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    @classmethod
    def build(cls, **fields: Any) -> Fingerprint:
        """A fingerprint from its fields, with the hash computed."""
        return cls(hash=cls.hash_fields(fields), **fields)

    def expected_hash(self) -> str:
        """The hash these fields should carry."""
        return self.hash_fields(self.model_dump(exclude={"hash"}))


class CheckResult(_Closed):
    """The outcome of one check (compute, collective, memory, golden)."""

    verdict: Verdict
    reason: str = ""
    digest: HexDigest | None = Field(
        default=None,
        description="Digest of everything the check computed; null if it did not finish.",
    )
    metrics: dict[str, MetricValue] = Field(default_factory=dict)
    odd_device: int | None = Field(
        default=None, description="The device that disagrees, if one can be named."
    )
    first_divergent_step: int | None = None
    first_divergent_submodule: str | None = None
    baseline: BaselineStatus = "absent"

    @field_validator("digest", mode="before")
    @classmethod
    def _digest_shape(cls, value: object) -> object:
        # Give the operator a readable reason instead of a regex dump.
        if isinstance(value, str) and (len(value) != 64 or not set(value) <= _HEX):
            raise ValueError(
                f"digest must be 64 lowercase hex characters (sha256), got {len(value)} "
                f"characters{' with non-hex ones' if not set(value) <= _HEX else ''}"
            )
        return value


class Injection(_Closed):
    """Fault injection bookkeeping: a result with ``enabled`` is not a real screening."""

    enabled: bool = False
    count: int = Field(default=0, ge=0, description="Corrupted elements, all sites and devices.")
    by_site: dict[str, int] = Field(default_factory=dict)


class RunPlan(_Closed):
    """How the run spent its budget: planned from measured round costs, and what ran."""

    budget_s: float = Field(ge=0, description="The time budget asked for.")
    startup_s: float = Field(
        ge=0, description="Seconds before the plan: process start, imports, warm-up rounds."
    )
    startup_parts: dict[str, float] = Field(
        default_factory=dict,
        description="Where the start-up went (slowest device per part, seconds): launch "
        "(process start and the probe's imports), import (torch, the device runtime and "
        "its set-up), group (joining the process group), stress (holding the device busy "
        "until its power and temperature settle, CUDA), peaks (the same-run peak "
        "measurements), warmup (the timed warm-up rounds).",
    )
    planned_s: float = Field(ge=0, description="What the plan expected the whole run to take.")
    rounds: dict[CheckName, int] = Field(
        default_factory=dict, description="Planned rounds per check (golden: training steps)."
    )
    run: dict[CheckName, int] = Field(
        default_factory=dict, description="Rounds every device completed, per check."
    )
    round_ms: dict[CheckName, float] = Field(
        default_factory=dict, description="Measured cost of one round (slowest device)."
    )
    margin: float = Field(
        default=0.0,
        ge=0,
        description="Safety share added to every round's measured cost when planning, from "
        "the spread of the round times measured in this run.",
    )
    cut: list[CheckName] = Field(
        default_factory=list,
        description="Checks that stopped before their planned rounds because the next round "
        "would have ended past the check's deadline (the run stays within its budget).",
    )
    catch_p: list[float] = Field(
        default_factory=lambda: [0.01, 0.05, 0.1],
        description="Per-round activation probabilities the catch chances are given for.",
    )
    catch: dict[CheckName, list[float]] = Field(
        default_factory=dict,
        description="Per check, 1 - (1 - p)^rounds for each p in catch_p (rounds run).",
    )
    catch_target: float | None = Field(
        default=None,
        description="The catch chance the screening aims for, per check, for a fault active "
        "in catch_fraction of rounds (e.g. 0.99).",
    )
    catch_fraction: float | None = Field(
        default=None, description="The share of rounds the target's fault is active in."
    )
    rounds_needed: int | None = Field(
        default=None,
        description="Rounds every check needs to reach catch_target: the least n with "
        "1 - (1 - catch_fraction)^n >= catch_target.",
    )
    planned_target_met: bool | None = Field(
        default=None,
        description="What the plan said before any check ran: whether its rounds reach the "
        "target in every check.",
    )
    catch_chance: dict[CheckName, float] = Field(
        default_factory=dict,
        description="Per check, the chance reached: 1 - (1 - catch_fraction)^rounds run.",
    )
    target_met: bool | None = Field(
        default=None,
        description="Whether every check reached catch_target with the rounds it ran; null "
        "when no target was set or no plan ran.",
    )
    shortfall: str | None = Field(
        default=None,
        description="Which checks fell short of the target and what budget would reach it; "
        "null when the target was met.",
    )
    error: str | None = Field(default=None, description="Why no plan fitted, if none did.")

    @model_validator(mode="after")
    def _target_is_consistent(self) -> RunPlan:
        # A result that claims a target it did not reach, or chances outside [0, 1], is
        # malformed: the operator reads it as inconclusive, never as a pass.
        for name, chance in self.catch_chance.items():
            if not 0.0 <= chance <= 1.0:
                raise ValueError(f"catch_chance of {name} is {chance}, not a probability")
        if self.target_met and self.catch_target is not None:
            short = [c for c, p in self.catch_chance.items() if p < self.catch_target - 5e-5]
            if short:
                raise ValueError(
                    f"target_met is true but {', '.join(short)} reached less than "
                    f"catch_target {self.catch_target}"
                )
        return self

    overrun: str | None = Field(
        default=None,
        description="Why the run ended past its budget, if it did (the start-up, or a "
        "slow-down, left less than the rounds that always run).",
    )


class ProbeResult(_Closed):
    """The document ``sdcprobe run`` writes (stdout in full, termination message squeezed)."""

    schema_version: Literal[1] = 1
    kind: Literal["sdcprobe.result"] = "sdcprobe.result"
    verdict: Verdict
    reason: str = ""
    fingerprint: Fingerprint | None = Field(
        default=None,
        description="Null only for inconclusive runs that failed before the devices were known.",
    )
    checks: dict[CheckName, CheckResult] = Field(default_factory=dict)
    injection: Injection = Field(default_factory=Injection)
    duration_s: float = Field(default=0.0, ge=0)
    truncated: bool = False
    seed: int | None = Field(
        default=None,
        description="The seed of the rounds a baseline covers (shared by the fleet's nodes).",
    )
    data_seed: int | None = Field(
        default=None,
        description="The seed of every later round: the screening's own data, judged "
        "without a baseline (equal to seed unless the run was given --data-seed).",
    )
    devices: list[DeviceId] = Field(
        default_factory=list,
        max_length=64,
        description="Each device's UUID or serial by device index ('' where unknown); "
        "empty when the runtime names none.",
    )
    plan: RunPlan | None = Field(
        default=None, description="Budget, planned and completed rounds, catch chances."
    )

    @model_validator(mode="after")
    def _verdict_is_backed(self) -> ProbeResult:
        if self.verdict == "inconclusive":
            return self
        if self.fingerprint is None:
            raise ValueError(f"verdict {self.verdict!r} without a fingerprint")
        if self.verdict == "pass":
            if not self.checks:
                raise ValueError("verdict 'pass' without any check")
            for name, check in self.checks.items():
                if check.verdict != "pass":
                    raise ValueError(f"verdict 'pass' but check {name!r} is {check.verdict!r}")
                if check.digest is None:
                    raise ValueError(f"verdict 'pass' but check {name!r} has no digest")
        return self

    def exit_code(self) -> int:
        """0 pass, 1 SDC detected, 2 inconclusive."""
        return {"pass": 0, "fail": 1, "inconclusive": 2}[self.verdict]


class Baseline(_Closed):
    """Golden digests recorded from a healthy run, valid under one fingerprint."""

    schema_version: Literal[1] = 1
    kind: Literal["sdcprobe.baseline"] = "sdcprobe.baseline"
    fingerprint: Fingerprint
    seed: int | None = Field(
        default=None, description="The seed the digests were recorded with (in config_hash too)."
    )
    digests: dict[CheckName, HexDigest]
    step_digests: dict[CheckName, list[str]] = Field(
        default_factory=dict,
        description="Compact per-step digests (16 hex chars) that locate the first divergent step.",
    )


def _first_error(exc: ValidationError) -> str:
    errors = exc.errors()
    parts = []
    for err in errors[:3]:
        where = ".".join(str(p) for p in err["loc"]) or "document"
        parts.append(f"{where}: {err['msg']}")
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return "; ".join(parts) + more


def parse_result(text: str) -> ProbeResult:
    """Parse a termination message or stdout line into a :class:`ProbeResult`.

    Raises :class:`ResultError` with a readable reason for an empty message, text that
    is not JSON (or JSON cut short), another kind of document, an unknown
    ``schema_version``, a pass without digests, a malformed digest, or a fingerprint
    whose hash does not cover its fields.
    """
    if not isinstance(text, str):
        raise ResultError(f"expected text, got {type(text).__name__}")
    stripped = text.strip()
    if not stripped:
        raise ResultError(
            "empty termination message: the probe wrote no result "
            "(crashed, was killed, or ran out of time before finishing)"
        )
    try:
        doc = json.loads(stripped)
    except RecursionError as exc:
        raise ResultError("result JSON is nested too deeply to be a probe result") from exc
    except json.JSONDecodeError as exc:
        if stripped.startswith("{") and not stripped.endswith("}"):
            raise ResultError(
                f"result JSON is truncated after {len(stripped.encode())} bytes "
                "(was the termination message cut by a size limit?)"
            ) from exc
        snippet = stripped[:40].encode("unicode_escape").decode()
        raise ResultError(f"result is not JSON ({exc.msg} at char {exc.pos}): {snippet!r}") from exc
    if not isinstance(doc, dict):
        raise ResultError(f"result must be a JSON object, got {type(doc).__name__}")
    if doc.get("kind") != RESULT_KIND:
        raise ResultError(
            f"not an sdcprobe result: kind is {doc.get('kind')!r}, expected {RESULT_KIND!r}"
        )
    version = doc.get("schema_version")
    # `type(...) is int`: JSON true and 1.0 equal 1 in Python but are not version 1.
    if type(version) is not int or version != SCHEMA_VERSION:
        raise ResultError(
            f"unknown schema_version {version!r}: this reader understands {SCHEMA_VERSION}; "
            "upgrade the operator or pin the probe image"
        )
    try:
        result = ProbeResult.model_validate(doc)
    except ValidationError as exc:
        raise ResultError(f"invalid result: {_first_error(exc)}") from exc
    fp = result.fingerprint
    if fp is not None and fp.hash != fp.expected_hash():
        raise ResultError(
            "fingerprint hash does not match its fields (document altered or corrupt)"
        )
    return result


def parse_baseline(text: str) -> Baseline:
    """Parse a baseline document; raises :class:`ResultError` with a reason."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ResultError(f"baseline is not JSON ({exc.msg} at char {exc.pos})") from exc
    if not isinstance(doc, dict) or doc.get("kind") != BASELINE_KIND:
        kind = doc.get("kind") if isinstance(doc, dict) else type(doc).__name__
        raise ResultError(f"not an sdcprobe baseline: kind is {kind!r}, expected {BASELINE_KIND!r}")
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise ResultError(f"unknown baseline schema_version {doc.get('schema_version')!r}")
    try:
        baseline = Baseline.model_validate(doc)
    except ValidationError as exc:
        raise ResultError(f"invalid baseline: {_first_error(exc)}") from exc
    if baseline.fingerprint.hash != baseline.fingerprint.expected_hash():
        raise ResultError("baseline fingerprint hash does not match its fields")
    return baseline


def _size(doc: dict[str, Any]) -> int:
    return len(json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode())


def _clip(text: str, chars: int) -> str:
    if len(text) <= chars:
        return text
    return text[: chars - 1] + "…" if chars > 0 else ""


def encode_for_termination(result: ProbeResult, limit: int = TERMINATION_LIMIT) -> str:
    """Compact JSON of ``result`` that is at most ``limit`` bytes of UTF-8.

    Detail is dropped in order until it fits, and ``truncated`` is set: metrics
    first, then reasons are shortened, then injection sites, then (only for
    absurdly many checks) whole check entries, failing ones kept first. Verdicts,
    digests and the fingerprint hash survive every step but the last, and the
    output always parses with :func:`parse_result`.
    """
    doc = result.model_dump(mode="json")
    if _size(doc) <= limit:
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
    doc["truncated"] = True
    checks: dict[str, dict[str, Any]] = doc["checks"]

    def reduced() -> dict[str, Any] | None:
        return doc if _size(doc) <= limit else None

    for check in checks.values():
        check["metrics"] = {}
    if (out := reduced()) is not None:
        return json.dumps(out, separators=(",", ":"), ensure_ascii=False)
    if doc.get("plan"):  # keep the budget, rounds, the target's outcome and any error
        doc["plan"]["round_ms"], doc["plan"]["catch"] = {}, {}
        doc["plan"]["startup_parts"] = {}
        if doc["plan"].get("shortfall"):
            doc["plan"]["shortfall"] = _clip(doc["plan"]["shortfall"], 200)
        if (out := reduced()) is not None:
            return json.dumps(out, separators=(",", ":"), ensure_ascii=False)
    for chars in (160, 64, 24, 0):
        doc["reason"] = _clip(doc["reason"], max(chars, 120))
        for check in checks.values():
            check["reason"] = _clip(check["reason"], chars)
            if check["first_divergent_submodule"] is not None:
                sub = check["first_divergent_submodule"]
                check["first_divergent_submodule"] = _clip(sub, max(chars, 24))
        if (out := reduced()) is not None:
            return json.dumps(out, separators=(",", ":"), ensure_ascii=False)
    doc["injection"]["by_site"] = {}
    if (out := reduced()) is not None:
        return json.dumps(out, separators=(",", ":"), ensure_ascii=False)
    doc["devices"] = []
    if (out := reduced()) is not None:
        return json.dumps(out, separators=(",", ":"), ensure_ascii=False)
    # Last resort: keep as many check entries as fit, the ones that explain the
    # verdict first. A real run has three checks and never gets here.
    rank = {"fail": 0, "inconclusive": 1, "pass": 2}
    ordered = sorted(checks.items(), key=lambda kv: (rank[kv[1]["verdict"]], kv[0]))
    doc["checks"] = {}
    omitted = 0
    for name, check in ordered:
        doc["checks"][name] = check
        if _size(doc) > limit - 64:  # leave room for the note below
            del doc["checks"][name]
            omitted += 1
    if omitted:
        note = f" [{omitted} of {len(ordered)} checks omitted; full result in the log]"
        doc["reason"] = (
            _clip(doc["reason"], 120 - len(note)) + note if doc["reason"] else note.strip()
        )
    if _size(doc) > limit:  # only an absurd limit gets here
        doc["reason"] = ""
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
