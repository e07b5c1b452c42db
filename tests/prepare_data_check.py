#!/usr/bin/env python3
"""scripts/prepare_data.py and `sample --tokenizer tokenizer.json` against the `tokenizers` package.

Run by tests/prepare_data_check.sh (which skips when `tokenizers` is missing), in a scratch folder:
  prepare_data_check.py REPO REMAT_TRAIN
Two tokenizers, built here: a byte-level BPE trained on the fly (GPT-2's pre-tokenizer, 16-bit ids,
so uint16 shards) and one written by hand with Llama 3's split regex and 66k ids (uint32 shards,
merged tokens and the end-of-text past 65535). For each: the shards hold exactly the ids that
`tokenizers` gives each document, one end-of-text between documents, whatever --chunk-bytes cuts;
remat-train trains on them with the `--set` options the script printed; and `sample`'s text with
--tokenizer is byte for byte `tokenizers`' decode (skip_special_tokens=False) of the ids it prints
without (random draws over the whole vocabulary, so partial UTF-8, special and odd tokens too),
and a text --prompt, which sample encodes itself, starts it as tokenizers' ids of it do.
"""
import array
import json
import os
import random
import resource
import shlex
import struct
import subprocess
import sys

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

REPO, BINARY = sys.argv[1], sys.argv[2]
SCRIPT = os.path.join(REPO, "scripts", "prepare_data.py")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "café", "naïve", "über",
         "日本語", "€5", "—", "😀", "it's", "42", "1999", "x+y", "\t", "(ok)"]


sys.path.insert(0, os.path.join(REPO, "tests"))
from prepare_chat_check import check, fail  # noqa: E402  (the shared checks)


def run(cmd, expect=0):
    p = subprocess.run(cmd, capture_output=True)
    if p.returncode != expect:
        fail(f"{shlex.join(cmd)}: exit {p.returncode}, expected {expect}\n"
             f"{p.stdout.decode(errors='replace')}{p.stderr.decode(errors='replace')}")
    return p


def prepare(*args, expect=0):
    return run([sys.executable, SCRIPT, *args], expect)


def one_error_line(p, *needles):
    err = p.stderr.decode().strip().split("\n")[-1]
    check(err.startswith("error: [prepare] ") and "Fix:" in err, f"not a one-line error: {err!r}")
    for n in needles:
        check(n in err, f"{n!r} not in {err!r}")


def read_shard(path):
    with open(path, "rb") as f:
        data = f.read()
    magic, version, count = struct.unpack("<3i", data[:12])
    tokens = array.array("H" if magic == 20240520 else "I")
    tokens.frombytes(data[1024:])
    check(len(tokens) == count, f"{path}: header says {count} tokens, the file has {len(tokens)}")
    return magic, version, list(tokens)


def shards(out, split):
    names = sorted(n for n in os.listdir(out) if n.startswith(split + "_") and n.endswith(".bin")
                   and not n.endswith(".mask.bin"))
    return [read_shard(os.path.join(out, n)) for n in names]


def documents(seed, n, lines):
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        rows = []
        for _ in range(rng.randrange(lines // 2, lines)):
            row = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(3, 12)))
            rows.append(rng.choice(["", "", "  ", "\n"]) + row)  # some lines start blank
        docs.append("\n".join(rows) + "\n")
    return docs


def expected_stream(tok, docs, eot):
    out = []
    for i, d in enumerate(docs):
        if i:
            out.append(eot)
        out += tok.encode(d, add_special_tokens=False).ids
    return out


