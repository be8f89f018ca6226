"""Summaries of the trials, the targets, and the three result files (json, md, png)."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.detection.detectors import (
    DETECTORS,
    LABELS,
    Thresholds,
    first_alarm,
    names_site,
    peak,
    wilson,
)
from bench.detection.profiles import Context, Profile
from bench.detection.trials import Outcome

Doc = dict[str, Any]

#: Persistent profiles on which the golden check must find every activated trial.
RECALL_TARGET = ("F1", "F2", "F3", "F4", "F7", "F11", "F12")
#: Profiles on which the recall gap to ABFT-bf16 and to loss monitoring is shown.
GAP_PROFILES = ("F1", "F2", "F7", "F11")


def _rate(k: int, n: int) -> Doc:
    lo, hi = wilson(k, n)
    return {
        "k": k,
        "n": n,
        "p": round(k / n, 4) if n else None,
        "ci95": [round(lo, 4), round(hi, 4)],
    }


def _detect_step(o: Outcome, detector: str, thresholds: Thresholds, start: int) -> int | None:
    if detector == "golden":
        return o.first_step if o.verdict == "fail" else None
    assert o.signals is not None
    return first_alarm(o.signals, detector, thresholds, start)


def _median(values: Sequence[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def summarize_control(profile: Profile, outs: Sequence[Outcome], thr: Thresholds) -> Doc:
    """Healthy-side profiles: how often each detector raises an alarm at all."""
    n = len(outs)
    detectors: Doc = {}
    for d in DETECTORS:
        k = sum(_detect_step(o, d, thr, 0) is not None for o in outs)
        detectors[d] = {"alarms": _rate(k, n)}
    return {
        "id": profile.id,
        "title": profile.title,
        "anchor": profile.anchor,
        "group": profile.group,
        "kind": profile.kind,
        "trials": n,
        "golden_verdicts": dict(sorted(Counter(o.verdict for o in outs).items())),
        "golden_reason_example": outs[0].reason if outs else None,
        "detectors": detectors,
        "cpu_s_per_trial": round(statistics.fmean(o.cpu_s for o in outs), 3) if outs else None,
    }


def summarize_fault(
    profile: Profile, outs: Sequence[Outcome], thr: Thresholds, ctx: Context
) -> Doc:
    """Fault profiles: detection over activated trials, masking, time to detect, site naming."""
    n = len(outs)
    act = [o for o in outs if o.injected > 0]
    detectors: Doc = {}
    for d in DETECTORS:
        steps = [(o, _detect_step(o, d, thr, o.hit_steps[0])) for o in act]
        hits = [(o, s) for o, s in steps if s is not None]
        ttd = [s - o.hit_steps[0] for o, s in hits]
        any_alarm = sum(_detect_step(o, d, thr, 0) is not None for o in outs)
        entry: Doc = {
            "activated": _rate(len(hits), len(act)),
            "all_trials": _rate(any_alarm, n),
            "ttd_steps_median": _median(ttd),
            "ttd_steps_max": max(ttd) if ttd else None,
        }
        if d != "golden":
            peaks = [peak(o.signals, d, thr) for o in act if o.signals is not None]
            entry["peak_over_threshold_median"] = _median(
                [p if math.isfinite(p) else 1e9 for p in peaks]
            )
        detectors[d] = entry
    golden_hits = [o for o in act if o.verdict == "fail"]
    doc: Doc = {
        "id": profile.id,
        "title": profile.title,
        "anchor": profile.anchor,
        "group": profile.group,
        "kind": profile.kind,
        "sites": profile.sites(ctx),
        "example_faults": profile.faults(ctx, 0),
        "trials": n,
        "reused": sum(o.reused for o in outs),
        "activated": len(act),
        "masked": sum(o.masked for o in act),
        "masking_rate": _rate(sum(o.masked for o in act), len(act)),
        "injected_elements_median": _median([o.injected for o in act]),
        "first_hit_step_median": _median([o.hit_steps[0] for o in act]),
        "golden_verdicts": dict(sorted(Counter(o.verdict for o in outs).items())),
        "golden_site_named": _rate(sum(o.site_named for o in golden_hits), len(golden_hits)),
        "trace_site_named": _rate(
            sum(names_site(o.trace_item, profile.sites(ctx)) for o in golden_hits),
            len(golden_hits),
        ),
        "golden_first_items": dict(
            Counter(o.first_item or "?" for o in golden_hits).most_common(4)
        ),
        "detectors": detectors,
        "cpu_s_per_trial": round(statistics.fmean(o.cpu_s for o in outs), 3) if outs else None,
    }
    if profile.step_probability is not None:
        p = profile.step_probability
        doc["ceiling"] = round(1 - (1 - p) ** ctx.steps, 4)
        doc["activated_share"] = _rate(len(act), n)
    if profile.onset is not None:
        onset = profile.onset(ctx)
        doc["onset_step"] = onset
        doc["golden_at_onset"] = _rate(sum(o.first_step == onset for o in golden_hits), len(act))
    return doc


def coverage(rows: Sequence[Doc]) -> Doc:
    """Issue 9: per detector, the share of sites it sees at all, next to pooled recall."""
    sites = [r for r in rows if r["group"] == "issue9" and r["activated"]]
    out: Doc = {"sites": [r["sites"][0] for r in sites]}
    for d in DETECTORS:
        seen = [r["sites"][0] for r in sites if r["detectors"][d]["activated"]["k"] > 0]
        k = sum(r["detectors"][d]["activated"]["k"] for r in sites)
        n = sum(r["detectors"][d]["activated"]["n"] for r in sites)
        out[d] = {
            "coverage": _rate(len(seen), len(sites)),
            "sites_seen": seen,
            "recall": _rate(k, n),
        }
    return out


def targets(rows: dict[str, Doc]) -> list[Doc]:
    """The issue's targets, each met, missed, or not evaluated (profile not run)."""
    out: list[Doc] = []

    def add(name: str, met: bool | None, detail: str) -> None:
        out.append({"target": name, "met": met, "detail": detail})

    def golden(pid: str) -> Doc:
        rate: Doc = rows[pid]["detectors"]["golden"]["activated"]
        return rate

    have = [p for p in RECALL_TARGET if p in rows and rows[p]["activated"]]
    if have:
        missed = [f"{p} {golden(p)['k']}/{golden(p)['n']}" for p in have if golden(p)["p"] != 1]
        add(
            "golden recall 100% on activated persistent profiles",
            not missed,
            f"{', '.join(have)}: "
            + ("all detected" if not missed else "missed " + "; ".join(missed)),
        )
    if "F6" in rows:
        r = rows["F6"]
        got = r["detectors"]["golden"]["all_trials"]
        gap = got["p"] - r["ceiling"]
        add(
            "F6 within 5 points of its ceiling",
            abs(gap) <= 0.05,
            f"golden {got['p']:.3f} of all trials [{got['ci95'][0]:.3f}, {got['ci95'][1]:.3f}] vs "
            f"ceiling {r['ceiling']:.3f} ({100 * gap:+.1f} points; the ceiling is "
            f"{'inside' if got['ci95'][0] <= r['ceiling'] <= got['ci95'][1] else 'outside'} "
            f"the 95% CI); activated share {r['activated_share']['p']:.3f}, golden on "
            f"activated {golden('F6')['k']}/{golden('F6')['n']}: any gap between golden and "
            "the activated share is detection, the rest is how often the fault fired",
        )
    if "F5" in rows:
        r = rows["F5"]
        at = r["golden_at_onset"]
        add(
            "F5 detected at the first comparison after onset",
            at["n"] > 0 and at["k"] == at["n"],
            f"first divergent step = onset step {r['onset_step']} in {at['k']}/{at['n']} "
            "activated trials",
        )
    if "F5-after" in rows:
        r = rows["F5-after"]
        k = r["detectors"]["golden"]["all_trials"]["k"]
        add(
            "F5-after honestly missed",
            k == 0 and r["activated"] == 0,
            f"{r['activated']}/{r['trials']} activated, golden alarms {k}/{r['trials']}",
        )
    for pid, allowed in (("H0", ("pass",)), ("H1", ("pass", "inconclusive")), ("H2", ("pass",))):
        if pid not in rows:
            continue
        verdicts = rows[pid]["golden_verdicts"]
        sdc = verdicts.get("fail", 0)
        if pid == "H2":
            ok = sdc == 0 and set(verdicts) == {"inconclusive"}
            name = "H2 always inconclusive"
        elif pid == "H0":
            ok = sdc == 0
            name = "zero SDC verdicts on H0"
        else:
            ok = sdc == 0 and set(verdicts) <= set(allowed)
            name = "H1 never called SDC"
        add(name, ok, f"golden verdicts {verdicts}")
    return out


