"""Does the golden check name the right place? Localisation of small persistent faults.

    python -m bench.localisation.run [--trials 10] [--steps 12] [--sites norm,param]

For each golden fault site of issue 9 (``attention.softmax``, ``norm``,
``optimizer``, ``param``, ``activation``, ``embedding``) it runs ``--trials``
trials of a small-error persistent fault: active every step from a random
onset step in the first half of the run, at a rate drawn log-uniformly from
[1e-4, 1e-3], alternately a relative error of 1e-5 to 1e-3 (``scale``) or a
flip of a low mantissa bit (``lo-mant``), both below bf16 resolution. Each trial
is read two ways:

* **trace**: :func:`~sdcprobe.checks.golden.run_golden` with the fault against
  a healthy run, item by item (``GoldenTrace.first_divergence``): the first
  divergent item, mapped to its site class by
  :func:`~sdcprobe.trace.site_of_item`, must be the fault's site;
* **probe**: the golden check as a worker runs it (training run plus replay)
  on a second device carrying the fault, judged with a healthy device 0 by
  :func:`~sdcprobe.judge.judge_check` without a baseline: its result's
  ``first_divergent_submodule`` (and ``first_divergent_site`` metric) must
  name the site.

A trial is detected when any divergence is found; the share reported is the
share of detected trials whose first divergent item names the right site
(target: at least 90%). Also reported: the share located at the onset step,
and how many first divergent item names would be ambiguous read literally
(``optimizer.embedding`` contains two site names) — why the mapping exists.
Writes ``bench/results/localisation.json`` and ``bench/results/localisation.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from sdcprobe.backends import setup_backend
from sdcprobe.checks.golden import GoldenTrace, golden_check, run_golden
from sdcprobe.config import GoldenConfig
from sdcprobe.faults import Injector
from sdcprobe.faultspec import SITES, FaultSpec
from sdcprobe.judge import judge_check
from sdcprobe.trace import CheckTrace, site_of_item

RESULTS = Path(__file__).resolve().parent.parent / "results"
SITES_UNDER_TEST = ("attention.softmax", "norm", "optimizer", "param", "activation", "embedding")
TARGET = 0.9
#: Small errors, below bf16 resolution (2^-8 relative) but visible in fp32.
PROFILES: dict[str, dict[str, Any]] = {
    "scale": {"mode": "scale", "scale": [1e-5, 1e-3]},
    "lo-mant": {"mode": "flip", "bits": "lo-mant"},
}


def trial_fault(site: str, trial: int, steps: int) -> dict[str, Any]:
    """The fault of one trial: seeded from (site, trial), so every run repeats it."""
    rng = random.Random(f"{site}/{trial}")
    profile = list(PROFILES)[trial % len(PROFILES)]
    rate = 10 ** rng.uniform(-4.0, -3.0)
    return {
        "site": site,
        "rate": float(f"{rate:.3g}"),
        "onset_step": rng.randrange(max(steps // 2, 1)),
        "seed": trial,
        **PROFILES[profile],
    }


def ambiguous(item: str | None) -> bool:
    """Whether an item's literal name contains more than one site's name."""
    if item is None:
        return False
    return sum(1 for s in SITES if s in item) > 1


def run_trial(
    site: str, trial: int, cfg: GoldenConfig, healthy_trace: GoldenTrace, healthy: CheckTrace
) -> dict[str, Any]:
    """One trial, read against a healthy trace and through the probe's own check."""
    backend = setup_backend("cpu", 0, 1)
    fault = trial_fault(site, trial, cfg.steps)
    spec = FaultSpec.model_validate({"faults": [fault]})
    start = time.perf_counter()
    faulty = run_golden(cfg, spec, backend)
    div = healthy_trace.first_divergence(faulty)
    step, item = div if div is not None else (None, None)

    # The probe: device 1 carries the fault (its injector continues across the replay).
    checked = golden_check(cfg, backend, Injector(spec, 1))
    result = judge_check("golden", {0: healthy, 1: checked}, None, None)
    probe_item = result.first_divergent_submodule
    return {
        "trial": trial,
        "fault": fault,
        "injected": sum(faulty.injections.values()),
        "detected": div is not None,
        "step": step,
        "item": item,
        "site": site_of_item("golden", item),
        "probe_verdict": result.verdict,
        "probe_step": result.first_divergent_step,
        "probe_item": probe_item,
        "probe_site": result.metrics.get("first_divergent_site"),
        "probe_odd_device": result.odd_device,
        "wall_s": round(time.perf_counter() - start, 3),
    }


def summarise(site: str, trials: list[dict[str, Any]]) -> dict[str, Any]:
    """Shares for one site."""
    detected = [t for t in trials if t["detected"]]
    right = [t for t in detected if t["site"] == site]
    probe_detected = [t for t in trials if t["probe_verdict"] == "fail"]
    probe_right = [t for t in probe_detected if t["probe_site"] == site]
    at_onset = [t for t in detected if t["step"] == t["fault"]["onset_step"]]

    def share(part: list[Any], whole: list[Any]) -> float | None:
        return round(len(part) / len(whole), 4) if whole else None

    return {
        "trials": len(trials),
        "injected_trials": sum(1 for t in trials if t["injected"] > 0),
        "detected": len(detected),
        "site_named": len(right),
        "site_share": share(right, detected),
        "probe_detected": len(probe_detected),
        "probe_site_named": len(probe_right),
        "probe_site_share": share(probe_right, probe_detected),
        "probe_odd_device_named": sum(1 for t in probe_detected if t["probe_odd_device"] == 1),
        "at_onset_step": len(at_onset),
        "ambiguous_raw_names": sum(1 for t in detected if ambiguous(t["item"])),
        "items": dict(Counter(str(t["item"]) for t in detected).most_common()),
        "misnamed": [
            {"trial": t["trial"], "item": t["item"], "probe_item": t["probe_item"]}
            for t in trials
            if t["detected"] and (t["site"] != site or t["probe_site"] != site)
        ],
        "meets_target": bool(
            right
            and len(right) / len(detected) >= TARGET
            and probe_detected
            and len(probe_right) / len(probe_detected) >= TARGET
        ),
    }


