#!/usr/bin/env bash
# Runs the test suite as two pytest processes at once, each with its own local
# control plane: one group spends its time in real probe runs (CPU), the other
# mostly waits on the API server, so together they take about as long as the
# longer of the two. Group B's output follows group A's; the exit status is
# non-zero if either failed.
set -uo pipefail
PY="${PY:?set PY to the venv python}"
cd "$(dirname "$0")/.."
GROUP_A=(tests/unit tests/probe tests/sim tests/e2e tests/bench tests/training)
GROUP_B=(tests/cluster tests/realnode tests/autoscaling tests/operator tests/badinput tests/chaos tests/chart tests/cli tests/notify tests/reports)
for dir in tests/*/; do
  [ "$(basename "$dir")" = __pycache__ ] && continue
  dir=${dir%/}
  case " ${GROUP_A[*]} ${GROUP_B[*]} " in
    *" $dir "*) ;;
    *) echo "error: $dir is in neither test group of $0; add it to one" >&2; exit 2 ;;
  esac
done
log_b=$(mktemp)
echo "[test] group A (${GROUP_A[*]}) runs here; group B (${GROUP_B[*]}) runs alongside, its output follows"
"$PY" -m pytest -q -p no:cacheprovider "${GROUP_B[@]}" >"$log_b" 2>&1 &
pid_b=$!
trap 'kill "$pid_b" 2>/dev/null; rm -f "$log_b"' EXIT INT TERM
"$PY" -m pytest -q -p no:cacheprovider "${GROUP_A[@]}"
status_a=$?
echo "[test] group A finished (exit $status_a); waiting for group B"
wait "$pid_b"
status_b=$?
echo "[test] ---- group B (${GROUP_B[*]}) ----"
cat "$log_b"
echo "[test] group A exit $status_a, group B exit $status_b"
trap - EXIT INT TERM
rm -f "$log_b"
[ "$status_a" -eq 0 ] && [ "$status_b" -eq 0 ]
