#!/usr/bin/env python3
"""remat-train and PyTorch on the same model, machine and policy, alternated, in one table.

A speed figure alone proves little on a shared machine; against the tool a user would pick
instead, measured in the same minutes, it says which is faster and by how much. For each row
(a config, its --set overrides, a policy) this runs, round after round, `remat-train bench
--json` and `scripts/torch_reference.py --json` (the same model in plain PyTorch, checked against
remat-train by ctest torch_reference_matches_remat_train), alternating which goes first, and
prints the medians and their ratio as a Markdown table, each row with both commands.

    python3 scripts/side_by_side.py [--rounds 2] [--steps 3] [--device cpu|cuda] [--out FILE]
        [--row NAME ...]   rows: tiny (a smoke test), gpt2-124m-1k (default on the CPU),
                           gpt2-124m-4k, gpt2-124m-32k,
                           gpt2-350m-4k, gpt2-350m-32k (the GPU rows), llama-3.2-1b-4k,
                           llama-3.2-1b-32k (the Llama family, GPU), smollm2-135m-512 and
                           smollm2-135m-512-lora (a small Llama at 512 tokens, batch 1: full
                           fine-tuning, and LoRA rank 16 on every linear against peft; the CPU's
                           pair), each under --policies
        [--policies none,full]  [--torch-python /usr/bin/python3]  [--binary build/remat-train]

A LoRA row (its sets hold lora.rank) trains adapters on the frozen base in both tools: remat-train's
[lora], and torch_reference.py's peft (LoraConfig + get_peft_model on the same modules, checked
against remat-train by ctest torch_reference_lora_matches_remat_train). Its --torch-python must
import peft as well as torch: the venv scripts/make-hf-venv.sh makes (/work/venv-hf/bin/python).
Compare a LoRA row with the full fine-tuning row of the same model, measured in the same rounds:

    python3 scripts/side_by_side.py --row smollm2-135m-512 --row smollm2-135m-512-lora \
        --torch-python /work/venv-hf/bin/python --rounds 2 --steps 3

Benchmark on a quiet machine (`uptime`; nothing else running): an OpenMP step slows 2-3x when
another process competes for the cores, and PyTorch's threads more than ours. --out FILE keeps
every run's JSON (one line each) beside the table.
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS = {
    "tiny": ("configs/tiny.toml", []),
    "gpt2-124m-1k": ("configs/gpt2-124m.toml", ["train.seq_len=1024", "train.batch_size=1"]),
    "gpt2-124m-4k": ("configs/gpt2-124m.toml", ["train.seq_len=4096", "train.batch_size=1"]),
    "gpt2-124m-32k": ("configs/gpt2-124m.toml", ["train.seq_len=32768", "train.batch_size=1"]),
    "gpt2-350m-4k": ("configs/gpt2-350m.toml", ["train.seq_len=4096", "train.batch_size=1"]),
    "gpt2-350m-32k": ("configs/gpt2-350m.toml", ["train.seq_len=32768", "train.batch_size=1"]),
    "llama-3.2-1b-4k": ("configs/llama-3.2-1b.toml", ["train.seq_len=4096", "train.batch_size=1"]),
    "llama-3.2-1b-32k": ("configs/llama-3.2-1b.toml",
                         ["train.seq_len=32768", "train.batch_size=1"]),
    "smollm2-135m-512": ("configs/smollm2-135m.toml", ["train.seq_len=512", "train.batch_size=1"]),
    "smollm2-135m-512-lora": ("configs/smollm2-135m.toml",
                              ["train.seq_len=512", "train.batch_size=1", "lora.rank=16"]),
}


def is_lora(row):
    return any(s.startswith("lora.rank=") for s in ROWS[row][1])


def sets_args(sets):
    return [a for s in sets for a in ("--set", s)]


def commands(opt, row, policy):
    config, sets = ROWS[row]
    sets = sets + [f"device.backend={opt.device}", "checkpoint.dir="]
    ours = [opt.binary, "bench", "--config", config, *sets_args(sets + [f"remat.policy={policy}"]),
            "--steps", str(opt.steps), "--json"]
    torch = [opt.torch_python, os.path.join("scripts", "torch_reference.py"), "--config", config,
             *sets_args(sets), "--policy", policy, "--device", opt.device,
             "--steps", str(opt.steps + 1), "--warmup", "1", "--json"]
    return ours, torch


def run_json(cmd):
    p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["(no message)"])[-1]
        return None, f"exit {p.returncode}: {last}"
    try:
        return json.loads(p.stdout), None
    except ValueError as e:
        return None, f"printed no JSON ({e})"


def step_ms(tool, j):
    return j["step_ms"] if tool == "remat-train" else j["median_step_ms"]


def planned_peak(opt, row, policy):
    """remat-train's peak: its plan's, which on the CPU equals the measured pool peak to the byte
    (every train summary says so) and on CUDA the pool's planned peak."""
    config, sets = ROWS[row]
    sets = sets + [f"device.backend={opt.device}", f"remat.policy={policy}"]
    j, _ = run_json([opt.binary, "plan", "--config", config, *sets_args(sets), "--json"])
    return j["policies"][-1]["peak_bytes"] if j else None


