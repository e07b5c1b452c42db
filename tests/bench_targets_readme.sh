#!/bin/bash
# scripts/bench_targets.py --page: writes its table into the performance page's block of the named
# machine, and only there, only from runs that are the machine's own (no warning, no tuning
# variable, every row), and leaves the file untouched otherwise. Run from the repository root on
# the saved runs of tests/data/bench_targets, on a copy ($d/README.md, the file the tables lived
# in before docs/performance.md); the written block is compared with readme_expected.md.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"

fixture=tests/data/bench_targets

cp -r "$fixture" "$d/runs"
printf 'Intro.\n\n<!-- bench_targets: Test VM -->\nold table\n<!-- /bench_targets: Test VM -->\n\n<!-- bench_targets: Other VM -->\nother table\n<!-- /bench_targets: Other VM -->\nAfter.\n' \
  >"$d/README.md"
cp "$d/README.md" "$d/README.orig"
write() {  # write [extra args...]: the script's exit status; its stderr in $d/err
  python3 scripts/bench_targets.py --from "$d/runs" --page "$d/README.md" "$@" \
    >/dev/null 2>"$d/err" && return 0 || return $?
}
unchanged() { cmp -s "$d/README.md" "$d/README.orig" || fail "$1: the README was changed"; }

# The fixture has a run that warned (its floor moved) and one whose floor fell to 180 GFLOP/s,
# below 90% of the highest reading, 201: refused, nothing written.
write --machine "Test VM" && fail "a run with a warning was written"
grep -q "not written: 1 warning(s) in the runs and 1 run(s) with the floor below 90%" "$d/err" ||
  fail "no refusal for the warning: $(cat "$d/err")"
unchanged "refused for a warning"

edit_runs() {  # edit_runs PYTHON: runs PYTHON on each run's JSON, as j
  python3 - "$d/runs" "$1" <<'EOF'
import glob, json, os, sys
for p in glob.glob(os.path.join(sys.argv[1], "[0-9]-*.json")):
    with open(p) as f:
        j = json.load(f)
    exec(sys.argv[2])
    with open(p, "w") as f:
        json.dump(j, f)
EOF
}
# Without the warning, the floor's dip alone is refused.
edit_runs 'j["warnings"] = []'
write --machine "Test VM" && fail "a run with its floor below 90% of the highest was written"
grep -q "not written: 0 warning(s) in the runs and 1 run(s) with the floor below 90%" "$d/err" ||
  fail "no refusal for the floor's dip: $(cat "$d/err")"
unchanged "refused for the floor's dip"
# Every floor reading within 90% of the highest from here on.
edit_runs 'j["sgemm_gflops"]["lowest"] = max(j["sgemm_gflops"]["lowest"], 181.0)'

# A block name the README does not have: the error names the blocks it has.
write --machine "Nowhere VM" && fail "an unknown block was written"
grep -q "its blocks: 'Other VM', 'Test VM'" "$d/err" || fail "unknown block: $(cat "$d/err")"
unchanged "unknown block"

# A subset of the rows: refused.
write --machine "Test VM" --rows mlp4 && fail "a subset of the rows was written"
grep -q "needs every row" "$d/err" || fail "subset: $(cat "$d/err")"
unchanged "subset of rows"

# Runs made with a tuning variable set: refused.
cp "$d/runs/machine.json" "$d/machine.json"
python3 -c "import json,sys; p=sys.argv[1]; m=json.load(open(p)); m['env']=['OPENBLAS_CORETYPE=SkylakeX']; json.dump(m, open(p,'w'))" \
  "$d/runs/machine.json"
write --machine "Test VM" && fail "runs with a tuning variable were written"
grep -q "OPENBLAS_CORETYPE=SkylakeX" "$d/err" || fail "tuning variable: $(cat "$d/err")"
unchanged "tuning variable"
cp "$d/machine.json" "$d/runs/machine.json"

# Live runs (no --from) refuse what they can before running anything: no binary is needed for
# these refusals.
live() { python3 scripts/bench_targets.py --binary "$d/no-such-binary" --page "$d/README.md" "$@" \
  >/dev/null 2>"$d/err" && return 0 || return $?; }
OMP_NUM_THREADS=3 live --machine "Test VM" && fail "a live run with a tuning variable started"
grep -q "would not be written: tuning variables were set (.*OMP_NUM_THREADS=3" "$d/err" ||
  fail "live, tuning variable: $(cat "$d/err")"
live --machine "Nowhere VM" && fail "a live run for an unknown block started"
grep -q "has 0 blocks named 'Nowhere VM'" "$d/err" || fail "live, unknown block: $(cat "$d/err")"
unchanged "live refusals"

# Written: the Test VM block replaced, the rest of the file as it was.
write --machine "Test VM" || fail "clean runs were not written: $(cat "$d/err")"
diff -u "$fixture/readme_expected.md" "$d/README.md" || fail "the written README differs"
# Again: the same file (the block is found by its markers, which it keeps), through --readme, the
# option's name from before the tables moved to docs/performance.md (kept as an alias).
python3 scripts/bench_targets.py --from "$d/runs" --readme "$d/README.md" --machine "Test VM" \
  >/dev/null 2>"$d/err" || fail "the second write (--readme) failed: $(cat "$d/err")"
diff -u "$fixture/readme_expected.md" "$d/README.md" || fail "a second write changed the README"
echo "bench_targets --page: refusals and the written block as expected"
