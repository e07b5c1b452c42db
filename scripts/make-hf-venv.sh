#!/usr/bin/env bash
# Creates the Python virtual environment that scripts/hf_golden.py runs in: PyTorch + Hugging Face
# transformers (and peft, for the LoRA goldens) at the versions pinned in
# scripts/requirements-hf.txt. Only for regenerating
# tests/golden/hf/ or checking an export against transformers; `make test` never needs it.
#
#   scripts/make-hf-venv.sh                      # -> /work/venv-hf
#   VENV=/some/where scripts/make-hf-venv.sh     # elsewhere (keep it out of the repository)
#   PYTHON=python3.12 scripts/make-hf-venv.sh    # another interpreter (3.10 or newer)
#
# Idempotent: an existing venv is reused and only brought to the pinned versions (pip does
# nothing when they are already installed). Needs network access to PyPI. The torch wheel from
# PyPI pulls its CUDA libraries (a few GB of disk); the golden only runs on the CPU.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
req="$here/requirements-hf.txt"
VENV="${VENV:-/work/venv-hf}"
PYTHON="${PYTHON:-python3}"

repo="$(cd "$here/.." && pwd)"
venv_abs="$(realpath -m "$VENV")"
case "$venv_abs/" in
  "$repo/"*) echo "error: VENV=$VENV is inside the repository; put it elsewhere" >&2; exit 2 ;;
esac

if [ ! -x "$venv_abs/bin/python" ]; then
  echo "creating venv $venv_abs with $PYTHON"
  if ! "$PYTHON" -m venv "$venv_abs"; then
    echo "error: '$PYTHON -m venv' failed. Fix (Debian): apt-get install python3-venv" >&2
    exit 1
  fi
fi

"$venv_abs/bin/python" -m pip install --quiet --upgrade pip
"$venv_abs/bin/python" -m pip install --quiet -r "$req"
"$venv_abs/bin/python" - <<'PY'
import torch, transformers, safetensors, numpy, tokenizers, peft
print("venv ready: torch", torch.__version__, "transformers", transformers.__version__,
      "safetensors", safetensors.__version__, "numpy", numpy.__version__,
      "tokenizers", tokenizers.__version__, "peft", peft.__version__)
PY
echo "run: $venv_abs/bin/python $repo/scripts/hf_golden.py"
