"""The fleet's copy against the real API server: streaming and paginated lists, watches,
410 Gone, throttled and failing list pages, cut streams, a server that does not serve
streaming lists, and the inventory's pokes."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from kubernetes import client, config

from sdcdev.cluster.localcluster import LocalCluster
from sdcdev.faultproxy import FaultProxy, FaultRates
from sdcdev.harness import apply_crds, gpu_pod, wait_for
from sdcguard.adapters.inventory import Inventory
from sdcguard.domain.observed import NodeSnapshot
from sdcguard.runtime.mirror import Change, Kind, Mirror, object_key, retrying_client

CASE_LABEL = "sdcguard.test/mirror-case"


def _nodes(api: client.ApiClient, case: str, count: int) -> list[str]:
    core = client.CoreV1Api(api)
    names = [f"mirror-{case}-{i:03d}" for i in range(count)]
    for name in names:
        core.create_node(
            client.V1Node(metadata=client.V1ObjectMeta(name=name, labels={CASE_LABEL: case}))
        )
    return names


def _delete_nodes(api: client.ApiClient, case: str) -> None:
    client.CoreV1Api(api).delete_collection_node(label_selector=f"{CASE_LABEL}={case}")


def _listed(api: client.ApiClient, case: str) -> set[str]:
    items = client.CoreV1Api(api).list_node(label_selector=f"{CASE_LABEL}={case}").items
    return {n.metadata.name for n in items}


@contextmanager
def _running(mirror: Mirror[Any]) -> Iterator[threading.Thread]:
    stop = threading.Event()
    thread = mirror.start(stop)
    try:
        yield thread
    finally:
        stop.set()
        mirror.stop_watch()
        thread.join(timeout=20)
        assert not thread.is_alive(), "the mirror's thread did not end"


def _node_kind(case: str) -> Kind:
    return Kind("nodes", "list_node", label_selector=f"{CASE_LABEL}={case}", path="/api/v1/nodes")


@pytest.mark.parametrize("streaming", [True, False], ids=["streaming-list", "paged-list"])
def test_a_list_then_a_watch_keep_an_exact_copy(
    api_client: client.ApiClient, streaming: bool
) -> None:
    """A streaming list (its initial events, then the same request watches on) or a
    paginated list and then a watch: the copy follows creations, changes and deletions."""
    case = uuid.uuid4().hex[:6]
    names = _nodes(api_client, case, 23)
    seen: list[Change[NodeSnapshot]] = []
    mirror: Mirror[NodeSnapshot] = Mirror(
        api_client,
        _node_kind(case),
        NodeSnapshot.from_body,
        on_change=seen.extend,
        page_size=5,
        watch_timeout=5,
        streaming=streaming,
    )
    try:
        with _running(mirror):
            wait_for(mirror.synced.is_set, 30, "the first list")
            assert set(mirror.items()) == set(names)
            if streaming:
                assert (mirror.stats.streams, mirror.stats.pages) == (1, 0)
                assert mirror.stats.initial_events == 23
                assert mirror.streaming, "the server serves streaming lists"
            else:
                assert (mirror.stats.streams, mirror.stats.pages) == (0, 5)  # pages of 5
            # The node controller may already be tainting the new nodes (changes), but
            # the first list itself reports nothing as new.
            assert [c.key for c in seen if c.old is None] == []
            core = client.CoreV1Api(api_client)
            extra = _nodes(api_client, f"{case}x", 1)[0]
            core.patch_node(extra, {"metadata": {"labels": {CASE_LABEL: case}}})
            core.patch_node(names[0], {"metadata": {"labels": {"example.com/x": "1"}}})
            core.delete_node(names[1])
            wait_for(lambda: set(mirror.items()) == _listed(api_client, case), 30, "the watch")
            snapshot = mirror.get(names[0])
            assert snapshot is not None and snapshot.labels["example.com/x"] == "1"
            # Controllers change the nodes too: the first change of the new node, the
            # last of the deleted one and some change of the relabelled one are ours.
            first = {c.key: c for c in reversed(seen)}
            last = {c.key: c for c in seen}
            assert first[extra].old is None and first[extra].new is not None
            assert last[names[1]].new is None and last[names[1]].old is not None
            assert any(
                c.key == names[0] and c.new is not None and "example.com/x" in c.new.labels
                for c in seen
            )
            assert mirror.stats.lists == 1, "steady state is a watch, not a relist"
            assert mirror.stats.relists_gone == 0
    finally:
        _delete_nodes(api_client, case)


def test_a_server_without_streaming_lists_is_listed_in_pages() -> None:
    """An API server that does not serve streaming lists (here: its WatchList feature
    gate off) refuses ``sendInitialEvents`` (422): the mirror says so once, lists in
    pages from then on, and keeps an exact copy."""
    with LocalCluster(extra_apiserver_args=["--feature-gates=WatchList=false"]) as cluster:
        api = config.new_client_from_config(str(cluster.kubeconfig))
        case = uuid.uuid4().hex[:6]
        names = _nodes(api, case, 7)
        mirror: Mirror[NodeSnapshot] = Mirror(
            api, _node_kind(case), NodeSnapshot.from_body, page_size=3, watch_timeout=5
        )
        with _running(mirror):
            wait_for(mirror.synced.is_set, 30, "the first list")
            assert set(mirror.items()) == set(names)
            assert not mirror.streaming
            assert (mirror.stats.streams, mirror.stats.pages) == (1, 3)
            assert mirror.stats.errors == 0, "a refusal is not a failure"
            client.CoreV1Api(api).delete_node(names[0])
            wait_for(lambda: set(mirror.items()) == set(names[1:]), 30, "the watch")


def test_a_resource_version_too_old_means_a_fresh_list(
    api_client: client.ApiClient, cluster: LocalCluster
) -> None:
    """410 Gone from the watch (the ERROR event an API server sends for a
    resourceVersion it no longer has): the mirror lists again and reports what changed
    while it was not watching (here, a node deleted meanwhile)."""
    case = uuid.uuid4().hex[:6]
    names = _nodes(api_client, case, 7)
    seen: list[Change[NodeSnapshot]] = []
    off = FaultRates.off()
    with FaultProxy(cluster.server, cluster.ca_file, cluster.token, seed=3, rates=off) as proxy:
        proxied = retrying_client(client.ApiClient(client.Configuration(host=proxy.url)))
        mirror: Mirror[NodeSnapshot] = Mirror(
            proxied,
            _node_kind(case),
            NodeSnapshot.from_body,
            on_change=seen.extend,
            page_size=3,
            watch_timeout=5,
        )
        try:
            mirror.relist(threading.Event())
            assert set(mirror.items()) == set(names)
            client.CoreV1Api(api_client).delete_node(names[0])
            proxy.rates = FaultRates(0, 0, 0, 0, 0, 0, 0, 0, 0, gone=1.0)
            with _running(mirror):
                wait_for(lambda: proxy.injected["watch-gone"] >= 1, 30, "the 410")
                proxy.calm()
                wait_for(lambda: names[0] not in mirror.items(), 30, "the relist's result")
            assert mirror.stats.relists_gone >= 1
            assert set(mirror.items()) == set(names[1:])
            assert [c.key for c in seen if c.new is None] == [names[0]]
        finally:
            _delete_nodes(api_client, case)


@pytest.mark.parametrize("streaming", [True, False], ids=["streaming-list", "paged-list"])
def test_throttled_failing_and_cut_requests_end_in_a_complete_copy(
    api_client: client.ApiClient, cluster: LocalCluster, streaming: bool
) -> None:
    """Through the fault proxy (429 with Retry-After, 500, dropped connections, cut
    watches and streams): the first sync is never partial, and the copy ends equal to
    a LIST."""
    case = uuid.uuid4().hex[:6]
    names = _nodes(api_client, case, 30)
    rates = FaultRates(
        drop=0.1,
        error_500=0.15,
        error_429=0.15,
        conflict_409=0,
        lost_response=0,
        delay=0,
        max_delay_s=0,
        cut_watch=0.7,
        max_watch_s=2.0,
        gone=0.1,
    )
    with FaultProxy(cluster.server, cluster.ca_file, cluster.token, seed=7, rates=rates) as proxy:
        proxied = retrying_client(client.ApiClient(client.Configuration(host=proxy.url)))
        sizes_at_sync: list[int] = []
        mirror: Mirror[NodeSnapshot] = Mirror(
            proxied,
            _node_kind(case),
            NodeSnapshot.from_body,
            page_size=4,
            watch_timeout=30,
            streaming=streaming,
        )
        original_install = mirror._install

        def install(fresh: dict[str, NodeSnapshot], version: str) -> None:
            was = mirror.synced.is_set()
            original_install(fresh, version)
            if not was and mirror.synced.is_set():
                sizes_at_sync.append(len(mirror))

        mirror._install = install  # type: ignore[method-assign]
        try:
            with _running(mirror):
                wait_for(mirror.synced.is_set, 90, "the first list through the faults")
                assert sizes_at_sync == [len(names)], "the first sync was not complete"
                wait_for(lambda: proxy.injected["watch-cut"] >= 1, 60, "a watch cut short")
                core = client.CoreV1Api(api_client)
                for name in names[:10]:
                    core.patch_node(name, {"metadata": {"labels": {"example.com/y": "2"}}})
                for name in names[10:15]:
                    core.delete_node(name)

                def exact() -> bool:
                    copy = mirror.items()
                    return set(copy) == _listed(api_client, case) and all(
                        copy[n].labels.get("example.com/y") == "2" for n in names[:10]
                    )

                wait_for(exact, 90, "the copy to equal a LIST after the changes")
        finally:
            _delete_nodes(api_client, case)
        injected = dict(proxy.injected)
    assert injected.get("500", 0) + injected.get("429", 0) > 0, injected
    assert injected.get("watch-cut", 0) > 0, injected
    assert mirror.streaming is streaming, "faults are not a refusal of streaming lists"
    assert (mirror.stats.streams > 0) is streaming and (mirror.stats.pages > 0) is not streaming


def test_the_inventory_says_when_a_workload_stops_using_a_node(
    api_client: client.ApiClient,
) -> None:
    """A Pod holding a GPU on a node, then finished: the node is poked both times, its
    idle time counts from the end, and a pod asking for GPUs unscheduled is demand."""
    apply_crds(api_client)  # the inventory copies our own kinds too: it syncs only with them
    case = uuid.uuid4().hex[:6]
    node = _nodes(api_client, case, 1)[0]
    namespace = f"mirror-{case}"
    core = client.CoreV1Api(api_client)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    pokes: list[tuple[list[str] | None, dict[str, Any]]] = []
    pod = gpu_pod
    parsed: dict[str, list[str]] = {"pods": [], "probe-pods": []}

    def recording(mirror: Mirror[Any]) -> None:
        slim = mirror.slim

        def record(body: Any) -> Any:
            parsed[mirror.kind.name].append(object_key(body))
            return slim(body)

        mirror.slim = record

    async def scenario() -> None:
        inv = Inventory(api_client, namespace, test_node=lambda _: None, clock=_clock)
        recording(inv.pods)
        recording(inv.probe_pods)
        inv.start(asyncio.get_running_loop(), lambda nodes=None, **kw: pokes.append((nodes, kw)))
        try:
            assert await asyncio.wait_for(inv.wait_synced(lambda: False), 30)
            await asyncio.to_thread(core.create_namespaced_pod, namespace, pod("train", node))
            await _until(lambda: inv.busy([node]).get(node), "the pod's use")
            assert [u.name for u in inv.busy([node])[node]] == ["train"]
            await asyncio.to_thread(
                core.patch_namespaced_pod_status,
                "train",
                namespace,
                {"status": {"phase": "Succeeded"}},
            )
            await _until(lambda: node in inv.last_busy, "the end of the pod's use")
            assert inv.busy([node]) == {}
            assert inv.last_busy[node] == _clock()
            await asyncio.to_thread(core.create_namespaced_pod, namespace, pod("waits", None))
            await _until(inv.pending, "the pending demand")
            assert [d.name for d in inv.pending() if d.namespace == namespace] == ["waits"]
            # A probe Pod is the probe mirror's alone: the server leaves it out of the
            # all-Pods watch, so it is parsed once.
            probe = pod("probe", node)
            probe.metadata.labels = {"app.kubernetes.io/component": "sdcprobe"}
            await asyncio.to_thread(core.create_namespaced_pod, namespace, probe)
            await _until(lambda: f"{namespace}/probe" in parsed["probe-pods"], "the probe Pod")
            await asyncio.to_thread(
                core.patch_namespaced_pod_status,
                "probe",
                namespace,
                {"status": {"phase": "Succeeded"}},
            )
            await _until(lambda: parsed["probe-pods"].count(f"{namespace}/probe") >= 2, "its end")
            assert f"{namespace}/train" in parsed["pods"]
            assert f"{namespace}/probe" not in parsed["pods"]
            # Ended Pods are left out by the server (a field selector): a fresh list
            # does not even parse them, and the one that ended left the copy above.
            parsed["pods"].clear()
            await asyncio.to_thread(inv.pods.relist, threading.Event())
            assert f"{namespace}/waits" in parsed["pods"]
            assert f"{namespace}/train" not in parsed["pods"], "Succeeded: not listed"
        finally:
            inv.stop()

    try:
        asyncio.run(scenario())
    finally:
        core.delete_namespace(namespace)
        _delete_nodes(api_client, case)
    poked = [nodes for nodes, _ in pokes if nodes]
    assert [node] in poked, pokes
    assert poked.count([node]) >= 2, "the start and the end of the use each poke the node"


def _clock() -> Any:
    import datetime as dt

    return dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


async def _until(predicate: Callable[[], Any], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_probe_ends_are_served_before_the_workload_pods_have_listed(
    api_client: client.ApiClient,
) -> None:
    """Every kind but the workload Pods has listed: probe ends may be judged, nothing
    that reads the Pods may be; a node's own Pods are then read with one list of just
    that node's (a quarantine's blast radius), without probe Pods or other nodes'."""
    apply_crds(api_client)
    case = uuid.uuid4().hex[:6]
    one, other = _nodes(api_client, case, 2)
    namespace = f"mirror-{case}"
    core = client.CoreV1Api(api_client)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    core.create_namespaced_pod(namespace, gpu_pod("train", one))
    core.create_namespaced_pod(namespace, gpu_pod("elsewhere", other))
    core.create_namespaced_pod(
        namespace, gpu_pod("probe", one, labels={"app.kubernetes.io/component": "sdcprobe"})
    )
    inv = Inventory(api_client, namespace, test_node=lambda _: None, clock=_clock)
    stop = threading.Event()
    try:
        for mirror in inv.mirrors:
            if mirror is not inv.pods:
                mirror.start(stop)
        deadline = time.monotonic() + 30
        while not inv.probes_synced() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert inv.probes_synced()
        assert not inv.workloads_synced() and not inv.synced()
        assert inv.busy([one]) == {}, "the copy has no Pods yet"
        assert [u.name for u in inv.node_uses(one)] == ["train"]
        assert [u.name for u in inv.node_uses(other)] == ["elsewhere"]
        assert inv.pods.stats.pages == 0, "the node's list is not the copy's"
        inv.pods.start(stop)
        deadline = time.monotonic() + 30
        while not inv.synced() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert inv.synced()
        assert [u.name for u in inv.node_uses(one)] == ["train"]  # now from the copy
    finally:
        stop.set()
        inv.stop()
        core.delete_namespace(namespace)
        _delete_nodes(api_client, case)