def markdown(doc: dict[str, Any]) -> str:
    """The results as a small markdown table."""
    cfg = doc["config"]
    lines = [
        "# Localisation of small persistent faults (golden check)",
        "",
        f"Generated by `{doc['command']}` ({cfg['trials']} trials per site, "
        f"{cfg['steps']} training steps, onset in the first half, rate 1e-4 to 1e-3, "
        "alternately relative error 1e-5 to 1e-3 or a low-mantissa flip). "
        "Share = detected trials whose first divergent item names the fault's site "
        f"(target {TARGET:.0%}).",
        "",
        "| Site | Detected | Site named (trace) | Site named (probe result) | "
        "Odd device named | At onset step | First divergent items |",
        "|---|---|---|---|---|---|---|",
    ]
    for site, s in doc["sites"].items():
        items = ", ".join(f"`{k}` {v}" for k, v in list(s["items"].items())[:3])
        lines.append(
            f"| `{site}` | {s['detected']}/{s['trials']} "
            f"| {s['site_named']}/{s['detected']} ({_pct(s['site_share'])}) "
            f"| {s['probe_site_named']}/{s['probe_detected']} ({_pct(s['probe_site_share'])}) "
            f"| {s['probe_odd_device_named']}/{s['probe_detected']} "
            f"| {s['at_onset_step']}/{s['detected']} | {items} |"
        )
    missed = [site for site, s in doc["sites"].items() if not s["meets_target"]]
    lines += [
        "",
        "All sites meet the target."
        if not missed
        else f"Below target: {', '.join(f'`{m}`' for m in missed)}.",
        "",
        f"Literal item names that contain two site names (e.g. `optimizer.embedding`): "
        f"{sum(s['ambiguous_raw_names'] for s in doc['sites'].values())} of "
        f"{sum(s['detected'] for s in doc['sites'].values())} first divergent items; "
        "`sdcprobe.trace.site_of_item` maps each item to exactly one site.",
        "",
        "Why every site scores 100%: each hooked output is digested after its fault is "
        "applied and nothing earlier in a step depends on it, so with bitwise digests the "
        "first divergent item is the corrupted one as soon as any bit changes. What this "
        "guards is that chain (hook, recorded item, site name) for every site and both "
        "readings. It does not show that a real defect is located to the unit at fault: a "
        "unit shared by several ops (say, special-function hardware used by softmax, SiLU "
        "and RMSNorm's rsqrt) is named by the first of them in execution order, and a fault "
        "seen only against a baseline is located to its step, not its item (a baseline keeps "
        "one digest per step).",
        "",
    ]
    return "\n".join(lines)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def main(argv: list[str] | None = None) -> int:
    """Run the trials, write the results, exit 1 if a site misses the target."""
    parser = argparse.ArgumentParser(prog="bench.localisation.run", description=__doc__)
    parser.add_argument("--trials", type=int, default=10, help="trials per site (>= 10)")
    parser.add_argument("--steps", type=int, default=12, help="golden training steps")
    parser.add_argument("--sites", default=",".join(SITES_UNDER_TEST))
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    sites = [s for s in args.sites.split(",") if s]
    unknown = [s for s in sites if s not in SITES]
    if unknown:
        parser.error(f"unknown site(s) {unknown}")
    cfg = GoldenConfig(steps=args.steps)
    backend = setup_backend("cpu", 0, 1)
    started = time.perf_counter()
    healthy_trace = run_golden(cfg, None, backend)
    healthy = golden_check(cfg, backend, Injector(None, 0))
    per_site: dict[str, Any] = {}
    raw: dict[str, list[dict[str, Any]]] = {}
    for site in sites:
        trials = [run_trial(site, t, cfg, healthy_trace, healthy) for t in range(args.trials)]
        raw[site] = trials
        per_site[site] = summarise(site, trials)
        s = per_site[site]
        print(
            f"{site}: detected {s['detected']}/{s['trials']}, site named "
            f"{s['site_named']}/{s['detected']} (trace), "
            f"{s['probe_site_named']}/{s['probe_detected']} (probe)",
            file=sys.stderr,
        )
    doc = {
        "benchmark": "localisation",
        "command": "python -m bench.localisation.run "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "config": {
            "trials": args.trials,
            "steps": args.steps,
            "golden": cfg.model_dump(mode="json"),
            "profiles": PROFILES,
            "rate_range": [1e-4, 1e-3],
            "target": TARGET,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_avg_1m": round(os.getloadavg()[0], 2),
        },
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wall_s": round(time.perf_counter() - started, 1),
        "sites": per_site,
        "trials": raw,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "localisation.json").write_text(json.dumps(doc, indent=2) + "\n")
    (args.out / "localisation.md").write_text(markdown(doc))
    ok = all(s["meets_target"] for s in per_site.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
