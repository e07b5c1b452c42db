#!/usr/bin/env python3
"""Plot `remat-train eval --json` results into one PNG.

Loss by position (eval without --passkey): the mean loss of each position bin against the
position (log scale), one line per file, several runs overlaid. A curve that keeps falling towards
the far positions shows a model that uses its long context.
Passkey retrieval (eval --passkey): one heatmap per file, context length across and the key's
depth down, each cell the share of its tasks answered exactly (green 1, red 0), as needle-in-a-
haystack plots draw it.
  plot_eval.py EVAL.json [EVAL2.json ...] [--label NAME ...] [--out PNG] [--title TEXT]
The files of one plot are all of one kind. Needs matplotlib (Debian: python3-matplotlib, installed
by scripts/install-deps.sh).
"""
import argparse
import json
import os
import sys

FIX_FILE = "give a file that `remat-train eval --json` wrote"


class BadInput(Exception):
    pass


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v


def check_records(path, obj, key, fields, nullable=()):
    """obj[key]: a list of objects whose `fields` are numbers (those in `nullable` may be null:
    a position bin the loss masks left empty)."""
    records = obj[key]
    ok = isinstance(records, list) and all(
        isinstance(r, dict) and all(is_number(r.get(f)) or (f in nullable and f in r and
                                                              r[f] is None) for f in fields)
        for r in records)
    if not ok:
        raise BadInput(f"{path}: \"{key}\" is not a list of objects with numeric "
                       f"{', '.join(fields)}. Fix: {FIX_FILE}")


def check_fields(path, obj, kind):
    """What the plots read, with the types they read them as."""
    if kind == "loss_by_position":
        check_records(path, obj, "bins", ("first", "last", "loss", "tokens"), nullable=("loss",))
        if not is_number(obj.get("loss")):
            raise BadInput(f"{path}: no numeric \"loss\". Fix: {FIX_FILE}")
        return
    check_records(path, obj, "cells", ("length", "depth", "tasks", "exact"))
    for key in ("lengths", "depths"):
        if not (isinstance(obj[key], list) and obj[key] and all(map(is_number, obj[key]))):
            raise BadInput(f"{path}: \"{key}\" is not a list of numbers. Fix: {FIX_FILE}")


def read_eval(path):
    # A FIFO or a device would be waited on, a folder fails later: regular files only.
    if os.path.exists(path) and not os.path.isfile(path):
        raise BadInput(f"{path}: not a regular file. Fix: {FIX_FILE}")
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except OSError as e:
        raise BadInput(f"{path}: cannot read: {e.strerror}. Fix: {FIX_FILE}")
    except (UnicodeDecodeError, ValueError) as e:
        raise BadInput(f"{path}: not JSON ({e}). Fix: {FIX_FILE}")
    kind = obj.get("eval") if isinstance(obj, dict) else None
    need = {"loss_by_position": ("bins", "seq_len"), "passkey": ("cells", "lengths", "depths")}
    if kind not in need:
        raise BadInput(f"{path}: no \"eval\": \"loss_by_position\" or \"passkey\" in it. "
                       f"Fix: {FIX_FILE}")
    missing = [k for k in need[kind] if k not in obj]
    if missing:
        raise BadInput(f"{path}: a {kind} result without {', '.join(missing)}. Fix: {FIX_FILE}")
    check_fields(path, obj, kind)
    return obj


