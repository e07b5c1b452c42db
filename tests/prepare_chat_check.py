#!/usr/bin/env python3
"""scripts/prepare_data.py --chat and --documents without the `tokenizers` package: on the byte-level
example tokenizer of docs/examples/sft/ (which the script encodes itself), in a scratch folder.

  prepare_chat_check.py SCRATCH_FOLDER

Run by ctest `prepare_data_chat` (skipped, exit 77, where python3 has no jinja2). The mask marks
exactly each assistant turn's content and its <|im_end|> (the byte-level ids spell the text back),
a template with {% generation %} blocks marks the same tokens, conversations end with
<|endoftext|> (never trained), shards.json records it, --documents ends every document with it,
and each bad input is one line naming the file (and the record's line), exit 2.
tests/prepare_data_check.py checks the same ids against `tokenizers` and the masks against
transformers where those are installed.
"""
import json
import os
import signal
import struct
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "scripts", "prepare_data.py")
SFT = os.path.join(REPO, "docs", "examples", "sft")
TOKENIZER = os.path.join(SFT, "tokenizer.json")
SPECIAL = {256: "<|endoftext|>", 257: "<|im_start|>", 258: "<|im_end|>"}


def fail(message):
    print(f"FAILED: {message}", file=sys.stderr)
    sys.exit(1)


def check(cond, message):
    if not cond:
        fail(message)


def prepare(*args, expect=0):
    p = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)
    if p.returncode != expect:
        fail(f"prepare_data.py {' '.join(args)}: exit {p.returncode}, expected {expect}\n"
             f"{p.stdout}{p.stderr}")
    return p


def one_error_line(p, *needles):
    err = p.stderr.strip().split("\n")[-1]
    check(err.startswith("error: [prepare] ") and "Fix:" in err, f"not a one-line error: {err!r}")
    for n in needles:
        check(n in err, f"{n!r} not in {err!r}")


def read(path, typecode_size):
    with open(path, "rb") as f:
        data = f.read()
    magic, version, count = struct.unpack("<3i", data[:12])
    body = data[1024:]
    check(len(body) == count * typecode_size, f"{path}: {count} items, {len(body)} bytes")
    items = struct.unpack(f"<{count}{'H' if typecode_size == 2 else 'B'}", body)
    return (magic, version), list(items)


def text_of(ids):
    return "".join(SPECIAL.get(i, chr(i)) for i in ids)  # the example's conversations are ASCII


def marked_tokenizer(folder):
    """The example tokenizer in `folder`, its template with {% generation %} blocks around each
    assistant turn's content and end token (what transformers' assistant masks read)."""
    cfg = json.load(open(os.path.join(SFT, "tokenizer_config.json")))
    old = "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    check(old in cfg["chat_template"], "the example template changed: update this check")
    cfg["chat_template"] = cfg["chat_template"].replace(
        old, "{{ '<|im_start|>' + message['role'] + '\\n' }}{% if message['role'] == 'assistant' %}"
        "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{% else %}"
        "{{ message['content'] + '<|im_end|>' }}{% endif %}{{ '\\n' }}")
    os.makedirs(folder, exist_ok=True)
    json.dump(cfg, open(os.path.join(folder, "tokenizer_config.json"), "w"))
    with open(TOKENIZER) as src, open(os.path.join(folder, "tokenizer.json"), "w") as dst:
        dst.write(src.read())
    return cfg["chat_template"]


