#!/usr/bin/env bash
# remat-train against PyTorch on one GPU (issue 47 item 5): the same models, lengths and remat
# policies, each row's tools run one after the other in an order that alternates from row to row,
# and the longest context of each under the same memory cap. For the GPU machine this project
# borrows (no compiler, no network): it runs the `make bundle` binaries (scripts/device-bundle.sh)
# and the machine's own PyTorch, and builds nothing.
#
# Send along: the working tree plus device-bundle/ (make bundle). Run, from the repository root:
#     OUT=/some/folder bash scripts/device-vs-torch.sh
# and bring back $OUT: device-vs-torch.rows.jsonl (one JSON object per result, appended as it is
# measured, so a run stopped by a time limit keeps everything done so far), device-vs-torch.log
# (everything printed) and logs.tar.gz (every run's own output). Commit the rows file under
# docs/device-runs/ (its README names the files).
#
# Rows (each has "stage", "status" and "t_s", seconds since the start), most valuable first:
#   start, binaries, gpu (no_gpu ends the run, exit 0), then
#   speed: one row per tool (remat-train = `bench --json`; torch-eager, torch-compile =
#     scripts/torch_reference.py [--compile]) for GPT-2 124M, then 350M, at 32k and 4k tokens,
#     batch 1, bf16, random tokens, under none, full and save_attn: the median of STEPS timed
#     steps after one warm-up (step_ms, tokens_per_s, model_tflops: each tool's own MFU count),
#     remat-train's predicted peak (plan --json: equal to the measured pool peak on an H200) and
#     PyTorch's torch.cuda.max_memory_allocated, remat-train's op families (bench on a GPU times
#     the ops with a sync after each, so its own step is slower: untimed_step_ms is the step
#     without them, and the row's step_ms). The tools of a row run back to back and the first
#     of them changes from one row to the next (remat-train, eager; eager, remat-train; ...), so
#     that a drift of the machine does not favour one tool; the torch.compile rows (a minute or
#     more of compiling each) come after the eager rows of a model, each with a remat-train run;
#   longest: the longest context of 124M (then 350M) under CAP (40GiB) with none, then full:
#     remat-train's `fit --memory CAP` answer confirmed by one real step under device.memory =
#     CAP; PyTorch's by real steps (torch_reference.py --longest: doubling from 32k, then a
#     binary search to LONGEST_GRAIN tokens, torch.cuda.set_per_process_memory_fraction(CAP)),
#     stopped after LONGEST_S seconds (then time_limited: the longest that ran so far);
#   speed for Llama-3.2-1B at 4k and 32k under full (if the budget allows);
#   (right after 124M's first speed rows) rows with a "variant" (REMAT_SETS, --set overrides of
#     remat-train's run): 124M under none at 32k and 4k with the LM head's former 192-row chunk,
#     beside the rows that ran the chunk sized to the budget (their "loss_chunk");
#   summary.
# Time: no new work after BUDGET_S (480) seconds and every run capped with `timeout`, so the
# whole run stays under 9 minutes with its start-up.
#   env: OUT (default a new temp folder), BUNDLE (device-bundle), BUDGET_S, STEPS (8),
#        POLICIES ("none full save_attn"), CAP (40GiB), LONGEST_S (90), LONGEST_GRAIN (8192),
#        TORCH_PYTHON (python3: the machine's PyTorch), COMPILE=0 (no torch.compile rows),
#        DRY_RUN=1 (no GPU: the same rows on the CPU at a tiny size, to test the plumbing; the
#        binary is REMAT_BIN, default build/remat-train), PACK_LOGS=0 (leave logs/ unpacked).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
START=$(date +%s)
BUDGET_S=${BUDGET_S:-480}
STEPS=${STEPS:-$([ "${DRY_RUN:-0}" = 1 ] && echo 2 || echo 8)}
CAP=${CAP:-40GiB}
DRY=${DRY_RUN:-0}
OUT=${OUT:-$(mktemp -d)}
if [ "$(cd "$OUT" 2>/dev/null && pwd -P)" = "$(pwd -P)" ]; then
  echo "[device-vs-torch] OUT is the repository root; give it a folder of its own" >&2
  exit 2
