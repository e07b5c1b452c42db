#!/usr/bin/env bash
# The one command for a machine with a GPU (built for an H200 with CUDA 13 and PyTorch's cuDNN
# wheel; no network): locate cuDNN, build Release with the CUDA backend into build-device, run
# the gpu tests, then time short training runs of the GPT-2 124M and 350M shapes at seq_len 4096
# and 32768 under each remat policy and print a table (tokens/s, model TFLOP/s, MFU, peak memory).
# Finishes in under 8 minutes (every step is under `timeout`). With $OUT set, writes the full
# log to $OUT/device-check.log and the table to $OUT/device-check.json.
# An out-of-memory run (exit 3) is recorded as "OOM", not as a failure.
# MFU = model FLOPs (recompute excluded) per second / the bf16 GEMM rate measured on this card by
# remat_bench_gemm. Last, the longest seq_len that fits with full remat in FIT_MEMORY is
# predicted by `fit` and confirmed by one real step (and one step above it must not fit).
#   env: CUDNN_ROOT (cuDNN folder), JOBS (build jobs, default nproc),
#        POLICIES ("none save_attn save_dots full"), FIT_MEMORY (pool budget for the fit, 64GiB)
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
BUDGET_S=450  # stop starting new work after this; the whole script must stay under 8 minutes
LOG_DIR=${OUT:-$(mktemp -d)}
mkdir -p "$LOG_DIR"
LOG="$LOG_DIR/device-check.log"
JSON="$LOG_DIR/device-check.json"
exec > >(tee "$LOG") 2>&1
elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( BUDGET_S - $(elapsed) )); }
say() { echo "[device-check $(elapsed)s] $*"; }

# ---- 1. cuDNN ----
if [ -z "${CUDNN_ROOT:-}" ]; then
  CUDNN_ROOT=$(python3 -c 'import nvidia.cudnn as m; print(list(m.__path__)[0])' 2>/dev/null || true)
fi
if [ -n "${CUDNN_ROOT:-}" ]; then
  say "cuDNN from $CUDNN_ROOT"
  export LD_LIBRARY_PATH="$CUDNN_ROOT/lib:${LD_LIBRARY_PATH:-}"  # its sub-libraries are dlopen'ed
  CUDNN_ARG=(-DCUDNN_ROOT="$CUDNN_ROOT")
else
  say "cuDNN: CUDNN_ROOT unset and no nvidia.cudnn wheel; trying the CUDA toolkit folder"
  CUDNN_ARG=()
fi
export PATH="/usr/local/cuda/bin:$PATH"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

# ---- 2. build ----
say "configure + build (Release, REMAT_CUDA=ON)"
if ! timeout 60 cmake -S . -B build-device -DCMAKE_BUILD_TYPE=Release -DREMAT_CUDA=ON "${CUDNN_ARG[@]}" >/dev/null; then
  say "FAILED: cmake configure"; exit 1
fi
if ! timeout 240 cmake --build build-device -j "${JOBS:-$(nproc)}" --target remat-train remat_gpu_tests remat_bench_gemm; then
  say "FAILED: build"; exit 1
fi
./build-device/remat-train --version

# ---- 3. gpu tests ----
say "gpu tests"
TESTS_RC=0
(cd build-device && timeout "$(( $(left) > 200 ? 200 : $(left) ))" ctest -L gpu --output-on-failure) || TESTS_RC=$?
say "gpu tests exit code $TESTS_RC"

# ---- 4. the measured bf16 GEMM peak (MFU denominator) ----
PEAK_LINE=$(timeout 60 ./build-device/tests/gpu/remat_bench_gemm || true)
say "$PEAK_LINE"
PEAK_TFLOPS=$(echo "$PEAK_LINE" | sed -n 's/^bf16 GEMM peak: \([0-9.]*\).*/\1/p')
if [ -z "$PEAK_TFLOPS" ]; then PEAK_TFLOPS=989; say "GEMM benchmark failed: MFU against the 989 TFLOP/s datasheet value"; fi

# ---- 5. benchmarks ----
TMP=$(mktemp -d)
write_config() {  # name n_layer n_head n_embd
  cat > "$TMP/$1.toml" <<TOML
[model]
kind = "gpt"
n_layer = $2
n_head = $3
n_embd = $4
vocab_size = 50304
n_ctx = 32768
position = "rope"
[train]
seq_len = 4096
batch_size = 1
steps = 3
lr = 3e-4
warmup_steps = 1
[data]
task = "random"
[remat]
policy = "none"
[device]
backend = "cuda"
TOML
}
write_config gpt2-124m 12 12 768
write_config gpt2-350m 24 16 1024

