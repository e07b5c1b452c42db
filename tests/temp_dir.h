// A folder of its own for each test, under the system temp dir, removed with everything in it;
// and a file read whole.
#pragma once

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace remat::test {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag = "test") {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           fmt::format("remat-{}-{}-{}", tag, ::getpid(), counter++);
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return (path / name).string(); }
  std::string str(const std::string& sub = "") const { return (path / sub).string(); }
};

/// The bytes of the file at `path` ("" when it cannot be opened).
inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// Writes `text` as the whole file at `path`, byte for byte.
inline void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

}  // namespace remat::test
