#!/usr/bin/env bash
# The longest-context sweep plus its plot in one command:
#   scripts/sweep.sh CONFIG [sweep args...]
# Builds remat-train if needed (`make build`), runs `remat-train sweep --config CONFIG` into
# out/sweep-<config name> (or the --out DIR among the args), then scripts/plot_sweep.py DIR.
# Without --seq-lens it sweeps 128..2k (doubling); without --steps, 2 steps per point.
# Environment: BUILD (build folder, default build), REMAT (a remat-train binary to use instead).
# Installed (`make install`) it is remat-train-sweep and uses the remat-train beside it.
set -euo pipefail

usage() { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; }
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  usage
  exit 0
fi
if [ $# -lt 1 ]; then
  usage >&2
  exit 2
fi
config=$1
shift
here=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)  # through symlinks: a link on the PATH still finds its neighbours
if [ -f "$here/../Makefile" ] && [ -f "$here/plot_sweep.py" ]; then
  # In the source tree: the build folder's binary, built if missing.
  root=$(cd "$here/.." && pwd)
  build=${BUILD:-build}
  remat=${REMAT:-$root/$build/remat-train}
  plot=$here/plot_sweep.py
  if [ ! -x "$remat" ]; then
    echo "[sweep.sh] building $remat"
    make -C "$root" build BUILD="$build" >/dev/null
  fi
else
  # Installed (`make install`) as remat-train-sweep: the binary and plot script beside it.
  remat=${REMAT:-$here/remat-train}
  plot=$here/remat-train-plot-sweep
  if [ ! -x "$remat" ]; then
    echo "error: [sweep.sh] $remat not found. Fix: reinstall (make install) or set REMAT to a remat-train binary" >&2
    exit 2
  fi
fi

args=("$@")
out=""
has_seq_lens=0
has_steps=0
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[$i]}" in
    --out) out=${args[$((i + 1))]:-} ;;
    --out=*) out=${args[$i]#--out=} ;;
    --seq-lens | --seq-lens=*) has_seq_lens=1 ;;
    --steps | --steps=*) has_steps=1 ;;
  esac
done
if [ -z "$out" ]; then
  out="out/sweep-$(basename "$config" .toml)"
  args+=(--out "$out")
fi
[ $has_seq_lens -eq 1 ] || args+=(--seq-lens 128..2k)
[ $has_steps -eq 1 ] || args+=(--steps 2)

status=0
"$remat" sweep --config "$config" "${args[@]}" || status=$?
# 1: some point failed (still plotted); 130: interrupted (the finished points are plotted).
if [ $status -ne 0 ] && [ $status -ne 1 ] && [ $status -ne 130 ]; then exit $status; fi
# Debian's python3-matplotlib lives in /usr/bin/python3, which another python3 on the PATH
# (pyenv, a venv) may shadow.
py=python3
if ! python3 -c 'import matplotlib' 2>/dev/null && /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  py=/usr/bin/python3
fi
if [ -f "$out/sweep.json" ]; then
  "$py" "$plot" "$out" ||
    echo "[sweep.sh] no plot: install python3-matplotlib (scripts/install-deps.sh)" >&2
fi
exit $status