def test_the_workload_pods_list_after_every_kind_that_serves_probe_ends(
    api_client: client.ApiClient,
) -> None:
    """At start-up the Pods (ten to one against the Nodes) list last, so their list does
    not take the API server's time from the kinds a probe's end needs."""
    apply_crds(api_client)
    case = uuid.uuid4().hex[:6]
    (one,) = _nodes(api_client, case, 1)
    namespace = f"mirror-{case}"
    core = client.CoreV1Api(api_client)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    core.create_namespaced_pod(namespace, gpu_pod("train", one))
    inv = Inventory(api_client, namespace, test_node=lambda _: None, clock=_clock)
    others = [m for m in inv.mirrors if m is not inv.pods]
    assert {id(e) for e in inv.pods.after} == {id(m.synced) for m in others}
    try:
        inv.warm()
        wait_for(inv.synced, 30, "the inventory to list every kind")
        pods_at = inv.pods.stats.first_sync_seconds
        assert pods_at is not None
        for m in others:
            at = m.stats.first_sync_seconds
            assert at is not None and at <= pods_at, (m.kind.name, at, pods_at)
        assert [u.name for u in inv.node_uses(one)] == ["train"]
    finally:
        inv.stop()
        core.delete_namespace(namespace)
        _delete_nodes(api_client, case)
