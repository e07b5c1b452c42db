#!/usr/bin/env python3
"""Tokenize text into llm.c token shards that `remat-train` trains on (data.source = "tokens").

  prepare_data.py --tokenizer DIR/tokenizer.json INPUT --out DIR [--text-key text] [--eot ID|TOKEN]
                  [--val-fraction F] [--shard-tokens N] [--chunk-bytes N] [--force]
                  [--documents | --chat]
  prepare_data.py --tokenizer DIR/tokenizer.json --encode "some text"    # prints the ids
  prepare_data.py --passkey --tokenizer T [FILLER] --lengths 4k,16k --depths 0,0.5,1 --out DIR
                  [--samples N] [--seed S] [--force]

INPUT is a text file (one document), a folder (every *.txt under it, sorted by path, hidden
entries skipped; one document each) or a .jsonl file (one document per line, its --text-key
string). The tokenizer is a Hugging Face tokenizer.json, read with the `tokenizers` package
(Tokenizer.from_file); no special tokens are added inside documents, and one end-of-text token
separates consecutive documents: --eot (an id or a token string), else tokenizer_config.json's
eos_token beside tokenizer.json, else <|end_of_text|> or <|endoftext|> if the vocabulary has it.

Shards: DIR/train_000000.bin, ... and DIR/val_000000.bin, ..., each at most --shard-tokens tokens,
in llm.c's format (dev/data/data_common.py, write_datafile): a header of 256 little-endian int32
(magic, version, token count), then the tokens, uint16 (magic 20240520, version 1) when every id
fits 16 bits, else uint32 (magic 20240801, version 7: Llama 3's 128256 ids, Qwen's 151k).
Validation is the last --val-fraction of the input's bytes, from the first document or line
start at or after that point (data.val_fraction's tail, cut where a document or a line begins).

Long documents are encoded in pieces of about --chunk-bytes, cut only at a newline between a
character that is not whitespace and a printable ASCII one: byte-level BPE pre-tokenizers (GPT-2's,
Llama 3's, Qwen's regexes) make that newline a pre-token of its own whether the text is cut there
or not, so the ids are the same as the whole document's, and the pieces are encoded on every core.
A tokenizer that prepends to each input (add_prefix_space, Metaspace, Prepend) is never cut.

--documents: every document ends with the end-of-text token (the last one too), as data.attention
= "document" and data.order = "packed" read them, and a shard ends between documents (a document
longer than --shard-tokens excepted).

--chat: INPUT is JSONL whose records hold "messages", a list of {"role", "content"}. Each record is
rendered with the tokenizer's own chat template (tokenizer_config.json's chat_template, Jinja, in a
sandbox with transformers' globals: raise_exception, strftime_now, the tojson filter, and the
special tokens bos_token, eos_token, ... of the config), ends with the end-of-text token as one
document, and gets a loss mask beside its shard, X.mask.bin for X.bin (the shard's 1024-byte header
with magic 20240522, version 1 and the same count, then one byte per token: 1 = trained as a
target). Trained are the assistant turns and their end token, nothing else. Which characters those
are: a template with {% generation %} ... {% endgeneration %} blocks marks them itself (as
transformers' return_assistant_tokens_mask reads them); any other is rendered message by message,
each assistant turn being what rendering the conversation up to it adds to rendering the turns
before it with add_generation_prompt, up to and including the last end-of-turn token
(tokenizer_config.json's eos_token) in it, so the newline a template writes after that token is not
trained. The text is encoded piece by piece at the edges of the trained spans. The end-of-text
token between conversations is --eot, else <|end_of_text|> or <|endoftext|>, else the eos_token;
it must never occur inside a rendered conversation.

Every mode writes shards.json beside the shards: the end-of-text id (which remat-train reads when
data.eot_token is not set), the vocabulary size, the mode, and the documents' count and mean length.

`--tokenizer bytes` needs no file: every UTF-8 byte is its own token (ids 0-255, vocabulary 256,
a newline between documents unless --eot), the ids a byte-level model trained on text files
(data.source = "text") reads, for such a model fine-tuned on shards; `remat-train sample
--tokenizer bytes` prints them as text.

Progress (tokens/s, documents, bytes) goes to stderr; at the end, stdout has the `--set` options
that train on the shards. Errors are one line, `error: [prepare] ... Fix: ...`, exit 2; a run that
fails (a full disk, bad input, ^C) removes the shards it wrote, so no partial set is left.
Needs `tokenizers` (pip install tokenizers, in a virtual environment), except with --tokenizer
bytes and for a byte-level tokenizer.json without merges (every byte a token of its own, plus added
tokens), which this script encodes itself; --chat needs jinja2 (Debian's python3-jinja2).

--passkey writes passkey retrieval tasks for `remat-train eval --passkey DIR` (docs/
context-extension.md): for each length L of --lengths, depth d of --depths and sample, one task
of exactly L + 1 tokens (a window of seq_len L): an instruction, filler, "The pass key is NNNNN.
Remember it." after a fraction d of the filler, the rest of the filler, "What is the pass key?
The pass key is", and the answer " NNNNN" (a random 5-digit key per task, from --seed). Files in
--out: passkey.bin (every task, one after the other, as a token shard), passkey.mask.bin (its
loss mask: the shard's 1024-byte header with magic 20240522, version 1 and the same token count,
then one byte per token, 1 on the answer's tokens, which are the targets scored) and passkey.json
(each task's length, depth, key and place in the shard). The filler is FILLER's text (a file or
a folder, as INPUT above), in order and never repeated, so a length that needs more filler
tokens than FILLER has is refused; without FILLER it is the usual repeated sentences ("The grass
is green. The sky is blue. ...").
"""
import argparse
import array
import json
import os
import random
import re
import shlex
import shutil
import signal
import sys
import time
import types

GPT2_FORMAT = (20240520, 1, "H")  # magic, version, array typecode (uint16)
LLAMA3_FORMAT = (20240801, 7, "I")  # uint32
HEADER_INTS = 256
SHARD_NAME = re.compile(r"^((train|val)_\d{6}(\.mask)?\.bin|shards\.json)$")
MASK_FORMAT = (20240522, 1)  # a shard's loss mask: magic, version; one byte per token
EOT_FALLBACKS = ("<|end_of_text|>", "<|endoftext|>")
# Encode this many bytes (or pieces) per encode_batch call: enough to keep every core busy.
BATCH_BYTES = 16 << 20
BATCH_PIECES = 4096


class Fail(Exception):
    """A one-line error for the user: `error: [prepare] MESSAGE`, exit 2."""