def check_shards(out, tok, docs, eot, magic, version, shard_tokens, val=True):
    train, val_shards = shards(out, "train"), shards(out, "val")
    for m, v, t in train + val_shards:
        check((m, v) == (magic, version), f"{out}: header {m}, {v}, expected {magic}, {version}")
    for _, _, t in train[:-1]:
        check(len(t) == shard_tokens, f"{out}: a train shard of {len(t)} tokens, not "
              f"{shard_tokens}")
    a = [x for s in train for x in s[2]]
    b = [x for s in val_shards for x in s[2]]
    want = expected_stream(tok, docs, eot)
    # val starts inside a document (no end-of-text) or at the start of one (one between them)
    check(a + b == want or a + [eot] + b == want, f"{out}: the shards are not the documents' ids")
    if val:
        check(0.02 < len(b) / len(want) < 0.25, f"{out}: val holds {len(b)} of {len(want)} tokens")
    else:
        check(not b, f"{out}: val shards with --val-fraction 0")
    return a, b


def train(tag, printed):
    options = shlex.split(printed.strip().split("\n")[-1])
    with open(f"{tag}.toml", "w") as f:
        f.write(f"""[model]
kind = "gpt"
n_layer = 1
n_head = 2
n_embd = 16
position = "rope"
[train]
seq_len = 32
batch_size = 2
steps = 4
eval_every = 2
eval_tokens = 64
[device]
backend = "cpu"
threads = 1
[checkpoint]
dir = "{tag}-ckpt"
""")
    p = run([BINARY, "train", "--config", f"{tag}.toml", *options])
    check(b"val_loss" in p.stdout, f"{tag}: no validation in the run:\n{p.stdout.decode()}")


def sample_matches_decode(tag, tok, prompt_text):
    """The checkpoint of train(tag), whose model.vocab_size is the tokenizer's: with and without
    --tokenizer, sample draws the same ids (the same candidates), so the text is their decode; and
    the prompt as text, which sample encodes itself, is the prompt tokenizers' ids are."""
    prompt_ids = tok.encode(prompt_text, add_special_tokens=False).ids
    sample = [BINARY, "sample", "--checkpoint", f"{tag}-ckpt", "--tokens", "300",
              "--temperature", "1", "--seed", "5"]
    by_ids = sample + ["--prompt-ids", " ".join(map(str, prompt_ids))]
    ids = [int(x) for x in run(by_ids).stdout.split()]
    check(len(ids) == 300, f"{tag}: sample printed {len(ids)} ids")
    text = run(by_ids + ["--tokenizer", "tokenizer.json"]).stdout
    want = (tok.decode(prompt_ids + ids, skip_special_tokens=False) + "\n").encode()
    check(text == want, f"{tag}: sample's text is not tokenizers' decode:\n{text!r}\n{want!r}")
    by_text = run(sample + ["--prompt", prompt_text, "--tokenizer", "tokenizer.json"]).stdout
    check(by_text == text, f"{tag}: --prompt {prompt_text!r} is not tokenizers' ids {prompt_ids}")


