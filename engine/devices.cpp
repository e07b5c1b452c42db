// Backend selection (see engine/devices.h).
#include "engine/devices.h"

#include "engine/core/machine.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cuda_api.h"
#include "engine/parallel/communicator.h"

namespace remat {

int host_default_threads() {
  return cpu::default_threads();
}

bool picks_cpu(const Config& cfg) {
  const BackendKind want = cfg.device.backend;
  return want == BackendKind::Cpu || (want == BackendKind::Auto && cuda::device_count() == 0);
}

BackendChoice make_backend(const Config& cfg) {
  const BackendKind want = cfg.device.backend;
  BackendChoice c;
  if (!picks_cpu(cfg)) {
    c.backend = cuda::make_backend(cfg.device);
    c.why = want == BackendKind::Cuda ? "device.backend = \"cuda\"" : "auto: CUDA device found";
    return c;
  }
  // Ranks on one machine share its RAM: without device.memory, each CPU rank's budget is its share
  // (each would otherwise plan against all of it, and the machine would run out).
  const uint64_t budget =
      cfg.device.memory_bytes
          ? cfg.device.memory_bytes
          : host_memory_bytes() / static_cast<uint64_t>(parallel::local_ranks());
  const uint64_t host_budget =
      cfg.device.host_memory_bytes ? cfg.device.host_memory_bytes : host_memory_bytes();
  c.backend =
      std::make_unique<cpu::CpuBackend>(budget, static_cast<int>(cfg.device.threads), host_budget);
  c.why = want == BackendKind::Cpu
              ? "device.backend = \"cpu\""
              : (cuda::is_built() ? "auto: no CUDA device found" : "auto: built without CUDA");
  return c;
}

}  // namespace remat
