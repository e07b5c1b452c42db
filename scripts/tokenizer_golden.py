#!/usr/bin/env python3
"""The tokenizer golden: what the `tokenizers` package makes of a multilingual corpus, for the C++
tokenizer's tests (tests/test_tokenizer.cpp) to compare against without Python.

Generate (deterministic; rewrites tests/golden/tokenizers/golden.json):

    scripts/make-hf-venv.sh && /work/venv-hf/bin/python scripts/tokenizer_golden.py

It reads the real tokenizer.json files committed beside the golden (tests/golden/tokenizers/*.json.xz,
their sources in README.md there) and, for each *variant* (a file, optionally with some of its
top-level keys replaced: the pipelines of other model families on a real vocabulary), records
  * encode: Tokenizer.encode(text, add_special_tokens=False).ids for every corpus text,
  * encode_special: the same with add_special_tokens=True (the post-processor's template),
  * decode: Tokenizer.decode(encode_special ids, skip_special_tokens=False),
  * stream (some variants): the chunks DecodeStream(skip_special_tokens=False) yields, id by id,
  * big: the length and FNV-1a hash of the ids of the corpus repeated to 256 KiB (some variants).
Tiny whole files (vocabularies of a dozen tokens) cover what the real ones never meet. And
decode_cases: hand-picked id sequences (characters split across tokens, bytes that are no
UTF-8, byte-fallback runs) with tokenizers' decode of each.

Truncation and padding are switched off (the GPT-2 file sets a truncation; remat-train's
tokenizer never truncates or pads). The C++ test applies the same patches (stored in the golden).
"""
import json
import lzma
import os

from golden_env import golden_dir, missing_packages

try:
    import tokenizers
    from tokenizers import Tokenizer
    from tokenizers.decoders import DecodeStream
except ImportError as e:
    missing_packages("tokenizer_golden.py", "the tokenizers package", e)

DIR = golden_dir("tokenizers")

# Every kind of text the pre-tokenizers and normalizers treat specially: contractions (any case,
# the long s that case-folds to s), emoji with modifiers and joiners, CJK, combining marks in
# composed and decomposed forms (NFC changes them; the Angstrom sign is a singleton), other
# scripts, every Unicode space and runs of them (U+0085 and U+180E are where regex libraries
# disagree on \s), digits of several scripts, newline forms, the special tokens of each family in
# running text (with the whitespace Phi-3's rstrip tokens take), code, empty and blank texts.
CORPUS = [
    "Hello world! I'm here, you're there; they'll've gone. DON'T SHOUT'S. It's O'Neil's.",
    "Emoji: 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ 🤖✨ 😀😃😄 🏳️‍🌈",
    "中文测试：你好，世界！日本語のテキスト、カタカナ。한국어 텍스트입니다.",
    "e\u0301 vs \u00e9; A\u030a vs \u00c5 vs \u212b; Tie\u0302\u0301ng Vie\u0323\u0302t; \u1e31 k\u0301; "
    "\u1100\u1161\u11a8 \uac01; q\u0323\u0307 q\u0307\u0323; \u0344 \u0958 \u2126 \u0041\u0328\u0301",
    "नमस्ते दुनिया; مرحبا بالعالم; שָׁלוֹם עוֹלָם; Привет, мир! Ελληνικά; ภาษาไทย",
    "a    b\t\tc \u00a0d\u3000e\u0085f\u180eg\u2028h\u200bi\u2009j\u202fk   \n  \n\n   end   ",
    "1 12 123 1234 12345 1234567890 3.14159 -42 1,000,000 ٣٤٥ ①② Ⅻ ½ 2024-12-31 x2y33z444",
    "line1\nline2\r\nline3\n\n\nline4\r\r\n\t\n \n",
    "<|endoftext|>Hello<|endoftext|> world <|endoftext|>\n<|im_start|>user\nhi<|im_end|>",
    "<s>[INST] hi [/INST]</s>   <|user|>  \n question<|end|>\n<|assistant|>answer</s>x",
    "def f(x):\n    return x**2  # square\n\nint main() { return 0; }\n\t\tif (a && b) {}\n",
    "",
    " ",
    "   leading spaces and trailing   ",
    "'s 'S 'ſ ’s 'LL 'Ve 'd'm",
    "abc ab a b cab abcabc Hello Hell ba aab abab bab",
    "Pneumonoultramicroscopicsilicovolcanoconiosis aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "The café naïve coöperate façade — “quotes” ‘single’ … ©®™ €100 £5 ¥ § ¶ •",
    "\u0000\u0001\u007f bell\u0007 esc\u001b[0m \ufeffbom \ufffd",
    "ﬁ ligature ﬀ ㎏ ¹²³ ｆｕｌｌ ｗｉｄｔｈ",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛 𠀋 𐍈",
    "<|endoftext| <endoftext> < s > <s <|endoftext|><|endoftext|>",
    "<|end|> x <|user|>\t\ny ▁ already ▁▁x ▁",
    "mask: a <mask> b  \t<mask>c<mask><mask> | word words sword _word word. (word) spaced  spaced!",
    "\u00c5ngstr\u00f6m vs A\u030angstro\u0308m vs \u212bngstr\u00f6m; x\u00c5ngstr\u00f6my",
    # Assigned in Unicode 15.0-16.0, after PCRE2 10.42's tables (data/unicode_properties.inc):
    # Kawi letters, sign and digits, Nag Mundari letters and digits, CJK Extensions H and I,
    # Garay letters and digits, Latin capitals, a combining Latin letter now Alphabetic.
    "Kawi \U00011F04\U00011F05\U00011F00x \U00011F5012 Nag \U0001E4D0\U0001E4D1 \U0001E4F01234 "
    "\U0001E4F1\U0001E4F2\U0001E4F3\U0001E4F4 CJK \U00031350\U00031351 \U0002EBF0\U0002EBF1x "
    "Garay \U00010D4A\U00010D4B \U00010D4012 \uA7CB\uA7CC a\u0363b 7\U0001E4F0",
]

