#!/usr/bin/env bash
# The one command for a machine with a GPU: turns a few minutes of it into verified numbers.
# Built for an H200 with CUDA 13, cuDNN/cuBLAS/NVRTC as Python wheels, no compiler packages and
# no network, so it runs the prebuilt bundle (scripts/device-bundle.sh) and builds nothing.
#
# Send along: the working tree plus the ignored folder `device-bundle` (about 50 MiB; make it
# here with `make bundle`). Run, from the repository root:
#     OUT=/some/folder bash scripts/device-check.sh
# and bring back $OUT: device-check.rows.jsonl (one JSON object per line, appended as soon as
# each result is measured, so a run killed by a time limit still returns everything done so far),
# device-check.json (the summary, written last), device-check.log (everything printed) and
# logs.tar.gz (logs/: each stage's full output; configs/: the models it trained).
#
# Rows, in order (each has "stage" and "status"; "t_s" is seconds since the start):
#   start, binaries, libraries, versions (cuDNN: header built with, runtime, wheel header),
#   plan (the bundle's prediction for GPT-2 124M at 32k on an h200, no GPU needed),
#   gpu ("no_gpu" ends the check here, exit 0: what a dry run on a machine without one shows),
#   gpu_test per test binary tag, each test once under its narrowest tag ("covered": none left;
#   parity vs the CPU in fp32 and bf16, bitwise policies on the
#   MLP, cuDNN's tolerance on the GPT, plan workspaces against the planner's reserve at GPT-2's and
#   Llama's grouped-query shapes, the cuDNN release's backward at key lengths off multiples of
#   128, attention chunks without a 1-token tail, planner vs measured peak; [documents]: document
#   attention, one cuDNN call per document, against the CPU's, 20 steps of a llama and a RoPE GPT
#   on packed-style documents against the CPU's losses, and the planner's peak with documents;
#   [rope]: every RoPE scaling type and yarn's attention factor against the CPU; [eval]: the LM
#   head's argmax that eval --passkey reads), gemm (bf16
#   peak: the MFU denominator), train per GPT-2 124M/350M x 4k/32k x policy (ms/step, tokens/s,
#   MFU, measured vs predicted peak; gpt2-124m-chunked: 32k, full, attention in chunks of 8192),
#   offload (124M at 32k, full, MLP tiled, checkpoints and AdamW moments in pinned host memory,
#   then also the weights and gradients with AdamW on the host: step time beside the run that
#   keeps them, device and host peaks against the planner's), fit (fit --measure, full,
#   FIT_MEMORY), longest (one step of
#   124M at the planner's maximum for the whole card, or "skipped" with the estimated step time),
#   long (two steps of 124M, full, at the longest power-of-two length from 64k whose steps fit
#   LONG_STEP_S: the second step's executed TFLOP/s against the rate `plan` assumes),
#   sanitizer (compute-sanitizer memcheck over every gpu test, racecheck over the tests of our
#   kernels that use shared memory; "partial" when the time cap came first with no error), summary.
# Time: stops starting work after BUDGET_S (420) seconds and caps every step with `timeout`, so
# the whole check stays under 8 minutes.
#   env: OUT (results folder; default a new temp folder), BUNDLE (default device-bundle; when
#        that folder is missing, BUNDLE.tar.gz is unpacked into a temp folder),
#        BUDGET_S, POLICIES ("none save_attn save_dots full"), FIT_MEMORY (pool budget of the
#        fit --measure stage, 6GiB: its longest context, ~87k tokens, takes seconds a step),
#        DRY_RUN=1 (stop before using any GPU, as if there were none), CUDNN_ROOT, CUDA_HOME,
#        LONG_STEP_S (90: seconds for the long stage's two steps), PACK_LOGS=0 (leave logs/ and
#        configs/ unpacked), SANITIZE=0 (no compute-sanitizer stage).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
START=$(date +%s)
BUDGET_S=${BUDGET_S:-420}
OUT=${OUT:-$(mktemp -d)}
# logs/ and configs/ under OUT are replaced: never the repository's own.
if [ "$(cd "$OUT" 2>/dev/null && pwd -P)" = "$(pwd -P)" ]; then
  echo "[device-check] OUT is the repository root; give it a folder of its own (OUT=/tmp/device-check)" >&2
  exit 2
fi
mkdir -p "$OUT/logs" "$OUT/configs"
LOG=$OUT/device-check.log
ROWS=$OUT/device-check.rows.jsonl
SUMMARY=$OUT/device-check.json
: > "$ROWS"
CFG=$OUT/configs
PY=$(command -v python3 || command -v python) || { echo "[device-check] needs python3 (JSON rows)" >&2; exit 1; }

# Everything printed also goes to the log. The tee is waited for on exit, so its last lines
# are on disk before the script returns.
exec 3>&1 4>&2
exec > >(tee "$LOG") 2>&1
TEE_PID=$!
finish() {
  local rc=$?
  [ "${PACK_LOGS:-1}" = 1 ] && pack_logs
  exec 1>&3 2>&4 3>&- 4>&-
  wait "$TEE_PID" 2>/dev/null || while kill -0 "$TEE_PID" 2>/dev/null; do sleep 0.1; done
  exit "$rc"
}
trap finish EXIT

