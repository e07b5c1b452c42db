// cuBLASLt GEMM engine (see engine/cuda/gemm.h).
// cuBLASLt in brief: a matmul descriptor (compute type, scale type, transposes), one matrix
// layout per operand (dtype, rows, cols, ld; column-major), a preference (workspace limit,
// minimum pointer alignments) and cublasLtMatmulAlgoGetHeuristic pick an algorithm; then
// cublasLtMatmul(handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, ws, ...).
// Here C aliases D (beta = 1 accumulates in place, as llm.c does for weight gradients).
#include "engine/cuda/gemm.h"

#include <fmt/format.h>

#include "engine/cuda/check.h"

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

// Largest power of two (up to 256) dividing the address: the heuristic must only pick kernels
// whose vector loads that alignment allows (row offsets into chunks can be odd multiples of 2).
int alignment_of(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  int a = 256;
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

GemmEngine::Plan& GemmEngine::plan_for(const Key& key, int64_t m, int64_t n, int64_t k,
                                       const GemmOperand& a, const GemmOperand& b, bool d_bf16,
                                       int64_t ldd, size_t ws_bytes, int align_a, int align_b,
                                       int align_d) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  auto p = std::make_unique<Plan>();
  p->lt = &lt_;
  // fp32 accumulation and fp32 alpha/beta for both bf16 and f32 inputs (no TF32).
  REMAT_CUBLAS_CHECK(lt_.matmul_desc_create(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = a.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = b.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  REMAT_CUBLAS_CHECK(
      lt_.matmul_desc_set_attribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  REMAT_CUBLAS_CHECK(
      lt_.matmul_desc_set_attribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  // Stored shapes: A is (m x k) or, transposed, (k x m); likewise B (k x n) / (n x k).
  REMAT_CUBLAS_CHECK(lt_.matrix_layout_create(&p->a, dtype_of(a.bf16),
                                              static_cast<uint64_t>(a.trans ? k : m),
                                              static_cast<uint64_t>(a.trans ? m : k), a.ld));
  REMAT_CUBLAS_CHECK(lt_.matrix_layout_create(&p->b, dtype_of(b.bf16),
                                              static_cast<uint64_t>(b.trans ? n : k),
                                              static_cast<uint64_t>(b.trans ? k : n), b.ld));
  REMAT_CUBLAS_CHECK(lt_.matrix_layout_create(&p->d, dtype_of(d_bf16), static_cast<uint64_t>(m),
                                              static_cast<uint64_t>(n), ldd));

  cublasLtMatmulPreference_t pref = nullptr;
  REMAT_CUBLAS_CHECK(lt_.matmul_preference_create(&pref));
  const uint64_t ws = ws_bytes;
  const uint32_t al_a = static_cast<uint32_t>(align_a), al_b = static_cast<uint32_t>(align_b),
                 al_d = static_cast<uint32_t>(align_d);
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
    throw BackendError(fmt::format(
        "[gemm] cuBLASLt has no algorithm for m={} n={} k={} ({}{}, {}{} -> {}, ld {}/{}/{}, "
        "alignment {}/{}/{}): {}",
        m, n, k, a.bf16 ? "bf16" : "f32", a.trans ? "^T" : "", b.bf16 ? "bf16" : "f32",
        b.trans ? "^T" : "", d_bf16 ? "bf16" : "f32", a.ld, b.ld, ldd, align_a, align_b, align_d,
        lt_.get_status_string(st)));
  }
  p->algo = result.algo;
  return *plans_.emplace(key, std::move(p)).first->second;
}

void GemmEngine::matmul(int64_t m, int64_t n, int64_t k, const GemmOperand& a, const GemmOperand& b,
                        void* d, bool d_bf16, int64_t ldd, float beta, void* workspace,
                        size_t ws_bytes) {
  REMAT_ASSERT(a.bf16 == b.bf16, "gemm: A and B dtypes differ");
  const int align_a = alignment_of(a.ptr), align_b = alignment_of(b.ptr), align_d = alignment_of(d);
  const Key key{
      m,       n,      k,      a.ld,    b.ld,    ldd,     a.trans,
      b.trans, a.bf16, d_bf16, align_a, align_b, align_d, static_cast<int>(ws_bytes >> 20)};
  Plan& p = plan_for(key, m, n, k, a, b, d_bf16, ldd, ws_bytes, align_a, align_b, align_d);
  const float alpha = 1.0f;
  REMAT_CUBLAS_CHECK(lt_.matmul(handle_, p.desc, &alpha, a.ptr, p.a, b.ptr, p.b, &beta, d, p.d, d,
                                p.d, &p.algo, workspace, ws_bytes, stream_));
}

}  // namespace remat::cuda
