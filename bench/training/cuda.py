"""sdctrain on a GPU: the guard's scenarios with the model, batches and digests on CUDA.

``python -m bench.training.cuda --out DIR`` (on a machine with a GPU; run by
``bench/device/cuda-check.sh``). Three ranks share the first GPU in a gloo group,
which carries CUDA tensors (a stand-in for one GPU per rank over NCCL): what this
proves is the guard's CUDA side (GPU UUIDs, the deterministic-algorithms check,
the digests and recomputation on the device, RNG state capture), not NCCL.

Writes ``DIR/training-cuda.json`` and prints one line per scenario with what was
expected and what happened; exits 1 when any scenario missed its expectation.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from bench.training.harness import Trial, run_trials

AUDIT_EVERY_STEP = {"consensus_every": 4, "audit_every": 1}
CONSENSUS_ONLY = {"consensus_every": 2, "audit_every": 1000, "first_audit_step": 1000}
WIDTH, DEPTH, BATCH = 1024, 4, 256


def _one_shot(site: str, step: int = 3) -> dict[str, Any]:
    return {"site": site, "rate": 0.01, "onset_step": step, "end_step": step, "seed": 5}


def trials(steps: int, device: str = "cuda") -> list[tuple[Trial, str]]:
    """(trial, expectation): ``clean``, ``rank1`` (detected on rank 1) or ``refused``."""
    fwd = {"site": "matmul", "rate": 0.01, "onset_step": 2, "seed": 3}
    return [
        (Trial("healthy", steps=12, config=AUDIT_EVERY_STEP, device=device), "clean"),
        (
            Trial(
                "forward",
                steps=14,
                fault=fwd,
                config=AUDIT_EVERY_STEP,
                env={r: {"NODE_NAME": f"gpu-{r}", "POD_NAME": f"train-{r}"} for r in range(3)},
                device=device,
            ),
            "rank1",
        ),
        (
            Trial(
                "at-rest", steps=8, fault=_one_shot("param"), config=CONSENSUS_ONLY, device=device
            ),
            "rank1",
        ),
        (
            Trial(
                "receive",
                steps=8,
                fault=_one_shot("allreduce"),
                config=CONSENSUS_ONLY,
                device=device,
            ),
            "rank1",
        ),
        (
            Trial(
                "nondeterministic",
                steps=4,
                deterministic=False,
                config={"consensus_every": 2, "audit_every": 1},
                device=device,
            ),
            "refused",
        ),
        (
            Trial(
                "overhead none",
                steps=steps,
                guard=False,
                width=WIDTH,
                depth=DEPTH,
                batch=BATCH,
                device=device,
            ),
            "clean",
        ),
        (
            Trial(
                "overhead 2%",
                steps=steps,
                config={"audit_budget": 0.02, "consensus_every": 50},
                width=WIDTH,
                depth=DEPTH,
                batch=BATCH,
                device=device,
            ),
            "clean",
        ),
    ]


def _outcome(results: list[dict[str, Any]]) -> str:
    if any(r["refused"] for r in results):
        return "refused"
    ranks = {d["rank"] for r in results for d in r["detections"]}
    if not ranks:
        finals = {tuple(r["final_digest"]) for r in results}
        return "clean" if len(finals) == 1 else "diverged"
    return "rank" + ",".join(str(r) for r in sorted(ranks))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=60, help="steps of the overhead runs")
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of the same scenarios")
    args = parser.parse_args(argv)
    plan = trials(args.steps, args.device)
    results = run_trials([t for t, _ in plan], world=3)
    doc: dict[str, Any] = {"scenarios": []}
    missed = 0
    for (trial, expected), per_rank in zip(plan, results, strict=True):
        got = _outcome(per_rank)
        missed += got != expected
        times = [t for r in per_rank for t in r["times"][5:]]
        entry = {
            "name": trial.name,
            "expected": expected,
            "outcome": got,
            "detections": [d for r in per_rank for d in r["detections"]],
            "refused": per_rank[0]["refused"],
            "audits": per_rank[0]["audits"],
            "step_median_s": statistics.median(times) if times else None,
        }
        doc["scenarios"].append(entry)
        print(
            f"{trial.name}: expected {expected}, got {got}; audits {entry['audits']}, "
            f"step median {entry['step_median_s']}, "
            f"{[(d['rank'], d['method'], d['confirmation']) for d in entry['detections']][:3]} "
            f"{entry['detections'][0]['detail'][:200] if entry['detections'] else ''}",
            flush=True,
        )
    by_name = {s["name"]: s for s in doc["scenarios"]}
    none, two = by_name["overhead none"]["step_median_s"], by_name["overhead 2%"]["step_median_s"]
    if none and two:
        doc["overhead_ratio"] = two / none
        print(f"step time with a 2% audit budget / without the guard: {two / none:.3f}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "training-cuda.json").write_text(json.dumps(doc, indent=1))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
