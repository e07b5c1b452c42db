#!/bin/bash
# scripts/torch_reference.py (the PyTorch reference trainer) against the binary: from the same
# weights and the same batch, remat-train and PyTorch agree on step 1's loss within 1e-5
# relative (fp32), and on every other loss, learning rate and gradient norm of 3 steps within 1e-4
# (AdamW parity: its first update is sign-like, blind to the clip and the betas; the second's
# loss, step 3's, sees them). The model is tests/golden/gpt.toml's small GPT, with
# learned positions (policy none) and RoPE (policy full: checkpointing must not move a number);
# the shard holds exactly two windows, read in order, so every step sees the same batch in both
# tools. The weights are those of one remat-train step (not the init's symmetric ones), loaded by
# `train --init` and `torch_reference.py --init`.
# Needs PyTorch for python3 or /usr/bin/python3; without it the test is skipped (exit 77).
# Usage: tests/torch_reference_check.sh [path/to/remat-train]
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"
repo=$(cd "$(dirname "$0")/.." && pwd)
bin=$(realpath "${1:-$repo/build/remat-train}")
[ -x "$bin" ] || fail "no remat-train binary at $bin (run make build, or pass its path)"

py=
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import torch' 2>/dev/null; then
    py=$p
    break
  fi
done
if [ -z "$py" ]; then
  echo "skipped: PyTorch not installed (apt-get install python3-torch)"
  exit 77
fi

config=$repo/tests/golden/gpt.toml
# Two windows of seq_len + 1 = 38 tokens (batch_size 2, data.order sequential): one batch, always.
"$py" - "$d/tokens.bin" <<'PY'
import random, struct, sys
n, rng = 2 * 37 + 1, random.Random(47)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *[0] * 253))
    f.write(struct.pack(f"<{n}H", *[rng.randrange(64) for _ in range(n)]))
PY

for variant in learned:none rope:full; do
  position=${variant%:*} policy=${variant#*:}
  # grad_clip 1.0: the clip acts at step 1 (its gradient norm is ~1.7), so it is checked too.
  sets=(--set "data.path=$d/tokens.bin" --set "model.position=$position" --set train.grad_clip=1.0)
  "$bin" train --config "$config" "${sets[@]}" --set "checkpoint.dir=$d/start-$position" \
    --steps 1 --quiet || fail "$position: remat-train's first run (the shared weights) failed"
  init=$d/start-$position/step_00000001
  "$bin" train --config "$config" "${sets[@]}" --init "$init" --steps 3 \
    --metrics "$d/remat-$position.jsonl" --quiet || fail "$position: remat-train --init failed"
  "$py" "$repo/scripts/torch_reference.py" --config "$config" "${sets[@]}" --init "$init" \
    --steps 3 --policy "$policy" --device cpu --threads 1 --json >"$d/torch-$position.json" \
    2>"$d/torch-$position.err" || {
    cat "$d/torch-$position.err" >&2
    fail "$position: scripts/torch_reference.py failed"
  }
  ours=$d/remat-$position.jsonl theirs=$d/torch-$position.json
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
    print(f"{variant:12} {what}: remat-train {a:.9g}  torch {b:.9g}  rel {rel(a, b):.1e} "
          f"(< {tol:g}) {'ok' if ok else 'FAILED'}")
sys.exit(1 if bad else 0)
PY
done
version=$("$py" -c 'import torch; print(torch.__version__)')
echo "torch_reference matches remat-train (torch $version, $py)"
