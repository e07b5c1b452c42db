// Loading cuBLASLt on first use (see engine/cuda/cublaslt_library.h).
#include "engine/cuda/cublaslt_library.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <optional>

#include "engine/core/error.h"

namespace remat::cuda {

namespace {

#define REMAT_STRINGIFY_INNER(x) #x
#define REMAT_STRINGIFY(x) REMAT_STRINGIFY_INNER(x)

// The major version is the soname's: a cuBLASLt of another major may change these signatures.
constexpr const char* kSoname = "libcublasLt.so." REMAT_STRINGIFY(CUBLAS_VER_MAJOR);

// The library resolved, or why not (kept: a failed load fails the same way every time).
struct Loaded {
  std::optional<CublasLtLibrary> library;
  std::string error;
};

// Sets `fn` to the library's `name`; the first one missing is the error.
template <typename Fn>
void resolve(void* handle, const char* name, Fn& fn, std::string& error) {
  fn = reinterpret_cast<Fn>(dlsym(handle, name));
  if (fn == nullptr && error.empty())
    error =
        fmt::format("{} has no symbol {} (is it cuBLASLt {}?)", kSoname, name, CUBLAS_VER_MAJOR);
}

Loaded load() {
  Loaded out;
  // Never closed: the handles and plans it hands out live as long as the process.
  void* handle = dlopen(kSoname, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    out.error = why ? why : "dlopen failed";
#ifdef REMAT_CUBLASLT_DIR
    const std::string built_with = fmt::format("{}/{}", REMAT_CUBLASLT_DIR, kSoname);
    handle = dlopen(built_with.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* also = dlerror();
      out.error += fmt::format("; {}", also ? also : built_with + ": dlopen failed");
    }
#endif
  }
  if (handle == nullptr) return out;
  out.error.clear();
  CublasLtLibrary lib{};
  std::string& e = out.error;
  resolve(handle, "cublasLtCreate", lib.create, e);
  resolve(handle, "cublasLtDestroy", lib.destroy, e);
  resolve(handle, "cublasLtGetVersion", lib.get_version, e);
  resolve(handle, "cublasLtGetStatusName", lib.get_status_name, e);
  resolve(handle, "cublasLtGetStatusString", lib.get_status_string, e);
  resolve(handle, "cublasLtMatmul", lib.matmul, e);
  resolve(handle, "cublasLtMatmulAlgoGetHeuristic", lib.matmul_algo_get_heuristic, e);
  resolve(handle, "cublasLtMatmulDescCreate", lib.matmul_desc_create, e);
  resolve(handle, "cublasLtMatmulDescDestroy", lib.matmul_desc_destroy, e);
  resolve(handle, "cublasLtMatmulDescSetAttribute", lib.matmul_desc_set_attribute, e);
  resolve(handle, "cublasLtMatmulPreferenceCreate", lib.matmul_preference_create, e);
  resolve(handle, "cublasLtMatmulPreferenceDestroy", lib.matmul_preference_destroy, e);
  resolve(handle, "cublasLtMatmulPreferenceSetAttribute", lib.matmul_preference_set_attribute, e);
  resolve(handle, "cublasLtMatrixLayoutCreate", lib.matrix_layout_create, e);
  resolve(handle, "cublasLtMatrixLayoutDestroy", lib.matrix_layout_destroy, e);
  if (e.empty()) out.library = lib;
  return out;
}

const Loaded& loaded() {
  static const Loaded once = load();
  return once;
}

}  // namespace

const char* cublaslt_soname() {
  return kSoname;
}

const CublasLtLibrary& cublaslt() {
  const Loaded& l = loaded();
  if (!l.library)
    throw BackendError(fmt::format(
        "[device] the CUDA backend cannot load cuBLASLt: {}. Fix: install the CUDA {} cuBLAS "
        "libraries, or add the folder holding {} to LD_LIBRARY_PATH",
        l.error, CUBLAS_VER_MAJOR, kSoname));
  return *l.library;
}

std::string cublaslt_version() {
  const Loaded& l = loaded();
  if (!l.library) return fmt::format("cannot load {} ({})", kSoname, l.error);
  const int v = static_cast<int>(l.library->get_version());
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

}  // namespace remat::cuda
