#!/usr/bin/env python3
"""Runs the documentation's examples, compares their output with the text, and checks its links.

Pages: README.md and every docs/**/*.md, or the PAGEs named (a page may lie outside the
repository: its relative links resolve from its own folder; its commands run as any page's).

Examples. Every line of a fenced block that starts with `$ remat-train` or `$ python3 scripts/` (the
repository's own scripts) is a command (a trailing `\\` continues it; a trailing `# comment` is not
run; `<`, `>`, `>>` and `2>&1` standing alone redirect); the lines after it, up to the next `$ ` line or
the end of the block, are its expected output: stdout, and stderr too when the command fails. A line `...`
stands for any number of lines. Timings (ms/step, tok/s, tokens/s, GFLOP/s, ms, elapsed,
ETA, fit's "a step ~N min") and the load average (and CPU steal) printed beside them are masked on both sides, and runs of spaces compare as one, so a check fails only when
something a run determines (memory, losses, FLOPs, messages) differs.

HTML comments right before a block steer it (the pages show none of them; the prefix is
`readme-check` because the README was the first page checked):
  <!-- readme-check: skip REASON -->           not checked (say why)
  <!-- readme-check: setup SHELL -->            run first in the scratch folder (e.g. write bad.toml)
  <!-- readme-check: continue -->               run in the folder of the page's previous block, with
                                                what its commands left there (a walkthrough in steps)
  <!-- readme-check: mask-tokens REGEX I,J --> on output lines matching REGEX, whitespace-separated
                                                tokens I, J (0-based) are timings: masked
  <!-- readme-check: plan -->                   too slow to run: the command's `plan --json` must
                                                predict the "(N B)" peak the block shows
  <!-- readme-check: tolerance REGEX I,J REL --> on output lines matching REGEX, tokens I, J are
                                                numbers that may differ from the page's by REL of
                                                the larger (0.02: 2%), every other token exactly:
                                                figures a training run determines only up to the
                                                CPU's rounding (another machine's GEMM kernels sum
                                                in another order, and training amplifies that)
And a region of plain page text (a Markdown table, say) can be a command's exact output:
  <!-- readme-check: output CMD -->
  ...the output of CMD, verbatim...
  <!-- readme-check: end -->

Commands run in a scratch folder that links every top-level entry of the repository, with the
built binary first on PATH, so `configs/...` works and outputs land outside the tree.

Links (outside fenced blocks, code spans and HTML comments). Every relative `[..](target)`,
`![..](target)` and `[x]: target` must name an existing file or folder, relative to the page;
a `#anchor` (alone, or after a .md target) must be a heading's GitHub slug in that page.
http(s), mailto and other URLs are not checked (no network).
Named files. A code span that is a path ending in .jsonl/.png/.patch/.toml/.py/.sh/.md whose first
folder is one of the repository's top-level folders (`configs/...`, `docs/...`) must exist; so
must a bare name in a table row of a page in docs/device-runs/ (relative to that page).

  scripts/check_docs.py [--binary build/remat-train] [--update] [--match TEXT] [--links-only]
                        [PAGE ...]
--update rewrites each checked block's expected output, in the page it came from, with what the
binary printed (blocks with `...` keep their elisions and are reported instead). --links-only
checks the links and named files only (no binary needed; fast).
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMING_PATTERNS = [
    (re.compile(r"[\d.]+(k|M)?( ?)(ms/step|tok/s|tokens/s|GFLOP/s)"), r"<t>\2\3"),
    (re.compile(r"\(\d+ ms\)"), "(<t> ms)"),
    (re.compile(r"in [\d.]+ ms"), "in <t> ms"),
    (re.compile(r"(elapsed|ETA) [\dhms]+"), r"\1 <t>"),
    (re.compile(r"load average [\d.]+"), "load average <t>"),
    (re.compile(r", CPU steal \d+%"), ""),  # only printed when the host took some
    (re.compile(r"a step ~[\d.]+ (ms|s|min|h) at"), "a step ~<t> at"),  # fit: from a measured rate
]
MARKER = re.compile(r"<!--\s*readme-check:\s*(\S+)\s*(.*?)\s*-->")
COMMANDS = ("remat-train", "python3 scripts/")  # what a `$ ` line of a block runs
NAMED_EXTENSIONS = (".jsonl", ".png", ".patch", ".toml", ".py", ".sh", ".md")


def display(path):
    """The page's name in messages: relative to the repository when inside it."""
    rel = os.path.relpath(os.path.abspath(path), ROOT)
    return path if rel.startswith("..") else rel


