"""DRA I/O for per-device quarantine: which resource.k8s.io version serves
DeviceTaintRules, a node's ResourceSlice devices, and the rules sdcguard writes.

The served version is discovered, newest first (v1, v1beta2, v1beta1, v1alpha3: GA in
Kubernetes 1.37, beta in 1.36, alpha before behind the DRADeviceTaints feature gate),
and looked up again after an hour or when a request finds it gone (an upgrade).
Only rules that carry sdcguard's ``app.kubernetes.io/managed-by`` label are changed
or deleted: the write paths re-read a rule and refuse one without it.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sdcguard.adapters.kube import already_exists
from sdcguard.domain.devicetaints import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NODE_LABEL,
    TAINT_KEY,
    TICKET_ANNOTATION,
    UUID_ANNOTATION,
    NodeDevices,
    RulePlan,
    SeenRule,
    SliceDevice,
    WantedRule,
    ownership,
    plan_rules,
)

GROUP = "resource.k8s.io"
RULES = "devicetaintrules"
SLICES = "resourceslices"
REDISCOVER = dt.timedelta(hours=1)
log = structlog.get_logger("sdcguard.devicetaints")

_VERSION = re.compile(r"^v(\d+)(?:(alpha|beta)(\d+))?$")


def version_priority(version: str) -> tuple[int, int, int]:
    """Kubernetes' version order as a sort key (higher is newer): GA over beta over
    alpha, then by number; a name that is no Kubernetes version sorts lowest."""
    m = _VERSION.match(version)
    if m is None:
        return (-1, 0, 0)
    stage = {"alpha": 0, "beta": 1, None: 2}[m.group(2)]
    return (stage, int(m.group(1)), int(m.group(3) or 0))


def newest(versions: Iterable[str]) -> str | None:
    """The newest of ``versions`` by Kubernetes' version order, None for none."""
    ordered = sorted(versions, key=version_priority, reverse=True)
    return ordered[0] if ordered else None


def slice_devices(body: dict[str, Any]) -> list[SliceDevice]:
    """The devices of one ResourceSlice (v1/v1beta2 keep attributes on the device,
    v1beta1 and v1alpha3 under ``basic``)."""
    spec = body.get("spec") or {}
    driver = str(spec.get("driver") or "")
    pool = str((spec.get("pool") or {}).get("name") or "")
    out = []
    for device in spec.get("devices") or []:
        attrs = device.get("attributes") or (device.get("basic") or {}).get("attributes") or {}
        uuid = (attrs.get("uuid") or {}).get("string") or ""
        name = str(device.get("name") or "")
        if driver and pool and name:
            out.append(SliceDevice(driver, pool, name, str(uuid)))
    return out


def seen_rule(body: dict[str, Any]) -> SeenRule:
    """A DeviceTaintRule as the plan reads it."""
    meta = body.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    spec = body.get("spec") or {}
    selector = spec.get("deviceSelector") or {}
    return SeenRule(
        name=str(meta.get("name") or ""),
        driver=str(selector.get("driver") or ""),
        pool=str(selector.get("pool") or ""),
        device=str(selector.get("device") or ""),
        effect=str((spec.get("taint") or {}).get("effect") or ""),
        owned=labels.get(MANAGED_BY_LABEL) == MANAGED_BY,
        node=str(labels.get(NODE_LABEL) or ""),
        ticket=str(annotations.get(TICKET_ANNOTATION) or ""),
        uuid=str(annotations.get(UUID_ANNOTATION) or ""),
    )


def rule_body(rule: WantedRule, version: str) -> dict[str, Any]:
    """The DeviceTaintRule for ``rule``, with sdcguard's ownership marks."""
    marks = ownership(rule)
    return {
        "apiVersion": f"{GROUP}/{version}",
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": rule.name,
            "labels": dict(marks.labels),
            "annotations": dict(marks.annotations),
        },
        "spec": {
            "deviceSelector": {
                "driver": rule.device.driver,
                "pool": rule.device.pool,
                "device": rule.device.name,
            },
            "taint": {"key": TAINT_KEY, "value": rule.ticket[:63], "effect": rule.effect},
        },
    }


