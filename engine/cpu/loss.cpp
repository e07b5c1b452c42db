// CPU losses (engine/core/ops/loss.h): the fused, chunked LM head + softmax cross-entropy and the
// tutorial MLP's mean-squared error.

#include <algorithm>
#include <cmath>
#include <numbers>

#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/gemm.h"
#include "engine/cpu/vector_math.h"

namespace remat::cpu {
namespace {

// Softmax cross-entropy of one row of logits l (V), in place: returns the loss
// logsumexp(l) - l[t] and leaves (softmax(l) - onehot(t)) * scale in l. Each exponential is
// computed once, in float, 8 at a time: e_j = 2^((l_j - max) log2 e) (exp2_ps, 0.87 ulp; the
// product with log2 e adds ~|l_j - max| x 6e-8 relative, largest on the terms that matter least),
// and summed in double, lane by lane in a fixed order, so the loss keeps ~1e-7 relative accuracy
// at any V and the result is the same bits on every thread count. At GPT-2's V = 50257 this is
// ~50x faster than one double std::exp per logit.
double softmax_xent_row(float* l, int64_t V, int32_t t, float scale) {
  const float lt = l[t];
#if defined(__AVX2__) && defined(__FMA__)
  __m256 vmax = _mm256_set1_ps(l[0]);
  int64_t j = 0;
  for (; j + 8 <= V; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(l + j));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  float mx = lanes[0];
  for (float v : lanes) mx = std::max(mx, v);
  for (; j < V; ++j) mx = std::max(mx, l[j]);

  const __m256 shift = _mm256_set1_ps(mx), log2e = _mm256_set1_ps(std::numbers::log2e_v<float>);
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  // 2^((x - mx) log2 e) on the lanes in `keep` (0 on the others), accumulated in double.
  auto exps = [&](__m256 x, __m256 keep) {
    const __m256 e = _mm256_and_ps(exp2_ps(_mm256_mul_ps(_mm256_sub_ps(x, shift), log2e)), keep);
    lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    return e;
  };
  const __m256 all = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  for (j = 0; j + 8 <= V; j += 8) _mm256_storeu_ps(l + j, exps(_mm256_loadu_ps(l + j), all));
  if (j < V) {  // the tail: masked lanes load 0 and add nothing
    const __m256i mask = lane_mask(V - j);
    _mm256_maskstore_ps(l + j, mask,
                        exps(_mm256_maskload_ps(l + j, mask), _mm256_castsi256_ps(mask)));
  }
  const double sum = hsum_pd(lo) + hsum_pd(hi);
#else  // portable fallback: one std::exp per logit
  float mx = l[0];
  for (int64_t j = 1; j < V; ++j) mx = std::max(mx, l[j]);
  double sum = 0;
  for (int64_t j = 0; j < V; ++j) {
    l[j] = std::exp(l[j] - mx);
    sum += l[j];
  }
#endif
  const float f = static_cast<float>(1.0 / sum) * scale;
  for (int64_t k = 0; k < V; ++k) l[k] *= f;
  l[t] -= scale;
  return static_cast<double>(mx) + std::log(sum) - static_cast<double>(lt);
}

// One row of the mean-squared error: returns mean((x - y)^2) and writes g (x - y) to dx. The
// squares are summed in double, in 8 lanes (two vectors of 4) and then the lanes in a fixed order:
// the same bits for any thread count, and 8 independent chains instead of one, whose 4-cycle
// latency per element made this loss 3% of the MLP's step.
float mse_row(const float* x, const float* y, float* dx, int64_t D, float g) {
  double acc = 0;
  int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  const __m256 vg = _mm256_set1_ps(g);
  for (; j + 8 <= D; j += 8) {
    const __m256 diff = _mm256_sub_ps(_mm256_loadu_ps(x + j), _mm256_loadu_ps(y + j));
    _mm256_storeu_ps(dx + j, _mm256_mul_ps(vg, diff));
    const __m256d d_lo = _mm256_cvtps_pd(_mm256_castps256_ps128(diff));
    const __m256d d_hi = _mm256_cvtps_pd(_mm256_extractf128_ps(diff, 1));
    lo = _mm256_fmadd_pd(d_lo, d_lo, lo);
    hi = _mm256_fmadd_pd(d_hi, d_hi, hi);
  }
  alignas(32) double lanes[8];
  _mm256_store_pd(lanes, lo);
  _mm256_store_pd(lanes + 4, hi);
  for (const double v : lanes) acc += v;
#endif
  for (; j < D; ++j) {
    const float diff = x[j] - y[j];
    acc += static_cast<double>(diff) * diff;
    dx[j] = g * diff;
  }
  return static_cast<float>(acc / static_cast<double>(D));
}

}  // namespace

// For each chunk of rows: logits = inp W^T; per row, the greedy prediction when asked (the first
// largest logit, as argmax decoding picks it), then a numerically stable softmax (subtract the
// row max) gives loss = logsumexp - logit[target] and dlogits = (softmax - onehot) * scale,
// written over the logits (softmax_xent_row); then dinp = dlogits W (in vocabulary slabs for a
// long vocabulary: lm_head_dinp_slabs in engine/core/cpu_workspace.h) and dW += dlogits^T inp.
void CpuBackend::lm_head_loss_impl(const LmHeadLossArgs& a, const OpWorkspace& ws) {
  const int64_t N = a.inp.rows(), C = a.inp.dim(-1), V = a.weight.dim(0);
  const Buffer& chunk = ws.at("lm_head.logits_chunk");
  const int64_t R = chunk.tensor().dim(0);
  float* logits = chunk.f32();
  const float* W = f32_weight(a.weight, ws);  // a frozen LoRA base's bf16 head: decoded once
  const int32_t* targets = a.targets.i32();
  float* losses = a.losses.f32();
  int32_t* argmax = a.argmax.empty() ? nullptr : a.argmax.i32();
  for (int64_t r0 = 0; r0 < N; r0 += R) {
    const int64_t rows = std::min(R, N - r0);
    const float* x = a.inp.f32() + r0 * C;
    sgemm(CblasNoTrans, CblasTrans, rows, V, C, x, C, W, C, 0.0f, logits, V);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      float* l = logits + r * V;
      const int32_t t = targets[r0 + r];
      if (t == kIgnoredTarget) {  // not trained: no loss, and zeros add nothing to dinp or dW
        losses[r0 + r] = 0.0f;
        std::fill(l, l + V, 0.0f);
        continue;
      }
      REMAT_ASSERT(t >= 0 && t < V, "lm_head_loss: target {} outside vocabulary {}", t, V);
      if (argmax) argmax[r0 + r] = static_cast<int32_t>(std::max_element(l, l + V) - l);
      losses[r0 + r] = static_cast<float>(softmax_xent_row(l, V, t, a.loss_scale));
    }
    const int64_t slabs = lm_head_dinp_slabs(V);
    if (slabs > 1) {
      const Buffer& partials = ws.at("lm_head.dinp_slabs");
      REMAT_ASSERT(partials.tensor().numel() >= (slabs - 1) * rows * C,
                   "lm_head_loss: the slab workspace holds {} floats, {} slabs need {}",
                   partials.tensor().numel(), slabs, (slabs - 1) * rows * C);
      sgemm_k_slabs(rows, C, V, logits, V, W, C, a.dinp.f32() + r0 * C, C, partials.f32(), slabs);
    } else {
      sgemm(CblasNoTrans, CblasNoTrans, rows, C, V, logits, V, W, C, 0.0f, a.dinp.f32() + r0 * C,
            C);
    }
    if (!a.dweight.empty())  // a frozen head has no weight gradient
      sgemm(CblasTrans, CblasNoTrans, V, C, rows, logits, V, x, C, 1.0f, a.dweight.f32(), C);
  }
}

void CpuBackend::mse_loss_impl(const MseLossArgs& a) {
  const int64_t N = a.inp.rows(), D = a.inp.dim(-1);
  const float* x = a.inp.f32();
  const float* y = a.target.f32();
  float* dx = a.dinp.f32();
  float* loss = a.losses.f32();
  const float g = 2.0f * a.loss_scale / static_cast<float>(D);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) loss[i] = mse_row(x + i * D, y + i * D, dx + i * D, D, g);
}

}  // namespace remat::cpu
