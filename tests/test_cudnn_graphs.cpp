// Host-side checks of the CUDA backend that need no GPU: every cuDNN operation graph the backend
// builds finalizes (cuDNN validates the graph's wiring, dtypes and attributes on the host), and
// cuBLASLt loads on first use, in the GEMM engine's process and not in a CPU run's.
// Compiles to nothing in builds without CUDA.
#ifdef REMAT_HAVE_CUDA
#include <catch2/catch.hpp>
#include <regex>
#include <string>

#include "engine/cuda/cublaslt_library.h"
#include "engine/cuda/cudnn_graphs.h"
#include "engine/cuda_api.h"
#include "tests/cli_util.h"

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

TEST_CASE("cuDNN releases whose attention backward needs a padding mask are refused by name",
          "[cuda]") {
  using remat::cuda::cudnn_version_refusal;
  // Up to 9.15.0 the backward needs a padding mask when the key length is not a multiple of 128
  // (cudnn-frontend adds one; our graphs have none); 9.10.0/9.10.1 are blocked for their bugs.
  for (int64_t v : {90000, 90600, 91002, 91500}) {
    INFO(v);
    CHECK_THAT(cudnn_version_refusal(v),
               Catch::Matchers::Contains("multiple of 128") && Catch::Matchers::Contains("9.15.1"));
  }
  CHECK_THAT(cudnn_version_refusal(91500), Catch::Matchers::Contains("cuDNN 9.15.0:"));
  CHECK_THAT(cudnn_version_refusal(91001),
             Catch::Matchers::Contains("cuDNN 9.10.1 has known bugs"));
  CHECK_THAT(cudnn_version_refusal(8907), Catch::Matchers::Contains("cuDNN 8.9.7 is too old"));
  for (int64_t v : {91501, 91900, 92600}) CHECK(cudnn_version_refusal(v).empty());
}

TEST_CASE("the CUDA version string names the runtime, cuBLASLt and cuDNN without a GPU", "[cuda]") {
  const std::string v = remat::cuda::version_string();
  CHECK(remat::cuda::is_built());
  CHECK(v.find("CUDA runtime") != std::string::npos);
  CHECK(v.find("cuBLASLt") != std::string::npos);
  CHECK(v.find("cuDNN 9.") != std::string::npos);
  CHECK(remat::cuda::device_count() >= 0);  // 0, not an exception, without a driver
}
TEST_CASE("cuBLASLt loads on first use, its entry points the library's own", "[cuda]") {
  // cublaslt() returns only when every entry point resolved; calling two of them checks that
  // they are the library the headers describe.
  const remat::cuda::CublasLtLibrary& lt = remat::cuda::cublaslt();
  CHECK(static_cast<int>(lt.get_version()) / 10000 == CUBLAS_VER_MAJOR);
  CHECK(std::string(lt.get_status_name(CUBLAS_STATUS_NOT_INITIALIZED)) ==
        "CUBLAS_STATUS_NOT_INITIALIZED");
  CHECK(remat::cuda::cublaslt_version().rfind(std::to_string(CUBLAS_VER_MAJOR) + ".", 0) == 0);
}

TEST_CASE("a CPU run does not load cuBLASLt, and --version does", "[cuda][smoke]") {
  // LD_DEBUG=files: the dynamic loader names every library it opens and initializes, on stderr.
  const std::string soname = remat::cuda::cublaslt_soname();
  const auto plan =
      remat::test::run_binary("plan --config configs/tiny.toml", true, "LD_DEBUG=files");
  REQUIRE(plan.code == 0);
  CHECK(plan.out.find("calling init: ") != std::string::npos);  // the loader did report
  CHECK(plan.out.find(soname) == std::string::npos);
  const auto version = remat::test::run_binary("--version", true, "LD_DEBUG=files");
  REQUIRE(version.code == 0);
  CHECK(version.out.find("cannot load") == std::string::npos);
  CHECK(std::regex_search(version.out, std::regex("calling init: \\S*/" + soname + "\n")));
}
#endif