@dataclass
class DeviceTaints:
    """Reads ResourceSlices and writes sdcguard's DeviceTaintRules.

    ``allow(kind)``: counts a write and says whether to send it (the writer's dry-run)."""

    api: client.ApiClient
    allow: Callable[[str], bool] = lambda _kind: True
    clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)
    _versions: dict[str, str | None] = field(default_factory=dict)
    _found_at: dt.datetime | None = None

    def __post_init__(self) -> None:
        self.custom = client.CustomObjectsApi(self.api)

    # Discovery --------------------------------------------------------------

    def served_version(self, plural: str = RULES) -> str | None:
        """The newest resource.k8s.io version serving ``plural``, None when none does."""
        now = self.clock()
        if self._found_at is None or now - self._found_at > REDISCOVER:
            self._versions = self._discover()
            self._found_at = now
        return self._versions.get(plural)

    def forget_versions(self) -> None:
        """Look the versions up again on the next request (a 404: the API changed)."""
        self._found_at = None

    def _discover(self) -> dict[str, str | None]:
        groups = client.ApisApi(self.api).get_api_versions().groups or []
        versions = [v.version for g in groups if g.name == GROUP for v in g.versions or []]
        serving: dict[str, list[str]] = {RULES: [], SLICES: []}
        for version in versions:
            try:
                listed = self.custom.get_api_resources(GROUP, version)
            except ApiException as exc:
                if exc.status == 404:
                    continue
                raise
            for resource in listed.resources or []:
                if resource.name in serving:
                    serving[resource.name].append(version)
        found = {plural: newest(vs) for plural, vs in serving.items()}
        log.info("dra versions", devicetaintrules=found[RULES], resourceslices=found[SLICES])
        return found

    # Reads --------------------------------------------------------------------

    def node_devices(self, node: str) -> NodeDevices:
        """The devices of the ResourceSlices on ``node``, and whether rules are served."""
        rules = self.served_version(RULES)
        slices = self.served_version(SLICES)
        if slices is None:
            return NodeDevices(served=rules is not None)
        listed = self._list(slices, SLICES, f"spec.nodeName={node}")
        devices = [d for item in listed for d in slice_devices(item)]
        return NodeDevices(served=rules is not None, devices=tuple(devices))

    def rules(self) -> list[SeenRule]:
        """Every DeviceTaintRule (any author): a foreign rule for a device we taint is
        reported, and one that holds our name is never overwritten."""
        version = self.served_version(RULES)
        if version is None:
            return []
        return [seen_rule(item) for item in self._list(version, RULES)]

    def _list(self, version: str, plural: str, selector: str = "") -> list[dict[str, Any]]:
        try:
            body = (
                self.custom.list_cluster_custom_object(
                    GROUP, version, plural, field_selector=selector
                )
                if selector
                else self.custom.list_cluster_custom_object(GROUP, version, plural)
            )
        except ApiException as exc:
            if exc.status == 404:
                self.forget_versions()
                return []
            raise
        items = body.get("items") if isinstance(body, dict) else None
        return list(items or [])

    # Writes -------------------------------------------------------------------

    def ensure(
        self,
        node: str,
        wanted: Iterable[WantedRule],
        *,
        prune: bool,
        only: Iterable[str] | None = None,
    ) -> RulePlan:
        """Create or correct the node's wanted rules (and with ``prune`` delete its
        other rules of ours; ``only``: of those, only the rules so named); returns the
        plan applied. Raises ApiException when the API serves no DeviceTaintRule (the
        caller falls back or retries)."""
        version = self.served_version(RULES)
        wanted = list(wanted)
        if version is None:
            if not wanted:
                return RulePlan()
            raise ApiException(status=404, reason="the API server serves no DeviceTaintRule")
        seen = self.rules()
        if only is not None:
            names = set(only)
            seen = [s for s in seen if s.name in names]
        plan = plan_rules(wanted, seen, node, prune=prune)
        for rule in plan.create:
            if self.allow("devicetaintrules-create"):
                try:
                    self.custom.create_cluster_custom_object(
                        GROUP, version, RULES, rule_body(rule, version), field_manager="sdcguard"
                    )
                except ApiException as exc:
                    if not already_exists(exc):
                        raise
        for rule in plan.update:
            self._write_owned(version, rule.name, rule_body(rule, version))
        for name in plan.delete:
            self._write_owned(version, name, None)
        for name in plan.conflicts:
            log.warning("device taint rule name taken by someone else; left alone", rule=name)
        if not plan.empty:
            log.info(
                "device taint rules",
                node=node,
                created=[r.name for r in plan.create],
                updated=[r.name for r in plan.update],
                deleted=list(plan.delete),
                foreign=list(plan.foreign),
            )
        return plan

    def _write_owned(self, version: str, name: str, body: dict[str, Any] | None) -> None:
        """Patch (or, with None, delete) a rule, only if it still carries our label; the
        write carries the resourceVersion read, so a change in between is a 409."""
        try:
            current = self.custom.get_cluster_custom_object(GROUP, version, RULES, name)
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        meta = (current.get("metadata") if isinstance(current, dict) else None) or {}
        if (meta.get("labels") or {}).get(MANAGED_BY_LABEL) != MANAGED_BY:
            log.warning("device taint rule is not sdcguard's; left alone", rule=name)
            return
        if body is None:
            if self.allow("devicetaintrules-delete"):
                try:
                    self.custom.delete_cluster_custom_object(
                        GROUP,
                        version,
                        RULES,
                        name,
                        body=client.V1DeleteOptions(
                            preconditions=client.V1Preconditions(
                                resource_version=meta.get("resourceVersion")
                            )
                        ),
                    )
                except ApiException as exc:
                    if exc.status != 404:
                        raise
            return
        patch = {
            "metadata": {
                "resourceVersion": meta.get("resourceVersion"),
                "annotations": body["metadata"]["annotations"],
            },
            "spec": body["spec"],
        }
        if self.allow("devicetaintrules-patch"):
            self.custom.patch_cluster_custom_object(GROUP, version, RULES, name, patch)