# ---- time and rows ----
DEVICE_SCRIPT=device-check
# elapsed, left, say, cap, emit and row
. scripts/device-rows.sh
summary() {  # the last row, device-check.json and a table; $1: overall status
  "$PY" - "$ROWS" "$SUMMARY" "$1" "$(elapsed)" <<'PY'
import json, sys
rows_path, summary_path, status, elapsed = sys.argv[1:5]
rows = [json.loads(l) for l in open(rows_path) if l.strip()]
tests = [r for r in rows if r["stage"] == "gpu_test"]
runs = [r for r in rows if r["stage"] == "train"]
failed = [r for r in rows if r.get("status") in ("failed", "timeout", "missing", "disagrees")]
gemm = next((r for r in rows if r["stage"] == "gemm"), {})
def label(r):
    parts = [r["stage"], r.get("tag"), r.get("name"), r.get("model"), r.get("seq_len"), r.get("policy")]
    return " ".join(str(p) for p in parts if p not in (None, "")) + ": " + r["status"]
out = {"stage": "summary", "status": status if status != "auto" else ("ok" if not failed else "failures"),
       "elapsed_s": int(elapsed), "gpu": next((r.get("name") for r in rows if r["stage"] == "gpu"), None),
       "gpu_tests": {s: sum(r["status"] == s for r in tests) for s in ("passed", "failed", "timeout", "skipped", "covered")},
       "train_runs": {s: sum(r["status"] == s for r in runs) for s in ("ok", "OOM", "failed", "timeout", "skipped")},
       "peaks_agree": sum(bool(r.get("peak_agrees")) for r in runs),
       "bf16_gemm_peak_tflops": gemm.get("peak_tflops"),
       "sanitizer": {r["name"]: r["status"] for r in rows if r["stage"] == "sanitizer"},
       "failures": [label(r) for r in failed]}
with open(rows_path, "a") as f:
    f.write(json.dumps(out) + "\n")
with open(summary_path, "w") as f:
    json.dump(dict(out, rows=rows), f, indent=1)
cols = [("model", "<10"), ("seq_len", ">7"), ("policy", "<9"), ("status", "<8"), ("step_ms", ">8"),
        ("tokens_per_s", ">9"), ("model_tflops", ">7"), ("mfu", ">6"), ("peak_gib", ">8"),
        ("predicted_peak_gib", ">8"), ("peak_agrees", ">6")]
if runs:
    print(" ".join(format(k[:9], f) for k, f in cols))
    for r in runs:
        print(" ".join(format(str(r.get(k, "-")), f) for k, f in cols))
print(json.dumps(out))
PY
}

# ---- 1. binaries: the bundle, or a build where the machine can make one ----
BUNDLE=${BUNDLE:-device-bundle}
locate_binaries() {
  # The bundle travels gzipped (scripts/device-bundle.sh): unpacked into a temp folder, not OUT.
  if [ ! -x "$BUNDLE/remat-train" ] && [ -f "$BUNDLE.tar.gz" ]; then
    local unpacked
    unpacked=$(mktemp -d)
    if tar -C "$unpacked" -xzf "$BUNDLE.tar.gz"; then
      BUNDLE=$unpacked/$(basename "$BUNDLE")
      say "unpacked the bundle into $BUNDLE"
    else
      row stage=binaries status=failed note="could not unpack $BUNDLE.tar.gz"
      return 1
    fi
  fi
  if [ -x "$BUNDLE/remat-train" ]; then
    RT=$BUNDLE/remat-train GT=$BUNDLE/remat_gpu_tests GB=$BUNDLE/remat_bench_gemm
    row stage=binaries status=ok source=bundle bundle="$BUNDLE" \
      manifest="$(sed -n '1,2p' "$BUNDLE/MANIFEST.txt" 2>/dev/null | paste -sd' ')"
    return 0
  fi
  say "no $BUNDLE/remat-train: building into build-device (needs the Debian packages)"
  local cudnn=()
  if [ -n "${CUDNN_ROOT:-}" ]; then cudnn=(-DCUDNN_ROOT="$CUDNN_ROOT"); fi
  if timeout "$(cap 60)" cmake -S . -B build-device -DCMAKE_BUILD_TYPE=Release -DREMAT_CUDA=ON "${cudnn[@]}" >/dev/null &&
    timeout "$(cap 240)" cmake --build build-device -j "$(nproc)" --target remat-train remat_gpu_tests remat_bench_gemm; then
    RT=build-device/remat-train GT=build-device/tests/gpu/remat_gpu_tests GB=build-device/tests/gpu/remat_bench_gemm
    row stage=binaries status=ok source=build
    return 0
  fi
  row stage=binaries status=failed source=build \
    note="no bundle and no build: make the bundle where the packages are (make bundle) and send device-bundle along"
  return 1
}

