#!/usr/bin/env python3
"""Checks docs/architecture.md against the code, so that its diagram cannot rot.

Two checks:
  1. every folder or file the page's diagram (its first fenced block) names in its left column
     (`cmd/`, `engine/remat/weight_stream`, `+-- engine/cpu`) exists: a folder, or a stem with .h/.cpp/.cu;
  2. every rule of the page's table "| files in | never include |" holds: no source file under
     the left cell's names has an `#include` of a file under the right cell's names.
A name ending in `/` is a folder (its whole tree); otherwise a file stem (`engine/remat` is
engine/remat/executor.h and engine/remat/executor.cpp). Exit 1 with one line per problem, 0 otherwise.

  scripts/check_architecture.py [--page docs/architecture.md] [--root DIR]
"""
import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIAGRAM_NAME = re.compile(r"^\s*(?:\+--\s+)?([a-z0-9_]+/[a-z0-9_/]*)\s")
RULE_ROW = re.compile(r"^\|\s*(`[^|]+)\|\s*(`[^|]+)\|\s*$")
LEVEL_ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*(`[^|]+)\|\s*$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCE_EXT = (".h", ".cpp", ".cu", ".cuh")


def diagram_names(lines):
    start = next(i for i, l in enumerate(lines) if l.startswith("```"))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("```"))
    return [m.group(1) for l in lines[start + 1 : end] if (m := DIAGRAM_NAME.match(l))]


def rules(lines):
    """[(line number, [files-in names], [never-include names])] from the rules table."""
    out = []
    for n, line in enumerate(lines, 1):
        m = RULE_ROW.match(line)
        if m:
            out.append((n, re.findall(r"`([^`]+)`", m.group(1)), re.findall(r"`([^`]+)`", m.group(2))))
    return out


def levels(lines):
    """[(line number, level, [names])] from the levels table, in page order."""
    out = []
    for n, line in enumerate(lines, 1):
        m = LEVEL_ROW.match(line)
        if m:
            out.append((n, int(m.group(1)), re.findall(r"`([^`]+)`", m.group(2))))
    return out


def level_problems(root, where, table):
    """Files in no level or in two, and includes that point up the levels table."""
    problems = []
    if not table:
        return [f"{where}: no '| level | holds |' rows found"]
    for row, _, names in table:
        for name in names:
            if not exists(root, name):
                problems.append(f"{where}:{row}: the level names '{name}', which does not exist")

    def level_of(rel):
        return [(lvl, row) for row, lvl, names in table if any(covers(n, rel) for n in names)]

    for rel in sources(root):
        mine = level_of(rel)
        if not mine:
            problems.append(f"{rel} is in no level of {where}. Fix: add its folder to the levels "
                            "table")
            continue
        if len(mine) > 1:
            problems.append(f"{rel} is in levels {', '.join(str(l) for l, _ in mine)} of {where}")
            continue
        lvl, row = mine[0]
        for n, target in includes(root, rel):
            theirs = level_of(target)
            if theirs and theirs[0][0] > lvl:
                problems.append(f"{rel}:{n} includes {target} (level {theirs[0][0]}), above its "
                                f"own level {lvl} ({where}:{row}): dependencies point down the "
                                "levels table")
    return problems


def covers(name, rel):
    """Whether a repository-relative file belongs to a folder (`x/`) or file stem (`x/y`)."""
    if name.endswith("/"):
        return rel.startswith(name)
    return os.path.splitext(rel)[0] == name


def exists(root, name):
    """A folder (`x/`), or a file stem; the diagram may name a folder without its slash."""
    path = os.path.join(root, name.rstrip("/"))
    if os.path.isdir(path):
        return True
    return not name.endswith("/") and any(os.path.isfile(path + ext) for ext in SOURCE_EXT)


def sources(root):
    for top in ("cmd", "data", "engine", "layers"):
        for folder, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if f.endswith(SOURCE_EXT):
                    yield os.path.relpath(os.path.join(folder, f), root)


def includes(root, rel):
    """(line, repository-relative target) of each quoted include that resolves to a file."""
    with open(os.path.join(root, rel), errors="replace") as f:
        for n, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            beside = os.path.normpath(os.path.join(os.path.dirname(rel), m.group(1)))
            for target in (beside, os.path.normpath(m.group(1))):
                if os.path.isfile(os.path.join(root, target)):
                    yield n, target
                    break


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=ROOT, help="the repository (default: this script's)")
    ap.add_argument("--page", help="default: ROOT/docs/architecture.md")
    opt = ap.parse_args()
    page = opt.page or os.path.join(opt.root, "docs", "architecture.md")
    with open(page) as f:
        lines = f.read().split("\n")
    where = os.path.relpath(page, opt.root)
    problems = [f"{where}: the diagram names '{n}', which is no folder or source file. Fix: "
                "correct the diagram" for n in diagram_names(lines) if not exists(opt.root, n)]
    problems += level_problems(opt.root, where, levels(lines))
    table = rules(lines)
    if not table:
        problems.append(f"{where}: no '| files in | never include |' rule rows found")
    for row, sources_in, banned in table:
        for name in sources_in + banned:
            if not exists(opt.root, name):
                problems.append(f"{where}:{row}: the rule names '{name}', which does not exist")
        for rel in sources(opt.root):
            if not any(covers(s, rel) for s in sources_in):
                continue
            for n, target in includes(opt.root, rel):
                hit = next((b for b in banned if covers(b, target)), None)
                if hit:
                    problems.append(f"{rel}:{n} includes {target}, against {where}:{row} "
                                    f"(files in {' '.join(sources_in)} never include {hit})")
    for p in problems:
        print(f"check_architecture: {p}")
    print(f"check_architecture: {len(diagram_names(lines))} diagram names, "
          f"{len(levels(lines))} levels, {len(table)} rules, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
