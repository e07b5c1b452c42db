#!/usr/bin/env python3
"""scripts/torch_reference.py's LoRA (peft's adapters) against remat-train's (run by
tests/torch_reference_lora_check.sh, in a scratch folder, with the repository and the binary).

For three models, from the same base weights (one remat-train step of full fine-tuning, read by
remat-train as the Hugging Face folder `export --hf` writes and by torch_reference.py as the
checkpoint's model.safetensors) and the same batch (a shard of exactly two windows, read in order):
  1. fresh adapters: each tool draws its own A (uniform, +-1/sqrt(in)) and B = 0, so step 1 is the
     base's loss in both: it agrees within 1e-5 (relative);
  2. the same adapters: a PEFT folder from remat-train's `export --adapter` after one LoRA step
     (A random, B no longer 0, the modules trained whole moved), loaded by `train --init-adapter`
     and `torch_reference.py --init-adapter`: 3 steps' losses, learning rates and gradient norms
     agree within 1e-4 (step 1's loss within 1e-5), as the full fine-tuning check's do;
  3. the model FLOPs MFU divides by: what LoRA takes off full fine-tuning's count (the frozen
     weights' gradients, less the adapters' work) is the same number in both tools' counts,
     exactly (`remat-train bench`'s also count elementwise ops, which torch_reference's leave out;
     with every norm trained whole no elementwise weight gradient is skipped, so they cancel).
The models: a grouped-query Llama with llama3 RoPE scaling and an untied head, rank 4 on every
linear with the norms and the head trained whole (policy full); a multi-query Qwen2 (q/k/v
biases, which the fused q|k|v rows carry into torch's three projections) with a tied (frozen)
head, rslora, adapters on q, k, v and down only, the norms trained whole (policy none); GPT-2 with
learned positions, every linear (one adapter on the fused c_attn), wpe and the LayerNorms trained
whole (policy none).
"""
import json
import os
import random
import struct
import subprocess
import sys

# name: (model sets, LoRA sets, torch_reference's policy)
VARIANTS = {
    "llama-gqa": ([], ["lora.rank=4", "lora.alpha=8", 'lora.modules_to_save=["norm", "lm_head"]'],
                  "full"),
    "qwen2-tied": (["model.n_kv_head=1", "model.head_dim=0", "model.rope_scaling=none",
                    "model.attention_bias=true", "model.tie_embeddings=true"],
                   ["lora.rank=4", "lora.alpha=16", "lora.rslora=true",
                    'lora.targets=["q_proj", "k_proj", "v_proj", "down_proj"]',
                    'lora.modules_to_save=["norm"]'], "none"),
    "gpt-learned": (["model.position=learned"],
                    ["lora.rank=4", "lora.alpha=8",
                     'lora.modules_to_save=["wpe", "ln_1", "ln_2", "ln_f"]'],
                    "none"),
}


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAILED: {' '.join(cmd)} exited {r.returncode}:\n{r.stdout}{r.stderr}")
    return r.stdout


def sets(items):
    return [a for s in items for a in ("--set", s)]


def remat_steps(path):
    return [s for s in map(json.loads, open(path)) if "loss" in s and "step" in s]


def compare(label, ours, theirs, keys):
    """Prints each figure; returns how many are out of bounds."""
    rel = lambda a, b: abs(a - b) / max(abs(b), 1e-30)
    bad = 0
    for i, k in keys:
        a, b = ours[i][k], theirs[i][k]
        tol = 1e-5 if (i, k) == (0, "loss") else 1e-4
        ok = rel(a, b) < tol
        bad += not ok
        print(f"{label:26} step {i + 1} {k:9}: remat-train {a:.9g}  torch+peft {b:.9g}  "
              f"rel {rel(a, b):.1e} (< {tol:g}) {'ok' if ok else 'FAILED'}")
    return bad


def bench_flops(binary, args):
    out = run([binary, "bench", "--config", "model.toml", *args, "--set", "checkpoint.dir=",
               "--steps", "1", "--json"])
    return json.loads(out)["model_gflop"] * 1e9


