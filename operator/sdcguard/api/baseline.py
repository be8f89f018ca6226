"""SDCBaseline: golden digests for one hardware+software fingerprint."""

from __future__ import annotations

import datetime as dt
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, StringConstraints, model_validator

from sdcguard.api.common import (
    API_VERSION,
    CONDITIONS_LIST,
    SET_LIST,
    ApiModel,
    ApiVersion,
    Condition,
    HexDigest,
    NodeName,
    ObjectMeta,
    cel,
    cel_rules,
)

ShortField = Annotated[str, StringConstraints(max_length=128)]
CheckKey = Annotated[str, StringConstraints(max_length=64)]
SHORT_HASH_CHARS = 12


class BaselineSource(StrEnum):
    """How the digests were established."""

    RECORDED = "Recorded"
    CONSENSUS = "Consensus"
    APPROVED = "Approved"


class FingerprintSpec(ApiModel):
    """Everything a healthy device's bits depend on. Digests compare only under equal hashes."""

    model_config = ConfigDict(
        frozen=True,
        json_schema_extra=cel_rules(
            cel(
                "!has(self.shortHash) || self.hash.startsWith(self.shortHash)",
                "spec.fingerprint.shortHash: must be the first characters of hash",
            )
        ),
    )

    hash: HexDigest
    """sha256 over the other fields, as the probe computes it."""
    short_hash: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{8,64}$")] | None = None
    """The first 12 characters of hash, for display (filled in when empty)."""
    backend: ShortField = ""
    """Probe backend: cpu, cuda or xla."""
    device_model: ShortField = ""
    """Accelerator model, e.g. NVIDIA H100 80GB HBM3."""
    device_count: int = Field(default=0, ge=0)
    """Devices per node."""
    driver: ShortField | None = None
    """Kernel driver version."""
    runtime: ShortField | None = None
    """CUDA, PJRT or Neuron runtime version."""
    torch: ShortField | None = None
    """torch version."""
    torch_xla: ShortField | None = None
    """torch-xla version."""
    cpu_isa: ShortField | None = None
    """CPU architecture and SIMD level."""
    threads: int | None = Field(default=None, ge=0)
    """Intra-op threads per device worker."""
    config_hash: ShortField | None = None
    """Hash of the check parameters."""

    @model_validator(mode="before")
    @classmethod
    def _fill_short_hash(cls, data: Any) -> Any:
        """An empty shortHash is filled in from hash (before validation: frozen)."""
        filled = isinstance(data, dict) and (data.get("shortHash") or data.get("short_hash"))
        if isinstance(data, dict) and isinstance(data.get("hash"), str) and not filled:
            rest = {k: v for k, v in data.items() if k not in ("shortHash", "short_hash")}
            return {**rest, "shortHash": data["hash"][:SHORT_HASH_CHARS]}
        return data

    @model_validator(mode="after")
    def _short_hash(self) -> FingerprintSpec:
        if self.short_hash and not self.hash.startswith(self.short_hash):
            raise ValueError("spec.fingerprint.shortHash: must be the first characters of hash")
        return self


def baseline_name(fingerprint_hash: str) -> str:
    """The SDCBaseline name for a fingerprint, so it is found by GET, not by LIST."""
    return f"fp-{fingerprint_hash[:32]}"


class SDCBaselineSpec(ApiModel):
    """Golden digests, how they were established, and whether they are trusted."""

    model_config = ConfigDict(
        frozen=True,
        json_schema_extra=cel_rules(
            cel(
                "!self.trusted || (has(self.digests) && size(self.digests) > 0)",
                "spec.digests: a trusted baseline needs at least one digest; "
                "add digests or set trusted: false",
            ),
        ),
    )

    fingerprint: FingerprintSpec = Field(
        json_schema_extra=cel_rules(
            cel(
                "self.hash == oldSelf.hash",
                "spec.fingerprint.hash is immutable; create another SDCBaseline",
            )
        )
    )
    """The fingerprint these digests belong to."""
    digests: dict[CheckKey, HexDigest] = Field(default_factory=dict, max_length=16)
    """Golden digest per check."""
    source: BaselineSource = BaselineSource.CONSENSUS
    """Recorded (named reference nodes), Consensus (K agreeing nodes) or Approved (a person)."""
    recorded_from: list[NodeName] = Field(
        default_factory=list, max_length=100, json_schema_extra=SET_LIST
    )
    """Nodes whose results established the digests (for Recorded: the reference nodes)."""
    trusted: bool = False
    """Only a trusted baseline turns a digest difference into an SDC verdict."""
    approved_by: ShortField | None = None
    """Who approved the digests (source Approved): the user ``kubectl sdc baselines approve``
    ran as, kept so that a trust no quorum established names the person behind it."""
    approved_at: dt.datetime | None = None
    """When they were approved."""

    @model_validator(mode="after")
    def _trusted_has_digests(self) -> SDCBaselineSpec:
        if self.trusted and not self.digests:
            raise ValueError(
                "spec.digests: a trusted baseline needs at least one digest; "
                "add digests or set trusted: false"
            )
        return self


class Candidate(ApiModel):
    """Digests one node reported while no baseline was trusted."""

    model_config = ConfigDict(frozen=True)

    node_name: NodeName
    """The node."""
    digests: dict[CheckKey, HexDigest] = Field(default_factory=dict, max_length=16)
    """Its digest per check."""
    test_name: Annotated[str, StringConstraints(max_length=253)] = ""
    """The SDCTest that produced them."""
    recorded_at: dt.datetime | None = None
    """When."""


class SDCBaselineStatus(ApiModel):
    """Candidates collected towards consensus, and who agrees."""

    model_config = ConfigDict(frozen=True)

    candidates: list[Candidate] = Field(default_factory=list, max_length=500)
    """One entry per node (its latest result) while the baseline is not trusted."""
    agreeing_nodes: list[NodeName] = Field(
        default_factory=list, max_length=500, json_schema_extra=SET_LIST
    )
    """Nodes whose digests equal the (leading) digests."""
    disagreeing_nodes: list[NodeName] = Field(
        default_factory=list, max_length=500, json_schema_extra=SET_LIST
    )
    """Nodes whose digests differ: suspects once the baseline is trusted."""
    conditions: list[Condition] = Field(
        default_factory=list, max_length=16, json_schema_extra=CONDITIONS_LIST
    )
    """Trusted, Contested."""


class SDCBaseline(ApiModel):
    """SDCBaseline: golden digests for one hardware+software fingerprint."""

    # Frozen, like every snapshot the reconcile reads (the operator's index keeps them):
    # a change is a model_copy, never an assignment into a shared object.
    model_config = ConfigDict(frozen=True)

    api_version: ApiVersion = API_VERSION
    kind: Literal["SDCBaseline"] = "SDCBaseline"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: SDCBaselineSpec
    status: SDCBaselineStatus | None = None