fi
mkdir -p "$OUT/logs"
LOG=$OUT/device-vs-torch.log
ROWS=$OUT/device-vs-torch.rows.jsonl
: > "$ROWS"
PY=$(command -v python3 || command -v python) || { echo "[device-vs-torch] needs python3 (JSON rows)" >&2; exit 1; }
TPY=${TORCH_PYTHON:-python3}

exec 3>&1 4>&2
exec > >(tee "$LOG") 2>&1
TEE_PID=$!
finish() {
  local rc=$?
  if [ "${PACK_LOGS:-1}" = 1 ]; then
    tar czf "$OUT/logs.tar.gz" -C "$OUT" logs 2>/dev/null && rm -rf "$OUT/logs"
  fi
  exec 1>&3 2>&4 3>&- 4>&-
  wait "$TEE_PID" 2>/dev/null || while kill -0 "$TEE_PID" 2>/dev/null; do sleep 0.1; done
  exit "$rc"
}
trap finish EXIT

# ---- time and rows (scripts/device-check.sh's conventions) ----
DEVICE_SCRIPT=device-vs-torch
# elapsed, left, say, cap, emit and row
. scripts/device-rows.sh
status_of() {  # exit code -> status
  case $1 in 0) echo ok ;; 3) echo OOM ;; 124 | 137) echo timeout ;; *) echo failed ;; esac
}

# ---- the models: configs and, in a dry run, a tiny size of the same kind ----
config_of() {
  case $1 in
    gpt2-124m) echo configs/gpt2-124m.toml ;;
    gpt2-350m) echo configs/gpt2-350m.toml ;;
    llama-3.2-1b) echo configs/llama-3.2-1b.toml ;;
  esac
}
SIZE_SETS=() DEVICE=cuda
if [ "$DRY" = 1 ]; then
  DEVICE=cpu
  SIZE_SETS=(--set model.n_layer=2 --set model.n_embd=64 --set model.n_head=4 --set model.vocab_size=256)
fi
model_sets() {  # model: the --set overrides every tool gets
  local sets=("${SIZE_SETS[@]}")
  if [ "$DRY" = 1 ] && [ "$1" = llama-3.2-1b ]; then
    sets+=(--set model.n_kv_head=2 --set model.head_dim=16 --set model.d_ff=128)
  fi
  sets+=(--set train.batch_size=1 --set data.task=random --set device.backend="$DEVICE")
  printf '%s\n' "${sets[@]}"
}
seq_of() {  # the length a row names -> the length it runs (a dry run: 4096 -> 64, 32768 -> 128)
  if [ "$DRY" = 1 ]; then echo $(($1 / 64 > 128 ? 128 : $1 / 64)); else echo "$1"; fi
}

# ---- binaries, libraries, the GPU ----
locate() {
  local bundle=${BUNDLE:-device-bundle}
  if [ "$DRY" != 1 ] && [ -x "$bundle/remat-train" ]; then
    RT=$bundle/remat-train
    local lib dirs
    lib="$(cd "$bundle" && pwd)/lib"
    # The CUDA libraries: the bundle's, then the wheels of the PyTorch this compares with.
    dirs=$("$TPY" - <<'PY' 2>/dev/null
import glob, os, site
roots = list(site.getsitepackages()) + [site.getusersitepackages()]
print(":".join(d for r in roots for d in sorted(glob.glob(os.path.join(r, "nvidia", "*", "lib")))))
PY
)
    export LD_LIBRARY_PATH="$lib${dirs:+:$dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  else
    RT=${REMAT_BIN:-build/remat-train}
  fi
  if ! "$RT" --version > "$OUT/logs/version.txt" 2>&1; then
    row stage=binaries status=failed remat_train="$RT" output="$(tail -5 "$OUT/logs/version.txt")" \
      note="no runnable remat-train: make bundle and send device-bundle along"
    return 1
  fi
  local torch
  if ! torch=$("$TPY" -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>&1); then
    row stage=binaries status=failed torch_python="$TPY" output="$torch" \
      note="this python has no PyTorch: set TORCH_PYTHON"
    return 1
  fi
  row stage=binaries status=ok remat_train="$RT" version="$(head -3 "$OUT/logs/version.txt" | paste -sd';')" \
    torch_python="$TPY" torch="$torch" dry_run:="$([ "$DRY" = 1 ] && echo true || echo false)"
}
detect_gpu() {
  local q
  q=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader,nounits 2>/dev/null | head -1)
  if [ "$DRY" = 1 ]; then
    row stage=gpu status=dry_run nvidia_smi="$q" note="DRY_RUN=1: tiny models on the CPU"
    return 0
  fi
  if [ -z "$q" ]; then
    row stage=gpu status=no_gpu note="nvidia-smi found no GPU"
    return 1
  fi
  local name total driver
  IFS=, read -r name total driver <<< "$q"
  row stage=gpu status=ok name="$name" memory_total_mib:="${total// /}" driver="${driver// /}"
}

