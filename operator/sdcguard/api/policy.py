"""SDCPolicy: which nodes sdcguard screens, when, with what, and what it does about failures."""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, StringConstraints, field_validator, model_validator
from pydantic.config import JsonDict

from sdcguard.api.common import (
    API_VERSION,
    CONDITIONS_LIST,
    QUALIFIED_NAME_PATTERN,
    SET_LIST,
    ApiModel,
    ApiVersion,
    Condition,
    Duration,
    ImageReference,
    NodeName,
    ObjectMeta,
    QualifiedName,
    ShortText,
    Url,
    cel,
    cel_rules,
    map_list,
    parse_duration,
)

DEFAULT_ACCELERATORS = ("nvidia.com/gpu", "aws.amazon.com/neuron", "google.com/tpu", "amd.com/gpu")
DEFAULT_GATE_TAINT = "sdcguard.dev/unqualified"
DEFAULT_TESTING_TAINT = "sdcguard.dev/testing"
DEFAULT_QUARANTINE_TAINT = "sdcguard.dev/quarantined"


class CheckName(StrEnum):
    """A probe check. Depth order (what a passing check may stand for) is in domain.judging."""

    COMPUTE = "compute"
    COLLECTIVE = "collective"
    GOLDEN = "golden"
    MEMORY = "memory"


class Suite(StrEnum):
    """A named list of checks: which one runs depends on why a node is tested."""

    ACCEPTANCE = "acceptance"
    REQUALIFICATION = "requalification"
    REPAIR_VERIFICATION = "repairVerification"


class Mode(StrEnum):
    """Observe screens and records; Enforce also taints, cordons and opens tickets."""

    OBSERVE = "Observe"
    ENFORCE = "Enforce"


class RepairStrategy(StrEnum):
    """InPlace keeps the Node for repair; Replace deletes it so the cloud replaces it."""

    IN_PLACE = "InPlace"
    REPLACE = "Replace"


class RetireAction(StrEnum):
    """What happens to a node that used up its repair cycles."""

    CORDON = "Cordon"
    DELETE = "Delete"


class BaselineMode(StrEnum):
    """How golden digests for a new fingerprint are established."""

    CONSENSUS = "Consensus"
    RECORDED = "Recorded"


LabelValue = Annotated[str, StringConstraints(max_length=63)]


class SelectorOperator(StrEnum):
    """How a matchExpressions requirement tests a label, as in Kubernetes label selectors."""

    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


SELECTOR_VALUES = (
    "spec.nodeSelector.matchExpressions[].values: In and NotIn need at least one value, "
    "Exists and DoesNotExist take none"
)


class LabelSelectorRequirement(ApiModel):
    """One requirement on a node label: key, operator and values."""

    model_config = ConfigDict(
        frozen=True,
        json_schema_extra=cel_rules(
            cel(
                "(self.operator in ['In', 'NotIn']) == (has(self.values) && size(self.values) > 0)",
                SELECTOR_VALUES,
            )
        ),
    )

    key: QualifiedName
    """The label key."""
    operator: SelectorOperator
    """In: the label has one of the values. NotIn: it is absent or has none of them.
    Exists: it is present. DoesNotExist: it is absent."""
    values: tuple[LabelValue, ...] = Field(default=(), max_length=64)
    """Values for In and NotIn; empty for Exists and DoesNotExist."""

    @model_validator(mode="after")
    def _values_fit_the_operator(self) -> LabelSelectorRequirement:
        wants = self.operator in (SelectorOperator.IN, SelectorOperator.NOT_IN)
        if wants != bool(self.values):
            raise ValueError(SELECTOR_VALUES)
        return self


class NodeSelector(ApiModel):
    """Which nodes the policy covers: a Kubernetes label selector (matchLabels and
    matchExpressions, all of which must hold)."""

    match_labels: dict[QualifiedName, LabelValue] = Field(default_factory=dict, max_length=32)
    """Labels a node must carry, all of them. Empty (and no matchExpressions): every node
    with an accelerator."""
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list, max_length=32)
    """Requirements on node labels, all of which must hold, e.g. {key:
    node.kubernetes.io/instance-type, operator: In, values: [p5.48xlarge, p4d.24xlarge]}."""


class ReturnFromUse(ApiModel):
    """Re-screen a qualified node after a workload used it and left it idle."""

    enabled: bool = True
    """Screen nodes again when they return from use."""
    idle_for: Duration = "30m"
    """How long a node must be idle (no pod using accelerators) before it is screened."""


class OverdueAction(StrEnum):
    """What happens to a node whose qualification is overdue."""

    WARN = "Warn"
    """Label and count it (sdcguard.dev/overdue), and wait for an idle window."""
    DRAIN = "Drain"
    """Hold it (the testing taint: no new work lands), screen it once its running work
    ends, and drain it after gracePeriod if the work has not ended by then."""


class OverdueTrigger(ApiModel):
    """Force the re-screening of a node kept busy past maxQualificationAge."""

    action: OverdueAction = OverdueAction.WARN
    """Warn (the default) only labels, counts and alerts; Drain holds the node and
    screens it when its work ends, draining it after gracePeriod."""
    grace_period: Duration = "24h"
    """With action Drain: how long a held overdue node's running work may go on before
    its pods are evicted (PodDisruptionBudgets are honoured) so it can be screened."""


class Triggers(ApiModel):
    """When nodes are screened."""

    on_join: bool = True
    """Gate new nodes and admit them only after the acceptance suite passes."""
    on_return_from_use: ReturnFromUse = Field(default_factory=ReturnFromUse)
    """Screen a node that was used since its last qualification once it is idle."""
    max_qualification_age: Duration = Field(
        default="168h",
        json_schema_extra=cel_rules(
            cel(
                "self == '0' || duration(self) >= duration('1m')",
                'spec.triggers.maxQualificationAge: must be "0" (never expire) or at least 1m, '
                'e.g. "168h"',
            )
        ),
    )
    """A qualification older than this is renewed in the node's next idle window. "0": never.
    Until then the node is Overdue (the sdcguard.dev/overdue label); see overdue."""
    overdue: OverdueTrigger = Field(default_factory=OverdueTrigger)
    """What to do with an Overdue node: only warn (default), or hold and drain it."""
    on_suspect: bool = True
    """Honour the sdcguard.dev/suspect node annotation that workloads and people set."""
    hold_suspects: bool = True
    """Reserve a node reported suspect at once (the testing taint: running work finishes,
    no new work lands), so it is re-screened before it takes more work. Off: it stays
    schedulable and is re-screened in its next idle window, after pending pods."""
    inconclusive_backoff: Duration = "10m"
    """Wait before re-screening after an inconclusive result; doubles per repeat, up to 16x."""

    @field_validator("max_qualification_age")
    @classmethod
    def _age_positive(cls, value: str) -> str:
        if value != "0" and parse_duration(value) < 60:
            raise ValueError(
                'spec.triggers.maxQualificationAge: must be "0" (never expire) or at least 1m, '
                'e.g. "168h"'
            )
        return value


