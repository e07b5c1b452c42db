#!/usr/bin/env python3
"""Plot training runs: one or more `remat-train train --metrics FILE` JSONL files into one PNG.

Three panels against step: loss (solid; val_loss dashed with markers, on the steps that have it),
tokens/s, and peak memory. Several files are overlaid, one colour per run.
  plot_run.py RUN.jsonl [RUN2.jsonl ...] [--label NAME ...] [--out PNG] [--title TEXT]
Needs matplotlib (Debian: python3-matplotlib, installed by scripts/install-deps.sh).
"""
import argparse
import json
import os
import sys

MIB = 1024.0 * 1024.0
FIX_FILE = "give a file that `remat-train train --metrics FILE` wrote"


class BadInput(Exception):
    def __init__(self, message, code):
        super().__init__(message)
        self.code = code


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v


def read_run(path):
    """(step rows, summary or None) of one metrics file; event lines are skipped."""
    if os.path.exists(path) and not os.path.isfile(path):  # a FIFO would be waited on
        raise BadInput(f"{path}: not a regular file. Fix: {FIX_FILE}", 2)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise BadInput(f"{path}: cannot read: {e.strerror}. Fix: {FIX_FILE}", 1)
    except UnicodeDecodeError:
        raise BadInput(f"{path}: not UTF-8 text, so not a metrics file. Fix: {FIX_FILE}", 2)
    lines = text.split("\n")
    # A run still writing has a last line without its newline yet: plot what is finished.
    if lines and not text.endswith("\n"):
        lines.pop()
    rows, summary = [], None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise BadInput(f"{path}:{n}: not JSON ({e.msg} at column {e.colno}). Fix: {FIX_FILE}", 2)
        if not isinstance(obj, dict):
            raise BadInput(f"{path}:{n}: not a JSON object. Fix: {FIX_FILE}", 2)
        if obj.get("event") == "resume":
            # A run killed after its last checkpoint logged steps that the resume does again: keep
            # the resumed ones, or the curves would run backwards.
            if not is_number(obj.get("step", 0)):
                raise BadInput(f"{path}:{n}: a resume event whose step is not a number. "
                               f"Fix: {FIX_FILE}", 2)
            rows = [r for r in rows if r["step"] <= obj.get("step", 0)]
            continue
        if "event" in obj:
            continue
        if "summary" in obj:
            summary = obj["summary"]
            continue
        missing = [k for k in ("step", "loss", "tokens_per_s", "peak_bytes") if k not in obj]
        if missing:
            raise BadInput(f"{path}:{n}: a step line without {', '.join(missing)}. Fix: {FIX_FILE}", 2)
        # A loss may be NaN or null (a diverged step: remat-train writes null); the rest is drawn.
        wrong = [k for k in ("step", "tokens_per_s", "peak_bytes") if not is_number(obj[k])]
        if wrong or not (is_number(obj["loss"]) or obj["loss"] is None):
            raise BadInput(f"{path}:{n}: a step line whose {', '.join(wrong or ['loss'])} is not a "
                           f"number. Fix: {FIX_FILE}", 2)
        rows.append(obj)
    if not rows:
        raise BadInput(f"{path}: no step lines. Fix: {FIX_FILE} (after at least one step)", 2)
    return rows, summary


def describe(label, summary):
    """The run's part of the title: its label, policy and seq_len from the summary line."""
    if not summary:
        return f"{label} (unfinished)"
    extra = " (interrupted)" if summary.get("interrupted") else ""
    return f"{label}: {summary.get('policy', '?')}, seq_len {summary.get('seq_len', '?')}{extra}"


def main(argv):
    ap = argparse.ArgumentParser(
        prog=os.path.basename(argv[0]),
        description="Plot `remat-train train --metrics FILE` runs: loss, tokens/s and peak memory vs step.")
    ap.add_argument("files", nargs="+", metavar="RUN.jsonl")
    ap.add_argument("--label", action="append", default=[],
                    help="legend name of each file, in order (default: the file names)")
    ap.add_argument("--out", help="PNG to write (default: the first file's name with .png)")
    ap.add_argument("--title", help="figure title (default: each run's policy and seq_len)")
    args = ap.parse_args(argv[1:])
    if args.label and len(args.label) != len(args.files):
        ap.error(f"{len(args.label)} --label for {len(args.files)} files: give one per file, or none")

    try:
        import matplotlib
    except ImportError:
        print(f"{ap.prog}: {sys.executable} has no matplotlib. Fix: install python3-matplotlib "
              "(scripts/install-deps.sh) and run this script with /usr/bin/python3, or pip install "
              "matplotlib for this interpreter", file=sys.stderr)
        return 1
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    try:
        runs = [read_run(p) for p in args.files]
    except BadInput as e:
        print(f"error: [plot] {e}", file=sys.stderr)
        return e.code
    labels = args.label or [os.path.basename(p) for p in args.files]
    out = args.out or os.path.splitext(args.files[0])[0] + ".png"

    top = max(r["peak_bytes"] for rows, _ in runs for r in rows)
    unit, scale = ("GiB", MIB * 1024) if top >= MIB * 1024 else ("MiB", MIB)
    fig, (ax_loss, ax_tok, ax_mem) = plt.subplots(3, 1, sharex=True, figsize=(8, 9), dpi=90)
    for i, ((rows, _), label) in enumerate(zip(runs, labels)):
        color = f"C{i}"
        # Policies change memory and speed, not the losses (bit for bit): each later run is drawn
        # thinner, so that identical curves still show every colour.
        lw = max(0.8, 2.6 - 0.6 * i)
        steps = [r["step"] for r in rows]
        ax_loss.plot(steps, [r["loss"] for r in rows], "-", color=color, lw=lw, label=label)
        val = [r for r in rows if r.get("val_loss") is not None]
        if val:
            ax_loss.plot([r["step"] for r in val], [r["val_loss"] for r in val], "o--", color=color,
                         lw=lw, markersize=4)
        ax_tok.plot(steps, [r["tokens_per_s"] for r in rows], "-", color=color, lw=lw, label=label)
        ax_mem.plot(steps, [r["peak_bytes"] / scale for r in rows], "-", color=color, lw=lw, label=label)
    if any(r.get("val_loss") is not None for rows, _ in runs for r in rows):
        ax_loss.plot([], [], "ko--", markersize=4, label="val_loss (dashed)")
    ax_loss.set_ylabel("loss")
    ax_tok.set_ylabel("tokens/s")
    ax_mem.set_ylabel(f"peak memory ({unit})")
    ax_mem.set_xlabel("step")
    ax_mem.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in (ax_tok, ax_mem):
        ax.set_ylim(bottom=0)
    for ax in (ax_loss, ax_tok, ax_mem):
        ax.grid(True, alpha=0.3)
    ax_loss.legend(fontsize=8)
    fig.suptitle(args.title or "; ".join(describe(l, s) for (_, s), l in zip(runs, labels)), fontsize=10)
    fig.tight_layout()
    try:
        fig.savefig(out)
    except OSError as e:
        print(f"error: [plot] {out}: cannot write: {e.strerror}. Fix: give --out a PNG path in a folder "
              "that exists and you can write", file=sys.stderr)
        return 1
    except ValueError as e:  # an extension matplotlib cannot write
        print(f"error: [plot] {out}: {e}. Fix: end --out with .png", file=sys.stderr)
        return 2
    # matplotlib adds .png to a name without an extension: say the file it wrote.
    print(f"wrote {out if os.path.splitext(out)[1] else out + '.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