def default_pages():
    pages = [os.path.join(ROOT, "README.md")]
    for folder, dirs, files in os.walk(os.path.join(ROOT, "docs")):
        dirs.sort()
        pages += [os.path.join(folder, f) for f in sorted(files) if f.endswith(".md")]
    return pages


# ---------------------------------------------------------------- examples

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
    """[(first, last, command)]: page lines [first, last) must be the command's output."""
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


# Redirections a command may use, as words of their own (`tokenize < text.txt > ids.json`): left
# to the shell, where every other word is quoted.
REDIRECTIONS = {"<", ">", ">>", "2>&1"}


def strip_comment(cmd):
    lexer = shlex.shlex(cmd, posix=True, punctuation_chars=False)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return " ".join(t if t in REDIRECTIONS else shlex.quote(t) for t in lexer)


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


def same_line(e, a, tolerances):
    """Equal, or equal but for the numbers a tolerance directive lets differ by its share."""
    if e == a:
        return True
    for regex, indices, rel in tolerances:
        if not (regex.search(e) and regex.search(a)):
            continue
        te, ta = e.split(), a.split()
        if len(te) != len(ta):
            return False
        for i, (x, y) in enumerate(zip(te, ta)):
            if x == y:
                continue
            try:
                fx, fy = float(x), float(y)
            except ValueError:
                return False
            if i not in indices or abs(fx - fy) > rel * max(abs(fx), abs(fy)):
                return False
        return True
    return False


def matches(expected, actual, token_masks, tolerances=()):
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
            r = j < len(act) and same_line(exp[i], act[j], tolerances) and go(i + 1, j + 1)
        memo[(i, j)] = r
        return r

    sys.setrecursionlimit(10000)
    return go(0, 0), exp, act


def first_difference(exp, act):
    if "..." in exp:
        return first_missing(exp, act)
    for n, (e, a) in enumerate(zip(exp, act)):
        if e != a and e != "...":
            return f"    line {n + 1}:\n      page:   {e}\n      binary: {a}"
    return f"    the page has {len(exp)} lines, the binary printed {len(act)}"


def first_missing(exp, act):
    """With `...` the page's lines are not where the binary's are: the first page line missing
    from the output, searched in order (the lines before it found first)."""
    j = 0
    for n, e in enumerate(exp):
        if e != "...":
            if e not in act[j:]:
                return (f"    line {n + 1} is not in the binary's output after the lines before "
                        f"it:\n      page:   {e}")
            j = act.index(e, j) + 1
    return ("    every line is in the binary's output, in order, but other lines lie between "
            "them: a `...` is missing")


def run(cmd, cwd, env):
    """stdout, then stderr when the command failed (its error line is the example's point;
    a successful run's stderr is progress, e.g. compare's per-policy lines). Bytes that are not
    UTF-8 (`sample` from a byte-level model prints any bytes) compare as U+FFFD, not a crash."""
    p = subprocess.run(cmd, shell=True, cwd=cwd, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, errors="replace", timeout=900)
    text = p.stdout + (p.stderr if p.returncode != 0 else "")
    return text.rstrip("\n").split("\n") if text.strip() else []


# train's flags that plan does not take (none changes the plan), with how many values follow.
TRAIN_ONLY_FLAGS = {"--metrics": 1, "--resume": 1, "--init": 1, "--stop-at": 1, "--steps": 1,
                    "-q": 0, "--quiet": 0}


def without_train_only_flags(args):
    out, i = [], 0
    while i < len(args):
        name = args[i].split("=", 1)[0]
        if name in TRAIN_ONLY_FLAGS:
            i += 1 + (TRAIN_ONLY_FLAGS[name] if "=" not in args[i] else 0)
            continue
        out.append(args[i])
        i += 1
    return out


