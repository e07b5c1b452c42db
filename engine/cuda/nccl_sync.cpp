// Data parallel on the CUDA backend (engine/parallel/gradient_sync.h): each block's gradients are
// all-reduced in place with NCCL as soon as the block's backward is enqueued, on the backend's
// communication stream, which waits (by event) for those ops only, so the reduction overlaps the
// rest of the backward. finish() makes the compute stream wait for the last reduction. NCCL's ring
// and tree all-reduces compute every element once and copy it to every rank, so the ranks hold the
// same bits and their weights stay identical. The communicator is bootstrapped through MPI: rank 0
// makes the NCCL id and broadcasts it. With a sharded optimizer (ZeRO-1) the same stream carries
// reduce-scatters of the gradients and all-gathers of the updated weights (NcclShardedSync).
// Context parallel's ring passes its blocks with NCCL sends and receives (NcclRingChannel).
#include <fmt/format.h>
#include <nccl.h>

#include <exception>
#include <vector>

#include "engine/core/error.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda_api.h"
#include "engine/model.h"
#include "engine/parallel/communicator.h"
#include "engine/parallel/context_ring.h"
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

// A NCCL communicator over the ranks of an MPI one (rank 0 makes the id and broadcasts it), on
// the backend's communication stream (shared by every communicator of the rank: NCCL does not
// support two communicators' work running at once), with two events: `ready` orders NCCL work
// after the compute stream's ops so far, `done` the compute stream's later ops after the NCCL work
// so far.
struct NcclChannel {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;  // not owned: CudaBackend::comm_stream()
  cudaEvent_t ready = nullptr, done = nullptr;

  NcclChannel(parallel::Communicator& mpi, cudaStream_t comm_stream) : stream(comm_stream) {
    ncclUniqueId id{};
    if (mpi.rank() == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    mpi.broadcast(&id, sizeof id, 0);
    nccl_check(ncclCommInitRank(&comm, mpi.size(), id, mpi.rank()), "ncclCommInitRank");
    try {
      cuda_check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
      cuda_check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
    } catch (...) {
      release(/*abort=*/true);
      throw;
    }
  }
  NcclChannel(const NcclChannel&) = delete;
  NcclChannel& operator=(const NcclChannel&) = delete;
  // While an error unwinds, a collective queued on the stream may wait for ranks that will never
  // join it: abort the communicator instead of waiting (the job is being stopped anyway).
  ~NcclChannel() { release(std::uncaught_exceptions() > 0); }

  void release(bool abort) {
    if (abort) {
      if (comm) ncclCommAbort(comm);
    } else {
      if (stream) cudaStreamSynchronize(stream);  // no collective may outlive its buffers
      if (comm) ncclCommDestroy(comm);
    }
    if (ready) cudaEventDestroy(ready);
    if (done) cudaEventDestroy(done);
    comm = nullptr, stream = nullptr, ready = done = nullptr;
  }
  /// NCCL work enqueued from now on runs after the compute stream's ops so far.
  void after_compute(cudaStream_t compute) {
    cuda_check(cudaEventRecord(ready, compute), "cudaEventRecord");
    cuda_check(cudaStreamWaitEvent(stream, ready, 0), "cudaStreamWaitEvent");
  }
  /// Compute ops enqueued from now on run after the NCCL work so far.
  void before_compute(cudaStream_t compute) {
    cuda_check(cudaEventRecord(done, stream), "cudaEventRecord");
    cuda_check(cudaStreamWaitEvent(compute, done, 0), "cudaStreamWaitEvent");
  }
  /// `n` floats from `src` to `dst` (device memory), on the NCCL stream.
  void copy(float* dst, const float* src, int64_t n) {
    cuda_check(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * sizeof(float),
                               cudaMemcpyDeviceToDevice, stream),
               "cudaMemcpyAsync");
  }
};

class NcclGradientSync final : public parallel::GradientSync {
 public:
  NcclGradientSync(CudaBackend& be, Model& model, parallel::Communicator& comm)
      : be_(be), ranks_(comm.size()), nccl_(comm, be.comm_stream()) {
    stages_ = parallel::params_by_stage(model);
    for (Param& p : model.params())
      if (p.trainable()) bytes_ += p.grad.tensor().bytes();
  }

