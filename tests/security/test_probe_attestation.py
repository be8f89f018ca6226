"""Anyone who may write a probe Pod's status or create Pods in the operator's namespace
(trust model row "forge a verdict"): only the screening's own probe can pass it.

Each SDCTest's nonce and key are derived from the operator's attestation key and the
test's uid, written into a Secret only that test's Job mounts; the probe seals its
result with them (``sdcprobe.attest``). A result without a valid MAC, or sealed for
another test, is Inconclusive (Unattested), never Pass. The unit tests forge the
termination message the judge reads; the cluster test runs the operator on the real
API server, where a forged Pod status fails the screening and a sealed one passes it.
"""

from __future__ import annotations

import base64
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sdcguard.api import Verdict
from sdcguard.builders.probe_job import build_attestation_secret
from sdcguard.domain.attestation import Attestation
from sdcguard.domain.judging import PodEnd, judge_result
from sdcprobe import attest
from sdcprobe.cli import _termination_text
from sdcprobe.result import TERMINATION_LIMIT, parse_result
from tests.chart.test_scanner import probe_job
from tests.unit.factories import CHECKS, check, result, text
from tests.unit.test_judging import trusted

OPERATOR_KEY = bytes(range(32))
MINE = Attestation.derive(OPERATOR_KEY, "uid-of-this-test")
OTHER = Attestation.derive(OPERATOR_KEY, "uid-of-another-test")
PASSING = text(result("pass", {c: check(value="good", baseline="match") for c in CHECKS}))


def _judge(message: str, exit_code: int = 0, **kw: Any) -> Any:
    return judge_result(PodEnd(message, exit_code, **kw), CHECKS, trusted(), None, MINE)


def test_an_unsealed_passing_result_is_not_a_pass() -> None:
    """The attack: a ``pods/status`` write with a result that matches the trusted
    baseline (its digests are in every passing Pod's status of the day)."""
    assert judge_result(PodEnd(PASSING, 0), CHECKS, trusted()).verdict == Verdict.PASS
    j = _judge(PASSING)
    assert (j.verdict, j.reason) == (Verdict.INCONCLUSIVE, "Unattested")
    assert "carries no MAC" in j.message


def test_a_result_sealed_for_another_test_or_with_another_key_is_not_a_pass() -> None:
    j = _judge(attest.seal(PASSING, OTHER.key, OTHER.nonce))
    assert (j.verdict, j.reason) == (Verdict.INCONCLUSIVE, "Unattested")
    assert "another screening" in j.message
    guessed = attest.seal(PASSING, b"k" * 32, MINE.nonce)  # the nonce is no secret
    j = _judge(guessed)
    assert (j.verdict, j.reason) == (Verdict.INCONCLUSIVE, "Unattested")
    assert "does not verify" in j.message
    # One changed byte of a sealed result breaks it.
    sealed = attest.seal(PASSING, MINE.key, MINE.nonce)
    j = _judge(sealed.replace('"verdict":"pass"', '"verdict":"pass" ', 1))
    assert j.reason == "Unattested"
    # A forged SDC is not acted on either.
    sdc = text(result("fail", {**{c: check() for c in CHECKS}, "golden": check("fail")}))
    assert _judge(sdc, 1).reason == "Unattested"


def test_the_probes_own_sealed_result_passes_and_a_crash_stays_a_crash() -> None:
    j = _judge(attest.seal(PASSING, MINE.key, MINE.nonce))
    assert (j.verdict, j.reason) == (Verdict.PASS, "Passed")
    # A probe that died before writing a result leaves its log's tail: judged as that.
    j = _judge("Traceback (most recent call last):\n  boom", 137, crashed=True, detail="OOMKilled")
    assert j.verdict == Verdict.CRASH


