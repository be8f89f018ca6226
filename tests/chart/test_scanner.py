"""An outside manifest scanner (checkov, its Kubernetes checks) on what sdcguard deploys:
the rendered chart and a probe Job as the operator builds it. Every finding must be listed,
with its reason, in tests/chart/checkov-accepted.yaml; anything else fails, and so does an
entry there that the scanner no longer reports.

checkov lives in a venv of its own under the cache (tests/chart/install-checkov.sh, run by
``make test``): its pins clash with the project's. It runs offline (--skip-download)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from sdcguard.api import SDCPolicySpec
from sdcguard.builders.probe_job import (
    ProbeJobRequest,
    attestation_secret_name,
    build_attestation_secret,
    build_probe_job,
)
from tests.chart.helm import CHART, ROOT, render

CHECKOV_VERSION = "3.3.30"
ACCEPTED = Path(__file__).with_name("checkov-accepted.yaml")
NAMESPACE = "sdcguard-system"
TEST_NAME = "gpu-node-7-1a2b3-4"


def probe_job(spec: SDCPolicySpec | None = None, *, attested: bool = False) -> dict[str, Any]:
    """The Job the operator builds for a test on an 8-GPU node under ``spec`` (default: an
    empty policy), with the chart's default probe image and priority class; ``attested``:
    mounting the test's attestation Secret, as with the chart's default values."""
    spec = spec or SDCPolicySpec()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    image = f"{values['probe']['image']['repository']}:{app_version}"
    return build_probe_job(
        ProbeJobRequest(
            test_name=TEST_NAME,
            test_uid="0b6c1c8e-3f7e-4a59-9d0e-6a8f2f1d9c11",
            node_name="gpu-node-7",
            namespace=NAMESPACE,
            image=spec.probe.image or image,
            checks=tuple(c.name.value for c in spec.suites.requalification),
            budget_seconds=spec.probe.budget_seconds,
            active_deadline_seconds=spec.probe.active_deadline_seconds,
            ttl_seconds_after_finished=spec.probe.ttl_seconds_after_finished,
            accelerators=(("nvidia.com/gpu", 8),),
            tolerated_taint_keys=(spec.taints.gate, spec.taints.testing, spec.taints.quarantine),
            resources={
                "requests": {k: str(v) for k, v in spec.probe.resources.requests.items()},
                "limits": {k: str(v) for k, v in spec.probe.resources.limits.items()},
            },
            priority_class="sdcguard-probe",
            attestation_secret=attestation_secret_name(TEST_NAME) if attested else None,
        )
    )


def _container(job: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = job["spec"]["template"]["spec"]["containers"][0]
    return container


def test_probe_pods_request_cpu_and_memory_by_default() -> None:
    resources = _container(probe_job())["resources"]
    assert resources["requests"] == {"cpu": "1", "memory": "2Gi", "nvidia.com/gpu": "8"}
    assert resources["limits"] == {"nvidia.com/gpu": "8"}  # Burstable, not BestEffort
    spec = SDCPolicySpec.model_validate(
        {"probe": {"resources": {"requests": {"memory": "64Gi"}, "limits": {"memory": "96Gi"}}}}
    )
    resources = _container(probe_job(spec))["resources"]
    assert resources["requests"] == {"cpu": "1", "memory": "64Gi", "nvidia.com/gpu": "8"}
    assert resources["limits"] == {"memory": "96Gi", "nvidia.com/gpu": "8"}


def test_probe_pods_run_with_the_runtime_default_seccomp_profile() -> None:
    pod = probe_job()["spec"]["template"]["spec"]
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert _container(probe_job())["securityContext"]["seccompProfile"] == {
        "type": "RuntimeDefault"
    }


def _checkov() -> str:
    """The checkov executable: $SDCGUARD_CHECKOV, else the cached venv (made if missing)."""
    given = os.environ.get("SDCGUARD_CHECKOV")
    if given:
        return given
    proc = subprocess.run(
        ["bash", str(ROOT / "tests" / "chart" / "install-checkov.sh")],
        env={**os.environ, "CHECKOV_VERSION": CHECKOV_VERSION},
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    assert proc.returncode == 0, f"could not install checkov {CHECKOV_VERSION}:\n{proc.stderr}"
    return proc.stdout.strip().splitlines()[-1]


def _accepted() -> dict[tuple[str, str], str]:
    entries = yaml.safe_load(ACCEPTED.read_text())["accepted"]
    accepted = {}
    for entry in entries:
        reason = " ".join(str(entry.get("reason", "")).split())
        assert len(reason) > 40, f"{ACCEPTED.name}: {entry['check']} needs a reason"
        for resource in entry["resources"]:
            accepted[(entry["check"], resource)] = reason
    return accepted


def _scan(folder: Path) -> tuple[set[tuple[str, str]], int]:
    proc = subprocess.run(
        [
            _checkov(),
            "--directory",
            str(folder),
            "--framework",
            "kubernetes",
            "--output",
            "json",
            "--compact",
            "--quiet",
            "--skip-download",  # no calls home: findings come from the installed checks
        ],
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE"},
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert proc.returncode in (0, 1), f"checkov crashed ({proc.returncode}):\n{proc.stderr}"
    report = json.loads(proc.stdout)
    report = report[0] if isinstance(report, list) else report
    failed = {(f["check_id"], f["resource"]) for f in report["results"]["failed_checks"]}
    return failed, int(report["summary"]["passed"]) + int(report["summary"]["failed"])


@pytest.fixture(scope="module")
def scanned(tmp_path_factory: pytest.TempPathFactory) -> tuple[set[tuple[str, str]], int]:
    folder = tmp_path_factory.mktemp("manifests")
    (folder / "chart.yaml").write_text(
        yaml.safe_dump_all(render(namespace=NAMESPACE), sort_keys=False)
    )
    # The probe Job and its attestation Secret as the operator builds them by default.
    secret = build_attestation_secret(
        TEST_NAME, "0b6c1c8e-3f7e-4a59-9d0e-6a8f2f1d9c11", NAMESPACE, {"nonce": "n", "key": "k"}
    )
    (folder / "probe-job.yaml").write_text(
        yaml.safe_dump_all([probe_job(attested=True), secret], sort_keys=False)
    )
    return _scan(folder)


def test_scanner_findings_are_all_accepted_with_a_reason(
    scanned: tuple[set[tuple[str, str]], int],
) -> None:
    failed, checks = scanned
    assert checks > 150, f"the scanner ran only {checks} checks; did it see the manifests?"
    accepted = _accepted()
    new = sorted(failed - set(accepted))
    assert not new, (
        f"checkov findings not in {ACCEPTED.name} (fix them, or list them with a reason): {new}"
    )
    stale = sorted(set(accepted) - failed)
    assert not stale, f"{ACCEPTED.name} lists findings the scanner no longer reports: {stale}"


def test_the_fixed_findings_stay_fixed(scanned: tuple[set[tuple[str, str]], int]) -> None:
    """Requests, seccomp and NetworkPolicies: what the probe Job and the chart once lacked."""
    failed, _ = scanned
    job = f"Job.{NAMESPACE}.sdcprobe-{TEST_NAME}"
    for check in ("CKV_K8S_10", "CKV_K8S_12", "CKV_K8S_31"):  # CPU, memory requests; seccomp
        assert (check, job) not in failed
    assert not [f for f in failed if f[0] == "CKV2_K8S_6"]  # pods without a NetworkPolicy