def count(n):
    """4096 -> "4k", as remat-train writes lengths."""
    for unit, size in (("M", 1 << 20), ("k", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def plot_losses(plt, results, labels):
    fig, ax = plt.subplots(figsize=(8, 5), dpi=90)
    for i, (r, label) in enumerate(zip(results, labels)):
        bins = [b for b in r["bins"] if b.get("tokens", 0) > 0]
        # Each bin at the geometric middle of its positions: evenly spaced on the log axis.
        xs = [(b["first"] * b["last"]) ** 0.5 for b in bins]
        ax.plot(xs, [b["loss"] for b in bins], "o-", color=f"C{i}", lw=2, markersize=4,
                label=f"{label} (mean {r['loss']:.3f})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("position in the window (tokens of context seen)")
    ax.set_ylabel("mean loss")
    ax.grid(True, alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return fig


def plot_passkey(plt, results, labels):
    fig, axes = plt.subplots(1, len(results), figsize=(4.5 * len(results), 4), dpi=90,
                             squeeze=False)
    for k, (ax, r, label) in enumerate(zip(axes[0], results, labels)):
        lengths, depths = r["lengths"], r["depths"]
        grid = [[float("nan")] * len(lengths) for _ in depths]
        for c in r["cells"]:
            if c["length"] in lengths and c["depth"] in depths and c.get("tasks"):
                grid[depths.index(c["depth"])][lengths.index(c["length"])] = c["exact"] / c["tasks"]
        im = ax.imshow(grid, cmap="RdYlGn", vmin=0, vmax=1, aspect="auto")
        ax.set_xticks(range(len(lengths)), [count(n) for n in lengths])
        ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths])
        ax.set_xlabel("context length (tokens)")
        if k == 0:
            ax.set_ylabel("depth of the key")
        ax.set_title(label, fontsize=9)
        for y, row in enumerate(grid):
            for x, v in enumerate(row):
                if v == v:  # not NaN
                    ax.text(x, y, f"{v:.0%}", ha="center", va="center", fontsize=8)
    fig.colorbar(im, ax=list(axes[0]), label="exact match")
    return fig


def main(argv):
    ap = argparse.ArgumentParser(
        prog=os.path.basename(argv[0]),
        description="Plot `remat-train eval --json` results: loss by position, or passkey heatmaps.")
    ap.add_argument("files", nargs="+", metavar="EVAL.json")
    ap.add_argument("--label", action="append", default=[],
                    help="legend name of each file, in order (default: its \"label\", else the "
                         "file name)")
    ap.add_argument("--out", help="PNG to write (default: the first file's name with .png)")
    ap.add_argument("--title", help="figure title")
    args = ap.parse_args(argv[1:])
    if args.label and len(args.label) != len(args.files):
        ap.error(f"{len(args.label)} --label for {len(args.files)} files: give one per file, or none")
    try:
        results = [read_eval(p) for p in args.files]
        kinds = {r["eval"] for r in results}
        if len(kinds) > 1:
            raise BadInput("loss-by-position and passkey results in one plot. Fix: plot each kind "
                           "on its own")
    except BadInput as e:
        print(f"error: [plot] {e}", file=sys.stderr)
        return 2
    try:
        import matplotlib
    except ImportError:
        print(f"{ap.prog}: {sys.executable} has no matplotlib. Fix: install python3-matplotlib "
              "(scripts/install-deps.sh) and run this script with /usr/bin/python3, or pip install "
              "matplotlib for this interpreter", file=sys.stderr)
        return 1
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    labels = args.label or [r.get("label") or os.path.basename(p)
                            for r, p in zip(results, args.files)]
    out = args.out or os.path.splitext(args.files[0])[0] + ".png"
    kind = results[0]["eval"]
    fig = (plot_losses if kind == "loss_by_position" else plot_passkey)(plt, results, labels)
    default_title = ("loss by position" if kind == "loss_by_position" else "passkey retrieval")
    fig.suptitle(args.title or default_title, fontsize=10)
    try:
        fig.savefig(out, bbox_inches="tight")
    except OSError as e:
        print(f"error: [plot] {out}: cannot write: {e.strerror}. Fix: give --out a PNG path in a "
              "folder that exists and you can write", file=sys.stderr)
        return 1
    except ValueError as e:  # an extension matplotlib cannot write
        print(f"error: [plot] {out}: {e}. Fix: end --out with .png", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
