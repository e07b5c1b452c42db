// A read-only memory map of a regular file (RAII, move-only). Data files are mapped rather than
// read so that a multi-GB corpus costs no heap and the page cache does the buffering; only the
// pages a window touches are ever faulted in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace remat {

class MappedFile {
 public:
  /// How the pages will be read next; forwarded to madvise (a hint, never an error).
  enum class Access { Normal, Sequential, Random };

  MappedFile() = default;
  /// Maps `path` read-only. Throws DataError naming the file when it cannot be opened, is not a
  /// regular file, or cannot be mapped. An empty file maps to size() == 0 and data() == nullptr.
  explicit MappedFile(const std::string& path);
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::string& path() const { return path_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  void advise(Access access) const;

 private:
  void unmap();
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace remat
