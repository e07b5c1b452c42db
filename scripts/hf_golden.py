#!/usr/bin/env python3
"""The Hugging Face golden: tiny random transformers models and what transformers computes on them,
for remat-train's HF checkpoint import/export tests to compare against.

Generate (writes tests/golden/hf/<name>/ for every architecture, deterministic):

    scripts/make-hf-venv.sh && /work/venv-hf/bin/python scripts/hf_golden.py
    /work/venv-hf/bin/python scripts/hf_golden.py --only qwen3 --out /tmp/hf   # one, elsewhere

Each tests/golden/hf/<name>/ holds
  * the model as `save_pretrained` writes it (config.json, generation_config.json, safetensors
    weights in float32; `llama` is sharded with model.safetensors.index.json),
  * golden.safetensors: `tokens` (I64, B x T+1), `logits` (F32, B x T x V, of the inputs
    tokens[:, :T]), `loss` (F32, shape [1]), `rope_inv_freq` (F32, for the RoPE models: the
    inverse frequencies transformers uses, scaling applied) and one F32 gradient per parameter
    under its HF name (model.layers.0.self_attn.q_proj.weight, ...; a tied head has one
    parameter, so its gradient, embedding + head, is stored once under the embedding's name),
  * golden.json: tokens, shapes, loss, versions, a description.

The `rope-*` directories are one small Llama per RoPE scaling type transformers defines (linear,
dynamic NTK, yarn with its default attention factor, yarn with DeepSeek's mscale pair and its
other keys set), run at T = 40, past the original context of 16 they scale from; their
golden.safetensors also holds `rope_attention_factor` (F32 [1]: the factor transformers
multiplies cos and sin by) and `rope_inv_freq` as the rotary module holds it after that forward
(dynamic NTK recomputes it for the run's length).

LoRA goldens (tests/golden/hf/llama-lora, gpt2-lora; need peft): the base as above, a PEFT adapter
with random A and B in adapter/, and golden.safetensors with the PeftModel's loss, logits and the
gradient of every trainable tensor under its adapter_model.safetensors name (generate_lora).

Loss convention (remat-train's): tokens x is B x (T+1); inputs = x[:, :T], targets = x[:, 1:];
loss = mean over the B*T positions of cross_entropy(logits, targets), computed here from
model(input_ids=inputs).logits (labels are not passed, so transformers' own shift is not used).

Documents (data.attention = "document"), written beside the golden of DOCUMENT_ARCHS:

    /work/venv-hf/bin/python scripts/hf_golden.py --documents

reads each saved model back (from_pretrained, eager attention) and writes documents.safetensors
(`tokens` I64 B x T+1 with end-of-text ids ending the documents, `position_ids` and `doc_start` I64
B x T, `targets` I64 B x T with -1 where not trained, `logits`, `loss`, and every gradient under its
HF name) and documents.json. transformers gets the rows as packed documents: a 4-D block-diagonal
causal mask (B x 1 x T x T, 0 where a query sees a key of its own document, the float minimum
elsewhere) and position_ids restarting at 0 in every document; labels -100 where the input is an
end-of-text token (its target is the next document's first token). The loss is the mean over the
trained targets. Each document is also run alone (its own positions from 0, no mask) and must give
the same logits: the 4-D mask is honoured.

Check an export (a directory remat-train's `export` wrote) with transformers:

    /work/venv-hf/bin/python scripts/hf_golden.py --check-export DIR --expect FILE

FILE is a golden.json (its logits are read from the golden.safetensors it names), a JSON file with
"tokens" and "logits" (nested lists, or flat with "logits_shape"), or a .safetensors file with
`tokens` and `logits`. The model is loaded with AutoModelForCausalLM.from_pretrained(DIR) in
float32 (bf16/f16 weights are upcast exactly) and run on the first logits.shape[1] tokens of each
row (tokens[:, :T] for a golden.json). Exit 0 when
max |logits - expected| <= bound, else 1. Bounds: F32_BOUND for float32 weights, BF16_BOUND
(absolute, on logits of order 1) when any floating weight in DIR is bf16/f16; --tol overrides.
"""
import argparse
import json
import os
import shutil
import struct
import sys

