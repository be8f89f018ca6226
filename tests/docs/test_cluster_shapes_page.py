"""The cluster shapes guide's policies are valid SDCPolicies and do what the page says
for their shape: the tainted pool's taint is tolerated, the runtime class reaches the
probe, the MIG policy runs no collective check."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from sdcguard.api import SDCPolicy, Suite, Toleration
from sdcguard.domain.lifecycle import NodeState
from sdcguard.domain.nodecondition import condition_for

PAGE = Path(__file__).parents[2] / "docs" / "guides" / "cluster-shapes.md"


def _policies() -> dict[str, SDCPolicy]:
    blocks = re.findall(r"```yaml\n(.*?)```", PAGE.read_text(), flags=re.DOTALL)
    docs = [yaml.safe_load(b) for b in blocks]
    return {
        d["metadata"]["name"]: SDCPolicy.model_validate(d)
        for d in docs
        if d.get("kind") == "SDCPolicy"
    }


def _tolerated(tolerations: list[Toleration], key: str, value: str, effect: str) -> bool:
    return any(t.tolerates(key, value, effect) for t in tolerations)


def test_the_page_has_a_section_and_a_policy_per_shape() -> None:
    text = PAGE.read_text()
    for heading in (
        "## Tainted GPU pools",
        "## Runtime classes",
        "## MIG",
        "## DRA-only GPU nodes",
        "## NVLink domains",
        "## Remediators that read Node conditions",
    ):
        assert heading in text
    assert set(_policies()) == {
        "aks-gpu",
        "dra-gpus",
        "gb200",
        "gke-h100",
        "gpu-operator",
        "mig-mixed",
    }


def test_the_dra_policy_claims_nvidias_class_counted_from_its_driver() -> None:
    assert _policies()["dra-gpus"].spec.dra_classes == (("gpu.nvidia.com", "gpu.nvidia.com"),)


def test_the_clique_policy_holds_one_node_a_clique() -> None:
    (budget,) = _policies()["gb200"].spec.budgets.topology
    assert (budget.label_key, budget.max_unavailable) == ("nvidia.com/gpu.clique", 1)


def test_the_condition_table_says_what_the_operator_writes() -> None:
    """Each row of the page's SDCQualified table is what condition_for gives."""
    text = PAGE.read_text()
    for state, certified in (
        (NodeState.QUALIFIED, True),
        (NodeState.UNQUALIFIED, False),
        (NodeState.SUSPECT, False),
        (NodeState.QUARANTINED, False),
        (NodeState.REPAIRING, False),
        (NodeState.VERIFYING, False),
        (NodeState.RETIRED, False),
        (NodeState.EXCLUDED, False),
    ):
        c = condition_for(state, certified=certified, enforce=True)
        assert f"| `{c.status}` | `{c.reason}` |" in text, (state, c)
    observe = condition_for(NodeState.QUALIFIED, certified=True, enforce=False)
    assert f"| `{observe.status}` | `{observe.reason}` |" in text


@pytest.mark.parametrize(
    ("policy", "taint"),
    [
        ("aks-gpu", ("sku", "gpu", "NoSchedule")),
        ("aks-gpu", ("nvidia.com/gpu", "present", "NoSchedule")),
        ("gke-h100", ("nvidia.com/gpu", "present", "NoSchedule")),
        ("gke-h100", ("google.com/tpu", "present", "NoSchedule")),
    ],
)
def test_the_pool_policies_tolerate_their_pools_taints(
    policy: str, taint: tuple[str, str, str]
) -> None:
    assert _tolerated(_policies()[policy].spec.probe.tolerations, *taint)


def test_the_runtime_class_policy_sets_what_it_shows() -> None:
    probe = _policies()["gpu-operator"].spec.probe
    assert probe.runtime_class_name == "nvidia"
    assert probe.image_pull_secrets == ["registry-credentials"]
    assert probe.priority_class_name == "gpu-screening"


def test_the_mig_policy_runs_no_collective_check() -> None:
    spec = _policies()["mig-mixed"].spec
    for suite in Suite:
        assert "collective" not in {c.name.value for c in spec.suites.checks(suite)}
