"""Quarantine scope Device against a real API server that serves DeviceTaintRules: the
operator taints exactly the failed GPU, keeps the node in service, follows a renamed
device, never touches rules it did not write, and removes its own after verification."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sdcdev.cluster.localcluster import LocalCluster
from sdcdev.harness import (
    GROUP as SDC_GROUP,
)
from sdcdev.harness import (
    TESTING,
    VERSION,
    ProbeKubelet,
    annotate,
    create_policy,
    gpu_nodes,
    list_custom,
    new_case,
    node_state,
    read_node,
    taint_keys,
    trusted_baseline,
    wait_for,
)
from sdcguard.adapters.devicetaints import GROUP, RULES, SLICES, DeviceTaints, newest
from sdcguard.cli.main import main
from sdcguard.domain.devicetaints import SliceDevice, rule_name, wanted_rules

pytestmark = pytest.mark.cluster
DRIVER = "gpu.nvidia.com"


def _uuid(node: str, i: int) -> str:
    return f"GPU-{abs(hash(node)) % 10**8:08d}-0000-0000-0000-{i:012d}"


def slice_body(
    node: str, version: str, names: dict[int, str], generation: int = 1
) -> dict[str, Any]:
    """A ResourceSlice as NVIDIA's DRA driver publishes one: a pool per node, one
    device per GPU with uuid, product and memory."""

    def device(i: int, name: str) -> dict[str, Any]:
        attributes = {
            "uuid": {"string": _uuid(node, i)},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "index": {"int": i},
        }
        capacity = {"memory": {"value": "80Gi"}}
        if version in ("v1beta1", "v1alpha3"):
            return {"name": name, "basic": {"attributes": attributes, "capacity": capacity}}
        return {"name": name, "attributes": attributes, "capacity": capacity}

    return {
        "apiVersion": f"{GROUP}/{version}",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": [device(i, n) for i, n in sorted(names.items())],
        },
    }


def foreign_rule(name: str, node: str, device: str, version: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{version}",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name, "labels": {"team": "gpu-ops"}},
        "spec": {
            "deviceSelector": {"driver": DRIVER, "pool": node, "device": device},
            "taint": {"key": "example.com/maintenance", "effect": "NoSchedule"},
        },
    }


@pytest.fixture
def dra(dra_api: client.ApiClient) -> DeviceTaints:
    return DeviceTaints(dra_api)


def test_the_served_versions_are_discovered(dra: DeviceTaints) -> None:
    rules, slices = dra.served_version(RULES), dra.served_version(SLICES)
    assert rules is not None and slices is not None
    groups = client.ApisApi(dra.api).get_api_versions().groups
    versions = [v.version for g in groups if g.name == GROUP for v in g.versions]
    assert slices == newest(versions) or slices in versions
    assert rules in versions


@contextlib.contextmanager
def published(api: client.ApiClient, body: dict[str, Any]) -> Iterator[None]:
    version = body["apiVersion"].split("/")[1]
    custom = client.CustomObjectsApi(api)
    custom.create_cluster_custom_object(GROUP, version, SLICES, body)
    try:
        yield
    finally:
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(GROUP, version, SLICES, body["metadata"]["name"])


def _rules(dra: DeviceTaints) -> dict[str, dict[str, Any]]:
    version = dra.served_version(RULES)
    assert version
    items = client.CustomObjectsApi(dra.api).list_cluster_custom_object(GROUP, version, RULES)
    return {i["metadata"]["name"]: i for i in items["items"]}


def _written(rule: dict[str, Any]) -> tuple[Any, ...]:
    """What a writer of the rule could change: its spec (``generation`` counts spec
    changes), labels and annotations. Not its status: from 1.37 the controller-manager
    writes conditions there for every rule, whoever owns it."""
    meta = rule["metadata"]
    return (meta.get("generation"), meta.get("labels"), meta.get("annotations"), rule["spec"])


def _ours(dra: DeviceTaints, node: str) -> dict[str, dict[str, Any]]:
    return {
        n: r
        for n, r in _rules(dra).items()
        if (r["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by") == "sdcguard"
        and r["metadata"]["labels"].get("sdcguard.dev/node") == node
    }


def test_one_failing_gpu_is_tainted_repaired_verified_and_returned(
    dra_api: client.ApiClient,
    dra_operator: object,
    dra: DeviceTaints,
    dra_cluster: LocalCluster,
) -> None:
    case = new_case()
    node = f"dev-{case}"
    rules_v = dra.served_version(RULES)
    slices_v = dra.served_version(SLICES)
    assert rules_v and slices_v
    custom = client.CustomObjectsApi(dra_api)
    names = {i: f"gpu-{i}" for i in range(8)}
    # Someone else's rules: one for the GPU that will fail, one for another GPU.
    theirs = {
        f"ops-{case}-gpu3": foreign_rule(f"ops-{case}-gpu3", node, "gpu-3", rules_v),
        f"ops-{case}-gpu5": foreign_rule(f"ops-{case}-gpu5", node, "gpu-5", rules_v),
    }
    for body in theirs.values():
        custom.create_cluster_custom_object(GROUP, rules_v, RULES, body)
    before = {n: _written(_rules(dra)[n]) for n in theirs}
    trusted_baseline(dra_api)
    outcomes = {node: "pass"}
    try:
        with (
            gpu_nodes(dra_api, [node], case=case, gated=False),
            published(dra_api, slice_body(node, slices_v, names)),
            ProbeKubelet(dra_api, outcomes),
        ):
            create_policy(
                dra_api,
                case,
                quarantine={"scope": "Device", "deviceTaintEffect": "NoSchedule"},
            )
            wait_for(lambda: node_state(dra_api, node) == "Qualified", 90, "qualification")

            # GPU 3 starts computing wrong answers; a workload reports the node.
            outcomes[node] = "sdc@3@2"
            annotate(dra_api, node, {"sdcguard.dev/suspect": "loss spike on rank 3"})
            wait_for(lambda: node_state(dra_api, node) == "Quarantined", 120, "quarantine")
            ours = wait_for(lambda: _ours(dra, node) or None, 30, "our device taint rule")
            uuid3 = _uuid(node, 3)
            assert list(ours) == [rule_name(node, uuid3)], "one rule, for the failed GPU only"
            rule = ours[rule_name(node, uuid3)]
            assert rule["spec"]["deviceSelector"] == {
                "driver": DRIVER,
                "pool": node,
                "device": "gpu-3",
            }
            assert rule["spec"]["taint"]["effect"] == "NoSchedule"
            (ticket,) = list_custom(dra_api, "repairtickets", node)
            assert (
                rule["metadata"]["annotations"]["sdcguard.dev/ticket"] == ticket["metadata"]["name"]
            )
            assert rule["metadata"]["annotations"]["sdcguard.dev/device-uuid"] == uuid3
            record = ticket["spec"]["quarantine"]
            assert (record["scope"], record["reason"]) == ("Device", "DeviceTainted")
            assert [(d["index"], d["device"], d["uuid"]) for d in record["devices"]] == [
                (3, "gpu-3", uuid3)
            ]
            assert ticket["spec"]["hardware"]["deviceIDs"] == [uuid3]
            # The node keeps serving with its other seven GPUs.
            n = read_node(dra_api, node)
            assert not n.spec.unschedulable
            assert not {"sdcguard.dev/quarantined", TESTING} & taint_keys(dra_api, node)

            # kubectl sdc status lists the GPU as out of service.
            out, err = io.StringIO(), io.StringIO()
            code = main(
                ["status", "-o", "json", "--kubeconfig", str(dra_cluster.kubeconfig)],
                stdout=out,
                stderr=err,
            )
            assert code == 0, err.getvalue()
            listed = [
                d for d in json.loads(out.getvalue())["devicesOutOfService"] if d["node"] == node
            ]
            assert listed == [
                {
                    "node": node,
                    "device": f"{DRIVER}/{node}/gpu-3",
                    "uuid": uuid3,
                    "ticket": ticket["metadata"]["name"],
                    "rule": rule_name(node, uuid3),
                }
            ]
            table = io.StringIO()
            main(["status", "--kubeconfig", str(dra_cluster.kubeconfig)], stdout=table)
            assert "Devices out of service" in table.getvalue()

            # The driver restarts and names the GPU anew: the rule follows its UUID.
            version = slices_v
            renamed = {**names, 3: "gpu-3-r"}
            custom.replace_cluster_custom_object(
                GROUP,
                version,
                SLICES,
                f"{node}-{DRIVER}",
                {
                    **slice_body(node, version, renamed, generation=2),
                    "metadata": {
                        "name": f"{node}-{DRIVER}",
                        "resourceVersion": custom.get_cluster_custom_object(
                            GROUP, version, SLICES, f"{node}-{DRIVER}"
                        )["metadata"]["resourceVersion"],
                    },
                },
            )
            wait_for(
                lambda: (
                    _ours(dra, node)
                    .get(rule_name(node, uuid3), {})
                    .get("spec", {})
                    .get("deviceSelector", {})
                    .get("device")
                    == "gpu-3-r"
                ),
                60,
                "the rule to follow the renamed device",
            )
            assert len(_ours(dra, node)) == 1

            # Repaired: verification re-tests the node with every GPU, then returns it.
            outcomes[node] = "pass"
            custom.patch_cluster_custom_object(
                SDC_GROUP,
                VERSION,
                "repairtickets",
                ticket["metadata"]["name"],
                {"spec": {"resolution": "Repaired"}},
            )
            wait_for(lambda: node_state(dra_api, node) == "Qualified", 120, "return to service")
            wait_for(lambda: not _ours(dra, node), 30, "our rule removed")
            (closed,) = list_custom(dra_api, "repairtickets", node)
            assert closed["status"]["phase"] == "Closed"
            suites = [t["spec"].get("suite") for t in list_custom(dra_api, "sdctests", node)]
            assert "repairVerification" in suites
            assert not taint_keys(dra_api, node) & {"sdcguard.dev/quarantined", TESTING}
            after = _rules(dra)
            for name in theirs:
                assert _written(after[name]) == before[name], (
                    f"{name} is not ours and must never be changed"
                )
    finally:
        for name in theirs:
            with contextlib.suppress(ApiException):
                custom.delete_cluster_custom_object(GROUP, rules_v, RULES, name)


def test_a_rule_holding_our_name_is_never_overwritten_or_deleted(
    dra_api: client.ApiClient, dra: DeviceTaints
) -> None:
    """Someone wrote a rule under the name sdcguard would use, and another that carries
    our node label but not our managed-by label: neither is changed or deleted."""
    case = new_case()
    node = f"clash-{case}"
    version = dra.served_version(RULES)
    assert version
    custom = client.CustomObjectsApi(dra_api)
    gpu = SliceDevice(DRIVER, node, "gpu-0", _uuid(node, 0))
    (wanted,) = wanted_rules(node, "t-1", "compute on gpu-0", "NoSchedule", [gpu])
    squatter = foreign_rule(wanted.name, node, "gpu-0", version)
    lookalike = foreign_rule(f"look-{case}", node, "gpu-1", version)
    lookalike["metadata"]["labels"]["sdcguard.dev/node"] = node
    for body in (squatter, lookalike):
        custom.create_cluster_custom_object(GROUP, version, RULES, body)
    try:
        before = {n: _written(r) for n, r in _rules(dra).items()}
        plan = dra.ensure(node, [wanted], prune=False)
        assert plan.conflicts == (wanted.name,) and not plan.create and not plan.update
        dra.ensure(node, [], prune=True)
        after = _rules(dra)
        for name in (wanted.name, f"look-{case}"):
            assert _written(after[name]) == before[name]
        assert after[wanted.name]["spec"]["taint"]["key"] == "example.com/maintenance"
    finally:
        for name in (wanted.name, f"look-{case}"):
            with contextlib.suppress(ApiException):
                custom.delete_cluster_custom_object(GROUP, version, RULES, name)


def _tickets(api: client.ApiClient, node: str) -> dict[str, dict[str, Any]]:
    return {t["metadata"]["name"]: t for t in list_custom(api, "repairtickets", node)}


def _sized(found: dict[str, dict[str, Any]], size: int) -> dict[str, dict[str, Any]] | None:
    return found if len(found) == size else None


def _resolve(api: client.ApiClient, name: str) -> None:
    client.CustomObjectsApi(api).patch_cluster_custom_object(
        SDC_GROUP, VERSION, "repairtickets", name, {"spec": {"resolution": "Repaired"}}
    )


def test_two_failing_gpus_get_a_ticket_each_and_return_one_at_a_time(
    dra_api: client.ApiClient,
    dra_operator: object,
    dra: DeviceTaints,
    dra_cluster: LocalCluster,
) -> None:
    """GPUs 2 and 5 fail together: a ticket and a rule each. Both are repaired, but GPU 5
    fails its verification again: GPU 2 returns (its ticket closes, its rule goes) while
    GPU 5 stays out with its ticket's cycle raised; repaired again, it returns too."""
    case = new_case()
    node = f"two-{case}"
    slices_v = dra.served_version(SLICES)
    assert slices_v
    uuids = tuple(_uuid(node, i) for i in range(8))
    kubeconfig = str(dra_cluster.kubeconfig)
    trusted_baseline(dra_api)
    outcomes = {node: "pass"}
    with (
        gpu_nodes(dra_api, [node], case=case, gated=False),
        published(dra_api, slice_body(node, slices_v, {i: f"gpu-{i}" for i in range(8)})),
        ProbeKubelet(dra_api, outcomes, devices={node: uuids}),
    ):
        policy = create_policy(
            dra_api,
            case,
            quarantine={"scope": "Device"},
            confirmation={"reruns": 0},
            budgets={"maxUnavailableDevices": 4},  # 2 GPUs out: the node is still verified
        )
        wait_for(lambda: node_state(dra_api, node) == "Qualified", 90, "qualification")

        outcomes[node] = "sdc@2+5@2"  # golden names GPU 2, compute names GPU 5
        annotate(dra_api, node, {"sdcguard.dev/suspect": "two ranks disagree"})
        wait_for(lambda: node_state(dra_api, node) == "Quarantined", 120, "quarantine")
        tickets = wait_for(lambda: _sized(_tickets(dra_api, node), 2), 30, "two tickets")
        by_device: dict[str, str] = {}
        for name, ticket in tickets.items():
            (device,) = ticket["spec"]["quarantine"]["devices"]
            assert name.endswith(f"-{device['device']}"), "named after the incident and GPU"
            assert ticket["spec"]["hardware"]["deviceIDs"] == [device["uuid"]]
            assert {f["oddDevice"] for f in ticket["spec"]["findings"]} == {device["index"]}
            by_device[device["device"]] = name
        assert set(by_device) == {"gpu-2", "gpu-5"}
        ours = wait_for(lambda: _sized(_ours(dra, node), 2), 30, "rules")
        assert {
            r["spec"]["deviceSelector"]["device"]: r["metadata"]["annotations"][
                "sdcguard.dev/ticket"
            ]
            for r in ours.values()
        } == by_device, "each rule names its own GPU's ticket"
        assert not read_node(dra_api, node).spec.unschedulable
        out = io.StringIO()
        assert main(["status", "-o", "json", "--kubeconfig", kubeconfig], stdout=out) == 0
        (budget,) = [b for b in json.loads(out.getvalue())["deviceBudget"] if b["policy"] == policy]
        assert (budget["devices"], budget["outOfService"], budget["allows"]) == (8, 2, 4)

        # Both repaired; the verification still finds GPU 5 wrong.
        outcomes[node] = "sdc@5@2"
        for name in by_device.values():
            _resolve(dra_api, name)

        def gpu2_returned() -> tuple[str | None, str | None, int | None, str | None]:
            now = {n: t.get("status") or {} for n, t in _tickets(dra_api, node).items()}
            two, five = now[by_device["gpu-2"]], now[by_device["gpu-5"]]
            return (
                two.get("phase"),
                five.get("phase"),
                five.get("cycle"),
                node_state(dra_api, node),
            )

        wait_for(
            lambda: gpu2_returned() == ("Closed", "Open", 2, "Quarantined"),
            120,
            "GPU 2 returned, GPU 5 kept out",
        )
        five = _tickets(dra_api, node)[by_device["gpu-5"]]
        assert "resolution" not in five["spec"], "the repair side is asked again"
        left = wait_for(lambda: _sized(_ours(dra, node), 1), 30, "one rule")
        (rule,) = left.values()
        assert rule["spec"]["deviceSelector"]["device"] == "gpu-5"
        assert not taint_keys(dra_api, node) & {"sdcguard.dev/quarantined", TESTING}

        def history() -> dict[str, Any]:
            return {
                h["spec"]["id"]: h
                for h in client.CustomObjectsApi(dra_api).list_cluster_custom_object(
                    SDC_GROUP, VERSION, "sdchardwares"
                )["items"]
            }

        def five_failures() -> list[tuple[str, str]] | None:
            """GPU 5's failures once there are two (None before)."""
            status = history()[uuids[5]].get("status") or {}
            found = [(f["kind"], f["ticket"]) for f in status.get("failures", [])]
            return found if len(found) >= 2 else None

        # The hardware's history follows the decision's node patch (its last stage but
        # Events): the ticket's phases above can be seen before it is written.
        failures = wait_for(five_failures, 30, "GPU 5's second failure in its history")
        assert failures == [
            ("Quarantined", by_device["gpu-5"]),
            ("VerificationFailed", by_device["gpu-5"]),
        ], "GPU 5's history counts its own two cycles"
        hardware = history()
        assert [f["ticket"] for f in hardware[uuids[2]]["status"]["failures"]] == [
            by_device["gpu-2"]
        ]

        # GPU 5 repaired again: it passes, and the node is whole again.
        outcomes[node] = "pass"
        _resolve(dra_api, by_device["gpu-5"])

        seen: list[str] = []

        def returned() -> bool:
            """Qualified; else it notes what the node and its newest tests say, for the
            timeout's message (a stall here once went unexplained on a loaded machine)."""
            if node_state(dra_api, node) == "Qualified":
                return True
            meta = read_node(dra_api, node).metadata
            tests = client.CustomObjectsApi(dra_api).list_cluster_custom_object(
                SDC_GROUP, VERSION, "sdctests"
            )["items"]
            mine = sorted(
                (t for t in tests if t["spec"]["nodeName"] == node),
                key=lambda t: t["metadata"]["creationTimestamp"],
            )[-3:]
            ours = {k: v for k, v in (meta.annotations or {}).items() if "sdcguard" in k}
            ours.update({k: v for k, v in (meta.labels or {}).items() if "sdcguard" in k})
            status = [t.get("status") or {} for t in mine]
            runs = [
                (t["metadata"]["name"], s.get("phase"), s.get("reason"))
                for t, s in zip(mine, status, strict=True)
            ]
            seen[:] = [json.dumps({"node": ours, "tests": runs})]
            return False

        try:
            wait_for(returned, 120, "return to service")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {seen[-1] if seen else ''}") from None
        wait_for(lambda: not _ours(dra, node), 30, "rules removed")
        phases = {n: t["status"]["phase"] for n, t in _tickets(dra_api, node).items()}
        assert phases == dict.fromkeys(by_device.values(), "Closed")