from golden_env import golden_dir, missing_packages

try:
    import torch
    import torch.nn.functional as F
    import transformers
    from safetensors.torch import load_file, save_file
except ImportError as e:
    missing_packages("hf_golden.py", "torch, transformers and safetensors", e)

OUT = golden_dir("hf")
B, T = 2, 13
ROPE_T = 40             # the RoPE scaling goldens: past their original context of 16
SEED = 20240611
INIT_STD = 0.1          # initializer_range: large enough that attention is far from uniform
F32_BOUND = 1e-4        # float32 export of the same weights: transformers' logits agree to ~1e-6
BF16_BOUND = 0.08       # bf16-rounded weights (rel. 2^-9 each): measured max 0.011-0.025 here

# One entry per directory: the class, the config and what the directory is for.
ARCHS = {
    "llama": dict(
        cls="LlamaForCausalLM",
        config=dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
                    rope_theta=500000.0, max_position_embeddings=64,
                    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8},
                    tie_word_embeddings=False, attention_bias=False),
        shard="150KB",
        desc="Llama 3 style: GQA (4 heads, 2 kv heads), SwiGLU with intermediate 96 (not 4*hidden), "
             "RMSNorm eps 1e-5, RoPE theta 5e5 with llama3 scaling (original_max_position_embeddings "
             "8 so that scaling changes every frequency at T=13), untied head; saved SHARDED "
             "(model-0000k-of-0000n.safetensors + model.safetensors.index.json)."),
    "llama-tied": dict(
        cls="LlamaForCausalLM",
        config=dict(vocab_size=100, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=1, rms_norm_eps=1e-6,
                    rope_theta=10000.0, max_position_embeddings=64, rope_scaling=None,
                    tie_word_embeddings=True, attention_bias=False),
        desc="Llama with MQA (4 heads, 1 kv head, head_dim 8), tied embeddings (no lm_head.weight "
             "in the file), plain RoPE theta 1e4, RMSNorm eps 1e-6."),
    "qwen2": dict(
        cls="Qwen2ForCausalLM",
        config=dict(vocab_size=113, hidden_size=64, intermediate_size=32, num_hidden_layers=1,
                    num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
                    rope_theta=1000000.0, max_position_embeddings=64,
                    tie_word_embeddings=True, use_sliding_window=False),
        desc="Qwen2: q/k/v projections WITH biases (set to non-zero random values), o_proj without, "
             "GQA 4/2, tied embeddings, RoPE theta 1e6, 1 layer (size budget)."),
    "qwen3": dict(
        cls="Qwen3ForCausalLM",
        config=dict(vocab_size=97, hidden_size=64, intermediate_size=32, num_hidden_layers=1,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=24, rms_norm_eps=1e-6,
                    rope_theta=1000000.0, max_position_embeddings=64,
                    tie_word_embeddings=False, attention_bias=False, use_sliding_window=False),
        desc="Qwen3: head_dim 24 while hidden/heads = 16 (q_proj 96x64, k/v_proj 48x64, o_proj "
             "64x96), per-head q_norm/k_norm RMSNorm over head_dim (weights random, not ones) "
             "applied before RoPE, GQA 4/2, untied head, no biases, 1 layer (size budget)."),
    "mistral": dict(
        cls="MistralForCausalLM",
        config=dict(vocab_size=100, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=1, rms_norm_eps=1e-5,
                    rope_theta=10000.0, max_position_embeddings=64, sliding_window=None,
                    tie_word_embeddings=False),
        desc="Mistral: 4 heads, 1 kv head, sliding_window null so attention is full causal "
             "(sliding window DISABLED), head_dim null in config.json (= hidden/heads = 8), untied."),
    "gpt2": dict(
        cls="GPT2LMHeadModel",
        config=dict(vocab_size=101, n_embd=64, n_layer=2, n_head=4, n_positions=32, n_inner=48,
                    activation_function="gelu_new", layer_norm_epsilon=1e-5,
                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True,
                    bos_token_id=0, eos_token_id=0),
        desc="GPT-2: learned positions (n_positions 32), LayerNorm with biases (all perturbed), "
             "tanh GELU (gelu_new), n_inner 48 (not 4*n_embd), tied head. Conv1D weights are "
             "[in, out] (c_attn.weight is 64x192 = [q|k|v] along the output): an importer must "
             "transpose them. Names carry the 'transformer.' prefix (saved from GPT2LMHeadModel)."),
}