# ---- 2. libraries: cuDNN, cuBLAS, NVRTC and the CUDA runtime from the wheels or CUDA_HOME ----
site_dirs() {
  "$PY" - <<'PY' 2>/dev/null
import site, sysconfig
dirs = list(site.getsitepackages()) + [site.getusersitepackages(), sysconfig.get_paths()["purelib"]]
print("\n".join(dict.fromkeys(dirs)))
PY
}
library_dirs() {  # candidate folders, most specific first
  if [ -n "${CUDNN_ROOT:-}" ]; then echo "$CUDNN_ROOT/lib"; fi
  local sp d
  while read -r sp; do
    for d in "$sp"/nvidia/*/lib; do [ -d "$d" ] && echo "$d"; done
  done < <(site_dirs)
  for d in "${CUDA_HOME:-/usr/local/cuda}"/lib64 /usr/local/cuda/lib64; do [ -d "$d" ] && echo "$d"; done
}
dir_of() {  # the first folder in $LD_LIBRARY_PATH holding a file matching $1
  local d f
  IFS=: read -ra dirs <<< "$LD_LIBRARY_PATH"
  for d in "${dirs[@]}"; do
    for f in "$d"/$1; do [ -e "$f" ] && { echo "$d"; return; }; done
  done
}
missing_libs() {  # sonames ldd cannot resolve for the three binaries, and cuBLASLt (loaded on first use)
  local b
  {
    for b in "$RT" "$GT" "$GB"; do ldd "$b" 2>&1 | awk '/not found/ {print $1}'; done
    "$RT" --version 2>/dev/null | sed -n 's/.*cuBLASLt cannot load \([^ ]*\) .*/\1/p'
  } | sort -u | paste -sd' '
}
setup_libraries() {
  local dirs
  dirs=$(library_dirs | awk '!seen[$0]++' | paste -sd:)
  local bundle_lib
  bundle_lib="$(cd "$(dirname "$RT")" && pwd)/lib"  # absolute: the binaries may run elsewhere
  LD_LIBRARY_PATH="$bundle_lib${dirs:+:$dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export LD_LIBRARY_PATH
  # The bundled libstdc++ only if the machine's is too old for the binaries (one libstdc++ per
  # process, shared with cuDNN: the newer system one is preferred).
  local compat=no
  if ! "$RT" --version >/dev/null 2>"$OUT/logs/version.err" && grep -q 'GLIBCXX\|CXXABI\|libstdc' "$OUT/logs/version.err" &&
    [ -d "$bundle_lib/compat" ]; then
    LD_LIBRARY_PATH="$bundle_lib/compat:$LD_LIBRARY_PATH"
    compat=yes
  fi
  local missing
  missing=$(missing_libs)
  row stage=libraries status="$([ -z "$missing" ] && echo ok || echo missing)" missing="$missing" \
    cudnn_dir="$(dir_of 'libcudnn.so.9*')" cublas_dir="$(dir_of 'libcublasLt.so.*')" \
    nvrtc_dir="$(dir_of 'libnvrtc.so.*')" cudart_dir="$(dir_of 'libcudart.so.*')" \
    nccl_dir="$(dir_of 'libnccl.so.*')" \
    compat_libstdcxx="$compat" glibc="$(ldd --version 2>&1 | head -1 | grep -o '[0-9.]*$')" \
    ld_library_path="$LD_LIBRARY_PATH"
  [ -z "$missing" ]
}

# ---- 3. versions: the cuDNN headers built against, the runtime loaded, the wheel's headers ----
check_versions() {
  local v built runtime header="" hdr
  v=$("$RT" --version 2>&1)
  echo "$v"
  runtime=$(echo "$v" | sed -n 's/.*cuDNN \([0-9.]*\) (built with.*/\1/p')
  built=$(echo "$v" | sed -n 's/.*(built with \([0-9.]*\)).*/\1/p')
  hdr=$(dirname "$(dir_of 'libcudnn.so.9*')")/include/cudnn_version.h
  if [ -f "$hdr" ]; then
    header=$(awk '/#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) / {print $3}' "$hdr" | paste -sd.)
  fi
  local status=ok
  if [ -z "$runtime" ]; then status=failed; elif [ "$runtime" != "$built" ]; then status=differs; fi
  row stage=versions status="$status" cudnn_runtime="$runtime" cudnn_built_with="$built" \
    cudnn_wheel_header="$header" version="$(echo "$v" | paste -sd';')"
  [ "$status" != failed ]
}

# The bundle plans without a GPU: GPT-2 124M at 32k on the h200 preset (what a run compares with).
plan_smoke() {
  local out
  out=$("$RT" plan --config configs/gpt2-124m.toml --gpu h200 --json 2>"$OUT/logs/plan.err")
  local rc=$?
  emit "$("$PY" - "$rc" "$(elapsed)" "$out" <<'PY'
import json, sys
rc, t, text = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
row = {"stage": "plan", "status": "ok" if rc == 0 else "failed", "exit_code": rc,
       "config": "configs/gpt2-124m.toml", "target": "h200"}
try:
    row["predicted_peak_bytes"] = {p["policy"]: p["peak_bytes"] for p in json.loads(text)["policies"]}
except (ValueError, KeyError):
    row["status"] = "failed"
row["t_s"] = t
print(json.dumps(row))
PY
)"
}

