#!/usr/bin/env bash
# The probe's CUDA backend and sdctrain on one GPU, as one prepared run (about 8 minutes):
# gemm_busy and peak ratios per dtype, power against the limit (NVML), memory read-back and
# write against a plain copy, start-up parts, catch chances at 60 and 120 s (900 s projected
# from the measured round costs), a healthy pass against a baseline and an injected fault
# that fails. For power figures put the nvidia-ml-py wheel in .whl/ too (without it power
# is reported absent, never zero).
#
# Run from the project's root on a machine with an NVIDIA GPU and PyTorch:
#   bash bench/device/cuda-check.sh
# Where pydantic is missing, put its wheels (pydantic, pydantic-core, annotated-types,
# typing-inspection, typing-extensions) in .whl/ first: they are installed into a
# private target, nothing else is touched. Results go to $OUT (default /tmp/sdcguard-cuda):
# summary.txt (one line per step) and cuda-check.tar.gz (every JSON, log and message).
set -u
OUT=${OUT:-/tmp/sdcguard-cuda}
DEVICE=${DEVICE:-cuda}  # cpu runs the same steps on this machine (a dry run of the script)
BUDGET=${BUDGET:-30}
W=$(mktemp -d)
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/sdcguard-site .whl/*.whl \
    || { echo "wheel install failed" | tee "$OUT/summary.txt"; exit 1; }
  export PYTHONPATH=/tmp/sdcguard-site:$PWD/jobs:$PWD
else
  export PYTHONPATH=$PWD/jobs:$PWD
fi
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
say() { echo "== $*" | tee -a "$OUT/summary.txt"; }
finish() { tar -czf "$OUT/cuda-check.tar.gz" -C "$W" . ; }
trap finish EXIT
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$W/gpu.txt" | tee -a "$OUT/summary.txt"
python3 -c "import torch;print('torch',torch.__version__,'cuda',torch.version.cuda,torch.cuda.get_device_name(0))" \
  | tee -a "$OUT/summary.txt"
step() {
  local name=$1 t0 rc; shift
  t0=$(date +%s.%N)
  timeout 200 "$@" >"$W/$name.json" 2>"$W/$name.err"; rc=$?
  say "$name rc=$rc wall=$(python3 -c "import time;print(round(time.time()-$t0,1))")s $(tail -1 "$W/$name.err" | cut -c1-200)"
}
echo "[1/7] fingerprint"
step fingerprint python3 -m sdcprobe fingerprint --device "$DEVICE"
echo "[2/7] baseline (no stress phase: the digests do not depend on it)"
step baseline python3 -m sdcprobe baseline --device "$DEVICE" --budget "$BUDGET" --stress-seconds 0
echo "[3/7] screening at 60 s"
step run60 python3 -m sdcprobe run --device "$DEVICE" --budget 60 --baseline "$W/baseline.json" --result-file "$W/term60.txt"
echo "[4/7] screening at 120 s, another process"
step run120 python3 -m sdcprobe run --device "$DEVICE" --budget 120 --baseline "$W/baseline.json" --result-file "$W/term120.txt"
echo "[5/7] screening with an injected fault"
printf '{"faults":[{"site":"attention.output","rate":0.001,"bits":"lo-mant","mode":"flip","seed":5,"device":0}]}' >"$W/faults.json"
step fault python3 -m sdcprobe run --device "$DEVICE" --budget "$BUDGET" --baseline "$W/baseline.json" --result-file "$W/term3.txt" \
  --stress-seconds 0 --allow-fault-injection --faults "$W/faults.json"
echo "[6/7] summary"
python3 - "$W" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys, pathlib
from sdcprobe.config import catch_probability, plan_rounds, BASELINE_ROUNDS
o = pathlib.Path(sys.argv[1])
def load(n):
    try:
        return json.loads((o / f"{n}.json").read_text())
    except Exception as e:
        return {"error": str(e)}
r60, r120, f = load("run60"), load("run120"), load("fault")
d = lambda r: {k: v.get("digest") for k, v in r.get("checks", {}).items()}
print("verdicts: 60s", r60.get("verdict"), "120s", r120.get("verdict"), "fault:", f.get("verdict"), "-", (f.get("reason") or "")[:160])
print("digests equal across processes (60 s vs 120 s):", d(r60) == d(r120) and bool(d(r60)))
keys = ("gemm_busy", "peak_ratio", "peak_gflops", "gflops", "host_bytes_per_round", "host_syncs_per_round",
        "power_w", "power_limit_w", "power_ratio", "temperature_c_max", "clock_mhz_min", "clock_mhz_max",
        "max_clock_mhz", "settled_s", "telemetry_absent", "stress_s", "stress_settled_s", "stress_power_ratio",
        "stress_temperature_c_max", "write_vs_copy", "read_vs_copy", "copy_gbps", "read_gbps", "write_gbps",
        "busbw_ratio", "best_busbw_gbps", "bytes_tested", "dwell_s", "clock_mhz_start", "clock_mhz_end")
for label, run in (("60s", r60), ("120s", r120)):
    plan = run.get("plan") or {}
    print(f"[{label}] start-up {plan.get('startup_s')} s parts {plan.get('startup_parts')}")
    print(f"[{label}] rounds {plan.get('run')} round_ms {plan.get('round_ms')}")
    print(f"[{label}] catch target {plan.get('catch_target')} at {plan.get('catch_fraction')}: "
          f"planned {plan.get('planned_target_met')} met {plan.get('target_met')} chance {plan.get('catch_chance')}")
    for name, check in run.get("checks", {}).items():
        m = check.get("metrics", {})
        print(f"[{label}] {name} {check.get('verdict')}", json.dumps({k: m[k] for k in keys if k in m}))
# 900 s: projected from the 120 s run's measured round costs (not run: a 900 s run
# would take the whole device session).
plan = r120.get("plan") or {}
costs = {c: ms / 1000 * (1 + plan.get("margin", 0.05)) for c, ms in (plan.get("round_ms") or {}).items() if ms}
if costs:
    start = plan.get("startup_s", 0.0)
    for budget in (60, 120, 900):
        avail = budget - start - (0.6 + 0.02 * budget)
        try:
            rounds = plan_rounds(costs, avail, {c: BASELINE_ROUNDS[c] for c in costs})
            print(f"projected at {budget}s from the 120 s run's costs: rounds {rounds}, catch at 5% "
                  + ", ".join(f"{c} {catch_probability(0.05, n):.4f}" for c, n in rounds.items()))
        except Exception as exc:
            print(f"projected at {budget}s: {exc}")
PY
echo "[7/7] sdctrain on CUDA"
t0=$(date +%s)
timeout 200 python3 -m bench.training.cuda --out "$W" --device "$DEVICE" >"$W/training.txt" 2>"$W/training.err"
say "training rc=$? wall=$(( $(date +%s) - t0 ))s"
tee -a "$OUT/summary.txt" <"$W/training.txt"
tail -5 "$W/training.err" | cut -c1-300 | tee -a "$OUT/summary.txt"
