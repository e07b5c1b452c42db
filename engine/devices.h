// Picks and creates the backend a run uses, and says why ("auto" -> CUDA when a device is
// present, else the CPU).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/backend.h"
#include "engine/config.h"

namespace remat {

struct BackendChoice {
  std::unique_ptr<Backend> backend;
  std::string why;  // "auto: no CUDA device found"
};

BackendChoice make_backend(const Config& cfg);
/// Physical memory of this machine (the CPU backend's default budget).
uint64_t host_memory_bytes();
/// Threads the CPU backend uses when device.threads = 0 (all cores).
int host_default_threads();

}  // namespace remat
