// Shared by the fuzz targets: the readers take a path (they memory-map it), so each input is
// written to one scratch file per fuzzing process first.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace remat::fuzz {

inline std::string scratch_file(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/remat-fuzz-" + std::to_string(::getpid()) + ".bin";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) __builtin_trap();
  if (size && std::fwrite(data, 1, size, f) != size) __builtin_trap();
  std::fclose(f);
  return path;
}

}  // namespace remat::fuzz
