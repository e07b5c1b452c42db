// The CUDA backend as the rest of the program sees it. engine/cuda/ implements these when the
// build has CUDA; engine/no_cuda.cpp otherwise, turning every use into a clear runtime error.
#pragma once

#include <memory>
#include <string>

#include "engine/config/config.h"
#include "engine/core/backend.h"

namespace remat {
class Model;
namespace parallel {
class Communicator;
class GradientSync;
class RingChannel;
class ShardedGradientSync;
}  // namespace parallel
}  // namespace remat

namespace remat::cuda {

/// True when this binary was built with the CUDA backend.
bool is_built();
/// Number of usable CUDA devices (0 when none, or when built without CUDA).
int device_count();
/// "CUDA 13.0, cuBLASLt 13.1, cuDNN 9.19.0" or "built without CUDA".
std::string version_string();
/// The CUDA backend on this rank's device (0 without a launcher). Throws BackendError when it
/// cannot be created.
std::unique_ptr<Backend> make_backend(const DeviceConfig& cfg);
/// Data parallel on the CUDA backend `be`: NCCL all-reduces of `model`'s gradients over the ranks
/// of `comm` (bootstrapped through it), on the backend's communication stream
/// (engine/cuda/nccl_sync.cpp).
std::unique_ptr<parallel::GradientSync> make_nccl_sync(Backend& be, Model& model,
                                                       parallel::Communicator& comm);
/// ZeRO-1 on the CUDA backend `be` (engine/parallel/sharded_adamw.h runs the update): NCCL
/// reduce-scatters of `model`'s gradients in buckets of `bucket_bytes`, all-gathers of the updated
/// weights, over the ranks of `comm`.
std::unique_ptr<parallel::ShardedGradientSync> make_nccl_sharded_sync(Backend& be, Model& model,
                                                                      parallel::Communicator& comm,
                                                                      uint64_t bucket_bytes);
/// Context parallel on the CUDA backend `be`: the ring of ContextRing over the ranks of `comm`
/// (the context group), as NCCL sends and receives of device memory on the backend's
/// communication stream (engine/cuda/nccl_sync.cpp).
std::unique_ptr<parallel::RingChannel> make_nccl_ring_channel(Backend& be,
                                                              parallel::Communicator& comm);
/// "NCCL 2.28.3" or "built without CUDA".
std::string nccl_version();

}  // namespace remat::cuda