def _unique_checks_rule(path: str) -> JsonDict:
    return {
        "minItems": 1,
        "maxItems": 8,
        **cel_rules(
            cel(
                "self.all(c, self.exists_one(d, d.name == c.name))",
                f"{path}: check names must be unique within a suite; list each check once",
            )
        ),
    }


CHECK_PARAMS: dict[CheckName, tuple[str, ...]] = {
    CheckName.COMPUTE: (),
    CheckName.COLLECTIVE: (),
    CheckName.GOLDEN: ("steps",),
    CheckName.MEMORY: ("memory-fraction", "memory-mib"),
}
"""The probe flags (``sdcprobe run --NAME VALUE``) each check's ``params`` may set: the
ones that shape that check alone. Flags of the whole run (threads, stress) go in
spec.probe.args; the memory dwell is spec.probe.memoryDwellSeconds. A test holds this
table to the probe's own parser."""

_PARAMS_CEL_MAP = (
    "{"
    + ", ".join(
        f"'{check.value}': [{', '.join(repr(p) for p in names)}]"
        for check, names in CHECK_PARAMS.items()
    )
    + "}"
)
_PARAMS_HINT = "; ".join(
    f"{check.value}: {', '.join(names) or 'none'}" for check, names in CHECK_PARAMS.items()
)


def unknown_params_message(check: str, unknown: list[str]) -> str:
    """The refusal of params that ``check`` does not take, naming them (the same words
    as the CEL rule's messageExpression)."""
    return (
        f"spec.suites[].params: check {check} takes no parameter {', '.join(unknown)} "
        f"(known: {_PARAMS_HINT}; run-wide probe flags go in spec.probe.args)"
    )


class CheckSpec(ApiModel):
    """One check of a suite."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                f"!has(self.params) || self.params.all(k, k in {_PARAMS_CEL_MAP}[self.name])",
                "spec.suites[].params: a parameter this check does not take "
                f"(known: {_PARAMS_HINT}; run-wide probe flags go in spec.probe.args)",
                message_expression=(
                    "'spec.suites[].params: check ' + self.name + ' takes no parameter ' + "
                    f"self.params.filter(k, !(k in {_PARAMS_CEL_MAP}[self.name]))[0] + "
                    f"' (known: {_PARAMS_HINT}; run-wide probe flags go in spec.probe.args)'"
                ),
            )
        )
    )

    name: CheckName
    """The check: compute, collective, golden or memory."""
    params: dict[Annotated[str, StringConstraints(max_length=63)], int | ShortText] = Field(
        default_factory=dict, max_length=32
    )
    """Check parameters passed to the probe as its flags (--NAME VALUE), as integers or
    strings (quote fractions: "0.9"). Each check takes only its own: golden: steps
    (training steps); memory: memory-fraction (share of free device memory, up to 0.95)
    and memory-mib (MiB per device instead); compute and collective: none. Any other
    name is refused when the policy is applied."""

    @model_validator(mode="after")
    def _known_params(self) -> CheckSpec:
        unknown = sorted(k for k in self.params if k not in CHECK_PARAMS[self.name])
        if unknown:
            raise ValueError(unknown_params_message(self.name.value, unknown))
        return self


def _checks(*names: CheckName) -> list[CheckSpec]:
    return [CheckSpec(name=n) for n in names]


def _acceptance() -> list[CheckSpec]:
    # Memory too: a new node is idle anyway, and every node then contributes the memory
    # digest to the fingerprint's baseline (repair verification needs it trusted).
    return _checks(CheckName.COMPUTE, CheckName.COLLECTIVE, CheckName.GOLDEN, CheckName.MEMORY)


def _requalification() -> list[CheckSpec]:
    return _checks(CheckName.COMPUTE, CheckName.COLLECTIVE, CheckName.GOLDEN)


def _repair_verification() -> list[CheckSpec]:
    return [CheckSpec(name=n) for n in CheckName]


REPAIR_VERIFICATION_BUDGET_FACTOR = 1.5
"""repairVerification's default budget, as a multiple of spec.probe.budgetSeconds.

The probe fills its budget with rounds, so a fault active in a share f of rounds is
missed with chance (1 - f)^rounds: 1.5 times the rounds turns a miss chance m into
m^1.5 (0.01 becomes 0.001). A repaired node is exactly the one most likely to still
be bad, and verification runs once per repair (a few in a thousand devices a year),
so the extra node-time is small fleet-wide. 1.5 rather than 2 keeps the default 900 s
budget's verification (1350 s) inside the default 1800 s activeDeadlineSeconds with
room for the Pod's start; a larger budget is capped at that deadline."""


class SuiteBudgets(ApiModel):
    """Seconds the probe plans each suite for. Unset: spec.probe.budgetSeconds, except
    repairVerification: 1.5 times it (within activeDeadlineSeconds), so a repaired node
    is screened harder than a new one."""

    acceptance: int | None = Field(default=None, ge=5, le=86400)
    """Budget of the acceptance suite (new nodes)."""
    requalification: int | None = Field(default=None, ge=5, le=86400)
    """Budget of the requalification suite (return from use, expiry, suspicion)."""
    repair_verification: int | None = Field(default=None, ge=5, le=86400)
    """Budget of the repairVerification suite (repaired nodes)."""


class Suites(ApiModel):
    """The checks run for each reason a node is tested."""

    acceptance: list[CheckSpec] = Field(
        default_factory=_acceptance, json_schema_extra=_unique_checks_rule("spec.suites.acceptance")
    )
    """Run on nodes that join the cluster before they take any work."""
    requalification: list[CheckSpec] = Field(
        default_factory=_requalification,
        json_schema_extra=_unique_checks_rule("spec.suites.requalification"),
    )
    """Run on qualified nodes that return from use, expire or are suspected; also re-runs."""
    repair_verification: list[CheckSpec] = Field(
        default_factory=_repair_verification,
        json_schema_extra=_unique_checks_rule("spec.suites.repairVerification"),
    )
    """Run on repaired nodes before they return; make it the strictest suite."""
    budget_seconds: SuiteBudgets = Field(default_factory=SuiteBudgets)
    """Each suite's own budget; each must fit in spec.probe.activeDeadlineSeconds."""

    @model_validator(mode="after")
    def _unique_and_present(self) -> Suites:
        for alias, checks in (
            ("acceptance", self.acceptance),
            ("requalification", self.requalification),
            ("repairVerification", self.repair_verification),
        ):
            if not checks:
                raise ValueError(f"spec.suites.{alias}: list at least one check")
            names = [c.name for c in checks]
            if len(set(names)) != len(names):
                raise ValueError(
                    f"spec.suites.{alias}: check names must be unique within a suite; "
                    "list each check once"
                )
        return self

    def checks(self, suite: Suite) -> list[CheckSpec]:
        """The checks of ``suite``."""
        return {
            Suite.ACCEPTANCE: self.acceptance,
            Suite.REQUALIFICATION: self.requalification,
            Suite.REPAIR_VERIFICATION: self.repair_verification,
        }[suite]


Quantity = int | Annotated[str, StringConstraints(max_length=64)]


DEFAULT_PROBE_REQUESTS = {"cpu": "1", "memory": "2Gi"}
"""CPU and memory the probe container requests when the policy names none, so its Pod is
never BestEffort (the first evicted under memory pressure)."""


