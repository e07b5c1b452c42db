#!/usr/bin/env bash
# Removes what `cmake --install` (`make install`) put in place:
#   scripts/uninstall.sh MANIFEST     (`make uninstall` gives it build/install_manifest.txt)
# Every file MANIFEST lists, then share/remat-train and share/doc/remat-train where left empty
# (bin/ and share/ themselves stay: other programs live there).
set -euo pipefail

usage() { sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//'; }
case "${1:-}" in -h | --help) usage; exit 0 ;; esac
if [ $# -ne 1 ]; then
  usage >&2
  exit 2
fi
manifest=$1
if [ ! -f "$manifest" ]; then
  echo "error: [uninstall] $manifest not found: it lists what \`make install\` installed, so nothing" \
    "is known to remove. Fix: run \`make install\` (same BUILD and PREFIX) first, or remove the files by hand" >&2
  exit 1
fi

removed=0
gone=0
failed=0
declare -A dirs=()
while IFS= read -r f || [ -n "$f" ]; do
  [ -n "$f" ] || continue
  if [ -e "$f" ] || [ -L "$f" ]; then
    if rm -f -- "$f"; then removed=$((removed + 1)); else failed=$((failed + 1)); fi
  else
    gone=$((gone + 1))
  fi
  case "$f" in */share/remat-train/* | */share/doc/remat-train/*) dirs["$(dirname -- "$f")"]=1 ;; esac
done <"$manifest"

# The folders under share/remat-train and share/doc/remat-train, deepest first, up to those two:
# only when empty.
while IFS= read -r d; do
  while [ -n "$d" ] && rmdir -- "$d" 2>/dev/null; do
    case "$d" in */share/remat-train | */share/doc/remat-train) break ;; esac
    d=$(dirname -- "$d")
  done
done < <(for d in "${!dirs[@]}"; do echo "${#d} $d"; done | sort -rn | cut -d' ' -f2-)

note=""
[ $gone -eq 0 ] || note=" ($gone listed were already gone)"
echo "[uninstall] removed $removed files listed in $manifest$note"
if [ $failed -ne 0 ]; then
  echo "error: [uninstall] $failed files could not be removed. Fix: run it as a user who may" \
    "write the install folder (sudo make uninstall for /usr/local)" >&2
  exit 1
fi
