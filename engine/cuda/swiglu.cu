// SwiGLU's gate (engine/core/ops/swiglu.h), as engine/cpu/swiglu.cpp: out = silu(g) u with
// silu(g) = g s, s = sigmoid(g) = 1 / (1 + e^-g);  dg = dout u s (1 + g (1 - s)),  du = dout g s,
// where 1 - s is e^-g s for g >= 0 (free of the cancellation of 1 - s as s nears 1; for g < 0,
// e^-g overflows past g ~ -88 and 1 - s >= 1/2 has none). One thread per element,
// grid-stride, as elementwise.cu's pointwise kernels; expf, not the fast __expf, for the CPU's
// accuracy.
#include "engine/cuda/device_common.cuh"
#include "engine/cuda/norm_kernels.cuh"

namespace remat::cuda::kern {
namespace {

template <typename T>
__global__ void swiglu_forward_kernel(T* out, const T* gate, const T* up, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = to_f32(gate[i]);
    const float s = 1.0f / (1.0f + expf(-g));
    out[i] = from_f32<T>(g * s * to_f32(up[i]));
  }
}

// Reads every input of element i before writing its gradients (a gradient may alias an input).
template <typename T>
__global__ void swiglu_backward_kernel(T* dgate, T* dup, const T* dout, const T* gate, const T* up,
                                       int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = to_f32(gate[i]), u = to_f32(up[i]), d = to_f32(dout[i]);
    const float e = expf(-g);
    const float s = 1.0f / (1.0f + e);
    const float one_minus_s = g >= 0.0f ? e * s : 1.0f - s;
    dgate[i] = from_f32<T>(d * u * s * (1.0f + g * one_minus_s));
    dup[i] = from_f32<T>(d * g * s);
  }
}

}  // namespace

void swiglu_forward(const SwiGluForwardParams& p, cudaStream_t s) {
  dispatch_act(p.bf16, [&](auto tag) {
    using T = decltype(tag);
    swiglu_forward_kernel<T><<<grid_for(p.n), kThreads, 0, s>>>(
        static_cast<T*>(p.out), static_cast<const T*>(p.gate), static_cast<const T*>(p.up), p.n);
  });
}

void swiglu_backward(const SwiGluBackwardParams& p, cudaStream_t s) {
  dispatch_act(p.bf16, [&](auto tag) {
    using T = decltype(tag);
    swiglu_backward_kernel<T><<<grid_for(p.n), kThreads, 0, s>>>(
        static_cast<T*>(p.dgate), static_cast<T*>(p.dup), static_cast<const T*>(p.dout),
        static_cast<const T*>(p.gate), static_cast<const T*>(p.up), p.n);
  });
}

}  // namespace remat::cuda::kern
