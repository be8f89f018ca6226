"""Retention on the real API server: a preloaded history is pruned to its bound, an open
ticket and what it references survive, and an object the operator cannot parse (one
stored under an older, looser schema) is skipped, counted and named, never a crash
loop of the copy.

The objects are created now; the sweep's clock is injected a year and more ahead, so
all of them are "old" to it."""

from __future__ import annotations

import copy
import datetime as dt
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sdcdev.cluster.localcluster import LocalCluster
from sdcdev.harness import GROUP, REPO, VERSION, wait_for
from sdcguard.adapters.kube import KubeWriter
from sdcguard.adapters.observe import TicketSnapshot
from sdcguard.adapters.pass_state import TestSnapshot
from sdcguard.adapters.retention import (
    MirroredCopy,
    RetentionSweeper,
    TokenBucket,
    list_custom,
    read_history,
)
from sdcguard.domain.observed import NodeSnapshot
from sdcguard.domain.retention import HistoryKind, RetentionLimits
from sdcguard.metrics import Metrics
from sdcguard.runtime.mirror import NODES, Mirror, cluster_custom

FP_CARRIED = "c" * 64
FP_GONE = "d" * 64
TESTS = 16
LATER = dt.timedelta(days=400)


def body(kind: str, name: str, spec: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": kind,
        "metadata": {"name": name, **meta},
        "spec": spec,
    }


def baseline(name: str, fingerprint: str) -> dict[str, Any]:
    spec = {"fingerprint": {"hash": fingerprint}, "source": "Approved", "trusted": False}
    return body("SDCBaseline", name, spec)


def create(custom: client.CustomObjectsApi, plural: str, obj: dict[str, Any]) -> None:
    namespace = obj["metadata"].get("namespace")
    if namespace:
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, plural, obj)
    else:
        custom.create_cluster_custom_object(GROUP, VERSION, plural, obj)


def status(custom: client.CustomObjectsApi, plural: str, name: str, value: Any) -> None:
    custom.patch_cluster_custom_object_status(GROUP, VERSION, plural, name, {"status": value})


def names(api: client.ApiClient, plural: str) -> set[str]:
    return {o["metadata"]["name"] for o in list_custom(api, plural)}


@pytest.fixture
def history(api_client: client.ApiClient, crds: None) -> Iterator[None]:
    """Node ``kept`` (carrying FP_CARRIED) with 16 passed tests, an open ticket naming
    its two oldest, a closed ticket, its WorkloadRecord; a departed node's record; an
    SDCReport; two baselines; and one SDCTest stored under a looser schema."""
    core = client.CoreV1Api(api_client)
    custom = client.CustomObjectsApi(api_client)
    core.create_node(
        client.V1Node(
            metadata=client.V1ObjectMeta(
                name="kept", annotations={"sdcguard.dev/fingerprint": FP_CARRIED}
            )
        )
    )
    tests = [f"kept-t{i:02d}" for i in range(TESTS)]
    for name in tests:
        spec = {"nodeName": "kept", "policyRef": "p", "suite": "requalification"}
        create(custom, "sdctests", body("SDCTest", name, {**spec, "reason": "Expiry"}))
        status(custom, "sdctests", name, {"phase": "Passed", "fingerprintHash": FP_CARRIED})
    create(custom, "repairtickets", body("RepairTicket", "open", {"nodeName": "kept",
           "evidence": tests[:2]}))  # fmt: skip
    status(custom, "repairtickets", "open", {"phase": "InRepair"})
    create(custom, "repairtickets", body("RepairTicket", "closed", {"nodeName": "kept"}))
    status(custom, "repairtickets", "closed", {"phase": "Closed",
           "closedAt": "2020-01-01T00:00:00Z"})  # fmt: skip
    for node in ("kept", "departed"):
        create(custom, "workloadrecords", body("WorkloadRecord", node, {"nodeName": node}))
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="team")))
    report = {"nodeName": "kept", "podName": "trainer-0", "step": 5, "method": "ShadowAudit"}
    create(custom, "sdcreports", body("SDCReport", "r1", report, namespace="team"))
    create(custom, "sdcbaselines", baseline("fp-carried", FP_CARRIED))
    create(custom, "sdcbaselines", baseline("fp-gone", FP_GONE))
    store_unreadable_test(api_client)
    yield
    for plural in ("sdctests", "repairtickets", "workloadrecords", "sdcbaselines"):
        for name in names(api_client, plural):
            custom.delete_cluster_custom_object(GROUP, VERSION, plural, name)
    core.delete_namespace("team")
    core.delete_node("kept")


