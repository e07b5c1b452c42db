#!/bin/bash
# remat-train's LoRA against peft and transformers end to end (tests/peft_check.py): a run started
# from a PEFT adapter, its `export --adapter` loaded by peft.PeftModel.from_pretrained and its
# merged `export --hf` loaded by transformers, both giving the loss remat-train computes on the
# same tokens (within 1e-5), for the Llama and GPT-2 goldens of tests/golden/hf/*-lora.
# Needs torch, transformers and peft for $REMAT_HF_PYTHON (default python3; the venv of
# scripts/make-hf-venv.sh has them); without them the test is skipped (exit 77), so `make test`
# never needs them.
# Usage: tests/peft_check.sh [path/to/remat-train]
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"
hf_python_check peft_check.py 'import torch, transformers, peft' \
  "scripts/make-hf-venv.sh; then REMAT_HF_PYTHON=/path/to/venv/bin/python" "$@"
