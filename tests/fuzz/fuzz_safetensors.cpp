// The safetensors reader (checkpoints and --init files): validate, then touch every byte of every
// tensor it hands out, so ASan catches an offset that escaped the checks.
#include <cstddef>
#include <cstdint>

#include "engine/core/error.h"
#include "engine/model_files/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

volatile unsigned g_sink;  // keeps the reads of tensor bytes from being optimized away

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = remat::fuzz::scratch_file(data, size);
  try {
    const remat::safetensors::Reader r(path);
    unsigned sum = 0;
    for (const auto& t : r.tensors()) {
      const std::byte* p = r.data(t);
      for (uint64_t i = 0; i < t.bytes(); ++i) sum += static_cast<unsigned>(p[i]);
      if (r.find(t.name) != &t) __builtin_trap();
    }
    g_sink = sum;
  } catch (const remat::CheckpointError&) {
  } catch (const remat::IoError&) {
  }
  return 0;
}