def fmt_gib(b):
    return "-" if not b else f"{b / 2**30:.2f} GiB"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per run (after one warm-up)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--row", action="append", choices=sorted(ROWS))
    ap.add_argument("--policies", default="none,full")
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "remat-train"))
    ap.add_argument("--torch-python", default="/usr/bin/python3",
                    help="the python that runs torch_reference.py; LoRA rows need peft too "
                         "(scripts/make-hf-venv.sh: /work/venv-hf/bin/python)")
    ap.add_argument("--out", help="append every run's JSON here, one line each")
    opt = ap.parse_args()
    if not os.access(opt.binary, os.X_OK):
        sys.exit(f"error: [side_by_side] {opt.binary} is not an executable. Fix: make build")
    rows = opt.row or (["gpt2-124m-1k"] if opt.device == "cpu" else
                       ["gpt2-124m-4k", "gpt2-124m-32k", "gpt2-350m-4k", "gpt2-350m-32k"])
    if any(map(is_lora, rows)) and subprocess.run(
            [opt.torch_python, "-c", "import torch, peft"], stderr=subprocess.DEVNULL).returncode:
        sys.exit(f"error: [side_by_side] a LoRA row runs torch_reference.py with peft, which "
                 f"{opt.torch_python} cannot import. Fix: scripts/make-hf-venv.sh, then "
                 "--torch-python /work/venv-hf/bin/python")
    policies = opt.policies.split(",")
    results = {}  # (row, policy, tool) -> [json]
    out = open(opt.out, "a") if opt.out else None
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for rnd in range(opt.rounds):
        for row in rows:
            for policy in policies:
                ours, torch = commands(opt, row, policy)
                order = [("remat-train", ours), ("pytorch", torch)]
                if rnd % 2:
                    order.reverse()
                for tool, cmd in order:
                    j, err = run_json(cmd)
                    print(f"[side_by_side] round {rnd + 1} {row} {policy} {tool}: "
                          f"{err or f'{step_ms(tool, j):.1f} ms/step'}", file=sys.stderr)
                    if out:
                        out.write(json.dumps({"round": rnd + 1, "row": row, "policy": policy,
                                              "tool": tool, "error": err, "result": j}) + "\n")
                        out.flush()
                    if j:
                        results.setdefault((row, policy, tool), []).append(j)
    load = os.getloadavg()[0]
    print(f"Side by side on {opt.device}, {started}, {opt.rounds} alternated rounds of "
          f"{opt.steps} timed steps after one warm-up; load average {load:.2f} at the end.\n")
    print("| row | policy | remat-train ms/step | PyTorch ms/step | remat-train is | "
          "remat-train peak | PyTorch peak |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        for policy in policies:
            a = results.get((row, policy, "remat-train"), [])
            b = results.get((row, policy, "pytorch"), [])
            ma = statistics.median(step_ms("remat-train", j) for j in a) if a else None
            mb = statistics.median(step_ms("pytorch", j) for j in b) if b else None
            ratio = f"{mb / ma:.2f}x as fast" if ma and mb else "-"
            pa = planned_peak(opt, row, policy)
            pb, kb = (b[-1].get("peak_bytes"), b[-1].get("peak_kind", "")) if b else (None, "")
            print(f"| {row} | `{policy}` | {ma and f'{ma:.1f}' or '-'} | "
                  f"{mb and f'{mb:.1f}' or '-'} | {ratio} | {fmt_gib(pa)} | "
                  f"{fmt_gib(pb)}{f' ({kb})' if pb and kb else ''} |")
    warned = [(row, policy, n + 1, w) for (row, policy, tool), js in results.items()
              if tool == "remat-train" for n, j in enumerate(js) for w in j.get("warnings", [])]
    for row, policy, n, w in warned:
        print(f"\n{row} {policy}, remat-train's run {n}: {w}")
    torch_runs = [j for (_, _, tool), js in results.items() if tool == "pytorch" for j in js]
    print(f"\nPyTorch {torch_runs[0]['torch'] if torch_runs else '-'}; "
          f"{torch_runs[0]['attention'] if torch_runs else ''}")
    print("Commands (per row and policy):")
    for row in rows:
        for policy in policies:
            ours, torch = commands(opt, row, policy)
            ours[0] = os.path.relpath(ours[0], ROOT)
            print(f"    {shlex.join(ours)}\n    {shlex.join(torch)}")
    missing = [f"{row} {policy} {tool}" for row in rows for policy in policies
               for tool in ("remat-train", "pytorch") if (row, policy, tool) not in results]
    if missing:
        print(f"error: [side_by_side] no result for {', '.join(missing)}. Fix: see the runs' "
              "messages above", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
