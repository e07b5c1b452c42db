#!/usr/bin/env python3
"""Writes data/unicode_properties.inc: what the Unicode version of `tokenizers`' Oniguruma adds to
each Unicode property over the tables of the PCRE2 this project links, so that a split regex's
\\p{L}, \\p{N}, \\w, \\d ... (data/regex.cpp) match what they match in `tokenizers`.

`tokenizers` 0.22 runs Oniguruma with Unicode 16.0.0; Debian 12's PCRE2 10.42 has Unicode 14.0.0.
Letters, digits and marks assigned in 15.0, 15.1 and 16.0 (CJK Extensions H and I, Kawi, Nag
Mundari, Garay, ...) are neither letters nor digits to PCRE2, so `\\p{N}{1,3}` (Llama 3's regex)
groups digits around them otherwise than `tokenizers`. For each property PCRE2 knows, this script
asks both sides which code points have it: the `regex` package (pinned to 2024.11.6, Unicode
16.0.0, in scripts/requirements-hf.txt) and the PCRE2 library itself (libpcre2-32 through ctypes,
the same 10.42 as libpcre2-8 that the build links), and writes the code points the first has and
the second lacks, as ranges of code points. Code points PCRE2 has and Unicode 16 does not
(a property that lost members) are listed in a comment: a class can only add to a property.

    /work/venv-hf/bin/python scripts/make_unicode_properties.py   # rewrites data/unicode_properties.inc

Run it in the venv of scripts/make-hf-venv.sh, which pins `regex` and `tokenizers`; when
`tokenizers` can be imported, the script also checks that it reads the probe code points below as
`regex` does. A newer `tokenizers` (a newer Unicode) or PCRE2 means new pins and a rerun.
"""
import ctypes
import ctypes.util
import importlib.metadata
import os
import sys

import regex

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
                   "unicode_properties.inc")
UNICODE = "16.0.0"
REGEX_VERSION = importlib.metadata.version("regex")
# Probes of the Unicode version: U+10D4A (GARAY CAPITAL LETTER A) is a letter from 16.0 on,
# U+10940 (SIDETIC LETTER N01) from 17.0 on.
PROBES = [(0x10D4A, True), (0x10940, False)]
# The general categories (short names, as both regex syntaxes write them) and the one binary
# property Oniguruma's \w is made of that PCRE2 names.
PROPERTIES = ["L", "LC", "Lu", "Ll", "Lt", "Lm", "Lo", "M", "Mn", "Mc", "Me", "N", "Nd", "Nl", "No",
              "P", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "S", "Sm", "Sc", "Sk", "So",
              "Z", "Zs", "Zl", "Zp", "C", "Cc", "Cf", "Co", "Cn", "Alphabetic"]

PCRE2_UTF = 0x00080000
PCRE2_UCP = 0x00020000
PCRE2_CONFIG_UNICODE_VERSION = 10


class Pcre2:
    """The 32-bit PCRE2 library: a code unit is a code point, so match offsets are indices."""

    def __init__(self):
        name = ctypes.util.find_library("pcre2-32") or "libpcre2-32.so.0"
        try:
            self.lib = ctypes.CDLL(name)
        except OSError:
            sys.exit("error: [unicode] libpcre2-32 not found. Fix: apt-get install libpcre2-dev "
                     "(scripts/install-deps.sh installs it)")
        lib = self.lib
        lib.pcre2_compile_32.restype = ctypes.c_void_p
        lib.pcre2_compile_32.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint32,
                                         ctypes.POINTER(ctypes.c_int),
                                         ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p]
        lib.pcre2_match_data_create_from_pattern_32.restype = ctypes.c_void_p
        lib.pcre2_match_data_create_from_pattern_32.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.pcre2_match_32.restype = ctypes.c_int
        lib.pcre2_match_32.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                       ctypes.c_size_t, ctypes.c_uint32, ctypes.c_void_p,
                                       ctypes.c_void_p]
        lib.pcre2_get_ovector_pointer_32.restype = ctypes.POINTER(ctypes.c_size_t)
        lib.pcre2_get_ovector_pointer_32.argtypes = [ctypes.c_void_p]
        lib.pcre2_code_free_32.argtypes = [ctypes.c_void_p]
        lib.pcre2_match_data_free_32.argtypes = [ctypes.c_void_p]
        lib.pcre2_config_32.argtypes = [ctypes.c_uint32, ctypes.c_void_p]

    def unicode_version(self):
        buf = (ctypes.c_uint32 * 32)()
        self.lib.pcre2_config_32(PCRE2_CONFIG_UNICODE_VERSION, buf)
        return "".join(chr(c) for c in buf if c)

    def runs(self, pattern, subject):
        """(start, end) of every match of `pattern` in `subject` (a uint32 array), or None when
        PCRE2 does not know the pattern."""
        units = (ctypes.c_uint32 * len(pattern))(*map(ord, pattern))
        err, off = ctypes.c_int(), ctypes.c_size_t()
        code = self.lib.pcre2_compile_32(units, len(pattern), PCRE2_UTF | PCRE2_UCP,
                                         ctypes.byref(err), ctypes.byref(off), None)
        if not code:
            return None
        md = self.lib.pcre2_match_data_create_from_pattern_32(code, None)
        out, start = [], 0
        while True:
            rc = self.lib.pcre2_match_32(code, subject, len(subject), start, 0, md, None)
            if rc < 0:
                break
            ov = self.lib.pcre2_get_ovector_pointer_32(md)
            out.append((ov[0], ov[1]))
            start = ov[1]
        self.lib.pcre2_match_data_free_32(md)
        self.lib.pcre2_code_free_32(code)
        return out