def recall_gaps(rows: dict[str, Doc]) -> list[Doc]:
    """Golden's recall minus ABFT-bf16's and the loss monitor's (points), per profile."""
    out = []
    for pid in GAP_PROFILES:
        if pid not in rows or not rows[pid]["activated"]:
            continue
        det = rows[pid]["detectors"]
        g = det["golden"]["activated"]["p"]
        out.append(
            {
                "profile": pid,
                "golden": g,
                "abft_bf16": det["abft_bf16"]["activated"]["p"],
                "loss": det["loss"]["activated"]["p"],
                "gap_to_abft_bf16_points": round(100 * (g - det["abft_bf16"]["activated"]["p"]), 1),
                "gap_to_loss_points": round(100 * (g - det["loss"]["activated"]["p"]), 1),
            }
        )
    return out


# --- markdown -------------------------------------------------------------------------


def _cell(rate: Doc) -> str:
    if not rate["n"]:
        return "-"
    lo, hi = rate["ci95"]
    return f"{rate['k']}/{rate['n']} = {rate['p']:.2f} [{lo:.2f}, {hi:.2f}]"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _pct(rate: Doc) -> str:
    return f"{100 * rate['p']:.0f}%" if rate["n"] else "-"


def markdown(doc: Doc) -> str:
    """The results as markdown tables."""
    rows: list[Doc] = doc["profiles"]
    faults = [r for r in rows if r["kind"] == "fault"]
    controls = [r for r in rows if r["kind"] != "fault"]
    cfg = doc["config"]
    fp = doc["fingerprint"]
    lines = [
        "# Detection benchmark",
        "",
        f"`{doc['command']}` on {doc['generated_at']}, mode **{doc['mode']}**, "
        f"{doc['runtime']['wall_s']:.0f} s wall, {doc['runtime']['cpu_s']:.0f} s CPU "
        f"({doc['machine']['cpus']} shared cores, 1-minute load average "
        f"{doc['machine']['load_avg_1m_start']} at the start, {doc['machine']['load_avg_1m']} "
        "at the end: wall time stretches with other work on the machine, CPU time does not).",
        "",
        f"Fingerprint: backend `{fp['backend']}`, `{fp['device_model']}`, {fp['device_count']} "
        f"devices, torch {fp['torch']}, `{fp['cpu_isa']}`, {fp['threads']} thread(s); hash "
        f"`{fp['hash'][:16]}` (model seed {cfg['fingerprint_seed']}; the config hash, hence "
        "the fingerprint, differs per model seed).",
        "",
        f"Golden model: {cfg['model']['n_layers']} layers, d={cfg['model']['d_model']}, "
        f"{cfg['steps']} training steps per screening; monitors judge steps "
        f"{cfg['window']}..{cfg['steps'] - 1} against a {cfg['window']}-step trailing window; "
        f"thresholds = largest score on {cfg['calibration_runs']} healthy calibration runs "
        f"({cfg['bf16_calibration_runs']} of them also for bf16 checksum noise) "
        f"x {1 + cfg['headroom']:.2f}.",
        "",
        "## Detection probability over activated trials (k/n = p [95% Wilson CI])",
        "",
        "| profile | fault | activated | masked | "
        + " | ".join(LABELS[d] for d in DETECTORS)
        + " |",
        "|---|---|---|---|" + "---|" * len(DETECTORS),
    ]
    for r in faults:
        cells = [_cell(r["detectors"][d]["activated"]) for d in DETECTORS]
        lines.append(
            f"| {r['id']} | {r['title']} | {r['activated']}/{r['trials']} | "
            f"{_pct(r['masking_rate'])} | " + " | ".join(cells) + " |"
        )
    lines += [
        "",
        "## Time to detect (median steps after the first corrupted step) and site naming",
        "",
        "| profile | first hit (median step) | "
        + " | ".join(LABELS[d] for d in DETECTORS)
        + " | golden names the site | golden's first divergent items |",
        "|---|---|" + "---|" * len(DETECTORS) + "---|---|",
    ]
    for r in faults:
        ttd = [r["detectors"][d]["ttd_steps_median"] for d in DETECTORS]
        items = ", ".join(f"`{k}` {v}" for k, v in r["golden_first_items"].items())
        lines.append(
            f"| {r['id']} | {_num(r['first_hit_step_median'])} | "
            + " | ".join(_num(t) for t in ttd)
            + f" | {_cell(r['golden_site_named'])} | {items or '-'} |"
        )
    differ = [r for r in faults if r["golden_site_named"]["k"] != r["trace_site_named"]["k"]]
    for r in differ:
        lines.append(
            f"\n{r['id']}: the judge names `{next(iter(r['golden_first_items']), '?')}`; the "
            f"traces themselves first differ at the injected site in "
            f"{_cell(r['trace_site_named'])} (the judge reports the item of the earliest "
            "evidence, and a non-finite loss is evidence at the same step)."
        )
    lines += [
        "",
        "## Healthy side: alarms on runs without SDC (k/n = rate [95% CI])",
        "",
        "| profile | what | golden verdicts | " + " | ".join(LABELS[d] for d in DETECTORS) + " |",
        "|---|---|---|" + "---|" * len(DETECTORS),
    ]
    for r in controls:
        verdicts = ", ".join(f"{k} {v}" for k, v in r["golden_verdicts"].items())
        cells = [_cell(r["detectors"][d]["alarms"]) for d in DETECTORS]
        lines.append(f"| {r['id']} | {r['title']} | {verdicts} | " + " | ".join(cells) + " |")
    special = [r for r in faults if "ceiling" in r or "onset_step" in r]
    if special:
        lines += ["", "## Occasional and late faults", ""]
        for r in special:
            g = r["detectors"]["golden"]
            if "ceiling" in r:
                lines.append(
                    f"- {r['id']}: ceiling 1-(1-p)^S = {r['ceiling']:.3f}; activated "
                    f"{_cell(r['activated_share'])} of all trials; golden "
                    f"{_cell(g['all_trials'])} of all trials."
                )
            if "onset_step" in r:
                lines.append(
                    f"- {r['id']}: onset step {r['onset_step']}; golden diverges at the onset "
                    f"in {_cell(r['golden_at_onset'])} of activated trials; alarms over all "
                    f"trials: golden {_cell(g['all_trials'])}."
                )
    if doc.get("recall_gaps"):
        lines += [
            "",
            "## Recall gap (points) of golden over ABFT-bf16 and loss monitoring",
            "",
            "| profile | golden | ABFT bf16 | loss z-score | gap to ABFT bf16 | gap to loss |",
            "|---|---|---|---|---|---|",
        ]
        for g in doc["recall_gaps"]:
            lines.append(
                f"| {g['profile']} | {g['golden']:.2f} | {g['abft_bf16']:.2f} | {g['loss']:.2f} "
                f"| {g['gap_to_abft_bf16_points']:+.0f} | {g['gap_to_loss_points']:+.0f} |"
            )
    cov = doc.get("coverage")
    if cov and cov["sites"]:
        lines += [
            "",
            f"## Site coverage (issue 9): {', '.join(cov['sites'])}",
            "",
            "| detector | sites seen at all | recall over these sites |",
            "|---|---|---|",
        ]
        for d in DETECTORS:
            c = cov[d]
            lines.append(
                f"| {LABELS[d]} | {c['coverage']['k']}/{c['coverage']['n']} "
                f"({', '.join(c['sites_seen']) or 'none'}) | {_cell(c['recall'])} |"
            )
        if doc.get("sites_missing"):
            lines.append(f"\nSites the probe lacks: {', '.join(doc['sites_missing'])}.")
    cost = doc["cost_cpu_s"]
    lines += [
        "",
        "## CPU seconds per screening",
        "",
        "| detector | own cost (CPU s) | note |",
        "|---|---|---|",
    ]
    for d in DETECTORS:
        c = cost[d]
        lines.append(f"| {LABELS[d]} | {c['cpu_s']:.4g} | {c['note']} |")
    lines += ["", "## Targets", ""]
    for t in doc["targets"]:
        mark = {True: "met", False: "**missed**", None: "not evaluated"}[t["met"]]
        lines.append(f"- {t['target']}: {mark} ({t['detail']})")
    lines += ["", "## Definitions", ""]
    lines += [f"- **{k}**: {v}" for k, v in doc["definitions"].items()]
    thr = doc["thresholds"]
    lines += [
        "",
        "## Calibrated thresholds",
        "",
        f"- loss z-score > {thr['loss']:.3g}; grad-norm z-score > {thr['grad_norm']:.3g}",
        "- ABFT bf16 (bf16 units): "
        + ", ".join(f"{k} {v:.3g}" for k, v in thr["abft_bf16"].items()),
        "- ABFT fp32 (fp32 units): "
        + ", ".join(f"{k} {v:.3g}" for k, v in thr["abft_fp32"].items()),
        "",
    ]
    return "\n".join(lines)