# ---- speed rows ----
speed_remat() {  # model seq policy order; REMAT_SETS="key=value ...": a variant of the row
  local model=$1 seq=$2 policy=$3 order=$4 log rc t0 sets plan kv
  log=$OUT/logs/remat-$model-$seq-$policy-$order${REMAT_SETS:+-${REMAT_SETS// /_}}
  mapfile -t sets < <(model_sets "$model")
  sets+=(--set train.seq_len="$(seq_of "$seq")" --set remat.policy="$policy" --set checkpoint.dir=)
  for kv in ${REMAT_SETS:-}; do sets+=(--set "$kv"); done
  t0=$(date +%s)
  timeout -k 5 "$(cap 120)" "$RT" bench --config "$(config_of "$model")" "${sets[@]}" --steps "$STEPS" \
    --json > "$log.json" 2> "$log.err"
  rc=$?
  plan=$(timeout -k 5 "$(cap 30)" "$RT" plan --config "$(config_of "$model")" "${sets[@]}" --json 2>/dev/null)
  emit "$("$PY" - "$model" "$seq" "$policy" "$order" "$(status_of $rc)" "$rc" "$(($(date +%s) - t0))" \
    "$log" "$plan" "$(elapsed)" "${REMAT_SETS:-}" <<'PY'
import json, sys
model, seq, policy, order, status, rc, wall, log, plan, t, variant = sys.argv[1:12]
row = {"stage": "speed", "tool": "remat-train", "model": model, "seq_len": int(seq),
       "policy": policy, "order": int(order), "status": status, "exit_code": int(rc),
       "wall_s": int(wall)}
if variant:
    row["variant"] = variant
try:
    j = json.load(open(log + ".json"))
    step = j.get("untimed_step_ms") or j["step_ms"]
    row.update(ran_seq_len=j["seq_len"], step_ms=round(step, 2),
               op_timed_step_ms=round(j["step_ms"], 2),
               tokens_per_s=round(j["batch_size"] * j["seq_len"] / (step / 1e3)),
               model_tflops=round(j["model_gflop"] / step, 2), timed_steps=len(j["steps"]),
               device=j["device"], loss_chunk=j.get("loss_chunk"),
               op_ms={r["key"]: round(r["ms"], 2) for r in j["op_families"]})
except (OSError, ValueError, KeyError, TypeError) as e:
    if status == "ok":
        row["status"] = "failed"
    row["note"] = f"no bench JSON ({e}): " + " | ".join(open(log + ".err").read().splitlines()[-3:])
try:
    row["predicted_peak_bytes"] = json.loads(plan)["policies"][-1]["peak_bytes"]
except (ValueError, KeyError, IndexError):
    pass
row["t_s"] = int(t)
print(json.dumps(row))
PY
)" speed
}
speed_torch() {  # model seq policy order eager|compile
  local model=$1 seq=$2 policy=$3 order=$4 kind=$5 log rc t0 sets extra=()
  log=$OUT/logs/torch-$kind-$model-$seq-$policy-$order
  mapfile -t sets < <(model_sets "$model")
  sets+=(--set train.seq_len="$(seq_of "$seq")")
  [ "$kind" = compile ] && extra=(--compile)
  t0=$(date +%s)
  # STEPS + 1 steps, the first untimed (and, compiled, the one that compiles).
  timeout -k 5 "$(cap 240)" "$TPY" scripts/torch_reference.py --config "$(config_of "$model")" \
    "${sets[@]}" --policy "$policy" --device "$DEVICE" --dtype bf16 --steps $((STEPS + 1)) \
    --warmup 1 "${extra[@]}" --json > "$log.json" 2> "$log.err"
  rc=$?
  emit "$("$PY" - "$model" "$seq" "$policy" "$order" "$kind" "$(status_of $rc)" "$rc" \
    "$(($(date +%s) - t0))" "$log" "$(elapsed)" <<'PY'
import json, sys
model, seq, policy, order, kind, status, rc, wall, log, t = sys.argv[1:11]
row = {"stage": "speed", "tool": f"torch-{kind}", "model": model, "seq_len": int(seq),
       "policy": policy, "order": int(order), "status": status, "exit_code": int(rc),
       "wall_s": int(wall)}
err = open(log + ".err").read()
if "out of memory" in err.lower():
    row["status"] = "OOM"
try:
    j = json.load(open(log + ".json"))
    row.update(ran_seq_len=j["seq_len"], step_ms=round(j["median_step_ms"], 2),
               tokens_per_s=round(j["tokens_per_s"]),
               model_tflops=round(j["model_tflops"], 2), timed_steps=j["timed_steps"],
               peak_bytes=j["peak_bytes"], peak_kind=j["peak_kind"], torch=j["torch"],
               attention=j["attention"], optimizer=j["optimizer"],
               first_step_ms=round(j["steps"][0]["ms"], 1))
except (OSError, ValueError, KeyError, IndexError) as e:
    if row["status"] == "ok":
        row["status"] = "failed"
    row["note"] = f"no JSON ({e}): " + " | ".join(err.splitlines()[-3:])
row["t_s"] = int(t)
print(json.dumps(row))
PY
)" speed
}
ROW_N=0
speed_row() {  # model seq policy: each of $TOOLS once, the first one rotating from row to row
  local model=$1 seq=$2 policy=$3 tools i n
  read -ra tools <<< "${TOOLS:-remat eager}"
  n=${#tools[@]}
  for ((i = 0; i < n; i++)); do
    local tool=${tools[$(((ROW_N + i) % n))]}
    if [ "$(left)" -lt 15 ]; then
      row stage=speed tool="$tool" model="$model" seq_len:="$seq" policy="$policy" status=skipped note="time budget"
      continue
    fi
    say "speed $model seq_len=$seq policy=$policy: $tool"
    case $tool in
      remat) speed_remat "$model" "$seq" "$policy" "$i" ;;
      *) speed_torch "$model" "$seq" "$policy" "$i" "$tool" ;;
    esac
  done
  ROW_N=$((ROW_N + 1))
}
speed_model() {  # model seq...: every policy at each length
  local model=$1 seq policy
  shift
  for seq in "$@"; do
    for policy in ${POLICIES:-none full save_attn}; do speed_row "$model" "$seq" "$policy"; done
  done
}