# ---- 4. the GPU ----
GPU_NAME="" GPU_FREE_MIB=0
detect_gpu() {
  local q
  q=$(nvidia-smi --query-gpu=name,memory.total,memory.free,driver_version --format=csv,noheader,nounits 2>/dev/null | head -1)
  if [ "${DRY_RUN:-0}" = 1 ]; then
    row stage=gpu status=dry_run nvidia_smi="$q"
    return 1
  fi
  if [ -z "$q" ]; then
    row stage=gpu status=no_gpu note="nvidia-smi found no GPU$(command -v nvidia-smi >/dev/null || echo ' (not installed)')"
    return 1
  fi
  IFS=, read -r GPU_NAME total GPU_FREE_MIB driver <<< "$q"
  GPU_FREE_MIB=${GPU_FREE_MIB// /}
  row stage=gpu status=ok name="${GPU_NAME}" memory_total_mib:="${total// /}" \
    memory_free_mib:="$GPU_FREE_MIB" driver="${driver// /}"
}

# ---- 5. gpu tests, one tag at a time ----
run_gpu_tests() {
  local tags tag rc t0 out capped spec seen="" n
  # An array, not word splitting: "[linear]" unquoted would be a glob.
  # Narrow tags first (fewest tests), so that a broad one ([ops]) runs only what no other covers.
  mapfile -t tags < <("$GT" --list-tags 2>/dev/null | sed -n 's/^ *\([0-9]\+\) \+\(\[[^]]*\]\).*/\1 \2/p' |
    sort -s -n -k1,1 | cut -d' ' -f2 | grep -v '^\[gpu\]$')
  [ ${#tags[@]} -gt 0 ] || { row stage=gpu_test status=failed tag=list note="--list-tags gave nothing"; return; }
  for tag in "${tags[@]}"; do
    # Each test runs once, under the first of its tags: "[attention]~[chunks]" leaves out the
    # tests [chunks] ran (most carry two or three tags; [ops] holds 80 of the 140).
    spec="$tag$seen" seen="$seen~$tag"
    n=$("$GT" --list-tests "$spec" 2>/dev/null | sed -n 's/^\([0-9]\+\) matching test case.*/\1/p')
    if [ "${n:-1}" = 0 ]; then row stage=gpu_test tag="$tag" status=covered note="its tests ran under earlier tags"; continue; fi
    if [ "$(left)" -lt 30 ]; then row stage=gpu_test tag="$tag" status=skipped note="time budget"; continue; fi
    out=$OUT/logs/gpu_test-${tag//[^a-z_0-9]/}.txt
    t0=$(date +%s) capped=$(cap 120)
    timeout -k 5 "$capped" "$GT" "$spec" > "$out" 2>&1
    rc=$?
    cat "$out"
    local status
    # Catch exits with the number of failed assertions, so 77 and 124 are codes only with their
    # meaning's evidence: the binary's "no CUDA device" line, the time cap reached.
    case $rc in
      0) status=passed ;;
      77) if grep -q 'skipped: no CUDA device' "$out"; then status=skipped; else status=failed; fi ;;
      124 | 137) if [ $(($(date +%s) - t0)) -ge "$capped" ]; then status=timeout; else status=failed; fi ;;
      *) status=failed ;;
    esac
    # Passing tests print their measurements (workspace sizes, loss differences): keep those;
    # a failure keeps the end of its output.
    local notes
    if [ $rc -eq 0 ]; then notes=$(grep -E '^(cuDNN plan workspace|cuDNN in use|policies )|weights on the host vs kept' "$out"); else notes=$(tail -40 "$out"); fi
    row stage=gpu_test tag="$tag" spec="$spec" tests:="${n:-null}" status="$status" exit_code:="$rc" \
      seconds:="$(($(date +%s) - t0))" output="$notes"
  done
}

# ---- 6. bf16 GEMM peak ----
PEAK_TFLOPS=""
run_gemm() {
  local out peak mlp
  out=$(timeout -k 5 "$(cap 90)" "$GB" 2>&1)
  echo "$out"
  peak=$(echo "$out" | sed -n 's/^bf16 GEMM peak: \([0-9.]*\).*/\1/p')
  mlp=$(echo "$out" | sed -n 's/^bf16 GEMM 3072x32768x768: \([0-9.]*\).*/\1/p')
  if [ -n "$peak" ]; then
    PEAK_TFLOPS=$peak
    row stage=gemm status=ok peak_tflops:="$peak" gpt2_mlp_32k_tflops:="${mlp:-null}" shape="M=N=K=8192, random bf16, GEMM only"
  else
    row stage=gemm status=failed output="$(echo "$out" | tail -20)"
  fi
}

