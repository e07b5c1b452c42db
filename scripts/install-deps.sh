#!/usr/bin/env bash
# Installs the Debian packages remat-train builds against, and nothing else.
# Idempotent: packages already present are skipped, so a second run takes well under a second.
set -euo pipefail

case "${1-}" in
  "") ;;
  -h | --help)
    echo "usage: scripts/install-deps.sh   (no arguments: installs the missing Debian packages"
    echo "that remat-train builds against, with apt-get, through sudo when not root; nothing"
    echo "when every one is present. \`make run\` and \`make test\` run it.)"
    exit 0
    ;;
  *)
    echo "error: install-deps.sh takes no arguments, got '$1'. Fix: run scripts/install-deps.sh" \
      "alone (--help says what it does)" >&2
    exit 2
    ;;
esac

packages=(
  build-essential cmake
  libcli11-dev libtomlplusplus-dev catch2 nlohmann-json3-dev libfmt-dev
  libxxhash-dev            # XXH3-64 checksums of checkpoint files
  libpcre2-dev pkgconf     # PCRE2 (found by pkg-config): the regexes of tokenizer.json pre-tokenizers
  xz-utils                 # the tests' tokenizer.json files are stored xz-compressed
  libopenblas-openmp-dev   # OpenBLAS on OpenMP: one thread pool shared with our kernels
  libdnnl2                 # oneDNN (OpenMP): the CPU GEMM's tiles, loaded at run time
  libopenmpi-dev openmpi-bin  # mpirun and MPI: data-parallel runs ([parallel])
  python3-matplotlib       # scripts/plot_sweep.py
  python3-jinja2           # scripts/prepare_data.py --chat: the chat template (docs/data.md)
  patchelf                 # scripts/device-bundle.sh: RUNPATH of the bundled binaries
  clang libclang-rt-14-dev # libFuzzer + sanitizers: `make fuzz`, and the fuzz step of `make test`
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "[install-deps] installing: ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "[install-deps] done"
