#!/usr/bin/python3
"""The PyTorch golden (issue 17): an independent implementation of remat-train's GPT in PyTorch,
run on weights remat-train wrote, whose numbers tests/test_golden.cpp checks the real binary
against.

For each variant (learned positions, RoPE) it
  1. writes tests/golden/tokens.bin, one fixed batch: two windows of seq_len + 1 random tokens
     (Python's random, seeded; an llm.c token shard),
  2. runs remat-train for one step of tests/golden/gpt.toml and keeps the model.safetensors it
     writes as tests/golden/gpt-<variant>.init.safetensors (trained weights, not the init's
     symmetric ones),
  3. loads those weights into a minimal PyTorch GPT in float64 (nn.functional only: layer_norm,
     a causal softmax over the full T x T scores, RoPE from its definition, tanh GELU, the head
     tied to wte, mean cross-entropy) and takes 5 steps of torch.optim.AdamW on the batch, with
     the config's warmup + cosine schedule, global-norm clipping and weight decay on the 2-D
     parameters only,
  4. writes tests/golden/gpt-<variant>.golden.json: per step the loss, the gradient norm before
     clipping and the learning rate; after the last step each parameter's L2 norm.

Needs Debian's python3-torch (`apt-get install python3-torch`; `make golden` installs it), never
installed by `make test`. Regenerate everything with one command:

    make golden          # = /usr/bin/python3 scripts/torch_golden.py --binary build/remat-train

The script also runs the binary from the same weights and prints how far it is from the golden,
so a regeneration shows at once whether the two implementations still agree.
"""
import argparse
import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    sys.exit("error: scripts/torch_golden.py needs PyTorch. Fix: apt-get install python3-torch "
             "and run it with /usr/bin/python3 (or run `make golden`)")

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = None

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(REPO, "tests", "golden")
CONFIG = os.path.join(GOLDEN, "gpt.toml")
TOKENS = os.path.join(GOLDEN, "tokens.bin")
VARIANTS = {"learned": [], "rope": ["--set", "model.position=rope"]}
SHARD_MAGIC, SHARD_VERSION = 20240520, 1
BETAS, ADAM_EPS, LN_EPS = (0.9, 0.95), 1e-8, 1e-5


def read_config():
    text = open(CONFIG, "rb").read()
    if tomllib is None:
        sys.exit("error: reading tests/golden/gpt.toml needs Python 3.11 (tomllib)")
    cfg = tomllib.loads(text.decode())
    return cfg["model"], cfg["train"]


def write_tokens(model, train):
    """Exactly two windows of seq_len + 1 tokens: sequential order reads the same batch every step."""
    n = 2 * train["seq_len"] + 1
    rng = random.Random(20240520)
    tokens = [rng.randrange(model["vocab_size"]) for _ in range(n)]
    header = [SHARD_MAGIC, SHARD_VERSION, n] + [0] * 253
    with open(TOKENS, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{n}H", *tokens))
    return tokens


def read_safetensors(path):
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, t in header.items():
        assert t["dtype"] == "F32", (name, t["dtype"])
        a, b = t["data_offsets"]
        vals = struct.unpack(f"<{(b - a) // 4}f", blob[8 + n + a:8 + n + b])
        out[name] = torch.tensor(vals, dtype=torch.float64).reshape(t["shape"])
    return out


def run_binary(binary, args, cwd):
    r = subprocess.run([binary] + args, cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"error: {binary} {' '.join(args)} exited {r.returncode}:\n{r.stderr}")


def binary_args(variant, ckpt_dir):
    return (["train", "--config", CONFIG, "--set", f"data.path={TOKENS}",
             "--set", f"checkpoint.dir={ckpt_dir}", "--quiet"] + VARIANTS[variant])


def only_checkpoint(ckpt_dir):
    steps = sorted(d for d in os.listdir(ckpt_dir) if d.startswith("step_"))
    return os.path.join(ckpt_dir, steps[-1], "model.safetensors")


# ---- the model, from the formulas ----

def rope(x, theta):
    """x: (B, H, T, HS). Pairs (i, i + HS/2) rotated by angle t * theta^(-2i/HS)."""
    T, HS = x.shape[-2], x.shape[-1]
    half = HS // 2
    i = torch.arange(half, dtype=torch.float64)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * theta ** (-2.0 * i / HS)
    c, s = torch.cos(ang), torch.sin(ang)
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * c - b * s, a * s + b * c], dim=-1)


def gpt_loss(P, model, idx, targets):
    B, T = idx.shape
    C, H, L = model["n_embd"], model["n_head"], model["n_layer"]
    HS = C // H
    use_rope = model.get("position", "learned") == "rope"
    x = P["wte"][idx]
    if not use_rope:
        x = x + P["wpe"][:T]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(L):
        p = lambda n: P[f"blocks.{l}.{n}"]
        h = F.layer_norm(x, (C,), p("ln1.weight"), p("ln1.bias"), LN_EPS)
        qkv = h @ p("attn.qkv.weight").T + p("attn.qkv.bias")
        q, k, v = (t.reshape(B, T, H, HS).transpose(1, 2) for t in qkv.split(C, dim=-1))
        if use_rope:
            theta = float(model.get("rope_theta", 10000.0))
            q, k = rope(q, theta), rope(k, theta)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(HS)
        scores = scores.masked_fill(~causal, float("-inf"))
        att = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + att @ p("attn.proj.weight").T + p("attn.proj.bias")
        h = F.layer_norm(x, (C,), p("ln2.weight"), p("ln2.bias"), LN_EPS)
        fc = F.gelu(h @ p("mlp.fc.weight").T + p("mlp.fc.bias"), approximate="tanh")
        x = x + fc @ p("mlp.proj.weight").T + p("mlp.proj.bias")
    x = F.layer_norm(x, (C,), P["lnf.weight"], P["lnf.bias"], LN_EPS)
    logits = x @ P["wte"].T
    return F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))