# ---- 7. training runs ----
write_config() {  # name n_layer n_head n_embd
  cat > "$CFG/$1.toml" <<TOML
[model]
kind = "gpt"
n_layer = $2
n_head = $3
n_embd = $4
vocab_size = 50304
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

train_row() {  # model seq policy status exit_code wall_s metrics_file
  "$PY" - "$@" "${PEAK_TFLOPS:-989}" "$([ -n "$PEAK_TFLOPS" ] && echo measured || echo datasheet)" "$(elapsed)" <<'PY'
import json, os, sys
model, seq, policy, status, rc, wall, metrics, peak, basis, t = sys.argv[1:11]
row = {"stage": "train", "model": model, "seq_len": int(seq), "policy": policy, "status": status,
       "exit_code": int(rc), "wall_s": int(wall)}
summary = None
if os.path.exists(metrics):
    for line in open(metrics):
        if '"summary"' in line:
            summary = json.loads(line)["summary"]
if summary:
    flops = summary.get("flops_per_step", {})
    model_flops = sum(v for k, v in flops.items() if k != "recompute")  # MFU counts no recompute
    ms = summary.get("median_step_ms") or 0
    peak_b, pred_b = summary.get("peak_bytes", 0), summary.get("predicted_peak_bytes", 0)
    # tokens/s of the median step: the run's own figure counts step 1 with its start-up (cuDNN
    # plans, first-touch allocations), which in a 3-step run is most of the time.
    tokens = int(seq) * summary.get("batch_size", 1)
    row.update(step_ms=round(ms, 1), tokens_per_s=round(tokens / (ms / 1000)) if ms > 0 else 0,
               peak_bytes=peak_b, predicted_peak_bytes=pred_b, peak_agrees=peak_b == pred_b,
               peak_gib=round(peak_b / 2**30, 2), predicted_peak_gib=round(pred_b / 2**30, 2),
               flops_per_step=sum(flops.values()), recompute_flops=flops.get("recompute", 0))
    if summary.get("predicted_host_peak_bytes"):
        host_b, host_pred = summary.get("host_peak_bytes", 0), summary["predicted_host_peak_bytes"]
        row.update(host_peak_bytes=host_b, predicted_host_peak_bytes=host_pred,
                   host_peak_agrees=host_b == host_pred)
    if ms > 0:
        tflops = model_flops / (ms / 1000) / 1e12
        row.update(model_tflops=round(tflops, 1), mfu=round(tflops / float(peak), 3), mfu_basis=basis)
row["t_s"] = int(t)
print(json.dumps(row))
PY
}

train_one() {  # model seq policy [extra --set ...]: one run, one row
  local model=$1 seq=$2 policy=$3 rc status t0
  shift 3
  local m=$OUT/logs/train-$model-$seq-$policy.jsonl
  if [ "$(left)" -lt 20 ]; then
    row stage=train model="$model" seq_len:="$seq" policy="$policy" status=skipped note="time budget"
    return
  fi
  say "train $model seq_len=$seq policy=$policy"
  t0=$(date +%s)
  timeout -k 5 "$(cap 90)" "$RT" --config "$CFG/$model.toml" --set train.seq_len="$seq" \
    --set remat.policy="$policy" --metrics "$m" -q "$@"
  rc=$?
  case $rc in 0) status=ok ;; 3) status=OOM ;; 124 | 137) status=timeout ;; *) status=failed ;; esac
  emit "$(train_row "$model" "$seq" "$policy" "$status" "$rc" "$(($(date +%s) - t0))" "$m")"
}

train_model() {  # model: 4k and 32k under each policy
  local seq policy
  for seq in 4096 32768; do
    for policy in ${POLICIES:-none save_attn save_dots full}; do train_one "$1" "$seq" "$policy"; done
  done
}

# ---- 7b. offload: the same 32k full run with checkpoints and moments (then weights and gradients
# too, AdamW on the host) in pinned host memory; $1 is remat.offload ----
run_offload() {
  local kind=$1 m rc t0 status
  m=$OUT/logs/train-gpt2-124m-32768-full-offload-${kind//+/-}.jsonl
  if [ "$(left)" -lt 30 ]; then row stage=offload offload="$kind" status=skipped note="time budget"; return; fi
  say "train gpt2-124m seq_len=32768 policy=full tile_tokens=4096 offload=$kind"
  t0=$(date +%s)
  timeout -k 5 "$(cap 90)" "$RT" --config "$CFG/gpt2-124m.toml" --set train.seq_len=32768 \
    --set remat.policy=full --set remat.tile_tokens=4096 \
    --set remat.offload="$kind" --metrics "$m" -q
  rc=$?
  case $rc in 0) status=ok ;; 3) status=OOM ;; 124 | 137) status=timeout ;; *) status=failed ;; esac
  local r
  r=$(train_row gpt2-124m 32768 full "$status" "$rc" "$(($(date +%s) - t0))" "$m")
  emit "$("$PY" - "$r" "$OUT/logs/train-gpt2-124m-32768-full.jsonl" "$kind" <<'PY'
import json, os, sys
r = json.loads(sys.argv[1])
r.update(stage="offload", offload=sys.argv[3], tile_tokens=4096)
if os.path.exists(sys.argv[2]):  # the run that keeps everything on the card, for the step time
    for line in open(sys.argv[2]):
        if '"summary"' in line:
            r["kept_step_ms"] = json.loads(line)["summary"].get("median_step_ms")