class ResourceList(ApiModel):
    """Requests and limits of the probe container (CPU, memory); accelerators are added."""

    requests: dict[Annotated[str, StringConstraints(max_length=253)], Quantity] = Field(
        default_factory=dict, max_length=16
    )
    """Minimum resources, e.g. cpu: "4", memory: 16Gi. cpu and memory not named here are
    requested as cpu: "1" and memory: 2Gi, so the probe Pod is never BestEffort."""
    limits: dict[Annotated[str, StringConstraints(max_length=253)], Quantity] = Field(
        default_factory=dict, max_length=16
    )
    """Maximum resources. The node's accelerators are always requested in full."""


class ShortfallAction(StrEnum):
    """What a screening does when its budget cannot reach the catch target."""

    FLAG = "Flag"
    REFUSE = "Refuse"


CATCH_CHANCE_RANGE = (
    "spec.probe.catchTarget.chance: must be above 0 and below 1, e.g. 0.99 (a chance of 1 "
    "would need endless rounds)"
)
CATCH_FRACTION_RANGE = (
    "spec.probe.catchTarget.activeFraction: must be above 0 and at most 1, e.g. 0.05 for "
    "a fault active in one round in twenty"
)


class CatchTarget(ApiModel):
    """The chance every check of a screening must reach of catching a fault that is
    active in a given share of its rounds. The probe sizes each check's rounds for it
    and says before any check runs whether the budget reaches it; the SDCTest records
    the chance each check reached (status.checks[].catchChance, status.catchTargetMet)."""

    chance: float = Field(
        default=0.99,
        ge=0.0,
        le=1.0,
        json_schema_extra=cel_rules(cel("self > 0.0 && self < 1.0", CATCH_CHANCE_RANGE)),
    )
    """Catch chance per check, strictly between 0 and 1, e.g. 0.99."""
    active_fraction: float = Field(
        default=0.05,
        ge=0.0,
        le=1.0,
        json_schema_extra=cel_rules(cel("self > 0.0", CATCH_FRACTION_RANGE)),
    )
    """Share of rounds the fault is active in, above 0 and at most 1, e.g. 0.05 for a
    fault that corrupts one round in twenty. Smaller shares need more rounds: 0.99 at
    0.05 needs 90 rounds of every check."""
    on_shortfall: ShortfallAction = ShortfallAction.FLAG
    """Flag: run anyway; the test records the shortfall (condition CatchTargetMet False,
    reason CatchShortfall) and says what budget would reach the target. Refuse: run no
    check; the test ends Inconclusive (CatchShortfall) with the budget that would."""

    @model_validator(mode="after")
    def _in_range(self) -> CatchTarget:
        # OpenAPI v3.0 has no exclusive numeric bounds: CEL says these in the cluster.
        if not 0.0 < self.chance < 1.0:
            raise ValueError(CATCH_CHANCE_RANGE)
        if not 0.0 < self.active_fraction <= 1.0:
            raise ValueError(CATCH_FRACTION_RANGE)
        return self


class TolerationOperator(StrEnum):
    """How a toleration matches a taint's value, as in Kubernetes."""

    EXISTS = "Exists"
    EQUAL = "Equal"


TolerationKey = Annotated[
    str, StringConstraints(pattern="^$|" + QUALIFIED_NAME_PATTERN, max_length=316)
]
TOLERATION_EXISTS_VALUE = "spec.probe.tolerations[].value: operator Exists takes no value"
TOLERATION_SECONDS_EFFECT = (
    "spec.probe.tolerations[].tolerationSeconds: applies to effect NoExecute only; "
    "set effect: NoExecute or drop tolerationSeconds"
)


class Toleration(ApiModel):
    """A Kubernetes toleration for the probe Pod (core/v1 Toleration)."""

    model_config = ConfigDict(
        frozen=True,
        json_schema_extra=cel_rules(
            cel(
                "!has(self.operator) || self.operator != 'Exists' "
                "|| !has(self.value) || self.value == ''",
                TOLERATION_EXISTS_VALUE,
            ),
            cel(
                "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
                TOLERATION_SECONDS_EFFECT,
            ),
        ),
    )

    key: TolerationKey = ""
    """The taint key it tolerates. Empty would tolerate every taint (sdcguard's
    quarantine taint too) and is refused."""
    operator: TolerationOperator = TolerationOperator.EQUAL
    """Equal: the taint's value must equal value. Exists: any value."""
    value: LabelValue = ""
    """The taint value for operator Equal; empty for Exists."""
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""
    """The taint effect it tolerates; empty: every effect."""
    toleration_seconds: int | None = Field(default=None, ge=0, le=31536000)
    """Effect NoExecute only: how long the Pod stays once the taint is added."""

    @model_validator(mode="after")
    def _operator_and_seconds(self) -> Toleration:
        if self.operator == TolerationOperator.EXISTS and self.value:
            raise ValueError(TOLERATION_EXISTS_VALUE)
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError(TOLERATION_SECONDS_EFFECT)
        return self

    def tolerates(self, key: str, value: str, effect: str) -> bool:
        """Whether this toleration matches a taint (key, value, effect), by the
        Kubernetes rules: an empty effect matches every effect, an empty key (with
        Exists) every key, Exists any value, Equal only the same value."""
        if self.effect and self.effect != effect:
            return False
        if self.key and self.key != key:
            return False
        if self.operator == TolerationOperator.EXISTS:
            return True
        return self.value == value

    def pod_toleration(self) -> dict[str, str | int]:
        """The toleration as the Pod spec writes it (empty fields left out)."""
        out: dict[str, str | int] = {"operator": self.operator.value}
        if self.key:
            out["key"] = self.key
        if self.value:
            out["value"] = self.value
        if self.effect:
            out["effect"] = self.effect
        if self.toleration_seconds is not None:
            out["tolerationSeconds"] = self.toleration_seconds
        return out


def _default_tolerations() -> list[Toleration]:
    return [Toleration(key=key, operator=TolerationOperator.EXISTS) for key in DEFAULT_ACCELERATORS]


RESERVED_POD_KEYS = (
    "app.kubernetes.io/component",
    "app.kubernetes.io/managed-by",
    "karpenter.sh/do-not-disrupt",
)
"""Labels and annotations of the probe Pod that sdcguard sets itself (with every key
in the sdcguard.dev/ domain): spec.probe.labels and annotations may not name them."""
_RESERVED_KEYS_CEL = (
    "self.all(k, !k.startsWith('sdcguard.dev/') && !(k in ["
    + ", ".join(f"'{k}'" for k in RESERVED_POD_KEYS)
    + "]))"
)


def reserved_keys_message(field: str) -> str:
    """The refusal of a probe Pod label or annotation key that sdcguard sets itself."""
    return (
        f"spec.probe.{field}: keys in the sdcguard.dev/ domain and "
        f"{', '.join(RESERVED_POD_KEYS)} are set by sdcguard on the probe Pod; pick another key"
    )


def _reserved_keys_rule(field: str) -> JsonDict:
    return cel_rules(cel(_RESERVED_KEYS_CEL, reserved_keys_message(field)))