def check_plan(cmd, expected, cwd, env):
    argv = shlex.split(strip_comment(cmd))
    assert argv[0] == "remat-train"
    args = argv[1:]
    if args and args[0] == "train":
        args = args[1:]
    args = without_train_only_flags(args)
    out = subprocess.run(["remat-train", "plan", *args, "--json"], cwd=cwd, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if out.returncode != 0:
        return False, f"    plan failed: {out.stderr.strip()}"
    peak = json.loads(out.stdout)["policies"][-1]["peak_bytes"]
    text = "\n".join(expected)
    if f"({peak} B)" not in text or f"predicted peak  {peak} B" not in text:
        return False, f"    plan predicts {peak} B; the block does not show it"
    return True, f"plan predicts {peak} B as shown"


class Runner:
    """The scratch folders and PATH the commands run with; made on the first command, so a
    page without examples costs nothing."""

    def __init__(self, binary):
        self.binary = binary
        self.scratch = None
        self.env = None
        self.last_work = None  # the previous block's folder (`continue`)

    def start(self):
        if self.scratch is None:
            self.scratch = tempfile.mkdtemp(prefix="remat-docs-")
            bindir = os.path.join(self.scratch, ".bin")
            os.mkdir(bindir)
            os.symlink(self.binary, os.path.join(bindir, "remat-train"))
            self.env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
        return self.env

    def workdir(self, directives):
        self.start()
        if "continue" in dict(directives) and self.last_work:
            work = self.last_work
        else:
            # A fresh scratch folder per block: the repository's entries, nothing from other
            # blocks.
            work = tempfile.mkdtemp(dir=self.scratch)
            for entry in os.listdir(ROOT):
                if not entry.startswith(".") and entry not in ("build", "out"):
                    os.symlink(os.path.join(ROOT, entry), os.path.join(work, entry))
        self.last_work = work
        for kind, arg in directives:
            if kind == "setup":
                subprocess.run(arg, shell=True, cwd=work, env=self.env, check=True)
        return work

    def close(self):
        if self.scratch:
            subprocess.run(["rm", "-rf", self.scratch])


def token_masks_of(directives):
    out = []
    for kind, arg in directives:
        if kind == "mask-tokens":
            regex, idx = arg.rsplit(" ", 1)
            out.append((re.compile(regex), [int(i) for i in idx.split(",")]))
    return out


def tolerances_of(directives):
    out = []
    for kind, arg in directives:
        if kind == "tolerance":
            regex, idx, rel = arg.rsplit(" ", 2)
            out.append((re.compile(regex), [int(i) for i in idx.split(",")], float(rel)))
    return out


def check_block(name, start, directives, examples, runner, update, edits):
    """Runs one block's examples; returns (checked, failures); the --update edits go to edits."""
    d = dict(directives)
    work = runner.workdir(directives)
    token_masks = token_masks_of(directives)
    tolerances = tolerances_of(directives)
    checked = failures = 0
    for cmd, expected, offset in examples:
        checked += 1
        where = f"{name}:{start + 2 + offset - 1}"
        if "plan" in d:
            ok, why = check_plan(cmd, expected, work, runner.env)
            print(f"[docs] {'ok  ' if ok else 'FAIL'} {where} {why if ok else ''}")
            if not ok:
                failures += 1
                print(why)
            continue
        actual = run(strip_comment(cmd), work, runner.env)
        ok, exp, act = matches(expected, actual, token_masks, tolerances)
        print(f"[docs] {'ok  ' if ok else 'FAIL'} {where} $ {cmd[:80]}")
        if ok:
            continue
        if update and "..." not in expected:
            first = start + 1 + offset
            edits.append((first, first + len(expected), actual))
            continue
        failures += 1
        print(first_difference(exp, act))
    return checked, failures


def check_examples(path, name, lines, opt, runner):
    """(examples checked, failures) of one page; --update rewrites the page itself."""
    checked = failures = 0
    edits = []  # (first line index, last line index exclusive, new lines)
    runner.last_work = None  # `continue` never reaches into another page's folder
    for start, _end, directives, body in parse_blocks(lines):
        examples = [e for e in split_examples(body)
                    if e[0].startswith(COMMANDS) and opt.match in e[0]]
        if examples and "skip" not in dict(directives):
            c, f = check_block(name, start, directives, examples, runner, opt.update, edits)
            checked, failures = checked + c, failures + f
    for first, last, cmd in output_regions(lines, opt.match):
        checked += 1
        actual = run(cmd, ROOT, runner.start())  # in the repository itself, as always
        ok = lines[first:last] == actual
        print(f"[docs] {'ok  ' if ok else 'FAIL'} {name}:{first} output of {cmd}")
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
        with open(path, "w") as f:
            f.write("\n".join(lines))
        print(f"[docs] rewrote {len(edits)} example(s) in {name}")
    return checked, failures


# ---------------------------------------------------------------- links and named files

FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^\s)]*)"
                         r"(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")
