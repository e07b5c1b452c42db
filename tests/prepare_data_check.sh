#!/bin/bash
# scripts/prepare_data.py end to end (tests/prepare_data_check.py): tokenizers it builds itself,
# shards checked token by token against the `tokenizers` package, a few training steps on them,
# and `sample --tokenizer tokenizer.json` against tokenizers' own decode.
# Needs the Python package `tokenizers` for $REMAT_HF_PYTHON (default python3); without it the test
# is skipped (exit 77), so `make test` never needs it.
# Usage: tests/prepare_data_check.sh [path/to/remat-train]
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"
repo=$(cd "$(dirname "$0")/.." && pwd)
bin=$(realpath "${1:-$repo/build/remat-train}")
[ -x "$bin" ] || fail "no remat-train binary at $bin (run make build, or pass its path)"

py=${REMAT_HF_PYTHON:-python3}
if ! command -v "$py" >/dev/null || ! "$py" -c 'import tokenizers' 2>/dev/null; then
  echo "skipped: $py cannot import tokenizers (python3 -m venv V && V/bin/pip install tokenizers;" \
    "then REMAT_HF_PYTHON=V/bin/python)"
  exit 77
fi
cd "$d"
"$py" "$repo/tests/prepare_data_check.py" "$repo" "$bin"