def _no_reserved_keys(keys: dict[str, str], field: str) -> None:
    if any(k.startswith("sdcguard.dev/") or k in RESERVED_POD_KEYS for k in keys):
        raise ValueError(reserved_keys_message(field))


QUARANTINE_TOLERATION = (
    "spec.probe.tolerations: a toleration must not match sdcguard's quarantine taint "
    "(the key in spec.taints.quarantine, or an empty key, which tolerates every taint): a "
    "probe must never land on a quarantined node it was not sent to; name the foreign "
    "taint's key instead"
)


class ProbeSpec(ApiModel):
    """The probe Job that runs the checks on a node."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                "self.activeDeadlineSeconds >= self.budgetSeconds",
                "spec.probe.activeDeadlineSeconds: must be at least budgetSeconds (defaults: "
                "1800 and 900), or the Job is killed before the probe's own budget runs out",
            )
        )
    )

    image: ImageReference | None = None
    """Probe image, e.g. ghcr.io/sdcguard/sdcprobe:0.1.0 or ...@sha256:<digest> (pin it: the
    image is part of the baseline fingerprint). Empty: the operator's default
    (SDCGUARD_DEFAULT_PROBE_IMAGE)."""
    command: list[Annotated[str, StringConstraints(max_length=1024)]] | None = Field(
        default=None, max_length=32
    )
    """Overrides the container's command (default: python -m sdcprobe); it must accept
    the probe's arguments (run --checks ... --budget ... --result-file ...)."""
    args: list[Annotated[str, StringConstraints(max_length=1024)]] | None = Field(
        default=None, max_length=64
    )
    """Extra arguments, added after the ones sdcguard passes (checks, budget, deadline,
    seeds, catch target, check parameters): flags of the whole run, e.g. --threads 4."""
    resources: ResourceList = Field(default_factory=ResourceList)
    """CPU and memory for the probe container."""
    cpu_devices: int = Field(default=0, ge=0, le=64)
    """Simulated devices for the probe's cpu backend (nodes without accelerators, tests)."""
    budget_seconds: int = Field(default=900, ge=5, le=86400)
    """Time the probe plans its checks for. A node too slow to start, or too loaded, for
    the rounds every plan runs still runs them over budget (its result says why); only a
    plan that cannot end before activeDeadlineSeconds is refused (Inconclusive, NoPlan)."""
    active_deadline_seconds: int = Field(default=1800, ge=60, le=172800)
    """Hard limit on the Job; when reached, the test's verdict is Timeout."""
    ttl_seconds_after_finished: int = Field(default=3600, ge=0, le=604800)
    """Seconds a finished probe Job is kept for its logs."""
    catch_target: CatchTarget = Field(default_factory=CatchTarget)
    """What every check of a screening must reach (probe flags --catch-target,
    --catch-fraction, --catch-shortfall)."""
    memory_dwell_seconds: float | None = Field(default=None, ge=0.0, le=600.0)
    """Seconds each memory pattern sits unread before it is read back, for retention
    faults (probe flag --memory-dwell). Unset: the probe's default for the device
    (see the probe's README)."""
    tolerations: list[Toleration] = Field(default_factory=_default_tolerations, max_length=32)
    """Tolerations of the probe Pod besides sdcguard's own taints and the cordon, which
    it always tolerates. A node with a NoSchedule or NoExecute taint these do not
    tolerate is not screened: it waits (ForeignTaint) with a message naming the taint.
    Default: Exists for the resource names of the default accelerators
    (nvidia.com/gpu, aws.amazon.com/neuron, google.com/tpu, amd.com/gpu), the keys GKE,
    EKS and AKS GPU and TPU pools are tainted with (GKE: nvidia.com/gpu=present:
    NoSchedule): such a taint keeps off pods that do not use the accelerator, and the
    probe uses all of it. Fixed rather than derived from spec.accelerators, so what the
    probe tolerates is what the object says; setting the list replaces the default
    (list those you still want). Refused: a toleration of the quarantine taint
    (spec.taints.quarantine) or with an empty key (it tolerates every taint)."""
    image_pull_secrets: list[NodeName] = Field(
        default_factory=list, max_length=16, json_schema_extra=SET_LIST
    )
    """Names of Secrets in the operator's namespace to pull the probe image with
    (the Pod's imagePullSecrets)."""
    runtime_class_name: NodeName | None = None
    """The probe Pod's RuntimeClass, e.g. nvidia where the GPU Operator installs the
    NVIDIA container runtime as a runtime class rather than the node's default. Empty:
    the node's default runtime."""
    priority_class_name: NodeName | None = None
    """The probe Pod's PriorityClass. Empty: the operator's setting
    (SDCGUARD_PROBE_PRIORITY_CLASS, the chart's probe.priorityClass)."""
    labels: dict[QualifiedName, LabelValue] = Field(
        default_factory=dict, max_length=32, json_schema_extra=_reserved_keys_rule("labels")
    )
    """Extra labels of the probe Pod (e.g. for a cost report or a network policy).
    Keys sdcguard sets itself (sdcguard.dev/*, app.kubernetes.io/component and
    managed-by) are refused."""
    annotations: dict[QualifiedName, Annotated[str, StringConstraints(max_length=4096)]] = Field(
        default_factory=dict, max_length=32, json_schema_extra=_reserved_keys_rule("annotations")
    )
    """Extra annotations of the probe Pod (e.g. a service mesh opt-out). Keys sdcguard
    sets itself (sdcguard.dev/*, karpenter.sh/do-not-disrupt) are refused."""

    @model_validator(mode="after")
    def _deadline_covers_budget(self) -> ProbeSpec:
        if self.active_deadline_seconds < self.budget_seconds:
            raise ValueError(
                f"spec.probe.activeDeadlineSeconds: {self.active_deadline_seconds} s must be "
                f"at least budgetSeconds ({self.budget_seconds} s), or the Job is killed "
                "before the probe's own budget runs out"
            )
        _no_reserved_keys(self.labels, "labels")
        _no_reserved_keys(self.annotations, "annotations")
        return self


_PERCENT = re.compile(r"^[0-9]+%$")
PERCENT_0_100 = r"^(100|[1-9]?[0-9])%$"
_PERCENT_0_100 = re.compile(PERCENT_0_100)


def allowed_unavailable(max_unavailable: int | str, nodes: int) -> int:
    """Nodes of a pool of ``nodes`` that ``spec.budgets.maxUnavailable`` lets sdcguard
    hold: a count, or a percent rounded down (a non-zero percent allows at least one)."""
    if isinstance(max_unavailable, int):
        return max_unavailable
    percent = int(max_unavailable.rstrip("%"))
    if percent == 0 or nodes == 0:
        return 0
    return max(1, math.floor(nodes * percent / 100))


