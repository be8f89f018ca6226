"""The objects the plugin reads, decoded once where they come in.

sdcguard's own resources decode into their API models (:mod:`sdcguard.api`). Of the core
objects the plugin reads only a few fields of Nodes and Events; they get small models of
their own here, kept beside the body for the domain's decoders that take a Node body
(``NodeFacts.from_body``, ``NodeSnapshot.from_body``)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field, TypeAdapter

from sdcguard.api import ApiModel, ObjectMeta
from sdcguard.domain import keys

_TIME = TypeAdapter(dt.datetime)


def wire_time(value: dt.datetime | None) -> str | None:
    """A timestamp as the operator writes it (pydantic's JSON form, "Z" for UTC): what
    ``-o json|yaml`` shows for a time read from an object."""
    return None if value is None else str(_TIME.dump_python(value, mode="json"))


def wire(model: BaseModel) -> dict[str, Any]:
    """A nested API value (a failure, a workload, a retirement) as the object carries it:
    camelCase, unset optional fields left out."""
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


class _Taint(ApiModel):
    key: str = ""
    effect: str = ""
    value: str | None = None


class _NodeSpec(ApiModel):
    taints: list[_Taint] = Field(default_factory=list)


class _NodeBody(ApiModel):
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: _NodeSpec = Field(default_factory=_NodeSpec)


@dataclass(frozen=True)
class Node:
    """A Node: the metadata and taints the plugin reads, and the body it came from."""

    metadata: ObjectMeta
    taint_keys: frozenset[str]
    body: Mapping[str, Any]
    dra_devices: tuple[tuple[str, int], ...] = ()
    """(driver, devices) its ResourceSlices publish (a DRA-only node's devices)."""

    @classmethod
    def from_body(
        cls, body: Mapping[str, Any], dra_devices: tuple[tuple[str, int], ...] = ()
    ) -> Node:
        decoded = _NodeBody.model_validate(body)
        return cls(
            decoded.metadata, frozenset(t.key for t in decoded.spec.taints), body, dra_devices
        )

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def labels(self) -> dict[str, str]:
        return self.metadata.labels

    @property
    def annotations(self) -> dict[str, str]:
        return self.metadata.annotations

    @property
    def state(self) -> str | None:
        """The state label as written (None: the operator has not labelled the node)."""
        return self.labels.get(keys.LABEL_STATE)


class InvolvedObject(ApiModel):
    kind: str | None = None
    name: str | None = None


class Event(ApiModel):
    """A core/v1 Event, as far as a node's history shows it."""

    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    involved_object: InvolvedObject = Field(default_factory=InvolvedObject)
    reason: str | None = None
    message: str | None = None
    type: str | None = None
    count: int | None = None
    event_time: dt.datetime | None = None
    last_timestamp: dt.datetime | None = None
    first_timestamp: dt.datetime | None = None

    @property
    def time(self) -> dt.datetime | None:
        """When it last happened: the newest of the times an Event may carry."""
        return (
            self.event_time
            or self.last_timestamp
            or self.first_timestamp
            or self.metadata.creation_timestamp
        )

    @property
    def about(self) -> tuple[str | None, str | None]:
        """(kind, name) of the object the Event is about."""
        return self.involved_object.kind, self.involved_object.name
