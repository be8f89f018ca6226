"""Workload records against a real API server: owners that cannot be followed to the
top (no owner, a deleted owner, a cycle, a kind not served) give a note, never a crash;
and a record at its bound is accepted and far below the API server's size limit."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import uuid

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sdcdev.harness import workload_record
from sdcguard.adapters.observe import OwnerRef
from sdcguard.adapters.owners import OwnerResolver
from sdcguard.api import GROUP, MAX_WORKLOADS, VERSION, WorkloadRecordStatus, to_body
from sdcguard.api.workloads import MAX_POD_NAMES, MAX_RUNNING
from sdcguard.domain.blast import LivePod, TopOwner, update_record

API_SERVER_LIMIT = 1_572_864  # etcd's default request limit, 1.5 MiB


@pytest.fixture()
def namespace(api_client: client.ApiClient, crds: None):  # type: ignore[no-untyped-def]
    core = client.CoreV1Api(api_client)
    name = f"owners-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    core.delete_namespace(name)


def _cm(core: client.CoreV1Api, ns: str, name: str, owner: OwnerRef | None = None) -> OwnerRef:
    meta = client.V1ObjectMeta(name=name)
    if owner is not None:
        meta.owner_references = [
            client.V1OwnerReference(
                api_version=owner.api_version, kind=owner.kind, name=owner.name, uid=owner.uid
            )
        ]
    made = core.create_namespaced_config_map(ns, client.V1ConfigMap(metadata=meta))
    return OwnerRef("v1", "ConfigMap", name, made.metadata.uid)


def test_owners_are_followed_to_the_top_or_a_note_says_why_not(api_client, namespace) -> None:
    core, batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
    resolver = OwnerResolver(api_client)

    # No owner: the Pod is the workload.
    assert resolver.top(namespace, "lonely", None) == TopOwner(namespace, "Pod", "lonely", "v1")

    # A Job owned by a ConfigMap standing in for a JobSet: the top is the ConfigMap.
    top = _cm(core, namespace, "jobset-like")
    job = batch.create_namespaced_job(
        namespace,
        client.V1Job(
            metadata=client.V1ObjectMeta(
                name="train",
                owner_references=[
                    client.V1OwnerReference(
                        api_version="v1", kind="ConfigMap", name=top.name, uid=top.uid
                    )
                ],
            ),
            spec=client.V1JobSpec(
                suspend=True,
                template=client.V1PodTemplateSpec(
                    spec=client.V1PodSpec(
                        restart_policy="Never",
                        containers=[client.V1Container(name="c", image="localhost/none:1")],
                    )
                ),
            ),
        ),
    )
    ref = OwnerRef("batch/v1", "Job", "train", job.metadata.uid)
    found = resolver.top(namespace, "train-0", ref)
    assert (found.kind, found.name, found.uid, found.note) == ("ConfigMap", top.name, top.uid, None)
    reads = resolver.reads
    assert resolver.top(namespace, "train-1", ref) == found
    assert resolver.reads == reads  # the cache answered

    # A deleted owner: the top is the last reference, with a note.
    gone = OwnerRef("batch/v1", "Job", "deleted-job", str(uuid.uuid4()))
    found = resolver.top(namespace, "p", gone)
    assert (found.kind, found.name) == ("Job", "deleted-job")
    assert found.note == "owner Job/deleted-job was deleted"

    # A cycle: a -> b -> a.
    a = _cm(core, namespace, "cycle-a")
    b = _cm(core, namespace, "cycle-b", owner=a)
    core.patch_namespaced_config_map(
        "cycle-a",
        namespace,
        {
            "metadata": {
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "cycle-b", "uid": b.uid}
                ]
            }
        },
    )
    found = resolver.top(namespace, "p", b)
    assert found.note is not None and found.note.startswith("ownerReference cycle at ConfigMap/")

    # A kind the API server does not serve (its CRD is not installed).
    odd = OwnerRef("kubeflow.org/v1", "PyTorchJob", "bert", str(uuid.uuid4()))
    found = resolver.top(namespace, "p", odd)
    assert (found.kind, found.name) == ("PyTorchJob", "bert")
    assert found.note == "PyTorchJob/bert: kind PyTorchJob of kubeflow.org/v1 is not served"


def test_a_record_at_its_bound_is_accepted_and_far_below_the_size_limit(api_client, crds) -> None:
    """Every list full, every string at its longest: what the API server stores."""
    t0 = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
    record = WorkloadRecordStatus()
    ns = "n" * 63
    live: list[LivePod] = []
    for i in range(MAX_WORKLOADS + 20):
        name = f"{i:04d}" + "o" * 249
        owner = TopOwner(ns, "K" * 63, name, "g" * 120 + "/v1", "u" * 63, "x" * 999)
        live += [
            LivePod(ns, f"{i:04d}-{j:03d}" + "p" * 245, owner, 8, t0)
            for j in range(max(MAX_POD_NAMES, MAX_RUNNING) + 4)
        ]
        record = update_record(record, live, {}, t0, t0)
    assert len(record.workloads) == MAX_WORKLOADS
    assert all(len(w.running) == MAX_RUNNING for w in record.workloads)
    assert record.dropped == 0
    node = f"bound-{uuid.uuid4().hex[:6]}"
    custom = client.CustomObjectsApi(api_client)
    with workload_record(api_client, node, to_body(record)) as stored:
        assert len(stored["status"]["workloads"]) == MAX_WORKLOADS
        size = len(json.dumps(stored).encode())
        assert size < API_SERVER_LIMIT / 3, size
        # One entry more than the schema allows is refused by the API server itself.
        over = to_body(record)
        over["workloads"].append(over["workloads"][0])
        with pytest.raises(ApiException) as refused:
            custom.patch_cluster_custom_object_status(
                GROUP, VERSION, "workloadrecords", node, {"status": over}
            )
        assert refused.value.status == 422


def test_records_are_written_once_per_change_and_read_back_after_a_restart(
    api_client, crds
) -> None:
    from sdcguard.adapters.kube import KubeWriter
    from sdcguard.adapters.observe import PodUse
    from sdcguard.adapters.workload_record import WorkloadBook
    from sdcguard.domain.observed import NodeSnapshot
    from sdcguard.metrics import Metrics

    node, quiet = f"rec-{uuid.uuid4().hex[:6]}", f"quiet-{uuid.uuid4().hex[:6]}"
    clock = [dt.datetime(2026, 12, 1, 12, tzinfo=dt.UTC)]
    live: dict[str, list[PodUse]] = {node: [], quiet: []}
    deleted: set[str] = set()
    custom = client.CustomObjectsApi(api_client)

    def book() -> WorkloadBook:
        return WorkloadBook(
            KubeWriter(api=api_client, metrics=Metrics()),
            OwnerResolver(api_client),
            # Every Node exists but those this test deletes (the cluster is shared: other
            # tests' records must not be touched).
            node=lambda n: None if n in deleted else NodeSnapshot(name=n),
            live=lambda n: list(live.get(n, [])),
            clock=lambda: clock[0],
        )

    first = book()
    assert node not in first.load()
    first.flush()  # settles records other tests left behind
    use = PodUse("team-x", "solo", node, frozenset({"nvidia.com/gpu"}), 4, None)
    live[node] = [use]
    first.note([use], [])
    assert first.flush() == 2  # the record's create and its status
    assert first.flush() == 0  # nothing changed, nothing written
    clock[0] += dt.timedelta(minutes=10)
    live[node] = []
    first.note([], [use])
    assert first.flush() == 1
    stored = custom.get_cluster_custom_object(GROUP, VERSION, "workloadrecords", node)
    assert stored["status"]["idleSince"] == "2026-12-01T12:10:00Z"
    assert stored["status"]["workloads"][0]["lastSeen"] == "2026-12-01T12:10:00Z"
    try:
        # A restart: the new book reads the idle time back and writes nothing.
        second = book()
        idle = second.load()
        assert idle[node] == clock[0]
        second.flush()
        again = custom.get_cluster_custom_object(GROUP, VERSION, "workloadrecords", node)
        assert again["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]
        assert quiet not in second.nodes()  # a node nothing used has no record
        # The Node is deleted: its record goes.
        deleted.add(node)
        second.forget(node)
        assert second.flush() == 1
        with pytest.raises(ApiException) as gone:
            custom.get_cluster_custom_object(GROUP, VERSION, "workloadrecords", node)
        assert gone.value.status == 404
    finally:
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(GROUP, VERSION, "workloadrecords", node)
