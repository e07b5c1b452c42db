// The per-pair RoPE kernel (tests/gpu/rope_reference.h), kept as the bits to match: its indexing
// verbatim; its rotation with every product and sum rounded explicitly, as kern::rope_apply's.
#include "engine/cuda/device_common.cuh"
#include "tests/gpu/rope_reference.h"

namespace remat::test {
namespace {

using cuda::kern::bf16;
using cuda::kern::from_f32;
using cuda::kern::RopeParams;
using cuda::kern::to_f32;

template <typename Td, typename Ts>
__global__ void rope_pair_kernel(Td* dst, const Ts* src, RopeParams p) {
  const int64_t half = p.HS / 2, rotated = (p.NH + p.KVH) * half;
  const int64_t per_row = (p.NH + 2 * p.KVH) * half, n = p.BT * per_row, W = 2 * per_row;
  for (int64_t w = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; w < n;
       w += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = w / per_row, r = w % per_row, base = row * W;
    if (r >= rotated || p.freq.n == 0) {  // v, or no rotation: copy two elements
      const int64_t i0 = base + 2 * r;
      dst[i0] = from_f32<Td>(to_f32(src[i0]));
      dst[i0 + 1] = from_f32<Td>(to_f32(src[i0 + 1]));
      continue;
    }
    const int64_t h = r / half, i = r % half;  // h: a query head, then the key heads
    const int64_t i0 = base + h * p.HS + i, i1 = i0 + half;
    double sn_d, cs_d;
    sincos(static_cast<double>(row % p.T) * p.freq.inv_freq[i], &sn_d, &cs_d);
    const float cs = static_cast<float>(cs_d * p.freq.attention_factor);  // 1: the former bits
    const float sn = static_cast<float>(sn_d * p.freq.attention_factor);
    const float a = to_f32(src[i0]), b = to_f32(src[i1]);
    // Each product and sum rounded by itself, as kern::rope_apply does: nvcc contracts nothing
    // here, so the comparison is bit for bit by construction, whatever either file's FMA fusion.
    if (!p.inverse) {
      dst[i0] = from_f32<Td>(__fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn)));
      dst[i1] = from_f32<Td>(__fadd_rn(__fmul_rn(a, sn), __fmul_rn(b, cs)));
    } else {
      dst[i0] = from_f32<Td>(__fadd_rn(__fmul_rn(a, cs), __fmul_rn(b, sn)));
      dst[i1] = from_f32<Td>(__fsub_rn(__fmul_rn(b, cs), __fmul_rn(a, sn)));
    }
  }
}

template <typename Td, typename Ts>
void launch(const RopeParams& p, cudaStream_t s) {
  const unsigned g = cuda::kern::grid_for(p.BT * (p.NH + 2 * p.KVH) * (p.HS / 2));
  rope_pair_kernel<Td, Ts><<<g, cuda::kern::kThreads, 0, s>>>(static_cast<Td*>(p.dst),
                                                              static_cast<const Ts*>(p.src), p);
}

}  // namespace

void rope_reference(const RopeParams& p, cudaStream_t s) {
  if (p.dst_bf16 && p.src_bf16)
    launch<bf16, bf16>(p, s);
  else if (p.dst_bf16)
    launch<bf16, float>(p, s);
  else if (p.src_bf16)
    launch<float, bf16>(p, s);
  else
    launch<float, float>(p, s);
}

}  // namespace remat::test
