// The NF4 dequantise kernel (lora.base = "nf4", docs/lora.md): a frozen base weight stored in
// bitsandbytes' 4-bit NormalFloat (engine/core/nf4.h has the format and the CPU decoder, the
// specification) decoded into a GEMM's workspace copy, bf16 or f32, before cuBLASLt reads it.
// One thread per byte of codes (two values); each thread decodes its block's absmax, from the f32
// absmax or, with double quant, from the 8-bit code, the nested absmax and the offset. Memory-bound
// (it reads 0.5 byte and writes 2 or 4 per value), as bitsandbytes' own dequantize kernel.
#include "engine/cuda/device_common.cuh"
#include "engine/cuda/kernels.cuh"

namespace remat::cuda::kern {
namespace {

template <typename T>
__global__ void nf4_dequantize_kernel(T* out, const uint8_t* packed, int64_t n, Nf4Tables tables,
                                      Nf4Layout l) {
  const int64_t bytes = (n + 1) / 2;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < bytes;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t k = 2 * t, block = k / 64;  // both values are in one block of 64
    float absmax;
    if (l.double_quant) {
      const float offset = *reinterpret_cast<const float*>(packed + l.offset);
      const float absmax2 = reinterpret_cast<const float*>(packed + l.absmax2)[block / 256];
      // Rounded as the CPU rounds (no fused multiply-add): the same absmax, bit for bit.
      absmax = __fadd_rn(__fmul_rn(tables.dynamic[packed[l.absmax + block]], absmax2), offset);
    } else {
      absmax = reinterpret_cast<const float*>(packed + l.absmax)[block];
    }
    const uint8_t byte = packed[l.codes + t];
    out[k] = from_f32<T>(__fmul_rn(tables.code[byte >> 4], absmax));
    if (k + 1 < n) out[k + 1] = from_f32<T>(__fmul_rn(tables.code[byte & 15], absmax));
  }
}

}  // namespace

void nf4_dequantize(void* dst, bool dst_bf16, const void* packed, int64_t n,
                    const Nf4Tables& tables, const Nf4Layout& l, cudaStream_t s) {
  const unsigned g = grid_for((n + 1) / 2);
  const auto* p = static_cast<const uint8_t*>(packed);
  dispatch_act(dst_bf16, [&](auto tag) {
    using T = decltype(tag);
    nf4_dequantize_kernel<T><<<g, kThreads, 0, s>>>(static_cast<T*>(dst), p, n, tables, l);
  });
}

}  // namespace remat::cuda::kern
