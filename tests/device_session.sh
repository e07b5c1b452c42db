#!/bin/bash
# scripts/device-session.sh runs the device check and then the comparison with PyTorch in one
# command: it unpacks device-bundle.tar.gz once for both (device-vs-torch.sh reads only a folder),
# gives the check its share of TOTAL_S and the comparison what is left, writes both rows files
# under OUT, and exits non-zero when either script does. Fake binaries, a fake nvidia-smi and a
# fake PyTorch python stand in for the bundle, the GPU and torch; every test and run passes but
# the PyTorch rows, which cannot (the fake python prints no JSON).
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"
b=$d/bundle/device-bundle
fake_device_bundle "$d/bin" "$b"
cat >"$d/bin/torch-python" <<'FAKE'
#!/bin/sh
echo "2.9.1 13.0"
FAKE
cat >"$b/remat_gpu_tests" <<'FAKE'
#!/bin/sh
if [ "$1" = --list-tags ]; then
  printf 'All available tags:\n   2  [gpu]\n   1  [linear]\n1 tags\n'
  exit 0
fi
[ "$1" != --list-tests ] || { echo "1 matching test case"; exit 0; }
echo "All tests passed"
FAKE
chmod +x "$d/bin/torch-python" "$b/remat_gpu_tests"
# Only the archive, as the device tool carries it: the folder must come from unpacking it.
tar -C "$d/bundle" -czf "$d/bundle/device-bundle.tar.gz" device-bundle
rm -rf "$b"

# A bad share is refused before anything runs.
if out=$(TOTAL_S=9x OUT="$d/bad" bash scripts/device-session.sh 2>&1); then fail "TOTAL_S=9x ran"; fi
echo "$out" | grep -q "TOTAL_S=9x: not a whole number" || fail "TOTAL_S=9x: $out"
[ ! -e "$d/bad" ] || fail "TOTAL_S=9x created OUT"

rc=0
env -u DRY_RUN -u PACK_LOGS -u FIT_MEMORY PATH="$d/bin:$PATH" OUT="$d/out" TOTAL_S=400 \
  BUNDLE="$d/bundle/device-bundle" POLICIES=none SANITIZE=0 COMPILE=0 TORCH_PYTHON="$d/bin/torch-python" \
  bash scripts/device-session.sh >"$d/log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] || fail "the session exited 0 though its PyTorch rows failed (log: $(tail -5 "$d/log"))"
grep -q "done: device-check exit 0, device-vs-torch exit [1-9]" "$d/log" ||
  fail "the exit codes line: $(grep 'device-session' "$d/log" | tail -3)"
python3 - "$d/out" "$d/bundle/device-bundle" <<'PY' || fail "rows: $(head -c 2000 "$d/out/check/device-check.rows.jsonl")"
import json, sys
out, packed = sys.argv[1:3]
check = [json.loads(l) for l in open(f"{out}/check/device-check.rows.jsonl")]
start = next(r for r in check if r["stage"] == "start")
assert start["budget_s"] == 400 * 55 // 100, start
binaries = next(r for r in check if r["stage"] == "binaries")
assert binaries["status"] == "ok" and binaries["bundle"] != packed, binaries  # the unpacked copy
assert check[-1]["stage"] == "summary" and check[-1]["status"] == "ok", check[-1]
vs = [json.loads(l) for l in open(f"{out}/vs-torch/device-vs-torch.rows.jsonl")]
found = next(r for r in vs if r["stage"] == "binaries")
assert found["status"] == "ok", found
assert found["remat_train"] == binaries["bundle"] + "/remat-train", (found, binaries)
assert any(r["stage"] == "speed" and r.get("tool") == "remat-train" for r in vs), vs
PY
echo "device-session runs the check, then the comparison, on one unpacked bundle: ok"
