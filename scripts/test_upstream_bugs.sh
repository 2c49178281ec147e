#!/usr/bin/env bash
# The three upstream BytePS bugs our patch series fixes each have a test that fails without the fix
# (`make test-upstream-bugs`; not part of `make test`: it builds the series three more times).
#
# For each fix, tests/cluster/test_upstream_bugs.py has one test. This script builds the series
# without that one patch into its own directory (scripts/build_byteps.sh --without NNNN --target
# .cache/byteps/variants/without-NNNN; never into .venv), runs the test there
# (BYTEPS_THC_FORK_DIR) and expects it to FAIL, then runs it on our build (.venv) and expects it to
# PASS. Exit status 0 only if all six outcomes are as expected.
#   0005 torch plugin: wait_and_clear holds the GIL while it waits -> the 2nd push_pull deadlocks
#   0006 ReadyTable::SetReadyCount lacks its return (UB)           -> the worker crashes at -O3
#   0012 server: round k+1's first push lands in round k's buffer  -> a slow worker pulls it
# The server bug needs only the server: that variant is built with --server-only.
# Logs: .cache/byteps/variants/without-NNNN.{build,test}.log and ours-NNNN.test.log.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PY:-$ROOT/.venv/bin/python}"
VARIANTS="$ROOT/.cache/byteps/variants"
TESTS="tests/cluster/test_upstream_bugs.py"
export BYTEPS_BUILD_JOBS="${BYTEPS_BUILD_JOBS:-1}"
export BYTEPS_THC_TENSORFLOW=0  # the variants need torch's plugin only
cd "$ROOT"
mkdir -p "$VARIANTS"

say() { echo "[upstream-bugs] $*"; }

# pytest one test; prints its result line and the first assertion lines; returns pytest's status
run_test() {  # log test [env...]
  local log="$1" test="$2"; shift 2
  env "$@" "$PY" -m pytest -q -p no:cacheprovider "$TESTS::$test" > "$log" 2>&1
  local rc=$?
  grep -E '^E  ' "$log" | grep -v -E '^E +(\[[0-9:]+\] |$)' | head -n 8 | cut -c1-160 |
    sed 's/^/    /'  # the first lines of the failure, without ps-lite's log lines
  tail -n 1 "$log" | sed 's/^/    /'
  return $rc
}

status=0
summary=()
for case in "0005 full test_0005_second_push_pull_does_not_deadlock" \
            "0006 full test_0006_compressed_push_pull_does_not_crash" \
            "0012 server test_0012_next_rounds_push_does_not_overwrite_pulls"; do
  read -r n kind test <<< "$case"
  dir="$VARIANTS/without-$n"
  args=(--target "$dir" --without "$n")
  [ "$kind" = server ] && args+=(--server-only)
  say "patch $n: building the series without it ($kind) into ${dir#"$ROOT/"}"
  # torch is what these tests drive: no TensorFlow plugin in the variants (saves a compile each)
  if ! BYTEPS_THC_TENSORFLOW=0 scripts/build_byteps.sh "${args[@]}" > "$dir.build.log" 2>&1; then
    tail -n 20 "$dir.build.log"
    say "patch $n: the build without it failed (log: ${dir#"$ROOT/"}.build.log)"
    status=1; summary+=("$n  build without it FAILED"); continue
  fi
  say "patch $n: $test without the fix (expected to fail)"
  start=$(date +%s)
  run_test "$dir.test.log" "$test" BYTEPS_THC_FORK_DIR="$dir"
  rc=$?; secs=$(( $(date +%s) - start ))
  if [ $rc -eq 1 ] && grep -q "1 failed" "$dir.test.log"; then without="fails (${secs} s)"
  else without="did NOT fail (pytest status $rc)"; status=1; fi
  say "patch $n: $test on our build (expected to pass)"
  run_test "$VARIANTS/ours-$n.test.log" "$test"
  rc=$?
  if [ $rc -eq 0 ] && grep -q "1 passed" "$VARIANTS/ours-$n.test.log"; then with="passes"
  else with="does NOT pass (pytest status $rc)"; status=1; fi
  summary+=("$n  without the fix: $without; with it: $with")
done
say "summary (logs in ${VARIANTS#"$ROOT/"}/):"
printf '  %s\n' "${summary[@]}"
exit $status