class ByteLevelTokenizer:
    """A byte-level BPE tokenizer.json without merges, encoded here: added tokens are matched
    literally (leftmost, longest first, as `tokenizers` splits on them), every other byte is one
    token, the id of its byte-level symbol (GPT-2's bytes_to_unicode). What `tokenizers` gives such
    a file, without the package (tests/prepare_data_check.py compares both)."""

    @staticmethod
    def byte_symbols():
        visible = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) +
                   list(range(ord("®"), ord("ÿ") + 1)))
        symbols, extra = {}, 0
        for b in range(256):
            if b in visible:
                symbols[b] = chr(b)
            else:
                symbols[b] = chr(256 + extra)
                extra += 1
        return symbols

    @classmethod
    def load(cls, path):
        """The tokenizer, or None when `path` is not such a file."""
        try:
            with open(path, encoding="utf-8") as f:
                spec = json.load(f)
        except (OSError, ValueError):
            return None
        model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
        if (model.get("type") != "BPE" or model.get("merges") or spec.get("normalizer") or
                pre.get("type") != "ByteLevel" or pre.get("add_prefix_space")):
            return None
        vocab = dict(model.get("vocab") or {})
        symbols = cls.byte_symbols()
        if any(symbols[b] not in vocab for b in range(256)):
            return None
        added = {}
        for t in spec.get("added_tokens") or []:
            if t.get("lstrip") or t.get("rstrip") or t.get("single_word") or t.get("normalized"):
                return None
            added[t["content"]] = t["id"]
        return cls(vocab, added, symbols)

    def __init__(self, vocab, added, symbols):
        self.vocab = {**vocab, **added}
        self.added = sorted(added, key=len, reverse=True)  # longest first
        self.byte_ids = [vocab[symbols[b]] for b in range(256)]
        self.by_id = {i: t for t, i in self.vocab.items()}

    def get_vocab(self, with_added_tokens=True):
        return dict(self.vocab)

    def id_to_token(self, i):
        return self.by_id.get(i)

    def token_to_id(self, text):
        return self.vocab.get(text)

    def encode(self, text, add_special_tokens=False):
        ids, i = [], 0
        while i < len(text):
            hit = next((t for t in self.added if text.startswith(t, i)), None)
            if hit:
                ids.append(self.vocab[hit])
                i += len(hit)
                continue
            j = i + 1
            while j < len(text) and not any(text.startswith(t, j) for t in self.added):
                j += 1
            ids += [self.byte_ids[b] for b in text[i:j].encode("utf-8")]
            i = j
        return types.SimpleNamespace(ids=ids)

    def encode_batch(self, texts, add_special_tokens=False):
        return [self.encode(t) for t in texts]


BYTES = "bytes"  # --tokenizer bytes: the text's UTF-8 bytes are the ids


class ByteTokenizer:
    """--tokenizer bytes, with the part of `tokenizers.Tokenizer` this script calls: token i is the
    byte i (its text the character chr(i)), and a text encodes to its UTF-8 bytes."""

    class Encoding:
        def __init__(self, ids):
            self.ids = ids

    def get_vocab(self, with_added_tokens=True):
        return {chr(i): i for i in range(256)}

    def id_to_token(self, i):
        return chr(i) if 0 <= i < 256 else None

    def encode(self, text, add_special_tokens=False):
        return self.Encoding(list(text.encode("utf-8")))

    def encode_batch(self, texts, add_special_tokens=False):
        return [self.encode(t) for t in texts]


def load_tokenizer(path):
    if path == BYTES:
        return ByteTokenizer()
    if not os.path.isfile(path):
        raise Fail(f"{path}: no such file. Fix: pass the model's tokenizer.json to --tokenizer")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        own = ByteLevelTokenizer.load(path)
        if own is not None:
            return own
        raise Fail(f"the Python package `tokenizers` is not importable by {sys.executable}. Fix: "
                   "python3 -m venv VENV && VENV/bin/pip install tokenizers, then run "
                   "VENV/bin/python scripts/prepare_data.py ...")
    try:
        tok = Tokenizer.from_file(path)
    except Exception as e:  # tokenizers raises a bare Exception for a malformed file
        raise Fail(f"{path}: not a tokenizer.json `tokenizers` can load ({str(e).splitlines()[0]})."
                   " Fix: pass the model's Hugging Face tokenizer.json")
    # A tokenizer.json may carry the truncation and padding of the pipeline that saved it: for
    # shards they would cut every document (or chunk) to max_length and pad short ones with ids.
    # remat-train tokenize and sample ignore both too.
    tok.no_truncation()
    tok.no_padding()
    return tok


def vocab_size_of(tok):
    """One past the largest id: what model.vocab_size must at least be (ids may have gaps)."""
    return max(tok.get_vocab(with_added_tokens=True).values()) + 1


def splits_safely(path):
    """Whether encoding a document in pieces gives its ids: no step prepends to each input."""
    if path == BYTES:
        return True
    with open(path, encoding="utf-8") as f:
        spec = json.load(f)

    def prepends(node):
        if isinstance(node, dict):
            if node.get("add_prefix_space") is True or node.get("type") in ("Metaspace", "Prepend"):
                return True
            return any(prepends(v) for v in node.values())
        if isinstance(node, list):
            return any(prepends(v) for v in node)
        return False

    return not (prepends(spec.get("normalizer")) or prepends(spec.get("pre_tokenizer")))


def resolve_eot(tok, tokenizer_path, given, chat=False):
    """(id, text, where it came from). For chat data the vocabulary's end-of-text comes before the
    eos_token, which a chat template writes after every turn."""
    vocab = tok.get_vocab(with_added_tokens=True)
    if chat and given is None:
        for text in EOT_FALLBACKS:
            if text in vocab:
                return vocab[text], text, "the vocabulary"
    if given is not None:
        if given.isdigit():
            i = int(given)
            text = tok.id_to_token(i)
            if text is None:
                raise Fail(f"--eot {given}: no token has that id in {tokenizer_path}. Fix: pass an "
                           "id of the vocabulary, or the token's text")
            return i, text, "--eot"
        if given not in vocab:
            raise Fail(f"--eot {given!r}: not a token of {tokenizer_path}. Fix: pass the "
                       "end-of-text token's exact text or its id")
        return vocab[given], given, "--eot"
    if tokenizer_path == BYTES:
        return 10, "\n", "--tokenizer bytes: a newline"
    config = os.path.join(os.path.dirname(os.path.abspath(tokenizer_path)), "tokenizer_config.json")
    if os.path.isfile(config):
        try:
            with open(config, encoding="utf-8") as f:
                eos = json.load(f).get("eos_token")
        except (OSError, ValueError, AttributeError) as e:
            raise Fail(f"{config}: cannot read its eos_token ({e}). Fix: repair it, or pass --eot")
        if isinstance(eos, dict):
            eos = eos.get("content")
        if isinstance(eos, str):
            if eos not in vocab:
                raise Fail(f"{config}: eos_token {eos!r} is not in {tokenizer_path}. Fix: pass "
                           "--eot with the end-of-text token")
            return vocab[eos], eos, "tokenizer_config.json's eos_token"
    for text in EOT_FALLBACKS:
        if text in vocab:
            return vocab[text], text, "the vocabulary"
    raise Fail(f"{tokenizer_path}: no end-of-text token found (no tokenizer_config.json eos_token "
               f"beside it, no {' or '.join(EOT_FALLBACKS)}). Fix: pass --eot ID or --eot TOKEN")