def code_points(runs, index):
    return {index[i] for begin, end in runs for i in range(begin, end)}


def ranges(cps):
    out, cps = [], sorted(cps)
    for cp in cps:
        if out and out[-1][1] + 1 == cp:
            out[-1][1] = cp
        else:
            out.append([cp, cp])
    return out


def check_versions(pcre2):
    for cp, letter in PROBES:
        if bool(regex.fullmatch(r"\p{L}", chr(cp))) != letter:
            sys.exit(f"error: [unicode] regex {REGEX_VERSION} is not Unicode {UNICODE} "
                     f"(U+{cp:04X}). Fix: pip install regex==2024.11.6 (scripts/requirements-hf.txt)")
    try:
        import tokenizers
        from tokenizers import pre_tokenizers, Regex
    except ImportError:
        print("[unicode] tokenizers not importable: its Unicode version not checked")
        return
    split = pre_tokenizers.Split(Regex(r"\p{L}+"), behavior="isolated")
    for cp, letter in PROBES:
        pieces = split.pre_tokenize_str("a" + chr(cp) + "b")
        if (len(pieces) == 1) != letter:
            sys.exit(f"error: [unicode] tokenizers {tokenizers.__version__} reads U+{cp:04X} "
                     f"otherwise than Unicode {UNICODE}. Fix: pin the regex release of its "
                     "Unicode version and update UNICODE and PROBES here")
    print(f"[unicode] regex {REGEX_VERSION}, tokenizers {tokenizers.__version__}: Unicode "
          f"{UNICODE}; PCRE2: Unicode {pcre2.unicode_version()}")


def main():
    pcre2 = Pcre2()
    check_versions(pcre2)
    index = [cp for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]
    text = "".join(map(chr, index))
    subject = (ctypes.c_uint32 * len(index))(*index)
    rows, lost = [], []
    for name in PROPERTIES:
        pattern = rf"\p{{{name}}}+"
        theirs = pcre2.runs(pattern, subject)
        if theirs is None:
            print(f"[unicode] PCRE2 does not know \\p{{{name}}}: skipped")
            continue
        ours = {index[m.start() + i] for m in regex.finditer(pattern, text)
                for i in range(m.end() - m.start())}
        have = code_points(theirs, index)
        added, removed = ours - have, have - ours
        if added:
            rows.append((name, ranges(added), len(added)))
        if removed:
            lost.append((name, len(removed), ranges(removed)))
        print(f"[unicode] \\p{{{name}}}: {len(added)} added, {len(removed)} PCRE2 has and "
              f"Unicode {UNICODE} does not")
    with open(OUT, "w") as f:
        f.write(f"// Generated by scripts/make_unicode_properties.py: what Unicode {UNICODE} "
                f"(tokenizers' Oniguruma) adds\n// to each property over PCRE2's Unicode "
                f"{pcre2.unicode_version()} tables, as ranges of code points. Do not edit: rerun the "
                "script.\n// Included by data/regex.cpp only.\n")
        f.write(f'constexpr const char* kPropertiesUnicode = "{UNICODE}";\n')
        f.write(f'constexpr const char* kPcre2TablesUnicode = "{pcre2.unicode_version()}";\n\n')
        for name, count, spans in lost:
            first = ", ".join(f"U+{a:04X}" if a == b else f"U+{a:04X}-U+{b:04X}" for a, b in spans[:3])
            f.write(f"// \\p{{{name}}}: {count} code points PCRE2 has and Unicode {UNICODE} "
                    f"does not ({first}{', ...' if len(spans) > 3 else ''}): not corrected\n")
        f.write("\nstruct PropertyAdditions {\n  const char* name;              // the short name, as "
                "PCRE2 knows it\n  const uint32_t (*ranges)[2];   // first and last code point of "
                "each range, ascending\n  size_t count;\n};\n\n")
        for name, spans, count in rows:
            f.write(f"// \\p{{{name}}}: {count} code points\n")
            f.write(f"constexpr uint32_t kAdded{name}[][2] = {{\n")
            items = [f"{{0x{a:X}, 0x{b:X}}}" for a, b in spans]
            line = "   "
            for item in items:
                if len(line) + len(item) + 2 > 100:
                    f.write(line.rstrip() + "\n")
                    line = "   "
                line += f" {item},"
            f.write(line + "\n};\n")
        f.write("\nconstexpr PropertyAdditions kPropertyAdditions[] = {\n")
        for name, _, _ in rows:
            f.write(f"    {{\"{name}\", kAdded{name}, std::size(kAdded{name})}},\n")
        f.write("};\n")
    print(f"wrote {OUT}: {len(rows)} properties")


if __name__ == "__main__":
    main()