# ---- the longest context under CAP ----
longest_remat() {  # model policy
  local model=$1 policy=$2 log=$OUT/logs/longest-remat-$1-$2 sets rc T t0 status
  mapfile -t sets < <(model_sets "$model")
  sets+=(--set checkpoint.dir=)
  local cap_mem=$CAP
  [ "$DRY" = 1 ] && cap_mem=16MiB
  timeout -k 5 "$(cap 60)" "$RT" fit --config "$(config_of "$model")" "${sets[@]}" --memory "$cap_mem" \
    --policies "$policy" --json > "$log.fit.json" 2> "$log.fit.err"
  rc=$?
  T=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["policies"][0]["longest_seq_len"] or "")' \
    "$log.fit.json" 2>/dev/null)
  if [ $rc -ne 0 ] || [ -z "$T" ]; then
    row stage=longest tool=remat-train model="$model" policy="$policy" cap="$cap_mem" status=failed \
      exit_code:="$rc" note="fit gave no answer: $(tail -2 "$log.fit.err" | paste -sd' ')"
    return
  fi
  # The planner's answer, confirmed by one real step in the same budget.
  t0=$(date +%s)
  timeout -k 5 "$(cap 150)" "$RT" --config "$(config_of "$model")" "${sets[@]}" --set train.seq_len="$T" \
    --set remat.policy="$policy" --set train.steps=1 --set device.memory="$cap_mem" \
    --metrics "$log.train.jsonl" -q > "$log.train.out" 2>&1
  rc=$?
  status=$(status_of $rc)
  emit "$("$PY" - "$model" "$policy" "$cap_mem" "$T" "$status" "$rc" "$(($(date +%s) - t0))" "$log" \
    "$(elapsed)" <<'PY'
