// cuBLASLt GEMM engine (see engine/cuda/gemm.h).
// cuBLASLt in brief: a matmul descriptor (compute type, scale type, transposes), one matrix
// layout per operand (dtype, rows, cols, ld; column-major), a preference (workspace limit,
// minimum pointer alignments) and cublasLtMatmulAlgoGetHeuristic pick an algorithm; then
// cublasLtMatmul(handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, ws, ...).
// Here C aliases D (beta = 1 accumulates in place, as llm.c does for weight gradients).
#include "engine/cuda/gemm.h"

#include <fmt/format.h>

#include "engine/cuda/check.h"
#include "engine/cuda/kernels.cuh"

namespace remat::cuda {

struct GemmEngine::Plan {
  const CublasLtLibrary* lt = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (a) lt->matrix_layout_destroy(a);
    if (b) lt->matrix_layout_destroy(b);
    if (d) lt->matrix_layout_destroy(d);
    if (desc) lt->matmul_desc_destroy(desc);
  }
};

namespace {

// Largest power of two (up to 16, see gemm.h) dividing the address: the heuristic must only pick
// kernels whose vector loads that alignment allows (row offsets into chunks can be odd multiples
// of 2).
int alignment_of(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  int a = 16;
  while (a > 1 && (v % static_cast<uintptr_t>(a)) != 0) a >>= 1;
  return a;
}

cudaDataType_t dtype_of(bool bf16) {
  return bf16 ? CUDA_R_16BF : CUDA_R_32F;
}

}  // namespace

GemmEngine::GemmEngine(cudaStream_t stream) : stream_(stream), lt_(cublaslt()) {
  REMAT_CUBLAS_CHECK(lt_.create(&handle_));
}

GemmEngine::~GemmEngine() {
  plans_.clear();
  if (handle_) lt_.destroy(handle_);
}

// One GEMM's signature, everything plan_for needs.
struct GemmEngine::Shape {
  int64_t m, n, k;
  GemmOperand a, b;
  bool d_bf16;
  int64_t ldd;
  size_t ws_bytes;
  const float* bias;
  int align_a, align_b, align_d, align_bias;
  Key key() const {
    return {m,       n,       k,       a.ld,       b.ld,
            ldd,     a.trans, b.trans, a.bf16,     d_bf16,
            align_a, align_b, align_d, align_bias, static_cast<int>(ws_bytes >> 20)};
  }
};

GemmEngine::Plan* GemmEngine::plan_for(const Shape& s) {
  const Key key = s.key();
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();
  auto p = std::make_unique<Plan>();
  p->lt = &lt_;
  // fp32 accumulation and fp32 alpha/beta for both bf16 and f32 inputs (no TF32).
  REMAT_CUBLAS_CHECK(lt_.matmul_desc_create(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = s.a.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = s.b.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  REMAT_CUBLAS_CHECK(
      lt_.matmul_desc_set_attribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  REMAT_CUBLAS_CHECK(
      lt_.matmul_desc_set_attribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (s.bias) {
    // The heuristic reads the pointer's alignment; each call sets its own pointer.
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const int32_t bias_type = CUDA_R_32F;
    REMAT_CUBLAS_CHECK(lt_.matmul_desc_set_attribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                     &epilogue, sizeof(epilogue)));
    REMAT_CUBLAS_CHECK(lt_.matmul_desc_set_attribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                     &bias_type, sizeof(bias_type)));
    REMAT_CUBLAS_CHECK(lt_.matmul_desc_set_attribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                     &s.bias, sizeof(s.bias)));
  }
  const int64_t m = s.m, n = s.n, k = s.k;
  // Stored shapes: A is (m x k) or, transposed, (k x m); likewise B (k x n) / (n x k).
  REMAT_CUBLAS_CHECK(lt_.matrix_layout_create(&p->a, dtype_of(s.a.bf16),
                                              static_cast<uint64_t>(s.a.trans ? k : m),
                                              static_cast<uint64_t>(s.a.trans ? m : k), s.a.ld));
  REMAT_CUBLAS_CHECK(lt_.matrix_layout_create(&p->b, dtype_of(s.b.bf16),
                                              static_cast<uint64_t>(s.b.trans ? n : k),
                                              static_cast<uint64_t>(s.b.trans ? k : n), s.b.ld));
  REMAT_CUBLAS_CHECK(lt_.matrix_layout_create(&p->d, dtype_of(s.d_bf16), static_cast<uint64_t>(m),
                                              static_cast<uint64_t>(n), s.ldd));

  cublasLtMatmulPreference_t pref = nullptr;
  REMAT_CUBLAS_CHECK(lt_.matmul_preference_create(&pref));
  const uint64_t ws = s.ws_bytes;
  const uint32_t al_a = static_cast<uint32_t>(s.align_a), al_b = static_cast<uint32_t>(s.align_b),
                 al_d = static_cast<uint32_t>(s.align_d);
  lt_.matmul_preference_set_attribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                      sizeof(ws));
  lt_.matmul_preference_set_attribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a,
                                      sizeof(al_a));
  lt_.matmul_preference_set_attribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b,
                                      sizeof(al_b));
  lt_.matmul_preference_set_attribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d,
                                      sizeof(al_d));
  lt_.matmul_preference_set_attribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d,
                                      sizeof(al_d));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = lt_.matmul_algo_get_heuristic(handle_, p->desc, p->a, p->b, p->d, p->d,
                                                          pref, 1, &result, &found);
  lt_.matmul_preference_destroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    if (s.bias) {  // no BIAS epilogue here: remembered, so the caller adds the bias every time
      plans_.emplace(key, nullptr);
      return nullptr;
    }
    throw BackendError(fmt::format(
        "[gemm] cuBLASLt has no algorithm for m={} n={} k={} ({}{}, {}{} -> {}, ld {}/{}/{}, "
        "alignment {}/{}/{}): {}",
        m, n, k, s.a.bf16 ? "bf16" : "f32", s.a.trans ? "^T" : "", s.b.bf16 ? "bf16" : "f32",
        s.b.trans ? "^T" : "", s.d_bf16 ? "bf16" : "f32", s.a.ld, s.b.ld, s.ldd, s.align_a,
        s.align_b, s.align_d, lt_.get_status_string(st)));
  }
  p->algo = result.algo;
  return plans_.emplace(key, std::move(p)).first->second.get();
}

