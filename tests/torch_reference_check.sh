#!/bin/bash
# scripts/torch_reference.py (the PyTorch reference trainer) against the binary: from the same
# weights and the same batch, remat-train and PyTorch agree on step 1's loss within 1e-5
# relative (fp32), and on every other loss, learning rate and gradient norm of 3 steps within 1e-4
# (AdamW parity: its first update is sign-like, blind to the clip and the betas; the second's
# loss, step 3's, sees them). Four models: tests/golden/gpt.toml's small GPT with learned
# positions (policy none) and with RoPE (policy full: checkpointing must not move a number), and
# two small Llama-family models on the same batch: grouped-query attention (2 key/value heads for
# 4 query heads), head_dim 12 where n_embd / n_head is 8, llama3 RoPE scaling whose bands cut
# through the head's frequencies, an untied lm_head (policy full); and multi-query attention
# with Qwen's q/k/v biases and q/k norm and the head tied to wte (policy none). The shard holds
# exactly two windows, read in order, so every step sees the same batch in both tools. The weights
# are those of one remat-train step (not the init's symmetric ones), loaded by `train --init` and
# `torch_reference.py --init`.
# Needs PyTorch for $REMAT_TORCH_PYTHON (when set), python3 or /usr/bin/python3; without it the
# test is skipped (exit 77).
# Usage: [REMAT_TORCH_PYTHON=venv/bin/python] tests/torch_reference_check.sh [path/to/remat-train]
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"
repo=$(cd "$(dirname "$0")/.." && pwd)
bin=$(realpath "${1:-$repo/build/remat-train}")
[ -x "$bin" ] || fail "no remat-train binary at $bin (run make build, or pass its path)"

find_torch_python
if [ -n "${REMAT_TORCH_PYTHON:-}" ] && [ "$py" != "$REMAT_TORCH_PYTHON" ]; then
  echo "note: REMAT_TORCH_PYTHON=$REMAT_TORCH_PYTHON cannot import torch; using $py" >&2
fi

gpt=$repo/tests/golden/gpt.toml
# The Llama family's model: gpt.toml's run ([train] onwards) under a llama [model].
llama=$d/llama.toml
{
  cat "$repo/tests/data/reference_llama.toml"
  sed -n '/^\[train\]/,$p' "$gpt"
} >"$llama"
# Two windows of seq_len + 1 = 38 tokens (batch_size 2, data.order sequential): one batch, always.
"$py" - "$d/tokens.bin" <<'PY'
import random, struct, sys
n, rng = 2 * 37 + 1, random.Random(47)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *[0] * 253))
    f.write(struct.pack(f"<{n}H", *[rng.randrange(64) for _ in range(n)]))
PY

# name:policy, the config and its --set overrides by name.
for variant in learned:none rope:full llama-gqa:full llama-tied:none; do
  name=${variant%:*} policy=${variant#*:}
  # grad_clip 1.0: the clip acts at step 1 (its gradient norm is ~1.7), so it is checked too.
  sets=(--set "data.path=$d/tokens.bin" --set train.grad_clip=1.0)
  case $name in
    learned | rope) config=$gpt sets+=(--set "model.position=$name") ;;
    llama-gqa) config=$llama ;;
    llama-tied)
      config=$llama
      sets+=(--set model.n_kv_head=1 --set model.head_dim=0 --set model.rope_scaling=none
        --set model.attention_bias=true --set model.qk_norm=true --set model.tie_embeddings=true)
      ;;
  esac
  "$bin" train --config "$config" "${sets[@]}" --set "checkpoint.dir=$d/start-$name" \
    --steps 1 --quiet || fail "$name: remat-train's first run (the shared weights) failed"
  init=$d/start-$name/step_00000001
  "$bin" train --config "$config" "${sets[@]}" --init "$init" --steps 3 \
    --metrics "$d/remat-$name.jsonl" --quiet || fail "$name: remat-train --init failed"
  "$py" "$repo/scripts/torch_reference.py" --config "$config" "${sets[@]}" --init "$init" \
    --steps 3 --policy "$policy" --device cpu --threads 1 --json >"$d/torch-$name.json" \
    2>"$d/torch-$name.err" || {
    cat "$d/torch-$name.err" >&2
    fail "$name: scripts/torch_reference.py failed"
  }
  ours=$d/remat-$name.jsonl theirs=$d/torch-$name.json
  "$py" - "$variant" "$ours" "$theirs" <<'PY' || fail "$variant: the tools disagree"
import json, sys
variant, remat_path, torch_path = sys.argv[1:]
remat = [s for s in map(json.loads, open(remat_path)) if "loss" in s and "step" in s]
ref = json.load(open(torch_path))["steps"]
rel = lambda a, b: abs(a - b) / max(abs(b), 1e-30)
checks = [("step 1 loss", remat[0]["loss"], ref[0]["loss"], 1e-5)]
checks += [(f"step {i + 1} {k}", remat[i][k], ref[i][k], 1e-4)
           for i in range(3) for k in ("loss", "lr", "grad_norm") if (i, k) != (0, "loss")]
bad = 0
for what, a, b, tol in checks:
    ok = rel(a, b) < tol
    bad += not ok
    print(f"{variant:16} {what}: remat-train {a:.9g}  torch {b:.9g}  rel {rel(a, b):.1e} "
          f"(< {tol:g}) {'ok' if ok else 'FAILED'}")
sys.exit(1 if bad else 0)
PY
done
version=$("$py" -c 'import torch; print(torch.__version__)')
echo "torch_reference matches remat-train (torch $version, $py)"
