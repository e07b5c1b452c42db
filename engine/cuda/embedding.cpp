// CUDA token (+ position) embedding (engine/core/ops/embedding.h); kernels in elementwise.cu.
#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include "engine/cuda/check.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/op_util.h"

namespace remat::cuda {

// The backward buckets the tokens on the host (below), so the forward, which the step starts with,
// copies them to pinned memory on the stream: by the backward the copy is long done, and the
// host reads it without waiting for the device (a download there would stall the device at the
// end of every backward while the host sorts).
void CudaBackend::embedding_forward_impl(const EmbeddingForwardArgs& a) {
  if (!a.wpe.empty()) refuse_documents(a.doc_start, "embedding_forward");
  const int64_t B = a.tokens.dim(0), T = a.tokens.dim(1), C = a.wte.dim(1), V = a.wte.dim(0);
  kern::embedding_forward({.out = a.out.data,
                           .tokens = a.tokens.i32(),
                           .wte = a.wte.data,
                           .wpe = a.wpe.empty() ? nullptr : a.wpe.f32(),
                           .B = B,
                           .T = T,
                           .C = C,
                           .V = V,
                           .bf16 = is_bf16(a.out),
                           .wte_bf16 = is_bf16(a.wte)},
                          stream());
  const size_t bytes = a.tokens.bytes();
  tokens_copy_.reserve(bytes);
  // The host reads the previous copy only within embedding_backward_impl, which has returned:
  // the buffer is free to overwrite in stream order.
  REMAT_CUDA_CHECK(
      cudaMemcpyAsync(tokens_copy_.host, a.tokens.data, bytes, cudaMemcpyDefault, stream()));
  tokens_copy_.record(stream());
  tokens_device_ = a.tokens.data;
  tokens_bytes_ = bytes;
  finish_op();
}

// The scatter-add dwte[token] += dout row is made deterministic without atomics by bucketing
// rows by token on the host (a counting sort of the B*T token ids from the forward's pinned
// copy), then one GPU block column per distinct token sums its rows in order.
void CudaBackend::embedding_backward_impl(const EmbeddingBackwardArgs& a, const OpWorkspace& ws) {
  if (!a.dwpe.empty()) refuse_documents(a.doc_start, "embedding_backward");
  const int64_t B = a.tokens.dim(0), T = a.tokens.dim(1), C = a.dout.dim(-1), N = B * T;
  kern::EmbeddingBackwardParams p{.dwte = nullptr,
                                  .dwpe = a.dwpe.empty() ? nullptr : a.dwpe.f32(),
                                  .dout = a.dout.data,
                                  .tokens = a.tokens.i32(),
                                  .order = nullptr,
                                  .starts = nullptr,
                                  .n_buckets = 0,
                                  .B = B,
                                  .T = T,
                                  .C = C,
                                  .bf16 = is_bf16(a.dout)};
  if (!a.dwte.empty()) {  // a frozen token table has no buckets: the position rows alone
    const int64_t V = a.dwte.dim(0);
    std::vector<int32_t> tokens(static_cast<size_t>(N));
    if (tokens_device_ == a.tokens.data && tokens_bytes_ == a.tokens.bytes()) {
      tokens_copy_.wait();  // done since the forward
      std::memcpy(tokens.data(), tokens_copy_.host, a.tokens.bytes());
    } else {  // a backward without its forward on this backend (tests): read them now
      download(tokens.data(), a.tokens);
    }
    std::vector<int32_t> count(static_cast<size_t>(V) + 1, 0);
    for (int32_t t : tokens) {
      REMAT_ASSERT(t >= 0 && t < V, "embedding_backward: token {} outside vocabulary {}", t, V);
      ++count[static_cast<size_t>(t) + 1];
    }
    // host buffer: order (N) | starts (n_buckets + 1)
    std::vector<int32_t> host(static_cast<size_t>(2 * N + 1), 0);
    std::vector<int32_t> next(static_cast<size_t>(V), 0);
    int64_t n_buckets = 0;
    {
      int32_t pos = 0;
      for (int64_t v = 0; v < V; ++v) {
        next[static_cast<size_t>(v)] = pos;
        if (count[static_cast<size_t>(v) + 1] > 0) host[static_cast<size_t>(N + n_buckets++)] = pos;
        pos += count[static_cast<size_t>(v) + 1];
      }
      host[static_cast<size_t>(N + n_buckets)] = pos;
    }
    for (int64_t i = 0; i < N; ++i)  // ascending i: each bucket lists its rows in order
      host[static_cast<size_t>(next[static_cast<size_t>(tokens[static_cast<size_t>(i)])]++)] =
          static_cast<int32_t>(i);
    const Buffer& buckets = ws.at("embedding.buckets");
    const size_t table_bytes = static_cast<size_t>(N + n_buckets + 1) * 4;
    buckets_upload_.wait();  // the last step's upload, before the host writes over it
    buckets_upload_.reserve(host.size() * 4);
    std::memcpy(buckets_upload_.host, host.data(), table_bytes);
    REMAT_CUDA_CHECK(cudaMemcpyAsync(buckets.tensor().data, buckets_upload_.host, table_bytes,
                                     cudaMemcpyDefault, stream()));
    buckets_upload_.record(stream());
    const int32_t* order = static_cast<const int32_t*>(buckets.tensor().data);
    p.dwte = a.dwte.f32();
    p.order = order;
    p.starts = order + N;
    p.n_buckets = n_buckets;
  }
  kern::embedding_backward(p, stream());
  finish_op();
}

}  // namespace remat::cuda
