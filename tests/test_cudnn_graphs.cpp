// Host-side checks of the CUDA backend that need no GPU: every cuDNN operation graph the backend
// builds finalizes (cuDNN validates the graph's wiring, dtypes and attributes on the host).
// Compiles to nothing in builds without CUDA.
#ifdef REMAT_HAVE_CUDA
#include <catch2/catch.hpp>
#include <string>

#include "engine/cuda/cudnn_graphs.h"
#include "engine/cuda_api.h"

TEST_CASE("cuDNN causal attention graphs finalize on the host for every shape class", "[cuda]") {
  struct Shape {
    int64_t B, NH, T, HS;
  };
  // GPT-2 small and medium heads, an odd sequence length and a tiny one.
  const Shape shapes[] = {{1, 12, 1024, 64}, {2, 16, 4096, 64}, {3, 3, 67, 16}, {1, 4, 1, 128}};
  for (const Shape& s : shapes) {
    INFO("B=" << s.B << " NH=" << s.NH << " T=" << s.T << " HS=" << s.HS);
    std::string summary;
    REQUIRE_NOTHROW(summary = remat::cuda::check_attention_graphs_finalize(s.B, s.NH, s.T, s.HS));
    CHECK(summary == "fwd 14 ops, bwd 22 ops");
  }
}

TEST_CASE("the CUDA version string names the runtime, cuBLASLt and cuDNN without a GPU", "[cuda]") {
  const std::string v = remat::cuda::version_string();
  CHECK(remat::cuda::is_built());
  CHECK(v.find("CUDA runtime") != std::string::npos);
  CHECK(v.find("cuBLASLt") != std::string::npos);
  CHECK(v.find("cuDNN 9.") != std::string::npos);
  CHECK(remat::cuda::device_count() >= 0);  // 0, not an exception, without a driver
}
#endif
