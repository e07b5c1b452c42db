#!/usr/bin/env python3
"""Runs the README's examples and compares their output with the README text.

Every line of a fenced block that starts with `$ remat-train` is a command (a trailing `\\`
continues it; a trailing `# comment` is not run); the lines after it, up to the next `$ ` line or
the end of the block, are its expected output: stdout, and stderr too when the command fails. A line `...`
stands for any number of lines. Timings (ms/step, tok/s, tokens/s, GFLOP/s, ms, elapsed,
ETA) and the load average (and CPU steal) printed beside them are masked on both sides, and runs of spaces compare as one, so a check fails only when
something a run determines (memory, losses, FLOPs, messages) differs.

HTML comments right before a block steer it (the README shows none of them):
  <!-- readme-check: skip REASON -->           not checked (say why)
  <!-- readme-check: setup SHELL -->            run first in the scratch folder (e.g. write bad.toml)
  <!-- readme-check: mask-tokens REGEX I,J --> on output lines matching REGEX, whitespace-separated
                                                tokens I, J (0-based) are timings: masked
  <!-- readme-check: plan -->                   too slow to run: the command's `plan --json` must
                                                predict the "(N B)" peak the block shows
And a region of plain README text (a Markdown table, say) can be a command's exact output:
  <!-- readme-check: output CMD -->
  ...the output of CMD, verbatim...
  <!-- readme-check: end -->

Commands run in a scratch folder that links every top-level entry of the repository, with the
built binary first on PATH, so `configs/...` works and outputs land outside the tree.

  scripts/check_readme.py [--binary build/remat-train] [--update] [--match TEXT]
--update rewrites each checked block's expected output with what the binary printed (blocks
with `...` keep their elisions and are reported instead).
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMING_PATTERNS = [
    (re.compile(r"[\d.]+(k|M)?( ?)(ms/step|tok/s|tokens/s|GFLOP/s)"), r"<t>\2\3"),
    (re.compile(r"\(\d+ ms\)"), "(<t> ms)"),
    (re.compile(r"in [\d.]+ ms"), "in <t> ms"),
    (re.compile(r"(elapsed|ETA) [\dhms]+"), r"\1 <t>"),
    (re.compile(r"load average [\d.]+"), "load average <t>"),
    (re.compile(r", CPU steal \d+%"), ""),  # only printed when the host took some
]
MARKER = re.compile(r"<!--\s*readme-check:\s*(\S+)\s*(.*?)\s*-->")


def parse_blocks(lines):
    """Yields (start_line, end_line, directives, body_lines) for each fenced block."""
    i = 0
    directives = []
    while i < len(lines):
        m = MARKER.search(lines[i])
        if m:
            directives.append((m.group(1), m.group(2)))
            i += 1
            continue
        if lines[i].startswith("```"):
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            yield i, j, directives, lines[i + 1 : j]
            directives = []
            i = j + 1
            continue
        if lines[i].strip():
            directives = []
        i += 1


def output_regions(lines, match):
    """[(first, last, command)]: README lines [first, last) must be the command's output."""
    out = []
    for i, line in enumerate(lines):
        m = MARKER.search(line)
        if m and m.group(1) == "output" and match in m.group(2):
            j = i + 1
            while j < len(lines) and not re.search(r"<!--\s*readme-check:\s*end\s*-->", lines[j]):
                j += 1
            out.append((i + 1, j, m.group(2)))
    return out


def split_examples(body):
    """[(command, [expected lines], first_output_index)] for `$ remat-train` commands."""
    out = []
    k = 0
    while k < len(body):
        line = body[k]
        if not line.startswith("$ "):
            k += 1
            continue
        cmd = line[2:]
        while cmd.rstrip().endswith("\\") and k + 1 < len(body):
            k += 1
            cmd = cmd.rstrip()[:-1] + " " + body[k].strip()
        k += 1
        start = k
        while k < len(body) and not body[k].startswith("$ "):
            k += 1
        expected = body[start:k]
        while expected and not expected[-1].strip():
            expected = expected[:-1]
        out.append((cmd, expected, start))
    return out


def strip_comment(cmd):
    lexer = shlex.shlex(cmd, posix=True, punctuation_chars=False)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return " ".join(shlex.quote(t) for t in lexer)


def mask(line, token_masks):
    for regex, indices in token_masks:
        if regex.search(line):
            tokens = line.split()
            for i in indices:
                if i < len(tokens):
                    tokens[i] = "<t>"
            line = " ".join(tokens)
    for pattern, repl in TIMING_PATTERNS:
        line = pattern.sub(repl, line)
    return " ".join(line.split())


def matches(expected, actual, token_masks):
    """Line-by-line with `...` matching any run of lines (greedy-free backtracking)."""
    exp = [mask(l, token_masks) for l in expected]
    act = [mask(l, token_masks) for l in actual]
    memo = {}

    def go(i, j):
        if (i, j) in memo:
            return memo[(i, j)]
        if i == len(exp):
            r = j == len(act)
        elif exp[i] == "...":
            r = any(go(i + 1, k) for k in range(j, len(act) + 1))
        else:
            r = j < len(act) and exp[i] == act[j] and go(i + 1, j + 1)
        memo[(i, j)] = r
        return r

    sys.setrecursionlimit(10000)
    return go(0, 0), exp, act