# One small Llama per RoPE scaling type, with theta 10 so that yarn's ramp spans several of the
# 8 frequency pairs (at theta 1e4 and an original context of 16 it would be one pair wide).
ROPE_BASE = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                 num_attention_heads=2, num_key_value_heads=1, head_dim=16, rms_norm_eps=1e-5,
                 rope_theta=10.0, tie_word_embeddings=True, attention_bias=False)
ROPE_ARCHS = {
    "rope-linear": dict(
        config=dict(ROPE_BASE, max_position_embeddings=64,
                    rope_scaling={"rope_type": "linear", "factor": 4.0}),
        desc="linear (position interpolation): every inverse frequency divided by 4."),
    "rope-dynamic": dict(
        config=dict(ROPE_BASE, max_position_embeddings=16,
                    rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
        desc="dynamic NTK: at T = 40 past max_position_embeddings 16 the base grows to theta * "
             "(2 * 40 / 16 - 1)^(16 / 14); inv_freq as the module holds it after the forward."),
    "rope-yarn": dict(
        config=dict(ROPE_BASE, max_position_embeddings=64,
                    rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                  "original_max_position_embeddings": 16}),
        desc="yarn, transformers' defaults: beta_fast 32, beta_slow 1, truncate, attention factor "
             "0.1 ln 4 + 1 on cos and sin; the original context from rope_scaling."),
    "rope-yarn-mscale": dict(
        config=dict(ROPE_BASE, max_position_embeddings=16,
                    rope_scaling={"type": "yarn", "factor": 8.0, "beta_fast": 8.0,
                                  "beta_slow": 0.5, "truncate": False, "mscale": 1.0,
                                  "mscale_all_dim": 0.5}),
        desc="yarn in DeepSeek's form, spelled with the legacy `type`: the attention factor "
             "from mscale / mscale_all_dim, beta_fast 8, beta_slow 0.5, an untruncated ramp, and "
             "the original context from max_position_embeddings (rope_scaling has none)."),
}
for _name, _spec in ROPE_ARCHS.items():
    ARCHS[_name] = dict(_spec, cls="LlamaForCausalLM", T=ROPE_T)


# LoRA goldens (tests/golden/hf/<name>/, docs/lora.md): a base model saved as transformers does, a
# PEFT adapter on it with every weight random (init_lora_weights=False draws A and B both, so the
# adapter is far from the base) and its modules_to_save copies perturbed away from the base's, and
# what the PeftModel computes: loss, logits, and the gradient of every trainable tensor under its
# name in adapter_model.safetensors.
LORA = {
    "llama-lora": dict(
        base="llama",
        lora=dict(r=4, lora_alpha=8, lora_dropout=0.0, use_rslora=False,
                  target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                  "down_proj"],
                  modules_to_save=["input_layernorm", "lm_head"]),
        desc="LoRA r 4, alpha 8 (scale 2) on every linear of the llama golden's blocks (q, k and v "
             "are row ranges of remat-train's fused qkv), the first norm of each block and the "
             "untied LM head trained whole; A and B random (init_lora_weights=False), the saved "
             "modules perturbed away from the base. Base saved unsharded."),
    "gpt2-lora": dict(
        base="gpt2",
        lora=dict(r=3, lora_alpha=6, lora_dropout=0.0, use_rslora=True, fan_in_fan_out=True,
                  target_modules=["c_attn", "c_proj", "c_fc"], modules_to_save=["ln_f"]),
        desc="LoRA r 3, alpha 6 with use_rslora (scale 6/sqrt(3)) on GPT-2's Conv1D c_attn, both "
             "c_proj and c_fc (fan_in_fan_out), ln_f trained whole; A and B random."),
}