if r["status"] == "ok" and not (r.get("peak_agrees") and r.get("host_peak_agrees")):
    r["status"] = "disagrees"
print(json.dumps(r))
PY
)"
}

# ---- 8. fit --measure at a small budget: predicted maximum fits, one token more does not ----
run_fit() {
  local mem=${FIT_MEMORY:-6GiB} out=$OUT/logs/fit.json rc
  if [ "$(left)" -lt 60 ]; then row stage=fit status=skipped note="time budget"; return; fi
  say "fit --measure: gpt2-124m, full, pool budget $mem"
  timeout -k 5 "$(cap 150)" "$RT" fit --config "$CFG/gpt2-124m.toml" --memory "$mem" \
    --policies full --measure --json > "$out"
  rc=$?
  cat "$out"
  emit "$("$PY" - "$out" "$rc" "$mem" "$(elapsed)" <<'PY'
import json, sys
path, rc, mem, t = sys.argv[1:5]
row = {"stage": "fit", "memory": mem, "exit_code": int(rc),
       "status": {0: "agrees", 1: "disagrees", 124: "timeout", 137: "timeout"}.get(int(rc), "failed")}
try:
    p = json.load(open(path))["policies"][0]
    m = p.get("measured", {})
    row.update(longest_seq_len=p["longest_seq_len"], predicted_peak_bytes=p["predicted_peak_bytes"],
               measured_peak_bytes=m.get("measured_peak_bytes"), exit_at_longest=m.get("exit_at_longest"),
               exit_above_longest=m.get("exit_above_longest"),
               peak_agrees=m.get("measured_peak_bytes") == p["predicted_peak_bytes"])
except (OSError, ValueError, KeyError, IndexError) as e:
    row["note"] = f"no fit JSON: {e}"
    if row["status"] == "agrees":
        row["status"] = "failed"
row["t_s"] = int(t)
print(json.dumps(row))
PY
)"
}

# ---- 9. the longest context for the whole card: one real step, if it can finish in time ----
plan_field() {  # budget_mib seq_len jq-like python expression on the plan JSON
  "$RT" plan --config "$CFG/gpt2-124m.toml" --memory "$1MiB" --seq-len "$2" --json 2>/dev/null |
    "$PY" -c "import json,sys; j=json.load(sys.stdin); p=next(p for p in j['policies'] if p['policy']=='full'); print($3)"
}
step_seconds() {  # reference metrics file, FLOPs of a step: that step's seconds at the reference's rate
  "$PY" - "$1" "$2" <<'PY' 2>/dev/null
import json, sys
s = next(json.loads(l)["summary"] for l in open(sys.argv[1]) if '"summary"' in l)
print(round(s["median_step_ms"] / 1000 * float(sys.argv[2]) / sum(s["flops_per_step"].values())))
PY
}
# The card's planned maximum for 124M `full` (budget: the free memory less 1 GiB) and the 32k
# `full` run that stages 9 and 9b scale step times from; planned once for both.
CARD_BUDGET_MIB=0 CARD_LONGEST="" REF_32K=""
plan_card() {
  CARD_BUDGET_MIB=$((GPU_FREE_MIB - 1024))
  CARD_LONGEST=$(plan_field "$CARD_BUDGET_MIB" 32768 "p['longest_seq_len']")
  REF_32K=$OUT/logs/train-gpt2-124m-32768-full.jsonl
}
# cuDNN indexes (B, T, 3C) with 32-bit offsets in places: past 2^31 elements a step may fail.
int32_note() {  # seq_len: a note when 124M's (T, 3C) qkv passes 2^31 elements, else nothing
  local elems=$(($1 * 3 * 768))
  if [ "$elems" -ge $((1 << 31)) ]; then echo "T x 3C = $elems elements, past 2^31"; fi
}
run_longest() {
  local budget=$CARD_BUDGET_MIB ref=$REF_32K longest=$CARD_LONGEST est
  if [ -z "$longest" ] || [ ! -f "$ref" ]; then
    row stage=longest status=skipped note="no plan or no 32k reference run" budget_mib:="$budget"
    return
  fi
  # Step time at the maximum: the measured 32k step scaled by the planner's FLOPs (attention
  # grows with T^2, so this is close); plus ~20 s of start-up (weights, cuDNN plans).
  est=$(step_seconds "$ref" "$(plan_field "$budget" "$longest" "sum(p['flops'].values())")")
  [ -z "$est" ] || est=$((est + 20))
  local note
  note=$(int32_note "$longest")
  if [ -z "$est" ] || [ "$est" -gt "$(($(left) - 10))" ]; then
    row stage=longest status=skipped model=gpt2-124m policy=full seq_len:="$longest" \
      budget_mib:="$budget" est_seconds:="${est:-null}" seconds_left:="$(left)" \
      note="estimated step time exceeds the time left${note:+; $note}"
    return
  fi
  local m=$OUT/logs/train-longest.jsonl rc t0
  t0=$(date +%s)
  timeout -k 5 "$(cap $((est + 30)))" "$RT" --config "$CFG/gpt2-124m.toml" --set train.seq_len="$longest" \
    --set remat.policy=full --set train.steps=1 --set device.memory="${budget}MiB" --metrics "$m" -q
  rc=$?
  local status
  # Out of memory at the planner's own maximum means the plan is wrong: a failure, not a verdict.
  case $rc in 0) status=ok ;; 124 | 137) status=timeout ;; *) status=failed ;; esac
  local r
  r=$(train_row gpt2-124m "$longest" full "$status" "$rc" "$(($(date +%s) - t0))" "$m")
  emit "$("$PY" -c 'import json,sys; r=json.loads(sys.argv[1]); r.update(stage="longest", budget_mib=int(sys.argv[2]), est_seconds=int(sys.argv[3]), note=sys.argv[4]); print(json.dumps(r))' \
    "$r" "$budget" "$est" "$note")"
}

