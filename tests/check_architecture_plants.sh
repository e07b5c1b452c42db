#!/usr/bin/env bash
# scripts/check_architecture.py can fail: on a copy of the sources it passes, then fails on a
# planted include that breaks a rule of docs/architecture.md (a layer asking for the remat
# policy), on one that points up its levels (the core including the trainer), on a folder placed
# in no level, and on a diagram naming a folder that is gone.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/docs"
cp -r cmd data engine layers "$tmp/"
cp docs/architecture.md "$tmp/docs/"
python3 scripts/check_architecture.py --root "$tmp" >/dev/null
sed -i '1i #include "engine/config/policy.h"' "$tmp/layers/gpt_block.cpp"
if out=$(python3 scripts/check_architecture.py --root "$tmp"); then
  echo "FAIL: a planted include of engine/config/policy.h in layers/ passed"; exit 1
fi
grep -q 'layers/gpt_block.cpp:1 includes engine/config/policy.h' <<<"$out" || { echo "FAIL: $out"; exit 1; }
sed -i '1d' "$tmp/layers/gpt_block.cpp"
sed -i '1i #include "engine/training/trainer.h"' "$tmp/engine/core/tensor.cpp"
if out=$(python3 scripts/check_architecture.py --root "$tmp"); then
  echo "FAIL: a planted include of the trainer in engine/core/ passed"; exit 1
fi
grep -q 'engine/core/tensor.cpp:1 includes engine/training/trainer.h (level 10), above its own level 1' <<<"$out" ||
  { echo "FAIL: $out"; exit 1; }
sed -i '1d' "$tmp/engine/core/tensor.cpp"
mkdir -p "$tmp/engine/extras" && echo '#pragma once' >"$tmp/engine/extras/new.h"
if out=$(python3 scripts/check_architecture.py --root "$tmp"); then
  echo "FAIL: a folder in no level passed"; exit 1
fi
grep -q 'engine/extras/new.h is in no level' <<<"$out" || { echo "FAIL: $out"; exit 1; }
rm -r "$tmp/engine/extras"
mv "$tmp/engine/experiments" "$tmp/engine/trials"
if out=$(python3 scripts/check_architecture.py --root "$tmp"); then
  echo "FAIL: a diagram naming a missing folder passed"; exit 1
fi
grep -q "names 'engine/experiments'" <<<"$out" || { echo "FAIL: $out"; exit 1; }
echo "ok: the plants fail the check, the sources pass it"
