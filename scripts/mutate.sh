#!/usr/bin/env bash
# Mutation check (issue 17): applies each plausible bug kept in tests/mutants/ to a private copy of
# the tree, rebuilds incrementally, runs `ctest -L cpu`, and prints killed/survived per mutant and
# the score. Not part of `make test` (each mutant costs a rebuild and up to a full cpu test run).
#
#   scripts/mutate.sh [PATTERN...]       # all mutants, or those whose file name contains a PATTERN
#   MUTATE_DIR=/tmp/m scripts/mutate.sh  # reuse a work directory (incremental builds across runs)
#   MUTATE_JOBS=2 MUTATE_TIMEOUT=600     # build jobs; per-mutant ctest timeout in seconds
#   MUTATE_TESTS='[loop]' scripts/mutate.sh clip   # run only these Catch2 tests instead of ctest
#                                        # (does this test kill that mutant?)
#   MUTATE_FIRST='[reference],[loop]'    # try these fast cpu-label tests first; ctest only when
#                                        # they pass (same verdicts: they are part of ctest -L cpu)
#   MUTATE_CTEST_ARGS='-j2 -E slow-test-regex'     # extra ctest arguments (a time-boxed run)
#
# The working tree is never modified: the tracked files and the untracked, non-ignored ones are
# synchronized (by content) into $MUTATE_DIR/src, which is mutated, built in
# $MUTATE_DIR/build and restored after each mutant; an EXIT/INT/TERM trap restores the file being
# mutated there too, so an interrupted run leaves the copy clean for the next one.
#
# A mutant file (tests/mutants/NN-name.mutant) is a comment line saying what bug it plants, then
# one or more edits:
#   @@ path/relative/to/the/repository
#   - exact text to find (must occur exactly once; several "- " lines form a multi-line text)
#   + its replacement (several "+ " lines likewise; a lone "+" deletes the text)
# scripts/mutants.py parses and applies them; its `check` (ctest mutants_apply) finds stale ones.
# Outcomes: KILLED (some cpu test failed), SURVIVED (all passed: a test is missing), BUILD-FAILED
# (the mutant does not compile: not counted), STALE (its text is not in the source any more: fix
# the mutant). Exit status: 0 when every applicable mutant is killed, 1 otherwise.
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=${MUTATE_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/remat-mutate.XXXXXX")}
jobs=${MUTATE_JOBS:-2}
timeout_s=${MUTATE_TIMEOUT:-600}
src="$work/src"
build="$work/build"
logs="$work/logs"
mkdir -p "$src" "$build" "$logs"

# ---- the private copy ----
# Synchronized by content, not copied with the tree's modification times: a reused $MUTATE_DIR
# holds objects built from an earlier version of the tree (and from restored mutants), which can
# be newer than an older-dated changed file, so make would keep a stale object. A file whose
# bytes changed gets a fresh mtime; a file gone from the tree is removed from the copy.
echo "mutate: synchronizing the tree into $src"
incoming="$work/incoming"
rm -rf "$incoming" && mkdir -p "$incoming"
(cd "$repo" && git ls-files -z --cached --others --exclude-standard |
  while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done |
  tar --null -T - -cf -) | (cd "$incoming" && tar -xf -)
python3 - "$incoming" "$src" <<'PY'
import filecmp, os, shutil, sys
incoming, src = sys.argv[1:3]
want = set()
for root, _, files in os.walk(incoming):
    for f in files:
        rel = os.path.relpath(os.path.join(root, f), incoming)
        want.add(rel)
        dst = os.path.join(src, rel)
        if not os.path.exists(dst) or not filecmp.cmp(os.path.join(incoming, rel), dst, shallow=False):
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy(os.path.join(incoming, rel), dst)  # copy, not copy2: a fresh mtime
for root, _, files in os.walk(src):
    for f in files:
        rel = os.path.relpath(os.path.join(root, f), src)
        if rel not in want:
            os.remove(os.path.join(src, rel))
PY
rm -rf "$incoming"

# ---- apply / restore, with a trap so an interrupted run restores the copy ----
backup_dir="$work/backup"
restore() {
  if [ -d "$backup_dir" ]; then
    (cd "$backup_dir" && find . -type f -print0) | while IFS= read -r -d '' f; do
      cp "$backup_dir/$f" "$src/$f"  # a fresh mtime: the next build recompiles the original
    done
    rm -rf "$backup_dir"
  fi
}
trap 'restore' EXIT
trap 'echo; echo "mutate: interrupted; the copy is restored"; exit 130' INT TERM

# Applies mutant $1 to $src (backing up every file it touches); returns 2 when its text is stale.
apply_mutant() {
  python3 "$repo/scripts/mutants.py" apply "$1" "$src" "$backup_dir"
}

build_tree() {
  cmake --build "$build" -j "$jobs" --target remat_tests remat-train >"$1" 2>&1
}

# ---- baseline ----
echo "mutate: configuring and building the unmutated copy in $build"
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DREMAT_CUDA=OFF -DREMAT_WERROR=ON \
  >"$logs/configure.log" 2>&1 || { echo "mutate: configure failed, see $logs/configure.log"; exit 2; }
build_tree "$logs/baseline-build.log" || { echo "mutate: the unmutated tree does not build, see $logs/baseline-build.log"; exit 2; }
# The tests a mutant must fail: `ctest -L cpu`, or the Catch2 tests named by MUTATE_TESTS.
# The name of the first test case with a failed assertion in a Catch2 log. Catch2 frames every
# reported case (a warning too: "this CPU has no AVX-512") between two lines of dashes, so the
# first framed name is not always a failure; the case is the one framed last before "FAILED:".
# Without a FAILED line (a crash, a timeout), the first framed name.
first_failed_case() {  # $1: log file
  local name
  name=$(awk '/^--------------------/ { if (!open) { getline hdr; open = 1 } else { open = 0 }; next }
              /: FAILED:$/ { print hdr; exit }' "$1")
  [ -n "$name" ] || name=$(grep -m1 -A2 -E '^-{20,}' "$1" | sed -n '2p')
  echo "$name"
}

run_tests() {  # $1: log file; extra args: ctest options
  local log=$1
  shift
  if [ -n "${MUTATE_TESTS:-}" ]; then
    (cd "$build" && timeout "$timeout_s" tests/remat_tests "$MUTATE_TESTS" >"$log" 2>&1)
  else
    # shellcheck disable=SC2086  # MUTATE_CTEST_ARGS is a list of words
    (cd "$build" && ctest -L cpu --timeout "$timeout_s" ${MUTATE_CTEST_ARGS:-} "$@" >"$log" 2>&1)
  fi
}
tests_name=${MUTATE_TESTS:+remat_tests \"$MUTATE_TESTS\"}
tests_name=${tests_name:-ctest -L cpu${MUTATE_CTEST_ARGS:+ $MUTATE_CTEST_ARGS}}
if [ -z "${MUTATE_SKIP_BASELINE:-}" ]; then
  echo "mutate: running $tests_name on the unmutated copy (it must pass)"
  run_tests "$logs/baseline-tests.log" ||
    { echo "mutate: the unmutated tree fails $tests_name, see $logs/baseline-tests.log"; exit 2; }
fi

# ---- mutants ----
mutants=()
for m in "$src"/tests/mutants/*.mutant; do  # the synchronized copy: edits during a run do not leak in
  name=$(basename "$m" .mutant)
  if [ $# -gt 0 ]; then
    keep=0
    for pat in "$@"; do [[ "$name" == *"$pat"* ]] && keep=1; done
    [ $keep = 1 ] || continue
  fi
  mutants+=("$m")
done
echo "mutate: ${#mutants[@]} mutants, each against $tests_name"

killed=0 survived=0 broken=0 stale=0
survivors=()
results="$work/results.txt"
: >"$results"
for m in "${mutants[@]}"; do
  name=$(basename "$m" .mutant)
  what=$(sed -n '1s/^# *//p' "$m")
  t0=$(date +%s)
  apply_mutant "$m" >"$logs/$name.apply.log" 2>&1
  rc=$?
  if [ $rc -ne 0 ]; then
    restore
    stale=$((stale + 1))
    line="STALE         $name: $(tail -1 "$logs/$name.apply.log")"
  elif ! build_tree "$logs/$name.build.log"; then
    restore
    broken=$((broken + 1))
    line="BUILD-FAILED  $name ($what)"
  else
    rc=0
    if [ -n "${MUTATE_FIRST:-}" ] && [ -z "${MUTATE_TESTS:-}" ]; then
      (cd "$build" && timeout "$timeout_s" tests/remat_tests "$MUTATE_FIRST" >"$logs/$name.first.log" 2>&1)
      rc=$?
    fi
    if [ $rc -ne 0 ]; then
      by="remat_tests \"$MUTATE_FIRST\": $(first_failed_case "$logs/$name.first.log")"
    else
      by=""
      run_tests "$logs/$name.tests.log" --stop-on-failure
      rc=$?
    fi
    restore
    if [ $rc -ne 0 ]; then
      killed=$((killed + 1))
      if [ -n "$by" ]; then
        :
      elif [ -n "${MUTATE_TESTS:-}" ]; then  # Catch2: the first failing test case's name
        by=$(first_failed_case "$logs/$name.tests.log")
      else
        by=$(grep -E '^ *[0-9]+/[0-9]+ Test' "$logs/$name.tests.log" | grep -vE ' Passed ' | head -1 |
          sed -E 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: //; s/ \.{2,}.*//')
      fi
      line="KILLED        $name ($(($(date +%s) - t0)) s) by: ${by:-?}"
    else
      survived=$((survived + 1))
      survivors+=("$name")
      line="SURVIVED      $name ($what)"
    fi
  fi
  echo "$line" | tee -a "$results"
done

# Rebuild the restored copy so the next run starts from the unmutated objects.
build_tree "$logs/final-build.log" >/dev/null 2>&1 || true

total=$((killed + survived))
echo
if [ $total -gt 0 ]; then
  echo "mutation score: $killed killed of $total ($((100 * killed / total))%); $survived survived," \
    "$broken did not build, $stale stale" | tee -a "$results"
else
  echo "mutation score: no applicable mutant ($broken did not build, $stale stale)" | tee -a "$results"
fi
for s in "${survivors[@]+"${survivors[@]}"}"; do echo "  survivor: $s"; done
echo "logs: $logs; results: $results"
[ $survived -eq 0 ] && [ $stale -eq 0 ]
