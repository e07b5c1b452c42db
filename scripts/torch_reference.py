#!/usr/bin/env python3
"""The PyTorch reference trainer (issue 47): remat-train's GPT and its Llama-family model as a
competent PyTorch user would train them at long context, so that the two tools can be compared
side by side on one machine.

Someone choosing remat-train would otherwise write this: nn.Module blocks, F.scaled_dot_product_
attention(is_causal=True), torch.utils.checkpoint per block (or selective activation
checkpointing), bf16 autocast over fp32 master weights, fused AdamW, global-norm clipping,
torch.compile. This script is that program, for the same model and the same config file:

  * it reads a remat-train TOML config (`--set section.key=value` overrides as remat-train's) and
    builds the same GPT: LayerNorm (eps 1e-5), fused qkv with heads contiguous, RoPE on pairs
    (i, i + HS/2) or learned positions, tanh GELU, the LM head tied to wte, mean cross-entropy;
    parameter names are those of remat-train's model.safetensors, so `--init` loads its weights;
  * model.kind = "llama" is the Llama family as transformers writes it (LlamaForCausalLM, Qwen2's
    q/k/v biases, Qwen3's q/k norm): RMSNorm with its statistics in f32 and the normalized row
    cast back before the weight multiplies it, fused q|k|v rows, grouped-query attention (SDPA's
    enable_gqa on CUDA in bf16, else K and V heads repeat_interleave'd: key/value head j serves
    query heads j*g .. j*g+g-1), RoPE on the pairs (i, i + HS/2) with transformers' llama3
    frequency scaling, F.silu(gate) * up, the LM head tied to wte or its own lm_head.weight;
  * `[lora]` with a rank (lora.rank = 16, or --set lora.rank=16; alpha, targets, dropout, rslora,
    modules_to_save as remat-train reads them, docs/lora.md) trains LoRA as a peft user would:
    peft.LoraConfig + get_peft_model, the base frozen, adapters on the linears whose transformers
    names the targets select (peft 0.17's matching: q_proj ... down_proj; GPT-2's c_attn, c_proj,
    c_fc), AdamW over the trainable parameters alone. The model is remat-train's: one adapter
    per transformers projection, so a Llama's q, k and v become three nn.Linear here (their rows
    split from the fused weight `--init` loads), where GPT-2's c_attn, fused in transformers too,
    keeps one. `--init-adapter DIR` starts from a PEFT adapter folder (remat-train's `export
    --adapter`). peft lives in the venv of scripts/make-hf-venv.sh; without it a LoRA run stops
    with one line naming that fix;
  * it trains N steps with AdamW (betas 0.9/0.95, eps 1e-8, weight decay on 2-D weights only),
    remat-train's schedule (linear warmup, cosine to lr * min_lr_ratio) and global-norm clipping,
    on random tokens (seeded) or on the llm.c token shards remat-train reads;
  * it prints what `remat-train bench` prints about a step: the median step time after warm-up,
    tokens/s, the model FLOPs as MFU counts them (each GEMM of the forward, 2*M*N*K, plus causal
    attention's two GEMMs over T(T+1)/2 pairs, all times 3; the LM head's forward times 3) and the
    achieved TFLOP/s (under LoRA less the frozen weights' gradients, as remat-train's: the
    base's GEMMs twice, the adapters' and attention three times, the head twice unless it
    trains), and the peak memory (torch.cuda.max_memory_allocated on CUDA; on the CPU the
    process's peak RSS over the RSS before the model was built). remat-train's count adds the
    elementwise ops (LayerNorm, GELU, softmax): 0.2% more at GPT-2 124M, T = 1024.

Old PyTorch still runs it, with the fallback named in the banner: torch < 2.0 has no SDPA (the
explicit causal softmax is used) and no torch.compile; selective checkpointing (policies
save_attn and save_dots) needs torch >= 2.4 and is refused below it.

tests/torch_reference_check.sh checks it against the binary: from the same weights and batch,
step 1's loss agrees within 1e-5 relative (fp32), and 3 steps' losses, learning rates and
gradient norms within 1e-4 (AdamW parity), for two GPTs and two Llama-family models (grouped-
query attention with llama3 scaling and an untied head; multi-query with Qwen's biases and q/k
norm and a tied head). tests/torch_reference_lora_check.sh checks the LoRA path the same way
(peft's adapters against remat-train's, from the same base and the same PEFT adapter; skipped
without peft). A side-by-side CPU comparison (GPT-2 124M, T = 1024, batch 1; one warm-up and 3
timed steps each; then the same with policy full):

    build/remat-train bench --config configs/gpt2-124m.toml --set train.seq_len=1024 \\
        --set remat.policy=none --set device.backend=cpu --steps 3
    /usr/bin/python3 scripts/torch_reference.py --config configs/gpt2-124m.toml \\
        --set train.seq_len=1024 --policy none --device cpu --steps 4 --warmup 1

Compare them on a quiet machine, alternated: with more threads than free cores, OpenMP's
spinning threads can make PyTorch's step many times slower.
"""
import argparse
import contextlib
import functools
import gc
import glob
import json
import math
import os
import re
import resource
import statistics
import struct
import sys
import time

try:
    import tomllib
except ImportError:  # Python < 3.11: the small parser below reads remat-train's configs
    tomllib = None


def die(problem, fix):
    print(f"error: [torch_reference] {problem}. Fix: {fix}", file=sys.stderr)
    sys.exit(2)


try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import torch.utils.checkpoint as ckpt
except ImportError:
    die("PyTorch is not installed for " + sys.executable,
        "apt-get install python3-torch (and run /usr/bin/python3), or pip install torch")

TORCH = tuple(int(x) for x in re.findall(r"\d+", torch.__version__)[:2])
HAS_SDPA = hasattr(F, "scaled_dot_product_attention")
HAS_COMPILE = hasattr(torch, "compile")
HAS_SAC = hasattr(ckpt, "create_selective_checkpoint_contexts")
HAS_GQA = TORCH >= (2, 5)  # F.scaled_dot_product_attention(..., enable_gqa=True)
BETAS, ADAM_EPS, LN_EPS = (0.9, 0.95), 1e-8, 1e-5
SHARD_MAGIC, SHARD_VERSION = 20240520, 1
POLICIES = ("none", "full", "save_attn", "save_dots")

# remat-train's defaults (engine/config/config.h) for the keys this script reads.
DEFAULTS = {
    "model": {"kind": "gpt", "n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 256,
              "n_ctx": 1024, "d_ff": 0, "position": "learned", "rope_theta": 10000.0,
              "dropout": 0.0, "n_kv_head": 0, "head_dim": 0, "norm_eps": 1e-5,
              "rope_scaling": "none", "attention_bias": False, "qk_norm": False,
              "tie_embeddings": True},
    "train": {"seq_len": 256, "batch_size": 4, "steps": 20, "lr": 1e-3, "warmup_steps": 0,
              "min_lr_ratio": 0.1, "weight_decay": 0.1, "grad_clip": 1.0, "seed": 1337,
              "loss_chunk": 0},
    "data": {"source": "synthetic", "task": "random", "path": [], "order": "random"},
    "remat": {"policy": "none"},
    "device": {"backend": "auto", "precision": "bf16", "threads": 0},
    "lora": {"rank": 0, "alpha": 16.0, "targets": [], "dropout": 0.0, "rslora": False,
             "modules_to_save": [], "base": "fp32"},
}


# ---- the config ----

