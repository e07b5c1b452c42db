#!/usr/bin/env bash
# Gathers a self-contained device bundle: the Release binaries built with CUDA (remat-train, the
# gpu test binary, the GEMM benchmark) plus every non-system shared library they load (OpenBLAS
# and its Fortran runtime, fmt, toml++, xxHash, PCRE2, libgomp), RUNPATH $ORIGIN/lib, in one
# folder that scripts/device-check.sh runs on a GPU machine with no compiler packages and no
# network.
# Why: such a machine has the CUDA runtime, cuBLAS and cuDNN (as Python wheels) but none of the
# Debian packages remat-train builds against, so it cannot build; it only runs.
#
#   scripts/device-bundle.sh [--build DIR] [--out DIR] [--no-build]
#     --build DIR   CMake build folder the binaries come from (default: build). Configured
#                   (Release, REMAT_CUDA=ON) when it has no cache yet; must target sm_90.
#     --out DIR     the bundle (default: device-bundle, ignored by git); replaced each time
#     --no-build    take the binaries as they are (tests/test_device_bundle.cpp: no rebuild
#                   while other tests run); otherwise the three targets are brought up to date
#
# Layout: OUT/{remat-train,remat_gpu_tests,remat_bench_gemm}, OUT/lib/*.so* (RUNPATH $ORIGIN),
# OUT/lib/compat/{libstdc++.so.6,libgcc_s.so.1} (used by device-check.sh only when the machine's
# own are too old: the process must share one libstdc++ with cuDNN, so the system's comes first),
# OUT/MANIFEST.txt (source commit, toolchain, minimum glibc/libstdc++ versions, files).
# Left out on purpose, the device provides them: glibc, libstdc++/libgcc_s, the CUDA runtime,
# cuBLAS(Lt), cuDNN, NCCL, NVRTC and the driver (OpenMPI is bundled: the binaries link it, and
# it is never initialised without a launcher). What travels to the device is OUT.tar.gz, the
# folder gzipped (device-check.sh unpacks it when the folder is not there): it must stay under
# 48 MiB, so that it travels with room to spare beside the sources (64 MiB reach the device in
# all); the folder is about 64 MiB, 37 of them OpenBLAS (kernels for every x86 CPU), the archive
# about 20 MiB. The folder itself never travels and may grow to 160 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=build
OUT=device-bundle
DO_BUILD=1
while [ $# -gt 0 ]; do
  case $1 in
    --build) BUILD=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --no-build) DO_BUILD=0; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "[bundle] unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

BINARIES=(remat-train tests/gpu/remat_gpu_tests tests/gpu/remat_bench_gemm)
MAX_BYTES=$((48 << 20))          # the archive, OUT.tar.gz
MAX_FOLDER_BYTES=$((160 << 20))  # the folder it unpacks to
# Libraries the device machine provides (glibc, the compiler runtime, the CUDA stack).
PROVIDED='^(linux-vdso|ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libutil|libresolv|libcuda|libcudart|libcublas|libcublasLt|libcudnn[a-z_]*|libnvrtc[a-z-]*|libnvJitLink|libnccl)\.so'
COMPAT='^(libstdc\+\+|libgcc_s)\.so'

die() { echo "[bundle] $*" >&2; exit 1; }
say() { echo "[bundle] $*"; }

cache_value() { sed -n "s/^$1:[A-Z]*=//p" "$BUILD/CMakeCache.txt"; }

configure_if_needed() {
  if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] ||
      die "no nvcc: the bundle needs the CUDA backend. Fix: install the CUDA toolkit, or put nvcc on PATH"
    say "configuring $BUILD (Release, REMAT_CUDA=ON)"
    cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DREMAT_CUDA=ON >/dev/null
  fi
  [ "$(cache_value CMAKE_BUILD_TYPE)" = Release ] ||
    die "$BUILD is a $(cache_value CMAKE_BUILD_TYPE) build; the bundle is Release. Fix: --build <another folder>"
  if [ -z "$(cache_value CMAKE_CUDA_COMPILER)" ] || [ "$(cache_value REMAT_CUDA)" = OFF ]; then
    die "$BUILD is built without CUDA. Fix: nvcc on PATH and REMAT_CUDA=AUTO or ON, or --build <another folder>"
  fi
}

check_sm90() {
  local flags=$BUILD/engine/cuda/CMakeFiles/remat_cuda.dir/flags.make
  [ -f "$flags" ] || die "$flags missing: is $BUILD configured with the CUDA backend?"
  grep -q 'code=\[sm_90\]' "$flags" ||
    die "$BUILD does not compile sm_90 code (H100/H200). Fix: -DCMAKE_CUDA_ARCHITECTURES='80-real;90-real;90-virtual'"
}

build_targets() {
  say "building remat-train remat_gpu_tests remat_bench_gemm in $BUILD"
  cmake --build "$BUILD" -j "${JOBS:-$(nproc)}" --target remat-train remat_gpu_tests remat_bench_gemm
}

# Lines "soname path" for every library a binary loads (ldd lists the whole closure).
needed_libs() {
  ldd "$1" | awk '/ => not found/ {print $1, "NOTFOUND"; next} / => \// {print $1, $3}'
}