def input_files(path, chat=False):
    """(files, kind): kind is "text" or "jsonl"."""
    if os.path.isdir(path) and chat:
        raise Fail(f"{path}: a folder; --chat reads one .jsonl file of conversations. Fix: pass "
                   "that file")
    if os.path.isdir(path):
        files = []
        for folder, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            files += [os.path.join(folder, n) for n in names
                      if n.endswith(".txt") and not n.startswith(".")]
        if not files:
            raise Fail(f"{path}: no *.txt files under it. Fix: put the text there as .txt files, "
                       "or pass a file")
        return sorted(files, key=os.fsencode), "text"
    if os.path.exists(path) and not os.path.isfile(path):
        raise Fail(f"{path}: not a regular file (a FIFO or a device is never read). Fix: pass a "
                   "text file, a folder of .txt files or a .jsonl file")
    if not os.path.isfile(path):
        raise Fail(f"{path}: no such file or folder. Fix: pass a text file, a folder of .txt files "
                   "or a .jsonl file")
    return [path], ("jsonl" if path.endswith(".jsonl") else "text")


def ends_in_non_space(buf, end):
    """Whether the character that ends at buf[end] (inclusive) is neither whitespace nor cut."""
    b = buf[end]
    if b < 0x80:
        return 0x21 <= b <= 0x7E
    start = end
    while start > 0 and end - start < 3 and 0x80 <= buf[start] <= 0xBF:
        start -= 1
    try:
        return not bytes(buf[start:end + 1]).decode("utf-8").isspace()
    except UnicodeDecodeError:
        return False


def cut_point(buf, lo):
    """The first p >= lo where a document may be cut without changing its ids, or -1 if none yet:
    buf[p-1] is a newline between a character that is not whitespace and printable ASCII. Only
    there is the newline a pre-token of its own, cut or not: at the end of an input, a whitespace
    run is one pre-token (\\s+(?!\\S) has nothing left to leave its last character for)."""
    j = buf.find(b"\n", max(lo - 1, 1))
    while j >= 0 and j + 1 < len(buf):
        if 0x21 <= buf[j + 1] <= 0x7E and ends_in_non_space(buf, j - 1):
            return j + 1
        j = buf.find(b"\n", j + 1)
    return -1


def decode_utf8(raw, path, offset):
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Fail(f"{path}: not UTF-8 at byte {offset + e.start}. Fix: convert the file to UTF-8 "
                   "(iconv -f LATIN1 -t UTF-8, say)")


class Pieces:
    """Documents as (split, document number, piece number, text), in input order."""

    def __init__(self, files, kind, text_key, chunk, can_split, val_fraction):
        self.files, self.kind, self.text_key = files, kind, text_key
        self.chunk, self.can_split = chunk, can_split
        self.total_bytes = sum(os.path.getsize(f) for f in files)
        held = int(val_fraction * self.total_bytes)
        self.val_from = self.total_bytes - held if held > 0 else None  # input byte offset
        self.bytes_done = 0
        self.documents = 0
        self.empty = 0

    def split_of(self, offset):
        return "val" if self.val_from is not None and offset >= self.val_from else "train"

    def __iter__(self):
        base = 0
        for path in self.files:
            if self.kind == "jsonl":
                yield from self._jsonl(path, base)
            else:
                yield from self._text(path, base)
            base += os.path.getsize(path)
            self.bytes_done = base

    def _next_cut(self, buf, start, eof, val_cut):
        """Where the piece at the head of `buf` (input offset `start`) ends, or -1: read more.
        A cut not found yet lies at len(buf) or later, past any found one: the least found wins."""
        cuts = []
        if val_cut and self.val_from is not None and start < self.val_from:  # at a line start
            cuts.append(cut_point(buf, self.val_from - start))
        if self.can_split:
            cuts.append(cut_point(buf, self.chunk))
        found = [c for c in cuts if c > 0]
        if found:
            return min(found)
        return len(buf) if eof else -1

    def _pieces(self, blocks, path, start, file_base, val_cut):
        """The pieces of one document whose bytes come in `blocks`, at input offset `start`;
        `val_cut`: cut it where the val tail begins (text files; a JSONL line goes whole)."""
        doc, piece, buf, eof = None, 0, bytearray(), False
        blocks = iter(blocks)
        while True:
            cut = -1 if not buf else self._next_cut(buf, start, eof, val_cut)
            if cut < 0:
                if eof:
                    break
                block = next(blocks, None)
                if block is None:
                    eof = True
                else:
                    buf += block
                continue
            if doc is None:
                doc = self.documents
                self.documents += 1
            text = decode_utf8(buf[:cut], path, start - file_base)
            yield self.split_of(start), doc, piece, text
            piece, start = piece + 1, start + cut
            del buf[:cut]
            self.bytes_done = start
        if doc is None:
            self.empty += 1

    def _text(self, path, base):
        def blocks():
            with open(path, "rb") as f:
                while True:
                    block = f.read(self.chunk)
                    if not block:
                        return
                    yield block

        yield from self._pieces(blocks(), path, base, base, True)

    def _jsonl(self, path, base):
        for number, start, end, obj in jsonl_records(path, base):
            text = obj.get(self.text_key) if isinstance(obj, dict) else None
            if not isinstance(text, str):
                keys = ", ".join(obj) if isinstance(obj, dict) else "none: not an object"
                raise Fail(f"{path}:{number}: no string under {self.text_key!r} (keys: "
                           f"{keys}). Fix: pass --text-key with the key that holds the text")
            # "replace": a lone surrogate (JSON's "\ud800") has no UTF-8 form.
            yield from self._pieces([text.encode("utf-8", "replace")], path, start, base, False)
            self.bytes_done = end