def toml_value(text):
    """One TOML value of the kinds remat-train's configs use; a bare word is a string (--set)."""
    text = text.strip()
    if text.startswith("{") and text.endswith("}"):  # an inline table of scalars (rope_scaling)
        pairs = (item.partition("=") for item in text[1:-1].split(",") if item.strip())
        return {k.strip(): toml_value(v) for k, _, v in pairs}
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        return [toml_value(v) for v in re.findall(r'"[^"]*"|\'[^\']*\'|[^,\s][^,]*', inner)]
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    if text in ("true", "false"):
        return text == "true"
    for kind in (int, float):
        try:
            return kind(text.replace("_", ""))
        except ValueError:
            pass
    return text


def strip_comment(line):
    """The line without its # comment (a # inside a quoted string stays)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            return line[:i].strip()
    return line.strip()


def parse_toml_subset(text):
    """Sections, `key = value` and comments: enough for remat-train's configs without tomllib."""
    out = {}
    section = out
    for line in map(strip_comment, text.splitlines()):
        if not line:
            continue
        m = re.fullmatch(r"\[([A-Za-z0-9_.]+)\]", line)
        if m:
            section = out.setdefault(m.group(1), {})
            continue
        key, _, value = line.partition("=")
        section[key.strip()] = toml_value(value)
    return out


def load_config(path, overrides):
    try:
        text = open(path, "rb").read().decode()
    except OSError as e:
        die(f"cannot read config {path}: {e.strerror}", "pass --config FILE (see configs/)")
    try:
        raw = tomllib.loads(text) if tomllib else parse_toml_subset(text)
    except Exception as e:  # tomllib.TOMLDecodeError names the line
        die(f"{path}: {e}", "correct the TOML (remat-train rejects it too)")
    cfg = {s: dict(d, **raw.get(s, {})) for s, d in DEFAULTS.items()}
    for item in overrides:
        key, eq, value = item.partition("=")
        section, dot, name = key.partition(".")
        if not eq or not dot or not name:
            die(f"--set {item}: expected section.key=value", "write e.g. --set train.seq_len=4096")
        try:
            parsed = tomllib.loads(f"v = {value}")["v"] if tomllib else toml_value(value)
        except Exception:  # remat-train accepts bare words: --set data.source=tokens
            parsed = value
        cfg.setdefault(section, {})[name] = parsed
    m = cfg["model"]
    if m["kind"] not in ("gpt", "llama"):
        die(f"model.kind = {m['kind']}: only the GPT and the Llama family have a reference here",
            "use a gpt or llama config (configs/gpt2-124m.toml, configs/llama-3.2-1b.toml)")
    if m["kind"] == "llama":
        explicit = "position" in raw.get("model", {}) or \
            any(o.startswith("model.position=") for o in overrides)
        if explicit and m["position"] != "rope":
            die("the Llama family encodes positions with RoPE only", "remove model.position")
        m["position"] = "rope"
        m["rope_scaling"] = rope_scaling(m["rope_scaling"])
        if m["n_head"] % (m["n_kv_head"] or m["n_head"]):
            die(f"n_head = {m['n_head']} is not a multiple of n_kv_head = {m['n_kv_head']}",
                "choose n_kv_head dividing n_head")
    return cfg


def rope_scaling(value):
    """model.rope_scaling as remat-train reads it: "none"/"default", or llama3's table."""
    if isinstance(value, str) and value in ("none", "default"):
        return None
    if not isinstance(value, dict):
        die(f"model.rope_scaling = {value!r}: expected a table or \"none\"",
            'write { rope_type = "llama3", factor = 8.0, ... } or "none"')
    kind = value.get("rope_type", value.get("type"))
    if kind in ("none", "default"):
        return None
    if kind != "llama3" or "factor" not in value or \
            "original_max_position_embeddings" not in value:
        die(f"model.rope_scaling = {value}: only llama3 with factor and "
            "original_max_position_embeddings is known", "use the model's config.json values")
    return {"factor": float(value["factor"]),
            "low_freq_factor": float(value.get("low_freq_factor", 1.0)),
            "high_freq_factor": float(value.get("high_freq_factor", 4.0)),
            "original": float(value["original_max_position_embeddings"])}


# ---- the model (names as remat-train's model.safetensors) ----

def rope_inv_freq(HS, theta, scaling, device):
    """theta^(-2i/HS) for i < HS/2 in float64, then transformers' llama3 rescaling
    (_compute_llama3_parameters): wavelengths longer than original / low_freq_factor divided by
    factor, shorter than original / high_freq_factor kept, those between blended."""
    i = torch.arange(HS // 2, dtype=torch.float64, device=device)
    inv = theta ** (-2.0 * i / HS)
    if scaling is None:
        return inv
    factor, low, high, old = (scaling[k] for k in ("factor", "low_freq_factor",
                                                   "high_freq_factor", "original"))
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old / high) & (wavelen <= old / low)
    return torch.where(medium, blended, scaled)


def rope_tables(T, HS, theta, device, scaling=None):
    """cos, sin of angle t * inv_freq[i] for the pairs (i, i + HS/2), float32 (T, HS/2)."""
    ang = torch.arange(T, dtype=torch.float64, device=device)[:, None] * \
        rope_inv_freq(HS, theta, scaling, device)
    return torch.cos(ang).float(), torch.sin(ang).float()


def apply_rope(x, cos, sin):
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    c, s = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([a * c - b * s, a * s + b * c], dim=-1)


def causal_attention(q, k, v):
    """q (B, H, T, HS), k and v (B, KVH, T, HS). SDPA picks a flash / memory-efficient kernel;
    before torch 2.0 the explicit T x T softmax is all PyTorch has. Grouped-query attention: SDPA's
    enable_gqa where its flash kernel takes it (CUDA, 16-bit, torch >= 2.5), else each key/value
    head repeated for its g query heads (transformers' repeat_kv)."""
    g = q.shape[1] // k.shape[1]
    if g > 1:
        if HAS_SDPA and HAS_GQA and q.is_cuda and q.dtype in (torch.bfloat16, torch.float16):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    if HAS_SDPA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.shape[-2]
    scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v