# ---- 9b. a long context that finishes in time: cuDNN past 32k, and the rate plan's estimate uses --
# The longest T (doubling from 64k, up to the card's maximum) whose two steps fit LONG_STEP_S by
# the 32k step scaled with the planner's FLOPs; two steps, so that the second one's time (without
# cuDNN's plan building) gives the executed and model TFLOP/s at that length: the number that
# `plan` and `fit` estimate as 989 TFLOP/s x 0.4 (cmd/fit_command.cpp).
run_long() {
  local budget=$CARD_BUDGET_MIB ref=$REF_32K longest=$CARD_LONGEST
  local target T=65536 pick="" est="" e
  target=${LONG_STEP_S:-90}
  if [ "$(($(left) - 60))" -lt "$target" ]; then target=$(($(left) - 60)); fi
  if [ ! -f "$ref" ] || [ -z "$longest" ] || [ "$target" -lt 20 ]; then
    row stage=long status=skipped note="no 32k full run, no plan, or under 20 s left for it" \
      seconds_for_it:="$target"
    return
  fi
  while [ "$T" -le "$longest" ]; do
    e=$(step_seconds "$ref" "$(plan_field "$budget" "$T" "sum(p['flops'].values())")")
    if [ -z "$e" ] || [ $((2 * e + 20)) -gt "$target" ]; then break; fi
    pick=$T est=$e
    T=$((T * 2))
  done
  if [ -z "$pick" ]; then
    row stage=long status=skipped note="64k tokens would not finish in $target s" seconds_for_it:="$target"
    return
  fi
  say "train gpt2-124m seq_len=$pick policy=full, 2 steps (estimated $est s each)"
  local m=$OUT/logs/train-long.jsonl rc t0 status note
  note=$(int32_note "$pick")
  t0=$(date +%s)
  timeout -k 5 "$(cap $((2 * est + 60)))" "$RT" --config "$CFG/gpt2-124m.toml" --set train.seq_len="$pick" \
    --set remat.policy=full --set train.steps=2 --set device.memory="${budget}MiB" --metrics "$m" -q
  rc=$?
  # Below the planner's maximum for this budget, out of memory is a wrong plan: a failure.
  case $rc in 0) status=ok ;; 124 | 137) status=timeout ;; *) status=failed ;; esac
  emit "$("$PY" - "$(train_row gpt2-124m "$pick" full "$status" "$rc" "$(($(date +%s) - t0))" "$m")" \
    "$m" "$est" "${PEAK_TFLOPS:-989}" "$budget" "$note" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
r.update(stage="long", est_step_seconds=int(sys.argv[3]), budget_mib=int(sys.argv[5]))
if sys.argv[6]:
    r["note"] = sys.argv[6]
steps = [json.loads(l) for l in open(sys.argv[2]) if '"step_ms"' in l and '"summary"' not in l] if r["status"] == "ok" else []
if len(steps) >= 2 and r.get("flops_per_step"):
    ms = steps[-1]["step_ms"]  # the second step: cuDNN's plans are built by then
    executed = r["flops_per_step"] / (ms / 1000) / 1e12
    model = (r["flops_per_step"] - r["recompute_flops"]) / (ms / 1000) / 1e12
    r.update(second_step_ms=round(ms, 1), executed_tflops=round(executed, 1),
             model_tflops=round(model, 1), mfu=round(model / float(sys.argv[4]), 3),
             efficiency_vs_989=round(executed / 989.4, 3))  # plan's h200 rate: 989.4 TFLOP/s
print(json.dumps(r))
PY
)"
}

