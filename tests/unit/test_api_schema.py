"""The generated CRDs: fresh, structural, described, and carrying the rules people rely on."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sdcguard.api import RESOURCES, Resource
from sdcguard.api.common import (
    API_VERSION,
    GROUP,
    OLDER_VERSIONS,
    SERVED_API_VERSIONS,
    VERSION,
)
from sdcguard.api.crdgen import crd_manifest, main, render
from sdcguard.api.resources import from_body

ROOT = Path(__file__).resolve().parents[2]


def _walk(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from _walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{path}[{i}]")


def _schema(resource: Resource) -> dict[str, Any]:
    schema: dict[str, Any] = crd_manifest(resource)["spec"]["versions"][0]["schema"]
    return schema["openAPIV3Schema"]  # type: ignore[no-any-return]


def _properties(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    for name, sub in node.get("properties", {}).items():
        yield f"{path}.{name}", sub
        yield from _properties(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _properties(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _properties(node["additionalProperties"], f"{path}.*")


def _at(schema: dict[str, Any], dotted: str) -> dict[str, Any]:
    node = schema
    for part in dotted.split("."):
        node = node["items"] if part == "[]" else node["properties"][part]
    return node


def test_committed_crds_are_fresh() -> None:
    files = render()
    for folder in (ROOT / "crds", ROOT / "charts" / "sdcguard" / "crds"):
        for name, text in files.items():
            path = folder / name
            assert path.is_file(), f"{path} missing: run `make crds`"
            assert path.read_text() == text, f"{path} is stale: run `make crds`"


def test_check_mode_lists_stale_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, chart = tmp_path / "crds", tmp_path / "chart"
    assert main(["--out", str(out), "--chart", str(chart), "--check"]) == 1
    assert "sdctests.sdcguard.dev.yaml" in capsys.readouterr().err
    assert main(["--out", str(out), "--chart", str(chart)]) == 0
    assert main(["--out", str(out), "--chart", str(chart), "--check"]) == 0
    assert (out / "sdcpolicies.sdcguard.dev.yaml").read_text() == (
        chart / "crds" / "sdcpolicies.sdcguard.dev.yaml"
    ).read_text()
    (chart / "crds" / "repairtickets.sdcguard.dev.yaml").write_text("edited by hand\n")
    assert main(["--out", str(out), "--chart", str(chart), "--check"]) == 1
    assert "charts" not in str(out) and "repairtickets" in capsys.readouterr().err


@pytest.mark.parametrize("resource", RESOURCES, ids=lambda r: r.kind)
def test_schema_is_structural(resource: Resource) -> None:
    schema = _schema(resource)
    for path, node in _walk(schema):
        for forbidden in ("$ref", "$defs", "anyOf", "allOf", "oneOf", "title", "const"):
            assert forbidden not in node, f"{forbidden} at {path}"
        assert "x-kubernetes-preserve-unknown-fields" not in node, path
        assert not (node.get("uniqueItems")), f"uniqueItems at {path} (forbidden in CRDs)"
        assert "additionalProperties" not in node or "properties" not in node, path
    for path, prop in _properties(schema):
        assert "type" in prop or prop.get("x-kubernetes-int-or-string"), f"{path} has no type"


@pytest.mark.parametrize("resource", RESOURCES, ids=lambda r: r.kind)
def test_defaults_satisfy_their_own_schema(resource: Resource) -> None:
    # The API server refuses a CRD whose default breaks its pattern or enum.
    for path, node in _walk(_schema(resource)):
        if "default" not in node:
            continue
        values = node["default"] if isinstance(node["default"], list) else [node["default"]]
        item = node.get("items", node)
        for value in values:
            if "pattern" in item:
                assert re.search(item["pattern"], value), (path, value)
            if "enum" in item:
                assert value in item["enum"], (path, value)


@pytest.mark.parametrize("resource", RESOURCES, ids=lambda r: r.kind)
def test_every_property_is_described(resource: Resource) -> None:
    described = _properties(_schema(resource))
    missing = [path for path, prop in described if not prop.get("description")]
    # The API server refuses a description on metadata (it owns that schema).
    assert missing == [".metadata"]


@pytest.mark.parametrize("resource", RESOURCES, ids=lambda r: r.kind)
def test_every_rule_names_its_field(resource: Resource) -> None:
    for path, node in _walk(_schema(resource)):
        for rule in node.get("x-kubernetes-validations", []):
            assert rule["message"].startswith(("spec", "status")), (path, rule)
            assert rule["rule"].strip()


@pytest.mark.parametrize("resource", RESOURCES, ids=lambda r: r.kind)
def test_names_columns_and_category(resource: Resource) -> None:
    crd = crd_manifest(resource)
    names = crd["spec"]["names"]
    assert crd["spec"]["scope"] == ("Namespaced" if resource.kind == "SDCReport" else "Cluster")
    assert names["categories"] == ["sdcguard"]
    assert names["shortNames"] == list(resource.short_names)
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns[-1] == "Age"
    schema = _schema(resource)
    for column in version["additionalPrinterColumns"]:
        if column["jsonPath"].startswith(".metadata"):
            continue
        node = schema
        for part in column["jsonPath"].strip(".").split("."):
            node = node["properties"][part]
        assert node.get("type") in (column["type"], "array") or column["type"] == "string"


@pytest.mark.parametrize("resource", RESOURCES, ids=lambda r: r.kind)
def test_selectable_fields_are_strings_of_the_schema(resource: Resource) -> None:
    """Each selectable field (what the plugin's lists ask the API server to select on)
    names a string the schema has, in every served version."""
    crd = crd_manifest(resource)
    schema = _schema(resource)
    for version in crd["spec"]["versions"]:
        paths = [f["jsonPath"] for f in version.get("selectableFields", [])]
        assert paths == list(resource.selectable)
    for path in resource.selectable:
        node = schema
        for part in path.strip(".").split("."):
            node = node["properties"][part]
        assert node["type"] == "string", path


def test_the_history_kinds_select_by_node() -> None:
    by_kind = {r.kind: r.selectable for r in RESOURCES}
    assert by_kind["SDCTest"] == by_kind["RepairTicket"] == (".spec.nodeName", ".status.phase")
    assert by_kind["SDCReport"] == (".spec.nodeName",)


def test_short_names_and_columns_tell_the_story() -> None:
    by_kind = {r.kind: r for r in RESOURCES}
    assert {r.short_names[0] for r in RESOURCES} == {
        "sdcp",
        "sdct",
        "rt",
        "sdcb",
        "sdcr",
        "sdchw",
        "sdcw",
    }

    def visible(kind: str) -> list[str]:
        return [c.name for c in by_kind[kind].columns if c.priority == 0]

    assert visible("SDCTest") == [
        "Node",
        "Suite",
        "Reason",
        "Phase",
        "Verdict",
        "Budget",
        "Ends",
        "Age",
    ]
    assert visible("RepairTicket") == ["Node", "Phase", "Cycle", "Resolution", "External", "Age"]
    assert visible("SDCPolicy") == ["Mode", "Breaker", "Nodes", "Qualified", "Quarantined", "Age"]
    assert visible("SDCBaseline") == ["Fingerprint", "Source", "Trusted", "Nodes", "Age"]
    assert visible("SDCHardware") == ["Kind", "ID", "Failures", "Node", "Age"]
    assert visible("WorkloadRecord") == ["Node", "Since", "Idle", "Age"]


def test_policy_schema_details() -> None:
    spec = _schema(RESOURCES[0])["properties"]["spec"]
    max_unavailable = _at(spec, "budgets.maxUnavailable")
    assert max_unavailable["x-kubernetes-int-or-string"] is True
    assert "type" not in max_unavailable
    # Structural bounds (the API server then names the refused value): the pattern holds
    # for strings, the minimum for integers.
    assert max_unavailable["minimum"] == 0
    assert re.search(max_unavailable["pattern"], "100%")
    assert not re.search(max_unavailable["pattern"], "101%")
    assert "int-or-string" in max_unavailable["description"]
    idle_for = _at(spec, "triggers.onReturnFromUse.idleFor")
    assert not re.search(idle_for["pattern"], "-5m")
    assert re.search(idle_for["pattern"], "1h30m")
    assert _at(spec, "mode")["enum"] == ["Observe", "Enforce"]
    assert _at(spec, "circuitBreaker.maxFailureFraction")["maximum"] == 1.0
    assert _at(spec, "suites.acceptance.[].name")["enum"] == [
        "compute",
        "collective",
        "golden",
        "memory",
    ]
    acceptance_rules = _at(spec, "suites.acceptance")["x-kubernetes-validations"]
    assert "unique" in acceptance_rules[0]["message"]
    assert _at(spec, "probe.image")["nullable"] is True
    assert _at(spec, "taints.gate")["default"] == "sdcguard.dev/unqualified"
    params = _at(spec, "suites.acceptance.[].params")
    assert params["additionalProperties"] == {"x-kubernetes-int-or-string": True}


def test_status_conditions_are_a_map_by_type() -> None:
    for resource in RESOURCES:
        status = _schema(resource)["properties"]["status"]["properties"]
        if resource.kind == "WorkloadRecord":  # a record of what ran: nothing to condition
            assert "conditions" not in status
            continue
        conditions = status["conditions"]
        assert conditions["x-kubernetes-list-type"] == "map"
        assert conditions["x-kubernetes-list-map-keys"] == ["type"]
        assert "type" in conditions["items"]["required"]


def test_ticket_resolution_retire_is_final_and_test_spec_immutable() -> None:
    by_kind = {r.kind: r for r in RESOURCES}
    ticket_rules = _schema(by_kind["RepairTicket"])["properties"]["spec"][
        "x-kubernetes-validations"
    ]
    assert any("oldSelf.resolution" in r["rule"] for r in ticket_rules)
    test_rules = _schema(by_kind["SDCTest"])["properties"]["spec"]["x-kubernetes-validations"]
    assert {"rule": "self == oldSelf", "message": test_rules[0]["message"]} == test_rules[0]


def test_yaml_parses_back_to_the_manifest() -> None:
    for resource in RESOURCES:
        text = render()[f"{resource.crd_name}.yaml"]
        assert text.startswith("# Generated")
        assert yaml.safe_load(text) == crd_manifest(resource)


def test_the_versions_agree_and_every_served_one_parses() -> None:
    """v1beta1 is read, written and stored; v1alpha1 is served beside it with the same
    schema, so an object read through either parses."""
    assert f"{GROUP}/{VERSION}" == API_VERSION == SERVED_API_VERSIONS[0]
    assert SERVED_API_VERSIONS[1:] == tuple(f"{GROUP}/{v}" for v in OLDER_VERSIONS)
    for api_version in SERVED_API_VERSIONS:
        body = {"apiVersion": api_version, "kind": "SDCBaseline", "metadata": {"name": "b"},
                "spec": {"fingerprint": {"hash": "a" * 64}}}  # fmt: skip
        assert from_body(body).api_version == api_version
    with pytest.raises(ValueError, match="expected apiVersion"):
        from_body({"apiVersion": f"{GROUP}/v2", "kind": "SDCBaseline"})