def store_unreadable_test(api: client.ApiClient) -> None:
    """An SDCTest whose status.phase is a list: the CRD is swapped for one that keeps
    anything (as an older release's schema might have), the object stored, and the
    CRD put back. The API server keeps serving what it stored."""
    ext = client.ApiextensionsV1Api(api)
    custom = client.CustomObjectsApi(api)
    original = yaml.safe_load((REPO / "crds" / "sdctests.sdcguard.dev.yaml").read_text())
    loose = copy.deepcopy(original)
    for version in loose["spec"]["versions"]:
        version["schema"] = {
            "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        }
        version.pop("additionalPrinterColumns", None)
        version.pop("selectableFields", None)

    def replace(crd: dict[str, Any]) -> None:
        current = ext.read_custom_resource_definition(crd["metadata"]["name"])
        crd["metadata"]["resourceVersion"] = current.metadata.resource_version
        ext.replace_custom_resource_definition(crd["metadata"]["name"], crd)

    replace(loose)
    try:

        def stored() -> bool:
            try:
                create(custom, "sdctests", body("SDCTest", "from-an-older-release",
                       {"nodeName": "kept", "policyRef": "p"}))  # fmt: skip
            except ApiException as exc:
                return exc.status == 409  # stored by an earlier try
            return True

        wait_for(stored, 30, "the loose schema to be served")
        wait_for(
            lambda: _patched(custom, "from-an-older-release", {"phase": ["Passed"]}),
            30,
            "a status the current schema refuses",
        )
    finally:
        replace(original)


def _patched(custom: client.CustomObjectsApi, name: str, value: Any) -> bool:
    try:
        status(custom, "sdctests", name, value)
    except ApiException:
        return False
    got = custom.get_cluster_custom_object(GROUP, VERSION, "sdctests", name)
    return isinstance((got.get("status") or {}).get("phase"), list)


def test_history_is_pruned_to_its_bound_and_keeps_what_lives_on(
    cluster: LocalCluster, api_client: client.ApiClient, history: None
) -> None:
    stop = threading.Event()
    tests: Mirror[TestSnapshot] = Mirror(
        api_client, cluster_custom(GROUP, VERSION, "sdctests"), TestSnapshot.slim
    )
    tickets: Mirror[TicketSnapshot] = Mirror(
        api_client, cluster_custom(GROUP, VERSION, "repairtickets"), TicketSnapshot.from_body
    )
    nodes: Mirror[NodeSnapshot] = Mirror(api_client, NODES, NodeSnapshot.from_body)
    for mirror in (tests, tickets, nodes):
        mirror.start(stop)
    try:
        # The copy completes despite the object it cannot read, and names it.
        for mirror in (tests, tickets, nodes):
            wait_for(mirror.synced.is_set, 30, f"{mirror.kind.name} to sync")
        assert "from-an-older-release" in tests.stats.unreadable
        assert len(tests) == TESTS

        metrics = Metrics()
        copy_ = MirroredCopy(tests, tickets, nodes)
        sweeper = RetentionSweeper(
            writer=KubeWriter(api=api_client, metrics=metrics),
            metrics=metrics,
            limits=RetentionLimits(),  # the defaults: 10 tests a node, 30 days, ...
            bucket=TokenBucket(50, 5),
            read=lambda: read_history(copy_, lambda plural: list_custom(api_client, plural)),
            clock=lambda: dt.datetime.now(dt.UTC) + LATER,
        )
        done = sweeper.sweep()
        assert done == {
            "sdctests-deleted": TESTS - 10 - 2,  # newest ten and the open ticket's two stay
            "repairtickets-deleted": 1,
            "workloadrecords-deleted": 1,
            "sdcreports-deleted": 1,
            "sdcbaselines-deleted": 1,
        }
        left = names(api_client, "sdctests")
        assert left == {f"kept-t{i:02d}" for i in (0, 1, *range(6, TESTS))} | {
            "from-an-older-release"  # never deleted: it could not be read
        }
        assert names(api_client, "repairtickets") == {"open"}
        assert names(api_client, "workloadrecords") == {"kept"}
        assert names(api_client, "sdcbaselines") == {"fp-carried"}
        assert list(list_custom(api_client, "sdcreports")) == []

        def sample(name: str, kind: str) -> float:
            value = metrics.registry.get_sample_value(name, {"kind": kind})
            return 0.0 if value is None else value

        assert sample("sdcguard_retention_deleted_total", "sdctests") == TESTS - 12
        assert sample("sdcguard_retention_unreadable_objects", "sdctests") == 1

        # Bounded: a second sweep (once the copy saw the deletes) finds nothing to do.
        wait_for(lambda: len(tests) == 12, 30, "the copy to see the deletes")
        assert sweeper.sweep() == {}
        assert sample("sdcguard_retention_objects", HistoryKind.TEST.value) == 13
    finally:
        stop.set()
        for mirror in (tests, tickets, nodes):
            mirror.stop_watch()