REFERENCE_DEF = re.compile(r"^ {0,3}\[([^\]^][^\]]*)\]:\s*(<[^>]*>|\S+)")
ATX_HEADING = re.compile(r"^ {0,3}#{1,6}(?:\s+(.*?))?(?:\s+#+)?\s*$")
SETEXT_UNDERLINE = re.compile(r"^ {0,3}(=+|-+)\s*$")
HTML_ANCHOR = re.compile(r"<a\s[^>]*?(?:name|id)=\"([^\"]+)\"")


def prose_lines(lines):
    """[(line number, text)] outside fenced blocks, HTML comments removed: the lines whose
    links and code spans are the page's own (a block's text is a command or its output)."""
    out, fence, in_comment = [], None, False
    for n, line in enumerate(lines, 1):
        m = FENCE.match(line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                    and not line.strip()[len(m.group(1)):].strip():
                fence = None
            continue
        if m and not in_comment:
            fence = m.group(1)
            continue
        text = ""
        while line:
            if in_comment:
                end = line.find("-->")
                in_comment, line = (True, "") if end < 0 else (False, line[end + 3:])
            else:
                start = line.find("<!--")
                text += line if start < 0 else line[:start]
                in_comment, line = (False, "") if start < 0 else (True, line[start + 4:])
        out.append((n, text))
    return out


def slug(text):
    """GitHub's heading anchor: lowercase, links reduced to their text, then everything but
    letters, digits, spaces, hyphens and underscores dropped, spaces turned into hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def headings(prose):
    """The heading texts of a page's prose lines (ATX `# x`, and a one-line paragraph
    underlined with === or ---)."""
    out, previous = [], ["", ""]
    for _n, text in prose:
        m = ATX_HEADING.match(text)
        if m:
            out.append(m.group(1) or "")
        elif SETEXT_UNDERLINE.match(text) and previous[1].strip() \
                and (not previous[0].strip() or ATX_HEADING.match(previous[0])) \
                and not re.match(r"\s*([-*+>|]|\d+[.)])", previous[1]):
            out.append(previous[1])
        previous = [previous[1], text]
    return out


ANCHOR_CACHE = {}


def anchors(path):
    """Every anchor a .md file offers: heading slugs (a repeat gets -1, -2, ...) and HTML
    anchors."""
    if path not in ANCHOR_CACHE:
        with open(path, encoding="utf-8") as f:
            prose = prose_lines(f.read().split("\n"))
        found, seen = set(), {}
        for text in headings(prose):
            s = slug(text)
            found.add(s if s not in seen else f"{s}-{seen[s]}")
            seen[s] = seen.get(s, 0) + 1
        for _n, text in prose:
            found.update(HTML_ANCHOR.findall(text))
        ANCHOR_CACHE[path] = found
    return ANCHOR_CACHE[path]


def link_targets(prose):
    """[(line number, target)] of the inline links, images and reference definitions."""
    out = []
    for n, text in prose:
        text = CODE_SPAN.sub("", text)
        out += [(n, m.group(1)) for m in INLINE_LINK.finditer(text)]
        m = REFERENCE_DEF.match(text)
        if m:
            out.append((n, m.group(2)))
    return [(n, t[1:-1] if t.startswith("<") else t) for n, t in out]


def link_problem(page, target):
    """Why the link is broken, or None. URLs (any scheme) are not followed."""
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", target) or target.startswith("//") or not target:
        return None
    path, _, anchor = target.partition("#")
    path = urllib.parse.unquote(path.split("?")[0])
    if not path:
        file = page
    elif path.startswith("/"):  # GitHub resolves these from the repository's root
        file = os.path.join(ROOT, path.lstrip("/"))
    else:
        file = os.path.join(os.path.dirname(os.path.abspath(page)), path)
    if not os.path.exists(file):
        return "no such file"
    if anchor and file.endswith(".md") and os.path.isfile(file) \
            and urllib.parse.unquote(anchor) not in anchors(file):
        return f"no heading '#{anchor}' in {display(file)}"
    return None


def top_folders():
    """The repository's top-level folders that git tracks (build and output folders are not
    paths a page can name as the repository's); every visible folder without git."""
    try:
        files = subprocess.run(["git", "-C", ROOT, "ls-files"], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, check=True).stdout.split()
        tracked = {f.split("/")[0] for f in files if "/" in f}
    except (OSError, subprocess.CalledProcessError):
        tracked = None
    return {e for e in os.listdir(ROOT) if os.path.isdir(os.path.join(ROOT, e))
            and not e.startswith(".") and (tracked is None or e in tracked)}


