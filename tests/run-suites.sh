#!/usr/bin/env bash
# Runs the test suite as several pytest processes at once, each with its own local
# control plane. Most groups spend their time waiting (on the API server, the
# operator's passes, Karpenter, the real node or a Job's deadline), so running more of
# them side by side shortens the suite until the machine's cores are busy; group A
# prints as it goes; the other groups' output follows, each with its time and its
# twenty slowest tests (to balance the groups by); the exit status is non-zero if any
# failed. A group may name single files of a directory that another group names
# whole: that group then leaves those files out (--ignore). With SUITE_LOG_DIR set,
# each group's whole output is kept there as A.log, B.log, ... (for
# python -m bench.suite.slowest, which records the suite's slowest tests), and each
# test's CPU as A-cpu.jsonl, ... (for python -m bench.suite.testcpu).
set -uo pipefail
PY="${PY:?set PY to the venv python}"
cd "$(dirname "$0")/.."
declare -A GROUPS_OF=(
  [A]="tests/unit tests/probe tests/training tests/chart tests/docs"
  [B]="tests/e2e tests/sim tests/bench"
  [C]="tests/realnode"
  [D]="tests/autoscaling tests/chaos"
  [E]="tests/operator/test_lifecycle.py tests/operator/test_first_use.py tests/operator/test_recertification.py tests/operator/test_replace_rbac.py tests/operator/test_restart_listing.py tests/operator/test_hardware_history.py"
  [F]="tests/operator"
  [G]="tests/cluster tests/dra tests/badinput tests/cli tests/notify tests/packaging tests/security tests/reports"
)
# The groups that spend their time in real probe runs (CPU) run niced: when the cores
# are short, the groups that wait on an operator's passes, the real node or Karpenter,
# whose tests have deadlines of a few passes, get the CPU first, and the probe-bound
# groups take the rest (their waits are sized for a slow machine).
declare -A NICE_OF=([A]=10 [B]=10)
ORDER=(A B C D E F G)
LOG_DIR="${SUITE_LOG_DIR:-}"
[ -z "$LOG_DIR" ] || mkdir -p "$LOG_DIR"
all=" ${GROUPS_OF[*]} "
for dir in tests/*/; do
  [ "$(basename "$dir")" = __pycache__ ] && continue
  dir=${dir%/}
  case "$all" in
    *" $dir "*) ;;
    *) echo "error: $dir is in no test group of $0; add it to one" >&2; exit 2 ;;
  esac
done
# The pytest arguments of group $1: its entries, less the files other groups name.
args_of() {
  local g=$1 other entry
  local -a args
  read -ra args <<<"${GROUPS_OF[$g]}"
  for other in "${!GROUPS_OF[@]}"; do
    [ "$other" = "$g" ] && continue
    for entry in ${GROUPS_OF[$other]}; do
      case "$entry" in
        *.py)
          [ -f "$entry" ] || { echo "error: $entry (group $other) does not exist" >&2; exit 2; }
          case " ${GROUPS_OF[$g]} " in
            *" $(dirname "$entry") "*) args+=("--ignore=$entry") ;;
          esac
          ;;
      esac
    done
  done
  echo "${args[@]}"
}
for g in "${ORDER[@]}"; do args_of "$g" >/dev/null || exit 2; done
declare -A PID LOG START
cleanup() {
  for g in "${!PID[@]}"; do kill "${PID[$g]}" 2>/dev/null; done
  for g in "${!LOG[@]}"; do rm -f "${LOG[$g]}"; done
}
trap cleanup EXIT INT TERM
for g in "${ORDER[@]:1}"; do
  LOG[$g]=$(mktemp)
  (
    started=$SECONDS
    [ -z "$LOG_DIR" ] || export SUITE_CPU_LOG="$LOG_DIR/$g-cpu.jsonl"
    # shellcheck disable=SC2086  # the group is a list of directories
    nice -n "${NICE_OF[$g]:-0}" "$PY" -m pytest -q -p no:cacheprovider --durations=20 $(args_of "$g")
    rc=$?
    echo "[test] group $g took $((SECONDS - started)) s"
    exit "$rc"
  ) >"${LOG[$g]}" 2>&1 &
  PID[$g]=$!
  echo "[test] group $g (${GROUPS_OF[$g]}) runs alongside; its output follows group A's"
done
first=${ORDER[0]}
echo "[test] group $first (${GROUPS_OF[$first]}) runs here"
t0=$SECONDS
first_log=/dev/null
cpu_log=""
[ -z "$LOG_DIR" ] || { first_log="$LOG_DIR/$first.log"; cpu_log="$LOG_DIR/$first-cpu.jsonl"; }
# shellcheck disable=SC2086
SUITE_CPU_LOG="$cpu_log" nice -n "${NICE_OF[$first]:-0}" "$PY" -m pytest -q -p no:cacheprovider --durations=20 $(args_of "$first") | tee "$first_log"
declare -A STATUS=([$first]=${PIPESTATUS[0]})
echo "[test] group $first finished (exit ${STATUS[$first]}); it took $((SECONDS - t0)) s"
for g in "${ORDER[@]:1}"; do
  echo "[test] waiting for group $g"
  wait "${PID[$g]}"
  STATUS[$g]=$?
  unset "PID[$g]"
  echo "[test] ---- group $g (${GROUPS_OF[$g]}) ----"
  cat "${LOG[$g]}"
  [ -z "$LOG_DIR" ] || cp "${LOG[$g]}" "$LOG_DIR/$g.log"
done
failed=0
summary=""
for g in "${ORDER[@]}"; do
  summary+=" group $g exit ${STATUS[$g]};"
  [ "${STATUS[$g]}" -eq 0 ] || failed=1
done
echo "[test]${summary%;}"
exit "$failed"