# The pre-tokenizer of SmolLM2 and StarCoder (digits one by one, then GPT-2's byte level), of
# Falcon (punctuation, byte level, digits, then threes of digits), of Qwen2 (NFC, then its split
# regex: single digits), and newer Llama/Mistral conversions (Metaspace instead of the Prepend +
# Replace normalizer); Llama 2 / TinyLlama's template (<s> first).
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
              "use_regex": True}
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
               r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA2_TEMPLATE = {
    "type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
    "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
             {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
    "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
}
# Added tokens with each option the real files do not exercise: lstrip (RoBERTa's <mask>),
# single_word, a normalized token with rstrip, and a normalized token that the normalizer (NFC)
# changes (matched, and decoded, in its normalized form).
def added(base_tokens, extra):
    return base_tokens + [dict({"single_word": False, "lstrip": False, "rstrip": False,
                                "normalized": False, "special": False}, **t) for t in extra]


GPT2_ADDED = [{"id": 50256, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
               "rstrip": False, "normalized": True, "special": True}]
OLMO1_ADDED_EXTRA = [{"id": 50280, "content": "A\u030angstr\u00f6m", "normalized": True}]
VARIANTS = [
    {"name": "gpt2", "file": "gpt2.json.xz", "patch": {}, "stream": True, "big": True},
    {"name": "gpt2-digits", "file": "gpt2.json.xz", "patch": {"pre_tokenizer": {
        "type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True}, BYTE_LEVEL]}}},
    {"name": "gpt2-prefix-space", "file": "gpt2.json.xz", "patch": {
        "pre_tokenizer": dict(BYTE_LEVEL, add_prefix_space=True)}},
    {"name": "gpt2-added", "file": "gpt2.json.xz", "patch": {"added_tokens": added(GPT2_ADDED, [
        {"id": 50257, "content": "<mask>", "lstrip": True, "special": True},
        {"id": 50258, "content": "word", "single_word": True},
        {"id": 50259, "content": " spaced", "rstrip": True, "normalized": True}])}},
    {"name": "gpt2-falcon", "file": "gpt2.json.xz", "patch": {"pre_tokenizer": {
        "type": "Sequence", "pretokenizers": [
            {"type": "Punctuation", "behavior": "Contiguous"}, BYTE_LEVEL,
            {"type": "Digits", "individual_digits": False},
            {"type": "Split", "pattern": {"Regex": "[0-9][0-9][0-9]"}, "behavior": "Isolated",
             "invert": False}]}}},
    {"name": "olmo2", "file": "olmo2.json.xz", "patch": {}, "big": True},
    {"name": "olmo2-qwen2", "file": "olmo2.json.xz", "patch": {
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_REGEX}, "behavior": "Isolated",
             "invert": False},
            dict(BYTE_LEVEL, use_regex=False)]}}},
    {"name": "olmo1", "file": "olmo1.json.xz", "patch": {}},
    {"name": "olmo1-added", "file": "olmo1.json.xz", "patch": {}, "added_extra": OLMO1_ADDED_EXTRA},
    {"name": "phi3", "file": "phi3.json.xz", "patch": {}, "stream": True, "big": True},
    {"name": "phi3-llama2", "file": "phi3.json.xz", "patch": {"post_processor": LLAMA2_TEMPLATE}},
    {"name": "phi3-metaspace", "file": "phi3.json.xz", "patch": {
        "normalizer": None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
                          "split": False}}, "stream": True},
    {"name": "phi3-metaspace-split", "file": "phi3.json.xz", "patch": {
        "normalizer": None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always",
                          "split": True},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "ByteFallback"},
            {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}]}},
     "stream": True},
]
# Tiny vocabularies, whole files written here ("file": None), for what the real ones never meet:
# characters without a token (dropped, or <unk>, fused or not), a continuing-subword prefix and an
# end-of-word suffix (CLIP- and BERT-style BPE), ignore_merges (Llama 3), and no decoder (tokens
# joined by spaces).
def tiny(model, pre_tokenizer=None):
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
            "normalizer": None, "pre_tokenizer": pre_tokenizer, "post_processor": None,
            "decoder": None,
            "model": dict({"type": "BPE", "dropout": None, "unk_token": None,
                           "continuing_subword_prefix": None, "end_of_word_suffix": None,
                           "fuse_unk": False, "byte_fallback": False, "ignore_merges": False},
                          **model)}