def byte_level_bpe(docs, vocab_size, special_tokens):
    """A byte-level BPE with GPT-2's pre-tokenizer trained on `docs`, saved as tokenizer.json."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  special_tokens=special_tokens,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer)
    tok.save("tokenizer.json")
    return tok


def gpt2_style():
    """A trained byte-level BPE with GPT-2's pre-tokenizer: 16-bit ids."""
    os.makedirs("gpt2", exist_ok=True)
    os.chdir("gpt2")
    docs = documents(1, 6, 120)
    tok = byte_level_bpe(docs, 500, ["<|endoftext|>", "<|end of turn|>"])
    eot = tok.token_to_id("<|endoftext|>")
    os.makedirs("docs/sub", exist_ok=True)
    for i, d in enumerate(docs):  # docs/0.txt ... docs/sub/5.txt, sorted by path
        with open(f"docs/{'sub/' if i == 5 else ''}{i}.txt", "w", encoding="utf-8") as f:
            f.write(d)
    for skipped in ("docs/.hidden.txt", "docs/notes.md"):
        with open(skipped, "w") as f:
            f.write("never read")

    p = prepare("--tokenizer", "tokenizer.json", "docs", "--out", "out", "--val-fraction", "0.1",
                "--chunk-bytes", "300", "--shard-tokens", "1000")
    check(b"tok/s" in p.stderr and b"documents" in p.stderr, "no progress on stderr")
    cut = check_shards("out", tok, docs, eot, 20240520, 1, 1000)
    check(len(shards("out", "train")) > 3, "expected several train shards")
    printed = p.stdout.decode()
    check("--set 'data.path=out/train_*.bin'" in printed and "model.vocab_size=" in printed,
          f"no --set line:\n{printed}")

    p = prepare("--tokenizer", "tokenizer.json", "docs", "--out", "out", expect=2)
    one_error_line(p, "has shards already", "--force")
    # --force, with shards big enough for all: the earlier run's other shards must go.
    p = prepare("--tokenizer", "tokenizer.json", "docs", "--out", "out", "--val-fraction", "0.1",
                "--force")
    check(sorted(os.listdir("out")) == ["shards.json", "train_000000.bin", "val_000000.bin"],
          f"stale shards left: {sorted(os.listdir('out'))}")
    check(json.load(open("out/shards.json"))["eot_token"] == eot, "shards.json's eot_token")
    whole = check_shards("out", tok, docs, eot, 20240520, 1, 10**8)
    check(whole == cut, "pieces of --chunk-bytes 300 and whole documents tokenize differently")
    printed = p.stdout.decode()

    # A full disk: the error names the shard being written, and what this run wrote is removed.
    # A file-size limit below one shard (Python ignores SIGXFSZ: the write fails with EFBIG)
    # stands for it; shards of an earlier run there stay, although --force was given.
    os.makedirs("full")
    with open("full/train_000000.bin", "wb") as f:
        f.write(b"an earlier run's shard")
    limited = subprocess.run(
        [sys.executable, SCRIPT, "--tokenizer", "tokenizer.json", "docs", "--out", "full",
         "--val-fraction", "0.1", "--chunk-bytes", "300", "--shard-tokens", "1000", "--force"],
        capture_output=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (1500, 1500)))
    check(limited.returncode == 2, f"exit {limited.returncode} with a file-size limit")
    one_error_line(limited, "full/train_000000.bin", "File too large")
    check(os.listdir("full") == ["train_000000.bin"],
          f"a failed run left {sorted(os.listdir('full'))}")
    with open("full/train_000000.bin", "rb") as f:
        check(f.read() == b"an earlier run's shard", "a failed --force run replaced a shard")

    encoded = run([sys.executable, SCRIPT, "--tokenizer", "tokenizer.json", "--encode",
                   "the quick café 😀"]).stdout.split()
    prompt = [int(x) for x in encoded]
    check(prompt == tok.encode("the quick café 😀", add_special_tokens=False).ids, "--encode")
    train("gpt2", printed)
    sample_matches_decode("gpt2", tok, "the quick café 😀")

    # A tokenizer.json saved with truncation and padding on (GPT-2's hub file truncates to 50):
    # neither cuts nor pads a document.
    saved = Tokenizer.from_file("tokenizer.json")
    saved.enable_truncation(max_length=7)
    saved.enable_padding(length=64, pad_id=eot)
    saved.save("truncating.json")
    prepare("--tokenizer", "truncating.json", "docs", "--out", "trunc", "--val-fraction", "0")
    check_shards("trunc", tok, docs, eot, 20240520, 1, 10**8, val=False)
    encoded = run([sys.executable, SCRIPT, "--tokenizer", "truncating.json", "--encode",
                   "the quick brown fox jumps over the lazy dog"]).stdout.split()
    check([int(x) for x in encoded] ==
          tok.encode("the quick brown fox jumps over the lazy dog", add_special_tokens=False).ids,
          "--encode truncated or padded")

    # JSONL with its own key and --eot as text; a missing key names the line.
    with open("docs.jsonl", "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"id": 1, "body": d}) + "\n\n")
    turn = tok.token_to_id("<|end of turn|>")
    prepare("--tokenizer", "tokenizer.json", "docs.jsonl", "--out", "jl", "--text-key", "body",
            "--eot", "<|end of turn|>", "--val-fraction", "0")
    check_shards("jl", tok, docs, turn, 20240520, 1, 10**8, val=False)
    one_error_line(prepare("--tokenizer", "tokenizer.json", "docs.jsonl", "--out", "jl2",
                           expect=2), "docs.jsonl:1", "'text'", "--text-key")
    # The eos_token of a tokenizer_config.json beside tokenizer.json is the default.
    with open("tokenizer_config.json", "w") as f:
        json.dump({"eos_token": {"content": "<|end of turn|>"}}, f)
    prepare("--tokenizer", "tokenizer.json", "docs", "--out", "cfg", "--val-fraction", "0")
    check_shards("cfg", tok, docs, turn, 20240520, 1, 10**8, val=False)
    os.remove("tokenizer_config.json")
    one_error_line(prepare("--tokenizer", "tokenizer.json", "docs", "--out", "bad", "--eot",
                           "99999", expect=2), "--eot 99999")
    one_error_line(prepare("--tokenizer", "missing.json", "docs", "--out", "bad", expect=2),
                   "missing.json")
    os.chdir("..")


def llama3_style():
    """A hand-made tokenizer with Llama 3's split regex and 66k ids: uint32 shards."""
    os.makedirs("llama3", exist_ok=True)
    os.chdir("llama3")
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    for i in range(len(vocab), 66000):  # never made by a merge, but sample may draw them
        vocab[f"<filler {i}>" if i % 2 else f"Ā{i}"] = i
    merges = [("t", "h"), ("th", "e"), ("Ġ", "the"), ("Ã", "©"), ("q", "u"), ("Ġ", "qu"),
              ("o", "x"), ("f", "ox"), ("Ġ", "fox")]
    for a, b in merges:
        vocab.setdefault(a, len(vocab))
        vocab.setdefault(a + b, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|end_of_text|>"])
    tok.save("tokenizer.json")
    eot = tok.token_to_id("<|end_of_text|>")
    check(eot >= 66000, f"end-of-text id {eot}")
    docs = documents(2, 3, 80)
    os.makedirs("docs")
    for i, d in enumerate(docs):
        with open(f"docs/{i}.txt", "w", encoding="utf-8") as f:
            f.write(d)
    p = prepare("--tokenizer", "tokenizer.json", "docs", "--out", "out", "--val-fraction", "0.1",
                "--chunk-bytes", "200")
    train_ids, _ = check_shards("out", tok, docs, eot, 20240801, 7, 10**8)
    check(max(train_ids) >= 66000, "no id past 65535 in the uint32 shards")
    check("uint32" in p.stdout.decode(), p.stdout.decode())
    prompt = tok.encode("the fox café", add_special_tokens=False).ids
    check(max(prompt) >= 66000, f"prompt ids {prompt}")
    train("llama3", p.stdout.decode())
    sample_matches_decode("llama3", tok, "the fox café")
    os.chdir("..")


def documents_mode():
    """--documents: every document ends with the end-of-text, shards end between documents."""
    os.makedirs("documents", exist_ok=True)
    os.chdir("documents")
    docs = documents(3, 8, 40)
    tok = byte_level_bpe(docs, 400, ["<|endoftext|>"])
    eot = tok.token_to_id("<|endoftext|>")
    with open("docs.jsonl", "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    ids = [tok.encode(d, add_special_tokens=False).ids + [eot] for d in docs]
    limit = max(len(d) for d in ids) + 5  # two documents never fit one shard of this size
    p = prepare("--tokenizer", "tokenizer.json", "docs.jsonl", "--out", "out", "--documents",
                "--val-fraction", "0", "--shard-tokens", str(limit))
    got = [s[2] for s in shards("out", "train")]
    check(got == ids, "--documents: not one document, ending with its end-of-text, per shard")
    manifest = json.load(open("out/shards.json"))
    check(manifest["eot_token"] == eot and manifest["mode"] == "documents" and
          manifest["documents"]["train"] == len(docs), f"shards.json: {manifest}")
    printed = p.stdout.decode()
    check("--set data.order=packed --set data.attention=document" in printed, printed)
    # A document longer than a shard is the one cut inside.
    prepare("--tokenizer", "tokenizer.json", "docs.jsonl", "--out", "small", "--documents",
            "--val-fraction", "0", "--shard-tokens", "50")
    stream = [t for s in shards("small", "train") for t in s[2]]
    check(stream == [t for d in ids for t in d], "--documents with small shards")
    os.chdir("..")


def token_mask(tok, text, ids, spans):
    """1 for each token of `ids` (the byte-level example tokenizer's, of ASCII `text`) that starts
    inside a trained span: a byte token is one character there, a special token its text."""
    check(text.isascii(), "the example conversations are ASCII")
    mask, pos = [], 0
    for i in ids:
        mask.append(int(any(a <= pos < b for a, b in spans)))
        pos += len(tok.id_to_token(i)) if i >= 256 else 1
    return mask


def chat_mode():
    """--chat on docs/examples/sft against `tokenizers` (the ids; the script's own byte-level
    encoder) and transformers (the assistant masks of a {% generation %} template), where they
    are installed; tests/prepare_chat_check.py checks the rest without them."""
    os.makedirs("chat", exist_ok=True)
    os.chdir("chat")
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    import prepare_chat_check
    import prepare_data
    sft = prepare_chat_check.SFT
    tok = Tokenizer.from_file(os.path.join(sft, "tokenizer.json"))
    own = prepare_data.ByteLevelTokenizer.load(os.path.join(sft, "tokenizer.json"))
    check(own is not None, "the example tokenizer is not one prepare_data.py encodes itself")
    records = [json.loads(line) for line in open(os.path.join(sft, "chat.jsonl"))]
    template = prepare_data.ChatTemplate(os.path.join(sft, "tokenizer.json"))
    eot = tok.token_to_id("<|endoftext|>")
    want_ids, want_mask = [], []
    for r in records:
        text, spans = template.trained_spans(r["messages"])
        ids = tok.encode(text, add_special_tokens=False).ids
        check(own.encode(text).ids == ids, f"byte-level encoder differs on {text!r}")
        want_ids += ids + [eot]
        want_mask += token_mask(tok, text, ids, spans) + [0]
    prepare("--chat", os.path.join(sft, "chat.jsonl"), "--tokenizer",
            os.path.join(sft, "tokenizer.json"), "--out", "out", "--val-fraction", "0")
    ((_, _, got),) = shards("out", "train")
    check(got == want_ids, "--chat ids are not the rendered conversations' tokenizers ids")
    with open("out/train_000000.mask.bin", "rb") as f:
        check(list(f.read()[1024:]) == want_mask, "--chat mask")
    try:  # transformers reads the {% generation %} blocks as prepare_data.py does
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        PreTrainedTokenizerFast = None
    if PreTrainedTokenizerFast is not None:
        source = prepare_chat_check.marked_tokenizer("marked")
        marked = prepare_data.ChatTemplate("marked/tokenizer.json")
        hf = PreTrainedTokenizerFast(tokenizer_file="marked/tokenizer.json", chat_template=source)
        for r in records:
            got = hf.apply_chat_template(r["messages"], tokenize=True, return_dict=True,
                                         return_assistant_tokens_mask=True)
            text, spans = marked.trained_spans(r["messages"])
            ids = tok.encode(text, add_special_tokens=False).ids
            check(got["input_ids"] == ids, "transformers renders the conversation otherwise")
            check(got["assistant_masks"] == token_mask(tok, text, ids, spans),
                  "transformers' assistant mask differs")
    os.chdir("..")


gpt2_style()
llama3_style()
documents_mode()
chat_mode()
print("prepare_data.py: uint16 and uint32 shards equal tokenizers' ids; remat-train trained on "
      "them; sample's text equals tokenizers' decode; --documents ends every document and cuts "
      "shards between them; --chat masks exactly the assistant turns")