def chat():
    records = [json.loads(line) for line in open(os.path.join(SFT, "chat.jsonl"))]
    p = prepare("--chat", os.path.join(SFT, "chat.jsonl"), "--tokenizer", TOKENIZER, "--out",
                "out", "--val-fraction", "0")
    check("loss masks beside them" in p.stdout and "data.attention=document" in p.stdout, p.stdout)
    head, ids = read("out/train_000000.bin", 2)
    mhead, mask = read("out/train_000000.mask.bin", 1)
    check(head == (20240520, 1) and mhead == (20240522, 1), f"headers {head} {mhead}")
    check(len(mask) == len(ids), "the mask counts another number of tokens")
    manifest = json.load(open("out/shards.json"))
    check(manifest["eot_token"] == 256 and manifest["mode"] == "chat" and
          manifest["documents"]["train"] == len(records), f"shards.json: {manifest}")
    # Conversation by conversation: the trained tokens spell the assistant turns and their
    # <|im_end|>; <|endoftext|> ends each and is not trained.
    conversations, at = [], 0
    for k, i in enumerate(ids):
        if i == 256:
            check(mask[k] == 0, "an end-of-text token is trained")
            conversations.append((ids[at:k], mask[at:k]))
            at = k + 1
    check(at == len(ids) and len(conversations) == len(records), "one document per record")
    for (cids, cmask), r in zip(conversations, records):
        trained = text_of(i for i, m in zip(cids, cmask) if m)
        want = "".join(m["content"] + "<|im_end|>" for m in r["messages"] if m["role"] == "assistant")
        check(trained == want, f"trained {trained!r}, want {want!r}")
        rendered = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in r["messages"])
        check(text_of(cids) == rendered, f"rendered {text_of(cids)!r}")

    # The same marks from {% generation %} blocks around the assistant's content and end token.
    marked_tokenizer("marked")
    prepare("--chat", os.path.join(SFT, "chat.jsonl"), "--tokenizer", "marked/tokenizer.json",
            "--out", "out2", "--val-fraction", "0")
    check(read("out2/train_000000.mask.bin", 1)[1] == mask, "{% generation %} marks differ")
    check(read("out2/train_000000.bin", 2)[1] == ids, "{% generation %} ids differ")

    # Bad input: one line, exit 2, the record's line named.
    with open("bad.jsonl", "w") as f:
        f.write(json.dumps(records[0]) + "\n" + json.dumps({"text": "hi"}) + "\n")
    one_error_line(prepare("--chat", "bad.jsonl", "--tokenizer", TOKENIZER, "--out", "bad",
                           expect=2), "bad.jsonl:2", '"messages"')
    with open("role.jsonl", "w") as f:
        f.write(json.dumps(records[0]) + "\n\n" +
                json.dumps({"messages": [{"role": "tool", "content": "42"}]}) + "\n")
    one_error_line(prepare("--chat", "role.jsonl", "--tokenizer", TOKENIZER, "--out", "bad",
                           expect=2), "role.jsonl:3", "refuses this conversation",
                   "unknown role tool")
    with open("latin1.jsonl", "wb") as f:  # "café" in Latin-1
        f.write(json.dumps(records[0]).encode() + b'\n{"messages": [{"role": "user", '
                b'"content": "caf\xe9"}]}\n')
    one_error_line(prepare("--chat", "latin1.jsonl", "--tokenizer", TOKENIZER, "--out", "bad",
                           expect=2), "latin1.jsonl:2: not UTF-8 at byte", "iconv")
    with open("content.jsonl", "w") as f:
        f.write(json.dumps({"messages": [{"role": "user"}]}) + "\n")
    one_error_line(prepare("--chat", "content.jsonl", "--tokenizer", TOKENIZER, "--out", "bad",
                           expect=2), "content.jsonl:1", "message 0")
    os.makedirs("plain")
    with open(TOKENIZER) as src, open("plain/tokenizer.json", "w") as dst:
        dst.write(src.read())
    one_error_line(prepare("--chat", os.path.join(SFT, "chat.jsonl"), "--tokenizer",
                           "plain/tokenizer.json", "--out", "bad", expect=2),
                   "tokenizer_config.json: no such file", "chat or instruct model")
    json.dump({"eos_token": "<|im_end|>"}, open("plain/tokenizer_config.json", "w"))
    one_error_line(prepare("--chat", os.path.join(SFT, "chat.jsonl"), "--tokenizer",
                           "plain/tokenizer.json", "--out", "bad", expect=2), "no chat_template")
    # A template calling a function no one defines is the template's fault, not the data's.
    json.dump({"eos_token": "<|im_end|>",
               "chat_template": "{% for m in messages %}{{ format_turn(m) }}{% endfor %}"},
              open("plain/tokenizer_config.json", "w"))
    one_error_line(prepare("--chat", os.path.join(SFT, "chat.jsonl"), "--tokenizer",
                           "plain/tokenizer.json", "--out", "bad", expect=2),
                   "tokenizer_config.json: the chat template uses 'format_turn'", "chat.jsonl:1",
                   "Fix:")
    one_error_line(prepare("--chat", os.path.join(SFT, "chat.jsonl"), "--tokenizer", TOKENIZER,
                           "--out", "bad", "--eot", "<|im_end|>", expect=2), "chat.jsonl:1",
                   "occurs inside the rendered")
    with open("notes.txt", "w") as f:
        f.write("not a conversation\n")
    # A folder for --chat, a FIFO for input (never read), a file for --out: each named as it is.
    os.makedirs("convs", exist_ok=True)
    one_error_line(prepare("--chat", "convs", "--tokenizer", TOKENIZER, "--out", "bad",
                           expect=2), "convs: a folder; --chat reads one .jsonl file")
    if not os.path.exists("pipe.txt"):
        os.mkfifo("pipe.txt")
    one_error_line(prepare("pipe.txt", "--tokenizer", TOKENIZER, "--out", "bad", expect=2),
                   "pipe.txt: not a regular file")
    with open("afile", "w") as f:
        f.write("x")
    one_error_line(prepare(os.path.join(SFT, "chat.jsonl"), "--chat", "--tokenizer", TOKENIZER,
                           "--out", "afile", expect=2), "--out afile: a file, not a folder")
    one_error_line(prepare("--chat", "notes.txt", "--tokenizer", TOKENIZER, "--out", "bad",
                           expect=2), "notes.txt", "reads a .jsonl file")
    check(not os.path.exists("bad") or not any(n.endswith(".bin") for n in os.listdir("bad")),
          "a refused run left shards behind")


