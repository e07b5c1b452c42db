// Data parallel on the CUDA backend (engine/parallel/gradient_sync.h): each block's gradients are
// all-reduced in place with NCCL as soon as the block's backward is enqueued, on a stream of
// their own that waits (by event) for those ops only, so the reduction overlaps the rest of the
// backward. finish() makes the compute stream wait for the last reduction. NCCL's ring and tree
// all-reduces compute every element once and copy it to every rank, so the ranks hold the same
// bits and their weights stay identical. The communicator is bootstrapped through MPI: rank 0
// makes the NCCL id and broadcasts it.
#include <fmt/format.h>
#include <nccl.h>

#include <vector>

#include "engine/cuda/cuda_backend.h"
#include "engine/cuda_api.h"
#include "engine/error.h"
#include "engine/model.h"
#include "engine/parallel/communicator.h"
#include "engine/parallel/gradient_sync.h"

namespace remat::cuda {

namespace {

void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess)
    throw BackendError(
        fmt::format("[parallel] NCCL {} failed: {}. Fix: check that every rank "
                    "sees its own GPU and that the ranks can reach each other",
                    what, ncclGetErrorString(r)));
}

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw BackendError(fmt::format("[parallel] {} failed: {}", what, cudaGetErrorString(e)));
}

}  // namespace

class NcclGradientSync final : public parallel::GradientSync {
 public:
  NcclGradientSync(CudaBackend& be, Model& model, parallel::Communicator& comm)
      : be_(be), ranks_(comm.size()) {
    ncclUniqueId id{};
    if (comm.rank() == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    comm.broadcast(&id, sizeof id, 0);
    nccl_check(ncclCommInitRank(&comm_, comm.size(), id, comm.rank()), "ncclCommInitRank");
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda_check(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
    cuda_check(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
    stages_ = parallel::params_by_stage(model);
    for (Param& p : model.params()) bytes_ += p.grad.tensor().bytes();
  }
  NcclGradientSync(const NcclGradientSync&) = delete;
  NcclGradientSync& operator=(const NcclGradientSync&) = delete;
  ~NcclGradientSync() override {
    cudaStreamSynchronize(stream_);  // no reduction may outlive the gradients it writes
    ncclCommDestroy(comm_);
    cudaEventDestroy(ready_);
    cudaEventDestroy(done_);
    cudaStreamDestroy(stream_);
  }

  void block_done(size_t block) override { reduce(stages_[block]); }
  void finish() override {
    reduce(stages_.back());
    cuda_check(cudaEventRecord(done_, stream_), "cudaEventRecord");
    cuda_check(cudaStreamWaitEvent(be_.stream(), done_, 0), "cudaStreamWaitEvent");
  }
  uint64_t sent_bytes_per_step() const override {
    return parallel::allreduce_sent_bytes(bytes_, ranks_);
  }
  const char* describe() const override { return "all-reduced by NCCL"; }

 private:
  // The reductions wait for the compute stream's ops so far (the stage's backward), nothing more.
  void reduce(const std::vector<Param*>& params) {
    if (params.empty()) return;
    cuda_check(cudaEventRecord(ready_, be_.stream()), "cudaEventRecord");
    cuda_check(cudaStreamWaitEvent(stream_, ready_, 0), "cudaStreamWaitEvent");
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (Param* p : params) {
      float* g = p->grad.f32();
      nccl_check(ncclAllReduce(g, g, static_cast<size_t>(p->grad.tensor().numel()), ncclFloat,
                               ncclSum, comm_, stream_),
                 "ncclAllReduce");
    }
    nccl_check(ncclGroupEnd(), "ncclGroupEnd");
  }

  CudaBackend& be_;
  int ranks_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  std::vector<std::vector<Param*>> stages_;  // per block, then the rest
  uint64_t bytes_ = 0;
};

std::unique_ptr<parallel::GradientSync> make_nccl_sync(Backend& be, Model& model,
                                                       parallel::Communicator& comm) {
  auto* cuda = dynamic_cast<CudaBackend*>(&be);
  REMAT_ASSERT(cuda != nullptr, "make_nccl_sync on the {} backend", be.name());
  return std::make_unique<NcclGradientSync>(*cuda, model, comm);
}

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "NCCL (version unknown)";
  return fmt::format("NCCL {}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

}  // namespace remat::cuda
