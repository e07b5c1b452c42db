// Loading oneDNN (see engine/cpu/onednn.h).
#include "engine/cpu/onednn.h"

#include <dlfcn.h>
#include <fmt/format.h>

namespace remat::cpu {

namespace {

// dnnl_version() returns this (dnnl_version_t in dnnl_types.h).
struct DnnlVersion {
  int major, minor, patch;
  const char* hash;
  unsigned cpu_runtime, gpu_runtime;
};

OneDnn load() {
  OneDnn out;
  void* lib = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return out;
  out.sgemm = reinterpret_cast<DnnlSgemm>(dlsym(lib, "dnnl_sgemm"));
  using VersionFn = const DnnlVersion* (*)();
  const auto version = reinterpret_cast<VersionFn>(dlsym(lib, "dnnl_version"));
  if (const DnnlVersion* v = version ? version() : nullptr)
    out.version = fmt::format("oneDNN {}.{}.{}", v->major, v->minor, v->patch);
  else
    out.version = "oneDNN";
  return out;  // the library stays loaded for the process
}

}  // namespace

const OneDnn* onednn() {
  static const OneDnn loaded = load();
  return loaded.sgemm ? &loaded : nullptr;
}

}  // namespace remat::cpu