# ---- 10. compute-sanitizer over the gpu tests ----
# memcheck: out-of-bounds and misaligned accesses in every kernel the tests launch (ours, cuBLASLt's,
# cuDNN's, NCCL's). Without API error reports: NCCL 2.28 probes kernels that its wheel does not
# build for this GPU (cudaFuncGetAttributes, then clears the error), 24 reports on an H200 with no
# memory error behind them; our own code checks every API return itself. racecheck: shared-memory
# hazards in our kernels that tile through shared memory (LayerNorm, the LM head, the reductions,
# then ring attention, whose larger cases take ~10-25 s each under it); cuDNN's would take too long.
# A run that reaches its time cap with no error reported is "partial": how far it got is in
# test_cases, and only an error or a failed test is a failure.
find_sanitizer() {
  local c
  for c in "$(command -v compute-sanitizer)" "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" \
    /usr/local/cuda*/bin/compute-sanitizer /opt/nvidia/*/compute-sanitizer/compute-sanitizer; do
    [ -x "$c" ] && { echo "$c"; return; }
  done
}
run_sanitizer() {  # name seconds filter [compute-sanitizer options...]
  local name=$1 seconds=$2 filter=$3 out=$OUT/logs/sanitizer-$1.txt rc t0 status sanitizer capped
  shift 3
  if [ "${SANITIZE:-1}" = 0 ]; then
    row stage=sanitizer name="$name" status=skipped note="SANITIZE=0"
    return
  fi
  sanitizer=$(find_sanitizer)
  if [ -z "$sanitizer" ]; then
    row stage=sanitizer name="$name" status=skipped note="no compute-sanitizer on this machine"
    return
  fi
  if [ "$(left)" -lt 40 ]; then row stage=sanitizer name="$name" status=skipped note="time budget"; return; fi
  say "compute-sanitizer $* on $filter"
  t0=$(date +%s) capped=$(cap "$seconds")
  # -d yes: each finished test case is logged with its time, so a timeout shows how far it got.
  timeout -k 5 "$capped" "$sanitizer" "$@" --error-exitcode 99 --print-limit 20 \
    "$GT" "$filter" -d yes > "$out" 2>&1
  rc=$?
  # 99: the sanitizer found errors; other non-zero codes are failed test assertions. Stopped at
  # the cap it is "partial" if no sanitizer error came first and the one FAILED Catch printed is
  # the SIGTERM that stopped it ("due to a fatal error condition").
  local timed_out=no errors failed sigterm
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    [ $(($(date +%s) - t0)) -lt "$capped" ] || timed_out=yes
  fi
  errors=$(grep '^========= [A-Z]' "$out" | grep -cvE 'COMPUTE-SANITIZER|SUMMARY:')  # error headlines
  failed=$(grep -c 'FAILED:' "$out")
  sigterm=$(grep -c 'SIGTERM - Termination request signal' "$out")
  if [ "$rc" = 0 ]; then
    status=clean
  elif [ "$timed_out" = yes ] && [ "$errors" = 0 ] && [ "$failed" = "$sigterm" ] && [ "$failed" -le 1 ]; then
    status=partial
  else
    status=failed
  fi
  row stage=sanitizer name="$name" options="$*" filter="$filter" status="$status" exit_code:="$rc" \
    seconds:="$(($(date +%s) - t0))" error_summary="$(grep -m1 '^========= [A-Z]* SUMMARY:' "$out")" \
    test_cases:="$(grep -c '^[0-9.]* s: ' "$out")" \
    output="$(if [ "$status" != clean ]; then grep -v '^[0-9.]* s: ' "$out" | tail -40; fi)"
}

# ---- 7b. attention over chunks ----
# GPT-2 124M at 32k under full in chunks of 8192 tokens (remat.attention_chunk: 4 chunks, 10 cuDNN
# calls per attention op): its row beside the unchunked gpt2-124m 32768 full row gives the
# schedule's cost in step_ms, and peak_agrees checks its workspace rule on the card. The op's
# parity rows run as gpu_test tag [chunks].
run_chunked() {
  sed 's/^\[remat\]$/[remat]\nattention_chunk = 8192/' "$CFG/gpt2-124m.toml" > "$CFG/gpt2-124m-chunked.toml"
  train_one gpt2-124m-chunked 32768 full
}

# logs/ and configs/ leave as one archive beside the three result files: fewer files to copy back.
pack_logs() {
  tar czf "$OUT/logs.tar.gz" -C "$OUT" logs configs 2>/dev/null && rm -rf "$OUT/logs" "$OUT/configs"
}

# ---- the check ----
row stage=start status=ok host="$(uname -n)" out="$OUT" budget_s:="$BUDGET_S"
locate_binaries || { summary failed; exit 1; }
setup_libraries || say "libraries missing (row above): the runs below will say what fails"
check_versions || { summary failed; exit 1; }
plan_smoke
if ! detect_gpu; then
  summary "$(tail -1 "$ROWS" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["status"])')"
  exit 0
fi
write_config gpt2-124m 12 12 768
write_config gpt2-350m 24 16 1024
run_gpu_tests
run_gemm
train_model gpt2-124m
run_chunked
run_offload checkpoints+optimizer
run_offload checkpoints+optimizer+weights
run_fit
train_model gpt2-350m
plan_card
run_longest
run_long
run_sanitizer memcheck 180 "[gpu]" --tool memcheck --report-api-errors no
run_sanitizer racecheck 60 "[layernorm],[lm_head],[optimizer],[pointwise],[embedding],[linear]" --tool racecheck
run_sanitizer racecheck-ring 120 "[ring]" --tool racecheck
summary auto
! grep -qE '"status": "(failed|timeout|missing|disagrees)"' "$ROWS"
