"""Every Node write is a plan step written by the plan's node-patch stage.

The drain's end, a node that baseline consensus finds suspect, and a node that a
workload's SDCReport accuses were once patched with bodies built on the spot; they are
plans of annotation steps now, written where a decision's node patch is written.
"""

from __future__ import annotations

import ast
import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sdcguard.adapters.kube import KubeWriter
from sdcguard.adapters.node_writes import NodePatchStage, annotation_plan
from sdcguard.adapters.pass_state import Expectations, FleetView, KnownTests
from sdcguard.adapters.reports import ReportAdmission, report_facts
from sdcguard.adapters.test_runner import TestRunner
from sdcguard.api.report import SDCReport
from sdcguard.domain import keys
from sdcguard.domain.lifecycle import Cordon
from sdcguard.domain.observed import NodeSnapshot
from sdcguard.domain.plan import Plan
from sdcguard.domain.reports import ReportDecision
from sdcguard.metrics import Metrics
from sdcguard.settings import Settings

ADAPTERS = Path(__file__).resolve().parents[2] / "operator" / "sdcguard" / "adapters"
NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


class _Recorder(KubeWriter):
    """Every write in order (the report's own status goes through ``custom``)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.calls: list[tuple[str, Any]] = []
        calls = self.calls

        class _Custom:
            def patch_namespaced_custom_object_status(self, *args: Any) -> None:
                calls.append(("sdcreports-status", args[-1]))

        self.custom = _Custom()  # type: ignore[assignment]

    def patch_node(self, name: str, patch: dict[str, Any]) -> None:
        self.calls.append(("node-patch", (name, patch)))

    def patch_node_status(self, name: str, patch: dict[str, Any]) -> None:
        self.calls.append(("node-status-patch", (name, patch)))

    def event(self, **kw: Any) -> None:
        self.calls.append(("event", kw["reason"]))


def _writer() -> _Recorder:
    return _Recorder(api=client.ApiClient(), metrics=Metrics())


def test_no_adapter_but_the_node_patch_stage_patches_a_node() -> None:
    callers = set()
    for path in sorted(ADAPTERS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "patch_node"
            ):
                callers.add(path.name)
    assert callers == {"node_writes.py", "kube.py"}, callers


def test_an_annotation_plan_writes_its_annotations_in_one_merge_patch() -> None:
    writer = _writer()
    stage = NodePatchStage(writer)
    plan = annotation_plan([(keys.DRAIN_UNTIL, None), (keys.REQUEST_SUSPECT, "why")])
    assert stage.annotate("gpu-1", plan)
    annotations = {keys.DRAIN_UNTIL: None, keys.REQUEST_SUSPECT: "why"}
    assert writer.calls == [("node-patch", ("gpu-1", {"metadata": {"annotations": annotations}}))]


def test_an_annotation_plan_refuses_a_step_that_needs_the_nodes_facts() -> None:
    # A cordon or a taint is planned against the node as observed, and goes out with
    # its resourceVersion: only a decision's guarded patch may carry one.
    with pytest.raises(ValueError, match="Cordon is not an annotation step"):
        NodePatchStage(_writer()).annotate("gpu-1", Plan.of([Cordon()]))


def test_a_node_baseline_consensus_finds_suspect_is_marked_through_the_stage() -> None:
    writer = _writer()
    runner = TestRunner(
        writer,
        Settings(metrics_port=0),
        writer.metrics,
        KnownTests(),
        Expectations(),
        NodePatchStage(writer),
    )
    view = FleetView(
        nodes={
            "gpu-2": NodeSnapshot(name="gpu-2"),
            "gpu-3": NodeSnapshot(name="gpu-3", annotations={keys.REQUEST_SUSPECT: "earlier"}),
        }
    )
    runner._report_suspect("gpu-2", "digests disagree", view)
    runner._report_suspect("gpu-3", "digests disagree", view)  # asked already: left alone
    runner._report_suspect("gpu-9", "digests disagree", view)  # gone
    suspect = {"metadata": {"annotations": {keys.REQUEST_SUSPECT: "digests disagree"}}}
    assert writer.calls == [("node-patch", ("gpu-2", suspect))]


def test_an_accepted_report_marks_its_node_before_its_status_and_events() -> None:
    writer = _writer()
    admission = ReportAdmission(writer)
    report = SDCReport.model_validate(
        {
            "apiVersion": "sdcguard.dev/v1alpha1",
            "kind": "SDCReport",
            "metadata": {"name": "r1", "namespace": "team-a", "uid": "u1"},
            "spec": {
                "nodeName": "gpu-1",
                "podName": "llm-0",
                "step": 120,
                "method": "ShadowAudit",
                "confirmation": "Persistent",
            },
        }
    )
    decision = ReportDecision(True, "Accepted", "accepted", "SDCReport team-a/r1: loss spike")
    admission._act(report, report_facts(report), decision, NOW)
    kinds = [kind for kind, _ in writer.calls]
    assert kinds == ["node-patch", "sdcreports-status", "event", "event"], kinds
    name, patch = writer.calls[0][1]
    assert name == "gpu-1"
    assert patch == {
        "metadata": {"annotations": {keys.REQUEST_SUSPECT: "SDCReport team-a/r1: loss spike"}}
    }
