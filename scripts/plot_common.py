"""What the plot scripts (plot_run.py, plot_eval.py, plot_sweep.py) share: writing the figure."""
import sys


def save_figure(fig, out, **savefig_args):
    """Writes `fig` to the PNG `out` and says so. Returns the exit status: 0; 1 when the file
    cannot be written; 2 for an extension matplotlib cannot write. Each failure is one error
    line naming the file and the fix."""
    try:
        fig.savefig(out, **savefig_args)
    except OSError as e:
        print(f"error: [plot] {out}: cannot write: {e.strerror}. Fix: give --out a PNG path in a "
              "folder that exists and you can write", file=sys.stderr)
        return 1
    except ValueError as e:  # an extension matplotlib cannot write
        print(f"error: [plot] {out}: {e}. Fix: end --out with .png", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0
