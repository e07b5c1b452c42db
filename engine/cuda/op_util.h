// Small helpers the CUDA ops share (host code). Internal to engine/cuda.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/ops/rope.h"
#include "engine/core/tensor.h"
#include "engine/cuda/kernels.cuh"

namespace remat::cuda {

inline bool is_bf16(const Tensor& t) {
  return t.dtype == DType::BF16;
}

/// Address of element `elem_offset` of `t`, whatever its dtype.
inline char* byte_ptr(const Tensor& t, int64_t elem_offset) {
  return static_cast<char*>(t.data) + elem_offset * static_cast<int64_t>(dtype_size(t.dtype));
}

/// Documents (data.attention = "document": an op's doc_start) run on CUDA in attention
/// (engine/cuda/attention.cpp) and with RoPE, but not with a learned position table (GPT's
/// model.position = "learned") nor over the context-parallel ring; the train command refuses such
/// a run before it starts, and these ops once more, in one line.
inline void refuse_documents(const Tensor& doc_start, const char* op) {
  if (!doc_start.empty())
    throw BackendError(fmt::format(
        "[cuda] {}: data.attention = \"document\" runs on CUDA with RoPE positions on one "
        "context rank only (docs/gpu.md). Fix: model.position = \"rope\", parallel.context = 1, "
        "device.backend = \"cpu\", or data.attention = \"causal\"",
        op));
}

/// RoPE's frequencies and attention factor of a head of HS for the kernels (none when theta is
/// 0). Throws BackendError past the kernels' largest head, naming `component` ("[attention]").
inline kern::RopeFrequencies rope_frequencies(int64_t HS, float theta, const RopeScaling& scaling,
                                              const char* component) {
  kern::RopeFrequencies f;
  if (theta <= 0) return f;
  if (HS / 2 > kern::kMaxRopePairs)
    throw BackendError(fmt::format(
        "{} RoPE on CUDA takes head sizes up to {}, got {}. Fix: more heads (model.n_head) for "
        "the same width",
        component, 2 * kern::kMaxRopePairs, HS));
  const RopeAngles angles = rope_angles(HS, static_cast<double>(theta), scaling);
  f.n = static_cast<int>(angles.inv_freq.size());
  f.attention_factor = angles.attention_factor;
  std::copy(angles.inv_freq.begin(), angles.inv_freq.end(), f.inv_freq);
  return f;
}

}  // namespace remat::cuda