copy_libs() {
  local bin soname path dest
  for bin in "${BINARIES[@]}"; do
    while read -r soname path; do
      [ "$path" = NOTFOUND ] && die "$BUILD/$bin needs $soname, which ldd does not find here"
      if [[ $soname =~ $PROVIDED ]]; then continue; fi
      dest=$OUT/lib
      if [[ $soname =~ $COMPAT ]]; then dest=$OUT/lib/compat; fi
      [ -f "$dest/$soname" ] || cp -L "$path" "$dest/$soname"
    done < <(needed_libs "$BUILD/$bin")
  done
}

set_runpaths() {
  # shellcheck disable=SC2016  # $ORIGIN is for the dynamic loader, not the shell
  local origin='$ORIGIN' f
  for f in "${BINARIES[@]}"; do patchelf --set-rpath "$origin/lib" "$OUT/$(basename "$f")"; done
  for f in "$OUT"/lib/*.so* "$OUT"/lib/compat/*.so*; do patchelf --set-rpath "$origin" "$f"; done
}

# Highest version of a symbol family ($1: GLIBC_, GLIBCXX_) that the files in the folders $2...
# (not below them) require: objdump's "Version References", not the versions a library defines.
max_version() {
  local family=$1 dir f
  shift
  for dir in "$@"; do
    for f in "$dir"/*; do
      if [ -f "$f" ] && [[ $f != *.txt ]]; then objdump -p "$f" | sed -n '/Version References/,$p'; fi
    done
  done | grep -o "${family}[0-9.]*" | sort -uV | tail -1
}

write_manifest() {
  local commit
  commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
  git diff --quiet HEAD 2>/dev/null || commit="$commit+uncommitted changes"
  {
    echo "remat-train device bundle, made $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
    echo "source: $commit; build folder: $BUILD"
    echo "nvcc: $(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p') ($(cache_value CMAKE_CUDA_COMPILER))"
    echo "cuda architectures: $(grep -o 'code=\[[a-z_0-9]*\]' "$BUILD/engine/cuda/CMakeFiles/remat_cuda.dir/flags.make" | sort -u | tr -d '[]' | sed 's/code=//' | paste -sd' ')"
    echo "needs at least: $(max_version GLIBC_ "$OUT" "$OUT/lib") $(max_version GLIBCXX_ "$OUT" "$OUT/lib") (lib/compat: $(max_version GLIBC_ "$OUT/lib/compat"))"
    "$OUT/remat-train" --version 2>/dev/null | sed 's/^/version: /' || true
    echo "files:"
    (cd "$OUT" && find . -type f ! -name MANIFEST.txt -printf '  %-28p %s\n' | sort)
  } > "$OUT/MANIFEST.txt"
}

# Every library of every bundled binary resolves inside the bundle or to what the device
# provides, with only OUT/lib on the library path (the here-check the issue asks for).
verify() {
  local bin soname path bad=0
  for bin in "${BINARIES[@]}"; do
    while read -r soname path; do
      if [ "$path" = NOTFOUND ]; then
        echo "[bundle] $(basename "$bin"): $soname not found" >&2; bad=1
      elif [[ $path != "$(cd "$OUT" && pwd)"/* ]] && ! [[ $soname =~ $PROVIDED|$COMPAT ]]; then
        echo "[bundle] $(basename "$bin"): $soname resolves outside the bundle ($path)" >&2; bad=1
      fi
    done < <(LD_LIBRARY_PATH="$OUT/lib" needed_libs "$OUT/$(basename "$bin")")
  done
  [ $bad -eq 0 ] || die "the bundle is incomplete (above)"
  LD_LIBRARY_PATH="$OUT/lib" "$OUT/remat-train" --version >/dev/null || die "the bundled remat-train does not start"
}

main() {
  command -v patchelf >/dev/null || die "patchelf missing. Fix: scripts/install-deps.sh (Debian package patchelf)"
  configure_if_needed
  check_sm90
  if [ $DO_BUILD -eq 1 ]; then build_targets; fi
  local b
  for b in "${BINARIES[@]}"; do [ -x "$BUILD/$b" ] || die "$BUILD/$b is not built (drop --no-build)"; done
  rm -rf "$OUT"
  mkdir -p "$OUT/lib/compat"
  # Symbols stripped: the device needs none of them, and the carry limit is 64 MiB in all (the
  # Llama family's kernels and op tests took the bundle past 60 MiB unstripped).
  for b in "${BINARIES[@]}"; do
    cp "$BUILD/$b" "$OUT/"
    strip --strip-unneeded "$OUT/$(basename "$b")"
  done
  copy_libs
  set_runpaths
  verify
  write_manifest
  local bytes packed
  bytes=$(du -sb "$OUT" | cut -f1)
  [ "$bytes" -le $MAX_FOLDER_BYTES ] || die "the bundle is $((bytes >> 20)) MiB, over the 160 MiB limit"
  rm -f "$OUT.tar.gz"
  tar -C "$(dirname "$OUT")" -czf "$OUT.tar.gz" "$(basename "$OUT")"
  packed=$(stat -c %s "$OUT.tar.gz")
  [ "$packed" -le $MAX_BYTES ] || die "$OUT.tar.gz is $((packed >> 20)) MiB, over the 48 MiB limit"
  say "$OUT: $((bytes >> 20)) MiB, $(find "$OUT/lib" -name '*.so*' | wc -l) libraries, $OUT.tar.gz $((packed >> 20)) MiB (send this one); $(sed -n 's/^needs at least: //p' "$OUT/MANIFEST.txt")"
}

main
