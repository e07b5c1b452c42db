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

# Fakes of what scripts/device-check.sh and device-vs-torch.sh run on a GPU machine: BIN/nvidia-smi
# (one GPU), and in BUNDLE a remat-train whose training runs write a summary with peaks equal to
# the plan and a GEMM benchmark; the caller writes BUNDLE/remat_gpu_tests (what its tests report).
# Usage: fake_device_bundle BIN BUNDLE
fake_device_bundle() {
  local bin=$1 bundle=$2
  mkdir -p "$bin" "$bundle"
  cat >"$bin/nvidia-smi" <<'FAKE'
#!/bin/sh
echo "Fake GPU, 1000, 900, 1.0"
FAKE
  cat >"$bundle/remat-train" <<'FAKE'
#!/bin/sh
case "$1" in
  --version) echo "CUDA: CUDA runtime 13.0 (driver 13.0), cuDNN 9.19.0 (built with 9.19.0)" ;;
  plan) echo '{"policies": [{"policy": "none", "peak_bytes": 1}]}' ;;
  fit) echo '{"policies": [{"longest_seq_len": 9, "predicted_peak_bytes": 5, "measured":
    {"measured_peak_bytes": 5, "exit_at_longest": 0, "exit_above_longest": 3}}]}' ;;
  *)
    while [ $# -gt 0 ] && [ "$1" != --metrics ]; do shift; done
    [ $# -lt 2 ] || echo '{"summary": {"median_step_ms": 1, "tokens_per_s": 1, "peak_bytes": 5,
      "predicted_peak_bytes": 5, "host_peak_bytes": 7, "predicted_host_peak_bytes": 7}}' |
      tr -d '\n' >"$2"
    ;;
esac
FAKE
  cat >"$bundle/remat_bench_gemm" <<'FAKE'
#!/bin/sh
echo "bf16 GEMM peak: 100.0 TFLOP/s"
FAKE
  chmod +x "$bin/nvidia-smi" "$bundle/remat-train" "$bundle/remat_bench_gemm"
}
