#!/bin/bash
# scripts/prepare_data.py end to end (tests/prepare_data_check.py): tokenizers it builds itself,
# shards checked token by token against the `tokenizers` package, a few training steps on them,
# and `sample --tokenizer tokenizer.json` against tokenizers' own decode.
# Needs the Python package `tokenizers` for $REMAT_HF_PYTHON (default python3); without it the test
# is skipped (exit 77), so `make test` never needs it.
# Usage: tests/prepare_data_check.sh [path/to/remat-train]
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"
hf_python_check prepare_data_check.py 'import tokenizers' \
  "python3 -m venv V && V/bin/pip install tokenizers; then REMAT_HF_PYTHON=V/bin/python" "$@"