def chart(doc: Doc, path: Path) -> None:
    """Bar chart: detection probability per fault profile, one bar per detector, 95% CIs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in doc["profiles"] if r["kind"] == "fault" and r["activated"]]
    controls = [r for r in doc["profiles"] if r["kind"] != "fault"]
    fig, (ax, bx) = plt.subplots(
        1,
        2,
        figsize=(max(10, 0.9 * len(rows) + 4), 4.8),
        gridspec_kw={"width_ratios": [max(len(rows), 1), max(len(controls), 1) + 1]},
    )
    width = 0.8 / len(DETECTORS)
    colors = ["#1b7837", "#762a83", "#af8dc3", "#e08214", "#fdb863"]

    def bars(axis: Any, table: list[Doc], key: str) -> None:
        for i, d in enumerate(DETECTORS):
            xs, ys, lo, hi = [], [], [], []
            for j, r in enumerate(table):
                rate = r["detectors"][d][key]
                p = rate["p"] or 0.0
                xs.append(j + (i - (len(DETECTORS) - 1) / 2) * width)
                ys.append(p)
                lo.append(p - rate["ci95"][0])
                hi.append(rate["ci95"][1] - p)
            axis.bar(
                xs,
                ys,
                width,
                yerr=[lo, hi],
                capsize=1.5,
                error_kw={"elinewidth": 0.7, "ecolor": "#555555"},
                label=LABELS[d],
                color=colors[i],
            )
        axis.set_xticks(range(len(table)))
        axis.set_xticklabels([r["id"] for r in table], rotation=45, ha="right")
        axis.set_ylim(0, 1.05)

    bars(ax, rows, "activated")
    ax.set_ylabel("detection probability (activated trials)")
    ax.set_title("Fault profiles")
    bars(bx, controls, "alarms")
    bx.set_title("Healthy side: alarm rate")
    bx.set_ylabel("alarm probability (all trials)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0, -0.2), ncol=5)
    fp = doc["fingerprint"]
    fig.suptitle(
        f"sdcguard detection benchmark ({doc['mode']}), {doc['generated_at']}, "
        f"fingerprint {fp['hash'][:12]} ({fp['backend']}, torch {fp['torch']}, "
        f"{fp['threads']} thread)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
