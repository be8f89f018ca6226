#!/usr/bin/env bash
# The probe's CUDA backend and sdctrain on one GPU, as one short run (about 5 minutes).
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
  timeout 170 "$@" >"$W/$name.json" 2>"$W/$name.err"; rc=$?
  say "$name rc=$rc wall=$(python3 -c "import time;print(round(time.time()-$t0,1))")s $(tail -1 "$W/$name.err" | cut -c1-200)"
}
echo "[1/6] fingerprint"
step fingerprint python3 -m sdcprobe fingerprint --device "$DEVICE"
echo "[2/6] baseline"
step baseline python3 -m sdcprobe baseline --device "$DEVICE" --budget "$BUDGET"
echo "[3/6] screening 1"
step run1 python3 -m sdcprobe run --device "$DEVICE" --budget "$BUDGET" --baseline "$W/baseline.json" --result-file "$W/term1.txt"
echo "[4/6] screening 2, another process"
step run2 python3 -m sdcprobe run --device "$DEVICE" --budget "$BUDGET" --baseline "$W/baseline.json" --result-file "$W/term2.txt"
echo "[5/6] screening with an injected fault"
printf '{"faults":[{"site":"attention.output","rate":0.001,"bits":"lo-mant","mode":"flip","seed":5}]}' >"$W/faults.json"
step fault python3 -m sdcprobe run --device "$DEVICE" --budget "$BUDGET" --baseline "$W/baseline.json" --result-file "$W/term3.txt" \
  --allow-fault-injection --faults "$W/faults.json"
python3 - "$W" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys, pathlib
o = pathlib.Path(sys.argv[1])
def load(n):
    try:
        return json.loads((o / f"{n}.json").read_text())
    except Exception as e:
        return {"error": str(e)}
r1, r2, f = load("run1"), load("run2"), load("fault")
d = lambda r: {k: v.get("digest") for k, v in r.get("checks", {}).items()}
print("verdicts:", r1.get("verdict"), r2.get("verdict"), "fault:", f.get("verdict"))
print("digests equal across processes:", d(r1) == d(r2) and bool(d(r1)))
for name, check in r1.get("checks", {}).items():
    m = check.get("metrics", {})
    keep = {k: m[k] for k in m if any(s in k for s in ("flop", "peak", "ratio", "rounds", "gbps", "bytes", "seconds"))}
    print("check", name, check.get("verdict"), json.dumps(keep)[:600])
PY
echo "[6/6] sdctrain on CUDA"
t0=$(date +%s)
timeout 200 python3 -m bench.training.cuda --out "$W" --device "$DEVICE" >"$W/training.txt" 2>"$W/training.err"
say "training rc=$? wall=$(( $(date +%s) - t0 ))s"
tee -a "$OUT/summary.txt" <"$W/training.txt"
tail -5 "$W/training.err" | cut -c1-300 | tee -a "$OUT/summary.txt"