class Attention(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.n_head = H
        self.qkv = nn.Linear(C, 3 * C)  # q, k, v; heads contiguous in each
        self.proj = nn.Linear(C, C)

    def forward(self, h, rope):
        B, T, C = h.shape
        H = self.n_head
        q, k, v = (t.reshape(B, T, H, C // H).transpose(1, 2) for t in self.qkv(h).split(C, -1))
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        return self.proj(causal_attention(q, k, v).transpose(1, 2).reshape(B, T, C))


class Mlp(nn.Module):
    def __init__(self, C, FF):
        super().__init__()
        self.fc = nn.Linear(C, FF)
        self.proj = nn.Linear(FF, C)

    def forward(self, h):
        return self.proj(F.gelu(self.fc(h), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, C, H, FF, dropout):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(C, eps=LN_EPS), Attention(C, H)
        self.ln2, self.mlp = nn.LayerNorm(C, eps=LN_EPS), Mlp(C, FF)
        self.dropout = dropout

    def forward(self, x, rope):
        x = x + F.dropout(self.attn(self.ln1(x), rope), self.dropout, self.training)
        return x + F.dropout(self.mlp(self.ln2(x)), self.dropout, self.training)


class Gpt(nn.Module):
    def __init__(self, m, remat, loss_chunk):
        super().__init__()
        C, L, V = m["n_embd"], m["n_layer"], m["vocab_size"]
        FF = m["d_ff"] or 4 * C
        self.m, self.remat, self.loss_chunk = m, remat, loss_chunk
        self.wte = nn.Parameter(torch.empty(V, C))
        self.wpe = nn.Parameter(torch.empty(m["n_ctx"], C)) if m["position"] == "learned" else None
        self.blocks = nn.ModuleList(Block(C, m["n_head"], FF, m["dropout"]) for _ in range(L))
        self.lnf = nn.LayerNorm(C, eps=LN_EPS)
        self._rope = {}
        self.init_weights()

    def init_weights(self):
        """GPT-2's, as remat-train's: N(0, 0.02), residual projections / sqrt(2L), wpe
        N(0, 0.01), LayerNorms 1 and 0, biases 0."""
        resid = 0.02 / math.sqrt(2 * len(self.blocks))
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.ones_(p) if ".ln" in name or name.startswith("lnf") else nn.init.zeros_(p)
            else:
                std = 0.01 if name == "wpe" else resid if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def rope(self, T, device):
        if self.wpe is not None:
            return None
        key = (T, str(device))
        if key not in self._rope:  # built once per length, like a registered buffer
            C, H = self.m["n_embd"], self.m["n_head"]
            self._rope = {key: rope_tables(T, C // H, float(self.m["rope_theta"]), device)}
        return self._rope[key]

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = F.embedding(idx, self.wte)
        if self.wpe is not None:
            x = x + self.wpe[:T]
        rope = self.rope(T, idx.device)
        for block in self.blocks:
            x = self.remat(block, x, rope)
        return lm_loss(self.lnf(x), self.wte, targets, self.loss_chunk)


def chunk_loss(h, wte, targets):
    return F.cross_entropy(F.linear(h, wte).float(), targets, reduction="sum")


def lm_loss(x, wte, targets, chunk):
    """Mean cross-entropy of the tied head. At long context the (B*T, V) logits would be the
    largest tensor of the step, so rows go in checkpointed chunks whose logits are recomputed in
    the backward pass (what remat-train's fused head avoids storing, too)."""
    h, t = x.reshape(-1, x.shape[-1]), targets.reshape(-1)
    n = t.numel()
    if chunk >= n:
        return chunk_loss(h, wte, t) / n
    total = 0.0
    for i in range(0, n, chunk):
        total = total + ckpt.checkpoint(chunk_loss, h[i:i + chunk], wte, t[i:i + chunk],
                                        use_reentrant=False)
    return total / n


# ---- the Llama family (names as remat-train's layers/llama_model.cpp) ----

class RmsNorm(nn.Module):
    """transformers' LlamaRMSNorm: statistics in f32, the normalized row cast back to the input's
    dtype, then times the weight."""

    def __init__(self, C, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(C))
        self.eps = eps

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class LlamaAttention(nn.Module):
    def __init__(self, C, H, KVH, HS, bias, qk_norm, eps, split_qkv):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_size = H, KVH, HS
        self.split_qkv = split_qkv
        if split_qkv:  # LoRA: transformers' three projections, each taking its own adapter
            self.q_proj = nn.Linear(C, H * HS, bias=bias)
            self.k_proj = nn.Linear(C, KVH * HS, bias=bias)
            self.v_proj = nn.Linear(C, KVH * HS, bias=bias)
        else:
            self.qkv = nn.Linear(C, (H + 2 * KVH) * HS, bias=bias)  # rows q | k | v
        if qk_norm:
            self.q_norm, self.k_norm = RmsNorm(HS, eps), RmsNorm(HS, eps)
        self.qk_norm = qk_norm
        self.proj = nn.Linear(H * HS, C, bias=False)

    def forward(self, h, rope):
        B, T, _ = h.shape
        H, KVH, HS = self.n_head, self.n_kv_head, self.head_size
        if self.split_qkv:
            q, k, v = self.q_proj(h), self.k_proj(h), self.v_proj(h)
        else:
            q, k, v = self.qkv(h).split([H * HS, KVH * HS, KVH * HS], -1)
        q, k, v = q.view(B, T, H, HS), k.view(B, T, KVH, HS), v.view(B, T, KVH, HS)
        if self.qk_norm:  # Qwen3: per head, before RoPE
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        return self.proj(causal_attention(q, k, v).transpose(1, 2).reshape(B, T, H * HS))


class SwiGluMlp(nn.Module):
    def __init__(self, C, FF):
        super().__init__()
        self.gate = nn.Linear(C, FF, bias=False)
        self.up = nn.Linear(C, FF, bias=False)
        self.down = nn.Linear(FF, C, bias=False)

    def forward(self, h):
        return self.down(F.silu(self.gate(h)) * self.up(h))


class LlamaBlock(nn.Module):
    def __init__(self, m, C, HS, FF, split_qkv):
        super().__init__()
        H, eps = m["n_head"], float(m["norm_eps"])
        self.norm1 = RmsNorm(C, eps)
        self.attn = LlamaAttention(C, H, m["n_kv_head"] or H, HS, m["attention_bias"],
                                   m["qk_norm"], eps, split_qkv)
        self.norm2 = RmsNorm(C, eps)
        self.mlp = SwiGluMlp(C, FF)

    def forward(self, x, rope):
        x = x + self.attn(self.norm1(x), rope)
        return x + self.mlp(self.norm2(x))


class Llama(nn.Module):
    def __init__(self, m, remat, loss_chunk, split_qkv=False):
        super().__init__()
        C, L, V = m["n_embd"], m["n_layer"], m["vocab_size"]
        self.head_size = m["head_dim"] or C // m["n_head"]
        self.m, self.remat, self.loss_chunk = m, remat, loss_chunk
        self.split_qkv = split_qkv
        self.wte = nn.Parameter(torch.empty(V, C))
        self.blocks = nn.ModuleList(LlamaBlock(m, C, self.head_size, m["d_ff"] or 4 * C,
                                               split_qkv) for _ in range(L))
        self.normf = RmsNorm(C, float(m["norm_eps"]))
        self.lm_head = None if m["tie_embeddings"] else nn.Linear(C, V, bias=False)
        self._rope = {}
        self.init_weights()

    def init_weights(self):
        """transformers' _init_weights, as remat-train's: N(0, 0.02) for every matrix, norms 1,
        biases 0."""
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith("norm1.weight") or name.endswith("norm2.weight") or \
                    name.endswith("_norm.weight") or name == "normf.weight":
                nn.init.ones_(p)
            else:
                nn.init.zeros_(p)

    def fused_rows(self):
        """With q, k and v split (LoRA), remat-train's fused weight (and bias) of each block by
        the parameters its rows q | k | v load into."""
        if not self.split_qkv:
            return {}
        H, KVH = self.m["n_head"], self.m["n_kv_head"] or self.m["n_head"]
        rows = [H * self.head_size, KVH * self.head_size, KVH * self.head_size]
        out = {}
        for l in range(len(self.blocks)):
            for kind in ["weight"] + (["bias"] if self.m["attention_bias"] else []):
                out[f"blocks.{l}.attn.qkv.{kind}"] = [
                    (f"blocks.{l}.attn.{x}_proj.{kind}", n) for x, n in zip("qkv", rows)]
        return out

    def rope(self, T, device):
        key = (T, str(device))
        if key not in self._rope:
            self._rope = {key: rope_tables(T, self.head_size, float(self.m["rope_theta"]),
                                           device, self.m["rope_scaling"])}
        return self._rope[key]

    def forward(self, idx, targets):
        x = F.embedding(idx, self.wte)
        rope = self.rope(idx.shape[1], idx.device)
        for block in self.blocks:
            x = self.remat(block, x, rope)
        head = self.wte if self.lm_head is None else self.lm_head.weight
        return lm_loss(self.normf(x), head, targets, self.loss_chunk)


MODELS = {"gpt": Gpt, "llama": Llama}


# ---- LoRA with peft (docs/lora.md; the modules as remat-train's engine/config/lora.cpp) ----

def lora_modules(m):
    """transformers' modules that [lora] can name, with this script's module (or bare parameter)
    for each: (transformers' name, ours, kind, in, out). kind is "linear" (an adapter site of a
    block), "module" or "param" (trained whole: modules_to_save), or "tied" (an embedding or head
    tied to the other, which peft would split; remat-train refuses it)."""
    C, L, FF = m["n_embd"], m["n_layer"], m["d_ff"] or 4 * m["n_embd"]
    gpt = m["kind"] == "gpt"
    root = "transformer" if gpt else "model"
    out = []
    if gpt:
        out.append((f"{root}.wte", "wte", "tied", 0, 0))
        if m["position"] == "learned":
            out.append((f"{root}.wpe", "wpe", "param", 0, 0))
    else:
        out.append((f"{root}.embed_tokens", "wte", "tied" if m["tie_embeddings"] else "param",
                    0, 0))
    H = m["n_head"]
    HS = C // H if gpt else m["head_dim"] or C // H
    Q, KV = H * HS, (m["n_kv_head"] or H) * HS
    for l in range(L):
        t, o = f"{root}.{'h' if gpt else 'layers'}.{l}", f"blocks.{l}."
        if gpt:  # c_attn is one module in transformers too: one adapter on the fused q|k|v
            out += [(t + ".ln_1", o + "ln1", "module", 0, 0),
                    (t + ".attn.c_attn", o + "attn.qkv", "linear", C, 3 * C),
                    (t + ".attn.c_proj", o + "attn.proj", "linear", C, C),
                    (t + ".ln_2", o + "ln2", "module", 0, 0),
                    (t + ".mlp.c_fc", o + "mlp.fc", "linear", C, FF),
                    (t + ".mlp.c_proj", o + "mlp.proj", "linear", FF, C)]
            continue
        out += [(t + ".self_attn.q_proj", o + "attn.q_proj", "linear", C, Q),
                (t + ".self_attn.k_proj", o + "attn.k_proj", "linear", C, KV),
                (t + ".self_attn.v_proj", o + "attn.v_proj", "linear", C, KV),
                (t + ".self_attn.o_proj", o + "attn.proj", "linear", Q, C)]
        if m["qk_norm"]:
            out += [(t + ".self_attn.q_norm", o + "attn.q_norm", "module", 0, 0),
                    (t + ".self_attn.k_norm", o + "attn.k_norm", "module", 0, 0)]
        out += [(t + ".mlp.gate_proj", o + "mlp.gate", "linear", C, FF),
                (t + ".mlp.up_proj", o + "mlp.up", "linear", C, FF),
                (t + ".mlp.down_proj", o + "mlp.down", "linear", FF, C),
                (t + ".input_layernorm", o + "norm1", "module", 0, 0),
                (t + ".post_attention_layernorm", o + "norm2", "module", 0, 0)]
    if gpt:
        out += [(f"{root}.ln_f", "lnf", "module", 0, 0), ("lm_head", "wte", "tied", 0, 0)]
    else:
        out.append((f"{root}.norm", "normf", "module", 0, 0))
        out.append(("lm_head", "wte" if m["tie_embeddings"] else "lm_head",
                    "tied" if m["tie_embeddings"] else "module", 0, 0))
    return out


def lora_choice(m, lora):
    """The adapter sites and the modules trained whole that [lora] selects, by peft 0.17's rules
    on transformers' names: a target t adapts each linear named t or ending in ".t" ([] = every
    linear of the blocks); a modules_to_save entry trains each module whose PeftModel name
    ("base_model.model." + name) ends in it."""
    mods = lora_modules(m)
    linears = [x for x in mods if x[2] == "linear"]
    sites = linears if not lora["targets"] else []
    for t in lora["targets"]:
        hit = [x for x in linears if x[0] == t or x[0].endswith("." + t)]
        if not hit:
            die(f"lora.targets: '{t}' names no linear of a block of this {m['kind']} model",
                "use transformers' names: " + ("c_attn, c_proj, c_fc" if m["kind"] == "gpt" else
                                               "q_proj, k_proj, v_proj, o_proj, gate_proj, "
                                               "up_proj, down_proj"))
        sites += [x for x in hit if x not in sites]
    saved = []
    for n in lora["modules_to_save"]:
        hit = [x for x in mods if x[2] != "linear" and ("base_model.model." + x[0]).endswith(n)]
        if not hit or any(x[2] == "tied" for x in hit):
            what = "a tied embedding or head" if hit else "no embedding, norm or head"
            die(f"lora.modules_to_save: '{n}' selects {what}",
                "name the modules as remat-train accepts them (docs/lora.md)")
        saved += [x for x in hit if x not in saved]
    return [x for x in linears if x in sites], [x for x in mods if x in saved]


def require_peft(lora):
    """peft, or one line naming the fix (before any work)."""
    if lora["base"] != "fp32":
        die(f"lora.base = \"{lora['base']}\": this reference trains adapters over an fp32 base "
            "only (peft over nn.Linear; a bf16 or NF4 base is bitsandbytes' business)",
            "remove lora.base")
    try:
        import peft  # noqa: F401  (imported where used)
    except ImportError:
        die(f"lora.rank = {lora['rank']} trains adapters with peft, which {sys.executable} "
            "cannot import", "scripts/make-hf-venv.sh makes a venv with torch and peft; run this "
            "script with its python (side_by_side.py: --torch-python /work/venv-hf/bin/python)")


def apply_lora(model, lora, choice):
    """The base frozen, peft's adapters on the chosen linears and the chosen modules trained
    whole, as a peft user writes it (LoraConfig + get_peft_model). peft's matching is handed our
    modules' exact names, so that it adapts exactly the modules transformers' names select."""
    import peft
    sites, saved = choice
    config = peft.LoraConfig(
        r=lora["rank"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"],
        use_rslora=lora["rslora"], target_modules=[x[1] for x in sites], bias="none",
        modules_to_save=[x[1] for x in saved if x[2] == "module"] or None)
    net = peft.get_peft_model(model, config)
    # An embedding here is a bare nn.Parameter, which peft's modules_to_save (a module wrapper
    # training a copy) cannot take: it trains in place, the same arithmetic.
    for x in saved:
        if x[2] == "param":
            getattr(model, x[1]).requires_grad_(True)
    return net


def load_adapter(path, model, lora, choice):
    """A PEFT adapter folder (adapter_config.json, adapter_model.safetensors; transformers'
    names, as remat-train's `export --adapter` writes and `train --init-adapter` reads) into the
    adapters and the modules trained whole."""
    from safetensors.torch import load_file
    try:
        conf = json.load(open(os.path.join(path, "adapter_config.json")))
        tensors = load_file(os.path.join(path, "adapter_model.safetensors"))
    except (OSError, ValueError) as e:
        die(f"--init-adapter {path}: not a PEFT adapter folder ({e})",
            "pass a folder of remat-train export --adapter (or peft's save_pretrained)")
    for key, ours in (("r", lora["rank"]), ("lora_alpha", lora["alpha"]),
                      ("use_rslora", lora["rslora"])):
        if conf.get(key) != ours:
            die(f"--init-adapter {path}: {key} = {conf.get(key)} but the config's [lora] says "
                f"{ours}", "set the [lora] key to the adapter's")
    dest = {}
    for hf, ours, kind, _, _ in choice[0]:
        layer = model.get_submodule(ours)
        for ab in ("lora_A", "lora_B"):
            dest[f"base_model.model.{hf}.{ab}.weight"] = getattr(layer, ab)["default"].weight
    for hf, ours, kind, _, _ in choice[1]:
        if kind == "param":
            dest[f"base_model.model.{hf}.weight"] = getattr(model, ours)
        else:
            for n, p in model.get_submodule(ours).modules_to_save["default"].named_parameters():
                dest[f"base_model.model.{hf}.{n}"] = p
    if set(tensors) != set(dest):
        diff = sorted(set(tensors) ^ set(dest))[:3]
        die(f"--init-adapter {path}: its tensors are not the config's adapters ({', '.join(diff)})",
            "use the [lora] table the adapter was trained with")
    with torch.no_grad():
        for name, t in tensors.items():
            if t.shape != dest[name].shape:
                die(f"--init-adapter {path}: {name} is {list(t.shape)}, the model wants "
                    f"{list(dest[name].shape)}",
                    "use the [lora] table the adapter was trained with")
            dest[name].copy_(t.float())


# ---- activation checkpointing ----

def sdpa_ops():
    names = ["_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu"]
    return {getattr(torch.ops.aten, n).default for n in names if hasattr(torch.ops.aten, n)}


def remat_fn(policy):
    """How each block runs: as is, checkpointed, or checkpointed saving some ops' outputs."""
    if policy == "none":
        return lambda block, x, rope: block(x, rope)
    if policy == "full":
        return lambda block, x, rope: ckpt.checkpoint(block, x, rope, use_reentrant=False)
    if not HAS_SAC:
        die(f"policy {policy} is selective activation checkpointing, which needs torch >= 2.4 "
            f"(torch.utils.checkpoint.create_selective_checkpoint_contexts); this is torch "
            f"{torch.__version__}", "use --policy none or full, or a newer PyTorch")
    aten = torch.ops.aten
    save = sdpa_ops()
    if policy == "save_dots":  # JAX's dots_saveable: every GEMM output and attention
        save |= {aten.mm.default, aten.addmm.default, aten.bmm.default}

    def decide(ctx, op, *args, **kwargs):
        return (ckpt.CheckpointPolicy.MUST_SAVE if op in save
                else ckpt.CheckpointPolicy.PREFER_RECOMPUTE)

    context = functools.partial(ckpt.create_selective_checkpoint_contexts, decide)
    return lambda block, x, rope: ckpt.checkpoint(block, x, rope, use_reentrant=False,
                                                  context_fn=context)


# ---- weights, optimizer, schedule ----

def load_safetensors(path, model):
    """remat-train's model.safetensors (f32, names as the model's) into `model`, checked."""
    if os.path.isdir(path) and not os.path.exists(os.path.join(path, "model.safetensors")):
        steps = sorted(glob.glob(os.path.join(path, "step_*")))  # a checkpoint.dir: its newest
        path = steps[-1] if steps else path
    if os.path.isdir(path):
        path = os.path.join(path, "model.safetensors")
    try:
        blob = bytearray(open(path, "rb").read())
        (n,) = struct.unpack("<Q", blob[:8])
        header = json.loads(blob[8:8 + n])
    except (OSError, ValueError, struct.error) as e:
        die(f"--init {path}: not a readable safetensors file ({e})",
            "pass a remat-train checkpoint folder or its model.safetensors")
    header.pop("__metadata__", None)
    want = model.state_dict()
    # A Llama under LoRA holds q, k and v apart: the file's fused rows are split into them.
    fused = model.fused_rows() if hasattr(model, "fused_rows") else {}
    parts = {p for ps in fused.values() for p, _ in ps}
    shapes = {k: list(v.shape) for k, v in want.items() if k not in parts}
    for name, ps in fused.items():
        shapes[name] = [sum(r for _, r in ps)] + list(want[ps[0][0]].shape[1:])
    if set(header) != set(shapes):
        diff = sorted(set(header) ^ set(shapes))[:4]
        die(f"--init {path}: parameter names differ from the config's model ({', '.join(diff)})",
            "use the config the checkpoint was trained with (model.position, n_layer)")
    with torch.no_grad():
        for name, t in header.items():
            a, b = t["data_offsets"]
            if t["dtype"] != "F32" or list(t["shape"]) != shapes[name]:
                die(f"--init {path}: {name} is {t['dtype']} {t['shape']}, the model wants F32 "
                    f"{shapes[name]}", "use the config the checkpoint was trained with")
            src = torch.frombuffer(blob, dtype=torch.float32, offset=8 + n + a,
                                   count=(b - a) // 4).reshape(t["shape"])
            if name in fused:
                for part, rows in zip((p for p, _ in fused[name]),
                                      src.split([r for _, r in fused[name]])):
                    want[part].copy_(rows)
            else:
                want[name].copy_(src)


def make_optimizer(params, train, device):
    """AdamW over the parameters that train (under LoRA the adapters and the modules trained
    whole), decay on 2-D weights only; the fused kernel where this torch has one for the device
    (CUDA from 2.0, CPU from 2.4), else the multi-tensor (foreach) one."""
    decay = train["weight_decay"]
    groups = [{"params": [p for p in params if p.dim() == 2], "weight_decay": decay},
              {"params": [p for p in params if p.dim() != 2], "weight_decay": 0.0}]
    fused_ok = TORCH >= (2, 0) if device.type == "cuda" else TORCH >= (2, 4)
    for kind in (["fused"] if fused_ok else []) + ["foreach"]:
        try:
            return torch.optim.AdamW(groups, lr=train["lr"], betas=BETAS, eps=ADAM_EPS,
                                     **{kind: True}), kind
        except (TypeError, RuntimeError):
            continue
    return torch.optim.AdamW(groups, lr=train["lr"], betas=BETAS, eps=ADAM_EPS), "single-tensor"


def learning_rate(train, s):
    """remat-train's: linear warmup over warmup_steps, then cosine from lr to lr * min_lr_ratio."""
    lr, warmup, steps = train["lr"], train["warmup_steps"], train["steps"]
    if s < warmup:
        return lr * (s + 1) / warmup
    decay = steps - warmup
    if decay <= 1:
        return lr
    lo = lr * train["min_lr_ratio"]
    return lo + 0.5 * (lr - lo) * (1 + math.cos(math.pi * (s - warmup) / (decay - 1)))


# ---- data ----

def read_shard(path, V):
    try:
        blob = bytearray(open(path, "rb").read())
    except OSError as e:
        die(f"cannot read token shard {path}: {e.strerror}", "check --tokens / data.path")
    if len(blob) < 1024:
        die(f"{path}: shorter than the 1024-byte header", "pass an llm.c token shard")
    magic, version, n = struct.unpack("<3i", blob[:12])
    if magic != SHARD_MAGIC or version != SHARD_VERSION:
        die(f"{path}: bad magic {magic} / version {version} (a token shard starts with "
            f"{SHARD_MAGIC}, 1)", "regenerate it with an llm.c-format tokenizer")
    if len(blob) != 1024 + 2 * n:
        die(f"{path}: {len(blob)} bytes for {n} tokens (expected {1024 + 2 * n})",
            "the shard is truncated: regenerate it")
    tokens = torch.frombuffer(blob, dtype=torch.int16, offset=1024, count=n).to(torch.int32)
    tokens = tokens & 0xFFFF  # the uint16 tokens, read as int16 (older torch has no uint16)
    if n and int(tokens.max()) >= V:
        die(f"{path}: token {int(tokens.max())} is outside the vocabulary "
            f"(model.vocab_size = {V})", f"raise model.vocab_size to {int(tokens.max()) + 1}")
    return tokens


def shard_paths(spec):
    paths = []
    for s in [spec] if isinstance(spec, str) else spec:
        if os.path.isdir(s):
            paths += sorted(glob.glob(os.path.join(s, "*.bin")))
        else:
            paths += sorted(glob.glob(s)) or [s]
    return list(dict.fromkeys(paths))


class TokenWindows:
    """remat-train's windows of seq_len + 1 tokens of one shard. Sequential order is the
    binary's exactly (stride seq_len, row r = step * B + row takes window r mod n_windows);
    random order draws starts from torch's generator, not remat-train's counter RNG."""

    def __init__(self, paths, V, T, B, order, seed):
        self.shards = [read_shard(p, V) for p in paths]
        self.T, self.B, self.order, self.seed = T, B, order, seed
        self.windows = [(i, k * T) for i, s in enumerate(self.shards)
                        for k in range(max(0, (s.numel() - 1) // T))]
        self.starts = [(i, s.numel() - T) for i, s in enumerate(self.shards) if s.numel() > T]
        if not self.windows:
            die(f"the token data is shorter than one window (seq_len + 1 = {T + 1} tokens)",
                "lower train.seq_len, or add data")

    def window(self, step, row):
        r = step * self.B + row
        if self.order == "sequential":
            return self.windows[r % len(self.windows)]
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + r)
        total = sum(n for _, n in self.starts)
        k = int(torch.randint(total, (1,), generator=g))
        for i, n in self.starts:
            if k < n:
                return i, k
            k -= n

    def batch(self, step):
        rows = []
        for row in range(self.B):
            i, start = self.window(step, row)
            rows.append(self.shards[i][start:start + self.T + 1])
        w = torch.stack(rows).long()
        return w[:, :-1], w[:, 1:]


class RandomTokens:
    """Uniform random tokens, seeded per step: throughput runs (the loss stays near ln V)."""

    def __init__(self, V, T, B, seed):
        self.V, self.T, self.B, self.seed = V, T, B, seed

    def batch(self, step):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        w = torch.randint(self.V, (self.B, self.T + 1), generator=g)
        return w[:, :-1], w[:, 1:]


def make_data(cfg, args, T, B):
    V, seed = cfg["model"]["vocab_size"], cfg["train"]["seed"]
    spec = args.tokens or (cfg["data"]["path"] if cfg["data"]["source"] == "tokens" else None)
    if spec:
        paths = shard_paths(spec)
        return TokenWindows(paths, V, T, B, cfg["data"]["order"], seed), \
            f"tokens: {', '.join(paths)}, {cfg['data']['order']} windows of {T + 1}"
    return RandomTokens(V, T, B, seed), f"random tokens (seed {seed})"


# ---- measuring ----

def model_flops(m, B, T, lora=None, choice=None):
    """MFU's count, as remat-train's: 3x every forward GEMM (2*M*N*K) and causal attention's two
    GEMMs over T(T+1)/2 pairs per query head, plus the LM head's forward, also 3x. The Llama
    family's qkv GEMM is (H + 2 KVH) * HS wide and its MLP has three GEMMs (gate, up, down).
    Under LoRA (docs/lora.md) a frozen weight's gradient is no part of the work: the base's GEMMs
    count 2x (the forward and the input gradient), attention 3x, the adapters' 3x (their forward
    is 2 N r (in + out)), the LM head 2x unless it trains whole (modules_to_save)."""
    gemms, attention = block_flops(m, B, T)
    L, N, C, V = m["n_layer"], B * T, m["n_embd"], m["vocab_size"]
    if lora is None:
        return 3 * (L * (gemms + attention) + 2 * N * C * V)
    adapters = sum(2 * N * lora["rank"] * (i + o) for _, _, _, i, o in choice[0])
    head = 3 if any(x[0] == "lm_head" for x in choice[1]) else 2
    return L * (2 * gemms + 3 * attention) + 3 * adapters + head * 2 * N * C * V


def block_flops(m, B, T):
    """One block's forward FLOPs: its GEMMs', and causal attention's."""
    C, H = m["n_embd"], m["n_head"]
    FF, N = m["d_ff"] or 4 * C, B * T
    if m["kind"] == "llama":
        HS = m["head_dim"] or C // H
        KVH = m["n_kv_head"] or H
        gemms = 2 * N * C * (H + 2 * KVH) * HS + 2 * N * H * HS * C + 3 * 2 * N * C * FF
    else:
        HS = C // H
        gemms = 2 * N * C * (3 * C) + 2 * N * C * C + 2 * N * C * FF + 2 * N * FF * C
    return gemms, 2 * 2 * HS * B * H * T * (T + 1) / 2


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_memory(device, rss_before):
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "torch.cuda.max_memory_allocated"
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return peak - rss_before, f"RSS: peak over the {rss_before / 2**20:.0f} MiB before the model"


def parse_bytes(text):
    m = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]?)(i?)B?\s*", text, re.I)
    if not m:
        die(f"--cap {text}: not a size", "write e.g. --cap 40GiB")
    scale = (1024 if m.group(3) else 1000) ** "_KMGT".index(m.group(2).upper() or "_")
    return int(float(m.group(1)) * scale)


def fmt_flops(n, unit=""):
    return f"{n / 1e12:.3f} TFLOP{unit}" if n >= 1e12 else f"{n / 1e9:.3f} GFLOP{unit}"


def fmt_bytes(n):
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


# ---- training ----

class Trainer:
    def __init__(self, cfg, args, device, dtype):
        self.cfg, self.args, self.device = cfg, args, device
        self.train = cfg["train"]
        self.autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) \
            if dtype == "bf16" else contextlib.nullcontext
        self.offload = (lambda: torch.autograd.graph.save_on_cpu(pin_memory=True)) \
            if args.offload else contextlib.nullcontext

    def build(self, loss_chunk):
        m, lora = self.cfg["model"], self.cfg["lora"]
        # Under LoRA a Llama's q, k and v are three modules (three adapters, as transformers').
        split = {"split_qkv": True} if lora["rank"] > 0 and m["kind"] == "llama" else {}
        self.model = MODELS[m["kind"]](m, remat_fn(self.args.policy), loss_chunk,
                                       **split).to(self.device)
        if self.args.init:
            load_safetensors(self.args.init, self.model)
        self.n_params = sum(p.numel() for p in self.model.parameters())
        net, self.lora_choice = self.model, None
        if lora["rank"] > 0:
            self.lora_choice = lora_choice(m, lora)
            net = apply_lora(self.model, lora, self.lora_choice).to(self.device)
            if self.args.init_adapter:
                load_adapter(self.args.init_adapter, self.model, lora, self.lora_choice)
        self.forward = torch.compile(net) if self.args.compile else net
        self.params = [p for p in net.parameters() if p.requires_grad]
        self.opt, self.opt_kind = make_optimizer(self.params, self.train, self.device)

    def step(self, s, data):
        """One optimizer step; returns loss, grad_norm, lr, ms. The data is part of the step."""
        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        sync()
        t0 = time.perf_counter()
        lr = learning_rate(self.train, s)
        for g in self.opt.param_groups:
            g["lr"] = lr
        idx, tgt = data.batch(s)
        idx, tgt = idx.to(self.device, non_blocking=True), tgt.to(self.device, non_blocking=True)
        with self.autocast(), self.offload():
            loss = self.forward(idx, tgt)
        loss.backward()
        clip = self.train["grad_clip"]
        norm = torch.nn.utils.clip_grad_norm_(self.params, clip if clip > 0 else float("inf"))
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        sync()
        ms = (time.perf_counter() - t0) * 1e3
        return float(loss.detach()), float(norm), lr, ms


def pick_device(cfg, args):
    name = args.device or {"auto": "cuda" if torch.cuda.is_available() else "cpu"}.get(
        cfg["device"]["backend"], cfg["device"]["backend"])
    if name not in ("cpu", "cuda"):
        die(f"device {name}: unknown", "pass --device cpu or --device cuda")
    if name == "cuda" and not torch.cuda.is_available():
        die(f"no CUDA device for this torch {torch.__version__}",
            "pass --device cpu, or install a CUDA build of PyTorch")
    return torch.device(name)


def default_loss_chunk(cfg, B, T):
    """train.loss_chunk when set; else all rows at once while the logits stay under 1 GiB
    (fp32), and chunks of 256 MiB of logits above that."""
    V, n = cfg["model"]["vocab_size"], B * T
    if cfg["train"]["loss_chunk"] > 0:
        return cfg["train"]["loss_chunk"]
    return n if n * V * 4 <= 2**30 else max(64, (2**28 // (4 * V)) // 64 * 64)


def attention_path(m=None, device=None, dtype=None):
    if m and m["kind"] == "llama" and (m["n_kv_head"] or m["n_head"]) != m["n_head"]:
        gqa = HAS_SDPA and HAS_GQA and device is not None and device.type == "cuda" and \
            dtype == "bf16"
        return ("F.scaled_dot_product_attention(is_causal=True, enable_gqa=True)" if gqa else
                f"{attention_path()} over K/V heads repeat_interleave'd for grouped queries")
    if HAS_SDPA:
        return "F.scaled_dot_product_attention(is_causal=True)"
    return (f"explicit causal softmax over T x T (torch {torch.__version__} has no "
            "F.scaled_dot_product_attention; it came in 2.0)")


def describe_model(m):
    if m["kind"] == "gpt":
        return (f"gpt L={m['n_layer']} H={m['n_head']} C={m['n_embd']} V={m['vocab_size']} "
                f"({m['position']} positions)")
    H, C = m["n_head"], m["n_embd"]
    s = m["rope_scaling"]
    extras = [f"rope theta {m['rope_theta']:g}" + (f" llama3 x{s['factor']:g}" if s else "")]
    extras += [k for k in ("attention_bias", "qk_norm") if m[k]]
    extras.append("tied head" if m["tie_embeddings"] else "own lm_head")
    return (f"llama L={m['n_layer']} H={H}/{m['n_kv_head'] or H} C={C} "
            f"HS={m['head_dim'] or C // H} FF={m['d_ff'] or 4 * C} V={m['vocab_size']} "
            f"({', '.join(extras)})")


def describe_lora(lora, trainer):
    """' | LoRA r 16 (alpha 16) on 210 linears (peft 0.17.1), 4.88M trainable', or ''."""
    if trainer.lora_choice is None:
        return ""
    import peft
    sites, saved = trainer.lora_choice
    extras = "".join([", rslora" if lora["rslora"] else "",
                      f", dropout {lora['dropout']:g}" if lora["dropout"] else "",
                      f", {len(saved)} modules whole" if saved else ""])
    trainable = sum(p.numel() for p in trainer.params)
    return (f" | LoRA r {lora['rank']} (alpha {lora['alpha']:g}{extras}) on {len(sites)} "
            f"linears (peft {peft.__version__}), {trainable / 1e6:.3f}M trainable")


def banner(cfg, args, device, dtype, trainer, T, B, data_desc, out):
    m = cfg["model"]
    n_params = trainer.n_params
    threads = torch.get_num_threads() if device.type == "cpu" else "-"
    dev = f"cpu, {threads} threads" if device.type == "cpu" else \
        f"cuda: {torch.cuda.get_device_name(device)}"
    print(f"torch_reference  torch {torch.__version__} | {dev} | {dtype}"
          f"{' (autocast, fp32 master weights)' if dtype == 'bf16' else ''} | policy "
          f"{args.policy}{' + save_on_cpu offload' if args.offload else ''}"
          f"{' | torch.compile' if args.compile else ''}", file=out)
    print(f"attention {attention_path(m, device, dtype)}", file=out)
    chunk = trainer.model.loss_chunk
    loss = "full logits" if chunk >= B * T else f"chunks of {chunk} rows (checkpointed)"
    print(f"model {describe_model(m)} | {n_params / 1e6:.2f}M params"
          f"{describe_lora(cfg['lora'], trainer)} | batch {B} x {T} | AdamW {trainer.opt_kind} | "
          f"loss {loss}", file=out)
    print(f"data {data_desc}", file=out)


def run(cfg, args, device, dtype, out):
    T, B = cfg["train"]["seq_len"], cfg["train"]["batch_size"]
    m = cfg["model"]
    if m["position"] == "learned" and T > m["n_ctx"]:
        die(f"train.seq_len = {T} is longer than model.n_ctx = {m['n_ctx']} (learned positions)",
            "raise model.n_ctx or use model.position = rope")
    rss_before = rss_bytes()
    trainer = Trainer(cfg, args, device, dtype)
    trainer.build(args.loss_chunk or default_loss_chunk(cfg, B, T))
    data, data_desc = make_data(cfg, args, T, B)
    banner(cfg, args, device, dtype, trainer, T, B, data_desc, out)
    steps = []
    for s in range(cfg["train"]["steps"]):
        loss, norm, lr, ms = trainer.step(s, data)
        steps.append({"step": s + 1, "loss": loss, "grad_norm": norm, "lr": lr, "ms": ms})
        print(f"step {s + 1:>5}/{cfg['train']['steps']}  loss {loss:.6f}  lr {lr:.3e}  "
              f"grad_norm {norm:.4f}  {ms:9.1f} ms", file=out, flush=True)
    timed = steps[args.warmup:] or steps[-1:]
    median = statistics.median(s["ms"] for s in timed)
    lora = cfg["lora"] if trainer.lora_choice else None
    flops = model_flops(m, B, T, lora, trainer.lora_choice)
    peak, peak_kind = peak_memory(device, rss_before)
    return {"tool": "torch_reference", "torch": torch.__version__, "device": device.type,
            "threads": torch.get_num_threads(), "dtype": dtype,
            "attention": attention_path(m, device, dtype), "model": describe_model(m),
            "policy": args.policy, "offload": bool(args.offload), "compile": bool(args.compile),
            "optimizer": f"AdamW {trainer.opt_kind}", "seq_len": T, "batch_size": B,
            "params": trainer.n_params,
            "trainable_params": sum(p.numel() for p in trainer.params),
            "lora": lora and {"rank": lora["rank"], "alpha": lora["alpha"],
                              "rslora": lora["rslora"], "dropout": lora["dropout"],
                              "adapted": [x[0] for x in trainer.lora_choice[0]],
                              "trained_whole": [x[0] for x in trainer.lora_choice[1]]},
            "timed_steps": len(timed), "median_step_ms": median,
            "tokens_per_s": B * T / (median / 1e3), "model_flops_per_step": flops,
            "model_tflops": flops / (median / 1e3) / 1e12, "peak_bytes": peak,
            "peak_kind": peak_kind, "steps": steps}


FROZEN_NOTE = "; LoRA: less the frozen weights' gradients"


def print_summary(r, out):
    first = r["steps"][0]["step"] + len(r["steps"]) - r["timed_steps"]
    print(f"median step {r['median_step_ms']:.1f} ms (steps {first}-{r['steps'][-1]['step']}) | "
          f"{r['tokens_per_s']:.0f} tokens/s | model "
          f"{fmt_flops(r['model_flops_per_step'], '/step')} "
          f"(GEMMs + causal attention, x3{FROZEN_NOTE if r['lora'] else ''}) "
          f"-> {fmt_flops(r['model_tflops'] * 1e12, '/s')}",
          file=out)
    print(f"peak memory {fmt_bytes(r['peak_bytes'])} ({r['peak_kind']})", file=out)


# ---- the longest context under a cap (CUDA) ----

def is_oom(e):
    return isinstance(e, getattr(torch.cuda, "OutOfMemoryError", ())) or "out of memory" in str(e)


def try_seq_len(cfg, args, device, dtype, T):
    """Two real steps at seq_len T (the first allocates AdamW's state); the peak, or None."""
    probe = {s: dict(v) for s, v in cfg.items()}
    probe["train"]["seq_len"], probe["train"]["steps"] = T, 2
    trainer, result = Trainer(probe, args, device, dtype), None
    try:
        torch.cuda.reset_peak_memory_stats(device)
        B = probe["train"]["batch_size"]
        trainer.build(args.loss_chunk or default_loss_chunk(probe, B, T))
        data, _ = make_data(probe, args, T, B)
        ms = [trainer.step(s, data)[3] for s in range(2)][-1]
        result = torch.cuda.max_memory_allocated(device), ms
    except RuntimeError as e:
        if not is_oom(e):
            raise
    # Out of the except block, so that the traceback's frames no longer hold the step's tensors.
    trainer = None
    gc.collect()
    torch.cuda.empty_cache()
    return result


def probe_line(T, result):
    if result is None:
        return f"seq_len {T:>9}: OOM"
    return f"seq_len {T:>9}: ran, peak {fmt_bytes(result[0])}, {result[1]:.1f} ms a step"


def longest(cfg, args, device, dtype, out):
    if device.type != "cuda":
        die("--longest needs CUDA (its OOM is the search's signal)", "pass --device cuda")
    cap = parse_bytes(args.cap)
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), device)
    T0, grain = cfg["train"]["seq_len"], args.granularity
    n_ctx = cfg["model"]["n_ctx"] if cfg["model"]["position"] == "learned" else None
    good, bad, T, results = None, None, T0, {}
    start, limit = time.monotonic(), args.time_limit

    def out_of_time():  # --time-limit: no new probe once the search has spent it
        return limit > 0 and time.monotonic() - start > limit

    while bad is None and (n_ctx is None or T <= n_ctx) and not out_of_time():  # doubling
        results[T] = try_seq_len(cfg, args, device, dtype, T)
        print(probe_line(T, results[T]), file=out, flush=True)
        good, bad = (T, bad) if results[T] else (good, T)
        T *= 2
    bounded = bad is None and out_of_time()  # the answer is a lower bound
    if bad is None:
        bad = n_ctx + 1 if n_ctx else T
    lo = good or 0
    while bad - lo > grain and not bounded:  # binary search on multiples of the grain
        if out_of_time():
            bounded = True
            break
        mid = (lo + bad) // 2 // grain * grain
        if mid <= lo:
            break
        results[mid] = try_seq_len(cfg, args, device, dtype, mid)
        print(probe_line(mid, results[mid]), file=out, flush=True)
        lo, bad = (mid, bad) if results[mid] else (lo, mid)
    best = lo if lo and results.get(lo) else None
    return {"tool": "torch_reference", "torch": torch.__version__, "policy": args.policy,
            "dtype": dtype, "offload": bool(args.offload), "cap_bytes": cap,
            "longest_seq_len": best, "peak_bytes": results[best][0] if best else None,
            "step_ms": results[best][1] if best else None,
            "oom_at": None if bounded and not any(r is None for r in results.values()) else bad,
            "time_limited": bounded, "probes": {str(k): v and v[0] for k, v in results.items()}}


# ---- the command line ----

def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="torch_reference.py", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train remat-train's GPT in plain PyTorch from the same TOML config, and "
                    "report a step as `remat-train bench` does (median ms, tokens/s, model "
                    "TFLOP/s, peak memory).",
        epilog=__doc__[__doc__.index("tests/torch_reference_check.sh"):])
    ap.add_argument("--config", required=True, help="remat-train TOML config (configs/*.toml)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override a config key, as remat-train's --set (repeatable)")
    ap.add_argument("--steps", type=int, help="steps to train (sets train.steps: the schedule too)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed first steps (default 1)")
    ap.add_argument("--init", help="start from remat-train weights: model.safetensors, a "
                                   "step_* folder, or a checkpoint.dir (its newest)")
    ap.add_argument("--init-adapter", metavar="DIR",
                    help="LoRA: start the adapters (and the modules trained whole) from a PEFT "
                         "adapter folder, as remat-train's train --init-adapter")
    ap.add_argument("--tokens", help="llm.c token shard(s) (file, folder or glob); default: the "
                                     "config's data.path when data.source = tokens, else random")
    ap.add_argument("--policy", choices=POLICIES,
                    help="none; full = torch.utils.checkpoint per block; save_attn / save_dots = "
                         "selective checkpointing (torch >= 2.4). Default: the config's "
                         "remat.policy")
    ap.add_argument("--offload", action="store_true",
                    help="keep saved activations in pinned host memory (save_on_cpu; CUDA only)")
    ap.add_argument("--dtype", choices=("fp32", "bf16"),
                    help="bf16 = autocast over fp32 master weights. Default: fp32 on the CPU, "
                         "device.precision on CUDA")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (torch >= 2.0)")
    ap.add_argument("--device", choices=("cpu", "cuda"), help="default: device.backend")
    ap.add_argument("--threads", type=int,
                    help="CPU threads (torch.set_num_threads); default device.threads or all cores")
    ap.add_argument("--loss-chunk", type=int, default=0,
                    help="rows per checkpointed LM-head chunk; default train.loss_chunk, else "
                         "full logits up to 1 GiB of them")
    ap.add_argument("--json", action="store_true",
                    help="print the summary (with every step) as one JSON object on stdout; "
                         "the banner and step lines go to stderr")
    ap.add_argument("--longest", action="store_true",
                    help="CUDA: double seq_len from train.seq_len, then binary search, with real "
                         "steps until OOM under --cap; report the longest that ran")
    ap.add_argument("--cap", default="40GiB", help="memory cap for --longest (default 40GiB)")
    ap.add_argument("--granularity", type=int, default=1024,
                    help="--longest's binary search step in tokens (default 1024)")
    ap.add_argument("--time-limit", type=float, default=0,
                    help="--longest: start no probe after this many seconds; the answer is then "
                         "the longest that ran so far (time_limited in --json). Default: none")
    return ap.parse_args(argv)


def resolve(args, cfg, device):
    """Fills the defaults that come from the config, refusing what this torch cannot do."""
    if args.steps is not None:
        cfg["train"]["steps"] = args.steps
    if cfg["train"]["steps"] < 1:
        die("train.steps must be at least 1", "pass --steps N")
    if args.policy is None:
        args.policy = cfg["remat"]["policy"]
        if args.policy not in POLICIES:
            die(f"remat.policy = {args.policy} has no PyTorch equivalent here",
                f"pass --policy {'|'.join(POLICIES)}")
    if args.policy in ("save_attn", "save_dots"):
        remat_fn(args.policy)  # the torch-version check, before any work
    if cfg["lora"]["rank"] > 0:
        require_peft(cfg["lora"])
    elif args.init_adapter:
        die("--init-adapter loads LoRA adapters, and lora.rank is 0", "set lora.rank (--set "
            "lora.rank=16) as the adapter's r")
    if args.offload and device.type != "cuda":
        die("--offload (torch.autograd.graph.save_on_cpu) copies to the host from a GPU",
            "drop --offload on the CPU, or pass --device cuda")
    if args.compile and not HAS_COMPILE:
        die(f"torch {torch.__version__} has no torch.compile (it came in 2.0)", "drop --compile")
    dtype = args.dtype or ("fp32" if device.type == "cpu" else cfg["device"]["precision"])
    threads = args.threads or cfg["device"]["threads"] or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    return dtype


def main(argv):
    args = parse_args(argv)
    cfg = load_config(args.config, args.set)
    device = pick_device(cfg, args)
    dtype = resolve(args, cfg, device)
    torch.manual_seed(cfg["train"]["seed"])
    out = sys.stderr if args.json else sys.stdout
    if args.longest:
        r = longest(cfg, args, device, dtype, out)
        if not args.json:
            print(f"longest seq_len that ran under {args.cap}: {r['longest_seq_len']}", file=out)
    else:
        r = run(cfg, args, device, dtype, out)
        if not args.json:
            print_summary(r, out)
    if args.json:
        print(json.dumps(r))


if __name__ == "__main__":
    main(sys.argv[1:])
