"""Verdict logic on synthetic traces (pure: no devices, no torch)."""

from __future__ import annotations

from sdcprobe.config import plan_config
from sdcprobe.judge import judge, judge_check
from sdcprobe.result import Baseline, Fingerprint
from sdcprobe.trace import (
    CheckTrace,
    DeviceFacts,
    Evidence,
    WorkerReport,
    step_digest,
    trace_digest,
)

CONFIG = plan_config(6, "cpu")


def steps(
    n: int, bad_from: int | None = None, item: str = "layers.0.ffn.down"
) -> list[dict[str, str]]:
    out = []
    for s in range(n):
        items = {"embedding": f"e{s}", item: f"x{s}", "loss": f"l{s}"}
        if bad_from is not None and s >= bad_from:
            items[item] = f"BAD{s}"
            items["loss"] = f"BADLOSS{s}"
        out.append(items)
    return out


def trace(
    n: int = 10, bad_from: int | None = None, evidence: list[Evidence] | None = None
) -> CheckTrace:
    st = steps(n, bad_from)
    return CheckTrace(digest=trace_digest(st), steps=st, evidence=evidence or [])


def facts(threads: int = 1) -> DeviceFacts:
    return DeviceFacts(
        backend="cpu",
        device_model="cpu: test",
        torch="2.9.0",
        cpu_isa="x86_64-AVX512",
        threads=threads,
    )


def fingerprint(devices: int = 2, threads: int = 1) -> Fingerprint:
    return Fingerprint.build(
        backend="cpu",
        device_model="cpu: test",
        device_count=devices,
        driver=None,
        runtime=None,
        torch="2.9.0",
        torch_xla=None,
        cpu_isa="x86_64-AVX512",
        threads=threads,
        config_hash=CONFIG.config_hash(),
    )


def baseline_for(fp: Fingerprint, n: int = 10) -> Baseline:
    healthy = steps(n)
    return Baseline(
        fingerprint=fp,
        digests={"golden": trace_digest(healthy)},
        step_digests={"golden": [step_digest(s) for s in healthy]},
    )


def test_agreeing_devices_pass_and_say_no_baseline_was_given() -> None:
    r = judge_check("golden", {0: trace(), 1: trace()}, None, fingerprint())
    assert r.verdict == "pass" and r.baseline == "absent" and "no baseline" in r.reason
    assert r.digest == trace().digest


def test_two_devices_disagreeing_fail_without_naming_either() -> None:
    r = judge_check("golden", {0: trace(), 1: trace(bad_from=4)}, None, fingerprint())
    assert r.verdict == "fail" and r.odd_device is None
    assert r.first_divergent_step == 4 and r.first_divergent_submodule == "layers.0.ffn.down"


def test_majority_names_the_odd_device() -> None:
    traces = {0: trace(), 1: trace(), 2: trace(bad_from=7), 3: trace()}
    r = judge_check("golden", traces, None, fingerprint(4))
    assert r.verdict == "fail" and r.odd_device == 2 and r.first_divergent_step == 7


def test_replay_evidence_names_the_device() -> None:
    ev = [
        Evidence(kind="replay", step=3, item="layers.1.attention.output", detail="replay diverged")
    ]
    r = judge_check("golden", {0: trace(), 1: trace(evidence=ev)}, None, fingerprint())
    assert r.verdict == "fail" and r.odd_device == 1
    assert (r.first_divergent_step, r.first_divergent_submodule) == (3, "layers.1.attention.output")


def test_identical_corruption_everywhere_is_only_seen_against_the_baseline() -> None:
    fp = fingerprint()
    bad = {0: trace(bad_from=5), 1: trace(bad_from=5)}
    assert judge_check("golden", bad, None, fp).verdict == "pass"
    r = judge_check("golden", bad, baseline_for(fp), fp)
    assert r.verdict == "fail" and r.baseline == "mismatch"
    assert r.first_divergent_step == 5 and r.odd_device is None


def test_baseline_names_the_odd_device_of_two() -> None:
    fp = fingerprint()
    r = judge_check("golden", {0: trace(bad_from=2), 1: trace()}, baseline_for(fp), fp)
    assert r.verdict == "fail" and r.odd_device == 0 and r.first_divergent_step == 2


