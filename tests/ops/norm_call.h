// What the LayerNorm and RMSNorm op tests share (tests/ops/test_layernorm.cpp,
// tests/ops/test_rmsnorm.cpp): one call's tensors on the CPU backend, its double reference (the
// rows of tests/reference_decoder.h, which the model reference uses too), and the checks both ops
// pass: forward against the reference, backward against central differences and against the
// reference, the gradients added (+=) into what they held.
#pragma once

#include <vector>

#include "tests/ops/op_test.h"
#include "tests/reference_decoder.h"

namespace remat::test {

/// Rows and channels of a norm's input.
struct NormShape {
  int64_t N, C;
};

/// The LayerNorm shapes every backend runs: channel counts below, across and far beyond one
/// 32-channel slice of the parameter-gradient pass, and 5000 rows for its two-pass (row chunks,
/// then chunk order) reduction, not a multiple of the chunk.
inline const std::vector<NormShape> kLayerNormShapes = {
    {7, 13}, {5, 37}, {64, 200}, {41, 77}, {5000, 77}};

/// The RMSNorm shapes every backend runs: channel counts below, across and far beyond one
/// 32-channel slice of the weight-gradient pass and of the CPU's 16-lane row sums (13, 37, 77:
/// none a multiple of 16), an exact multiple (16), and 5000 rows for the two-pass (row chunks,
/// then chunk order) reduction on CUDA, not a multiple of the chunk.
inline const std::vector<NormShape> kRmsNormShapes = {{7, 13},   {5, 37},  {3, 16},
                                                      {64, 200}, {41, 77}, {5000, 77}};

/// A norm and one of its shapes: every row of both lists above.
struct NormRow {
  ref::Norm kind;
  NormShape shape;
};
inline std::vector<NormRow> norm_rows() {
  std::vector<NormRow> rows;
  for (const NormShape& s : kLayerNormShapes) rows.push_back({ref::Norm::Layer, s});
  for (const NormShape& s : kRmsNormShapes) rows.push_back({ref::Norm::Rms, s});
  return rows;
}

inline const char* norm_name(ref::Norm kind) {
  return kind == ref::Norm::Layer ? "layernorm" : "rmsnorm";
}

/// One norm's tensors on `be`: inputs ~ N(0.2 s, s^2) for x_scale s, weight ~ N(1, 1), the bias
/// (LayerNorm) and dout ~ N(0, 1), from streams `stream`, `stream + 1`, ... in that order; the
/// gradients prefilled with `grad_prefill` (backward adds into all of them). stats: LayerNorm's
/// (mean, rstd) per row, RMSNorm's rstd. eps: RMSNorm's argument (LayerNorm's is fixed, 1e-5).
struct NormCall {
  Backend& be;
  ref::Norm kind;
  int64_t N, C;
  float eps;
  Buffer inp, weight, bias, dout, out, stats, dinp, dweight, dbias;

  NormCall(Backend& backend, ref::Norm norm, int64_t n, int64_t c, uint64_t stream,
           float grad_prefill, float eps_ = 1e-5f, double x_scale = 1.5)
      : be(backend),
        kind(norm),
        N(n),
        C(c),
        eps(eps_),
        inp(make_randn(be, {N, C}, kSeed, stream, x_scale, 0.2 * x_scale)),
        weight(make_randn(be, {C}, kSeed, stream + 1, 1.0, 1.0)),
        bias(layer() ? make_randn(be, {C}, kSeed, stream + 2) : Buffer{}),
        dout(make_randn(be, {N, C}, kSeed, stream + (layer() ? 3 : 2))),
        out(make_tensor(be, {N, C})),
        stats(layer() ? make_tensor(be, {N, 2}) : make_tensor(be, {N})),
        dinp(make_filled(be, {N, C}, grad_prefill)),
        dweight(make_filled(be, {C}, grad_prefill)),
        dbias(layer() ? make_filled(be, {C}, grad_prefill) : Buffer{}) {}

  bool layer() const { return kind == ref::Norm::Layer; }