class ShardWriter:
    """One split's shards: at most `shard_tokens` tokens each, an end-of-text between documents.
    `whole`: every document ends with an end-of-text (the last too) and a shard ends between two
    (unless one document is longer than a shard). `masks`: a loss mask beside each shard."""

    def __init__(self, out, split, fmt, shard_tokens, eot, whole=False, masks=False, final=None):
        self.out, self.split, self.shard_tokens, self.eot = out, split, shard_tokens, eot
        self.final = final or out  # where the shards go when complete (messages name it)
        self.magic, self.version, self.typecode = fmt
        self.whole = whole
        self.buf = array.array(self.typecode)
        self.mask = bytearray() if masks else None
        self.doc_at = 0  # where the current document starts in buf (whole)
        self.last = None  # (document, piece) of the last piece appended
        self.paths, self.tokens, self.trained = [], 0, 0
        self.documents, self.document_tokens = 0, 0
        self.tmp = None  # the file being written, under its hidden name

    def remove_written(self):
        """Deletes every shard (and mask) this writer wrote, and the one it was writing."""
        masks = [p[:-4] + ".mask.bin" for p in self.paths]
        for path in self.paths + masks + ([self.tmp] if self.tmp else []):
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
        self.paths, self.tmp = [], None

    def move_to(self, folder):
        """Moves every shard (and mask) written into `folder`, under the same names."""
        moved = []
        for path in self.paths:
            for p in (path, path[:-4] + ".mask.bin"):
                if os.path.exists(p):
                    os.replace(p, os.path.join(folder, os.path.basename(p)))
            moved.append(os.path.join(folder, os.path.basename(path)))
        self.paths, self.out = moved, folder

    def add(self, doc, piece, ids, mask=None):
        # A piece that continues the last one joins it; anything else starts a new document here.
        if self.last is None or self.last != (doc, piece - 1):
            if self.last is not None:
                self._end_document()
            self.doc_at = len(self.buf)
            self.documents += 1
        self.buf.extend(ids)
        if self.mask is not None:
            self.mask.extend(mask if mask is not None else bytes(len(ids)))
        self.document_tokens += len(ids)
        self.last = (doc, piece)
        self._flush(self.shard_tokens)

    def _end_document(self):
        self.buf.append(self.eot)  # never trained: what follows it is another document
        self.document_tokens += 1
        if self.mask is not None:
            self.mask.append(0)

    def _flush(self, limit):
        while len(self.buf) > limit or (not self.whole and len(self.buf) >= limit and self.buf):
            cut = limit if not self.whole or self.doc_at == 0 else self.doc_at
            self._write(self.buf[:cut], self.mask[:cut] if self.mask is not None else None)
            del self.buf[:cut]
            if self.mask is not None:
                del self.mask[:cut]
            self.doc_at = max(0, self.doc_at - cut)

    def close(self):
        if self.whole and self.last is not None:
            self._end_document()
            self.last = None
        self._flush(self.shard_tokens)
        if self.buf:
            self._write(self.buf, self.mask)
            self.buf = array.array(self.typecode)
            self.mask = bytearray() if self.mask is not None else None

    def _write_file(self, path, header_ints, payload):
        """A header of 256 little-endian int32 (the given ones, then zeros) and `payload` (an array
        or bytes), under a hidden name then renamed: a glob never sees half a file. A failed write
        (a full disk) names the file; the run then removes what it wrote (prepare())."""
        header = array.array("i", header_ints + [0] * (HEADER_INTS - len(header_ints)))
        if sys.byteorder != "little":
            header.byteswap()
            if isinstance(payload, array.array):
                payload = array.array(payload.typecode, payload)
                payload.byteswap()
        tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
        self.tmp = tmp
        try:
            with open(tmp, "wb") as f:
                header.tofile(f)
                f.write(payload.tobytes() if isinstance(payload, array.array) else payload)
            os.replace(tmp, path)
        except OSError as e:
            shown = os.path.join(self.final, os.path.basename(path))
            raise Fail(f"{shown}: cannot write it ({e.strerror}, as {tmp}). Fix: free space on that "
                       "disk or choose another --out, then run again (this run's shards were "
                       "removed)") from e
        self.tmp = None

    def _write(self, tokens, mask):
        path = os.path.join(self.out, f"{self.split}_{len(self.paths):06d}.bin")
        self._write_file(path, [self.magic, self.version, len(tokens)], tokens)
        self.paths.append(path)  # before its mask: a failed mask write removes the shard too
        self.tokens += len(tokens)
        if mask is not None:
            self._write_file(path[:-4] + ".mask.bin", [*MASK_FORMAT, len(mask)], bytes(mask))
            self.trained += sum(mask)


def tokenizer_config(tokenizer_path):
    """(path, dict) of the tokenizer_config.json beside tokenizer.json, or (path, None)."""
    path = os.path.join(os.path.dirname(os.path.abspath(tokenizer_path)), "tokenizer_config.json")
    if not os.path.isfile(path):
        return path, None
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise Fail(f"{path}: not readable JSON ({e}). Fix: repair it")
    if not isinstance(config, dict):
        raise Fail(f"{path}: not a JSON object. Fix: use the model's tokenizer_config.json")
    return path, config


# Private-use characters that a template's {% generation %} blocks are wrapped in while rendering.
GENERATION_OPEN, GENERATION_CLOSE = "\ue000", "\ue001"


class NotTurnByTurn(Exception):
    """A conversation whose renderings, turn by turn, are not prefixes of each other."""