def versions():
    import numpy, safetensors, tokenizers
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "safetensors": safetensors.__version__, "numpy": numpy.__version__,
            "tokenizers": tokenizers.__version__}


def build(name, spec, seed):
    cfg_cls = getattr(transformers, spec["cls"].replace("ForCausalLM", "Config")
                      .replace("LMHeadModel", "Config"))
    cfg = cfg_cls(initializer_range=INIT_STD, **spec["config"])
    cfg._attn_implementation = "eager"  # the textbook softmax(QK^T/sqrt(d)+mask)V
    torch.manual_seed(seed)
    model = getattr(transformers, spec["cls"])(cfg).float()
    # Perturb what a random init leaves at 1 or 0, so a norm weight or bias mapped to the wrong
    # tensor (or dropped) changes the numbers. Sorted names: independent of module order.
    g = torch.Generator().manual_seed(seed + 1)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for pname in sorted(params):
            p = params[pname]
            if p.dim() == 1 and pname.endswith(".weight"):   # RMSNorm / LayerNorm / q_norm / k_norm
                p.copy_(torch.rand(p.shape, generator=g) * 0.8 + 0.6)   # U(0.6, 1.4)
            elif pname.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    model.eval()  # no dropout; eval() does not change the math of these models otherwise
    return model


def make_tokens(vocab, seed, T=T):
    g = torch.Generator().manual_seed(seed + 2)
    x = torch.randint(0, vocab, (B, T + 1), generator=g)
    x[0, 0], x[1, 3], x[1, T] = vocab - 1, 0, vocab - 1   # both ends of the vocabulary appear
    return x


def forward_loss(model, x):
    T = x.shape[1] - 1
    logits = model(input_ids=x[:, :T]).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), x[:, 1:].reshape(-1))
    return logits, loss


def rope_inv_freq(model):
    for mod in model.modules():
        if hasattr(mod, "inv_freq") and isinstance(mod.inv_freq, torch.Tensor):
            return mod.inv_freq.detach().float().clone()
    return None


def rope_attention_factor(model):
    for mod in model.modules():
        if hasattr(mod, "inv_freq") and hasattr(mod, "attention_scaling"):
            return torch.tensor([float(mod.attention_scaling)], dtype=torch.float32)
    return None