void GemmEngine::matmul(int64_t m, int64_t n, int64_t k, const GemmOperand& a, const GemmOperand& b,
                        void* d, bool d_bf16, int64_t ldd, float beta, void* workspace,
                        size_t ws_bytes, const float* bias, float alpha) {
  REMAT_ASSERT(a.bf16 == b.bf16, "gemm: A and B dtypes differ");
  Shape s{m,
          n,
          k,
          a,
          b,
          d_bf16,
          ldd,
          ws_bytes,
          bias,
          alignment_of(a.ptr),
          alignment_of(b.ptr),
          alignment_of(d),
          bias ? alignment_of(bias) : 0};
  REMAT_ASSERT(alpha == 1.0f || bias == nullptr, "gemm: a bias with alpha {}", alpha);
  auto run = [&](Plan& p) {
    return lt_.matmul(handle_, p.desc, &alpha, a.ptr, p.a, b.ptr, p.b, &beta, d, p.d, d, p.d,
                      &p.algo, workspace, ws_bytes, stream_);
  };
  if (Plan* p = plan_for(s); p && bias) {
    REMAT_CUBLAS_CHECK(lt_.matmul_desc_set_attribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                     &bias, sizeof(bias)));
    // Releases differ in how they refuse an epilogue at launch although the heuristic offered
    // it: either status means "not this way", and the signature falls back for good.
    const cublasStatus_t st = run(*p);
    if (st != CUBLAS_STATUS_NOT_SUPPORTED && st != CUBLAS_STATUS_INVALID_VALUE) {
      REMAT_CUBLAS_CHECK(st);
      return;
    }
    plans_[s.key()] = nullptr;
  } else if (p) {
    REMAT_CUBLAS_CHECK(run(*p));
    return;
  }
  if (!bias_fallback_noted_) {  // once: the speed the epilogue was for is not there
    bias_fallback_noted_ = true;
    fmt::print(stderr,
               "[gemm] note: cuBLASLt ({}) offers no BIAS epilogue with an f32 bias for m={} n={} "
               "k={} ({} output): the bias runs as a kernel of its own there\n",
               cublaslt_version(), m, n, k, d_bf16 ? "bf16" : "f32");
  }
  // A bias without the epilogue: into D first (D is m x n packed: ldd == m), then the GEMM
  // accumulates onto it, as the CPU backend orders the sum.
  REMAT_ASSERT(ldd == m, "gemm: a bias needs a packed D (ld {} for {} rows)", ldd, m);
  kern::bias_rows(d, bias, n, m, beta == 0.0f, d_bf16, stream_);
  beta = 1.0f;
  s.bias = nullptr;
  s.align_bias = 0;
  REMAT_CUBLAS_CHECK(run(*plan_for(s)));
}

}  // namespace remat::cuda
