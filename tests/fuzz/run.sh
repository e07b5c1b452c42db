#!/usr/bin/env bash
# Runs each fuzz target for SECONDS, two at a time: run.sh BIN_DIR SECONDS TARGET...
# Seeds come from tests/fuzz/<target>/ (read only); what a run discovers goes to a scratch corpus.
# A crashing input is saved as tests/fuzz/<target>/crash-<sha1>, to be fixed and kept as a seed.
# FUZZ_SEED (default 1) fixes libFuzzer's random sequence, so `make test` explores the same inputs
# on every machine and a red CI run is reproducible; FUZZ_SEED=0 draws a fresh seed (exploration).
set -uo pipefail
bin=$1 seconds=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
scratch=$(mktemp -d /tmp/remat-fuzz-corpus-XXXXXX)
trap 'rm -rf "$scratch"' EXIT

run_one() {
  local t=$1
  mkdir -p "$scratch/$t"
  "$bin/fuzz_$t" -seed="${FUZZ_SEED:-1}" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$here/$t/" "$scratch/$t" "$here/$t" >"$scratch/$t.log" 2>&1
  local rc=$?
  local runs
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$scratch/$t.log" | grep -o '[0-9]*$')
  if [ $rc -eq 0 ]; then
    echo "[fuzz] $t: ${seconds}s, ${runs:-?} inputs, no crash"
  else
    echo "[fuzz] $t: FAILED (exit $rc); the input is in tests/fuzz/$t/"
    tail -40 "$scratch/$t.log"
  fi
  return $rc
}

status=0
targets=("$@")
for ((i = 0; i < ${#targets[@]}; i += 2)); do
  pids=()
  for t in "${targets[@]:i:2}"; do
    run_one "$t" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || status=1; done
done
exit $status
