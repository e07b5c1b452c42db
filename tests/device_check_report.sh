#!/bin/bash
# scripts/device-check.sh reports a failing gpu test as a failure: its row says "failed" and keeps
# the end of the test's output, the summary lists it, and the check exits non-zero; and it runs
# each test once, under the narrowest of its tags. Fake binaries and a fake nvidia-smi stand in
# for the bundle and the GPU; the failing test prints Catch's captured values ("B := 2"), which
# once made its row unwritable and the check report "ok".
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"
# Training runs write a summary whose peaks agree with the plan, so that only the test fails.
fake_device_bundle "$d/bin" "$d/bundle"
cat >"$d/bundle/remat_gpu_tests" <<'FAKE'
#!/bin/sh
if [ "$1" = --list-tags ]; then
  printf 'All available tags:\n   2  [gpu]\n   2  [ops]\n   1  [attention]\n   1  [linear]\n4 tags\n'
  exit 0
fi
# The two tests carry [ops] too: once [attention] and [linear] ran, [ops] has none left.
if [ "$1" = --list-tests ]; then
  case "$2" in
    "[ops]~[attention]~[linear]") echo "0 matching test cases" ;;
    *) echo "1 matching test case" ;;
  esac
  exit 0
fi
if [ "$1" = "[attention]" ]; then
  printf 'tests/ops/test_attention.cpp:420: FAILED:\n  allclose(delta (=)): 6 of 6 mismatch\nwith messages:\n  B := 2\n  theta := 0.0f\n'
  exit 1
fi
echo "All tests passed"
FAKE
chmod +x "$d/bundle/remat_gpu_tests"

# The fakes take no time: a budget of 600 s runs every stage whatever the machine's load.
rc=0
env -u DRY_RUN -u LONG_STEP_S -u PACK_LOGS -u FIT_MEMORY PATH="$d/bin:$PATH" OUT="$d/out" \
  BUNDLE="$d/bundle" BUDGET_S=600 POLICIES=none SANITIZE=0 bash scripts/device-check.sh >"$d/log" 2>&1 || rc=$?
rows=$d/out/device-check.rows.jsonl
[ "$rc" -ne 0 ] || fail "the check exited 0 with a failing gpu test (log: $(tail -5 "$d/log"))"
if grep -q '^$' "$rows"; then fail "the rows file has a blank line (a row was lost)"; fi
python3 - "$rows" <<'PY' || fail "rows: $(cat "$rows")"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
att = [r for r in rows if r["stage"] == "gpu_test" and r["tag"] == "[attention]"]
assert len(att) == 1 and att[0]["status"] == "failed", att
assert "B := 2" in att[0]["output"], att[0]["output"]
lin = [r for r in rows if r["stage"] == "gpu_test" and r["tag"] == "[linear]"]
assert len(lin) == 1 and lin[0]["status"] == "passed", lin
# Each test once, under its first tag (the narrow ones first): [linear] without what [attention]
# ran, and [ops], whose tests both ran, reported as covered and not run.
assert lin[0]["spec"] == "[linear]~[attention]" and lin[0]["tests"] == 1, lin
ops = [r for r in rows if r["stage"] == "gpu_test" and r["tag"] == "[ops]"]
assert len(ops) == 1 and ops[0]["status"] == "covered", ops
s = rows[-1]
assert s["stage"] == "summary" and s["status"] == "failures", s
assert s["failures"] == ["gpu_test [attention]: failed"], s["failures"]
assert s["gpu_tests"]["failed"] == 1 and s["gpu_tests"]["passed"] == 1, s["gpu_tests"]
PY
# Listed into a file first: `tar | grep -q` would fail under pipefail when grep stops reading early.
tar tzf "$d/out/logs.tar.gz" >"$d/listing"
grep -qx 'logs/gpu_test-attention.txt' "$d/listing" || fail "logs.tar.gz lacks the failing test's log"
[ ! -e "$d/out/logs" ] || fail "logs/ was left beside logs.tar.gz"
echo "device-check reports the failing gpu test: ok"