class TopologyBudget(ApiModel):
    """A limit per topology domain: the nodes that share one value of ``labelKey``
    (an NVLink clique, a rack, a zone) form a domain, and sdcguard holds at most
    ``maxUnavailable`` of each domain's nodes at once."""

    label_key: QualifiedName
    """Label key whose values name the domains, e.g. nvidia.com/gpu.clique or
    topology.kubernetes.io/zone. A node without the label belongs to no domain of it."""
    max_unavailable: int | Annotated[str, StringConstraints(max_length=8)] = Field(
        json_schema_extra={"minimum": 0, "pattern": PERCENT_0_100}
    )
    """An int-or-string: nodes of one domain sdcguard may hold (testing or quarantined),
    as a count (1) or a percent of the domain's nodes from "0%" to "100%", rounded down
    (a non-zero percent allows one). A screening that would take a domain past it waits
    (Budget); a quarantine never waits, it uses the domain's share up."""

    @field_validator("max_unavailable")
    @classmethod
    def _count_or_percent(cls, value: int | str) -> int | str:
        return _count_or_percent(value, "topology[].maxUnavailable", "node")


class Budgets(ApiModel):
    """Limits on how much of each pool sdcguard takes away at once."""

    max_concurrent_tests: int = Field(default=2, ge=1, le=10000)
    """Tests running at the same time in one pool."""
    # Structural bounds, not CEL rules: the API server then names the value it refuses
    # ("Invalid value: \"150%\""); pattern applies to strings only, minimum to integers.
    max_unavailable: int | Annotated[str, StringConstraints(max_length=8)] = Field(
        default="10%", json_schema_extra={"minimum": 0, "pattern": PERCENT_0_100}
    )
    """An int-or-string: nodes of a pool that may be held by sdcguard (testing or
    quarantined), as a node count (3) or a percent of the pool from "0%" to "100%". A
    percent is rounded down, but a non-zero percent always allows one node so small pools
    are still screened."""
    max_unavailable_devices: int | Annotated[str, StringConstraints(max_length=8)] | None = Field(
        default=None, json_schema_extra={"minimum": 0, "pattern": PERCENT_0_100}
    )
    """An int-or-string: accelerator devices of a pool (its nodes' allocatable
    accelerators) that sdcguard may keep from work, as a device count (4) or a percent of
    them from "0%" to "100%": every device of a node it holds (testing, quarantined as a
    whole) and each device a quarantine of scope Device taints. A test that would take a
    node's devices past it waits (Budget). A quarantine is never held back by it (a bad
    device must leave service), it only uses it up. A percent is rounded down, and any
    non-zero limit lets one node be screened while no device of the pool but its own is
    out. Empty: no device limit, maxUnavailable alone applies."""
    pool_label: QualifiedName | None = None
    """Label key that groups nodes into pools (e.g. node.kubernetes.io/instance-type);
    budgets apply per pool. Empty: all nodes of the policy form one pool."""
    topology: list[TopologyBudget] = Field(
        default_factory=list,
        max_length=8,
        json_schema_extra=map_list("labelKey"),
    )
    """Budgets per topology domain, on top of the pool's: for each label key, no
    domain (the nodes sharing one value of it) has more than its maxUnavailable held.
    A key that no node of the policy carries is reported in the policy's status
    (condition TopologyKeysFound)."""

    @field_validator("topology")
    @classmethod
    def _distinct_keys(cls, value: list[TopologyBudget]) -> list[TopologyBudget]:
        keys = [t.label_key for t in value]
        twice = sorted({k for k in keys if keys.count(k) > 1})
        if twice:
            raise ValueError(
                f"spec.budgets.topology: label key {', '.join(twice)} is listed twice; "
                "give each key one maxUnavailable"
            )
        return value

    @field_validator("max_unavailable")
    @classmethod
    def _count_or_percent(cls, value: int | str) -> int | str:
        return _count_or_percent(value, "maxUnavailable", "node")

    @field_validator("max_unavailable_devices")
    @classmethod
    def _devices_count_or_percent(cls, value: int | str | None) -> int | str | None:
        return (
            None if value is None else _count_or_percent(value, "maxUnavailableDevices", "device")
        )


def _count_or_percent(value: int | str, name: str, unit: str) -> int | str:
    """A budget's value: a count that is not negative, or a percent from 0% to 100%."""
    field = f"spec.budgets.{name}"
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{field}: a {unit} count must not be negative, got {value}")
        return value
    if not _PERCENT.match(value):
        raise ValueError(
            f'{field}: must be a {unit} count like 3 or a percent like "10%", got {value!r}'
        )
    if not _PERCENT_0_100.match(value):
        raise ValueError(f"{field}: percent must be between 0% and 100%, got {value!r}")
    return value


class Confirmation(ApiModel):
    """How a first SDC verdict is confirmed before a node is quarantined."""

    reruns: int = Field(default=1, ge=0, le=5)
    """Re-runs on the same node after a first SDC verdict; one reproduced failure confirms.
    0 quarantines on the first SDC verdict."""
    require_same_check: bool = True
    """A re-run confirms only if the same check fails again."""


class QuarantineScope(StrEnum):
    """What a confirmed failure takes out of service."""

    NODE = "Node"
    DEVICE = "Device"


class Quarantine(ApiModel):
    """What quarantining a node does."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                "!self.drain || self.cordon",
                "spec.quarantine.drain: draining needs cordon: true (else pods come back); "
                "set cordon: true or drain: false",
            )
        )
    )

    taint_effect: Literal["NoSchedule", "NoExecute"] = "NoSchedule"
    """Effect of the quarantine taint. NoExecute evicts running pods that do not tolerate it."""
    cordon: bool = True
    """Also mark the node unschedulable (undone only if sdcguard cordoned it)."""
    drain: bool = False
    """Evict running pods after cordoning and tainting. Off: running work finishes on its own."""
    drain_timeout_seconds: int = Field(default=600, ge=0, le=86400)
    """How long evictions that a PodDisruptionBudget refuses (429) are retried, with
    back-off, before the drain gives up with a warning Event (the node stays quarantined)."""
    scope: QuarantineScope = QuarantineScope.NODE
    """Node: a confirmed failure taints and cordons the whole node. Device: a failure
    that the probe pins to one or a few devices writes one DRA DeviceTaintRule per device
    (resource.k8s.io) and leaves the node in service for its other devices; sdcguard
    falls back to the whole node, and says why in the ticket, when the failure names no
    device, names more than maxDeviceFraction of the node's devices, or the node's
    devices are not published in ResourceSlices (device-plugin clusters). Node is the
    default because it is safe everywhere: device taints need DRA, a DRA driver and a
    scheduler that honours DeviceTaintRules (see the README)."""
    device_taint_effect: Literal["NoSchedule", "NoExecute"] = "NoSchedule"
    """Effect of the DeviceTaintRules (scope Device). NoSchedule: no new claim is
    allocated the device; NoExecute also evicts pods whose claims use it now."""
    max_device_fraction: float = Field(default=0.5, ge=0.0, le=1.0)
    """Scope Device: a failure naming more than this share of the node's published
    devices quarantines the whole node (most of it is bad; e.g. 0.5 of 8 GPUs allows
    device taints for up to 4)."""

    @model_validator(mode="after")
    def _drain_needs_cordon(self) -> Quarantine:
        if self.drain and not self.cordon:
            raise ValueError(
                "spec.quarantine.drain: draining needs cordon: true (else pods come back); "
                "set cordon: true or drain: false"
            )
        return self


class SecretKeyRef(ApiModel):
    """A key of a Secret."""

    name: NodeName
    """Secret name."""
    namespace: NodeName
    """Secret namespace."""
    key: Annotated[str, StringConstraints(min_length=1, max_length=253)] = "token"
    """Key within the Secret."""


class TicketSink(ApiModel):
    """Where new repair tickets are announced (the RepairTicket object always exists too)."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                "self.type != 'jira' || has(self.secretRef)",
                "spec.repair.ticketSinks[].secretRef: required for type jira (the API token)",
            )
        )
    )

    type: Literal["webhook", "jira"]
    """webhook: POST the ticket as JSON; jira: create an issue through the REST API."""
    url: Url
    """Endpoint URL (http or https)."""
    secret_ref: SecretKeyRef | None = None
    """Credentials: a bearer token for webhooks, an API token for jira."""

    @model_validator(mode="after")
    def _jira_needs_secret(self) -> TicketSink:
        if self.type == "jira" and self.secret_ref is None:
            raise ValueError(
                "spec.repair.ticketSinks[].secretRef: required for type jira (the API token)"
            )
        return self


