"""The fleet file: which simulated nodes exist, how sick they are, what load they get.

A fleet file is YAML validated by the pydantic models below. Keys are
camelCase like Kubernetes manifests. Errors become one :class:`FleetError`
line that names the file, the entry (``nodes[3] (name 'h100-b')``), the field
and what to do; the CLI prints it and exits with code 2.

Fault specs are validated with the probe's own model
(:class:`sdcprobe.faultspec.Fault`), so a spec the probe would refuse is
refused here, before any node is registered.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from sdcdev.sim.catalogue import (
    CATALOGUE,
    INSTANCE_TYPE_LABEL,
    REGION_LABEL,
    ZONE_LABEL,
    InstanceType,
)
from sdcprobe.faultspec import Fault

FLEETS_DIR = Path(__file__).resolve().parent / "fleets"
DEMO_FLEET = FLEETS_DIR / "demo.yaml"

#: Label on every Node the simulator registers; its value is the fleet's name.
FLEET_LABEL = "sim.sdcguard.dev/fleet"
#: Customer pods "run" this many seconds (annotation on the Pod).
RUN_SECONDS_ANNOTATION = "sim.sdcguard.dev/run-seconds"

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_TAINT_TEXT = re.compile(r"^(?P<key>[^=:\s]+)(=(?P<value>[^:\s]*))?:(?P<effect>\w+)$")


CLIQUE_LABEL = "nvidia.com/gpu.clique"
"""NVIDIA's NVLink clique label (GPU Feature Discovery on multi-node NVLink systems)."""


class FleetError(ValueError):
    """A fleet file that cannot be used; the one-line message says where and why."""


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True
    )


def _taint_from_text(value: object) -> object:
    """Accept kubelet ``--register-with-taints`` syntax: ``key[=value]:Effect``."""
    if isinstance(value, str):
        m = _TAINT_TEXT.match(value.strip())
        if m is None:
            raise ValueError(f"taint {value!r} is not 'key[=value]:Effect'")
        return {"key": m["key"], "value": m["value"] or "", "effect": m["effect"]}
    return value


class Taint(_Model):
    """A taint the node registers with (like kubelet ``--register-with-taints``)."""

    key: str = Field(min_length=1)
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]

    def to_k8s(self) -> dict[str, str]:
        return {"key": self.key, "value": self.value, "effect": self.effect}


TaintItem = Annotated[Taint, BeforeValidator(_taint_from_text)]


def _fault_problem(spec: Mapping[str, Any]) -> str | None:
    """What is wrong with one fault spec, judged by the probe's own model; None if fine."""
    try:
        Fault.model_validate(spec)
    except ValidationError as exc:
        parts = []
        for err in exc.errors()[:3]:
            where = ".".join(str(p) for p in err["loc"])
            parts.append(f"{where}: {err['msg']}" if where else str(err["msg"]))
        return "; ".join(parts)
    return None


