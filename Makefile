# Thin wrapper over CMake (CMakeLists.txt is the source of truth).
#   make run       install missing packages, build Release, train configs/long.toml on the CPU,
#                  then sample from the checkpoint it wrote
#   make test      same set-up, build, run every test (ctest)
#   make sanitize  ASan + UBSan build, runs the cpu tests
#   make format    clang-format every source file
BUILD    ?= build
JOBS     ?= $(shell nproc)
WERROR   ?= $(or $(REMAT_WERROR),OFF)
CMAKE_FLAGS ?=

.PHONY: all deps build run test sanitize format clean

all: build

deps:
	@bash scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DREMAT_WERROR=$(WERROR) $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# The demo starts over each time: out/long holds only its own checkpoints.
run: build
	rm -rf out/long
	./$(BUILD)/remat-train --config configs/long.toml
	./$(BUILD)/remat-train sample --checkpoint out/long --prompt "// The memory pool" --tokens 200 --temperature 0.8 --top-k 40

test: build
	cd $(BUILD) && ctest --output-on-failure -j 1

sanitize: deps
	@cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo -DREMAT_SANITIZE=ON -DREMAT_WERROR=$(WERROR) -DREMAT_CUDA=OFF >/dev/null
	@cmake --build build-sanitize -j $(JOBS)
	cd build-sanitize && ctest --output-on-failure -L cpu

format:
	@git ls-files '*.h' '*.cpp' '*.cu' '*.cuh' | xargs clang-format -i

clean:
	rm -rf $(BUILD) build-sanitize