  void forward() {
    if (layer())
      be.layernorm_forward(
          {.out = out, .stats = stats, .inp = inp, .weight = weight, .bias = bias});
    else
      be.rmsnorm_forward({.out = out, .rstd = stats, .inp = inp, .weight = weight, .eps = eps});
  }
  void backward() {
    if (layer())
      be.layernorm_backward({dinp, dweight, dbias, dout, inp, weight, stats});
    else
      be.rmsnorm_backward({dinp, dweight, dout, inp, weight, stats});
  }
  std::vector<std::vector<float>> results() const {
    std::vector<std::vector<float>> r = {to_host(out), to_host(stats), to_host(dinp),
                                         to_host(dweight)};
    if (layer()) r.push_back(to_host(dbias));
    return r;
  }

  /// The double reference of the whole op: out and stats, and what backward adds to the
  /// gradients (with dout as the output's gradient).
  struct Reference {
    std::vector<double> out, stats, dinp, dweight, dbias;
  };
  Reference reference() const {
    Reference r{.out = std::vector<double>(static_cast<size_t>(N * C)),
                .stats = {},
                .dinp = std::vector<double>(static_cast<size_t>(N * C)),
                .dweight = std::vector<double>(static_cast<size_t>(C), 0.0),
                .dbias = std::vector<double>(static_cast<size_t>(C), 0.0)};
    const std::vector<double> x = to_double(inp), w = to_double(weight), dy = to_double(dout);
    const std::vector<double> b = layer() ? to_double(bias) : std::vector<double>{};
    std::vector<double> xhat(static_cast<size_t>(C));
    const double e = layer() ? 1e-5 : static_cast<double>(eps);
    for (int64_t n = 0; n < N; ++n) {
      const size_t row = static_cast<size_t>(n * C);
      const ref::NormStats st = ref::norm_row(kind, &r.out[row], xhat.data(), &x[row], w.data(),
                                              layer() ? b.data() : nullptr, C, e);
      if (layer()) r.stats.push_back(st.mean);
      r.stats.push_back(st.rstd);
      ref::norm_row_back(kind, &r.dinp[row], r.dweight.data(), layer() ? r.dbias.data() : nullptr,
                         &dy[row], xhat.data(), w.data(), st.rstd, C);
    }
    return r;
  }
};

/// Forward against the double reference: out and the stats.
inline void check_norm_forward(NormCall& n) {
  n.forward();
  const NormCall::Reference want = n.reference();
  CHECK(allclose(to_host(n.out), want.out, kTolReduction, "out"));
  CHECK(allclose(to_host(n.stats), want.stats, kTolReduction,
                 n.layer() ? "stats (mean, rstd)" : "rstd"));
}

/// Backward against central differences of sum(out * dout), each gradient added to its prefill
/// (dinp is the residual stream: what it held must stay).
inline void check_norm_backward_central_differences(NormCall& n) {
  auto loss = [&] {
    n.forward();
    return weighted_sum(n.out, n.dout);
  };
  loss();  // stats of the unperturbed input
  const std::vector<double> dinp0 = to_double(n.dinp), dweight0 = to_double(n.dweight);
  const std::vector<double> dbias0 = n.layer() ? to_double(n.dbias) : std::vector<double>{};
  n.backward();
  CHECK(allclose(minus(n.dinp, dinp0), central_differences(n.inp.f32(), n.N * n.C, kFdEps, loss),
                 kTolGradcheck, "dinp added"));
  CHECK(allclose(minus(n.dweight, dweight0), central_differences(n.weight.f32(), n.C, kFdEps, loss),
                 kTolGradcheck, "dweight added"));
  if (n.layer())
    CHECK(allclose(minus(n.dbias, dbias0), central_differences(n.bias.f32(), n.C, kFdEps, loss),
                   kTolGradcheck, "dbias added"));
}

/// Backward against the double reference, each gradient added to its prefill; the parameter
/// gradients, sums over all N rows, within `param_tol`.
inline void check_norm_backward(NormCall& n, Tolerance param_tol) {
  n.forward();
  const std::vector<double> dinp0 = to_double(n.dinp), dweight0 = to_double(n.dweight);
  const std::vector<double> dbias0 = n.layer() ? to_double(n.dbias) : std::vector<double>{};
  n.backward();
  const NormCall::Reference want = n.reference();
  CHECK(allclose(minus(n.dinp, dinp0), want.dinp, kTolReduction, "dinp added"));
  CHECK(allclose(minus(n.dweight, dweight0), want.dweight, param_tol, "dweight added"));
  if (n.layer()) CHECK(allclose(minus(n.dbias, dbias0), want.dbias, param_tol, "dbias added"));
}

#if REMAT_TEST_CUDA_ROWS
/// The norm's forward and backward on CUDA against the CPU's, the gradients accumulating (dinp
/// is the residual stream).
inline void check_norm_cuda_row(ref::Norm kind, int64_t N, int64_t C, DType act) {
  CAPTURE(norm_name(kind), N, C, dtype_name(act));
  const bool layer = kind == ref::Norm::Layer;
  CudaRow r(act);
  const Tolerance out_tol = r.pick(kCudaF32Gemm, kCudaBf16Gemm);
  const Tolerance grad_tol = r.pick(kCudaF32Gemm, kCudaBf16ParamGrad);
  auto [x_c, x_g] = r.act_pair({N, C}, r.act_values(N * C, 11, 2.0));
  auto [w_c, w_g] = r.f32_pair({C}, host_randn(C, 12));
  auto [b_c, b_g] = layer ? r.f32_pair({C}, host_randn(C, 13)) : std::pair<Buffer, Buffer>{};
  auto [y_c, y_g] = r.zeros_act({N, C});
  auto [s_c, s_g] = layer ? r.zeros_f32({N, 2}) : r.zeros_f32({N});
  auto [dy_c, dy_g] = r.act_pair({N, C}, r.act_values(N * C, 14));
  auto [dx_c, dx_g] = r.act_pair({N, C}, r.act_values(N * C, 15));  // += : the residual stream
  auto [dw_c, dw_g] = r.f32_pair({C}, host_randn(C, 16));
  auto [db_c, db_g] = layer ? r.f32_pair({C}, host_randn(C, 17)) : std::pair<Buffer, Buffer>{};
  for (const bool gpu : {false, true}) {
    Backend& be = gpu ? static_cast<Backend&>(*r.gpu) : r.cpu;
    const Buffer &x = gpu ? x_g : x_c, &w = gpu ? w_g : w_c, &y = gpu ? y_g : y_c;
    const Buffer &s = gpu ? s_g : s_c, &dy = gpu ? dy_g : dy_c, &dx = gpu ? dx_g : dx_c;
    const Buffer &dw = gpu ? dw_g : dw_c, &b = gpu ? b_g : b_c, &db = gpu ? db_g : db_c;
    if (layer) {
      be.layernorm_forward({y, s, x, w, b});
      be.layernorm_backward({dx, dw, db, dy, x, w, s});
    } else {
      be.rmsnorm_forward({.out = y, .rstd = s, .inp = x, .weight = w});
      be.rmsnorm_backward({dx, dw, dy, x, w, s});
    }
  }
  r.check_same(y_c, y_g, out_tol, "out");
  r.check_same(s_c, s_g, kCudaF32Gemm, layer ? "stats (mean, rstd)" : "rstd");
  r.check_same(dx_c, dx_g, out_tol, "dinp (+=)");
  r.check_same(dw_c, dw_g, grad_tol, "dweight (+=)");
  if (layer) r.check_same(db_c, db_g, grad_tol, "dbias (+=)");
}

/// check_norm_cuda_row on each of `shapes` with each activation type.
inline void check_norm_cuda_rows(ref::Norm kind, const std::vector<NormShape>& shapes) {
  for (const NormShape& s : shapes)
    for (const DType act : kCudaActivationTypes) check_norm_cuda_row(kind, s.N, s.C, act);
}
#endif

}  // namespace remat::test