def documents():
    texts = ["one document", "two\nlines", "x", "the last one"]
    with open("docs.jsonl", "w") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    p = prepare("--documents", "docs.jsonl", "--tokenizer", TOKENIZER, "--out", "docs",
                "--val-fraction", "0", "--shard-tokens", "16", "--eot", "<|endoftext|>")
    check("data.order=packed" in p.stdout, p.stdout)
    stream = []
    for n in sorted(os.listdir("docs")):
        if n.endswith(".bin"):
            shard = read(os.path.join("docs", n), 2)[1]
            check(shard[-1] == 256 or len(shard) == 16, f"{n} ends inside a document: {shard}")
            stream += shard
    check(text_of(stream) == "".join(t + "<|endoftext|>" for t in texts), text_of(stream))
    check(json.load(open("docs/shards.json"))["mode"] == "documents", "shards.json mode")
    # The end-of-text inside a document would split it in two: refused, as inside a conversation
    # (--tokenizer bytes: its end-of-text is a newline, which "two\nlines" holds).
    one_error_line(prepare("--documents", "docs.jsonl", "--tokenizer", "bytes", "--out", "nl",
                           "--val-fraction", "0", expect=2),
                   "document 2: the end-of-text token (10) occurs inside it", "--eot 0")


def stopped():
    """SIGTERM (a scheduler's, timeout's) stops a run as Ctrl-C does: what it wrote is removed,
    the shards --force would have replaced stay, one line, exit 128 + 15."""
    with open("big.txt", "w") as f:
        f.write(("a line of filler text\n" * 4096) * 300)  # ~27 MB: a second or more to encode
    os.makedirs("kept", exist_ok=True)
    with open("kept/train_000000.bin", "w") as f:
        f.write("an earlier shard")
    p = subprocess.Popen([sys.executable, SCRIPT, "big.txt", "--tokenizer", "bytes", "--out", "kept",
                          "--force", "--shard-tokens", "1000000"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    first = p.stderr.readline()  # printed once the handler is in place, before any shard
    check(first.startswith("[prepare] 1 text file"), f"unexpected first line {first!r}")
    p.send_signal(signal.SIGTERM)
    err = p.stderr.read().strip().split("\n")[-1]
    check(p.wait() == 128 + signal.SIGTERM, f"exit {p.returncode} after SIGTERM")
    check(err.startswith("error: [prepare] stopped by SIGTERM"), f"last line {err!r}")
    check(sorted(os.listdir("kept")) == ["train_000000.bin"], f"left {os.listdir('kept')}")
    with open("kept/train_000000.bin") as f:
        check(f.read() == "an earlier shard", "a stopped --force run replaced a shard")


if __name__ == "__main__":
    try:
        import jinja2  # noqa: F401  (what --chat needs)
    except ImportError:
        print(f"skipped: {sys.executable} cannot import jinja2 (apt install python3-jinja2)")
        sys.exit(77)
    os.chdir(sys.argv[1])
    chat()
    documents()
    stopped()
    print("prepare_data.py --chat: the assistant turns and their end token trained, nothing "
          "else, with or without generation blocks; --documents ends every document; bad input "
          "exit 2")