def test_the_probe_seals_what_it_writes_within_the_termination_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe's side: with the per-test Secret mounted, the termination message is
    the squeezed result and its MAC, at most the kubelet's 4096 bytes, and it opens
    with the operator's derivation of the same test's key."""
    folder = tmp_path / "attest"
    folder.mkdir()
    for name, value in MINE.secret_data().items():
        (folder / name).write_text(value)
    monkeypatch.setenv(attest.ENV, str(folder))
    huge = {c: check(value="good", baseline="match", reason="x" * 3000) for c in CHECKS}
    probe_result = parse_result(text(result("pass", huge)))
    message = _termination_text(probe_result)
    assert len(message.encode()) <= TERMINATION_LIMIT
    document, why = MINE.open(message)
    assert why == "" and document is not None
    assert parse_result(document).verdict == "pass"
    assert OTHER.open(message)[0] is None
    monkeypatch.delenv(attest.ENV)
    assert MINE.open(_termination_text(probe_result))[0] is None  # unsealed without it


def test_only_the_tests_own_job_mounts_its_secret() -> None:
    plain = probe_job()["spec"]["template"]["spec"]
    assert all("secret" not in v for v in plain["volumes"])
    secret = build_attestation_secret("t-1", "uid-1", "sdcguard-system", MINE.secret_data())
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert set(secret["stringData"]) == {"nonce", "key"}


# On the real API server, through the operator ------------------------------------


class SealingKubelet:
    """Completes probe Pods as a kubelet would, each with a passing result: sealed
    with the Secret its Pod mounts where ``honest``, else written as is (a forger)."""

    def __init__(self, api: client.ApiClient, honest: set[str], forged: set[str]) -> None:
        from sdcdev.harness import NS, result_message, terminated_probe

        self.core = client.CoreV1Api(api)
        self.honest, self.forged = honest, forged
        self.ns, self.result_message, self.terminated = NS, result_message, terminated_probe

    def step(self) -> None:
        pods = self.core.list_namespaced_pod(
            self.ns, label_selector="app.kubernetes.io/component=sdcprobe"
        ).items
        for pod in pods:
            node = pod.spec.node_name
            if node not in self.honest | self.forged or pod.status.phase in (
                "Succeeded",
                "Failed",
            ):
                continue
            args = list(pod.spec.containers[0].args or [])
            checks = tuple(args[args.index("--checks") + 1].split(","))
            code, message = self.result_message("pass", checks)
            if node in self.honest:
                (volume,) = [v for v in pod.spec.volumes if v.secret is not None]
                data = self.core.read_namespaced_secret(volume.secret.secret_name, self.ns).data
                key = bytes.fromhex(base64.b64decode(data["key"]).decode())
                nonce = base64.b64decode(data["nonce"]).decode()
                message = attest.seal(message, key, nonce)
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            status = {
                "phase": "Succeeded",
                "startTime": now,
                "containerStatuses": [
                    self.terminated(pod.spec.containers[0].image, code, message, now)
                ],
            }
            with contextlib.suppress(client.ApiException):
                self.core.patch_namespaced_pod_status(
                    pod.metadata.name, self.ns, {"status": status}
                )


@pytest.fixture
def sealing_operator(
    cluster: Any, crds: None, api_client: client.ApiClient, tmp_path: Path
) -> Iterator[Any]:
    from sdcdev.harness import OperatorProcess, delete_all

    key_file = tmp_path / "attestation-key"
    key_file.write_text(OPERATOR_KEY.hex())
    proc = OperatorProcess(
        cluster.kubeconfig,
        tmp_path / "operator.log",
        env={"SDCGUARD_PROBE_ATTESTATION_KEY_FILE": str(key_file)},
    ).start()
    try:
        yield proc
    finally:
        proc.stop()
        delete_all(api_client)


@pytest.mark.cluster
def test_a_forged_pod_status_does_not_pass_a_node_the_sealed_result_does(
    api_client: client.ApiClient, sealing_operator: Any
) -> None:
    from sdcdev.harness import (
        create_policy,
        gpu_nodes,
        list_custom,
        new_case,
        node_state,
        trusted_baseline,
        wait_for,
    )

    case = new_case()
    honest, forged = f"att-ok-{case}", f"att-forged-{case}"
    trusted_baseline(api_client)
    kubelet = SealingKubelet(api_client, {honest}, {forged})

    def tests_of(node: str) -> list[dict[str, Any]]:
        return list_custom(api_client, "sdctests", node)

    with gpu_nodes(api_client, [honest, forged], case=case):
        create_policy(api_client, case)

        def settled() -> bool:
            kubelet.step()
            forged_done = any(
                (t.get("status") or {}).get("reason") == "Unattested" for t in tests_of(forged)
            )
            return node_state(api_client, honest) == "Qualified" and forged_done

        wait_for(settled, 120, "the honest node to qualify and the forgery to be refused")
        assert node_state(api_client, forged) != "Qualified"
        (refused, *_) = [
            t for t in tests_of(forged) if (t.get("status") or {}).get("reason") == "Unattested"
        ]
        assert refused["status"]["phase"] == "Inconclusive"
        assert "not this screening's" in refused["status"]["message"]
        # Each Job mounts a Secret of its own, owned by its SDCTest.
        core = client.CoreV1Api(api_client)
        secrets = core.list_namespaced_secret(
            "sdcguard-system", label_selector="app.kubernetes.io/component=sdcprobe"
        ).items
        owners = {s.metadata.owner_references[0].name for s in secrets}
        assert {t["metadata"]["name"] for t in tests_of(honest)} <= owners