def fresh_dir(out_root, name):
    """out_root/name, emptied: a golden folder holds only what this run writes."""
    d = os.path.join(out_root, name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    return d


def forward_backward(model, vocab, seed, length=T):
    """One forward and backward pass on the golden's tokens, rows of `length` + 1 (the gradients
    land in model): the tokens, the logits, the loss, and the golden tensors they give."""
    x = make_tokens(vocab, seed, length)
    model.zero_grad(set_to_none=True)
    logits, loss = forward_loss(model, x)
    loss.backward()
    tensors = {"tokens": x.clone(), "logits": logits.detach().float().contiguous(),
               "loss": loss.detach().float().reshape(1)}
    return x, logits, loss, tensors


def check_reload(name, reloaded, x, logits):
    """The saved files reload to the same logits, to the bit."""
    with torch.no_grad():
        re_logits = reloaded(input_ids=x[:, :-1]).logits
    reload_diff = (re_logits - logits.detach()).abs().max().item()
    assert reload_diff == 0.0, (name, reload_diff)


def run_fields(vocab, x, loss, logits):
    """golden.json's fields on the run itself, in the order both generators write them."""
    return {
        "loss_convention": "inputs = tokens[:, :T], targets = tokens[:, 1:], loss = mean over "
                           "B*T of cross_entropy(logits, targets) in float32",
        "B": B, "T": x.shape[1] - 1, "vocab_size": vocab,
        "tokens": x.tolist(),
        "loss": float(loss.item()),
        "golden_file": "golden.safetensors",
        "logits_shape": list(logits.shape),
    }


def write_info(d, info):
    """golden.json, in the order info lists its fields; returns info."""
    with open(os.path.join(d, "golden.json"), "w") as f:
        json.dump(info, f, indent=1, sort_keys=False)
        f.write("\n")
    return info


def generate(name, spec, out_root, seed):
    d = fresh_dir(out_root, name)
    model = build(name, spec, seed)
    vocab = model.config.vocab_size
    x, logits, loss, tensors = forward_backward(model, vocab, seed, spec.get("T", T))
    inv = rope_inv_freq(model)
    if inv is not None:
        tensors["rope_inv_freq"] = inv
    if name.startswith("rope-"):
        tensors["rope_attention_factor"] = rope_attention_factor(model)
    grads = {}
    for pname, p in model.named_parameters():
        assert p.grad is not None, pname
        grads[pname] = p.grad.detach().float().contiguous().clone()
    assert not set(grads) & set(tensors)
    tensors.update(grads)

    save_kw = dict(safe_serialization=True)
    if spec.get("shard"):
        save_kw["max_shard_size"] = spec["shard"]
    model.save_pretrained(d, **save_kw)
    save_file(tensors, os.path.join(d, "golden.safetensors"), metadata={"format": "pt"})

    # What was saved: names, shapes, dtypes (read back from the files, not from the model).
    saved = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors") and f != "golden.safetensors":
            for k, v in load_file(os.path.join(d, f)).items():
                saved[k] = {"shape": list(v.shape), "dtype": str(v.dtype).replace("torch.", ""),
                            "file": f}
    shards = sorted(f for f in os.listdir(d) if f.startswith("model") and f.endswith(".safetensors"))
    if spec.get("shard"):
        assert len(shards) >= 2 and os.path.exists(os.path.join(d, "model.safetensors.index.json")), shards

    # The saved weights reload to the same logits (guards against a tied/untied save surprise).
    re = getattr(transformers, spec["cls"]).from_pretrained(d, attn_implementation="eager").eval()
    check_reload(name, re, x, logits)

    cfg = model.config
    info = {
        "name": name,
        "class": spec["cls"],
        "description": spec["desc"],
        "seed": seed,
        "versions": versions(),
        **run_fields(vocab, x, loss, logits),
        "extra_keys": sorted(k for k in tensors if k not in grads),
        "gradients": {k: list(v.shape) for k, v in grads.items()},
        "tied_word_embeddings": bool(getattr(cfg, "tie_word_embeddings", False)),
        "saved_weights": saved,
        "weight_files": shards,
        "attn_implementation": "eager",
        "init": f"transformers init with initializer_range={INIT_STD}; every 1-D '.weight' "
                "(RMSNorm/LayerNorm/q_norm/k_norm) set to U(0.6, 1.4), every bias to N(0, 0.1^2)",
    }
    if "head_dim" in spec["config"] or hasattr(cfg, "num_attention_heads"):
        n_heads = cfg.num_attention_heads
        info["head_dim"] = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads
    if name == "mistral":
        info["sliding_window"] = ("disabled: config sliding_window = null, so transformers uses "
                                  "the plain causal mask (create_causal_mask)")
    if name == "llama" or name.startswith("rope-"):
        info["rope_scaling_check"] = rope_scaling_check(model, spec, seed, x, logits.detach())
    if name == "gpt2":
        info["gpt2_layout"] = ("Conv1D: weight [in, out], y = x @ W + b; c_attn.weight [64, 192] "
                               "= [q|k|v] on the output dim; mlp.c_fc.weight [64, 48] = [in, n_inner], "
                               "mlp.c_proj.weight [48, 64] = [n_inner, out]; attn.bias / attn.masked_bias are "
                               "non-persistent buffers (not in the file)")
    return write_info(d, info)


def rope_scaling_check(model, spec, seed, x, logits):
    """The same weights without rope_scaling: the scaling must change the logits."""
    T = x.shape[1] - 1
    plain_cfg = dict(spec["config"], rope_scaling=None)
    plain = build("llama-plain", dict(spec, config=plain_cfg), seed)
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():
        plain_logits = plain(input_ids=x[:, :T]).logits
    inv_s, inv_p = rope_inv_freq(model), rope_inv_freq(plain)
    scaling = spec["config"]["rope_scaling"]
    kind = scaling.get("rope_type", scaling.get("type"))
    extra = {} if kind == "llama3" else {"attention_factor": float(rope_attention_factor(model)[0])}
    diff = (plain_logits - logits).abs().max().item()
    changed = int((inv_s != inv_p).sum().item())
    assert diff > 1e-3 and changed > 0, (diff, changed)
    return {"max_abs_logit_diff_vs_unscaled": diff,
            "inv_freq_changed": f"{changed} of {inv_s.numel()}",
            "inv_freq_scaled": inv_s.tolist(), "inv_freq_unscaled": inv_p.tolist(),
            "verdict": f"{kind} scaling changes the angles at T={T}: scaled and unscaled logits differ",
            **extra}


# ----------------------------------------------------------------------------- --documents

DOCUMENT_ARCHS = ("gpt2", "llama", "qwen3")
DOCUMENT_LENGTHS = ((5, 8), (1, 4, 8))  # per row, summing to T: a one-token document, cut tiles


def generate_documents(name, out_root, seed):
    d = os.path.join(out_root, name)
    cls = getattr(transformers, ARCHS[name]["cls"])
    model = cls.from_pretrained(d, attn_implementation="eager").float().eval()
    vocab = model.config.vocab_size
    eot = vocab - 2
    g = torch.Generator().manual_seed(seed + 3)
    x = torch.randint(0, vocab - 2, (B, T + 1), generator=g)  # no end-of-text but where placed
    positions = torch.zeros(B, T, dtype=torch.long)
    starts = torch.zeros(B, T, dtype=torch.long)
    allowed = torch.zeros(B, 1, T, T, dtype=torch.bool)
    for b, lengths in enumerate(DOCUMENT_LENGTHS):
        assert sum(lengths) == T
        at = 0
        for n in lengths:
            x[b, at + n - 1] = eot
            positions[b, at:at + n] = torch.arange(n)
            starts[b, at:at + n] = at
            allowed[b, 0, at:at + n, at:at + n] = torch.tril(torch.ones(n, n, dtype=torch.bool))
            at += n
    mask = torch.zeros(B, 1, T, T).masked_fill(~allowed, torch.finfo(torch.float32).min)
    targets = x[:, 1:].clone()
    targets[x[:, :T] == eot] = -100
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=x[:, :T], attention_mask=mask, position_ids=positions).logits
    loss = F.cross_entropy(logits.reshape(-1, vocab).float(), targets.reshape(-1),
                           ignore_index=-100)
    loss.backward()
    # The mask is honoured: each document alone gives the logits of its rows.
    worst = 0.0
    with torch.no_grad():
        for b, lengths in enumerate(DOCUMENT_LENGTHS):
            at = 0
            for n in lengths:
                alone = model(input_ids=x[b:b + 1, at:at + n]).logits[0]
                worst = max(worst, (alone - logits[b, at:at + n]).abs().max().item())
                at += n
    assert worst < 1e-5, (name, worst)
    tensors = {"tokens": x.clone(), "position_ids": positions, "doc_start": starts,
               "targets": targets.masked_fill(targets == -100, -1),
               "logits": logits.detach().float().contiguous(),
               "loss": loss.detach().float().reshape(1)}
    grads = {n: p.grad.detach().float().contiguous().clone()
             for n, p in model.named_parameters()}
    tensors.update(grads)
    save_file(tensors, os.path.join(d, "documents.safetensors"), metadata={"format": "pt"})
    info = {
        "name": name, "B": B, "T": T, "eot_token": eot,
        "document_lengths": [list(r) for r in DOCUMENT_LENGTHS],
        "tokens": x.tolist(), "loss": float(loss.item()),
        "trained_targets": int((targets != -100).sum().item()),
        "documents_alone_max_logit_diff": worst,
        "gradients": {k: list(v.shape) for k, v in grads.items()},
        "versions": versions(),
        "convention": "packed documents: 4-D block-diagonal causal mask (0 / float32 min, "
                      "B x 1 x T x T), position_ids from 0 in each document, eager attention; "
                      "targets = tokens[:, 1:] with -1 (labels -100) where the input is the "
                      "end-of-text id; loss = mean cross-entropy over the trained targets",
    }
    with open(os.path.join(d, "documents.json"), "w") as f:
        json.dump(info, f, indent=1)
    return info