SPACES = {"type": "Split", "pattern": {"String": " "}, "behavior": "Removed", "invert": False}
TINY_VOCAB = {"<unk>": 0, "a": 1, "b": 2, "c": 3, "ab": 4, "abc": 5, "e": 6, "l": 7, "o": 8,
              "H": 9, "He": 10, "ll": 11}
TINY_MERGES = ["a b", "ab c", "H e", "l l"]
PREFIX_VOCAB = {"<unk>": 0, "a": 1, "##a": 2, "b": 3, "##b": 4, "##b</w>": 5, "b</w>": 6,
                "a</w>": 7, "##a</w>": 8, "ab": 9, "ab</w>": 10, "##ab</w>": 11}
TINY = [
    {"name": "tiny-dropped", "file": None,
     "patch": tiny({"vocab": TINY_VOCAB, "merges": TINY_MERGES}, SPACES)},
    {"name": "tiny-unk", "file": None,
     "patch": tiny({"vocab": TINY_VOCAB, "merges": TINY_MERGES, "unk_token": "<unk>"}, SPACES)},
    {"name": "tiny-unk-fused", "file": None,
     "patch": tiny({"vocab": TINY_VOCAB, "merges": TINY_MERGES, "unk_token": "<unk>",
                    "fuse_unk": True}, SPACES)},
    {"name": "tiny-ignore-merges", "file": None,
     "patch": tiny({"vocab": TINY_VOCAB, "merges": ["a b"], "ignore_merges": True}, SPACES)},
    {"name": "tiny-prefix-suffix", "file": None,
     "patch": tiny({"vocab": PREFIX_VOCAB, "unk_token": "<unk>",
                    "merges": [["a", "##b"], ["a", "##b</w>"], ["##a", "##b</w>"]],
                    "continuing_subword_prefix": "##", "end_of_word_suffix": "</w>"}, SPACES)},
]
BIG_BYTES = 256 * 1024


