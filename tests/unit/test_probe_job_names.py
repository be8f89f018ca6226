"""Probe Jobs on nodes with long names (Karpenter's kwok names nodes ~55 characters)."""

from __future__ import annotations

import re

from sdcguard.adapters.observe import probe_job, probe_pod
from sdcguard.builders.probe_job import (
    NODE_LABEL,
    TEST_ANNOTATION,
    TEST_LABEL,
    ProbeJobRequest,
    build_probe_job,
    job_name,
    label_value,
)

LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
NODE = "kwok-gated-19438-f9tt5-markivory-1-5a2ubwoy2i-3486332290"
TEST = f"{NODE}-93965-1"


def request() -> ProbeJobRequest:
    return ProbeJobRequest(
        test_name=TEST,
        test_uid="uid-1",
        node_name=NODE,
        namespace="sdcguard-system",
        image="example.invalid/sdcprobe:test",
        checks=("compute",),
        budget_seconds=5,
        active_deadline_seconds=60,
        ttl_seconds_after_finished=60,
        accelerators=(("nvidia.com/gpu", 8),),
        tolerated_taint_keys=("sdcguard.dev/testing",),
    )


def test_short_values_are_kept_and_long_ones_hashed_to_a_valid_label() -> None:
    assert label_value("node-1") == "node-1"
    long = label_value(TEST)
    assert len(long) <= 63 and LABEL_VALUE.match(long)
    assert long != label_value(TEST + "x")
    assert label_value("a" * 51 + "-" + "b" * 20).count("--") == 0


def test_job_for_a_long_test_name_has_valid_labels_and_the_full_name_annotated() -> None:
    job = build_probe_job(request())
    for meta in (job["metadata"], job["spec"]["template"]["metadata"]):
        for value in meta["labels"].values():
            assert len(value) <= 63 and LABEL_VALUE.match(value), value
        assert meta["annotations"][TEST_ANNOTATION] == TEST
    assert job["metadata"]["labels"][NODE_LABEL] == NODE
    assert len(job["metadata"]["name"]) <= 63


def test_observers_read_the_full_test_name_from_the_annotation() -> None:
    job = build_probe_job(request())
    pod = {"metadata": job["spec"]["template"]["metadata"], "spec": {"nodeName": NODE}}
    seen_pod = probe_pod(pod)
    seen_job = probe_job({"metadata": job["metadata"], "status": {}})
    assert seen_pod is not None and seen_pod.test_name == TEST
    assert seen_job is not None and seen_job.test_name == TEST
    # A Pod made before the annotation existed is still read by its label.
    del pod["metadata"]["annotations"][TEST_ANNOTATION]
    pod["metadata"]["labels"][TEST_LABEL] = "short-test"
    legacy = probe_pod(pod)
    assert legacy is not None and legacy.test_name == "short-test"


def test_tests_of_one_long_named_node_get_distinct_valid_job_names() -> None:
    names = {job_name(f"{NODE}-93965-{n}") for n in range(1, 6)}
    assert len(names) == 5
    for name in names:
        assert len(name) <= 63 and LABEL_VALUE.match(name), name
    assert job_name("short-test-1") == "sdcprobe-short-test-1"
