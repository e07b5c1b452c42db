#!/usr/bin/env python3
"""Plot a `remat-train sweep` folder: DIR/sweep.json -> DIR/sweep.png.

Left: peak memory vs seq_len per policy (log2 x axis), measured where the point ran and
predicted (dashed, hollow markers) where it ran out of memory, with the budget as a
horizontal line. Right: measured tokens/s vs seq_len per policy.
Needs matplotlib (Debian: python3-matplotlib, installed by scripts/install-deps.sh).
"""
import json
import os
import sys

MIB = 1024.0 * 1024.0


def import_matplotlib():
    """pyplot and the tickers, or None (the message said why)."""
    try:
        import matplotlib
    except ImportError:
        print(f"plot_sweep.py: {sys.executable} has no matplotlib. Fix: install "
              "python3-matplotlib (scripts/install-deps.sh) and run this script with "
              "/usr/bin/python3, or pip install matplotlib for this interpreter", file=sys.stderr)
        return None
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
    from matplotlib import ticker
    return plt, ticker


def fmt_mib(mib):
    if mib >= 1024:
        return f"{mib / 1024:.3g} GiB"
    if mib < 1:
        return f"{mib * 1024:.3g} KiB"
    return f"{mib:.3g} MiB"


def fmt_count(n):
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20}M"
    if n >= 1 << 10 and n % (1 << 10) == 0:
        return f"{n >> 10}k"
    return str(n)


def main(argv):
    usage = "usage: plot_sweep.py DIR   (DIR holds sweep.json from `remat-train sweep --out DIR`)"
    if len(argv) == 2 and argv[1] in ("-h", "--help"):
        print(usage)
        print(__doc__.strip())
        return 0
    if len(argv) != 2:
        print(usage, file=sys.stderr)
        return 2
    folder = argv[1]
    path = os.path.join(folder, "sweep.json")
    fix = f"run `remat-train sweep --out {folder}` first"
    if os.path.exists(path) and not os.path.isfile(path):  # a FIFO would be waited on
        print(f"error: [plot] {path}: not a regular file. Fix: {fix}", file=sys.stderr)
        return 2
    try:
        with open(path, encoding="utf-8") as f:
            sweep = json.load(f)
    except OSError as e:
        print(f"error: [plot] cannot read {path}: {e.strerror}. Fix: {fix}", file=sys.stderr)
        return 2
    except ValueError as e:  # not JSON, or not UTF-8
        print(f"error: [plot] {path}: not JSON ({e}). Fix: {fix}", file=sys.stderr)
        return 2
    mpl = import_matplotlib()
    if mpl is None:
        return 1
    try:
        return plot(sweep, folder, *mpl)
    except (KeyError, TypeError, AttributeError, ValueError, IndexError) as e:
        print(f"error: [plot] {path}: not the sweep.json remat-train writes ({type(e).__name__}: "
              f"{e}). Fix: {fix}", file=sys.stderr)
        return 2


def plot(sweep, folder, plt, ticker):
    points = sweep["points"]
    policies = [p for p in sweep["policies"] if any(q["policy"] == p for q in points)]
    fig, (ax_mem, ax_tok) = plt.subplots(1, 2, figsize=(10, 4), dpi=90)
    for i, pol in enumerate(policies):
        color = f"C{i}"
        rows = sorted((q for q in points if q["policy"] == pol), key=lambda q: q["seq_len"])
        x = [q["seq_len"] for q in rows]
        ax_mem.plot(x, [q["predicted_peak_bytes"] / MIB for q in rows], "--", color=color, alpha=0.5)
        ok = [q for q in rows if q["status"] == "ok"]
        oom = [q for q in rows if q["status"] == "oom"]
        ax_mem.plot([q["seq_len"] for q in ok], [q["measured_peak_bytes"] / MIB for q in ok], "o-", color=color,
                    label=pol)
        if oom:
            ax_mem.plot([q["seq_len"] for q in oom], [q["predicted_peak_bytes"] / MIB for q in oom], "x", color=color,
                        markersize=8)
        ax_tok.plot([q["seq_len"] for q in ok], [q["tokens_per_s"] for q in ok], "o-", color=color, label=pol)

    # Budget line, unless it is so far above every point (the CPU default: all of RAM) that it
    # would flatten the curves; then the title says it.
    budget = sweep["budget_bytes"] / MIB
    top = max([q["predicted_peak_bytes"] / MIB for q in points] + [1e-9])
    budget_note = ""
    if budget <= 4 * top:
        ax_mem.axhline(budget, color="black", linewidth=1)
        ax_mem.annotate(f"budget {fmt_mib(budget)}", (0.02, budget), xycoords=("axes fraction", "data"),
                        textcoords="offset points", xytext=(0, 3), fontsize=8)
    else:
        budget_note = f", budget {fmt_mib(budget)} (off the chart)"
    ax_mem.plot([], [], "k--", alpha=0.5, label="predicted")
    ax_mem.plot([], [], "kx", label="out of memory")
    seq_lens = sweep["seq_lens"]
    for ax in (ax_mem, ax_tok):
        ax.set_xscale("log", base=2)
        ax.set_xticks(seq_lens)
        ax.set_xticklabels([fmt_count(t) for t in seq_lens], fontsize=8)
        ax.set_xlabel("seq_len (tokens)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    ax_mem.set_yscale("log", base=2)  # ticks at 16, 24, 32, 48, 64 ... MiB
    ax_mem.yaxis.set_major_locator(ticker.LogLocator(base=2, subs=(1.0, 1.5), numticks=12))
    ax_mem.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: fmt_mib(v)))
    ax_mem.yaxis.set_minor_formatter(ticker.NullFormatter())
    ax_mem.tick_params(axis="y", labelsize=8)
    ax_mem.set_ylabel("peak memory")
    ax_mem.set_title("peak memory vs seq_len", fontsize=10)
    ax_tok.set_ylabel("tokens/s (measured)")
    ax_tok.set_ylim(bottom=0)
    ax_tok.set_title("throughput vs seq_len", fontsize=10)
    name = os.path.basename(sweep["config"])
    steps = sweep["steps"]
    tile = sweep.get("tile_tokens", 0)
    tile_note = f", MLP in chunks of {tile} tokens" if tile else ""
    fig.suptitle(f"{name} on {sweep['target']}: batch {sweep['batch_size']}{tile_note}, {steps} step{'s' if steps != 1 else ''} "
                 f"per point{budget_note}" + (" (interrupted)" if sweep.get("interrupted") else ""), fontsize=10)
    fig.tight_layout()
    out = os.path.join(folder, "sweep.png")
    fig.savefig(out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