def test_collective_blames_the_sender_everyone_sees_wrong() -> None:
    def ev(src: int) -> list[Evidence]:
        return [Evidence(kind="collective", step=0, item="allgather", source=src, detail="bad")]

    traces = {0: trace(evidence=ev(2)), 1: trace(evidence=ev(2)), 2: trace()}
    r = judge_check("collective", traces, None, fingerprint(3))
    assert r.verdict == "fail" and r.odd_device == 2


def test_other_fingerprint_is_inconclusive_never_fail() -> None:
    here = fingerprint(threads=1)
    other = baseline_for(fingerprint(threads=2))
    reports = {
        r: WorkerReport(rank=r, facts=facts(), checks={"golden": trace(bad_from=1)}) for r in (0, 1)
    }
    result = judge(["golden"], reports, CONFIG, other, injection_enabled=False, duration_s=1.0)
    assert result.fingerprint is not None and result.fingerprint.hash == here.hash
    assert result.verdict == "inconclusive" and result.exit_code() == 2
    assert "threads: 2 in baseline, 1 here" in result.reason
    assert result.checks["golden"].baseline == "fingerprint-mismatch"


def test_a_crashed_worker_makes_the_run_inconclusive() -> None:
    reports: dict[int, WorkerReport | None] = {
        0: WorkerReport(rank=0, facts=facts(), checks={"golden": trace()}),
        1: WorkerReport(rank=1, error="timed out after 60s"),
    }
    result = judge(["golden"], reports, CONFIG, None, injection_enabled=False, duration_s=1.0)
    assert result.verdict == "inconclusive" and "timed out" in result.reason


def test_sdc_beats_a_crash_elsewhere() -> None:
    ev = [Evidence(kind="abft", step=0, item="float32", detail="residual 50x tolerance")]
    reports: dict[int, WorkerReport | None] = {
        0: WorkerReport(
            rank=0, facts=facts(), checks={"compute": trace(evidence=ev), "golden": trace()}
        ),
        1: WorkerReport(
            rank=1, facts=facts(), checks={"compute": trace(), "golden": CheckTrace(error="boom")}
        ),
    }
    result = judge(
        ["compute", "golden"], reports, CONFIG, None, injection_enabled=False, duration_s=1.0
    )
    assert result.verdict == "fail" and result.checks["compute"].odd_device == 0
    assert result.checks["golden"].verdict == "inconclusive"


def test_device_ids_are_reported_by_index_and_stay_out_of_the_fingerprint() -> None:
    named = {
        0: WorkerReport(
            rank=0,
            facts=facts().model_copy(update={"device_id": "GPU-aaaa"}),
            checks={"golden": trace()},
        ),
        1: WorkerReport(rank=1, facts=facts(), checks={"golden": trace(bad_from=1)}),
    }
    result = judge(["golden"], named, CONFIG, None, injection_enabled=False, duration_s=1.0)
    assert result.devices == ["GPU-aaaa", ""], "the unnamed device keeps its index"
    assert result.fingerprint is not None and result.fingerprint.hash == fingerprint().hash
    plain = {r: WorkerReport(rank=r, facts=facts(), checks={"golden": trace()}) for r in (0, 1)}
    result = judge(["golden"], plain, CONFIG, None, injection_enabled=False, duration_s=1.0)
    assert result.devices == [], "none named: empty"


def test_device_id_comes_from_the_device_plugins_uuids(monkeypatch) -> None:
    import torch

    from sdcprobe.backends import Backend
    from sdcprobe.fingerprint import device_uuid as device_id

    cpu = torch.device("cpu")
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "GPU-1111-aaaa, GPU-2222-bbbb")
    assert device_id(Backend("cpu", 1, cpu, 1)) == "GPU-2222-bbbb"
    assert device_id(Backend("cpu", 2, cpu, 1)) is None, "no entry for this device"
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "0,1")  # indexes name no hardware
    assert device_id(Backend("cpu", 0, cpu, 1)) is None
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "all")
    assert device_id(Backend("cpu", 0, cpu, 1)) is None
