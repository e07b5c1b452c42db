#!/usr/bin/env python3
"""remat-train's LoRA exports against peft and transformers (run by tests/peft_check.sh).

For each LoRA golden of tests/golden/hf (a base model and a PEFT adapter on it):
  1. remat-train trains 3 steps from the base (--init hf:) and the adapter (--init-adapter), so the
     adapters and the modules trained whole move away from the golden's;
  2. exports the checkpoint as a PEFT adapter (--adapter A) and as a merged model (--hf M);
  3. computes its own loss with adapter A on the golden's tokens (a 1-step run at lr 0 from
     --init-adapter A, on token shards holding those tokens: the loss printed before any update);
  4. peft.PeftModel.from_pretrained(base, A) and transformers' from_pretrained(M) compute theirs.
The three losses must agree within 1e-5 (relative). Prints them; exit 0 when they do.
"""
import json
import os
import struct
import subprocess
import sys

import torch
import torch.nn.functional as F
import transformers
import peft

BOUND = 1e-5


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAILED: {' '.join(cmd)} exited {r.returncode}:\n{r.stdout}{r.stderr}")
    return r.stdout


def shard(path, tokens):
    header = struct.pack("<3i", 20240520, 1, len(tokens)) + b"\0" * (256 * 4 - 12)
    with open(path, "wb") as f:
        f.write(header + struct.pack(f"<{len(tokens)}H", *tokens))


def toml_list(names):
    return "[" + ", ".join(f'"{n}"' for n in names) + "]"


def loss_of(model, tokens, T):
    with torch.no_grad():
        logits = model(input_ids=tokens[:, :T]).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                           tokens[:, 1:T + 1].reshape(-1)).item()


def check(repo, binary, name):
    golden = os.path.join(repo, "tests", "golden", "hf", name)
    meta = json.load(open(os.path.join(golden, "golden.json")))
    lora, B, T = meta["lora"], meta["B"], meta["T"]
    work = os.path.abspath(name)
    os.makedirs(work)
    os.chdir(work)
    lora_toml = (f"[lora]\nrank = {lora['r']}\nalpha = {float(lora['lora_alpha'])}\n"
                 f"rslora = {'true' if lora['use_rslora'] else 'false'}\n"
                 f"targets = {toml_list(lora['target_modules'])}\n"
                 f"modules_to_save = {toml_list(lora['modules_to_save'])}\n")
    with open("train.toml", "w") as f:
        f.write(f"[train]\nseq_len = {T}\nbatch_size = {B}\nsteps = 3\nlr = 0.01\n"
                f"[checkpoint]\ndir = \"ckpt\"\n" + lora_toml)
    run([binary, "train", "--config", "train.toml", "--init", "hf:" + golden,
         "--init-adapter", os.path.join(golden, "adapter"), "-q"])
    run([binary, "export", "--checkpoint", "ckpt", "--adapter", "adapter"])
    run([binary, "export", "--checkpoint", "ckpt", "--hf", "merged", "--dtype", "fp32"])
    # Our loss with the exported adapter on the golden's tokens: one row per shard, in order.
    for b, row in enumerate(meta["tokens"]):
        shard(f"row{b}.bin", row)
    with open("eval.toml", "w") as f:
        f.write(f"[train]\nseq_len = {T}\nbatch_size = {B}\nsteps = 1\nlr = 0.0\n"
                f"[data]\nsource = \"tokens\"\norder = \"sequential\"\n"
                f"path = {toml_list([f'row{b}.bin' for b in range(B)])}\n" + lora_toml)
    run([binary, "train", "--config", "eval.toml", "--init", "hf:" + golden,
         "--init-adapter", "adapter", "--metrics", "eval.jsonl", "-q"])
    ours = next(json.loads(l)["loss"] for l in open("eval.jsonl")
                if json.loads(l).get("step") == 1 and "loss" in json.loads(l))
    tokens = torch.tensor(meta["tokens"], dtype=torch.long)
    cls = getattr(transformers, meta["class"])
    base = cls.from_pretrained(golden, dtype=torch.float32, attn_implementation="eager").eval()
    theirs = loss_of(peft.PeftModel.from_pretrained(base, "adapter").eval(), tokens, T)
    merged = loss_of(cls.from_pretrained("merged", dtype=torch.float32,
                                         attn_implementation="eager").eval(), tokens, T)
    trained = abs(theirs - meta["loss"])  # the 3 steps moved the adapter
    ok = (abs(theirs - ours) <= BOUND * abs(ours) and abs(merged - ours) <= BOUND * abs(ours)
          and trained > 1e-4)
    print(f"{name}: remat-train {ours:.9f}, peft (export --adapter) {theirs:.9f}, transformers "
          f"(export --hf, merged) {merged:.9f}; the golden adapter's {meta['loss']:.9f} "
          f"({'OK' if ok else 'FAIL'})")
    os.chdir("..")
    return ok


def main():
    repo, binary = sys.argv[1], os.path.abspath(sys.argv[2])
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    results = [check(repo, binary, n) for n in ("llama-lora", "gpt2-lora")]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