  void block_done(size_t block) override { reduce(stages_[block]); }
  void finish() override {
    reduce(stages_.back());
    nccl_.before_compute(be_.stream());
  }
  uint64_t sent_bytes_per_step() const override {
    return parallel::allreduce_sent_bytes(bytes_, ranks_);
  }
  const char* describe() const override { return "all-reduced by NCCL"; }

 private:
  // The reductions wait for the compute stream's ops so far (the stage's backward), nothing more.
  void reduce(const std::vector<Param*>& params) {
    if (params.empty()) return;
    nccl_.after_compute(be_.stream());
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (Param* p : params) {
      float* g = p->grad.f32();
      nccl_check(ncclAllReduce(g, g, static_cast<size_t>(p->grad.tensor().numel()), ncclFloat,
                               ncclSum, nccl_.comm, nccl_.stream),
                 "ncclAllReduce");
    }
    nccl_check(ncclGroupEnd(), "ncclGroupEnd");
  }

  CudaBackend& be_;
  int ranks_;
  NcclChannel nccl_;
  std::vector<std::vector<Param*>> stages_;  // per block, then the rest
  uint64_t bytes_ = 0;
};

// ZeRO-1 over NCCL. Each bucket is packed into one slot (padded to ranks equal shards),
// reduce-scattered in place, and this rank's summed shard copied back into those floats of the
// gradients; after the update, this rank's shard of the weights goes into the slot, is
// all-gathered in place and unpacked into every weight. Everything runs on the NCCL stream in
// order, so one slot serves every bucket, while the compute stream goes on with the backward (or
// the next bucket's update).
class NcclShardedSync final : public parallel::EqualShardSync {
 public:
  NcclShardedSync(CudaBackend& be, Model& model, parallel::Communicator& comm,
                  uint64_t bucket_bytes)
      : EqualShardSync(be, model, comm.rank(), comm.size(), bucket_bytes),
        be_(be),
        nccl_(comm, be.comm_stream()) {}

  void block_done(size_t block) override { reduce_stage(block); }
  void finish() override {
    reduce_stage(plan_.stage_buckets.size() - 1);
    nccl_.before_compute(be_.stream());
  }
  const char* describe() const override {
    return "reduce-scattered by NCCL, updated weights all-gathered";
  }

  void start_weight_gather(size_t k) override {
    const parallel::BucketLayout& b = plan_.buckets[k];
    const int64_t shard = b.span;
    float* mine = slot_.f32() + static_cast<int64_t>(rank_) * shard;
    nccl_.after_compute(be_.stream());  // bucket k's update
    for_mine(
        b, [&](float* param, float* in_slot, int64_t n) { nccl_.copy(in_slot, param, n); },
        &Param::value);
    nccl_check(ncclAllGather(mine, slot_.f32(), static_cast<size_t>(shard), ncclFloat, nccl_.comm,
                             nccl_.stream),
               "ncclAllGather");
    for (const parallel::BucketLayout::Segment& s : b.segments)
      nccl_.copy(s.param->value.f32() + s.offset, slot_.f32() + s.at, s.count);
  }
  void finish_weight_gathers() override { nccl_.before_compute(be_.stream()); }

 private:
  // f(param floats, slot floats, count) for each piece of this rank's shard of bucket `b`.
  template <class F>
  void for_mine(const parallel::BucketLayout& b, F f, Buffer Param::*field) {
    const int64_t lo = b.displs[static_cast<size_t>(rank_)];
    parallel::for_each_overlap(
        b, lo, lo + b.counts[static_cast<size_t>(rank_)],
        [&](const parallel::BucketLayout::Segment& s, int64_t first, int64_t n) {
          f((s.param->*field).f32() + s.offset + (first - s.at), slot_.f32() + first, n);
        });
  }

