"""A baseline outlives the day it was made: the operator's seeds, the real probe and
the operator's judging, with the clock (creation times, ``now``) injected."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from sdcguard.adapters.pass_state import FleetView
from sdcguard.adapters.test_runner import _data_seed_of, _seed_of
from sdcguard.api import BaselineMode, BaselineSettings, SDCTest, Verdict
from sdcguard.builders.probe_job import PROBE_IMAGE_ENV, ProbeJobRequest, build_probe_job
from sdcguard.domain.baselines import fingerprint_spec, record_candidate
from sdcguard.domain.judging import PodEnd, judge_result
from sdcprobe.config import plan_config
from sdcprobe.result import parse_result
from tests.probe.conftest import run_cli

DAY_1 = dt.datetime(2026, 3, 4, 9, 0, tzinfo=dt.UTC)
DAY_3 = DAY_1 + dt.timedelta(days=2, hours=5)
IMAGE = "registry.example/sdcprobe@sha256:" + "ab" * 32
CHECKS = ("compute", "collective", "memory", "golden")


def _sdctest(name: str, node: str, created: dt.datetime) -> SDCTest:
    return SDCTest.model_validate(
        {
            "metadata": {"name": name, "uid": f"uid-{name}", "creationTimestamp": created},
            "spec": {"nodeName": node, "policyRef": "p", "reason": "Expiry"},
        }
    )


def _screen(test: SDCTest, tmp_path: Path) -> tuple[str, PodEnd]:
    """Run the probe as the operator's Job would for ``test``: its seeds, its image."""
    seed, data = _seed_of(test), _data_seed_of(test, FleetView(nodes={}, tests={}))
    env = {PROBE_IMAGE_ENV: IMAGE}
    run = run_cli(
        ["run", "--device", "cpu", "--budget", "8", "--seed", str(seed), "--data-seed", str(data)],
        tmp_path,
        env,
    )
    assert run.rc == 0, run.stderr[-3000:]
    assert run.termination is not None
    return run.termination, PodEnd(run.termination, 0)


def test_a_baseline_established_on_day_one_still_certifies_on_day_three(tmp_path: Path) -> None:
    settings = BaselineSettings(mode=BaselineMode.CONSENSUS, quorum=2)
    spec, status = None, None
    for node in ("n1", "n2"):  # day 1: two nodes, each with its own data, reach the quorum
        text, end = _screen(_sdctest(f"{node}-1", node, DAY_1), tmp_path)
        first = judge_result(end, CHECKS, {})
        assert first.verdict == Verdict.INCONCLUSIVE and first.fingerprint is not None
        update = record_candidate(
            spec,
            status,
            fingerprint=fingerprint_spec(first.fingerprint),
            node=node,
            test=f"{node}-1",
            digests=first.digests,
            settings=settings,
            now=DAY_1,
        )
        spec, status = update.spec, update.status
    assert spec is not None and spec.trusted

    # Day 3: a third node's screening (another day, another data seed) is judged
    # against day 1's baseline, and passes: same fingerprint, same baseline digests.
    text, end = _screen(_sdctest("n3-1", "n3", DAY_3), tmp_path)
    result = parse_result(text)
    assert result.fingerprint is not None
    assert result.fingerprint.hash == spec.fingerprint.hash
    assert result.data_seed != _data_seed_of(_sdctest("n1-1", "n1", DAY_1), FleetView({}, {}))
    judged = judge_result(end, CHECKS, {spec.fingerprint.hash: spec})
    assert judged.verdict == Verdict.PASS, judged.message
    later = record_candidate(
        spec,
        status,
        fingerprint=spec.fingerprint,
        node="n3",
        test="n3-1",
        digests=judged.digests,
        settings=settings,
        now=DAY_3,
    )
    assert later.spec == spec and "n3" in later.status.agreeing_nodes


def test_the_probe_image_is_part_of_the_fingerprint() -> None:
    """The image the operator runs reaches the probe (SDCPROBE_IMAGE) and its config
    hash, so a new image (a new digest) is a new fingerprint with its own baseline."""
    req = ProbeJobRequest(
        test_name="n1-1",
        test_uid="u",
        node_name="n1",
        namespace="sdcguard-system",
        image=IMAGE,
        checks=CHECKS,
        budget_seconds=60,
        active_deadline_seconds=600,
        ttl_seconds_after_finished=60,
        accelerators=(),
        tolerated_taint_keys=(),
        env=((PROBE_IMAGE_ENV, "spoofed"), ("X", "1")),
    )
    container = build_probe_job(req)["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env[PROBE_IMAGE_ENV] == container["image"] == IMAGE and env["X"] == "1"
    ours = plan_config(60, "cuda", seed=1, image=IMAGE).config_hash()
    other = IMAGE.replace("ab" * 32, "cd" * 32)
    assert plan_config(60, "cuda", seed=1, image=other).config_hash() != ours
    assert plan_config(60, "cuda", seed=1, data_seed=9, image=IMAGE).config_hash() == ours
