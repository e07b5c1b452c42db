#!/usr/bin/env python3
"""The mutants of tests/mutants/ (scripts/mutate.sh): their format, applying one, and checking that
every one still applies.

A mutant file is a comment line saying what bug it plants, then one or more edits:
  @@ path/relative/to/the/repository
  - exact text to find (must occur exactly once; several "- " lines form a multi-line text)
  + its replacement (several "+ " lines likewise; a lone "+" deletes the text)

  python3 scripts/mutants.py check [ROOT]            # every mutant's text occurs exactly once
  python3 scripts/mutants.py apply MUTANT SRC BACKUP # plant one in the tree SRC (mutate.sh)

`check` is a ctest (mutants_apply): a change to the code that a mutant plants its bug in makes the
mutant stale, and mutate.sh would only say so when it runs, sessions later.
"""
import os
import shutil
import sys


def parse(path):
    """The edits of one mutant file: [{"file", "find", "rep"}], find and rep as texts."""
    edits, cur = [], None
    for line in open(path).read().split("\n"):
        if line.startswith("#") or not line.strip():
            continue
        if line.startswith("@@ "):
            cur = {"file": line[3:].strip(), "find": [], "rep": []}
            edits.append(cur)
        elif cur is None:
            raise ValueError(f"{path}: an edit line before any '@@ FILE': {line!r}")
        elif line.startswith("- ") or line == "-":
            cur["find"].append(line[2:])
        elif line.startswith("+ ") or line == "+":
            cur["rep"].append(line[2:])
        else:
            raise ValueError(f"{path}: cannot parse line: {line!r}")
    if not edits:
        raise ValueError(f"{path}: no '@@ FILE' edit")
    return [{"file": e["file"], "find": "\n".join(e["find"]), "rep": "\n".join(e["rep"])}
            for e in edits]


def mutated(path, root):
    """{file: its mutated text} for the mutant at `path` applied to the tree `root`; raises
    LookupError naming the edit whose text does not occur exactly once (a stale mutant)."""
    texts = {}
    for e in parse(path):
        if e["file"] not in texts:
            texts[e["file"]] = open(os.path.join(root, e["file"])).read()
        n = texts[e["file"]].count(e["find"])
        if n != 1:
            raise LookupError(f"{e['file']}: the text to mutate occurs {n} times: {e['find']!r}")
        texts[e["file"]] = texts[e["file"]].replace(e["find"], e["rep"])
    return texts


def apply(path, src, backup):
    """Plants the mutant in `src`, copying every file it changes to `backup` first. Exit status
    2 when it is stale (mutate.sh counts it so)."""
    try:
        texts = mutated(path, src)
    except LookupError as err:
        print(err)
        sys.exit(2)
    for rel, text in texts.items():
        b = os.path.join(backup, rel)
        os.makedirs(os.path.dirname(b), exist_ok=True)
        shutil.copy2(os.path.join(src, rel), b)
        with open(os.path.join(src, rel), "w") as fh:
            fh.write(text)


def check(root):
    folder = os.path.join(root, "tests/mutants")
    names = sorted(f for f in os.listdir(folder) if f.endswith(".mutant"))
    stale = []
    for name in names:
        try:
            mutated(os.path.join(folder, name), root)
        except (LookupError, ValueError, OSError) as err:
            stale.append(f"{name}: {err}")
    for s in stale:
        print(f"STALE {s}")
    print(f"mutants: {len(names) - len(stale)} of {len(names)} apply to this tree"
          + ("" if not stale else "; fix the stale ones (tests/mutants/, scripts/mutate.sh)"))
    return 1 if stale or not names else 0


def main(argv):
    if len(argv) >= 1 and argv[0] == "check" and len(argv) <= 2:
        here = os.path.dirname(os.path.abspath(__file__))
        return check(argv[1] if len(argv) == 2 else os.path.dirname(here))
    if len(argv) == 4 and argv[0] == "apply":
        apply(*argv[1:])
        return 0
    print(__doc__.strip().split("\n\n")[2], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