class Repair(ApiModel):
    """The repair workflow for quarantined nodes."""

    strategy: RepairStrategy = RepairStrategy.IN_PLACE
    """InPlace: keep the Node (autoscalers are told not to remove it) and wait for the ticket's
    resolution. Replace: delete the Node once the ticket is acknowledged."""
    max_repair_cycles: int = Field(default=2, ge=1, le=10)
    """Repair cycles a piece of hardware may use within repairCycleWindow: each confirmed
    failure (a quarantine, or a repair that failed verification) begins one, counted across
    tickets and Node names by the hardware's identity (SDCHardware). A failure beyond them
    retires it."""
    repair_cycle_window: Duration = "720h"
    """How far back repair cycles count toward maxRepairCycles ("0": forever). A failure
    older than the window is kept in the hardware's history but no longer counted."""
    ticket_sinks: list[TicketSink] = Field(default_factory=list, max_length=8)
    """Systems told about new tickets."""
    retire_action: RetireAction = RetireAction.CORDON
    """What retiring does: Cordon keeps the node tainted and cordoned; Delete deletes it."""


class CircuitBreaker(ApiModel):
    """Stops quarantines when too many of the screened nodes fail at once (a bad image or
    driver, not a bad fleet). Counts distinct nodes: those screened in the window, and of
    those the nodes whose SDC verdict was confirmed (reproduced by a re-run, or a single
    one with confirmation.reruns 0). Reset by hand: annotate the policy
    sdcguard.dev/reset-breaker=<new value>."""

    window: Duration = Field(
        default="1h",
        json_schema_extra=cel_rules(
            cel(
                "duration(self) > duration('0s')",
                'spec.circuitBreaker.window: must be longer than 0s, e.g. "1h"',
            )
        ),
    )
    """Sliding window of screenings the breaker looks at."""
    min_samples: int = Field(default=5, ge=1, le=10000)
    """Distinct nodes screened in the window before the breaker can trip."""
    max_failure_fraction: float = Field(default=0.5, ge=0.0, le=1.0)
    """Trip when more than this fraction of the nodes screened in the window had
    confirmed failures."""

    @field_validator("window")
    @classmethod
    def _window_positive(cls, value: str) -> str:
        if parse_duration(value) <= 0:
            raise ValueError('spec.circuitBreaker.window: must be longer than 0s, e.g. "1h"')
        return value


class BaselineSettings(ApiModel):
    """How golden values are established for a fingerprint without a trusted baseline."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                "self.mode != 'Consensus' || self.quorum >= 2",
                "spec.baseline.quorum: Consensus needs at least 2 agreeing nodes; "
                "raise quorum or use mode: Recorded",
            )
        )
    )

    mode: BaselineMode = BaselineMode.CONSENSUS
    """Consensus: trust digests once quorum nodes agree. Recorded: trust the digests of the
    nodes named in the SDCBaseline's recordedFrom once they all agree."""
    quorum: int = Field(default=3, ge=1, le=100)
    """Agreeing nodes needed for a Consensus baseline."""

    @model_validator(mode="after")
    def _quorum(self) -> BaselineSettings:
        if self.mode == BaselineMode.CONSENSUS and self.quorum < 2:
            raise ValueError(
                "spec.baseline.quorum: Consensus needs at least 2 agreeing nodes; "
                "raise quorum or use mode: Recorded"
            )
        return self


class TaintKeys(ApiModel):
    """Keys of the taints sdcguard adds (and later removes: only those it added)."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                "self.gate != self.testing && self.gate != self.quarantine "
                "&& self.testing != self.quarantine",
                "spec.taints: gate, testing and quarantine must be three different keys",
            )
        )
    )

    gate: QualifiedName = DEFAULT_GATE_TAINT
    """Keeps new nodes free of work until they pass acceptance. Apply it at registration
    (kubelet --register-with-taints, Karpenter startupTaints) and tell Cluster Autoscaler with
    --startup-taint, or use a startup-taint.cluster-autoscaler.kubernetes.io/ key."""
    testing: QualifiedName = DEFAULT_TESTING_TAINT
    """Reserves a node for a test (NoSchedule)."""
    quarantine: QualifiedName = DEFAULT_QUARANTINE_TAINT
    """Marks a quarantined node. A status-taint.cluster-autoscaler.kubernetes.io/ key makes
    Cluster Autoscaler treat the node as unusable and add capacity."""

    @model_validator(mode="after")
    def _distinct(self) -> TaintKeys:
        if len({self.gate, self.testing, self.quarantine}) != 3:
            raise ValueError(
                "spec.taints: gate, testing and quarantine must be three different keys"
            )
        return self


def _accelerators() -> list[str]:
    return list(DEFAULT_ACCELERATORS)


FULL_GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
"""NVIDIA's device plugin with the mixed MIG strategy advertises each MIG profile as
its own resource, nvidia.com/mig-<profile> (nvidia.com/mig-1g.10gb)."""


def is_mig_resource(name: str) -> bool:
    """Whether ``name`` is a MIG profile's resource (nvidia.com/mig-<profile>)."""
    return name.startswith(MIG_RESOURCE_PREFIX)


def accelerator_resources(listed: Sequence[str], offered: Iterable[str]) -> tuple[str, ...]:
    """The accelerator resources of a node offering ``offered`` (its allocatable's
    names) under a policy listing ``listed``: those listed, and, when nvidia.com/gpu is
    listed, every MIG profile's resource it offers (spec.accelerators)."""
    migs = sorted(n for n in offered if is_mig_resource(n) and n not in listed)
    return (*listed, *migs) if FULL_GPU_RESOURCE in listed else tuple(listed)


class DraDeviceClass(ApiModel):
    """A DRA DeviceClass whose devices make a node an accelerator node (spec.dra)."""

    device_class_name: NodeName
    """The DeviceClass the probe claims the node's devices through (its Pod's
    ResourceClaimTemplate asks for every device of the class on the node, allocation
    mode All), e.g. gpu.nvidia.com, which NVIDIA's DRA driver installs for whole GPUs."""
    driver: NodeName
    """The DRA driver that publishes those devices in ResourceSlices; the devices it
    publishes for a node (spec.nodeName, newest pool generation) are that node's
    device count, e.g. gpu.nvidia.com. The class should select all of them: a device
    the class leaves out is counted but not screened."""