def saved_name(param_name):
    """A PeftModel parameter's name in adapter_model.safetensors (peft strips the adapter name)."""
    return param_name.replace(".modules_to_save.default", "").replace(".default", "")


def generate_lora(name, spec, out_root, seed):
    import peft
    d = fresh_dir(out_root, name)
    base_spec = dict(ARCHS[spec["base"]])
    base_spec.pop("shard", None)
    model = build(spec["base"], base_spec, seed)
    model.save_pretrained(d, safe_serialization=True)
    torch.manual_seed(seed + 3)
    cfg = peft.LoraConfig(task_type="CAUSAL_LM", init_lora_weights=False, **spec["lora"])
    pm = peft.get_peft_model(model, cfg)
    g = torch.Generator().manual_seed(seed + 4)
    params = dict(pm.named_parameters())
    with torch.no_grad():
        for pname in sorted(params):
            if "modules_to_save" in pname:  # the copies that train: not the base's values
                p = params[pname]
                p.mul_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
    pm.eval()
    pm.save_pretrained(os.path.join(d, "adapter"), safe_serialization=True)
    os.remove(os.path.join(d, "adapter", "README.md"))  # peft's model card: not read
    # target_modules is a Python set inside peft, written in hash order: sorted here, so that two
    # runs give the same bytes.
    cfg_path = os.path.join(d, "adapter", "adapter_config.json")
    with open(cfg_path) as f:
        saved_cfg = json.load(f)
    saved_cfg["target_modules"] = sorted(saved_cfg["target_modules"])
    with open(cfg_path, "w") as f:
        json.dump(saved_cfg, f, indent=2, sort_keys=True)
    vocab = model.config.vocab_size
    x, logits, loss, tensors = forward_backward(pm, vocab, seed)
    grads = {saved_name(n): p.grad.detach().float().contiguous().clone()
             for n, p in pm.named_parameters() if p.requires_grad}
    tensors.update(grads)
    save_file(tensors, os.path.join(d, "golden.safetensors"), metadata={"format": "pt"})

    # The saved adapter reloads onto a fresh base to the same logits.
    base = getattr(transformers, base_spec["cls"]).from_pretrained(
        d, attn_implementation="eager").eval()
    re = peft.PeftModel.from_pretrained(base, os.path.join(d, "adapter")).eval()
    check_reload(name, re, x, logits)
    # The same numbers from a merged model (peft's merge_and_unload): what `export --hf` writes.
    merged = re.merge_and_unload()
    with torch.no_grad():
        merged_diff = (merged(input_ids=x[:, :T]).logits - logits.detach()).abs().max().item()

    info = {
        "name": name,
        "class": base_spec["cls"],
        "description": spec["desc"],
        "base": spec["base"] + " (scripts/hf_golden.py ARCHS), saved unsharded in this folder",
        "adapter": "adapter/ (PeftModel.save_pretrained)",
        "lora": spec["lora"],
        "scaling": next(float(m.scaling["default"]) for m in pm.modules()
                        if isinstance(getattr(m, "scaling", None), dict)),
        "seed": seed,
        "versions": dict(versions(), peft=peft.__version__),
        **run_fields(vocab, x, loss, logits),
        "gradients": {k: list(v.shape) for k, v in grads.items()},
        "merged_max_abs_logit_diff": merged_diff,
        "attn_implementation": "eager",
    }
    return write_info(d, info)


