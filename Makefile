# Thin wrapper over CMake (CMakeLists.txt is the source of truth).
#   make run       install missing packages, build Release, train configs/long.toml on the CPU,
#                  then sample from the checkpoint it wrote and draw the run into out/long.png
#   make test      same set-up, build, run every test (ctest)
#   make sanitize  ASan + UBSan build, runs the cpu tests
#   make format    clang-format every source file
#   make fuzz      libFuzzer targets (clang, ASan + UBSan) in build-fuzz, each run FUZZ_TIME
#                  seconds, two at a time; `make test` ends with this step when clang++ is present
#   make soak      the long form of the soak test of files other processes change under running
#                  jobs (tests/soak/soak.py; SOAK_MINUTES, default 10; SOAK_SLOTS, SOAK_SEED)
#   make golden    regenerate the PyTorch golden (tests/golden/) with Debian's python3-torch,
#                  installed here only: `make test` never needs it
#   make install   build, then install into PREFIX (default /usr/local; e.g. PREFIX=$HOME/.local):
#                  bin/remat-train, its scripts as bin/remat-train-*, share/remat-train/configs,
#                  the manual in share/doc/remat-train
#   make uninstall remove every file the last install listed in BUILD/install_manifest.txt
BUILD    ?= build
JOBS     ?= $(shell nproc)
WERROR   ?= $(or $(REMAT_WERROR),OFF)
CMAKE_FLAGS ?=
PREFIX   ?= /usr/local
# Debian's python3-matplotlib lives in /usr/bin/python3, which another python3 on the PATH (pyenv,
# a venv) may shadow: the plots use whichever of the two has it.
PLOT_PYTHON = $(shell python3 -c 'import matplotlib' 2>/dev/null && echo python3 || echo /usr/bin/python3)

# 20 s per target keeps `make test` under CI's 15 minutes on a noisy 2-core VM (14m57s with 40 s
# on 2026-12-02, the tests themselves slowed by the host). Longer runs: `make fuzz FUZZ_TIME=600`.
FUZZ_TIME ?= 20
FUZZ_TARGETS := config shard safetensors gpt2_tokenizer checkpoint_state

.PHONY: all deps build run test sanitize format clean fuzz golden install uninstall soak

all: build

deps:
	@bash scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DREMAT_WERROR=$(WERROR) $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# The demo starts over each time: out/long holds only its own checkpoints.
run: build
	rm -rf out/long out/long.jsonl out/long.png
	mkdir -p out
	./$(BUILD)/remat-train --config configs/long.toml --metrics out/long.jsonl
	./$(BUILD)/remat-train sample --checkpoint out/long --prompt "// The memory pool" --tokens 200 --temperature 0.8 --top-k 40
	@$(PLOT_PYTHON) scripts/plot_run.py out/long.jsonl --out out/long.png || \
	  echo "[run] no plot: install python3-matplotlib (scripts/install-deps.sh)"

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(shell nproc)
	@if command -v clang++ >/dev/null; then $(MAKE) --no-print-directory fuzz; \
	else echo "[fuzz] clang++ not found: fuzz step skipped"; fi

# A separate clang build of only the parsers (tests/fuzz/CMakeLists.txt), then every target for
# FUZZ_TIME seconds, two at a time (CI has two cores). Seeds: tests/fuzz/<target>/.
fuzz: deps
	@cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_COMPILER=clang++ -DREMAT_FUZZ=ON \
	  -DREMAT_CUDA=OFF -DREMAT_WERROR=$(WERROR) >/dev/null
	@cmake --build build-fuzz -j $(JOBS) --target $(addprefix fuzz_,$(FUZZ_TARGETS))
	@bash tests/fuzz/run.sh build-fuzz/tests/fuzz $(FUZZ_TIME) $(FUZZ_TARGETS)

sanitize: deps
	@cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo -DREMAT_SANITIZE=ON -DREMAT_WERROR=$(WERROR) -DREMAT_CUDA=OFF >/dev/null
	@cmake --build build-sanitize -j $(JOBS)
	cd build-sanitize && ctest --output-on-failure -L cpu -j $(shell nproc)

# The short form (a minute) runs in `make test` (ctest soak_short, labels smoke;soak).
SOAK_MINUTES ?= 10
SOAK_SLOTS ?= 3
SOAK_SEED ?= $(shell date +%s)
soak: build
	python3 tests/soak/soak.py --binary $(BUILD)/remat-train --minutes $(SOAK_MINUTES) \
	  --slots $(SOAK_SLOTS) --seed $(SOAK_SEED)

# scripts/torch_golden.py runs under Debian's python3 (/usr/bin/python3), which python3-torch
# installs into; another python3 first on PATH would not see it.
golden: build
	@dpkg-query -W -f='$${Status}' python3-torch 2>/dev/null | grep -q "install ok installed" || \
	  { echo "[golden] installing python3-torch"; $(if $(filter 0,$(shell id -u)),,sudo) apt-get install -y -qq --no-install-recommends python3-torch >/dev/null; }
	/usr/bin/python3 scripts/torch_golden.py --binary $(BUILD)/remat-train

# CMake lists what it installed in $(BUILD)/install_manifest.txt, which `make uninstall` reads.
install: build
	cmake --install "$(BUILD)" --prefix "$(PREFIX)"

uninstall:
	@bash scripts/uninstall.sh "$(BUILD)/install_manifest.txt"

format:
	@git ls-files '*.h' '*.cpp' '*.cu' '*.cuh' | xargs clang-format -i

clean:
	rm -rf $(BUILD) build-sanitize build-fuzz

# The prebuilt folder scripts/device-check.sh runs on a GPU machine that cannot build
# (device-bundle/: binaries + non-system libraries, RUNPATH $$ORIGIN/lib; see the script).
.PHONY: bundle
bundle: build
	@bash scripts/device-bundle.sh --build $(BUILD)
