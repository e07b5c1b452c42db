#!/usr/bin/env bash
# A lent GPU's session in one command: scripts/device-check.sh, then scripts/device-vs-torch.sh,
# each with its share of TOTAL_S seconds. The device tool lends 15 minutes a session, the
# machine's start included, and runs at most 600 s a command, so both runs must fit one command
# with room left to send the results back and to rerun once. Here, first:
#
#   make bundle                                   # device-bundle.tar.gz: send it along (carry)
#   OUT=/some/folder bash scripts/device-session.sh   # on the GPU machine
#
# Writes $OUT/check/ (device-check.rows.jsonl, device-check.json, logs) and $OUT/vs-torch/
# (device-vs-torch.rows.jsonl, logs), each row as it is measured, so a session cut short keeps
# what ran; commit both rows files under docs/device-runs/ (its README names them). The bundle's
# .tar.gz is unpacked once, into a temp folder, for both scripts (device-vs-torch.sh reads only
# an unpacked folder). The check gets CHECK_SHARE percent of TOTAL_S; the comparison with
# PyTorch gets what the check left, and is skipped under 60 s. Exit status: 0 when both exit 0.
#
#   env: OUT (default a new temp folder), TOTAL_S (540), CHECK_SHARE (55), BUNDLE
#        (device-bundle), and what either script reads (POLICIES, SANITIZE, TORCH_PYTHON, ...).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
START=$(date +%s)
TOTAL_S=${TOTAL_S:-540}
CHECK_SHARE=${CHECK_SHARE:-55}
OUT=${OUT:-$(mktemp -d)}
BUNDLE=${BUNDLE:-device-bundle}
say() { echo "[device-session $(($(date +%s) - START))s] $*"; }

for v in TOTAL_S CHECK_SHARE; do
  case ${!v} in
    '' | *[!0-9]*) echo "[device-session] $v=${!v}: not a whole number of seconds or percent. Fix: e.g. $v=540" >&2; exit 2 ;;
  esac
done
if [ "$CHECK_SHARE" -gt 100 ]; then
  echo "[device-session] CHECK_SHARE=$CHECK_SHARE: over 100 percent. Fix: e.g. CHECK_SHARE=55" >&2
  exit 2
fi
if [ ! -x "$BUNDLE/remat-train" ] && [ -f "$BUNDLE.tar.gz" ]; then
  unpacked=$(mktemp -d)
  trap 'rm -rf "$unpacked"' EXIT
  if ! tar -C "$unpacked" -xzf "$BUNDLE.tar.gz"; then
    echo "[device-session] could not unpack $BUNDLE.tar.gz. Fix: make bundle here, and send device-bundle.tar.gz along" >&2
    exit 1
  fi
  BUNDLE=$unpacked/$(basename "$BUNDLE")
fi
BUNDLE=$(cd "$BUNDLE" 2>/dev/null && pwd || echo "$BUNDLE")
mkdir -p "$OUT/check" "$OUT/vs-torch" || exit 1

check_s=$((TOTAL_S * CHECK_SHARE / 100))
say "device-check.sh: ${check_s} s of ${TOTAL_S}, bundle $BUNDLE"
OUT="$OUT/check" BUNDLE="$BUNDLE" BUDGET_S=$check_s bash scripts/device-check.sh
check_rc=$?

left=$((TOTAL_S - ($(date +%s) - START)))
vs_rc=0
if [ "$left" -ge 60 ]; then
  say "device-vs-torch.sh: ${left} s left"
  OUT="$OUT/vs-torch" BUNDLE="$BUNDLE" BUDGET_S=$left bash scripts/device-vs-torch.sh
  vs_rc=$?
else
  say "device-vs-torch.sh skipped: ${left} s left, under 60"
  vs_rc=1
fi
say "done: device-check exit $check_rc, device-vs-torch exit $vs_rc; rows in $OUT/check and $OUT/vs-torch"
[ "$check_rc" -eq 0 ] && [ "$vs_rc" -eq 0 ]