ROWS=()
for model in gpt2-124m gpt2-350m; do
  for seq in 4096 32768; do
    for policy in ${POLICIES:-none save_attn save_dots full}; do
      if [ "$(left)" -lt 20 ]; then
        say "time budget spent: skipping $model T=$seq $policy"
        ROWS+=("{\"model\":\"$model\",\"seq_len\":$seq,\"policy\":\"$policy\",\"status\":\"skipped\"}")
        continue
      fi
      M="$TMP/$model-$seq-$policy.jsonl"
      say "run $model seq_len=$seq policy=$policy"
      timeout "$(( $(left) > 60 ? 60 : $(left) ))" ./build-device/remat-train --config "$TMP/$model.toml" \
        --set device.backend=cuda --set train.steps=3 --set train.seq_len=$seq \
        --set remat.policy=$policy --metrics "$M" -q
      rc=$?
      case $rc in
        0) status=ok ;; 3) status=OOM ;; 124) status=timeout ;; *) status="failed($rc)" ;;
      esac
      summary=$( [ -f "$M" ] && grep '"summary"' "$M" | tail -1 )
      ROWS+=("$(python3 - "$model" "$seq" "$policy" "$status" "$PEAK_TFLOPS" "$summary" <<'PY'
import json, sys
model, seq, policy, status, peak, summary = sys.argv[1:7]
row = {"model": model, "seq_len": int(seq), "policy": policy, "status": status}
if summary:
    s = json.loads(summary)["summary"]
    f = s.get("flops_per_step", {})
    flops = sum(v for k, v in f.items() if k != "recompute")  # model FLOPs: recompute excluded
    ms = s.get("median_step_ms", 0) or 0
    row.update(tokens_per_s=round(s.get("tokens_per_s", 0), 1), median_step_ms=round(ms, 1),
               peak_gib=round(s.get("peak_bytes", 0) / 2**30, 2),
               predicted_peak_gib=round(s.get("predicted_peak_bytes", 0) / 2**30, 2))
    if ms > 0:
        tflops = flops / (ms / 1000) / 1e12
        row.update(model_tflops=round(tflops, 1), mfu=round(tflops / float(peak), 3))
print(json.dumps(row))
PY
)")
    done
  done
done
# ---- 6. longest seq_len with full remat: predicted, then confirmed by one real step ----
FIT_RC=skipped
if [ "$(left)" -gt 60 ]; then
  say "fit: gpt2-124m, full, budget ${FIT_MEMORY:-64GiB}"
  timeout "$(( $(left) - 10 ))" ./build-device/remat-train fit --config "$TMP/gpt2-124m.toml" \
    --set device.backend=cuda --set device.memory="${FIT_MEMORY:-64GiB}" --policies full --measure
  FIT_RC=$?
  say "fit --measure exit code $FIT_RC (0: prediction confirmed)"
fi
rm -rf "$TMP"

# ---- 7. table ----
ROWS_FILE="$LOG_DIR/device-check.rows.jsonl"
printf '%s\n' "${ROWS[@]}" > "$ROWS_FILE"
python3 - "$TESTS_RC" "$JSON" "$ROWS_FILE" "$PEAK_TFLOPS" "$FIT_RC" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[3]) if l.strip()]
cols = [("model", "model", "<10"), ("seq_len", "seq_len", ">7"), ("policy", "policy", "<6"),
        ("status", "status", "<10"), ("tokens_per_s", "tok/s", ">9"), ("median_step_ms", "ms/step", ">9"),
        ("model_tflops", "TFLOP/s", ">8"), ("mfu", "MFU", ">6"), ("peak_gib", "peak GiB", ">9"),
        ("predicted_peak_gib", "pred GiB", ">9")]
print(" ".join(format(title, fmt) for _, title, fmt in cols))
for r in rows:
    print(" ".join(format(str(r.get(key, "-")), fmt) for key, _, fmt in cols))
with open(sys.argv[2], "w") as f:
    json.dump({"gpu_tests_exit_code": int(sys.argv[1]), "bf16_gemm_peak_tflops": float(sys.argv[4]),
               "fit_measure_exit_code": sys.argv[5], "runs": rows}, f, indent=1)
print(f"MFU against the measured bf16 GEMM peak of {sys.argv[4]} TFLOP/s; fit --measure exit code {sys.argv[5]}")
PY
say "done; log $LOG, table $JSON"
exit "$TESTS_RC"
