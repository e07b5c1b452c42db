# Sourced by the shell tests (tests/*.sh): strict mode, a scratch folder $d that is removed on
# exit, and `fail MESSAGE`, which prints FAILED: MESSAGE to stderr and exits 1.
# shellcheck shell=bash
set -euo pipefail

d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
fail() {
  echo "FAILED: $*" >&2
  exit 1
}

# Sets $py to a python with PyTorch (REMAT_TORCH_PYTHON first, then python3, then /usr/bin/python3,
# whose Debian package may have it when the PATH's python3 has not), or exits 77 (ctest: skipped)
# saying how to get one.
# shellcheck disable=SC2034  # py is the caller's
find_torch_python() {
  py=
  local p
  for p in ${REMAT_TORCH_PYTHON:-} python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null && "$p" -c 'import torch' 2>/dev/null; then
      py=$p
      return 0
    fi
  done
  echo "skipped: PyTorch not installed for ${REMAT_TORCH_PYTHON:+$REMAT_TORCH_PYTHON, }python3 or" \
    "/usr/bin/python3 (apt-get install python3-torch, or set REMAT_TORCH_PYTHON to a python with torch)"
  exit 77
}

# The checks against Hugging Face's Python packages (tests/NAME.sh): runs tests/SCRIPT REPO BIN in
# $d with $REMAT_HF_PYTHON (default python3), BIN being remat-train (ARGS' first, default
# build/remat-train), or exits 77 (ctest: skipped) with HINT where that python cannot run IMPORT.
# Usage: hf_python_check SCRIPT IMPORT HINT [ARGS...]
hf_python_check() {
  local script=$1 import=$2 hint=$3 repo bin py
  shift 3
  repo=$(cd "$(dirname "$0")/.." && pwd)
  bin=$(realpath "${1:-$repo/build/remat-train}")
  [ -x "$bin" ] || fail "no remat-train binary at $bin (run make build, or pass its path)"
  py=${REMAT_HF_PYTHON:-python3}
  if ! command -v "$py" >/dev/null || ! "$py" -c "$import" 2>/dev/null; then
    echo "skipped: $py cannot run '$import' ($hint)"
    exit 77
  fi
  cd "$d"
  "$py" "$repo/tests/$script" "$repo" "$bin"
}