def named_file(page, token, in_table, tops):
    """The file a code span names and must exist, or None. Conservative: example names a
    reader makes (`run.jsonl`, `out/x.toml`) do not count."""
    if not token.endswith(NAMED_EXTENSIONS) or re.search(r"[\s*?\[<{]", token):
        return None
    if "/" in token:
        return os.path.join(ROOT, token) if token.split("/")[0] in tops else None
    runs = os.path.join(ROOT, "docs", "device-runs") + os.sep
    if in_table and os.path.abspath(page).startswith(runs):
        return os.path.join(os.path.dirname(os.path.abspath(page)), token)
    return None


def check_static(page, name, lines, tops):
    """Broken links and named files that do not exist: one message each."""
    prose = prose_lines(lines)
    problems = []
    for n, target in link_targets(prose):
        why = link_problem(page, target)
        if why:
            problems.append(f"{name}:{n}: broken link '{target}' ({why})")
    for n, text in prose:
        in_table = text.lstrip().startswith("|")
        for m in CODE_SPAN.finditer(text):
            file = named_file(page, m.group(2).strip(), in_table, tops)
            if file and not os.path.exists(file):
                problems.append(f"{name}:{n}: names '{m.group(2).strip()}' which does not exist")
    return problems


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("pages", nargs="*", metavar="PAGE",
                    help="pages to check (default: README.md and docs/**/*.md)")
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "remat-train"))
    ap.add_argument("--update", action="store_true", help="rewrite the expected outputs")
    ap.add_argument("--match", default="", help="only the commands containing this text")
    ap.add_argument("--links-only", action="store_true",
                    help="check links and named files only; run nothing")
    opt = ap.parse_args()
    binary = os.path.abspath(opt.binary)
    if not opt.links_only and not os.access(binary, os.X_OK):
        sys.exit(f"check_docs: {binary} is not an executable; build first (make build)")
    pages = opt.pages or default_pages()
    for page in pages:
        if not os.path.isfile(page):
            sys.exit(f"check_docs: {page}: no such page")
    tops, runner = top_folders(), Runner(binary)
    checked = failures = broken = 0
    try:
        for page in pages:
            name = display(page)
            with open(page, encoding="utf-8") as f:
                lines = f.read().split("\n")
            problems = check_static(page, name, lines, tops)
            for p in problems:
                print(f"[docs] FAIL {p}")
            broken += len(problems)
            if not opt.links_only:
                c, f = check_examples(page, name, lines, opt, runner)
                checked, failures = checked + c, failures + f
    finally:
        runner.close()
    what = "" if opt.links_only else f"{checked} example(s) checked, {failures} differ; "
    print(f"[docs] {len(pages)} page(s): {what}{broken} broken link(s) or missing file(s)")
    return 1 if failures or broken else 0


if __name__ == "__main__":
    sys.exit(main())