class ChatTemplate:
    """tokenizer_config.json's chat_template, rendered as transformers renders it (a sandboxed
    Jinja environment with trim_blocks and lstrip_blocks, the loopcontrols extension, the tojson
    filter, raise_exception and strftime_now, and the special tokens as variables), and the
    character spans of a conversation that are trained (the module's docstring says how)."""

    def __init__(self, tokenizer_path):
        where, config = tokenizer_config(tokenizer_path)
        source = (config or {}).get("chat_template")
        if isinstance(source, list):  # named templates: the default one
            source = next((t.get("template") for t in source
                           if isinstance(t, dict) and t.get("name") == "default"), None)
        if not isinstance(source, str) or not source.strip():
            raise Fail(f"{where}: {'no such file' if config is None else 'no chat_template'}, and "
                       "--chat renders conversations with the tokenizer's own template. Fix: use "
                       "the tokenizer (tokenizer.json and tokenizer_config.json) of a chat or "
                       "instruct model, or drop --chat")
        try:
            import jinja2
            import jinja2.ext
            import jinja2.nodes
            import jinja2.sandbox
        except ImportError:
            raise Fail(f"--chat needs the Python package jinja2, not importable by {sys.executable}"
                       ". Fix: apt install python3-jinja2 (or pip install jinja2)")
        self.errors = (jinja2.exceptions.TemplateError, TypeError, ValueError, KeyError)
        self.undefined = jinja2.exceptions.UndefinedError

        class Generation(jinja2.ext.Extension):
            tags = {"generation"}

            def parse(self, parser):
                lineno = next(parser.stream).lineno
                body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
                call = self.call_method("_mark")
                return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

            def _mark(self, caller):
                return GENERATION_OPEN + caller() + GENERATION_CLOSE

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                              sort_keys=sort_keys)

        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: time.strftime(fmt)
        try:
            self.template = env.from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise Fail(f"{where}: chat_template is not valid Jinja (line {e.lineno}: {e.message}). "
                       "Fix: use the model's own tokenizer_config.json")
        self.where = where
        self.marked = re.search(r"\{%-?\s*generation\s*-?%\}", source) is not None
        self.specials = {}
        for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
            value = config.get(key)
            value = value.get("content") if isinstance(value, dict) else value
            if isinstance(value, str):
                self.specials[key] = value
        self.end_of_turn = self.specials.get("eos_token")

    def render(self, messages, add_generation_prompt=False):
        return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                    **self.specials)

    def trained_spans(self, messages):
        """(text, [(start, end)]): the rendered conversation and its trained character spans.
        Raises NotTurnByTurn (a message for the caller to place at its file and line), or what
        rendering raises."""
        if self.marked:
            raw, text, spans, start = self.render(messages), [], [], None
            for c in raw:
                if c == GENERATION_OPEN:
                    start = sum(map(len, text))
                elif c == GENERATION_CLOSE:
                    spans.append((start, sum(map(len, text))))
                else:
                    text.append(c)
            return "".join(text), spans
        text = self.render(messages)
        spans = []
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            before = self.render(messages[:i], add_generation_prompt=True)
            upto = self.render(messages[:i + 1])
            if not upto.startswith(before) or not text.startswith(upto):
                raise NotTurnByTurn(
                    f"the chat template does not render this conversation turn by turn (turn {i} "
                    "changes what comes before it), so the assistant turns cannot be found. Fix: "
                    "add {% generation %} ... {% endgeneration %} around the assistant content in "
                    f"the chat_template of {self.where}")
            end = len(upto)
            if self.end_of_turn:  # not the newline a template writes after its end-of-turn token
                last = upto.rfind(self.end_of_turn, len(before))
                if last >= 0:
                    end = last + len(self.end_of_turn)
            spans.append((len(before), end))
        return text, spans


def jsonl_records(path, base=0):
    """(line number, start offset, end offset, parsed JSON) of each non-blank line of a JSONL
    file; offsets count from `base`."""
    offset = base
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            start, offset = offset, offset + len(line)
            if not line.strip():
                continue
            try:
                yield number, start, offset, json.loads(line)
            except UnicodeDecodeError as e:
                raise Fail(f"{path}:{number}: not UTF-8 at byte {start + e.start}. Fix: convert "
                           "the file to UTF-8 (iconv -f LATIN1 -t UTF-8, say)")
            except ValueError as e:
                raise Fail(f"{path}:{number}: not a JSON object ({e}). Fix: one JSON object per "
                           "line")


def conversation_records(path, val_from):
    """(line number, split, messages) of each non-blank line of a chat JSONL file."""
    for number, start, _, record in jsonl_records(path):
        messages = record.get("messages") if isinstance(record, dict) else None
        if not isinstance(messages, list) or not messages:
            keys = ", ".join(record) if isinstance(record, dict) else "none: not an object"
            raise Fail(f"{path}:{number}: no \"messages\" list (keys: {keys}). Fix: each line "
                       "holds {\"messages\": [{\"role\": \"user\", \"content\": \"...\"}, "
                       "{\"role\": \"assistant\", \"content\": \"...\"}]}")
        for j, m in enumerate(messages):
            if (not isinstance(m, dict) or not isinstance(m.get("role"), str) or
                    not isinstance(m.get("content"), str)):
                raise Fail(f"{path}:{number}: message {j} is not {{\"role\": string, "
                           "\"content\": string}. Fix: give every message a role and a "
                           "text content")
        split = "val" if val_from is not None and start >= val_from else "train"
        yield number, split, messages


def prepare_chat(args, tok, writers, eot, eot_text):
    """--chat: each conversation rendered, encoded span by span, masked, one document."""
    template = ChatTemplate(args.tokenizer)
    total = os.path.getsize(args.input)
    held = int(args.val_fraction * total)
    conversations = untrained = 0
    batch = []

    def flush():
        pieces = [text for _, _, segments in batch for text, _ in segments]
        encoded = iter(tok.encode_batch(pieces, add_special_tokens=False))
        for number, split, segments in batch:
            ids, mask = [], bytearray()
            for _, trained in segments:
                piece = next(encoded).ids
                ids += piece
                mask += bytes([1 if trained else 0]) * len(piece)
            if eot in ids:
                raise Fail(f"{args.input}:{number}: the end-of-text token {eot_text!r} ({eot}) "
                           "occurs inside the rendered conversation, where it would split it into "
                           "two documents. Fix: pass --eot with a token the chat template never "
                           "writes")
            writers[split].add(number, 0, ids, mask)
        batch.clear()

    for number, split, messages in conversation_records(args.input, total - held if held else None):
        try:
            text, spans = template.trained_spans(messages)
        except NotTurnByTurn as e:
            raise Fail(f"{args.input}:{number}: {e}")
        except template.errors as e:
            # A name the template uses that no one defines (not a key a message lacks, which is
            # "'dict object' has no attribute ..."): the template's fault, whatever the data.
            name = re.fullmatch(r"'(\w+)' is undefined", str(e))
            if isinstance(e, template.undefined) and name:
                raise Fail(f"{template.where}: the chat template uses {name.group(1)!r}, which "
                           "neither it nor transformers' globals define (raise_exception, "
                           "strftime_now, the special tokens; messages, add_generation_prompt), "
                           f"first at conversation {args.input}:{number}. Fix: use the model's own "
                           "tokenizer_config.json, or define it in the template")
            raise Fail(f"{args.input}:{number}: the chat template refuses this conversation "
                       f"({e}). Fix: use the roles and order the model's template accepts")
        segments, at = [], 0
        for start, end in sorted(spans):
            if start > at:
                segments.append((text[at:start], False))
            if end > max(start, at):
                segments.append((text[max(start, at):end], True))
            at = max(at, end)
        if at < len(text):
            segments.append((text[at:], False))
        conversations += 1
        untrained += not spans
        batch.append((number, split, segments))
        if len(batch) >= BATCH_PIECES:
            flush()
    if batch:
        flush()
    return conversations, untrained