import json, sys
model, policy, cap, T, status, rc, wall, log, t = sys.argv[1:10]
row = {"stage": "longest", "tool": "remat-train", "model": model, "policy": policy, "cap": cap,
       "longest_seq_len": int(T), "status": {"ok": "confirmed"}.get(status, status),
       "exit_code": int(rc), "step_wall_s": int(wall), "how": "fit --memory CAP, then one train step there"}
p = json.load(open(log + ".fit.json"))["policies"][0]
row["predicted_peak_bytes"] = p.get("predicted_peak_bytes") or p.get("peak_bytes")
try:
    s = next(json.loads(l)["summary"] for l in open(log + ".train.jsonl") if '"summary"' in l)
    row.update(step_ms=round(s["median_step_ms"], 1), peak_bytes=s.get("peak_bytes"),
               peak_agrees=s.get("peak_bytes") == s.get("predicted_peak_bytes"))
except (OSError, StopIteration, ValueError, KeyError):
    pass
row["t_s"] = int(t)
print(json.dumps(row))
PY
)" longest
}
longest_torch() {  # model policy
  local model=$1 policy=$2 log=$OUT/logs/longest-torch-$1-$2 sets rc t0
  if [ "$DEVICE" != cuda ]; then
    row stage=longest tool=torch-eager model="$model" policy="$policy" status=skipped \
      note="dry run: the search runs out of CUDA memory, which a CPU has not"
    return
  fi
  mapfile -t sets < <(model_sets "$model")
  local limit=${LONGEST_S:-90}
  [ "$(($(left) - 30))" -lt "$limit" ] && limit=$(($(left) - 30))
  t0=$(date +%s)
  # A probe started at the limit may still take a while: the cap leaves it room.
  timeout -k 5 "$(cap $((limit + 90)))" "$TPY" scripts/torch_reference.py --config "$(config_of "$model")" \
    "${sets[@]}" --set train.seq_len=32768 --policy "$policy" --device cuda --dtype bf16 --longest \
    --cap "$CAP" --granularity "${LONGEST_GRAIN:-8192}" --time-limit "$limit" --json \
    > "$log.json" 2> "$log.err"
  rc=$?
  emit "$("$PY" - "$model" "$policy" "$CAP" "$(status_of $rc)" "$rc" "$(($(date +%s) - t0))" "$log" \
    "$limit" "$(elapsed)" <<'PY'
import json, re, sys
model, policy, cap, status, rc, wall, log, limit, t = sys.argv[1:10]
row = {"stage": "longest", "tool": "torch-eager", "model": model, "policy": policy, "cap": cap,
       "status": status, "exit_code": int(rc), "wall_s": int(wall), "time_limit_s": int(limit),
       "how": "real steps under torch.cuda.set_per_process_memory_fraction(CAP): doubling from 32k, then binary search"}
try:
    j = json.load(open(log + ".json"))
    row.update(longest_seq_len=j["longest_seq_len"], peak_bytes=j["peak_bytes"],
               step_ms=j["step_ms"] and round(j["step_ms"], 1), oom_at=j["oom_at"],
               time_limited=j.get("time_limited"), probes=j.get("probes"))
except (OSError, ValueError, KeyError):
    # Stopped by the cap: the probe lines it printed still say what ran.
    ran = [int(m) for m in re.findall(r"seq_len +(\d+): ran", open(log + ".err").read())]
    row.update(longest_seq_len=max(ran) if ran else None, time_limited=True,
               note="no JSON (stopped by its time cap): the longest probe that ran")
row["t_s"] = int(t)
print(json.dumps(row))
PY
)" longest
}
longest() {  # model policy
  if [ "$(left)" -lt 60 ]; then
    row stage=longest model="$1" policy="$2" status=skipped note="time budget"
    return
  fi
  say "longest $1 policy=$2 under $CAP"
  longest_remat "$1" "$2"
  longest_torch "$1" "$2"
}