def first_difference(exp, act):
    for n, (e, a) in enumerate(zip(exp, act)):
        if e != a and e != "...":
            return f"    line {n + 1}:\n      README: {e}\n      binary: {a}"
    return f"    README has {len(exp)} lines, the binary printed {len(act)}"


def run(cmd, cwd, env):
    """stdout, then stderr when the command failed (its error line is the example's point;
    a successful run's stderr is progress, e.g. compare's per-policy lines)."""
    p = subprocess.run(cmd, shell=True, cwd=cwd, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=900)
    text = p.stdout + (p.stderr if p.returncode != 0 else "")
    return text.rstrip("\n").split("\n") if text.strip() else []


def check_plan(cmd, expected, cwd, env):
    argv = shlex.split(strip_comment(cmd))
    assert argv[0] == "remat-train"
    args = argv[1:]
    if args and args[0] == "train":
        args = args[1:]
    out = subprocess.run(["remat-train", "plan", *args, "--json"], cwd=cwd, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if out.returncode != 0:
        return False, f"    plan failed: {out.stderr.strip()}"
    peak = json.loads(out.stdout)["policies"][-1]["peak_bytes"]
    text = "\n".join(expected)
    if f"({peak} B)" not in text or f"predicted peak  {peak} B" not in text:
        return False, f"    plan predicts {peak} B; the README block does not show it"
    return True, f"plan predicts {peak} B as shown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "remat-train"))
    ap.add_argument("--readme", default=os.path.join(ROOT, "README.md"))
    ap.add_argument("--update", action="store_true", help="rewrite the expected outputs")
    ap.add_argument("--match", default="", help="only the commands containing this text")
    opt = ap.parse_args()
    binary = os.path.abspath(opt.binary)
    if not os.access(binary, os.X_OK):
        sys.exit(f"check_readme: {binary} is not an executable; build first (make build)")

    with open(opt.readme) as f:
        lines = f.read().split("\n")
    scratch = tempfile.mkdtemp(prefix="remat-readme-")
    bindir = os.path.join(scratch, ".bin")
    os.mkdir(bindir)
    os.symlink(binary, os.path.join(bindir, "remat-train"))
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
    failures = checked = 0
    edits = []  # (first line index, last line index exclusive, new lines)
    for start, end, directives, body in parse_blocks(lines):
        d = dict(directives)
        examples = [e for e in split_examples(body)
                    if e[0].startswith("remat-train") and opt.match in e[0]]
        if not examples or "skip" in d:
            continue
        # A fresh scratch folder per block: the repository's entries, nothing from other blocks.
        work = tempfile.mkdtemp(dir=scratch)
        for entry in os.listdir(ROOT):
            if not entry.startswith(".") and entry not in ("build", "out"):
                os.symlink(os.path.join(ROOT, entry), os.path.join(work, entry))
        for kind, arg in directives:
            if kind == "setup":
                subprocess.run(arg, shell=True, cwd=work, env=env, check=True)
        token_masks = []
        for kind, arg in directives:
            if kind == "mask-tokens":
                regex, idx = arg.rsplit(" ", 1)
                token_masks.append((re.compile(regex), [int(i) for i in idx.split(",")]))
        for cmd, expected, offset in examples:
            checked += 1
            where = f"README.md:{start + 2 + offset - 1}"
            if "plan" in d:
                ok, why = check_plan(cmd, expected, work, env)
                print(f"[readme] {'ok  ' if ok else 'FAIL'} {where} {why if ok else ''}")
                if not ok:
                    failures += 1
                    print(why)
                continue
            actual = run(strip_comment(cmd), work, env)
            ok, exp, act = matches(expected, actual, token_masks)
            print(f"[readme] {'ok  ' if ok else 'FAIL'} {where} $ {cmd[:80]}")
            if ok:
                continue
            if opt.update and "..." not in expected:
                first = start + 1 + offset
                edits.append((first, first + len(expected), actual))
                continue
            failures += 1
            print(first_difference(exp, act))
    for first, last, cmd in output_regions(lines, opt.match):
        checked += 1
        actual = run(cmd, ROOT, env)
        ok = lines[first:last] == actual
        print(f"[readme] {'ok  ' if ok else 'FAIL'} README.md:{first} output of {cmd}")
        if ok:
            continue
        if opt.update:
            edits.append((first, last, actual))
            continue
        failures += 1
        print(first_difference(lines[first:last], actual))
    if edits:
        for first, last, new in sorted(edits, reverse=True):
            lines[first:last] = new
        with open(opt.readme, "w") as f:
            f.write("\n".join(lines))
        print(f"[readme] rewrote {len(edits)} example(s) in {opt.readme}")
    print(f"[readme] {checked} example(s) checked, {failures} differ")
    subprocess.run(["rm", "-rf", scratch])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
