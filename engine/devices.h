// Picks and creates the backend a run uses, and says why ("auto" -> CUDA when a device is
// present, else the CPU).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/config/config.h"
#include "engine/core/backend.h"
#include "engine/core/machine.h"  // host_memory_bytes

namespace remat {

struct BackendChoice {
  std::unique_ptr<Backend> backend;
  std::string why;  // "auto: no CUDA device found"
};

BackendChoice make_backend(const Config& cfg);
/// Whether make_backend(cfg) picks the CPU: device.backend = "cpu", or "auto" without a CUDA
/// device.
bool picks_cpu(const Config& cfg);
/// Threads the CPU backend uses when device.threads = 0 (all cores).
int host_default_threads();

}  // namespace remat
