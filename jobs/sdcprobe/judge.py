"""Turn the device workers' traces into verdicts. Pure and torch-free.

Evidence, strongest first:

1. Direct: a replay on the same device that differs, an ABFT residual above
   its worst-case bound, a collective result that differs from the exactly
   known answer, a memory pattern that reads back with flipped bits, a
   non-finite loss. Any of these is SDC.
2. Devices disagree: the same deterministic computation gave different bits.
3. The baseline (same fingerprint) disagrees: the only way to see a fault that
   hits every device identically and repeats on replay.

The odd device is named when exactly one device is implicated: by its own
direct evidence, by disagreeing with a strict majority (three or more devices),
or by disagreeing with the baseline. With two devices that disagree and nothing
else, either could be wrong and none is named.

A baseline recorded under another fingerprint makes the run inconclusive: it is
a configuration error, never evidence of SDC.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from sdcprobe.config import ProbeConfig
from sdcprobe.result import (
    MAX_DEVICE_UUIDS,
    Baseline,
    BaselineStatus,
    CheckResult,
    Fingerprint,
    Injection,
    ProbeResult,
    RunPlan,
    Verdict,
)
from sdcprobe.trace import (
    CheckTrace,
    DeviceFacts,
    WorkerReport,
    first_divergence,
    first_step_divergence,
    site_of_item,
    trace_digest,
)

Metrics = dict[str, int | float | str | None]


def build_fingerprint(
    facts: list[DeviceFacts],
    device_count: int,
    config: ProbeConfig,
    device_uuids: Sequence[str | None] = (),
) -> Fingerprint:
    """The run's fingerprint from the workers' device facts, device count and config hash.

    ``device_uuids[i]`` is device i's identity (None where unknown); kept only when at
    least one is known and there are at most ``MAX_DEVICE_UUIDS`` devices."""
    first = facts[0]
    models = sorted({f.device_model for f in facts})
    # A node with mixed devices gets a fingerprint of its own rather than borrowing one.
    model = models[0] if len(models) == 1 else " | ".join(models)[:128]
    return Fingerprint.build(
        backend=first.backend,
        device_model=model,
        device_count=device_count,
        driver=first.driver,
        runtime=first.runtime,
        torch=first.torch,
        torch_xla=first.torch_xla,
        cpu_isa=first.cpu_isa,
        threads=first.threads,
        config_hash=config.config_hash(),
        device_uuids=(
            list(device_uuids)
            if any(device_uuids) and len(device_uuids) <= MAX_DEVICE_UUIDS
            else []
        ),
    )


def fingerprint_difference(ours: Fingerprint, theirs: Fingerprint) -> str:
    """Readable list of the fields two fingerprints differ in."""
    a, b = ours.model_dump(exclude={"hash"}), theirs.model_dump(exclude={"hash"})
    diffs = [f"{k}: {b[k]!r} in baseline, {a[k]!r} here" for k in a if a[k] != b[k]]
    return "; ".join(diffs) or "hash only"


class _Location:
    """The earliest (step, item) any piece of evidence points at."""

    def __init__(self) -> None:
        self.step: int | None = None
        self.item: str | None = None

    def note(self, step: int | None, item: str | None) -> None:
        if step is None:
            return
        if self.step is None or step < self.step or (step == self.step and self.item is None):
            self.step, self.item = step, item


def _baseline_status(
    name: str, baseline: Baseline | None, fingerprint: Fingerprint | None
) -> BaselineStatus:
    if baseline is None:
        return "absent"
    if fingerprint is None or baseline.fingerprint.hash != fingerprint.hash:
        return "fingerprint-mismatch"
    return "match" if name in baseline.digests else "absent"


def _fmt(ranks: set[int] | list[int]) -> str:
    return ",".join(str(r) for r in sorted(ranks))


def judge_check(
    name: str,
    traces: dict[int, CheckTrace | None],
    baseline: Baseline | None,
    fingerprint: Fingerprint | None,
    baseline_rounds: int | None = None,
    planned_rounds: int | None = None,
) -> CheckResult:
    """Verdict of one check from every device's trace (None: the device reported nothing).

    Devices are compared over every round they ran. The check's ``digest`` (what a
    baseline stores and the operator's consensus compares) covers the first
    ``baseline_rounds`` rounds only, which every plan runs, so runs with different
    plans stay comparable; None covers every round. A device that ran fewer than
    ``planned_rounds`` rounds makes the check inconclusive (never a pass on part
    of a plan), unless it stopped at the check's deadline after at least the
    rounds a baseline covers: the plan then ended there, and devices are compared
    over the rounds all of them ran."""
    errors: dict[int, str] = {}
    ok: dict[int, CheckTrace] = {}
    for rank, trace in traces.items():
        if trace is None:
            errors[rank] = "no result"
        elif trace.error or trace.digest is None:
            errors[rank] = trace.error or "no digest"
        elif (
            planned_rounds is not None
            and len(trace.steps) < planned_rounds
            and not (trace.cut_at_deadline and len(trace.steps) >= (baseline_rounds or 1))
        ):
            errors[rank] = f"ran {len(trace.steps)} of {planned_rounds} planned rounds"
            ok[rank] = trace  # its evidence still counts
        elif baseline_rounds is not None and len(trace.steps) < baseline_rounds:
            errors[rank] = f"ran {len(trace.steps)} rounds, fewer than a baseline covers"
            ok[rank] = trace
        else:
            ok[rank] = trace

    def comparable(trace: CheckTrace) -> str:
        if baseline_rounds is None or trace.digest is None:
            return trace.digest or ""
        return trace_digest(trace.steps[:baseline_rounds])

    status = _baseline_status(name, baseline, fingerprint)
    where = _Location()
    suspects: set[int] = set()
    findings: list[str] = []

    # 1. Direct evidence inside each device.
    observers: set[int] = set()
    sources: set[int] = set()
    direct: list[str] = []
    for rank, trace in sorted(ok.items()):
        for ev in trace.evidence:
            where.note(ev.step, ev.item)
            if ev.kind == "collective":
                observers.add(rank)
                if ev.source is not None:
                    sources.add(ev.source)
            else:
                suspects.add(rank)
            at = f" at step {ev.step}" if ev.step is not None else ""
            item = f" ({ev.item})" if ev.item else ""
            line = f"device {rank}: {ev.detail}{at}{item}"
            if line not in direct:
                direct.append(line)
    # The first few say what happened; the count says how much.
    findings.extend(direct[:3])
    if len(direct) > 3:
        findings.append(f"{len(direct) - 3} more findings")
    if observers:
        # A bad chunk seen by everyone came from its sender; a bad result seen by
        # one rank is that rank's.
        if len(observers) == 1:
            suspects |= observers
        elif len(sources) == 1:
            suspects |= sources
        else:
            suspects |= observers

    # 2. Devices against each other, over every round they ran.
    digests = {r: t.digest for r, t in ok.items() if t.digest is not None}
    lengths = {len(t.steps) for t in ok.values()}
    if len(lengths) > 1:  # a device fell short of the plan: compare what all of them ran
        common = min(lengths)
        digests = {r: trace_digest(t.steps[:common]) for r, t in ok.items() if t.digest}
    prefix = {r: comparable(t) for r, t in ok.items() if t.digest is not None}
    counts = Counter(digests.values())
    base_digest = baseline.digests.get(name) if status == "match" and baseline is not None else None
    reference: str | None = None
    matching = [r for r, d in prefix.items() if d == base_digest]
    if base_digest is not None and matching:
        reference = digests[min(matching)]
    elif counts:
        top, top_n = counts.most_common(1)[0]
        if top_n * 2 > len(digests):
            reference = top
    disagree = len(counts) > 1
    if disagree:
        groups = {d: sorted(r for r, x in digests.items() if x == d) for d in counts}
        findings.append(
            "devices disagree: " + " vs ".join(f"[{_fmt(g)}]" for g in sorted(groups.values()))
        )
        if reference is not None:
            suspects |= {r for r, d in digests.items() if d != reference}
        ref_rank = (
            min(r for r, d in digests.items() if d == reference) if reference else min(digests)
        )
        for rank, digest in digests.items():
            if digest != digests[ref_rank]:
                div = first_divergence(ok[ref_rank].steps, ok[rank].steps)
                if div is not None:
                    where.note(*div)

    # 3. The baseline, over the rounds it covers.
    if base_digest is not None:
        off = {r for r, d in prefix.items() if d != base_digest}
        if off:
            status = "mismatch"
            suspects |= off
            findings.append(f"device(s) {_fmt(off)} differ from the baseline")
            base_steps = baseline.step_digests.get(name) if baseline is not None else None
            if base_steps:
                for rank in off:
                    ours = ok[rank].steps[: baseline_rounds or len(ok[rank].steps)]
                    where.note(first_step_divergence(ours, base_steps), None)

    failed = bool(findings)
    verdict: Verdict
    if failed:
        verdict = "fail"
        reason = "; ".join(findings)
    elif errors:
        verdict = "inconclusive"
        reason = "; ".join(f"device {r}: {e}" for r, e in sorted(errors.items()))
    elif status == "fingerprint-mismatch":
        verdict = "inconclusive"
        reason = "baseline recorded under another fingerprint: digests not comparable"
    else:
        verdict = "pass"
        n = len(digests)
        agree = f"{n} devices agree" if n > 1 else "1 device"
        given = "matches the baseline" if status == "match" else "no baseline given"
        reason = f"{agree}, no corruption seen, {given}"
    shown_rank = (
        min(r for r, d in digests.items() if d == reference)
        if reference is not None
        else (min(digests) if digests else None)
    )
    shown = prefix[shown_rank] if shown_rank is not None else None
    metrics = _merge_metrics(ok)
    metrics["devices"] = len(traces)
    site = site_of_item(name, where.item) if failed else None
    if site is not None:
        metrics["first_divergent_site"] = site
    if suspects:
        metrics["suspect_devices"] = _fmt(suspects)
    return CheckResult(
        verdict=verdict,
        reason=reason,
        digest=shown,
        metrics=metrics,
        odd_device=next(iter(suspects)) if len(suspects) == 1 else None,
        first_divergent_step=where.step if failed else None,
        first_divergent_submodule=where.item if failed else None,
        baseline=status,
    )


#: Metrics added up over devices (memory flips), and the smallest over devices
#: (what every device was at least tested with).
_SUMMED_METRICS = frozenset({"flips", "flipped_words"})
_MIN_METRICS = frozenset({"bytes_tested"})
#: Per-device details, kept for every device that has them, prefixed with its index.
_PER_DEVICE_METRICS = frozenset({"flip_bits", "flip_offsets"})


def _merge_metrics(ok: dict[int, CheckTrace]) -> Metrics:
    """The first device's metrics, with ABFT residuals as the worst over devices,
    memory flips summed, and flip locations kept per device."""
    if not ok:
        return {}
    ranks = sorted(ok)
    merged: Metrics = {
        k: v for k, v in ok[ranks[0]].metrics.items() if k not in _PER_DEVICE_METRICS
    }
    for rank in ranks[1:]:
        for key, value in ok[rank].metrics.items():
            old = merged.get(key)
            if isinstance(value, int | float) and isinstance(old, int | float):
                if key.startswith("abft_"):
                    merged[key] = max(old, value)
                elif key in _SUMMED_METRICS:
                    merged[key] = old + value
                elif key in _MIN_METRICS:
                    merged[key] = min(old, value)
            elif key.startswith("abft_") and isinstance(value, str):
                merged[key] = value  # "inf"/"nan" beats any number
    for key in sorted(_PER_DEVICE_METRICS):
        parts = [f"device {r}: {ok[r].metrics[key]}" for r in ranks if ok[r].metrics.get(key)]
        if parts:
            merged[key] = "; ".join(parts)
    return merged


def judge(
    checks: list[str],
    reports: dict[int, WorkerReport | None],
    config: ProbeConfig,
    baseline: Baseline | None,
    injection_enabled: bool,
    duration_s: float,
    plan: RunPlan | None = None,
) -> ProbeResult:
    """The probe result from all workers' reports (None: the worker left no report).

    ``plan``: the rounds planned for this run; a check that ran fewer is
    inconclusive, and a plan that could not be made (``plan.error``) makes the
    run inconclusive with its reason."""
    facts = [r.facts for _, r in sorted(reports.items()) if r is not None and r.facts is not None]
    uuids = [
        r.facts.uuid if r is not None and r.facts else None for _, r in sorted(reports.items())
    ]
    fingerprint = build_fingerprint(facts, len(reports), config, uuids) if facts else None
    by_site: Counter[str] = Counter()
    for report in reports.values():
        if report is not None:
            by_site.update(report.injections)
    injection = Injection(
        enabled=injection_enabled,
        count=sum(by_site.values()),
        by_site=dict(sorted(by_site.items())),
    )
    results: dict[str, CheckResult] = {}
    for name in checks:
        traces = {
            rank: (report.checks.get(name) if report is not None else None)
            for rank, report in reports.items()
        }
        planned = plan.rounds.get(name) if plan is not None else None
        results[name] = judge_check(
            name, traces, baseline, fingerprint, config.baseline_rounds.get(name), planned
        )
    worker_errors = [
        f"device {r}: {rep.error if rep else 'no report'}"
        for r, rep in sorted(reports.items())
        if rep is None or rep.error
    ]
    failed = [n for n, c in results.items() if c.verdict == "fail"]
    verdict: Verdict
    mismatched_fp = baseline is not None and (
        fingerprint is None or baseline.fingerprint.hash != fingerprint.hash
    )
    other_seed = baseline is not None and baseline.seed is not None and baseline.seed != config.seed

    if other_seed and baseline is not None:
        reason = (
            f"baseline was recorded for seed {baseline.seed}, this run used seed "
            f"{config.seed}: digests of other data are not comparable; give the baseline "
            "of this seed"
        )
        if failed:
            reason += f"; note: {', '.join(failed)} also failed: " + results[failed[0]].reason
        verdict = "inconclusive"
    elif plan is not None and plan.error is not None:
        verdict = "inconclusive"
        reason = plan.error
    elif mismatched_fp and fingerprint is not None and baseline is not None:
        reason = (
            "baseline was recorded under another fingerprint ("
            + fingerprint_difference(fingerprint, baseline.fingerprint)
            + "): record a baseline for this fingerprint"
        )
        if failed:
            reason += f"; note: {', '.join(failed)} also failed: " + results[failed[0]].reason
        verdict = "inconclusive"
    elif failed:
        verdict = "fail"
        reason = f"SDC detected by {', '.join(failed)}: {results[failed[0]].reason}"
    elif fingerprint is None or worker_errors or any(c.verdict != "pass" for c in results.values()):
        verdict = "inconclusive"
        bad = [f"{n}: {c.reason}" for n, c in results.items() if c.verdict != "pass"]
        reason = "; ".join(worker_errors + bad) or "no device reported"
    else:
        verdict = "pass"
        absent = [n for n, c in results.items() if c.baseline != "match"]
        if baseline is None:
            given = "no baseline given"
        elif absent:
            given = f"baseline matched; it has no digest for {', '.join(absent)}"
        else:
            given = "baseline matched"
        reason = f"all checks pass on {len(reports)} device(s); {given}"
    if injection.enabled:
        reason += f" [fault injection on: {injection.count} elements corrupted]"
    return ProbeResult(
        verdict=verdict,
        reason=reason,
        fingerprint=fingerprint,
        checks=results,
        injection=injection,
        duration_s=round(duration_s, 3),
        seed=config.seed,
        plan=plan,
    )
