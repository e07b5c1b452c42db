// The device bundle (scripts/device-bundle.sh), made from this build's binaries into a temp
// folder and checked the way the GPU machine will use it: with only the bundle's lib folder on
// the library path, every library of every bundled binary resolves inside the bundle or to what
// that machine provides (glibc, the compiler runtime, the CUDA stack); the bundled remat-train
// prints its version and plans GPT-2 124M for an h200; scripts/device-check.sh dry-runs against
// it and writes its rows file. Skipped with a message in builds without CUDA (no nvcc) or when
// patchelf is missing. About 10 s: the bundle is copied, never rebuilt (--no-build).
#include <fmt/format.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cli_util.h"
#include "tests/temp_dir.h"

namespace fs = std::filesystem;

namespace remat::test {
namespace {

using Shell = remat::test::CliResult;

Shell sh(const std::string& cmd) {
  return remat::test::run_command(cmd);
}

/// The reason to skip, or "" when this build can make a bundle.
std::string skip_reason(const fs::path& build) {
#ifndef REMAT_HAVE_CUDA
  (void)build;
  return "this build has no CUDA backend (no nvcc): there is no device bundle to check";
#else
  if (sh("command -v patchelf").code != 0)
    return "patchelf is missing (scripts/install-deps.sh installs it): no device bundle";
  if (!fs::exists(build / "tests/gpu/remat_gpu_tests") ||
      !fs::exists(build / "tests/gpu/remat_bench_gemm"))
    return "the gpu binaries are not built in " + build.string();
  return "";
#endif
}

// What the GPU machine provides itself; everything else must come from the bundle.
const std::regex kProvided(
    R"(^(linux-vdso|ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libgomp|)"
    R"(libcuda|libcudart|libcublas|libcublasLt|libcudnn[a-z_]*|libnvrtc[a-z-]*|libnccl)\.so)");

/// `ldd` of a bundled binary with only the bundle's lib folder added: the problems found.
std::vector<std::string> unresolved(const fs::path& bundle, const std::string& binary) {
  const Shell r =
      sh(fmt::format("LD_LIBRARY_PATH={}/lib ldd {}/{}", bundle.string(), bundle.string(), binary));
  REQUIRE(r.code == 0);
  std::vector<std::string> bad;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, std::regex(R"(^\s*(\S+)(?: => (\S+))?)"))) continue;
    const std::string soname = fs::path(m[1].str()).filename().string(), path = m[2];
    if (path == "not")
      bad.push_back(binary + ": " + soname + " not found");
    else if (path.rfind(bundle.string(), 0) != 0 && !std::regex_search(soname, kProvided))
      bad.push_back(binary + ": " + soname + " resolves outside the bundle, to " + path);
  }
  return bad;
}

uint64_t folder_bytes(const fs::path& dir) {
  uint64_t total = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) total += e.file_size();
  return total;
}

std::vector<nlohmann::json> read_rows(const std::string& path) {
  std::vector<nlohmann::json> rows;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

}  // namespace

TEST_CASE("the device bundle is self-contained and device-check.sh dry-runs against it",
          "[bundle]") {
  const fs::path build = fs::path(REMAT_BINARY).parent_path();
  if (const std::string why = skip_reason(build); !why.empty()) {
    WARN("skipped: " << why);
    SUCCEED();
    return;
  }
  TempDir tmp("bundle");
  const fs::path bundle = tmp.path / "device-bundle";
  const std::string src = REMAT_SOURCE_DIR;
  const std::string env = fmt::format("cd {} && LD_LIBRARY_PATH={}/lib", src, bundle.string());

  const Shell made =
      sh(fmt::format("cd {} && bash scripts/device-bundle.sh --no-build --build {} --out {}", src,
                     build.string(), bundle.string()));
  INFO(made.out);
  REQUIRE(made.code == 0);
  // What travels is the archive; the check below unpacks it (the folder is moved away first).
  const fs::path archive = bundle.string() + ".tar.gz";
  REQUIRE(fs::exists(archive));
  // It travels beside the sources, 64 MiB in all: scripts/device-bundle.sh refuses past 48 MiB.
  CHECK(fs::file_size(archive) < (uint64_t{48} << 20));
  CHECK(folder_bytes(bundle) < (uint64_t{160} << 20));

  for (const char* bin : {"remat-train", "remat_gpu_tests", "remat_bench_gemm"}) {
    const auto bad = unresolved(bundle, bin);
    for (const auto& b : bad) UNSCOPED_INFO(b);
    CHECK(bad.empty());
    CHECK_THAT(sh(fmt::format("readelf -d {}/{}", bundle.string(), bin)).out,
               Catch::Contains("Library runpath: [$ORIGIN/lib]"));
  }

  const Shell version = sh(fmt::format("{} {}/remat-train --version", env, bundle.string()));
  INFO(version.out);
  CHECK(version.code == 0);
  CHECK_THAT(version.out, Catch::Contains("backends: cpu, cuda"));
  const Shell plan = sh(fmt::format(
      "{} {}/remat-train plan --config configs/gpt2-124m.toml --gpu h200", env, bundle.string()));
  INFO(plan.out);
  CHECK(plan.code == 0);
  CHECK_THAT(plan.out, Catch::Contains("full"));

  // Without a GPU the check stops at "no_gpu"; with one, DRY_RUN=1 keeps `make test` from
  // starting the 8-minute measurement.
  const bool has_gpu = sh("nvidia-smi -L").code == 0;
  const std::string out = tmp.str("out");
  fs::rename(bundle, tmp.path / "unpacked-here-before");
  const Shell check =
      sh(fmt::format("cd {} && OUT={} BUNDLE={} DRY_RUN={} bash scripts/device-check.sh", src, out,
                     bundle.string(), has_gpu ? 1 : 0));
  CHECK_THAT(check.out, Catch::Contains("unpacked the bundle"));
  INFO(check.out);
  CHECK(check.code == 0);
  const auto rows = read_rows(out + "/device-check.rows.jsonl");
  REQUIRE(rows.size() >= 2);
  const std::string want = has_gpu ? "dry_run" : "no_gpu";
  bool gpu_row = false;
  for (const auto& r : rows) {
    INFO(r.dump());
    CHECK(r["status"] != "failed");
    if (r["stage"] == "gpu") gpu_row = r["status"] == want;
  }
  CHECK(gpu_row);
  CHECK(rows.back()["stage"] == "summary");
  CHECK(rows.back()["status"] == want);
}

}  // namespace remat::test