class FaultProfile(_Model):
    """How a node is sick: fault specs handed to the probe, and how often they show."""

    faults: list[dict[str, Any]] = Field(min_length=1)
    """The probe's fault specs (``SDCPROBE_FAULTS`` entries), validated by the probe's model."""
    intermittent: float | None = None
    """Chance that the faults are present on a given probe run (true = 0.5); none = every run."""
    repairs_needed: int = Field(default=1, ge=1)
    """Repairs it takes to clear the faults (more than 1 makes a repeat offender)."""

    @field_validator("intermittent", mode="before")
    @classmethod
    def _flag_or_probability(cls, value: object) -> object:
        if value is True:
            return 0.5
        if value is False:
            return None
        return value

    @field_validator("intermittent")
    @classmethod
    def _probability(cls, value: float | None) -> float | None:
        if value is not None and not 0.0 < value <= 1.0:
            raise ValueError(f"intermittent must be a probability in (0, 1], got {value}")
        return value

    @field_validator("faults")
    @classmethod
    def _valid_faults(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, spec in enumerate(value):
            problem = _fault_problem(spec)
            if problem is not None:
                raise ValueError(f"invalid fault spec faults[{i}] {json.dumps(spec)}: {problem}")
        return value

    def env_value(self) -> str:
        """The ``SDCPROBE_FAULTS`` value for a probe run on this node."""
        return json.dumps({"faults": self.faults}, separators=(",", ":"), sort_keys=True)


class NodeDefaults(_Model):
    """Settings every node entry inherits unless it sets its own."""

    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[TaintItem] = Field(default_factory=list)
    cpu_devices: int = Field(default=2, ge=1, le=64)
    dra: bool | Literal["only"] = False


class NodeEntry(_Model):
    """One node (``name``) or a group of alike nodes (``namePrefix`` + ``count``)."""

    name: str | None = None
    name_prefix: str | None = None
    count: int | None = Field(default=None, ge=1, le=10000)
    instance_type: str
    zone: str | None = None
    """Default: the instance type's zones, round-robin over the group."""
    pool: str | None = None
    """Node pool name (the provider's pool label). Default: derived from the instance type."""
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[TaintItem] | None = None
    """Taints at registration; replaces ``defaults.taints`` when set."""
    cpu_devices: int | None = Field(default=None, ge=1, le=64)
    """``--cpu-devices`` for probes on this node when the pod does not set it."""
    fault_profile: FaultProfile | None = None
    dra: bool | Literal["only"] | None = None
    """Publish the node's GPUs as NVIDIA's DRA driver does (ResourceSlices of
    ``gpu.nvidia.com``); NVIDIA GPU instance types only. ``true``: the node also
    advertises its ``nvidia.com/gpu`` extended resource (a device plugin beside the
    driver); ``only``: it does not (the DRA driver alone, a DRA-only node). Default:
    ``defaults.dra``."""
    clique_size: int | None = Field(default=None, ge=1, le=10000)
    """Label the group in NVLink cliques of this many nodes, as GB200 NVL72 racks are:
    ``nvidia.com/gpu.clique=<namePrefix>.<n>`` for the n-th run of ``cliqueSize`` nodes
    (for topology budgets, ``budgets.topology``)."""

    @field_validator("instance_type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        if value not in CATALOGUE:
            raise ValueError(
                f"unknown instance type {value!r}; known: {', '.join(sorted(CATALOGUE))}"
            )
        return value

    @model_validator(mode="after")
    def _naming(self) -> NodeEntry:
        if (self.name is None) == (self.name_prefix is None):
            raise ValueError("set exactly one of 'name' or 'namePrefix' (with 'count')")
        if self.name_prefix is not None and self.count is None:
            raise ValueError("'namePrefix' needs 'count'")
        if self.name is not None and self.count not in (None, 1):
            raise ValueError("'count' goes with 'namePrefix', not 'name'")
        return self

    def node_names(self) -> list[str]:
        if self.name is not None:
            return [self.name]
        assert self.name_prefix is not None and self.count is not None
        width = max(2, len(str(self.count - 1)))
        return [f"{self.name_prefix}{i:0{width}d}" for i in range(self.count)]


class WorkloadSettings(_Model):
    """Customer pods that come and go, so nodes are busy some of the time."""

    enabled: bool = True
    namespace: str = "customer"
    arrivals_per_minute: float = Field(default=2.0, gt=0)
    """Poisson arrival rate of new customer pods."""
    mean_duration_seconds: float = Field(default=60.0, gt=0)
    """Mean of the exponential run time of a customer pod."""
    min_duration_seconds: float = Field(default=5.0, ge=0)
    full_node_fraction: float = Field(default=0.5, ge=0, le=1)
    """Share of pods that ask for all accelerators of a node (the rest ask for one)."""
    max_pending: int = Field(default=2, ge=0)
    """No new pod while this many customer pods wait unscheduled."""
    keep_finished_seconds: float = Field(default=30.0, ge=0)
    """Finished customer pods are deleted after this long."""
    seed: int = 1
    image: str = "registry.example/customer/train:2025.11"


class RepairSettings(_Model):
    """The simulated repair shop that works RepairTickets."""

    enabled: bool = True
    delay_seconds: float = Field(default=30.0, ge=0)
    """Time from seeing an open ticket to setting its resolution."""
    resolution: Literal["Repaired", "Replaced", "FalseAlarm", "Retire"] = "Repaired"
    system: str = "sim"
    """``spec.external.system`` written on tickets."""


class ProbeSettings(_Model):
    """How the simulator runs probe pods."""

    max_parallel: int | None = Field(default=None, ge=1)
    """Probe processes at a time; default: the number of CPUs."""


class FleetFile(_Model):
    """Top level of a fleet file."""

    name: str = "sim"
    seed: int = 0
    """Seeds every random choice of the simulation (intermittent faults, workloads)."""
    defaults: NodeDefaults = Field(default_factory=NodeDefaults)
    nodes: list[NodeEntry] = Field(min_length=1)
    workloads: WorkloadSettings = Field(default_factory=WorkloadSettings)
    repair: RepairSettings = Field(default_factory=RepairSettings)
    probes: ProbeSettings = Field(default_factory=ProbeSettings)

    @field_validator("name")
    @classmethod
    def _label_value(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", value):
            raise ValueError(f"fleet name {value!r} must be a short lowercase DNS label")
        return value


@dataclass(frozen=True)
class NodeConfig:
    """One simulated node, fully resolved from its entry and the defaults."""

    name: str
    entry: str
    """Where it came from, for messages: ``nodes[2] (namePrefix 'trn-')``."""
    instance_type: InstanceType
    zone: str
    pool: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    cpu_devices: int
    fault_profile: FaultProfile | None
    provider_id: str
    internal_ip: str
    hardware_name: str = ""
    """The name the host's system UUID and machine ID derive from ("": the node's name); a
    host that registers again under another Node name keeps its old one (and its
    provider_id)."""
    dra: bool = False
    """Its GPUs are published through DRA (``sdcdev.sim.dra``)."""
    dra_only: bool = False
    """...and only there: no ``nvidia.com/gpu`` in its capacity (no device plugin)."""


@dataclass(frozen=True)
class Fleet:
    """A validated fleet: resolved nodes plus simulation settings."""

    name: str
    seed: int
    nodes: tuple[NodeConfig, ...]
    workloads: WorkloadSettings
    repair: RepairSettings
    probes: ProbeSettings
    source: str

    def node(self, name: str) -> NodeConfig:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)


def _entry_label(index: int, raw: object) -> str:
    if isinstance(raw, Mapping):
        for key in ("name", "namePrefix", "name_prefix"):
            if isinstance(raw.get(key), str):
                return f"nodes[{index}] ({'name' if key == 'name' else 'namePrefix'} {raw[key]!r})"
    return f"nodes[{index}]"


def _describe(exc: ValidationError, raw: object) -> str:
    raw_nodes = raw.get("nodes") if isinstance(raw, Mapping) else None
    problems = []
    for err in exc.errors():
        loc = list(err["loc"])
        where = ""
        if len(loc) >= 2 and loc[0] == "nodes" and isinstance(loc[1], int):
            item = raw_nodes[loc[1]] if isinstance(raw_nodes, list) else None
            where = _entry_label(loc[1], item)
            loc = loc[2:]
        rest = ".".join(str(p) for p in loc)
        where = f"{where}.{rest}" if where and rest else (where or rest or "fleet")
        msg = str(err["msg"]).removeprefix("Value error, ")
        problems.append(f"{where}: {msg}")
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    return "; ".join(problems[:3]) + more


def _fake_ip(name: str) -> str:
    h = hashlib.sha256(name.encode()).digest()
    return f"10.{h[0]}.{h[1]}.{max(1, h[2] % 255)}"


def _provider_id(itype: InstanceType, zone: str, name: str) -> str:
    digest = hashlib.sha256(name.encode()).hexdigest()
    if itype.provider == "aws":
        return f"aws:///{zone}/i-0{digest[:16]}"
    return f"gce://sdcguard-sim/{zone}/{name}"


def _clique(entry: NodeEntry, name: str, index: int) -> dict[str, str]:
    """The NVLink clique label of the group's ``index``-th node, with ``cliqueSize``."""
    if not entry.clique_size:
        return {}
    group = (entry.name_prefix or name).rstrip("-.")
    return {CLIQUE_LABEL: f"{group}.{index // entry.clique_size}"}


def _resolve(
    entry: NodeEntry, index: int, label: str, fleet: FleetFile
) -> tuple[list[NodeConfig], str | None]:
    itype = CATALOGUE[entry.instance_type]
    pool = entry.pool or itype.name.replace(".", "-")
    taints = tuple(entry.taints if entry.taints is not None else fleet.defaults.taints)
    wanted = entry.dra if entry.dra is not None else fleet.defaults.dra
    dra, dra_only = bool(wanted), wanted == "only"
    if dra and (itype.accelerator_resource != "nvidia.com/gpu" or itype.accelerator_count < 1):
        return [], (
            f"dra: instance type {itype.name} has no NVIDIA GPUs; only NVIDIA GPU nodes "
            "publish ResourceSlices (driver gpu.nvidia.com)"
        )
    nodes = []
    for i, name in enumerate(entry.node_names()):
        if len(name) > 63 or not _DNS_SUBDOMAIN.match(name):
            return [], f"node name {name!r} is not a valid DNS label (lowercase, digits, '-')"
        zone = entry.zone or itype.zones[i % len(itype.zones)]
        labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            INSTANCE_TYPE_LABEL: itype.name,
            ZONE_LABEL: zone,
            REGION_LABEL: itype.region,
            itype.pool_label: pool,
            **itype.labels,
            **fleet.defaults.labels,
            **entry.labels,
            **_clique(entry, name, i),
            FLEET_LABEL: fleet.name,
        }
        nodes.append(
            NodeConfig(
                name=name,
                entry=label,
                instance_type=itype,
                zone=zone,
                pool=pool,
                labels=labels,
                taints=taints,
                cpu_devices=entry.cpu_devices or fleet.defaults.cpu_devices,
                fault_profile=entry.fault_profile,
                provider_id=_provider_id(itype, zone, name),
                internal_ip=_fake_ip(name),
                dra=dra,
                dra_only=dra_only,
            )
        )
    return nodes, None


def parse_fleet(raw: object, source: str = "fleet") -> Fleet:
    """Validate a loaded fleet document; :class:`FleetError` names the bad entry."""
    try:
        doc = FleetFile.model_validate(raw)
    except ValidationError as exc:
        raise FleetError(f"{source}: {_describe(exc, raw)}") from None
    raw_nodes = raw.get("nodes") if isinstance(raw, Mapping) else None
    seen: dict[str, str] = {}
    nodes: list[NodeConfig] = []
    for index, entry in enumerate(doc.nodes):
        item = raw_nodes[index] if isinstance(raw_nodes, Sequence) else None
        label = _entry_label(index, item)
        resolved, problem = _resolve(entry, index, label, doc)
        if problem is not None:
            raise FleetError(f"{source}: {label}: {problem}")
        for node in resolved:
            if node.name in seen:
                raise FleetError(
                    f"{source}: {label}: duplicate node name {node.name!r} "
                    f"(already defined by {seen[node.name]}); node names must be unique"
                )
            seen[node.name] = label
            nodes.append(node)
    return Fleet(
        name=doc.name,
        seed=doc.seed,
        nodes=tuple(nodes),
        workloads=doc.workloads,
        repair=doc.repair,
        probes=doc.probes,
        source=source,
    )


def load_fleet(path: str | Path) -> Fleet:
    """Read and validate a fleet file."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise FleetError(f"{p}: cannot read the fleet file ({exc.strerror})") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise FleetError(f"{p}: not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(raw, Mapping):
        raise FleetError(f"{p}: expected a mapping with a 'nodes' list at the top level")
    return parse_fleet(raw, str(p))