# ----------------------------------------------------------------------------- --check-export

def safetensors_dtypes(d):
    """The floating dtypes of the weights in DIR (golden.safetensors, if there, is not a weight file)."""
    dtypes = set()
    for f in os.listdir(d):
        if f.endswith(".safetensors") and f != "golden.safetensors":
            with open(os.path.join(d, f), "rb") as fh:
                n = struct.unpack("<Q", fh.read(8))[0]
                hdr = json.loads(fh.read(n))
            dtypes |= {v["dtype"] for k, v in hdr.items()
                       if k != "__metadata__" and v["dtype"] in ("F64", "F32", "BF16", "F16")}
    return dtypes


def read_expect(path):
    if path.endswith(".safetensors"):
        t = load_file(path)
        return t["tokens"].long(), t["logits"].float()
    with open(path) as f:
        j = json.load(f)
    tokens = torch.tensor(j["tokens"], dtype=torch.long)
    if "logits" in j:
        logits = torch.tensor(j["logits"], dtype=torch.float32)
        if "logits_shape" in j:
            logits = logits.reshape(j["logits_shape"])
    else:
        gf = os.path.join(os.path.dirname(os.path.abspath(path)), j.get("golden_file", "golden.safetensors"))
        logits = load_file(gf)["logits"].float()
    return tokens, logits


