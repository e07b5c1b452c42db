// CPU linear layer, forward and backward (engine/core/ops/linear.h): GEMMs on the tile grid of
// gemm.h, with LoRA's adapter terms (lora.cpp), the bias and the fused activations as tile
// epilogues. Row-major; a weight is (OC, C) as in PyTorch, so out = inp W^T.

#include <algorithm>
#include <atomic>

#include "engine/core/nf4.h"
#include "engine/cpu/activation_rows.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/gemm.h"
#include "engine/cpu/lane_sum.h"

namespace remat::cpu {

const float* f32_weight(const Tensor& weight, const OpWorkspace& ws) {
  const Buffer* copy = ws.find("gemm.weight_f32");
  if (!copy) return weight.f32();
  const int64_t n = weight.numel();
  decode_weight(weight.dtype, weight.data, n, 0, n, copy->tensor().f32());
  return copy->tensor().f32();
}

void CpuBackend::linear_forward_impl(const LinearForwardArgs& a, const OpWorkspace& ws) {
  const int64_t N = a.inp.rows(), C = a.inp.dim(-1), OC = a.weight.dim(0);
  float* out = a.out.f32();
  const float* bias = a.bias.empty() ? nullptr : a.bias.f32();
  float* act_out = a.act_out.empty() ? nullptr : a.act_out.f32();
  LoraTileAdd adapters;
  if (!a.lora.empty()) {
    lora_h(a.lora, a.inp, ws);
    adapters = lora_out_tiles(a.lora, ws, out, OC);
  }
  // The adapters, the bias and the activation run on each tile as soon as it is computed, while
  // it is in cache, instead of as passes over the whole output after the GEMM.
  std::atomic<int> status{0};
  TileEpilogue epilogue;
  if (adapters || bias || act_out) {
    epilogue = [&](int64_t r0, int64_t c0, int64_t m, int64_t n) {
      if (adapters)
        if (const int s = adapters(r0, c0, m, n)) status = s;
      if (!bias && !act_out) return;
      for (int64_t r = r0; r < r0 + m; ++r) {
        float* o = out + r * OC + c0;
        if (bias)
          for (int64_t j = 0; j < n; ++j) o[j] += bias[c0 + j];
        if (act_out) activation_forward_row(a.act, o, act_out + r * OC + c0, n);
      }
    };
  }
  sgemm(CblasNoTrans, CblasTrans, N, OC, C, a.inp.f32(), C, f32_weight(a.weight, ws), C,
        a.accumulate ? 1.0f : 0.0f, out, OC, epilogue);
  throw_if_gemm_failed(status.load(), N, OC, a.lora.rank());
}

namespace {

bool overlap(const Tensor& a, const Tensor& b) {
  if (a.empty() || b.empty()) return false;
  const auto* a0 = static_cast<const char*>(a.data);
  const auto* b0 = static_cast<const char*>(b.data);
  return a0 < b0 + b.bytes() && b0 < a0 + a.bytes();
}

// dW (OC, C) += dout^T (OC, N) inp (N, C). Over many rows it is cut along them as well as into
// tiles (choose_split_grid), and its partial sums are kept in dinp, which is written only after:
// no memory of its own, so no plan changes. Without a dinp to hold them (the data's gradient is
// not wanted, or the rows are too few), the tile grid alone. Either way a function of the op's
// arguments, never of the thread count.
void weight_gradient(const LinearBackwardArgs& a) {
  const int64_t N = a.inp.rows(), C = a.inp.dim(-1), OC = a.weight.dim(0);
  const SplitGrid split = choose_split_grid(OC, C, N);
  if (split.slabs == 1 || a.dinp.empty() || split_partial_floats(split, OC, C) > N * C) {
    sgemm(CblasTrans, CblasNoTrans, OC, C, N, a.dout.f32(), OC, a.inp.f32(), C, 1.0f,
          a.dweight.f32(), C);
    return;
  }
  REMAT_ASSERT(
      !overlap(a.dinp, a.dout) && !overlap(a.dinp, a.inp) && !overlap(a.dinp, a.inp_pre_act),
      "linear_backward: dinp overlaps dout, inp or inp_pre_act");
  sgemm_split(CblasTrans, CblasNoTrans, OC, C, N, a.dout.f32(), OC, a.inp.f32(), C, 1.0f,
              a.dweight.f32(), C, a.dinp.f32(), split);
}

}  // namespace

// dinp (N, C) = dout (N, OC) W (OC, C) + the adapters' dh A, then through act'. Per tile of the
// GEMM while it is in cache; an adapter with dropout adds its masked term after the GEMM instead,
// and act' then follows as a pass of its own (the same per-element code: the same bits).
void CpuBackend::input_gradient(const LinearBackwardArgs& a, const OpWorkspace& ws) {
  const int64_t N = a.inp.rows(), C = a.inp.dim(-1), OC = a.weight.dim(0);
  float* dinp = a.dinp.f32();
  const float* pre_act = a.inp_pre_act.empty() ? nullptr : a.inp_pre_act.f32();
  const bool lora_after = a.lora.any_dropout();
  LoraTileAdd adapters;
  if (!a.lora.empty() && !lora_after) adapters = lora_dinp_tiles(a.lora, ws, dinp, C);
  const bool act_in_tiles = pre_act && !lora_after;
  std::atomic<int> status{0};
  TileEpilogue epilogue;
  if (adapters || act_in_tiles) {
    epilogue = [&](int64_t r0, int64_t c0, int64_t m, int64_t n) {
      if (adapters)
        if (const int s = adapters(r0, c0, m, n)) status = s;
      if (!act_in_tiles) return;
      for (int64_t r = r0; r < r0 + m; ++r) {
        float* d = dinp + r * C + c0;
        activation_backward_row(a.act, pre_act + r * C + c0, d, d, n);
      }
    };
  }
  sgemm(CblasNoTrans, CblasNoTrans, N, C, OC, a.dout.f32(), OC, f32_weight(a.weight, ws), C, 0.0f,
        dinp, C, epilogue);
  throw_if_gemm_failed(status.load(), N, C, a.lora.total_rank());
  if (!lora_after) return;
  lora_dinp_through_dropout(a, ws);
  if (pre_act) activation_backward_impl({a.dinp, a.dinp, a.inp_pre_act, a.act});
}

void CpuBackend::linear_backward_impl(const LinearBackwardArgs& a, const OpWorkspace& ws) {
  const int64_t N = a.inp.rows(), OC = a.weight.dim(0);
  const float* dout = a.dout.f32();
  if (!a.dweight.empty()) weight_gradient(a);  // first: it may use dinp as scratch
  if (!a.lora.empty()) lora_parameter_grads(a, ws);
  if (!a.dinp.empty()) input_gradient(a, ws);
  if (!a.dbias.empty()) {
    // Column sums; each thread owns a slice of columns, so the row order is fixed.
    float* db = a.dbias.f32();
    constexpr int64_t kSlice = 64;
    for_each_column_slice<kSlice>(OC, [&](int64_t j0, int64_t j1) {
      float acc[kSlice] = {};
      for (int64_t r = 0; r < N; ++r)
        for (int64_t j = j0; j < j1; ++j) acc[j - j0] += dout[r * OC + j];
      for (int64_t j = j0; j < j1; ++j) db[j] += acc[j - j0];
    });
  }
}

}  // namespace remat::cpu
