// Stand-in for engine/cuda/ in builds without CUDA: the program links, and asking for the CUDA
// backend is a clear error instead of an #ifdef at every call site.
#ifndef REMAT_HAVE_CUDA
#include "engine/core/error.h"
#include "engine/cuda_api.h"
#include "engine/parallel/context_ring.h"
#include "engine/parallel/gradient_sync.h"

namespace remat::cuda {

bool is_built() {
  return false;
}
int device_count() {
  return 0;
}
std::string version_string() {
  return "built without CUDA";
}
std::unique_ptr<parallel::GradientSync> make_nccl_sync(Backend&, Model&, parallel::Communicator&) {
  throw BackendError(
      "[parallel] NCCL needs the CUDA backend, and this binary was built without CUDA");
}
std::unique_ptr<parallel::ShardedGradientSync> make_nccl_sharded_sync(Backend&, Model&,
                                                                      parallel::Communicator&,
                                                                      uint64_t) {
  throw BackendError(
      "[parallel] NCCL needs the CUDA backend, and this binary was built without CUDA");
}
std::unique_ptr<parallel::RingChannel> make_nccl_ring_channel(Backend&, parallel::Communicator&) {
  throw BackendError(
      "[parallel] NCCL needs the CUDA backend, and this binary was built without CUDA");
}
std::string nccl_version() {
  return "built without CUDA";
}
std::unique_ptr<Backend> make_backend(const DeviceConfig&) {
  throw BackendError(
      "[device] device.backend = \"cuda\" but this binary was built without CUDA. Fix: install the "
      "CUDA toolkit (nvcc on PATH) and rebuild, or set device.backend = \"cpu\"");
}

}  // namespace remat::cuda
#endif
