#!/bin/bash
# scripts/bench_targets.py --patience: on a shared host it runs rounds until --rounds of them are
# clean, setting aside the rounds that warned or ran in a slow spell, and says how many; when the
# time is up, the last rounds stand and --page refuses them. A fake `remat-train` stands in for
# the binary: each call prints a saved run of tests/data/bench_targets with the floor and warnings
# of the round it belongs to (FAKE_ROUNDS), and its round's number in step_ms, so the table shows
# which rounds were kept.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"

cat >"$d/remat-train" <<'FAKE'
#!/usr/bin/env python3
# fake `remat-train bench ... --json`: round k of FAKE_ROUNDS ("warn:190,clean:150,...") is calls
# 6k..6k+5 (3 models x 2 policies), counted in $FAKE_DIR/calls. A floor "LO-HI" gives the round's
# lowest and highest readings; a single number F reads 0.99 F to F.
import json, os, sys
args = " ".join(sys.argv[1:])
model = "gpt2" if "gpt2" in args else "mlp4" if "mlp4" in args else "long"
policy = "full" if "remat.policy=full" in args else "none"
counter = os.path.join(os.environ["FAKE_DIR"], "calls")
calls = int(open(counter).read()) if os.path.exists(counter) else 0
open(counter, "w").write(str(calls + 1))
kind, floor = os.environ["FAKE_ROUNDS"].split(",")[calls // 6].split(":")
with open(f"tests/data/bench_targets/0-{model}-{policy}.json") as f:
    j = json.load(f)
lo, hi = map(float, floor.split("-")) if "-" in floor else (0.99 * float(floor), float(floor))
j["sgemm_gflops"] = {"lowest": lo, "median": (lo + hi) / 2, "highest": hi}
j["warnings"] = ["warning: the SGEMM floor moved (fake)"] if kind == "warn" else []
j["step_ms"] = 100.0 * (calls // 6 + 1) + (50 if policy == "full" else 0)
j["cpu_steal"] = 0.0
print(json.dumps(j))
FAKE
chmod +x "$d/remat-train"
# A copy of the performance page, as on a busy host: the block still names docs/performance.md in
# its command.
printf '<!-- bench_targets: Test VM -->\nold\n<!-- /bench_targets: Test VM -->\n' >"$d/copy.md"
cp "$d/copy.md" "$d/copy.orig"
# The script refuses to write a table when a tuning variable is set; some machines set one for
# every process (OPENBLAS_CORETYPE=Haswell on one development VM), and the fake needs none.
# The list is the script's own (TUNING_ENV).
tuning=$(python3 -c 'import os, sys; sys.path.insert(0, "scripts"); import bench_targets as b
print("\n".join(k for k in os.environ if k.startswith(b.TUNING_ENV)))')
for v in $tuning; do unset "$v"; done
bt() {  # bt ROUNDS [args...]: the script with the fake binary; stdout in $d/out, stderr in $d/err
  rm -f "$d/calls"
  FAKE_DIR=$d FAKE_ROUNDS=$1 python3 scripts/bench_targets.py --binary "$d/remat-train" \
    "${@:2}" >"$d/out" 2>"$d/err" && return 0 || return $?
}

# Round 1 warned; round 2 was clean but slow beside round 3 (150 < 90% of 190); 3 and 4 stand.
bt warn:190,clean:150,clean:190,clean:188 --rounds 2 --patience 5 --page "$d/copy.md" \
  --machine "Test VM" || fail "clean rounds were not written: $(cat "$d/err")"
[ "$(cat "$d/calls")" = 24 ] || fail "ran $(cat "$d/calls") benches, not 4 rounds of 6"
grep -q "0 clean round(s) of 1 so far; this round's floor 188-190 GFLOP/s, CPU steal at most 0%; 6 run(s) warned, first gpt2 none: warning: the SGEMM floor moved (fake)" "$d/err" ||
  fail "the progress line does not say why round 1 was set aside: $(cat "$d/err")"
# shellcheck disable=SC2016 # the backquotes are the table's Markdown
grep -q '^| GPT-2 124M, 1024 tokens, `none` | 300.0, 400.0 |' "$d/out" ||
  fail "not rounds 3 and 4 in the table: $(cat "$d/out")"
grep -q "2 round(s), and 2 more set aside for a busy host (--patience)" "$d/out" ||
  fail "the set-aside rounds are not counted: $(cat "$d/out")"
grep -q -- "--rounds 2 --patience 5 --page docs/performance.md --machine 'Test VM'" "$d/copy.md" ||
  fail "the page's block does not give the command: $(cat "$d/copy.md")"
grep -q "2 rounds through the rows, and 2 more set aside for a busy host" "$d/copy.md" ||
  fail "the page's block does not count the set-aside rounds: $(cat "$d/copy.md")"

# A round whose own floor moved by more than 10% (388-484) sets no other aside: rounds 2 and 3
# (416-453, 430-458) stand together, so the run stops there. --save keeps every round.
bt clean:388-484,clean:416-453,clean:430-458 --rounds 2 --patience 5 --save "$d/saved" ||
  fail "the rounds that stand together were not found: $(cat "$d/err")"
[ "$(cat "$d/calls")" = 18 ] || fail "ran $(cat "$d/calls") benches, not 3 rounds of 6"
# shellcheck disable=SC2016
grep -q '^| GPT-2 124M, 1024 tokens, `none` | 200.0, 300.0 |' "$d/out" ||
  fail "not rounds 2 and 3 in the table: $(cat "$d/out")"
[ "$(find "$d/saved/rounds" -name '*.json' | wc -l)" = 18 ] ||
  fail "--save did not keep every round: $(ls "$d/saved/rounds")"
json_holds() {  # json_holds FILE EXPR: EXPR (Python, over the file's JSON as j) is true
  python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); sys.exit(not eval(sys.argv[2]))' \
    "$1" "$2"
}
json_holds "$d/saved/rounds/1-gpt2-none.json" 'j["step_ms"] == 100.0' ||
  fail "the set-aside round 1 is not saved as round 1"
json_holds "$d/saved/0-gpt2-none.json" 'j["step_ms"] == 200.0' ||
  fail "the table's first round is not saved as round 0"
json_holds "$d/saved/machine.json" 'j["kept"] == [2, 3] and j["set_aside"] == 1' ||
  fail "machine.json does not name the kept rounds: $(cat "$d/saved/machine.json")"
# A second run into the same folder would mix its rounds with the first's: refused before running.
bt clean:430-458 --rounds 1 --save "$d/saved" && fail "a --save folder with rounds was reused"
grep -q "holds an earlier run's rounds" "$d/err" || fail "reused --save: $(cat "$d/err")"
[ ! -e "$d/calls" ] || fail "a reused --save folder ran benches"

# Two sets of two complete with round 3: 1+3 (400-440, 415-435) and 2+3 (450-460, 415-435). The
# one under the higher floor stands.
bt clean:400-440,clean:450-460,clean:415-435 --rounds 2 --patience 5 ||
  fail "no two rounds stood: $(cat "$d/err")"
# shellcheck disable=SC2016
grep -q '^| GPT-2 124M, 1024 tokens, `none` | 200.0, 300.0 |' "$d/out" ||
  fail "not rounds 2 and 3, under the higher floor: $(cat "$d/out")"

# The time is up and no two rounds are clean: the last two stand, and --page refuses them.
cp "$d/copy.orig" "$d/copy.md"
bt warn:190,clean:150,warn:190 --rounds 2 --patience 0.0001 --page "$d/copy.md" \
  --machine "Test VM" && fail "rounds that warned were written"
[ "$(cat "$d/calls")" = 12 ] || fail "ran $(cat "$d/calls") benches after the time was up"
grep -q "1 clean round(s) of 2; the last 2 stand" "$d/err" || fail "timeout: $(cat "$d/err")"
grep -q "not written: 6 warning(s) in the runs and 6 run(s) with the floor below 90%" "$d/err" || fail "no refusal after the timeout: $(cat "$d/err")"
cmp -s "$d/copy.md" "$d/copy.orig" || fail "the file was changed after the timeout"

# Without --patience: exactly --rounds rounds, whatever they read.
bt warn:190,clean:150,clean:190 --rounds 2 || fail "a plain run failed: $(cat "$d/err")"
[ "$(cat "$d/calls")" = 12 ] || fail "a plain run ran $(cat "$d/calls") benches"
# shellcheck disable=SC2016
grep -q '^| GPT-2 124M, 1024 tokens, `none` | 100.0, 200.0 |' "$d/out" ||
  fail "a plain run's table: $(cat "$d/out")"
bt clean:190 --from tests/data/bench_targets --patience 5 && fail "--patience with --from ran"
grep -q "not with --from" "$d/err" || fail "--patience with --from: $(cat "$d/err")"
echo "bench_targets --patience: rounds set aside and kept as expected"