def learning_rate(train, s):
    """Linear warmup over warmup_steps, then cosine from lr to lr * min_lr_ratio."""
    lr, warmup, steps = train["lr"], train.get("warmup_steps", 0), train["steps"]
    if s < warmup:
        return lr * (s + 1) / warmup
    decay = steps - warmup
    if decay <= 1:
        return lr
    progress = (s - warmup) / (decay - 1)
    lo = lr * train.get("min_lr_ratio", 0.1)
    return lo + 0.5 * (lr - lo) * (1 + math.cos(math.pi * progress))


def torch_run(model, train, tokens, init):
    T = train["seq_len"]
    rows = [tokens[r * T:r * T + T + 1] for r in range(2)]
    idx = torch.tensor([r[:-1] for r in rows])
    targets = torch.tensor([r[1:] for r in rows])
    P = {n: t.clone().requires_grad_(True) for n, t in init.items()}
    decay = [t for t in P.values() if t.dim() == 2]
    no_decay = [t for t in P.values() if t.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": train["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=train["lr"], betas=BETAS, eps=ADAM_EPS)
    steps = []
    for s in range(train["steps"]):
        lr = learning_rate(train, s)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad()
        loss = gpt_loss(P, model, idx, targets)
        loss.backward()
        norm = math.sqrt(sum(float((t.grad ** 2).sum()) for t in P.values()))
        clip = train.get("grad_clip", 1.0)
        if clip > 0 and norm > clip:  # plain clip / norm: no epsilon in the denominator
            for t in P.values():
                t.grad.mul_(clip / norm)
        opt.step()
        steps.append({"step": s + 1, "loss": float(loss), "grad_norm": norm, "lr": lr})
    final = {n: {"norm": float(t.detach().norm())} for n, t in sorted(P.items())}
    return {"steps": steps, "final": final}


def binary_run(binary, variant, init_path, work):
    ckpt = os.path.join(work, f"run-{variant}")
    metrics = os.path.join(work, f"{variant}.jsonl")
    run_binary(binary, binary_args(variant, ckpt) + ["--init", init_path, "--metrics", metrics],
               work)
    steps = [json.loads(line) for line in open(metrics)]
    steps = [s for s in steps if "loss" in s and "step" in s]
    final = read_safetensors(only_checkpoint(ckpt))
    return steps, final


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", default=os.path.join(REPO, "build", "remat-train"))
    args = ap.parse_args()
    binary = os.path.abspath(args.binary)
    if not os.access(binary, os.X_OK):
        sys.exit(f"error: no remat-train binary at {binary}. Fix: run `make build` or pass --binary")
    torch.set_num_threads(1)
    model, train = read_config()
    tokens = write_tokens(model, train)
    work = tempfile.mkdtemp(prefix="remat-golden.")
    try:
        for variant in VARIANTS:
            start = os.path.join(work, f"start-{variant}")
            run_binary(binary, binary_args(variant, start) + ["--steps", "1"], work)
            init_path = os.path.join(GOLDEN, f"gpt-{variant}.init.safetensors")
            shutil.copyfile(only_checkpoint(start), init_path)
            m = dict(model, position="rope" if variant == "rope" else "learned")
            golden = torch_run(m, train, tokens, read_safetensors(init_path))
            golden["generated_by"] = "scripts/torch_golden.py (float64, torch %s)" % torch.__version__
            with open(os.path.join(GOLDEN, f"gpt-{variant}.golden.json"), "w") as f:
                json.dump(golden, f, indent=1)
                f.write("\n")
            steps, final = binary_run(binary, variant, init_path, work)
            print(f"{variant}: step  loss (torch)          loss (remat-train)   rel     "
                  "grad_norm rel")
            for g, b in zip(golden["steps"], steps):
                print(f"  {g['step']:>4}  {g['loss']:.15f}  {b['loss']:.15f}  "
                      f"{rel(b['loss'], g['loss']):.1e}  {rel(b['grad_norm'], g['grad_norm']):.1e}")
            worst = max(golden["final"].items(),
                        key=lambda kv: rel(float(final[kv[0]].norm()), kv[1]["norm"]))
            print(f"  final weights: largest relative norm difference "
                  f"{rel(float(final[worst[0]].norm()), worst[1]['norm']):.1e} ({worst[0]})")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {os.path.relpath(GOLDEN, REPO)}/: tokens.bin, gpt-*.init.safetensors, "
          "gpt-*.golden.json")


if __name__ == "__main__":
    main()
