"""The operator's Pod tolerates sdcguard's own taints, so a node sdcguard left gated,
testing or quarantined (an uninstall that did not clean up, a one-node cluster) can never
keep a reinstalled operator Pending."""

from __future__ import annotations

from tests.chart.helm import find, render


def _tolerations(values: dict[str, object]) -> list[dict[str, str]]:
    pod = find(render(values), "Deployment")["spec"]["template"]["spec"]
    tolerations: list[dict[str, str]] = pod.get("tolerations") or []
    return tolerations


def test_the_default_taint_keys_are_tolerated() -> None:
    keys = {t["key"]: t for t in _tolerations({})}
    for key in ("sdcguard.dev/unqualified", "sdcguard.dev/testing", "sdcguard.dev/quarantined"):
        assert keys[key] == {"key": key, "operator": "Exists"}  # every effect, NoExecute too


def test_renamed_taint_keys_are_tolerated_and_a_persons_entry_wins() -> None:
    values = {
        "policy": {"taints": {"gate": "example.com/gate"}},
        "tolerations": {"sdcguard.dev/testing": {"operator": "Exists", "effect": "NoSchedule"}},
    }
    keys = {t["key"]: t for t in _tolerations(values)}
    assert keys["example.com/gate"]["operator"] == "Exists"
    assert "sdcguard.dev/unqualified" not in keys
    assert keys["sdcguard.dev/testing"]["effect"] == "NoSchedule"
