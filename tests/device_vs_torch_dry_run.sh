#!/bin/bash
# scripts/device-vs-torch.sh (remat-train against PyTorch on a GPU, issue 47) without a GPU:
# DRY_RUN=1 runs its stages on the CPU at a tiny size (a GPT row with remat-train's bench and
# PyTorch eager, the longest-context stage's fit + one step, a Llama row), so that the script's
# plumbing cannot rot between the rare device runs. Checks every row is JSON, each stage left
# the rows it should, the numbers are there, and the run ends with an "ok" summary. torch.compile
# is left out here (COMPILE=0: a minute of compiling on 2 cores).
# Needs PyTorch for $REMAT_TORCH_PYTHON (when set), python3 or /usr/bin/python3; without it the
# test is skipped (exit 77).
# Usage: [REMAT_TORCH_PYTHON=venv/bin/python] tests/device_vs_torch_dry_run.sh [path/to/remat-train]
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"
repo=$(cd "$(dirname "$0")/.." && pwd)
bin=$(realpath "${1:-$repo/build/remat-train}")
[ -x "$bin" ] || fail "no remat-train binary at $bin (run make build, or pass its path)"
find_torch_python

DRY_RUN=1 COMPILE=0 PACK_LOGS=0 OUT=$d/out REMAT_BIN=$bin TORCH_PYTHON=$py \
  bash "$repo/scripts/device-vs-torch.sh" >"$d/run.txt" 2>&1 || {
  tail -30 "$d/run.txt" >&2
  fail "the dry run exited non-zero"
}
python3 - "$d/out/device-vs-torch.rows.jsonl" <<'PY' || fail "the dry run's rows are not what they should be"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]  # every line one JSON object
stages = [r["stage"] for r in rows]
assert stages[:3] == ["start", "binaries", "gpu"], stages
assert rows[1]["status"] == "ok" and rows[1]["dry_run"] is True, rows[1]
assert rows[2]["status"] == "dry_run", rows[2]
speed = {(r["model"], r["tool"]): r for r in rows if r["stage"] == "speed" and "variant" not in r}
variants = [r for r in rows if r["stage"] == "speed" and "variant" in r]
assert len(variants) == 1 and variants[0]["variant"] == "train.loss_chunk=16", variants
assert variants[0]["status"] == "ok" and variants[0]["loss_chunk"] == 16, variants[0]
assert set(speed) == {("gpt2-124m", "remat-train"), ("gpt2-124m", "torch-eager"),
                      ("llama-3.2-1b", "remat-train"), ("llama-3.2-1b", "torch-eager")}, set(speed)
for (model, tool), r in speed.items():
    assert r["status"] == "ok" and r["policy"] == "full" and r["step_ms"] > 0, r
    assert r["tokens_per_s"] > 0 and r["timed_steps"] == 2, r
    assert r["seq_len"] == 4096 and r["ran_seq_len"] == 64, r  # the row's length, at tiny size
    if tool == "remat-train":
        assert r["predicted_peak_bytes"] > 0 and r["op_ms"]["linear"] > 0, r
        assert abs(sum(r["op_ms"].values()) - r["op_timed_step_ms"]) < 0.1, r  # the rows add up
    else:
        assert r["peak_bytes"] > 0 and r["attention"], r
assert "repeat_interleave" in speed[("llama-3.2-1b", "torch-eager")]["attention"]
# The tools of a row take turns going first: the first row starts with remat-train, the second
# (the variant, remat-train alone) with the tool after it, so the third, Llama's, with
# remat-train again and torch-eager second.
assert speed[("gpt2-124m", "remat-train")]["order"] == 0
assert speed[("llama-3.2-1b", "remat-train")]["order"] == 0
assert speed[("llama-3.2-1b", "torch-eager")]["order"] == 1
longest = [r for r in rows if r["stage"] == "longest"]
ours = next(r for r in longest if r["tool"] == "remat-train")
assert ours["status"] == "confirmed" and ours["longest_seq_len"] > 0 and ours["peak_agrees"], ours
assert next(r for r in longest if r["tool"] == "torch-eager")["status"] == "skipped"
assert rows[-1]["stage"] == "summary" and rows[-1]["status"] == "ok", rows[-1]
print(f"{len(rows)} rows; remat-train's longest under the tiny cap: {ours['longest_seq_len']} tokens, "
      "confirmed by a step at the planned peak")
PY
echo "device-vs-torch.sh dry run ok ($py)"