  void reduce_stage(size_t stage) {
    const auto [first, last] = plan_.stage_buckets[stage];
    if (first == last) return;
    nccl_.after_compute(be_.stream());  // the stage's backward
    for (size_t k = first; k < last; ++k) {
      const parallel::BucketLayout& b = plan_.buckets[k];
      const int64_t shard = b.span, padded = shard * ranks_;
      for (const parallel::BucketLayout::Segment& s : b.segments)
        nccl_.copy(slot_.f32() + s.at, s.param->grad.f32() + s.offset, s.count);
      if (padded > b.floats)  // the padding adds zeros to the last shard's tail
        cuda_check(
            cudaMemsetAsync(slot_.f32() + b.floats, 0,
                            static_cast<size_t>(padded - b.floats) * sizeof(float), nccl_.stream),
            "cudaMemsetAsync");
      float* mine = slot_.f32() + static_cast<int64_t>(rank_) * shard;
      nccl_check(ncclReduceScatter(slot_.f32(), mine, static_cast<size_t>(shard), ncclFloat,
                                   ncclSum, nccl_.comm, nccl_.stream),
                 "ncclReduceScatter");
      for_mine(
          b, [&](float* param, float* in_slot, int64_t n) { nccl_.copy(param, in_slot, n); },
          &Param::grad);
    }
  }

  CudaBackend& be_;
  NcclChannel nccl_;  // destroyed before the base's slot: it waits for the stream first
};

// Context parallel's ring (engine/parallel/context_ring.h) over NCCL. Each exchange is one group
// of a send to the next rank and a receive from the previous one, on the channel's stream, after
// the compute stream's ops so far: those wrote what is sent and last read what the receive
// overwrites. wait() orders the compute stream's later ops after every exchange so far, so the
// ring's kernels overlap the transfers they do not depend on. Every rank starts the same exchanges
// in the same order (ContextRing's schedule), which is how NCCL matches them.
class NcclRingChannel final : public parallel::RingChannel {
 public:
  NcclRingChannel(CudaBackend& be, parallel::Communicator& comm)
      : be_(be), rank_(comm.rank()), size_(comm.size()), nccl_(comm, be.comm_stream()) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  parallel::Request start(const float* send, int64_t n_send, float* recv, int64_t n_recv) override {
    nccl_.after_compute(be_.stream());
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    nccl_check(ncclSend(send, static_cast<size_t>(n_send), ncclFloat, (rank_ + 1) % size_,
                        nccl_.comm, nccl_.stream),
               "ncclSend");
    nccl_check(ncclRecv(recv, static_cast<size_t>(n_recv), ncclFloat, (rank_ + size_ - 1) % size_,
                        nccl_.comm, nccl_.stream),
               "ncclRecv");
    nccl_check(ncclGroupEnd(), "ncclGroupEnd");
    return {++started_};
  }
  void wait(parallel::Request& r) override {
    if (r.id == 0) return;
    nccl_.before_compute(be_.stream());
    r.id = 0;
  }

 private:
  CudaBackend& be_;
  int rank_, size_;
  NcclChannel nccl_;
  int64_t started_ = 0;
};

std::unique_ptr<parallel::RingChannel> make_nccl_ring_channel(Backend& be,
                                                              parallel::Communicator& comm) {
  auto* cuda = dynamic_cast<CudaBackend*>(&be);
  REMAT_ASSERT(cuda != nullptr, "make_nccl_ring_channel on the {} backend", be.name());
  return std::make_unique<NcclRingChannel>(*cuda, comm);
}

std::unique_ptr<parallel::GradientSync> make_nccl_sync(Backend& be, Model& model,
                                                       parallel::Communicator& comm) {
  auto* cuda = dynamic_cast<CudaBackend*>(&be);
  REMAT_ASSERT(cuda != nullptr, "make_nccl_sync on the {} backend", be.name());
  return std::make_unique<NcclGradientSync>(*cuda, model, comm);
}

std::unique_ptr<parallel::ShardedGradientSync> make_nccl_sharded_sync(Backend& be, Model& model,
                                                                      parallel::Communicator& comm,
                                                                      uint64_t bucket_bytes) {
  auto* cuda = dynamic_cast<CudaBackend*>(&be);
  REMAT_ASSERT(cuda != nullptr, "make_nccl_sharded_sync on the {} backend", be.name());
  return std::make_unique<NcclShardedSync>(*cuda, model, comm, bucket_bytes);
}

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "NCCL (version unknown)";
  return fmt::format("NCCL {}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

}  // namespace remat::cuda
