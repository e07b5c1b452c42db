#!/bin/bash
# `make install` and `make uninstall` end to end: installs BUILD into a scratch prefix
# (cmake --install), runs the installed binary and scripts from an empty folder with the prefix's
# bin/ first on the PATH (configs found in share/remat-train), then removes everything through the
# manifest with scripts/uninstall.sh, as `make uninstall` does.
#   bash tests/install_check.sh BUILD_DIR     (from the source folder; ctest: install_check)
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"
build=$(cd "${1:?usage: tests/install_check.sh BUILD_DIR}" && pwd)
src=$(pwd)
prefix=$d/prefix

# cmake --install rewrites BUILD/install_manifest.txt: the copy a real `make install` left there
# is put back (and none is left where there was none), so `make uninstall` still removes that.
manifest=$build/install_manifest.txt
[ ! -f "$manifest" ] || cp -p "$manifest" "$d/saved_manifest.txt"
restore() {
  if [ -f "$d/saved_manifest.txt" ]; then cp -p "$d/saved_manifest.txt" "$manifest"; else rm -f "$manifest"; fi
}
trap 'restore; rm -rf "$d"' EXIT

cmake --install "$build" --prefix "$prefix" >"$d/install.log" || fail "cmake --install: $(cat "$d/install.log")"
cp "$manifest" "$d/manifest.txt"
restore
for f in bin/remat-train bin/remat-train-sweep bin/remat-train-plot-sweep bin/remat-train-plot-run \
  bin/remat-train-plot-eval \
  share/remat-train/configs/copy.toml share/remat-train/configs/tiny.toml \
  share/doc/remat-train/README.md share/doc/remat-train/docs/configs.md; do
  case $f in
    bin/*) [ -x "$prefix/$f" ] || fail "not installed as a program: $f" ;;
    *) [ -f "$prefix/$f" ] || fail "not installed: $f" ;;
  esac
  grep -qx "$prefix/$f" "$d/manifest.txt" || fail "not in the manifest: $f"
done

# An empty folder, no source tree or build folder on the PATH, nothing that overrides the binary.
mkdir "$d/work"
cd "$d/work" || fail "cannot enter $d/work"
export PATH="$prefix/bin:/usr/bin:/bin"
unset REMAT BUILD
[ "$(command -v remat-train)" = "$prefix/bin/remat-train" ] || fail "remat-train on the PATH is $(command -v remat-train)"

remat-train --version >out.txt 2>&1 || fail "--version: $(cat out.txt)"
grep -q "^remat-train " out.txt || fail "--version printed: $(cat out.txt)"

remat-train plan --config configs/copy.toml >out.txt 2>&1 || fail "plan: $(cat out.txt)"
grep -q "$prefix/share/remat-train/configs/copy.toml" out.txt || fail "plan does not name the installed config: $(cat out.txt)"
grep -q "peak" out.txt || fail "plan printed no plan: $(cat out.txt)"

status=0
remat-train plan --config configs/nowhere.toml >out.txt 2>&1 || status=$?
[ $status -eq 2 ] || fail "a missing config exited $status"
grep -q "share/remat-train/configs/nowhere.toml" out.txt || fail "the error does not name the installed configs: $(cat out.txt)"
# The error points at the installed manual's page, which a user without the repository can open.
grep -q "(see $prefix/share/doc/remat-train/docs/configs.md)" out.txt ||
  fail "the error does not name the installed manual's page: $(cat out.txt)"
[ -f "$prefix/share/doc/remat-train/docs/configs.md" ] || fail "the page the error names is not installed"

remat-train-sweep configs/copy.toml --seq-lens 128 --policies full --steps 1 --out sw >out.txt 2>&1 ||
  fail "remat-train-sweep: $(cat out.txt)"
[ -f sw/sweep.csv ] || fail "remat-train-sweep wrote no sw/sweep.csv: $(cat out.txt)"
plots=0
if python3 -c 'import matplotlib' 2>/dev/null; then
  plots=1
  [ -f sw/sweep.png ] || fail "remat-train-sweep drew no sw/sweep.png: $(cat out.txt)"
else
  echo "install_check: no matplotlib for $(command -v python3): plots not checked"
fi

remat-train --config configs/tiny.toml --steps 3 --metrics m.jsonl -q >out.txt 2>&1 || fail "train: $(cat out.txt)"
grep -q '"summary"' m.jsonl || fail "m.jsonl has no summary line"

if [ $plots -eq 1 ]; then
  remat-train-plot-run m.jsonl --out m.png >out.txt 2>&1 || fail "remat-train-plot-run: $(cat out.txt)"
  [ "$(stat -c %s m.png)" -gt 1000 ] || fail "m.png is too small"
  printf '{"eval": "loss_by_position", "seq_len": 4, "loss": 2.0, "bins": [{"first": 1, "last": 1, "tokens": 2, "loss": 3.0}, {"first": 2, "last": 2, "tokens": 2, "loss": 2.0}, {"first": 3, "last": 4, "tokens": 4, "loss": 1.5}]}\n' >e.json
  remat-train-plot-eval e.json --out e.png >out.txt 2>&1 || fail "remat-train-plot-eval: $(cat out.txt)"
  [ "$(stat -c %s e.png)" -gt 1000 ] || fail "e.png is too small"
fi

cd "$src" || fail "cannot return to $src"
bash scripts/uninstall.sh "$d/manifest.txt" >"$d/uninstall.log" 2>&1 || fail "uninstall: $(cat "$d/uninstall.log")"
while IFS= read -r f; do
  [ ! -e "$f" ] || fail "left after uninstall: $f"
done <"$d/manifest.txt"
[ ! -e "$prefix/share/remat-train" ] || fail "left after uninstall: $prefix/share/remat-train"
[ ! -e "$prefix/share/doc/remat-train" ] || fail "left after uninstall: $prefix/share/doc/remat-train"
status=0
bash scripts/uninstall.sh "$d/no-manifest.txt" >"$d/out.txt" 2>&1 || status=$?
if [ $status -eq 0 ] || ! grep -q "Fix:" "$d/out.txt"; then
  fail "uninstall without a manifest: exit $status, $(cat "$d/out.txt")"
fi
echo "install_check: ok"