def size(n):
    """1536 -> "1.5 KiB"."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024.0


class Progress:
    """A status line on stderr: rewritten in place on a terminal, every 10 s otherwise."""

    def __init__(self, pieces):
        self.pieces = pieces
        self.start = self.last = time.monotonic()
        self.tty = sys.stderr.isatty()

    def line(self, tokens):
        p, secs = self.pieces, max(time.monotonic() - self.start, 1e-9)
        pct = 100.0 * p.bytes_done / p.total_bytes if p.total_bytes else 100.0
        return (f"[prepare] {tokens:,} tokens, {p.documents:,} documents, "
                f"{size(p.bytes_done)} of {size(p.total_bytes)} ({pct:.0f}%), "
                f"{tokens / secs:,.0f} tok/s")

    def update(self, tokens, final=False):
        now = time.monotonic()
        if not final and now - self.last < (0.5 if self.tty else 10.0):
            return
        self.last = now
        end = "\n" if final or not self.tty else ""
        sys.stderr.write(("\r\033[K" if self.tty else "") + self.line(tokens) + end)
        sys.stderr.flush()


def prepare(args):
    if args.shard_tokens < 1 or args.shard_tokens >= 2**31:
        raise Fail(f"--shard-tokens {args.shard_tokens}: a shard's header counts tokens in an "
                   "int32. Fix: pass 1 to 2147483647")
    if not 0 <= args.val_fraction < 1:
        raise Fail(f"--val-fraction {args.val_fraction}: not in [0, 1). Fix: pass 0.01, say")
    if args.chunk_bytes < 1:
        raise Fail(f"--chunk-bytes {args.chunk_bytes}: must be positive. Fix: pass 1048576, say")
    files, kind = input_files(args.input, args.chat)
    if args.chat and kind != "jsonl":
        raise Fail(f"{args.input}: --chat reads a .jsonl file of conversations. Fix: pass one, "
                   "each line {\"messages\": [{\"role\": ..., \"content\": ...}, ...]}")
    tok = load_tokenizer(args.tokenizer)
    if args.chat:
        ChatTemplate(args.tokenizer)  # a missing or broken template fails before any file is written
    vocab = vocab_size_of(tok)
    eot, eot_text, eot_from = resolve_eot(tok, args.tokenizer, args.eot, chat=args.chat)
    fmt = GPT2_FORMAT if vocab <= 2**16 else LLAMA3_FORMAT
    mode = "chat" if args.chat else "documents" if args.documents else "text"

    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise Fail(f"--out {args.out}: a file, not a folder. Fix: name a folder for the shards")
    os.makedirs(args.out, exist_ok=True)
    old = sorted(n for n in os.listdir(args.out) if SHARD_NAME.match(n))
    if old and not args.force:
        raise Fail(f"{args.out}: has shards already ({', '.join(old[:3])}"
                   f"{', ...' if len(old) > 3 else ''}). Fix: choose another --out, or pass "
                   "--force to replace them")
    # Written into a folder of this run's own inside --out and moved in when complete: a run that
    # fails (bad input, a full disk, a signal) leaves the shards --force would have replaced.
    stage = os.path.join(args.out, f".prepare-{os.getpid()}")
    writers = {}
    whole = mode != "text"
    try:
        os.makedirs(stage, exist_ok=True)
        writers = {s: ShardWriter(stage, s, fmt, args.shard_tokens, eot, whole, args.chat,
                                  args.out)
                   for s in ("train", "val")}
        sys.stderr.write(f"[prepare] {len(files)} {kind} file{'s' if len(files) != 1 else ''}, "
                         f"vocabulary {vocab:,} ({'uint16' if fmt is GPT2_FORMAT else 'uint32'} "
                         f"shards), end-of-text {eot_text!r} = {eot} (from {eot_from})\n")
        if args.chat:
            conversations, untrained = prepare_chat(args, tok, writers, eot, eot_text)
            for w in writers.values():
                w.close()
            what, empty = f"{conversations:,} conversations", 0
            if untrained:
                what += f" ({untrained:,} without an assistant turn: nothing trained there)"
        else:
            pieces = Pieces(files, kind, args.text_key, args.chunk_bytes,
                            splits_safely(args.tokenizer), args.val_fraction)
            write_shards(tok, pieces, writers, Progress(pieces))
            what, empty = f"{pieces.documents:,} documents", pieces.empty
        check_splits(args, writers, empty)
    except BaseException:  # a full disk, bad input, ^C: no partial shard set is left behind
        for w in writers.values():
            w.remove_written()
        shutil.rmtree(stage, ignore_errors=True)
        raise
    # Complete: the swap and the manifest run with SIGINT and SIGTERM held, and a stop that comes
    # now is too late to undo anything (ignored), so --out never holds half of each set.
    stops = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    for name in old:  # --force: a shorter output must not leave a stale tail shard behind
        os.remove(os.path.join(args.out, name))
    for w in writers.values():
        w.move_to(args.out)
    os.rmdir(stage)
    report(args, writers, vocab, fmt, eot, eot_text, mode, what)
    for sig in stops:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)


def write_shards(tok, pieces, writers, progress):
    """Encodes every piece and writes the shards of both splits."""
    batch, batch_bytes = [], 0

    def flush():
        encodings = tok.encode_batch([p[3] for p in batch], add_special_tokens=False)
        for (split, doc, piece, _), enc in zip(batch, encodings):
            w = writers[split]
            # --documents: an end-of-text inside a document would split it in two for training's
            # document masks (as --chat refuses it inside a conversation).
            if w.whole and w.eot in enc.ids:
                raise Fail(f"document {doc + 1}: the end-of-text token ({w.eot}) occurs inside it, "
                           "where it would split it into two documents. Fix: pass --eot with a "
                           "token the documents never contain (with --tokenizer bytes, a byte "
                           "they never hold, such as --eot 0)")
            w.add(doc, piece, enc.ids)
        batch.clear()
        progress.update(sum(w.tokens + len(w.buf) for w in writers.values()))

    for p in pieces:
        batch.append(p)
        batch_bytes += len(p[3])
        if batch_bytes >= BATCH_BYTES or len(batch) >= BATCH_PIECES:
            flush()
            batch_bytes = 0
    if batch:
        flush()
    for w in writers.values():
        w.close()
    progress.update(sum(w.tokens for w in writers.values()), final=True)


def check_splits(args, writers, empty):
    """Both splits have shards (val: when asked for)."""
    train, val = writers["train"], writers["val"]
    if not train.paths:
        raise Fail(f"{args.input}: no text to train on ({empty} empty documents"
                   f"{', all in the validation tail' if val.paths else ''}). Fix: give more text, "
                   "or lower --val-fraction")
    if args.val_fraction > 0 and not val.paths:
        raise Fail(f"{args.input}: no document or line starts in the last {args.val_fraction} of "
                   "the input, so nothing was held out (no shards kept). Fix: raise "
                   "--val-fraction, or pass --val-fraction 0 and set data.val_fraction in training")


def report(args, writers, vocab, fmt, eot, eot_text, mode, what):
    """What was written, and the --set options that train on it."""
    train, val = writers["train"], writers["val"]

    def shards(w):
        plural = "s" if len(w.paths) != 1 else ""
        return f"{len(w.paths)} {w.split} shard{plural} ({w.tokens:,} tokens)"

    kind_name = "uint16" if fmt is GPT2_FORMAT else "uint32"
    share = 100.0 * (train.trained + val.trained) / max(1, train.tokens + val.tokens)
    masks = f", loss masks beside them ({share:.1f}% of tokens trained)" if args.chat else ""
    print(f"wrote {shards(train)}{' and ' + shards(val) if val.paths else ''}, {kind_name}, "
          f"{what}, to {args.out}{masks}")
    manifest = {
        "eot_token": eot, "eot_text": eot_text, "vocab_size": vocab, "mode": mode,
        "tokenizer": args.tokenizer if args.tokenizer == BYTES else os.path.abspath(args.tokenizer),
        "documents": {"train": train.documents, "val": val.documents},
        "mean_document_tokens": round(train.document_tokens / max(1, train.documents), 2),
    }
    if args.chat:
        manifest["trained_tokens"] = {"train": train.trained, "val": val.trained}
    with open(os.path.join(args.out, ".shards.json.tmp"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    os.replace(os.path.join(args.out, ".shards.json.tmp"), os.path.join(args.out, "shards.json"))
    options = ["--set data.source=tokens",
               "--set " + shlex.quote(f"data.path={os.path.join(args.out, 'train_*.bin')}")]
    if val.paths:
        options += ["--set " + shlex.quote(f"data.val_path={os.path.join(args.out, 'val_*.bin')}"),
                    "--set data.val_fraction=0"]
    if mode != "text":
        options += ["--set data.order=packed", "--set data.attention=document"]
    options.append(f"--set model.vocab_size={vocab}")
    print("train on them with (model.vocab_size may be larger, a multiple of 64 say):")
    print("  " + " ".join(options))


# ---- passkey retrieval tasks (--passkey) ----

PASSKEY_INSTRUCTION = ("There is an important info hidden inside a lot of irrelevant text. Find it "
                       "and memorize it. I will quiz you about the important information there.\n")
PASSKEY_FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. There and "
                  "back again. ")
MASK_FORMAT = (20240522, 1)  # magic, version: a shard's loss mask, one byte per token


class PasskeyTokenizer:
    """A tokenizer.json through the `tokenizers` package (or `bytes`), no special tokens added."""

    def __init__(self, path):
        self.tok = load_tokenizer(path)
        self.vocab_size = vocab_size_of(self.tok)

    def encode(self, text):
        return self.tok.encode(text, add_special_tokens=False).ids


def parse_count(text, flag):
    """"4k" -> 4096, as remat-train reads counts (k = 1024, M = 1024^2)."""
    m = re.fullmatch(r"(\d+)([kKmM]?)", text.strip())
    if not m or int(m.group(1)) == 0:
        raise Fail(f"{flag} {text!r}: not a count. Fix: write e.g. 4k,16k,64k or 4096")
    return int(m.group(1)) * {"": 1, "k": 1024, "m": 1024 * 1024}[m.group(2).lower()]


def parse_depths(text):
    try:
        depths = [float(d) for d in text.split(",")]
    except ValueError:
        depths = [-1.0]
    if not depths or any(not 0.0 <= d <= 1.0 for d in depths):
        raise Fail(f"--depths {text!r}: each depth is a fraction of the filler in [0, 1]. Fix: "
                   "write e.g. 0,0.25,0.5,0.75,1")
    return depths


def write_token_file(path, header, data):
    """A 1024-byte header of int32 (magic, version, count, zeros), then `data`, under a hidden
    name first: a reader never sees half a file."""
    head = array.array("i", list(header) + [0] * (HEADER_INTS - len(header)))
    if sys.byteorder != "little":
        head.byteswap()
        if data.itemsize > 1:
            data = array.array(data.typecode, data)
            data.byteswap()
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    with open(tmp, "wb") as f:
        head.tofile(f)
        data.tofile(f)
    os.replace(tmp, path)


def passkey(args):
    if args.out is None:
        raise Fail("--passkey needs --out DIR. Fix: prepare_data.py --passkey --tokenizer T "
                   "--lengths 4k --depths 0,0.5,1 --out DIR")
    if args.lengths is None or args.depths is None:
        raise Fail("--passkey needs --lengths and --depths. Fix: e.g. --lengths 4k,16k,64k "
                   "--depths 0,0.25,0.5,0.75,1")
    lengths = [parse_count(x, "--lengths") for x in args.lengths.split(",")]
    depths = parse_depths(args.depths)
    if args.samples < 1:
        raise Fail(f"--samples {args.samples}: must be positive. Fix: pass 1 or more")
    tok = PasskeyTokenizer(args.tokenizer)
    names = ("passkey.bin", "passkey.mask.bin", "passkey.json")
    os.makedirs(args.out, exist_ok=True)
    old = [n for n in names if os.path.exists(os.path.join(args.out, n))]
    if old and not args.force:
        raise Fail(f"{args.out}: has {', '.join(old)} already. Fix: choose another --out, or pass "
                   "--force to replace them")

    # The filler: FILLER's text in order (never repeated), or the usual sentences repeated.
    longest = max(lengths)
    if args.input is not None:
        files, kind = input_files(args.input)
        if kind != "text":
            raise Fail(f"{args.input}: the filler is text (a .txt file or a folder of them). Fix: "
                       "pass a text file")
        filler, where = [], args.input
        for path in files:
            with open(path, "rb") as f:
                filler += tok.encode(decode_utf8(f.read(), path, 0))
            if len(filler) > longest:
                break
    else:
        unit = tok.encode(PASSKEY_FILLER)
        filler, where = unit * (longest // len(unit) + 1), "the repeated sentences"

    rng = random.Random(args.seed)
    fmt = GPT2_FORMAT if tok.vocab_size <= 2**16 else LLAMA3_FORMAT
    tokens, mask, tasks = array.array(fmt[2]), array.array("B"), []
    instruction = tok.encode(PASSKEY_INSTRUCTION)
    question = tok.encode("\nWhat is the pass key? The pass key is")
    for length in lengths:
        for depth in depths:
            for sample in range(args.samples):
                key = str(rng.randrange(10000, 100000))
                needle = tok.encode(f" The pass key is {key}. Remember it. {key} is the pass key. ")
                answer = tok.encode(" " + key)
                fixed = len(instruction) + len(needle) + len(question) + len(answer)
                need = length + 1 - fixed  # filler tokens: the task is a window of length + 1
                if need < 0:
                    raise Fail(f"--lengths {length}: shorter than the task's own text ({fixed} "
                               f"tokens besides the filler). Fix: use lengths of at least "
                               f"{fixed - 1}")
                if need > len(filler):
                    raise Fail(f"--lengths {length}: a task of {length + 1} tokens needs {need:,} "
                               f"filler tokens, and {where} has {len(filler):,}. Fix: give more "
                               "filler text, or shorter --lengths")
                before = round(depth * need)
                ids = (instruction + filler[:before] + needle + filler[before:need] + question
                       + answer)
                assert len(ids) == length + 1
                tasks.append({"length": length, "depth": depth, "sample": sample, "key": key,
                              "offset": len(tokens), "tokens": len(ids),
                              "needle_token": len(instruction) + before,
                              "answer_tokens": len(answer)})
                tokens.extend(ids)
                mask.extend([0] * (len(ids) - len(answer)) + [1] * len(answer))
    if len(tokens) >= 2**31:
        raise Fail(f"{len(tokens):,} tokens in all: a shard's header counts them in an int32. Fix: "
                   "fewer or shorter tasks")
    write_token_file(os.path.join(args.out, "passkey.bin"), fmt[:2] + (len(tokens),), tokens)
    write_token_file(os.path.join(args.out, "passkey.mask.bin"), MASK_FORMAT + (len(tokens),), mask)
    index = {"format": "remat-train passkey tasks", "version": 1, "tokenizer": args.tokenizer,
             "vocab_size": tok.vocab_size, "filler": where, "seed": args.seed,
             "shard": "passkey.bin", "mask": "passkey.mask.bin", "tasks": tasks}
    tmp = os.path.join(args.out, ".passkey.json.tmp")
    with open(tmp, "w") as f:
        json.dump(index, f, indent=1)
        f.write("\n")
    os.replace(tmp, os.path.join(args.out, "passkey.json"))
    print(f"wrote {len(tasks)} passkey tasks ({len(lengths)} length{'s' * (len(lengths) > 1)} x "
          f"{len(depths)} depth{'s' * (len(depths) > 1)} x {args.samples} sample"
          f"{'s' * (args.samples > 1)}, {len(tokens):,} tokens) to {args.out}")
    print(f"evaluate with: remat-train eval --checkpoint DIR --passkey {args.out}")


def encode(args):
    tok = load_tokenizer(args.tokenizer)
    print(" ".join(str(i) for i in tok.encode(args.encode, add_special_tokens=False).ids))


def main():
    ap = argparse.ArgumentParser(
        description="Tokenize text into llm.c token shards for remat-train (see docs/data.md).")
    ap.add_argument("input", nargs="?", help="a text file, a folder of .txt files or a .jsonl file")
    ap.add_argument("--tokenizer", required=True,
                    help="the model's tokenizer.json, or 'bytes': UTF-8 bytes are the ids (0-255)")
    ap.add_argument("--out", help="the folder the shards go to (created if missing)")
    ap.add_argument("--text-key", default="text", help="JSONL: the key holding the text (text)")
    ap.add_argument("--eot", help="end-of-text token between documents: an id or the token's text")
    ap.add_argument("--val-fraction", type=float, default=0.01,
                    help="the input's tail held out as val shards (0.01; 0: none)")
    ap.add_argument("--shard-tokens", type=int, default=100_000_000,
                    help="tokens per shard at most (100000000, as llm.c)")
    ap.add_argument("--chunk-bytes", type=int, default=1 << 20,
                    help="encode long documents in pieces of about this many bytes (1048576)")
    ap.add_argument("--force", action="store_true", help="replace the shards already in --out")
    modes = ap.add_mutually_exclusive_group()
    modes.add_argument("--documents", action="store_true",
                       help="every document ends with the end-of-text token; shards end between "
                            "documents (for data.attention = document, data.order = packed)")
    modes.add_argument("--chat", action="store_true",
                       help="INPUT is JSONL of {\"messages\": [...]}: rendered with the "
                            "tokenizer's chat template, assistant turns trained (X.mask.bin)")
    ap.add_argument("--encode", metavar="TEXT",
                    help="print TEXT's ids (for `remat-train sample --prompt`) and exit")
    ap.add_argument("--passkey", action="store_true",
                    help="write passkey retrieval tasks (INPUT, if given, is the filler text)")
    ap.add_argument("--lengths", help="--passkey: task lengths in tokens, e.g. 4k,16k,64k")
    ap.add_argument("--depths", help="--passkey: where the key sits in the filler, e.g. 0,0.5,1")
    ap.add_argument("--samples", type=int, default=1,
                    help="--passkey: tasks (keys) per length and depth (1)")
    ap.add_argument("--seed", type=int, default=1, help="--passkey: the keys' random seed (1)")
    args = ap.parse_args()

    # SIGTERM (kill, timeout, a batch scheduler) stops the run as Ctrl-C does: through the cleanup
    # of prepare() (no partial shard set left), then one line and 128 + the signal.
    class Stopped(BaseException):
        def __init__(self, signum):
            super().__init__(signum)
            self.signum = signum

    def stop(signum, _frame):
        raise Stopped(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        if args.passkey:
            passkey(args)
        elif args.encode is not None:
            encode(args)
        elif args.input is None or args.out is None:
            raise Fail("INPUT and --out are needed to write shards. Fix: prepare_data.py "
                       "--tokenizer tokenizer.json INPUT --out DIR (or --encode TEXT)")
        else:
            prepare(args)
    except Fail as e:
        if sys.stderr.isatty():
            sys.stderr.write("\n")
        sys.stderr.write(f"error: [prepare] {e}\n")
        sys.exit(2)
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        sys.stderr.write(f"error: [prepare] {where}{e.strerror or e}. Fix: check the path and "
                         "its permissions\n")
        sys.exit(2)
    except Stopped as e:
        if sys.stderr.isatty():
            sys.stderr.write("\n")
        sys.stderr.write(f"error: [prepare] stopped by {signal.Signals(e.signum).name}: the shards "
                         "this run wrote were removed (--out holds what it held before)\n")
        sys.exit(128 + e.signum)


if __name__ == "__main__":
    main()
