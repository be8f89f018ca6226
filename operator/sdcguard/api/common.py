"""Building blocks shared by every sdcguard resource: the model base, durations,
conditions, object metadata and the helper that declares CEL rules.

Field docstrings are part of the API: they become the CRD ``description`` that
``kubectl explain`` shows, so they are written for the person reading it.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict, JsonValue

GROUP = "sdcguard.dev"
VERSION = "v1beta1"
"""The version the operator reads and writes, and the one the API server stores."""
OLDER_VERSIONS = ("v1alpha1",)
"""Versions still served beside ``VERSION``, with the same schema: the API server
converts between them by changing ``apiVersion`` alone (no conversion webhook), so an
older operator, CLI or training job keeps working during and after an upgrade."""
ApiVersion = Literal["sdcguard.dev/v1beta1", "sdcguard.dev/v1alpha1"]
"""An object's apiVersion: any served version (the schemas are the same)."""
API_VERSION: ApiVersion = "sdcguard.dev/v1beta1"
SERVED_API_VERSIONS: tuple[ApiVersion, ...] = ("sdcguard.dev/v1beta1", "sdcguard.dev/v1alpha1")


class ApiModel(BaseModel):
    """Base of every API object: camelCase on the wire, snake_case in Python."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
        # The API server prunes unknown fields; ignoring them here keeps an older
        # operator working against objects written by a newer one.
        extra="ignore",
    )


# Go's time.ParseDuration syntax without the sign, so a negative duration cannot
# be written at all: "90s", "30m", "1h30m", "1.5h", or "0".
DURATION_PATTERN = r"^(0|([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+)$"
Duration = Annotated[str, StringConstraints(pattern=DURATION_PATTERN, max_length=32)]
"""A Go-style duration string such as "90s", "30m", "24h" or "1h30m"."""

_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ns|us|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


@functools.lru_cache(maxsize=256)
def parse_duration(text: str) -> float:
    """Seconds in a Go-style duration string ("1h30m" -> 5400.0).

    Raises ValueError naming the accepted syntax for anything else.
    """
    if not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(
            f"invalid duration {text!r}: use a number with a unit h, m, s, ms, us or ns, "
            'e.g. "90s", "30m", "24h" or "1h30m"'
        )
    return sum(float(n) * _UNIT_SECONDS[unit] for n, unit in _DURATION_PART.findall(text))


def parse_time(value: object) -> dt.datetime | None:
    """An RFC 3339 time as Kubernetes writes them ("Z" or an offset, an optional
    fraction), or a datetime, as some clients hand them over; in UTC if it names no
    zone; None for a missing or unreadable value (never raises).

    The one time parser of sdcguard: the domain (``keys.parse_time``), the adapters,
    the CLI and the simulator read times through it."""
    if not value:
        return None
    if isinstance(value, dt.datetime):
        parsed = value
    else:
        try:
            parsed = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError:
            return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


# Kubernetes object names (DNS subdomain) and label/annotation/taint keys.
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
NodeName = Annotated[str, StringConstraints(pattern=NAME_PATTERN, min_length=1, max_length=253)]
"""A Kubernetes object name (DNS subdomain)."""
QUALIFIED_NAME_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
QualifiedName = Annotated[
    str, StringConstraints(pattern=QUALIFIED_NAME_PATTERN, min_length=1, max_length=316)
]
"""A label, annotation or taint key, optionally prefixed: "sdcguard.dev/testing"."""
HEX_DIGEST_PATTERN = r"^[0-9a-f]{64}$"
HexDigest = Annotated[str, StringConstraints(pattern=HEX_DIGEST_PATTERN)]
"""A sha256 digest as 64 lowercase hex characters."""
# A container image reference as the container runtimes parse it: an optional registry
# host (with port), lower-case path components, an optional tag and an optional digest.
_REGISTRY = (
    r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*"
    r"(?::[0-9]+)?/)?"
)
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_PATTERN = (
    rf"^{_REGISTRY}{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)
ImageReference = Annotated[str, StringConstraints(pattern=IMAGE_PATTERN, max_length=512)]
"""A container image: registry/path[:tag][@sha256:digest], path in lower case."""
URL_PATTERN = r"^https?://(?:[^\s/?#@]+@)?[^\s/?#@]+(?:[/?#][^\s]*)?$"
Url = Annotated[str, StringConstraints(pattern=URL_PATTERN, max_length=2048)]
"""An http or https URL with a host (user info before it becomes Basic auth for sinks)."""
ShortText = Annotated[str, StringConstraints(max_length=256)]
Text = Annotated[str, StringConstraints(max_length=4096)]


def cel(
    rule: str,
    message: str,
    *,
    field_path: str | None = None,
    message_expression: str | None = None,
) -> JsonDict:
    """One ``x-kubernetes-validations`` entry.

    The message names the field and the fix, because it is all a person sees when
    ``kubectl apply`` is refused. Every rule has a Python twin in a model validator
    (or, for rules on ``oldSelf``, in a ``check_update`` function) so tests and the
    operator reject the same objects the API server rejects. ``message_expression``
    (CEL returning a string) names the offending value; ``message`` stays as the
    fallback the API server shows when the expression fails.
    """
    entry: JsonDict = {"rule": rule, "message": message}
    if message_expression is not None:
        entry["messageExpression"] = message_expression
    if field_path is not None:
        entry["fieldPath"] = field_path
    return entry


def cel_rules(*rules: JsonDict) -> JsonDict:
    """``json_schema_extra`` carrying CEL rules for a model or a field."""
    entries: list[JsonValue] = list(rules)
    return {"x-kubernetes-validations": entries}


class Condition(ApiModel):
    """A Kubernetes-convention status condition."""

    model_config = ConfigDict(frozen=True)

    type: Annotated[str, StringConstraints(max_length=316, pattern=r"^[A-Za-z][A-Za-z0-9]*$")]
    """Kind of condition in CamelCase, e.g. Ready, BreakerOpen, Complete."""
    status: Literal["True", "False", "Unknown"]
    """Whether the condition holds: True, False or Unknown."""
    reason: Annotated[
        str,
        StringConstraints(
            min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
        ),
    ]
    """One CamelCase word for programs, e.g. QuorumReached."""
    message: Annotated[str, StringConstraints(max_length=32768)] = ""
    """What happened and what to do, for people."""
    last_transition_time: dt.datetime
    """When status last changed (not when the condition was last written)."""
    observed_generation: Annotated[int, Field(ge=0)] | None = None
    """The metadata.generation this condition was computed from."""


def set_condition(
    conditions: list[Condition],
    type_: str,
    status: Literal["True", "False", "Unknown"],
    reason: str,
    message: str,
    now: dt.datetime,
    observed_generation: int | None = None,
) -> list[Condition]:
    """``conditions`` with ``type_`` set; lastTransitionTime moves only when status flips."""
    previous = next((c for c in conditions if c.type == type_), None)
    since = previous.last_transition_time if previous and previous.status == status else now
    updated = Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=since,
        observed_generation=observed_generation,
    )
    return (
        [updated if c.type == type_ else c for c in conditions]
        if previous
        else [*conditions, updated]
    )


def find_condition(conditions: list[Condition], type_: str) -> Condition | None:
    """The condition of ``type_``, if present."""
    return next((c for c in conditions if c.type == type_), None)


class ObjectMeta(ApiModel):
    """The parts of Kubernetes object metadata the operator reads; others are kept as-is."""

    model_config = ConfigDict(extra="allow")

    name: str = ""
    uid: str | None = None
    generation: int | None = None
    resource_version: str | None = None
    creation_timestamp: dt.datetime | None = None
    deletion_timestamp: dt.datetime | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    finalizers: list[str] = Field(default_factory=list)


def map_list(key: str) -> JsonDict:
    """Schema extras for a list of objects keyed by ``key``: the API server refuses an
    entry whose key is listed twice, and server-side apply merges entries by it."""
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": [key]}


CONDITIONS_LIST: JsonDict = map_list("type")
"""Schema extras for a conditions list: one entry per type (server-side apply merges by type)."""
SET_LIST: JsonDict = {"x-kubernetes-list-type": "set"}
"""Schema extras for a list of unique scalars."""