def load(variant):
    spec = {}
    if variant["file"]:
        with lzma.open(os.path.join(DIR, variant["file"]), "rt", encoding="utf-8") as f:
            spec = json.load(f)
    spec.update(variant["patch"])
    if "added_extra" in variant:  # appended to the file's own list (too long to repeat here)
        variant["patch"] = {"added_tokens": added(spec["added_tokens"], variant.pop("added_extra"))}
        spec.update(variant["patch"])
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.no_truncation()
    tok.no_padding()
    return tok


def fnv1a(ids):
    """FNV-1a 64 over the ids as little-endian uint32 (tests/test_tokenizer.cpp computes the same)."""
    h = 0xcbf29ce484222325
    for i in ids:
        for b in int(i).to_bytes(4, "little"):
            h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def stream_chunks(tok, ids):
    ds = DecodeStream(skip_special_tokens=False)
    return [ds.step(tok, i) for i in ids]


def decode_cases(toks):
    """Id sequences whose decoding is delicate, by variant, built from token strings."""
    cases = []

    def add(name, pieces):
        tok = toks[name]
        ids = []
        for p in pieces:
            i = p if isinstance(p, int) else tok.token_to_id(p)
            assert i is not None, (name, p)
            ids.append(i)
        cases.append({"variant": name, "ids": ids,
                      "text": tok.decode(ids, skip_special_tokens=False)})

    # Byte-level: € (E2 82 AC) whole, cut before its last byte, then text; bytes no UTF-8 has.
    add("gpt2", ["â", "Ĥ", "¬", "Ġthe"])
    add("gpt2", ["â", "Ĥ", "A", "Ġthe"])
    add("gpt2", ["Ã", "Ã", "ÿ", "A"])
    add("gpt2", ["<|endoftext|>", "Hello", "<|endoftext|>"])
    # Byte fallback: a valid run, a cut run (one U+FFFD per byte token), ▁ at the start (stripped
    # once), special tokens, a gap-free id range end.
    add("phi3", ["<0xE2>", "<0x82>", "<0xAC>", "▁the"])
    add("phi3", ["<0xE2>", "<0x82>", "▁A", "<0xFF>"])
    add("phi3", ["▁▁", "▁Hello", "<0x0A>", "<s>", "▁x", "</s>", "<|end|>"])
    add("phi3", ["<0x20>", "▁y"])
    add("phi3-metaspace-split", ["▁▁", "▁Hello", "<0xE2>", "<0x82>", "<0xAC>", "▁", "x"])
    add("olmo2", ["<|im_start|>", "user", "Ċ", "âĢ", "<|im_end|>"])
    return cases


def main():
    variants = VARIANTS + TINY
    toks = {v["name"]: load(v) for v in variants}
    out = {"tokenizers_version": tokenizers.__version__, "corpus": CORPUS, "variants": []}
    big_text = "\n".join(CORPUS)
    big_text = (big_text + "\n") * (BIG_BYTES // len(big_text.encode("utf-8")) + 1)
    for v in variants:
        tok = toks[v["name"]]
        enc = [tok.encode(t, add_special_tokens=False).ids for t in CORPUS]
        enc_special = [tok.encode(t, add_special_tokens=True).ids for t in CORPUS]
        entry = {"name": v["name"], "file": v["file"], "patch": v["patch"], "encode": enc,
                 "encode_special": enc_special,
                 "decode": [tok.decode(ids, skip_special_tokens=False) for ids in enc_special]}
        if v.get("stream"):
            entry["stream"] = [stream_chunks(tok, ids) for ids in enc]
        if v.get("big"):
            ids = tok.encode(big_text, add_special_tokens=False).ids
            entry["big"] = {"bytes": len(big_text.encode("utf-8")), "count": len(ids),
                            "fnv1a": fnv1a(ids)}
        out["variants"].append(entry)
    out["big_repeat"] = "the corpus joined with \\n, plus \\n, repeated until at least 256 KiB"
    out["decode_cases"] = decode_cases(toks)
    path = os.path.join(DIR, "golden.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=True, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes, tokenizers {tokenizers.__version__})")


if __name__ == "__main__":
    main()