def _dra_classes() -> list[DraDeviceClass]:
    return [DraDeviceClass(device_class_name=NVIDIA_DRA_CLASS, driver=NVIDIA_DRA_CLASS)]


NVIDIA_DRA_CLASS = "gpu.nvidia.com"
"""NVIDIA's DRA driver for GPUs, and the DeviceClass its chart installs for whole GPUs."""


ExtendedResourceName = Annotated[
    str,
    StringConstraints(
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
        max_length=253,
    ),
]


_SUITE_FIELDS = {
    Suite.ACCEPTANCE: "acceptance",
    Suite.REQUALIFICATION: "requalification",
    Suite.REPAIR_VERIFICATION: "repair_verification",
}
SUITE_BUDGET_DEADLINE = (
    "spec.suites.budgetSeconds: each suite's budget must be at most "
    "spec.probe.activeDeadlineSeconds (default 1800), or the Job is killed before the "
    "probe's own budget runs out; lower the budget or raise the deadline"
)
DEFAULT_DEADLINE_SECONDS = 1800
_DEADLINE_CEL = "(has(self.probe) ? self.probe.activeDeadlineSeconds : 1800)"


def suite_budget_deadline_message(budgets: Mapping[str, int], deadline: int) -> str:
    """SUITE_BUDGET_DEADLINE with the values: the suites' budgets and the deadline (and
    whether it is the default), so the fix can be chosen without looking anything up."""
    default = " (the default)" if deadline == DEFAULT_DEADLINE_SECONDS else ""
    given = "; ".join(f"{name} {value} s" for name, value in budgets.items())
    return (
        "spec.suites.budgetSeconds: each suite's budget must be at most "
        f"spec.probe.activeDeadlineSeconds, here {deadline} s{default}; given: {given}; "
        "the Job would be killed before the probe's own budget runs out: lower the budget "
        "or raise the deadline"
    )


_SUITE_BUDGET_CEL = " && ".join(
    f"(!has(self.suites.budgetSeconds.{name}) "
    f"|| self.suites.budgetSeconds.{name} <= {_DEADLINE_CEL})"
    for name in ("acceptance", "requalification", "repairVerification")
)