def check_flops(name, repo, binary, data, model_sets, lora, torch_lora):
    """3. above: LoRA's saving on the model FLOPs, remat-train's against torch_reference's."""
    sys.path.insert(0, os.path.join(repo, "scripts"))
    import torch_reference
    cfg = torch_reference.load_config("model.toml", model_sets)
    torch_full = torch_reference.model_flops(cfg["model"], cfg["train"]["batch_size"],
                                             cfg["train"]["seq_len"])
    full = bench_flops(binary, data + sets(model_sets))
    ours = full - bench_flops(binary, data + sets(model_sets) + lora)
    theirs = torch_full - torch_lora
    ok = abs(ours - theirs) <= 1e-9 * theirs
    print(f"{name:26} model FLOPs LoRA saves: remat-train {ours:.0f} (of {full:.0f})  torch+peft "
          f"{theirs:.0f} (of {torch_full:.0f}) {'ok' if ok else 'FAILED'}")
    return not ok


def check(repo, binary, name, gpt_toml, tokens):
    model_sets, lora_sets, policy = VARIANTS[name]
    os.makedirs(name)
    os.chdir(name)
    run_part = open(gpt_toml).read()
    run_part = run_part[run_part.index("[train]"):]  # the run, without [model]
    llama = os.path.join(repo, "tests", "data", "reference_llama.toml")
    model_toml = open(gpt_toml).read() if name.startswith("gpt") else \
        open(llama).read() + run_part
    open("model.toml", "w").write(model_toml)
    open("run.toml", "w").write(run_part)  # --init hf: gives [model]
    data = sets([f"data.path={tokens}", "train.grad_clip=1.0"])
    lora = sets(lora_sets)
    # The shared base: one step of full fine-tuning, as a checkpoint and as a transformers folder.
    run([binary, "train", "--config", "model.toml", *data, *sets(model_sets),
         "--set", "checkpoint.dir=start", "--steps", "1", "--quiet"])
    run([binary, "export", "--checkpoint", "start", "--hf", "base-hf", "--dtype", "fp32"])
    init = os.path.join("start", "step_00000001")
    # One LoRA step, exported as the PEFT adapter both tools then start from.
    run([binary, "train", "--config", "run.toml", *data, *lora, "--init", "hf:base-hf",
         "--set", "checkpoint.dir=lora1", "--steps", "1", "--quiet"])
    run([binary, "export", "--checkpoint", "lora1", "--adapter", "adapter"])
    bad = 0
    for label, adapter in (("fresh adapters", []), ("the same adapter", ["adapter"])):
        tag = "fresh" if not adapter else "same"
        extra = ["--init-adapter", "adapter"] if adapter else []
        run([binary, "train", "--config", "run.toml", *data, *lora, "--init", "hf:base-hf",
             *extra, "--set", "checkpoint.dir=", "--steps", "3", "--metrics", f"{tag}.jsonl",
             "--quiet"])
        out = run([sys.executable, os.path.join(repo, "scripts", "torch_reference.py"),
                   "--config", "model.toml", *data, *sets(model_sets), *lora, "--init", init,
                   *extra, "--steps", "3", "--policy", policy, "--device", "cpu",
                   "--threads", "1", "--json"])
        result = json.loads(out)
        ours, theirs = remat_steps(f"{tag}.jsonl"), result["steps"]
        keys = [(0, "loss")] if not adapter else \
            [(i, k) for i in range(3) for k in ("loss", "lr", "grad_norm")]
        bad += compare(f"{name}, {label}", ours, theirs, keys)
    bad += check_flops(name, repo, binary, data, model_sets, lora,
                       result["model_flops_per_step"])
    os.chdir("..")
    return bad


def main():
    repo, binary = sys.argv[1], sys.argv[2]
    # Two windows of seq_len + 1 = 38 tokens (batch_size 2, data.order sequential): one batch.
    n, rng = 2 * 37 + 1, random.Random(47)
    tokens = os.path.abspath("tokens.bin")
    with open(tokens, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *[0] * 253))
        f.write(struct.pack(f"<{n}H", *[rng.randrange(64) for _ in range(n)]))
    gpt_toml = os.path.join(repo, "tests", "golden", "gpt.toml")
    bad = sum(check(repo, binary, name, gpt_toml, tokens) for name in VARIANTS)
    if bad:
        sys.exit(f"FAILED: {bad} figures of torch_reference.py's LoRA differ from remat-train's")
    import peft
    import torch
    print(f"torch_reference's LoRA matches remat-train (torch {torch.__version__}, peft "
          f"{peft.__version__}, {sys.executable})")


if __name__ == "__main__":
    main()
