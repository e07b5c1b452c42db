#!/bin/bash
# scripts/torch_reference.py's LoRA (peft over the same model) against remat-train's
# (tests/torch_reference_lora_check.py): from the same base weights and batch, step 1's loss with
# fresh adapters within 1e-5, and 3 steps' losses, learning rates and gradient norms from the same
# PEFT adapter within 1e-4, for two Llama-family models and a GPT-2.
# Needs torch and peft for $REMAT_HF_PYTHON (default python3; the venv of scripts/make-hf-venv.sh
# has them); without them the test is skipped (exit 77), so `make test` never needs them.
# Usage: [REMAT_HF_PYTHON=venv/bin/python] tests/torch_reference_lora_check.sh [path/to/remat-train]
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"
hf_python_check torch_reference_lora_check.py 'import torch, peft, safetensors' \
  "scripts/make-hf-venv.sh; then REMAT_HF_PYTHON=/path/to/venv/bin/python" "$@"