class SDCPolicySpec(ApiModel):
    """Which nodes sdcguard screens for silent data corruption, when, and what it does."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                "!has(self.suites) || !has(self.suites.budgetSeconds) || ("
                + _SUITE_BUDGET_CEL
                + ")",
                SUITE_BUDGET_DEADLINE,
            ),
            cel(
                "!has(self.probe) || !has(self.probe.tolerations) || "
                "self.probe.tolerations.all(t, has(t.key) && t.key != '' && t.key != "
                "(has(self.taints) && has(self.taints.quarantine) ? self.taints.quarantine "
                f": '{DEFAULT_QUARANTINE_TAINT}'))",
                QUARANTINE_TOLERATION,
            ),
        )
    )

    node_selector: NodeSelector = Field(default_factory=NodeSelector)
    """Nodes covered by this policy."""
    accelerators: list[ExtendedResourceName] = Field(
        default=list(DEFAULT_ACCELERATORS), min_length=1, max_length=16, json_schema_extra=SET_LIST
    )
    """Extended resources that make a node an accelerator node; their allocatable count is the
    node's device count, and the probe requests all of them. nvidia.com/gpu also stands
    for NVIDIA's MIG instances (nvidia.com/mig-<profile>, the mixed MIG strategy): a node
    offering them is screened on every instance it has, each counted as a device; a node
    offering both whole GPUs and MIG instances is not screened (it waits, MixedMig), as
    a probe cannot tell which instances share a GPU with a whole one. Listed by name
    rather than by pattern so the profiles need no policy change when they are
    repartitioned."""
    dra: list[DraDeviceClass] = Field(
        default_factory=_dra_classes,
        max_length=8,
        json_schema_extra=map_list("deviceClassName"),
    )
    """DRA-only nodes: a node that advertises none of spec.accelerators but whose
    devices a listed driver publishes in ResourceSlices (NVIDIA's DRA driver without
    the device plugin) is an accelerator node; its device count is what the drivers
    publish for it, and the probe Pod claims every device of each class that has some
    there through a ResourceClaimTemplate (allocation mode All), so the scheduler
    keeps every other claim off the node while it runs. A node that advertises an
    accelerator resource is screened through that resource; its slices are not read
    for this. Default: NVIDIA's gpu.nvidia.com (class and driver). Empty: DRA-only
    nodes are not accelerator nodes."""
    triggers: Triggers = Field(default_factory=Triggers)
    """When nodes are screened."""
    suites: Suites = Field(default_factory=Suites)
    """Which checks run for each reason."""
    probe: ProbeSpec = Field(default_factory=ProbeSpec)
    """The probe Job."""
    budgets: Budgets = Field(default_factory=Budgets)
    """How much capacity screening may take away at once."""
    confirmation: Confirmation = Field(default_factory=Confirmation)
    """Re-runs that confirm an SDC verdict before quarantine."""
    quarantine: Quarantine = Field(default_factory=Quarantine)
    """What quarantining a node does."""
    repair: Repair = Field(default_factory=Repair)
    """Repair tickets, cycles and retirement."""
    circuit_breaker: CircuitBreaker = Field(default_factory=CircuitBreaker)
    """Stops quarantines during a failure storm."""
    baseline: BaselineSettings = Field(default_factory=BaselineSettings)
    """How golden values are established."""
    mode: Mode = Mode.ENFORCE
    """Observe: screen and record verdicts, labels and events, but never taint, cordon, delete
    or open tickets. Enforce: act."""
    paused: bool = False
    """Start no new tests; running ones finish and their results are still applied."""
    taints: TaintKeys = Field(default_factory=TaintKeys)
    """Taint keys sdcguard uses."""

    @field_validator("accelerators")
    @classmethod
    def _unique_accelerators(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("spec.accelerators: list each resource name once")
        return value

    @field_validator("dra")
    @classmethod
    def _unique_classes(cls, value: list[DraDeviceClass]) -> list[DraDeviceClass]:
        names = [c.device_class_name for c in value]
        if len(set(names)) != len(names):
            raise ValueError("spec.dra: list each deviceClassName once")
        return value

    @model_validator(mode="after")
    def _probe_stays_off_quarantine(self) -> SDCPolicySpec:
        quarantine = self.taints.quarantine
        if any(not t.key or t.key == quarantine for t in self.probe.tolerations):
            raise ValueError(QUARANTINE_TOLERATION)
        return self

    @model_validator(mode="after")
    def _suite_budgets_fit_deadline(self) -> SDCPolicySpec:
        deadline = self.probe.active_deadline_seconds
        budgets = self.suites.budget_seconds
        given = {
            suite.value: value
            for suite in Suite
            if (value := getattr(budgets, _SUITE_FIELDS[suite])) is not None
        }
        if any(value > deadline for value in given.values()):
            raise ValueError(suite_budget_deadline_message(given, deadline))
        return self

    @property
    def dra_classes(self) -> tuple[tuple[str, str], ...]:
        """spec.dra as (DeviceClass, driver) pairs."""
        return tuple((c.device_class_name, c.driver) for c in self.dra)

    def suite_budget(self, suite: Suite) -> int:
        """Seconds the probe plans ``suite`` for: the suite's own budget, else
        spec.probe.budgetSeconds, and for repairVerification 1.5 times that (within
        activeDeadlineSeconds, never below the probe's budget)."""
        own: int | None = getattr(self.suites.budget_seconds, _SUITE_FIELDS[suite])
        if own is not None:
            return own
        base = self.probe.budget_seconds
        if suite != Suite.REPAIR_VERIFICATION:
            return base
        scaled = math.ceil(base * REPAIR_VERIFICATION_BUDGET_FACTOR)
        return max(base, min(scaled, self.probe.active_deadline_seconds))


class BreakerSample(ApiModel):
    """One finished screening, as the circuit breaker counts it."""

    time: dt.datetime
    """When the screening finished."""
    failed: bool
    """Whether it found SDC."""
    node_name: Annotated[str, StringConstraints(max_length=253)] = ""
    """The screened node."""
    test_name: Annotated[str, StringConstraints(max_length=253)] = ""
    """The SDCTest."""
    devices: list[Annotated[str, StringConstraints(max_length=253)]] = Field(
        default_factory=list, max_length=16
    )
    """A failed screening: the devices it named as the odd one out (GPU UUIDs, else the
    probe's device indices)."""


class BreakerState(StrEnum):
    """Closed: quarantines proceed. Open: quarantines are held until a manual reset."""

    CLOSED = "Closed"
    OPEN = "Open"


class BreakerStatus(ApiModel):
    """The circuit breaker, reconstructed from its samples on every pass."""

    state: BreakerState = BreakerState.CLOSED
    """Closed or Open."""
    tripped_at: dt.datetime | None = None
    """When it opened."""
    reason: Annotated[str, StringConstraints(max_length=1024)] = ""
    """Why it is in this state, e.g. "3 of 5 nodes screened had confirmed failures in the
    last 1h (limit 50%)"."""
    samples: list[BreakerSample] = Field(default_factory=list, max_length=1000)
    """Recent screenings (pruned to what the breaker needs)."""
    window_samples: int = Field(default=0, ge=0)
    """Distinct nodes screened in the current window."""
    window_failures: int = Field(default=0, ge=0)
    """Of those, nodes with a confirmed failure."""
    window_failed_devices: int = Field(default=0, ge=0)
    """Distinct devices the failed screenings of those nodes named (two bad GPUs of one
    node: one failing node, two devices); told, the trip counts nodes."""
    held_nodes: list[Annotated[str, StringConstraints(max_length=253)]] = Field(
        default_factory=list, max_length=1000
    )
    """Nodes whose confirmed failure is held while the breaker is open (Suspect, tainted,
    not re-tested until it closes or a person asks)."""
    reset_marker: Annotated[str, StringConstraints(max_length=253)] | None = None
    """The last sdcguard.dev/reset-breaker annotation value acted on."""
    reset_at: dt.datetime | None = None
    """When the breaker was last reset; earlier samples are ignored."""


class NodeCounts(ApiModel):
    """Nodes of this policy in each lifecycle state."""

    total: int = Field(default=0, ge=0)
    """All nodes of this policy (the sum of the states below; kept so by the model)."""
    unqualified: int = Field(default=0, ge=0)
    """Joined, gated, waiting for acceptance."""
    testing: int = Field(default=0, ge=0)
    """Reserved and being screened."""
    qualified: int = Field(default=0, ge=0)
    """Passed their last screening."""
    suspect: int = Field(default=0, ge=0)
    """Failed once or were reported; being confirmed."""
    quarantined: int = Field(default=0, ge=0)
    """Confirmed SDC, waiting for repair."""
    repairing: int = Field(default=0, ge=0)
    """Handed to the repair side."""
    verifying: int = Field(default=0, ge=0)
    """Repaired, being verified."""
    retired: int = Field(default=0, ge=0)
    """Out of repair cycles."""
    excluded: int = Field(default=0, ge=0)
    """Opted out with sdcguard.dev/exclude=true."""

    @model_validator(mode="after")
    def _sum(self) -> NodeCounts:
        self.total = sum(getattr(self, name) for name in _STATE_COUNTS)
        return self


_STATE_COUNTS = (
    "unqualified",
    "testing",
    "qualified",
    "suspect",
    "quarantined",
    "repairing",
    "verifying",
    "retired",
    "excluded",
)


class TopologyStatus(ApiModel):
    """How held one topology budget's domains are, as the last full pass saw them."""

    label_key: Annotated[str, StringConstraints(max_length=317)]
    """The budget's label key."""
    domains: int = Field(default=0, ge=0)
    """Domains (distinct values of the key) among the policy's nodes; 0: no node
    carries the key, so the budget limits nothing."""
    at_limit: int = Field(default=0, ge=0)
    """Domains whose held nodes reached their maxUnavailable (screening waits there)."""
    most_held: int = Field(default=0, ge=0)
    """The most nodes held in any one domain."""


class NextNode(ApiModel):
    """A node waiting for test budget, with why it has its place in the order."""

    node: Annotated[str, StringConstraints(max_length=253)]
    """The Node's name."""
    basis: Annotated[str, StringConstraints(max_length=32)]
    """risk (the chance it holds an undetected fault), todays-order (no screening history
    in the fleet yet), overdue (waited past the starvation bound) or tier (a repair, new
    node or suspect, ahead of routine re-screenings)."""
    chance: float | None = Field(default=None, ge=0.0, le=1.0)
    """The risk order's chance that the node holds an undetected fault (basis risk)."""
    reason: Annotated[str, StringConstraints(max_length=512)] = ""
    """Every input behind its place: hours since its last pass and that pass's catch
    chance, its hardware type's measured failures, its repairs and reports."""


class SDCPolicyStatus(ApiModel):
    """What the operator observed for this policy."""

    observed_generation: int | None = None
    """The metadata.generation last acted on."""
    conditions: list[Condition] = Field(
        default_factory=list, max_length=16, json_schema_extra=CONDITIONS_LIST
    )
    """Ready, BreakerOpen, Paused, TransitionErrors."""
    breaker: BreakerStatus = Field(default_factory=BreakerStatus)
    """The circuit breaker."""
    counts: NodeCounts = Field(default_factory=NodeCounts)
    """Nodes by lifecycle state."""
    topology: list[TopologyStatus] = Field(default_factory=list, max_length=8)
    """Per topology budget (spec.budgets.topology): domains, those at their limit, and
    the most held in one."""
    budget_order: list[NextNode] = Field(default_factory=list, max_length=10)
    """The first nodes waiting for test budget, in the order they get it (as of the last
    full pass), each with its risk inputs (``kubectl sdc status``)."""


class SDCPolicy(ApiModel):
    """SDCPolicy: which nodes are screened for silent data corruption, and how."""

    api_version: ApiVersion = API_VERSION
    kind: Literal["SDCPolicy"] = "SDCPolicy"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: SDCPolicySpec = Field(default_factory=SDCPolicySpec)
    status: SDCPolicyStatus | None = None
