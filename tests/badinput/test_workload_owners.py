"""Workload records against a real API server: owners that cannot be followed to the
top (no owner, a deleted owner, a cycle, a kind not served) give a note, never a crash;
and a record at its bound is accepted and far below the API server's size limit."""

from __future__ import annotations

import datetime as dt
import json
import uuid

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

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
    custom.create_cluster_custom_object(
        GROUP,
        VERSION,
        "workloadrecords",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "WorkloadRecord",
            "metadata": {"name": node},
            "spec": {"nodeName": node},
        },
    )
    try:
        custom.patch_cluster_custom_object_status(
            GROUP, VERSION, "workloadrecords", node, {"status": to_body(record)}
        )
        stored = custom.get_cluster_custom_object(GROUP, VERSION, "workloadrecords", node)
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
    finally:
        custom.delete_cluster_custom_object(GROUP, VERSION, "workloadrecords", node)
