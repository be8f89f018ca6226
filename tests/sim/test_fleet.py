"""Fleet files: the shipped fleets load, and every mistake names its entry."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import yaml

from sdcdev.sim.__main__ import main
from sdcdev.sim.catalogue import CATALOGUE
from sdcdev.sim.fleet import DEMO_FLEET, FLEETS_DIR, FleetError, load_fleet, parse_fleet

F2_LIKE = {"site": "attention.output", "rate": 4.78e-3, "bits": [0, 22], "mode": "flip"}


def fleet_doc(*nodes: dict[str, object], **top: object) -> dict[str, object]:
    return {"name": "t", "nodes": list(nodes), **top}


def test_demo_fleet_is_mixed_with_a_steady_and_an_intermittent_fault() -> None:
    fleet = load_fleet(DEMO_FLEET)
    types = {n.instance_type.name for n in fleet.nodes}
    assert {"p5.48xlarge", "trn1.32xlarge"} <= types
    assert 8 <= len(fleet.nodes) <= 10
    faulty = [n for n in fleet.nodes if n.fault_profile is not None]
    assert len(faulty) == 2
    assert any(
        n.fault_profile.intermittent is None and n.fault_profile.faults[0] == F2_LIKE
        for n in faulty
        if n.fault_profile
    )
    assert any(n.fault_profile.intermittent for n in faulty if n.fault_profile)
    assert all(t.key == "sdcguard.dev/unqualified" for n in fleet.nodes for t in n.taints)


def test_e2e_fleet_has_30_nodes_and_3_differently_faulty() -> None:
    fleet = load_fleet(FLEETS_DIR / "e2e-30.yaml")
    assert len(fleet.nodes) == 30
    assert len({n.name for n in fleet.nodes}) == 30
    profiles = [n.fault_profile for n in fleet.nodes if n.fault_profile is not None]
    assert len(profiles) == 3
    assert len({p.env_value() for p in profiles}) == 3


def test_name_prefix_expands_and_zones_rotate() -> None:
    fleet = parse_fleet(
        fleet_doc({"namePrefix": "gpu-", "count": 3, "instanceType": "p5.48xlarge"})
    )
    assert [n.name for n in fleet.nodes] == ["gpu-00", "gpu-01", "gpu-02"]
    assert [n.zone for n in fleet.nodes] == list(CATALOGUE["p5.48xlarge"].zones)
    node = fleet.nodes[0]
    assert node.labels["node.kubernetes.io/instance-type"] == "p5.48xlarge"
    assert node.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert node.labels["topology.kubernetes.io/zone"] == "us-east-2a"
    assert node.labels["eks.amazonaws.com/nodegroup"] == "p5-48xlarge"


def test_taints_accept_kubelet_syntax_and_entries_override_defaults() -> None:
    fleet = parse_fleet(
        fleet_doc(
            {"name": "a", "instanceType": "trn1.32xlarge"},
            {"name": "b", "instanceType": "trn1.32xlarge", "taints": ["team=ml:NoExecute"]},
            defaults={"taints": ["sdcguard.dev/unqualified:NoSchedule"], "cpuDevices": 3},
        )
    )
    a, b = fleet.nodes
    assert [t.to_k8s() for t in a.taints] == [
        {"key": "sdcguard.dev/unqualified", "value": "", "effect": "NoSchedule"}
    ]
    assert [t.to_k8s() for t in b.taints] == [{"key": "team", "value": "ml", "effect": "NoExecute"}]
    assert a.cpu_devices == 3


def test_intermittent_flag_means_half_the_runs() -> None:
    fleet = parse_fleet(
        fleet_doc(
            {
                "name": "a",
                "instanceType": "p5.48xlarge",
                "faultProfile": {"intermittent": True, "faults": [F2_LIKE]},
            }
        )
    )
    profile = fleet.nodes[0].fault_profile
    assert profile is not None and profile.intermittent == 0.5


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        (
            [
                {"name": "ok", "instanceType": "p5.48xlarge"},
                {"name": "bad", "instanceType": "p9.huge"},
            ],
            ["nodes[1] (name 'bad')", "unknown instance type 'p9.huge'", "p5.48xlarge"],
        ),
        (
            [
                {
                    "namePrefix": "sick-",
                    "count": 2,
                    "instanceType": "p5.48xlarge",
                    "faultProfile": {"faults": [{"site": "attention.outptu", "rate": 0.1}]},
                }
            ],
            ["nodes[0] (namePrefix 'sick-')", "invalid fault spec faults[0]", "site"],
        ),
        (
            [
                {
                    "name": "sick",
                    "instanceType": "p5.48xlarge",
                    "faultProfile": {"faults": [{"site": "matmul", "rate": 2.0}]},
                }
            ],
            ["nodes[0] (name 'sick')", "rate"],
        ),
        (
            [
                {"namePrefix": "gpu-", "count": 3, "instanceType": "p5.48xlarge"},
                {"name": "gpu-01", "instanceType": "a3-highgpu-8g"},
            ],
            ["nodes[1] (name 'gpu-01')", "duplicate node name 'gpu-01'", "nodes[0]"],
        ),
        (
            [{"name": "Bad_Name", "instanceType": "p5.48xlarge"}],
            ["nodes[0] (name 'Bad_Name')", "not a valid DNS label"],
        ),
        (
            [{"instanceType": "p5.48xlarge"}],
            ["nodes[0]", "exactly one of 'name' or 'namePrefix'"],
        ),
        (
            [{"name": "a", "instanceType": "p5.48xlarge", "colour": "blue"}],
            ["nodes[0] (name 'a').colour", "Extra inputs"],
        ),
    ],
    ids=["unknown-type", "bad-site", "bad-rate", "duplicate", "bad-name", "no-name", "unknown-key"],
)
def test_errors_name_the_entry(nodes: list[dict[str, object]], expected: list[str]) -> None:
    with pytest.raises(FleetError) as err:
        parse_fleet(fleet_doc(*nodes), "fleet.yaml")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("fleet.yaml: ")
    for part in expected:
        assert part in message


def test_cli_prints_one_line_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(fleet_doc({"name": "x", "instanceType": "p5.huge"})))
    assert main(["--check", "--fleet", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "nodes[0] (name 'x')" in err and "unknown instance type 'p5.huge'" in err


def test_cli_check_lists_the_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--check", "--fleet", str(DEMO_FLEET)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == len(load_fleet(DEMO_FLEET).nodes)


def test_unreadable_and_non_mapping_files(tmp_path: Path) -> None:
    with pytest.raises(FleetError, match="cannot read"):
        load_fleet(tmp_path / "missing.yaml")
    bad = tmp_path / "list.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(FleetError, match="mapping"):
        load_fleet(bad)


def test_a_group_is_labelled_in_nvlink_cliques() -> None:
    fleet = parse_fleet(
        {
            "name": "nvl",
            "nodes": [
                {"namePrefix": "gb-", "count": 40, "instanceType": "p5.48xlarge", "cliqueSize": 18}
            ],
        }
    )
    cliques = Counter(n.labels["nvidia.com/gpu.clique"] for n in fleet.nodes)
    assert cliques == {"gb.0": 18, "gb.1": 18, "gb.2": 4}
    with pytest.raises(FleetError, match="cliqueSize"):
        parse_fleet(
            {
                "name": "nvl",
                "nodes": [
                    {"namePrefix": "g-", "count": 2, "instanceType": "p5.48xlarge", "cliqueSize": 0}
                ],
            }
        )