summary() {
  "$PY" - "$ROWS" "$(elapsed)" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
speed = [r for r in rows if r["stage"] == "speed"]
table = {}
for r in speed:
    table.setdefault((r["model"], r["seq_len"], r["policy"]), {})[r["tool"]] = r
print(f"{'model':<13} {'seq':>6} {'policy':<9} {'remat ms':>9} {'eager ms':>9} {'compile ms':>10} {'eager/remat':>11} {'compile/remat':>13}")
for (model, seq, policy), tools in table.items():
    ms = {k: v.get("step_ms") for k, v in tools.items()}
    a, e, c = ms.get("remat-train"), ms.get("torch-eager"), ms.get("torch-compile")
    ratio = lambda x: f"{x / a:.2f}x" if x and a else "-"
    print(f"{model:<13} {seq:>6} {policy:<9} {a or '-':>9} {e or '-':>9} {c or '-':>10} {ratio(e):>11} {ratio(c):>13}")
for r in rows:
    if r["stage"] == "longest" and r.get("tool"):
        print(f"longest {r['model']} {r['policy']} {r['tool']}: {r.get('longest_seq_len')} ({r['status']})")
bad = [r for r in rows if r.get("status") in ("failed", "timeout")]
out = {"stage": "summary", "status": "ok" if not bad else "failures", "elapsed_s": int(sys.argv[2]),
       "speed_rows": len(speed), "failures": [f"{r['stage']} {r.get('tool', '')} {r.get('model', '')} "
                                               f"{r.get('seq_len', '')} {r.get('policy', '')}: {r['status']}" for r in bad]}
with open(sys.argv[1], "a") as f:
    f.write(json.dumps(out) + "\n")
print(json.dumps(out))
PY
}

# ---- the run ----
row stage=start status=ok host="$(uname -n)" out="$OUT" budget_s:="$BUDGET_S" steps:="$STEPS" cap="$CAP"
locate || exit 1
detect_gpu || exit 0
# torch.compile takes a minute or more per run (its first step), so its rows come after the eager
# ones of the same model; each is paired with a fresh remat-train run, alternated as the others.
COMPILE_TOOLS="remat compile"
[ "${COMPILE:-1}" = 1 ] || COMPILE_TOOLS=""
compile_rows() {  # model seq...
  if [ -n "$COMPILE_TOOLS" ]; then TOOLS=$COMPILE_TOOLS speed_model "$@"; fi
}
if [ "$DRY" = 1 ]; then
  # The plumbing of every stage, once: a GPT row with every tool, the fit + step of longest, the
  # llama row.
  POLICIES=full TOOLS="remat eager${COMPILE_TOOLS:+ compile}" speed_model gpt2-124m 4096
  REMAT_SETS="train.loss_chunk=16" POLICIES=full TOOLS=remat speed_model gpt2-124m 4096
  longest gpt2-124m none
  POLICIES=full speed_model llama-3.2-1b 4096
else
  speed_model gpt2-124m 32768 4096
  # What sizing the LM head's chunk to the budget is worth: the same rows with the 192-row chunk
  # every GPU run had before it (the rows above say which chunk they ran: loss_chunk).
  REMAT_SETS="train.loss_chunk=192" POLICIES=none TOOLS=remat speed_model gpt2-124m 32768 4096
  longest gpt2-124m none
  compile_rows gpt2-124m 32768 4096
  speed_model gpt2-350m 32768 4096
  longest gpt2-124m full
  POLICIES=full speed_model llama-3.2-1b 4096 32768
  compile_rows gpt2-350m 32768 4096
  POLICIES=full compile_rows llama-3.2-1b 4096 32768
  longest gpt2-350m none
  longest gpt2-350m full
fi
summary
! grep -qE '"status": "(failed|timeout)"' "$ROWS"