def check_export(d, expect, tol):
    from transformers import AutoModelForCausalLM
    tokens, want = read_expect(expect)
    if want.dim() == 2:
        want = want.unsqueeze(0)
    if tokens.dim() == 1:
        tokens = tokens.unsqueeze(0)
    t = want.shape[1]
    dts = safetensors_dtypes(d)
    low = bool(dts & {"BF16", "F16"})
    bound = tol if tol is not None else (BF16_BOUND if low else F32_BOUND)
    model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    with torch.no_grad():
        got = model(input_ids=tokens[:, :t]).logits.float()
    if got.shape != want.shape:
        print(f"FAIL: logits shape {list(got.shape)} from {d}, expected {list(want.shape)}")
        return 1
    diff = (got - want).abs().max().item()
    argmax = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
    print(f"{d}: weights {sorted(dts)}, {type(model).__name__}, logits {list(got.shape)}: "
          f"max abs diff {diff:.3e} (bound {bound:g}{', bf16/f16 weights' if low else ''}), "
          f"argmax agreement {argmax:.3f}")
    ok = diff <= bound
    print("OK" if ok else "FAIL")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=OUT, help="root directory (default tests/golden/hf)")
    ap.add_argument("--only", action="append", choices=sorted(ARCHS) + sorted(LORA),
                    help="one architecture or LoRA golden (repeatable)")
    ap.add_argument("--check-export", metavar="DIR", help="check a model directory against --expect")
    ap.add_argument("--expect", metavar="FILE", help="golden.json / JSON / safetensors with tokens and logits")
    ap.add_argument("--tol", type=float, help=f"override the bound (default {F32_BOUND:g} f32, {BF16_BOUND:g} bf16)")
    ap.add_argument("--documents", action="store_true",
                    help="write documents.safetensors beside the golden of " + ", ".join(DOCUMENT_ARCHS))
    a = ap.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()

    if a.check_export:
        if not a.expect:
            ap.error("--check-export needs --expect FILE")
        sys.exit(check_export(a.check_export, a.expect, a.tol))

    if a.documents:
        for name in a.only or DOCUMENT_ARCHS:
            info = generate_documents(name, a.out, SEED + 1000 * list(ARCHS).index(name))
            print(f"{name:11s} documents: loss {info['loss']:.6f} over {info['trained_targets']} "
                  f"targets; each document alone within {info['documents_alone_max_logit_diff']:.2e}")
        return

    names = a.only or list(ARCHS) + list(LORA)
    os.makedirs(a.out, exist_ok=True)
    for i, name in enumerate(names):
        if name in LORA:
            info = generate_lora(name, LORA[name], a.out,
                                 SEED + 1000 * list(ARCHS).index(LORA[name]["base"]))
        else:
            info = generate(name, ARCHS[name], a.out, SEED + 1000 * list(ARCHS).index(name))
        d = os.path.join(a.out, name)
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        print(f"{name:11s} loss {info['loss']:.6f}  {len(info['gradients'])} grads  "
              f"{size / 1024:.0f} KiB  {d}")
    total = 0
    for root, _, files in os.walk(a.out):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    print(f"total {total / 1024:.0f} KiB under {a.out}")


if __name__ == "__main__":
    main()
